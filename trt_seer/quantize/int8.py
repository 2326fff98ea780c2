"""The INT8 stage of `build --int8`: calibration data -> KL ranges -> Q/DQ ONNX, gated by accuracy
on held-out data, with automatic per-layer precision fallback.

    FP32 ONNX --(ORT CPU, histograms, KL)--> amax --(quantize.py on the FP16 graph)--> Q/DQ ONNX
    gate: task metric vs FP32 on held-out samples; on failure the layers that add the most error
    go back to FP16 until the gate passes (or exit 1 with the table).
"""
from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer import __version__, data, records
from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.errors import AccuracyGateError, InputError
from trt_seer.export.families import ModelInfo, ShapeProfile
from trt_seer.files import ensure_out_dir, sha256_file, sha256_json, staging_dir
from trt_seer.eval.gate import Gate, fallback, rank_by_added_error, table as gate_table
from trt_seer.quantize import qat_ranges
from trt_seer.quantize.spec import QuantStageSpec

log = logging.getLogger(__name__)
HELDOUT_EVERY = 5  # user data: every 5th sample is held out for the gate
HELDOUT_SAMPLES = 160
# Fewer held-out samples than this make the gate's min cosine too lenient (10 passed a CPU form
# that 160 fail): the shipped held-out corpus is used instead of the user's few.
MIN_HELDOUT_SAMPLES = 64
SHIPPED_HELDOUT = "calib/heldout.txt"
CPU_INT8_FORM = "onnxruntime dynamic INT8 (per-channel S8 weights, U8 activations) on the fused CPU graph"
CPU_INT8_OPS = ("MatMul", "Attention")  # fused Attention becomes QAttention (INT8 QKV projection)


@dataclass
class CalibData:
    """Calibration and held-out feeds (the cache key fingerprints their files: data_fingerprint)."""

    calib: list
    heldout: list
    heldout_data: str = SHIPPED_HELDOUT  # where the held-out samples came from
    _reference: list | None = None

    @property
    def heldout_samples(self) -> int:
        return sum(len(b["input_ids"]) for b in self.heldout)

    def reference(self, fp32_path: Path) -> list:
        """FP32 outputs on the held-out feeds, computed once for every gate evaluation."""
        if self._reference is None:
            from trt_seer.eval.evaluate import run_batches, session

            self._reference = run_batches(session(fp32_path), self.heldout)
        return self._reference


def _npz_batches(folder: Path) -> list[dict]:
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise InputError(f"calibration directory {folder} holds no .npz token batches")
    out = []
    for f in files:
        try:
            with np.load(f) as z:
                out.append({k: z[k].astype(np.int64) for k in z.files})
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # torn, empty, not an .npz
            raise InputError(f"unreadable calibration batch {f}: {e}") from e
    return out


def split_heldout(items: list) -> tuple[list, list]:
    """(calibration, held-out): every HELDOUT_EVERY-th item is held out and never calibrated on."""
    held = items[HELDOUT_EVERY - 1::HELDOUT_EVERY]
    return [x for i, x in enumerate(items) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1], held


def _text_data(info: ModelInfo, quant: QuantStageSpec, profile: ShapeProfile, calibrates: bool) -> CalibData:
    if quant.calib is None:
        src, held = data.default_corpus("default"), data.default_corpus("heldout")
        texts, held_texts = data.load_texts(src), data.load_texts(held)
    else:
        texts, held_texts = split_heldout(data.load_texts(Path(quant.calib), quant.text_field))
    calib = []
    if calibrates:  # weight-only INT8 reads no calibration data: no batch to fill
        texts = texts[:quant.calib_samples]
        check_calib_count(len(texts), quant.calib_batch, "calibration data")
        calib = list(data.token_batches(info, texts, profile, quant.calib_batch))
    heldout = list(data.token_batches(info, held_texts[:HELDOUT_SAMPLES], profile, 16)) if held_texts else []
    return CalibData(calib, heldout, str(quant.calib) if quant.calib is not None else SHIPPED_HELDOUT)


def check_calib_count(usable: int, batch: int, what: str) -> None:
    """InputError when calibration has fewer samples than one batch."""
    if usable < batch:
        count = f"{usable} calibration sample{'' if usable == 1 else 's'}"
        raise InputError(f"{what} has {count} (after the held-out split), fewer than one batch ({batch}); "
                         "pass more data or a smaller --calib-batch")


def load_calib_data(info: ModelInfo, quant: QuantStageSpec, profile: ShapeProfile,
                    calibrates: bool = True) -> CalibData:
    """Calibration batches (only when `calibrates`) and at least MIN_HELDOUT_SAMPLES held-out
    samples for the gate: the user's held-out share, else the shipped held-out corpus."""
    if quant.calib is not None and Path(quant.calib).is_dir():
        batches = _npz_batches(Path(quant.calib))
        calib, held = split_heldout(batches)
        cd = CalibData(calib or batches, held, str(quant.calib))
    elif quant.calib is not None and not Path(quant.calib).exists():
        raise InputError(f"calibration data not found: {quant.calib}")
    else:
        cd = _text_data(info, quant, profile, calibrates)
    return _enough_heldout(info, cd, profile)


def _enough_heldout(info: ModelInfo, cd: CalibData, profile: ShapeProfile) -> CalibData:
    """`cd`, its held-out samples replaced by the shipped corpus's (random token ids for a model
    without a tokenizer) when it has fewer than MIN_HELDOUT_SAMPLES, said in the log."""
    given = cd.heldout_samples
    if given >= MIN_HELDOUT_SAMPLES:
        return cd
    if data.has_tokenizer(info):
        texts = data.load_texts(data.default_corpus("heldout"))[:HELDOUT_SAMPLES]
        held, source = list(data.token_batches(info, texts, profile, 16)), SHIPPED_HELDOUT
    else:
        from trt_seer.eval.evaluate import EvalSpec, eval_batches

        held, source = eval_batches(info, EvalSpec(samples=HELDOUT_SAMPLES)), "random token ids (no tokenizer)"
    log.warning("warning: %s gives %d held-out sample%s, fewer than the %d the accuracy check needs: it runs "
                "on %s instead (%d samples)", cd.heldout_data, given, "" if given == 1 else "s",
                MIN_HELDOUT_SAMPLES, source, sum(len(b["input_ids"]) for b in held))
    return CalibData(cd.calib, held, source)


def cache_path(info: ModelInfo, quant: QuantStageSpec) -> Path:
    """Where calibration.cache goes: --calib-cache, else `<out>/calib/<name>/calibration.cache`."""
    if quant.calib_cache:
        return Path(quant.calib_cache)
    return Path(quant.out) / "calib" / info.name / "calibration.cache"


def _ranges(fp32_path: Path, tensors: dict, cd: CalibData, quant: QuantStageSpec) -> dict[str, float]:
    """amax per activation tensor: from a seed cache (--from-cache) or by calibration."""
    from trt_seer.quantize import calibrate

    names = sorted(set(tensors.values()))
    seed = quant.from_cache
    if seed:
        scales = calibrate.read_cache(Path(seed))
        missing = [n for n in names if n not in scales]
        if missing:
            raise InputError(f"calibration cache {seed} is for other tensors: it lacks {len(missing)} of "
                             f"{len(names)} (e.g. {missing[0]})")
        return {n: scales[n] * calibrate.INT8_MAX for n in names}
    log.info("calibrating %d activation tensors on %d batches (%s) ...", len(names), len(cd.calib),
             quant.calib_method)
    return calibrate.collect_ranges(fp32_path, cd.calib, names, calibrate.CalibSpec(method=quant.calib_method))


def _write_cache(path: Path, amax: dict[str, float]) -> None:
    from trt_seer.quantize import calibrate
    from trt_seer.engine import trt

    v = trt.load().version if trt.available() else None
    tag = calibrate.cache_version_tag(v.major, v.minor, v.micro) if v else "0"
    ensure_out_dir(path.parent)
    calibrate.write_cache(path, calibrate.scales_from_ranges(amax), tag)


def resolve_mode(quant: QuantStageSpec) -> str:
    """`--int8-mode auto` is weight-only everywhere: TensorRT-RTX runs INT8 only as weight-only
    GEMMs, and no W8A8 engine has yet given a correct output on a GPU (NaN under TensorRT-RTX,
    docs/BENCHMARKS.md), so W8A8 is only built when asked for by name."""
    mode = quant.int8_mode
    return "weight-only" if mode == "auto" else mode


def gemm_counts(total: int, excluded) -> dict:
    """How many GEMMs stay INT8 out of `total`, and the names the gate's fallback put back in FP16."""
    return {"int8": total - len(excluded), "total": total, "fp16_fallback": sorted(excluded)}


def check_int8_left(counts: dict, allow_no_int8: bool, table: str = "") -> None:
    """AccuracyGateError when no GEMM is INT8 (the "INT8" engine would be an FP16 engine), unless
    `allow_no_int8`, which only warns."""
    if counts["int8"] > 0:
        return
    why = (f"no GEMM remains INT8 (0 of {counts['total']}; {len(counts['fp16_fallback'])} put back in FP16 "
           "by the accuracy gate's fallback): the INT8 engine would be an FP16 engine")
    if not allow_no_int8:
        raise AccuracyGateError(why + "; loosen the gate, or pass --allow-no-int8 to accept it"
                                + ("; the table above has every attempt" if table else ""))
    log.warning("warning: %s; kept because of --allow-no-int8", why)


def _quantized(fp16_path: Path, dest: Path, amax_by_input: dict, exclude: frozenset, task: str, attention: bool,
               weight_only: bool = False) -> int:
    """Writes the Q/DQ graph with `exclude` kept in FP16; returns how many GEMMs are INT8."""
    from trt_seer.quantize import qdq as quantize

    model = onnxio.load(fp16_path)
    targets = quantize.find_targets(model, quantize.QuantSpec(attention, exclude, weight_only), task)
    quantize.qdq_model(model, amax_by_input, targets)
    onnxio.save(model, dest)
    return len(targets)


def check_spec(quant: QuantStageSpec) -> None:
    """Fails fast (before any export) on unusable calibration data or a malformed seed cache."""
    from trt_seer.quantize import calibrate

    src = Path(quant.calib) if quant.calib is not None else None
    if src is not None and src.is_dir():
        _npz_batches(src)
    elif src is not None:
        usable = len(split_heldout(data.load_texts(src, quant.text_field))[0])
        if resolve_mode(quant) == "w8a8":  # weight-only INT8 calibrates nothing
            check_calib_count(min(usable, quant.calib_samples), quant.calib_batch, str(src))
    if quant.from_cache:
        calibrate.read_cache(Path(quant.from_cache))
        if resolve_mode(quant) == "weight-only":
            raise InputError("--from-cache seeds activation ranges, which weight-only INT8 (the default) does not "
                             "use; add --int8-mode w8a8, or drop --from-cache")
    if resolve_mode(quant) == "w8a8":
        log.warning("warning: --int8-mode w8a8 is unverified on a GPU: no W8A8 engine has yet given a correct "
                    "output (TensorRT-RTX returned NaN); the default (auto) is weight-only")
    if quant.calib_cache:  # the default place, under --out, is checked with --out
        ensure_out_dir(Path(quant.calib_cache).parent)
    qat_ranges.for_build(quant.model, resolve_mode(quant), quant)


def data_fingerprint(quant: QuantStageSpec) -> str:
    if quant.calib is None:
        return sha256_json([sha256_file(data.default_corpus(s)) for s in ("default", "heldout")])
    src = Path(quant.calib)
    if src.is_dir():
        return sha256_json([sha256_file(f) for f in sorted(src.glob("*.npz"))])
    if not src.is_file():
        raise InputError(f"calibration data not found: {src}")
    return sha256_file(src)


def _key(fp32: dict, fp16: dict, quant: QuantStageSpec, gate: Gate) -> str:
    seed = quant.from_cache
    return sha256_json({
        "fp32": fp32["sha256"], "fp16": fp16["sha256"], "data": data_fingerprint(quant),
        "samples": quant.calib_samples, "batch": quant.calib_batch, "method": quant.calib_method,
        "profile": [list(quant.batch), list(quant.seq)], "attention": quant.int8_attention,
        "smooth": quant.smooth_alpha, "mode": resolve_mode(quant),
        "gate": [gate.min_cosine, gate.min_cosine_each, gate.min_top1],
        "seed": sha256_file(Path(seed)) if seed and Path(seed).is_file() else seed, "trt_seer": __version__,
        "cpu": CPU_INT8_FORM,
        "qat": qat_ranges.fingerprint(Path(fp32["source"]["checkpoint"])),
    })


def _smoothed(fp32_path: Path, nodes: list[str], cd: CalibData, alpha: float, work: Path,
              learned=None) -> tuple[Path, Path]:
    """SmoothQuant-rewritten FP32 and FP16 graphs in `work`; `learned(groups)` gives the scales
    that finetune --qat-smoothing learned instead of computing them from the calibration data."""
    from trt_seer.quantize import smooth
    from trt_seer.export.precision import fp16_from_onnx

    model = onnxio.load(fp32_path)
    xs = smooth.groups(model, nodes)
    if learned is not None:
        log.info("smoothing %d activation groups with the scales trained by finetune --qat ...", len(xs))
        smooth.smooth_model(model, {}, alpha, nodes, learned(xs))
    else:
        log.info("smoothing %d activation groups (alpha %.2f) ...", len(xs), alpha)
        smooth.smooth_model(model, smooth.channel_absmax(fp32_path, cd.calib[:8], list(xs)), alpha, nodes)
    s32 = onnxio.save(model, work / "smooth.fp32.onnx")
    return s32, fp16_from_onnx(s32, work / "smooth.fp16.onnx")


def int8_onnx(info: ModelInfo, art: records.Artifacts, fp32: dict, fp16: dict, quant: QuantStageSpec) -> dict:
    """Builds (or reuses) the gated Q/DQ ONNX from the FP32 and FP16 graphs' records; returns its record."""
    import tempfile

    gate = Gate(quant.min_cosine, quant.min_cosine_each, quant.min_top1)
    dest, key = art.path("int8.onnx"), _key(fp32, fp16, quant, gate)
    record = None if quant.force else records.up_to_date(dest, manifest.record_path(dest), key)
    if record and not isinstance(record.get("quantization", {}).get("int8_gemms"), dict):
        record = None  # written before GEMM counts were recorded: redo it
    if record:
        log.info("int8 ONNX up to date: %s", dest)
        _log_counts(record["quantization"]["int8_gemms"])
        check_int8_left(record["quantization"]["int8_gemms"], quant.allow_no_int8)
        return record
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=art.out) as work:  # both INT8 graphs are staged here
        extra = _calibrate_and_gate(info, art, quant, gate, Path(work))
        return write_int8_record(Path(work) / dest.name, dest, fp32, fp16, key, extra)


def _log_counts(counts: dict) -> None:
    log.info("INT8 GEMMs: %d of %d%s", counts["int8"], counts["total"],
             f" ({len(counts['fp16_fallback'])} kept in FP16: {', '.join(counts['fp16_fallback'])})"
             if counts["fp16_fallback"] else "")


def _fp16_base(art: records.Artifacts, quant: QuantStageSpec, mode: str, work: Path) -> tuple[Path, dict]:
    """(the FP16 graph the Q/DQ nodes go into, its `graph_form`): weight-only INT8 writes its Q/DQ into
    fp16.onnx (an encoder's has each attention fused: export/engine_form.py); W8A8, whose activation
    ranges, SmoothQuant scales and --int8-attention Q/DQ are the decomposed graph's tensors, into the
    FP16 typing of the FP32 graph as exported."""
    from trt_seer.export.precision import fp16_from_onnx

    fp16 = art.path("fp16.onnx")
    form = (manifest.read_if_exists(manifest.record_path(fp16)) or {}).get("graph_form", {})
    if mode == "weight-only" or form.get("attention", "decomposed") == "decomposed":
        return fp16, {"graph_form": form} if form else {}
    form = {**form, "attention": "decomposed", "reason": "W8A8 Q/DQ go on the exported graph's tensors"}
    return fp16_from_onnx(art.path("fp32.onnx"), work / "decomposed.fp16.onnx"), {"graph_form": form}


def _calibrate_and_gate(info: ModelInfo, art: records.Artifacts, quant: QuantStageSpec, gate: Gate, work: Path) -> dict:
    from trt_seer.eval import evaluate
    from trt_seer.quantize import qdq as quantize

    fp32_path, dest, staged = art.path("fp32.onnx"), art.path("int8.onnx"), work / art.path("int8.onnx").name
    mode = resolve_mode(quant)
    cd = load_calib_data(info, quant, ShapeProfile(tuple(quant.batch), tuple(quant.seq)), mode == "w8a8")
    base16, form = _fp16_base(art, quant, mode, work)
    targets = quantize.find_targets(onnxio.load(base16, False), quantize.QuantSpec(quant.int8_attention), info.task)
    nodes = [t.node for t in targets]
    qat = qat_ranges.for_build(info.path, mode, quant)  # ranges trained by finetune --qat: no calibration
    src32 = fp32_path
    modules = qat_ranges.build_modules(fp32_path, targets, info.path) if qat else None
    if quant.smooth_alpha > 0 and mode == "w8a8":  # smoothing only helps activation quantization
        learned = None
        if qat and qat.smoothing:
            def learned(xs):
                return qat_ranges.smooth_scales(qat, modules, xs)
        src32, base16 = _smoothed(fp32_path, nodes, cd, quant.smooth_alpha, work, learned)
    tensors = quantize.activation_tensors(onnxio.load(src32, False), targets)
    if qat:
        amax_t = qat_ranges.build_amax(qat, modules, targets, tensors)
    elif mode == "weight-only":  # the graph keeps no activation range: nothing to calibrate
        amax_t = {}
        log.info("weight-only INT8: activations stay FP16, so no calibration runs")
    else:
        amax_t = _ranges(src32, tensors, cd, quant)
    if amax_t:
        _write_cache(cache_path(info, quant), amax_t)
    amax = {k: amax_t[t] for k, t in tensors.items() if t in amax_t}
    log.info("writing the %s Q/DQ graph ...", mode)
    excluded, metrics, fails, rows = fallback(
        lambda ex: _quantized(base16, staged, amax, ex, info.task, quant.int8_attention, mode == "weight-only"),
        lambda: evaluate.compare_onnx(info, cd.reference(fp32_path), staged, cd.heldout), gate, info.task,
        lambda: rank_by_added_error(fp32_path, staged, cd.heldout, nodes))
    table = gate_table(rows)
    log.info("INT8 accuracy vs FP32 on %d held-out samples (%s):\n%s", metrics["samples"], cd.heldout_data, table)
    if fails:
        dest.unlink(missing_ok=True)
        raise AccuracyGateError("INT8 cannot pass the accuracy gate even with every layer in FP16 ("
                                + "; ".join(fails) + "); the table above has every attempt")
    counts = gemm_counts(len(targets), excluded)
    _log_counts(counts)
    try:
        check_int8_left(counts, quant.allow_no_int8, table)
    except AccuracyGateError:
        dest.unlink(missing_ok=True)
        raise
    return {
        **form,
        "calibration": {"method": quant.calib_method if amax_t else "none (weight-only: no activation ranges)",
                        "batches": len(cd.calib) if amax_t else 0,
                        "data": (quant.calib or "calib/default.txt") if amax_t else None,
                        "cache": str(cache_path(info, quant)) if amax_t else None, "seeded_from": quant.from_cache,
                        "smooth_alpha": quant.smooth_alpha,
                        "qat_ranges": str(qat.path) if qat else None,
                        "smoothing": "learned (qat_ranges.json)" if qat and qat.smoothing else "SmoothQuant"},
        "quantization": {"mode": mode, "int8_gemms": counts, "attention": quant.int8_attention and mode == "w8a8"},
        "accuracy": {"onnx_vs_fp32": evaluate.accuracy_entry(metrics, dest, fp32_path),
                     "gate": {"passed": True, "thresholds": gate.__dict__, "measured_on": evaluate.measured_on(dest),
                              "heldout": {"samples": metrics["samples"], "data": cd.heldout_data,
                                          "minimum": MIN_HELDOUT_SAMPLES},
                              "table": [[r[0], r[1], not r[2]] for r in rows]}},
        "cpu": _cpu_int8(info, art, cd, gate)}


def _cpu_int8(info: ModelInfo, art: records.Artifacts, cd: CalibData, gate: Gate) -> dict:
    """The CPU backend's own INT8 artifact (`<name>.int8.cpu.onnx`): ONNX Runtime's dynamic INT8
    MatMuls and QAttention (per-channel S8 weights, U8 activations quantized at run time) on the
    fused CPU graph (`fp32.cpu.onnx`; else the plain graph's MatMuls), which its CPU kernels run
    faster than FP32, unlike TensorRT-style S8 Q/DQ graphs (docs/DESIGN.md has the measured
    alternatives). Gated against the FP32 graph the same way; the fallback keeps the fused graph's
    own MatMuls and Attentions that add the most error in FP32."""
    from trt_seer.eval import evaluate
    from trt_seer.quantize import qdq as quantize

    fused = art.path("fp32.cpu.onnx")
    fp32_path, dest = art.path("fp32.onnx"), art.path("int8.cpu.onnx")
    src = fused if records.present(fused) else fp32_path
    ops = CPU_INT8_OPS if src == fused else ("MatMul",)
    log.info("writing the CPU INT8 graph (ONNX Runtime dynamic INT8 on %s) ...", src.name)
    with staging_dir(dest) as work:  # published with its record once it passes the gate
        staged = work / dest.name
        excluded, metrics, fails, rows = fallback(
            lambda ex: quantize.ort_dynamic_int8(src, staged, ex, ops),
            lambda: evaluate.compare_onnx(info, cd.reference(fp32_path), staged, cd.heldout), gate, info.task,
            lambda: rank_by_added_error(src, staged, cd.heldout, None, ("MatMul", "Gemm", *ops)))
        log.info("CPU INT8 accuracy vs FP32 on %d held-out samples (%s; layers kept out of INT8 stay FP32):\n%s",
                 metrics["samples"], cd.heldout_data, gate_table(rows))
        if fails:
            dest.unlink(missing_ok=True)
            log.warning("warning: no CPU INT8 artifact: it cannot pass the gate (%s)", "; ".join(fails))
            return {"file": None, "reason": "; ".join(fails)}
        fp32 = manifest.read(manifest.record_path(fp32_path))
        accuracy = evaluate.accuracy_entry(metrics, dest, fp32_path)
        record = records.publish_record(staged, dest, {
            **records.inherit(fp32), "precision": "int8", "form": CPU_INT8_FORM, "source_graph": src.name,
            "fp32_sha256": fp32["sha256"], "fp32_gemms": sorted(excluded), "accuracy": {"onnx_vs_fp32": accuracy}})
    return {"file": dest.name, "sha256": record["sha256"], "source_graph": src.name, "fp32_gemms": sorted(excluded),
            "accuracy": accuracy}


def write_int8_record(staged: Path, dest: Path, fp32: dict, fp16: dict, key: str, extra: dict) -> dict:
    """Publishes the Q/DQ graph staged at `staged` as `dest` with its record."""
    return records.publish_record(staged, dest, {**records.inherit(fp32), "precision": "int8", "key": key, "fp32_sha256": fp32["sha256"],
                                        "fp16_sha256": fp16["sha256"], **extra})
