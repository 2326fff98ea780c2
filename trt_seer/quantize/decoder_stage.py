"""The weight-only stage of `build --int8` / `build --int4` for causal LMs.

    FP16 model --(weightonly.py, AWQ scales for INT4 from calibration activations)--> Q/DQ ONNX

The caller hands the stage a `DecoderSource`: the FP16 graph's record, a way to load the FP16
model (from its graph, or its weightless skeleton filled tensor by tensor from the checkpoint
once the graph's weights were removed), the FP16 reference logits of the gate's rows and, when
a GPU runs engines, an evaluator that scores a candidate graph through its engine.
    gate: held-out perplexity increase and greedy next-token agreement against the FP16 graph,
    teacher-forced step by step through the KV cache (eval/teacher.py); on failure the GEMMs that
    add the most error go back to FP16 (int8.py's fallback loop) until it passes, or exit 1.

Record (`<name>.int8.onnx.json` / `.int4.onnx.json`): `quantization` (bits, block size, AWQ alphas,
GEMMs kept FP16 and why) and `accuracy` (gate metrics, thresholds, table, `measured_on`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trt_seer import __version__, records
from trt_seer.engine import manifest
from trt_seer.errors import AccuracyGateError
from trt_seer.export import onnxio
from trt_seer.export.families import ModelInfo, ShapeProfile, max_positions
from trt_seer.eval import gate as gate_mod
from trt_seer.files import sha256_json
from trt_seer.quantize import int8
from trt_seer.quantize.weightonly import WeightOnlySpec
from trt_seer.quantize.spec import QuantStageSpec

log = logging.getLogger(__name__)
GATE_ROWS, GATE_LENGTH = 16, 64  # held-out rows x tokens, teacher-forced


@dataclass(frozen=True)
class DecoderGate:
    """Defaults by bits: INT8 <= 1% perplexity increase and >= 90% agreement, INT4 <= 5% and >= 80%
    (docs/DESIGN.md has the measurements behind them)."""

    max_ppl_increase: float
    min_agreement: float

    @classmethod
    def for_bits(cls, bits: int, max_ppl_increase: float | None, min_agreement: float | None) -> "DecoderGate":
        ppl, agree = (0.01, 0.90) if bits == 8 else (0.05, 0.80)
        return cls(ppl if max_ppl_increase is None else max_ppl_increase,
                   agree if min_agreement is None else min_agreement)

    def check(self, task: str, m: dict) -> list[str]:
        fails = []
        if not m["ppl_increase"] <= self.max_ppl_increase:
            fails.append(f"perplexity +{100 * m['ppl_increase']:.2f}% > +{100 * self.max_ppl_increase:.2f}%")
        if not m["agreement"] >= self.min_agreement:
            fails.append(f"next-token agreement {m['agreement']:.4f} < {self.min_agreement}")
        return fails


def weight_only_spec(quant: QuantStageSpec, bits: int) -> WeightOnlySpec:
    return WeightOnlySpec(bits, quant.int4_block, quant.quantize_lm_head)


def uses_awq(quant: QuantStageSpec, bits: int, qat) -> bool:
    """AWQ for INT4, unless --no-awq or the weights were trained for plain round-to-nearest."""
    return bits == 4 and not quant.no_awq and qat is None


def int4_qat(info: ModelInfo, quant: QuantStageSpec, bits: int):
    """The checkpoint's `finetune --qat int4` file for an INT4 build (qat_ranges.Int4Qat), else None;
    InputError when its block size or LM head differ from the build's."""
    from trt_seer.quantize import qat_ranges

    return qat_ranges.int4_for_build(info.path, quant) if bits == 4 else None


def _key(fp16: dict, quant: QuantStageSpec, spec: WeightOnlySpec, gate: DecoderGate, qat) -> str:
    return sha256_json({"fp16": fp16["sha256"], "data": int8.data_fingerprint(quant), "bits": spec.bits,
                        "block": spec.block_size, "head": spec.lm_head, "awq": uses_awq(quant, spec.bits, qat),
                        "qat": qat.fingerprint() if qat else None,
                        "samples": quant.calib_samples, "batch": quant.calib_batch,
                        "profile": [list(quant.batch), list(quant.seq)], "gate": [gate.max_ppl_increase, gate.min_agreement],
                        "rows": [GATE_ROWS, GATE_LENGTH], "trt_seer": __version__})


@dataclass
class DecoderSource:
    """What the weight-only stage takes from its caller (it never calls the pipeline back).

    fp16: the FP16 graph's record. weights: its structure and weights (intermediates.FP16Weights:
    `structure()`, `read(name)`, `fill(model)`, `whole()`), so no stage holds it whole. graph: the
    FP16 graph file while its weights are still on disk (AWQ statistics, per-layer ranking), else
    None. reference: teacher-forced FP16 logits of `rows` (what candidates are gated against).
    evaluate: a candidate graph's teacher-forced logits of `rows`, default ONNX Runtime on the CPU;
    measured_on says what evaluate and reference ran on."""

    fp16: dict
    weights: Any
    graph: Path | None
    rows: np.ndarray
    reference: np.ndarray
    evaluate: Callable | None = None
    measured_on: str = ""
    awq_stats: dict | None = field(default=None, repr=False)

    def logits(self, candidate: Path) -> np.ndarray:
        from trt_seer.eval import teacher

        return self.evaluate(candidate, self.rows) if self.evaluate else teacher.teacher_forced_logits(candidate, self.rows)


def stage_key(fp16: dict, quant: QuantStageSpec, info: ModelInfo, bits: int) -> str:
    """The cache key of `<name>.int{bits}.onnx` (computed without loading any model)."""
    spec = weight_only_spec(quant, bits)
    gate = DecoderGate.for_bits(bits, quant.max_ppl_increase, quant.min_agreement)
    return _key(fp16, quant, spec, gate, int4_qat(info, quant, bits))


def gate_rows(info: ModelInfo, quant: QuantStageSpec) -> tuple[int8.CalibData, np.ndarray]:
    """The calibration data and the held-out token rows the gate teacher-forces."""
    cd = int8.load_calib_data(info, quant, ShapeProfile(tuple(quant.batch), tuple(quant.seq)))
    return cd, _teacher_rows(info, cd)


def weight_only_onnx(info: ModelInfo, art: records.Artifacts, source: DecoderSource, quant: QuantStageSpec,
                     bits: int, cd: int8.CalibData) -> dict:
    """Builds (or reuses) the gated weight-only ONNX `<name>.int{bits}.onnx`; returns its record."""
    fp16 = source.fp16
    spec = weight_only_spec(quant, bits)
    gate = DecoderGate.for_bits(bits, quant.max_ppl_increase, quant.min_agreement)
    qat = int4_qat(info, quant, bits)
    dest, key = art.path(f"int{bits}.onnx"), _key(fp16, quant, spec, gate, qat)
    record = None if quant.force else records.up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("int%d ONNX up to date: %s", bits, dest)
        return record
    extra = quantize_and_gate(info, art, quant, spec, gate, cd, source, qat)
    inherited = {**records.inherit(fp16), **({"decoder": fp16["decoder"]} if "decoder" in fp16 else {})}
    return records.write_record(dest, {**inherited, "precision": f"int{bits}", "key": key,
                                       **({"fp32_sha256": fp16["fp32_sha256"]} if "fp32_sha256" in fp16 else {}),
                                       "fp16_sha256": fp16["sha256"], **extra})


def cpu_form(info: ModelInfo, art: records.Artifacts, fp32: dict, record: dict, cd: int8.CalibData) -> None:
    """`<name>.int{bits}.cpu.onnx` (ONNX Runtime's MatMulNBits form) from the FP32 graph, keeping
    in FP32 what the gate kept in FP16."""
    from trt_seer.quantize.cpu_nbits import nbits_cpu_onnx

    bits = record["quantization"]["bits"]
    gate = DecoderGate(**record["accuracy"]["gate"]["thresholds"])
    keep = frozenset(record["quantization"]["fp16_gemms"])
    nbits_cpu_onnx(info, art, fp32, bits, gate, _teacher_rows(info, cd), keep)


def _teacher_rows(info: ModelInfo, cd: int8.CalibData) -> np.ndarray:
    from trt_seer.eval.teacher import token_rows

    length = min(GATE_LENGTH, max_positions(info) or GATE_LENGTH)
    return token_rows(cd.heldout, length, GATE_ROWS)


def prefill_batches(path: Path, batches: list[dict]) -> list[dict]:
    from trt_seer.eval.teacher import graph_inputs, prefill_feeds

    inputs = graph_inputs(path)
    return [prefill_feeds(inputs, b) for b in batches]


CPU_AWQ_BUDGET = 2e12  # prefill tokens x model parameters AWQ's statistics may take on the CPU


def awq_statistics(graph: Path, targets: list, batches: list[dict]) -> dict:
    """Activation statistics of the GEMM inputs in `targets`, on `graph` (ONNX Runtime, CPU), over
    as many of `batches` as the CPU's time bound allows (cpu_bounded)."""
    from trt_seer.quantize import awq

    nodes = {n.name: n for n in onnxio.load(graph, False).graph.node}
    names = sorted({nodes[t.node].input[0] for t in targets})
    batches = cpu_bounded(batches, sum(t.k * t.n for t in targets))
    log.info("collecting activation statistics of %d GEMM inputs on %s ...", len(names), Path(graph).name)
    return awq.activation_stats(graph, batches, names)


def cpu_bounded(batches: list[dict], params: int, budget: float = CPU_AWQ_BUDGET) -> list[dict]:
    """The first of `batches` whose prefill tokens x `params` (the quantized GEMMs' weights) stay
    within `budget`, at least one: AWQ's statistics on the CPU take minutes, not hours, at 7B (about
    300 tokens there; a GPU takes every batch). The log says when batches were left out."""
    kept, spent = [], 0.0
    for b in batches:
        cost = float(np.count_nonzero(b["attention_mask"])) * params
        if kept and spent + cost > budget:
            break
        kept.append(b)
        spent += cost
    if len(kept) < len(batches):
        log.info("AWQ statistics on the CPU: %d of %d calibration batches (%d tokens), a time bound for "
                 "%.2fB quantized weights; a GPU takes them all", len(kept), len(batches), int(spent // params),
                 params / 1e9)
    return kept


def awq_scales(stats: dict, fp16_model, targets: list, spec: WeightOnlySpec, read=lambda name: None):
    """{FP16 activation tensor: s} where AWQ beats round-to-nearest, and a per-activation report
    (`read`: weights the graph holds no value for, as weight_only_model takes it)."""
    from tqdm import tqdm

    from trt_seer.quantize import awq, awq_torch
    from trt_seer.quantize.weightonly import initializer_value

    groups: dict[str, list] = {}
    for t in targets:
        groups.setdefault(t.activation, []).append(t)
    names = {x: x for x in groups}
    inits = {i.name: i for i in fp16_model.graph.initializer}
    scales, report = {}, []
    device = awq_torch.gpu()
    for x, group in tqdm(groups.items(), desc=f"AWQ scale search ({device or 'CPU'})", unit="activation"):
        weights = [initializer_value(inits[t.weight], read) for t in group]
        c = awq_torch.search(stats[names[x]], weights, spec, device) if device else \
            awq.search(stats[names[x]], [w.astype(np.float32) for w in weights], spec)
        if c.alpha > 0:
            scales[x] = c.s
        report.append({"gemms": [t.node for t in group], "alpha": c.alpha,
                       "rel_error": float(np.sqrt(c.error / max(c.ref_energy, 1e-30))),
                       "rtn_rel_error": float(np.sqrt(c.rtn_error / max(c.ref_energy, 1e-30)))})
    return scales, report


def measured_on_cpu(path: Path) -> str:
    import onnxruntime

    from trt_seer.eval.teacher import has_cache

    how = "one token per step through the KV cache" if has_cache(path) else "all positions per pass (no KV cache)"
    return f"ONNX Runtime {onnxruntime.__version__} CPU, teacher-forced, {how}, against the FP16 graph"


def _write(weights, dest: Path, spec: WeightOnlySpec, scales: dict, exclude: frozenset) -> int:
    """The weight-only graph, its GEMM weights read, quantized and dropped one at a time."""
    from trt_seer.quantize import weightonly

    model = weights.structure()
    s = WeightOnlySpec(spec.bits, spec.block_size, spec.lm_head, exclude)
    targets = weightonly.find_targets(model, s)
    weightonly.weight_only_model(model, targets, s, scales, read=weights.read)
    onnxio.save(weights.fill(model), dest, give_back=False)
    return len(targets)


def quantize_and_gate(info: ModelInfo, art: records.Artifacts, quant: QuantStageSpec, spec: WeightOnlySpec,
                      gate: DecoderGate, cd: int8.CalibData, source: DecoderSource, qat=None) -> dict:
    """Writes `<name>.int{bits}.onnx` with the fewest GEMMs in FP16 that pass `gate`; returns the
    record's quantization, calibration and accuracy sections. AccuracyGateError (exit 1) if none does."""
    from trt_seer.eval import teacher
    from trt_seer.quantize import weightonly

    dest = art.path(f"int{spec.bits}.onnx")
    model16 = source.weights.structure()  # names and shapes; weights are read one at a time
    targets = weightonly.find_targets(model16, spec)
    scales, awq_report = _awq(quant, spec, qat, source, model16, targets, cd)
    summary = _quantization(model16, spec, len(targets), frozenset(), awq_report)
    del model16
    excluded, metrics, fails, table_rows = gate_mod.fallback(
        lambda ex: _write(source.weights, dest, spec, scales, ex),
        lambda: teacher.lm_metrics(source.reference, source.logits(dest), source.rows), gate, info.task,
        lambda: _rank(source, dest, cd, targets, spec), f"INT{spec.bits}")
    table = gate_mod.table(table_rows, f"INT{spec.bits}")
    log.info("INT%d accuracy vs FP16 on %d held-out tokens:\n%s", spec.bits, metrics["samples"], table)
    if fails:
        dest.unlink(missing_ok=True)
        raise AccuracyGateError(f"INT{spec.bits} cannot pass the accuracy gate even with every layer in FP16 ("
                                + "; ".join(fails) + "); the table above has every attempt")
    summary.update({"quantized_gemms": len(targets) - len(excluded), "fp16_gemms": sorted(excluded)})
    return {"quantization": {**summary,
                             "qat": None if qat is None else {"file": str(qat.path), "block": qat.block,
                                                              "weights": qat.weights,
                                                              "awq": "skipped: weights trained for round-to-nearest"}},
            "calibration": {"data": quant.calib or "calib/default.txt", "batches": len(cd.calib)},
            "accuracy": {"onnx_vs_fp16": metrics, "measured_on": source.measured_on,
                         "gate": {"passed": True, "thresholds": gate.__dict__,
                                  "table": [[r[0], r[1], not r[2]] for r in table_rows]}}}


def _awq(quant, spec, qat, source: DecoderSource, model16, targets, cd) -> tuple[dict, list | None]:
    if qat is not None:
        log.info("AWQ skipped: %s says finetune --qat int4 trained these weights for round-to-nearest INT4 on "
                 "the plain weights (blocks of %d); AWQ's rescaling would round different values", qat.path, qat.block)
    if not uses_awq(quant, spec.bits, qat):
        return {}, None
    stats = source.awq_stats
    if stats is None:
        if source.graph is None:
            raise AccuracyGateError("AWQ needs activation statistics of the FP16 graph, whose weights were removed; "
                                    "rerun with --force or --no-awq")
        stats = awq_statistics(source.graph, targets, prefill_batches(source.graph, cd.calib))
    log.info("searching AWQ scales for %d GEMMs ...", len(targets))
    return awq_scales(stats, model16, targets, spec, source.weights.read)


def _rank(source: DecoderSource, dest: Path, cd, targets: list, spec: WeightOnlySpec) -> list[str]:
    """GEMMs by the error they add: measured layer by layer against the FP16 graph while it is on
    disk, else by the relative error of their quantized weights (no FP16 graph needed)."""
    if source.graph is not None:
        return gate_mod.rank_by_added_error(source.graph, dest, prefill_batches(source.graph, cd.heldout[:4]),
                                            [t.node for t in targets])
    from trt_seer.quantize import weightonly

    log.info("ranking GEMMs by the relative error of their quantized weights (the FP16 graph's weights were removed)")
    model = source.weights.structure()
    inits = {t.name: t for t in model.graph.initializer}
    errors = {}
    for t in targets:
        w = weightonly.initializer_value(inits[t.weight], source.weights.read).astype(np.float32)
        d = weightonly.fake_quant(w, spec.bits, spec.block_size) - w
        errors[t.node] = float(np.sum(d * d) / max(float(np.sum(w * w)), 1e-30))
    return sorted(errors, key=lambda n: -errors[n])


def _quantization(model16, spec: WeightOnlySpec, n_targets: int, excluded: frozenset, awq_report) -> dict:
    """The record's `quantization` section."""
    from trt_seer.quantize import weightonly

    head = weightonly.lm_head(model16)
    return {"mode": "weight-only", "bits": spec.bits, "block_size": spec.block_size if spec.bits == 4 else None,
            "granularity": "per-output-channel" if spec.bits == 8 else f"blocks of {spec.block_size} input channels",
            "quantized_gemms": n_targets - len(excluded), "fp16_gemms": sorted(excluded),
            "fp16_k_not_multiple_of_block": weightonly.unfit_int4(model16, spec) if spec.bits == 4 else [],
            "lm_head": head if spec.lm_head else None, "lm_head_fp16": None if spec.lm_head else head,
            "awq": awq_report}
