"""Accuracy diff of an engine or ONNX artifact against FP32 ONNX, FP16 ONNX or PyTorch, run through
Polygraphy: ONNX Runtime on CPU, TensorRT(-RTX) where it runs on a GPU, PyTorch through a runner here.

    python -m trt_seer diff engines/all-MiniLM-L6-v2.fp16.manifest.json --against fp32 --report out/

    from trt_seer.eval.diff import DiffSpec, diff, resolve_target
    result = diff(resolve_target(Path("engines/all-MiniLM-L6-v2.fp16.onnx.json")), DiffSpec())

Gates by the candidate's precision: FP32 elementwise (atol = rtol = 1e-4); FP16 elementwise
(1e-2) and the task metric; INT8 the task metric only (elementwise errors are reported). An engine
is compared only where a TensorRT runtime runs on a GPU; its ONNX graph is always compared, and a
skipped comparison is reported with its reason.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trt_seer.engine import manifest
from trt_seer.errors import DependencyError, InputError

PRECISIONS = ("fp32", "fp16", "int8")  # most to least precise
AGAINST = ("fp32", "pytorch", "fp16")
HIST_EDGES = np.linspace(-10.0, 2.0, 61)  # log10 |error| bins of the histograms
MASK_SCRIPT_NAME = "mask_padding.py"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    gating: bool  # whether the elementwise check decides pass/fail


DEFAULT_TOLERANCES = {
    "fp32": Tolerance(1e-4, 1e-4, True),
    "fp16": Tolerance(1e-2, 1e-2, True),
    "int8": Tolerance(1e-1, 1e-1, False),  # INT8 is judged by the task metric
}
TASK_GATED = frozenset({"fp16", "int8"})


@dataclass(frozen=True)
class Target:
    """The artifact under test, named by an engine manifest, an ONNX record or an .onnx file."""

    path: Path
    kind: str  # "engine" | "onnx"
    name: str
    precision: str
    record: Path | None  # the manifest / record that receives the results (None for a bare .onnx)
    data: dict  # its contents ({} when there is none)

    def artifact(self, suffix: str) -> Path:
        return self.path.parent / f"{self.name}.{suffix}"


@dataclass(frozen=True)
class DiffSpec:
    against: str | None = None  # None: PyTorch for an FP32 ONNX, else the FP32 ONNX
    samples: int = 128
    data: Path | None = None  # held-out text (default: calib/heldout.txt)
    text_field: str = "text"
    atol: tuple[tuple[str, float], ...] = ()  # ("", v) applies to every output
    rtol: tuple[tuple[str, float], ...] = ()
    model: Path | None = None  # checkpoint override (default: manifest["source"]["checkpoint"])
    task: str | None = None
    layers: bool | None = None  # per-layer error profile (default: for INT8 candidates)
    verbose: bool = False


@dataclass(frozen=True)
class Side:
    """One runner of the comparison."""

    label: str  # runner name: "pytorch-fp32", "onnxrt-fp16", "tensorrt-fp16"
    backend: str  # "pytorch" | "onnxrt" | "tensorrt"
    precision: str
    path: Path | None = None


@dataclass
class DiffResult:
    target: Target
    task: str
    against: str
    reference: Side
    candidates: list[Side]
    skipped: list[dict]
    batches: list[dict]
    run_results: object  # polygraphy RunResults as produced: candidates first, the reference last
    compared: object = None  # the same with token-level outputs zeroed at padded positions
    comparisons: list[dict] = field(default_factory=list)
    histograms: dict = field(default_factory=dict)  # (candidate, output) -> counts over HIST_EDGES
    layers: list[dict] | None = None
    layer_pair: tuple[Path, Path] | None = None

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.comparisons)

    @property
    def samples(self) -> int:
        return int(sum(len(next(iter(b.values()))) for b in self.batches))


# --- what to compare -------------------------------------------------------------------------

def _split_name(path: Path, suffix: str) -> tuple[str, str]:
    stem = path.name.removesuffix(suffix)
    name, _, precision = stem.rpartition(".")
    if not name or precision not in PRECISIONS:
        raise InputError(f"cannot tell name and precision from {path.name}; expected "
                         f"<name>.<{'|'.join(PRECISIONS)}>{suffix}")
    return name, precision


def resolve_target(path: Path) -> Target:
    """Reads the manifest / record named by `path` (InputError if missing or malformed)."""
    path = Path(path)
    if path.name.endswith(".manifest.json"):
        data = manifest.read_engine_manifest(path)
        return Target(path, "engine", *_split_name(path, ".manifest.json"), path, data)
    if path.name.endswith(".onnx.json"):
        data = manifest.read(path)
        return Target(path, "onnx", *_split_name(path, ".onnx.json"), path, data)
    if path.suffix == ".onnx":
        if not path.is_file():
            raise InputError(f"no such artifact: {path}")
        data = manifest.read_if_exists(manifest.record_path(path)) or {}
        return Target(path, "onnx", *_split_name(path, ".onnx"), None, data)
    raise InputError(f"{path} is neither an engine manifest (*.manifest.json), an ONNX record "
                     "(*.onnx.json) nor an .onnx file")


def model_info(target: Target, spec: DiffSpec):
    """The checkpoint (for PyTorch and the tokenizer) and the task."""
    from trt_seer.export.families import resolve_model

    ckpt = spec.model or target.data.get("source", {}).get("checkpoint")
    if not ckpt:
        raise InputError(f"{target.path.name} records no source checkpoint; pass --model DIR")
    return resolve_model(Path(ckpt), spec.task or target.data.get("task"))


def default_against(target: Target) -> str:
    return "pytorch" if target.kind == "onnx" and target.precision == "fp32" else "fp32"


def _onnx_side(target: Target, precision: str) -> Side:
    path = target.artifact(f"{precision}.onnx")
    if not path.is_file():
        hint = "trt-seer export --fp16" if precision != "int8" else "trt-seer build --int8"
        raise InputError(f"no such artifact: {path} (make it with `{hint}`)")
    return Side(f"onnxrt-{precision}", "onnxrt", precision, path)


def reference_side(target: Target, against: str) -> Side:
    if against not in AGAINST:
        raise InputError(f"unknown --against {against!r}; choose one of {', '.join(AGAINST)}")
    if against == "pytorch":
        return Side("pytorch-fp32", "pytorch", "fp32")
    return _onnx_side(target, against)


def plan(target: Target, against: str) -> tuple[Side, list[Side], list[dict]]:
    """(reference, candidates, skipped): the target's ONNX graph always, its engine where it runs."""
    ref = reference_side(target, against)
    cands, skipped = [], []
    onnx_path = target.artifact(f"{target.precision}.onnx")
    if target.kind == "onnx" or onnx_path.is_file():
        cand = _onnx_side(target, target.precision)  # a missing ONNX target is an input error
        if cand.path != ref.path:
            cands.append(cand)
    else:
        skipped.append({"comparison": f"onnxrt-{target.precision} vs {ref.label}",
                        "reason": f"{onnx_path.name} not found beside the engine"})
    if target.kind == "engine":
        engine = _engine_side(target)
        reason = engine_unavailable_reason(target.data)
        if reason:
            skipped.append({"comparison": f"{engine.label} vs {ref.label}", "reason": reason})
        else:
            cands.append(engine)
    if not cands and not skipped:
        raise InputError(f"{target.path.name} is the --against {against} reference itself; choose another --against")
    return ref, cands, skipped


def _engine_side(target: Target) -> Side:
    path = target.path.parent / target.data["engine"].get("file", f"{target.name}.{target.precision}.engine")
    if not path.is_file():
        raise InputError(f"no such artifact: {path} (rebuild it with `trt-seer build`)")
    return Side(f"tensorrt-{target.precision}", "tensorrt", target.precision, path)


# --- can an engine run here ------------------------------------------------------------------

def engine_unavailable_reason(engine_manifest: dict) -> str | None:
    """Why this engine cannot run here, or None: the runtime's own answers (TensorRT importable
    and driving GPU 0, then the manifest's flavor, release and targets against them)."""
    from trt_seer import runtime
    from trt_seer.engine import trt
    from trt_seer.errors import ManifestMismatchError
    from trt_seer.runtime import cuda
    from trt_seer.runtime.engine import check_manifest

    reason = runtime.tensorrt_unavailable_reason()
    if reason:
        return reason
    gpu = cuda.device_info(0)
    try:
        check_manifest(engine_manifest, trt.load().describe(), gpu.compute_capability, gpu.name)
    except ManifestMismatchError as e:
        return str(e)
    return None


# --- runners ----------------------------------------------------------------------------------

def torch_runner(info, name: str):
    """A Polygraphy runner for the checkpoint in PyTorch (FP32, CPU), with the ONNX graph's I/O."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class TorchRunner(BaseRunner):
        def activate_impl(self):
            from trt_seer.export.checkpoint import load_model, wrap

            self.module = wrap(load_model(info), info)

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for n in info.inputs:
                meta.add(n, np.int64, (None, None))  # (batch, seq)
            return meta

        def infer_impl(self, feed_dict):
            from collections import OrderedDict

            from trt_seer.export.checkpoint import torch_outputs

            start = time.perf_counter()
            outs = torch_outputs(self.module, {n: feed_dict[n] for n in info.inputs})
            self.inference_time = time.perf_counter() - start
            return OrderedDict(zip(info.outputs, outs))

        def deactivate_impl(self):
            del self.module

    return TorchRunner(name=name)


def trt_runner(side: Side):
    """Polygraphy's TensorRT runner; Polygraphy selects TensorRT-RTX by an environment variable."""
    from trt_seer.engine import trt

    if trt.load().is_rtx:
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
        import polygraphy.config

        polygraphy.config.USE_TENSORRT_RTX = True  # in case polygraphy was imported before
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(side.path))), name=side.label)


def make_runner(side: Side, info):
    if side.backend == "pytorch":
        return torch_runner(info, side.label)
    if side.backend == "tensorrt":
        return trt_runner(side)
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    return OnnxrtRunner(SessionFromOnnx(str(side.path)), name=side.label)


def run_sides(sides: list[Side], info, batches: list[dict]):
    """Comparator.run over `sides` (in that order) -> RunResults."""
    from polygraphy.comparator import Comparator
    from polygraphy.exception import PolygraphyException

    runners = [make_runner(s, info) for s in sides]
    try:
        return Comparator.run(runners, data_loader=batches)
    except PolygraphyException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"Polygraphy could not run {', '.join(s.label for s in sides)}: {first}") from e


# --- data and tolerances ---------------------------------------------------------------------

def eval_data(info, target: Target, spec: DiffSpec) -> list[dict]:
    """Held-out batches, within the engine's shape profile when the target is an engine."""
    from trt_seer import data
    from trt_seer.eval.evaluate import EvalSpec, eval_batches

    profile = (target.data.get("profiles") or [None])[0]
    if profile is None:
        ev = EvalSpec(samples=spec.samples)
    else:
        ev = EvalSpec(samples=spec.samples, batch=min(16, profile["batch"][2]), max_seq=min(256, profile["seq"][2]))
    if spec.data is None:
        batches = eval_batches(info, ev)
    elif not data.has_tokenizer(info):
        raise InputError(f"--data needs the model's tokenizer.json; {info.path} has none")
    else:
        batches = eval_batches(info, ev, data.load_texts(Path(spec.data), spec.text_field))
    return batches if profile is None else fit_profile(batches, profile)


def fit_profile(batches: list[dict], profile: dict) -> list[dict]:
    """Feeds cut to the profile's max batch and seq, padded (mask 0) to its min seq; batches
    smaller than its min batch are dropped."""
    (b_lo, _, b_hi), (s_lo, _, s_hi) = profile["batch"], profile["seq"]
    out = []
    for feeds in batches:
        feeds = {k: v[:b_hi, :s_hi] for k, v in feeds.items()}  # (batch, seq)
        rows, seq = next(iter(feeds.values())).shape
        if seq < s_lo:
            feeds = {k: np.pad(v, ((0, 0), (0, s_lo - seq))) for k, v in feeds.items()}
        if rows >= b_lo:
            out.append(feeds)
    if not out:
        raise InputError(f"no held-out batch fits the engine's profile {profile}")
    return out


def gating_precision(ref: Side, cand: Side) -> str:
    """The less precise side decides the tolerances."""
    return max(ref.precision, cand.precision, key=PRECISIONS.index)


def parse_tolerance(option: str, text: str) -> tuple[str, float]:
    """'sentence_embedding=1e-3' -> ('sentence_embedding', 0.001); a bare '1e-3' -> ('', 0.001)."""
    name, sep, value = text.rpartition("=")
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not np.isfinite(v) or v < 0 or (sep and not name):
        raise InputError(f"malformed {option} {text!r}; use VALUE or OUTPUT=VALUE with VALUE >= 0, "
                         f"e.g. {option} sentence_embedding=1e-3")
    return name, v


def _override(pairs: tuple[tuple[str, float], ...], output: str, default: float) -> float:
    """The last value given for `output`, else the last bare one, else `default`."""
    named = [v for n, v in pairs if n == output]
    bare = [v for n, v in pairs if not n]
    return (named or bare or [default])[-1]


def tolerances(precision: str, outputs: list[str], spec: DiffSpec) -> dict[str, Tolerance]:
    """Per-output tolerances: the precision's defaults, overridden by --atol/--rtol."""
    unknown = sorted({n for n, _ in spec.atol + spec.rtol if n and n not in outputs})
    if unknown:
        raise InputError(f"unknown output {', '.join(map(repr, unknown))} in --atol/--rtol; "
                         f"outputs are {', '.join(outputs)}")
    base = DEFAULT_TOLERANCES[precision]
    return {o: Tolerance(_override(spec.atol, o, base.atol), _override(spec.rtol, o, base.rtol), base.gating)
            for o in outputs}


# --- comparing --------------------------------------------------------------------------------

def _iterations(run_results, label: str) -> list:
    return next(iters for name, iters in run_results if name == label)


def mask_padding(outputs: dict, mask: np.ndarray) -> dict:
    """Token-level outputs (batch, seq, ...) with padded positions (mask == 0) zeroed: padding is
    never consumed, and its values carry only noise. MASK_SCRIPT repeats this for Polygraphy."""
    keep = mask.astype(bool)[..., None]
    return {n: np.where(keep, a, 0).astype(a.dtype) if a.ndim == 3 and a.shape[:2] == mask.shape else a
            for n, a in outputs.items()}


MASK_SCRIPT = '''"""Polygraphy post-processing (--postprocess-func-script): zeroes token-level outputs at padded
positions (attention_mask == 0 in inputs.json), as `trt-seer diff` compares them."""
import collections
import sys
import types

import numpy as np
from polygraphy.json import load_json

# Polygraphy re-imports this script for every call, so the per-runner iteration count lives in a
# module of its own that survives the re-import.
STATE = sys.modules.setdefault("mask_padding_state", types.ModuleType("mask_padding_state"))
if not hasattr(STATE, "seen"):
    STATE.masks = [feed["attention_mask"].astype(bool) for feed in load_json("inputs.json")]
    STATE.seen = collections.Counter()


def postprocess_outputs(result):
    mask = STATE.masks[STATE.seen[result.runner_name] % len(STATE.masks)]  # iterations come in order
    STATE.seen[result.runner_name] += 1
    for name, arr in list(result.items()):
        if arr.ndim == 3 and arr.shape[:2] == mask.shape:
            result[name] = np.where(mask[..., None], arr, 0).astype(arr.dtype)
    return result
'''


def masked_results(run_results, batches: list[dict]):
    """A RunResults with every iteration passed through mask_padding (the arrays are new)."""
    from polygraphy.comparator import IterationResult, RunResults

    out = RunResults()
    for name, iters in run_results:
        out[name] = [IterationResult(mask_padding(dict(it), b["attention_mask"]) if "attention_mask" in b else dict(it),
                                     it.runtime, name) for it, b in zip(iters, batches)]
    return out


def elementwise(run_results, ref: Side, cand: Side, tols: dict[str, Tolerance]) -> dict[str, bool]:
    """Polygraphy's elementwise check of `cand` against `ref`: {output: passed in every iteration}."""
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    func = SimpleCompareFunc(atol={o: t.atol for o, t in tols.items()}, rtol={o: t.rtol for o, t in tols.items()},
                             check_error_stat="elemwise")
    names = [name for name, _ in run_results]
    acc = Comparator.compare_accuracy(run_results, compare_func=func,
                                      comparisons=[(names.index(cand.label), names.index(ref.label))])
    iterations = acc[0][(cand.label, ref.label)]
    return {o: all(bool(it[o]) for it in iterations) for o in tols}


def _rows(arr: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(n, d) rows over the last axis; token-level outputs keep only unmasked positions."""
    if mask is not None and arr.ndim == 3 and arr.shape[:2] == mask.shape:
        return arr[mask.astype(bool)]
    return arr.reshape(-1, arr.shape[-1]) if arr.ndim >= 2 else arr.reshape(1, -1)


def output_stats(name: str, refs: list, cands: list, batches: list[dict]) -> tuple[dict, np.ndarray]:
    """Errors of one output over all iterations (unmasked positions), and its log10 |error| histogram."""
    from trt_seer.eval.metrics import cosine_rows

    cos, abs_err, rel_err = [], [], []
    for r, c, b in zip(refs, cands, batches):
        mask = b.get("attention_mask")
        rr, cr = _rows(r[name], mask).astype(np.float64), _rows(c[name], mask).astype(np.float64)
        cos.append(cosine_rows(rr, cr))
        abs_err.append(np.abs(cr - rr).ravel())
        rel_err.append(abs_err[-1] / np.maximum(np.abs(rr).ravel(), np.finfo(np.float64).eps))  # Polygraphy's eps
    cos, abs_err, rel_err = (np.concatenate(x) for x in (cos, abs_err, rel_err))
    hist = np.histogram(np.clip(np.log10(np.maximum(abs_err, 1e-30)), HIST_EDGES[0], HIST_EDGES[-1]), HIST_EDGES)[0]
    return {"max_abs": float(abs_err.max()), "mean_abs": float(abs_err.mean()), "max_rel": float(rel_err.max()),
            "mean_rel": float(rel_err.mean()), "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())}, hist


def task_gate(task: str, metrics: dict, precision: str) -> dict:
    from trt_seer.quantize.int8 import Gate

    gate = Gate()
    failures = gate.check(task, metrics)
    return {"gating": precision in TASK_GATED, "passed": not failures, "failures": failures,
            "thresholds": dict(gate.__dict__)}


def compare(result: DiffResult, cand: Side, spec: DiffSpec) -> dict:
    """One candidate against the reference: per-output errors, the task metric and the verdict."""
    from trt_seer.eval.evaluate import compare_outputs

    ref = result.reference
    refs, cands = _iterations(result.run_results, ref.label), _iterations(result.run_results, cand.label)
    precision = gating_precision(ref, cand)
    tols = tolerances(precision, list(refs[0].keys()), spec)
    within = elementwise(result.compared, ref, cand, tols)
    outputs = {}
    for name, tol in tols.items():
        stats, result.histograms[(cand.label, name)] = output_stats(name, refs, cands, result.batches)
        outputs[name] = {**stats, "elementwise_passed": within[name], "atol": tol.atol, "rtol": tol.rtol,
                         "gating": tol.gating}
    metrics = compare_outputs(result.task, refs, cands, result.batches)
    gate = task_gate(result.task, metrics, precision)
    passed = all(o["elementwise_passed"] for o in outputs.values() if o["gating"])
    passed = passed and (gate["passed"] or not gate["gating"])
    return {"reference": ref.label, "candidate": cand.label, "precision": precision, "passed": passed,
            "outputs": outputs, "task_metrics": metrics, "task_gate": gate}


# --- the whole diff ---------------------------------------------------------------------------

def _layer_pair(result: DiffResult) -> tuple[tuple[Path, Path] | None, str | None]:
    """((reference ONNX, candidate ONNX), None) for the layer profile, or (None, why not)."""
    cand = next((c for c in result.candidates if c.backend == "onnxrt"), None)
    if cand is None:
        return None, "no ONNX candidate ran"
    ref = result.reference
    ref_path = ref.path if ref.backend == "onnxrt" else result.target.artifact("fp32.onnx")
    if not ref_path.is_file():
        return None, f"{ref_path.name} not found"
    if ref_path == cand.path:
        return None, "the candidate is the FP32 reference graph"
    return (ref_path, cand.path), None


def profile_layers(result: DiffResult, spec: DiffSpec) -> None:
    """The per-layer error profile of the ONNX candidate (on by default for INT8)."""
    from trt_seer.quantize.layers import layer_error_profile

    if not (spec.layers if spec.layers is not None else result.target.precision == "int8"):
        return
    pair, reason = _layer_pair(result)
    if reason:
        result.skipped.append({"comparison": "per-layer error profile", "reason": reason})
        return
    result.layers = layer_error_profile(*pair, result.batches[:4])  # 4 batches: up to 64 samples
    result.layer_pair = pair


def polygraphy_logs(verbose: bool):
    """Polygraphy's log at INFO with -v, else silent (its critical errors still raise)."""
    from polygraphy.logger import G_LOGGER

    return G_LOGGER.verbosity(G_LOGGER.INFO if verbose else G_LOGGER.CRITICAL)


def diff(target: Target, spec: DiffSpec = DiffSpec()) -> DiffResult:
    """Runs the reference and every candidate that can run here on held-out data and compares them."""
    against = spec.against or default_against(target)
    ref, cands, skipped = plan(target, against)
    recorded = [o["name"] for o in target.data.get("io", {}).get("outputs", [])]
    if recorded:
        tolerances(ref.precision, recorded, spec)  # unknown output names fail before the slow part
    info = model_info(target, spec)
    if not cands:
        why = "; ".join(f"{s['comparison']}: {s['reason']}" for s in skipped)
        raise DependencyError(f"nothing can be compared here: {why}")
    batches = eval_data(info, target, spec)
    with polygraphy_logs(spec.verbose):
        run_results = run_sides(cands + [ref], info, batches)
        result = DiffResult(target, info.task, against, ref, cands, skipped, batches, run_results,
                            masked_results(run_results, batches))
        result.comparisons = [compare(result, c, spec) for c in cands]
    profile_layers(result, spec)
    return result


# --- output: table, report, manifest ---------------------------------------------------------

def task_output(task: str) -> str:
    return "sentence_embedding" if task == "feature-extraction" else "logits"


def _cos(x: float) -> str:
    """Cosine with its distance from 1 readable: 0.998731, or 1-2.1e-08 when that close."""
    return f"{x:.6f}" if x < 0.999999 else f"1-{max(1.0 - x, 0.0):.1e}"


def _task_text(task: str, m: dict) -> str:
    if task == "feature-extraction":
        return f"cos {_cos(m['mean_cosine'])} (min {_cos(m['min_cosine'])})"
    return f"top-1 {m['top1_agreement']:.4f}, KL {m['mean_kl']:.2e}"


def _verdict(out: dict, gate: dict, is_task_output: bool) -> str:
    checks = [out["elementwise_passed"]] if out["gating"] else []
    if is_task_output and gate["gating"]:
        checks.append(gate["passed"])
    if not checks:
        return "info (%s)" % ("within tol" if out["elementwise_passed"] else "over tol")
    return "PASS" if all(checks) else "FAIL"


TABLE_HEADER = ("comparison", "output", "max abs", "mean abs", "max rel", "mean rel", "cosine", "task metric", "result")


def table_rows(result: DiffResult) -> list[tuple[str, ...]]:
    rows = []
    for c in result.comparisons:
        for name, o in c["outputs"].items():
            is_task = name == task_output(result.task)
            rows.append((f"{c['candidate']} vs {c['reference']}", name, f"{o['max_abs']:.2e}", f"{o['mean_abs']:.2e}",
                         f"{o['max_rel']:.2e}", f"{o['mean_rel']:.2e}", _cos(o["mean_cosine"]),
                         _task_text(result.task, c["task_metrics"]) if is_task else "-",
                         _verdict(o, c["task_gate"], is_task)))
    return rows


def _headline(result: DiffResult) -> str:
    t = result.target
    return (f"{t.name} {t.precision} ({t.kind}) vs {result.against}: {result.samples} held-out samples in "
            f"{len(result.batches)} batches, task {result.task}")


def format_table(result: DiffResult) -> str:
    """The per-output table printed by the CLI, skipped comparisons and the overall verdict."""
    rows = [TABLE_HEADER, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    lines = [_headline(result)] + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"skipped: {s['comparison']}: {s['reason']}" for s in result.skipped]
    for c in result.comparisons:
        for f in c["task_gate"]["failures"] if c["task_gate"]["gating"] else []:
            lines.append(f"{c['candidate']}: task gate failed: {f}")
    if result.layers:
        from trt_seer.quantize.layers import first_jumps

        jumps = first_jumps(result.layers)
        lines.append("per-layer error: first jumps at " + (", ".join(
            f"{r['node']} (+{r['added_error']:.2e} -> {r['rel_error']:.2e})" for r in jumps) or "none"))
    lines.append("result: " + ("PASS" if result.passed else "FAIL"))
    return "\n".join(lines)


def accuracy_summary(result: DiffResult) -> dict:
    """What goes into the manifest's accuracy["diff_vs_<against>"]."""
    keep = ("max_abs", "mean_abs", "max_rel", "mean_rel", "mean_cosine", "elementwise_passed")
    return {
        "passed": result.passed, "reference": result.reference.label, "samples": result.samples,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "comparisons": {c["candidate"]: {"precision": c["precision"], "passed": c["passed"], "task": c["task_metrics"],
                                         "outputs": {n: {k: o[k] for k in keep} for n, o in c["outputs"].items()}}
                        for c in result.comparisons},
        "skipped": result.skipped,
    }


def record_accuracy(result: DiffResult) -> Path | None:
    """Writes the summary into the target's manifest / ONNX record (none for a bare .onnx)."""
    if result.target.record is None:
        return None
    manifest.update_accuracy(result.target.record, f"diff_vs_{result.against}", accuracy_summary(result))
    return result.target.record


# --- report directory -------------------------------------------------------------------------

def save_polygraphy_data(result: DiffResult, out: Path) -> dict:
    """inputs.json (the data loader's feeds), outputs.json (RunResults as produced) in Polygraphy's
    format, and the post-processing script that masks padding as the comparison did."""
    from polygraphy.json import save_json

    from trt_seer.files import atomic_write_text

    save_json(result.batches, str(out / "inputs.json"), description="diff inputs")
    result.run_results.save(str(out / "outputs.json"))
    atomic_write_text(out / MASK_SCRIPT_NAME, MASK_SCRIPT)
    return {"inputs": "inputs.json", "outputs": "outputs.json", "postprocess": MASK_SCRIPT_NAME}


def _tol_flags(c: dict) -> str:
    atol = " ".join(f"{n}:{o['atol']:g}" for n, o in c["outputs"].items())
    rtol = " ".join(f"{n}:{o['rtol']:g}" for n, o in c["outputs"].items())
    return f"--atol {atol} --rtol {rtol}"


def _check_flags(c: dict, task: str) -> str:
    """How Polygraphy should judge the comparison as trt-seer did. Element-wise tolerances when
    they decide; when only the task metric does (INT8) and that metric is an embedding cosine,
    Polygraphy's cosine check on the task output (its cosine spans a whole batch, so it is the
    closest check, not the same one) and no check (threshold -1) on the other outputs."""
    if any(o["gating"] for o in c["outputs"].values()) or task != "feature-extraction":
        return _tol_flags(c)
    out = task_output(task)
    least = {n: (c["task_gate"]["thresholds"]["min_cosine"] if n == out else -1) for n in c["outputs"]}
    return "--compare-func cosine_similarity --cosine-similarity-threshold " + " ".join(
        f"{n}:{v:g}" for n, v in least.items())


def reproduce_commands(result: DiffResult, out: Path) -> list[str]:
    """`polygraphy run` lines that rerun each candidate against the saved outputs, from `out`."""
    from trt_seer.engine import trt

    cmds = []
    for side, c in zip(result.candidates, result.comparisons):
        path = os.path.relpath(side.path.resolve(), out.resolve())
        io = (f"--load-inputs inputs.json --load-outputs outputs.json --postprocess-func-script {MASK_SCRIPT_NAME} "
              f"{_check_flags(c, result.task)}")
        if side.backend == "onnxrt":
            cmds.append(f"polygraphy run {path} --onnxrt {io}")
        else:
            env = "POLYGRAPHY_USE_TENSORRT_RTX=1 " if trt.load().is_rtx else ""
            cmds.append(f"{env}polygraphy run {path} --model-type engine --trt {io}")
    return cmds


def _figure(width: float = 7.0, height: float = 4.0):
    # No pyplot: no global backend to set, and Figure.savefig renders PNG with Agg.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.subplots()


def plot_histograms(result: DiffResult, out: Path) -> list[str]:
    """error_hist_<output>.png: log10 |candidate - reference| per output, one series per candidate."""
    names = []
    for output in result.comparisons[0]["outputs"]:
        fig, ax = _figure()
        for c in result.comparisons:
            counts = result.histograms[(c["candidate"], output)]
            ax.stairs(counts, HIST_EDGES, label=f"{c['candidate']} vs {c['reference']}")
            ax.axvline(np.log10(max(c["outputs"][output]["atol"], 1e-30)), linestyle=":", color="grey")
        ax.set(title=f"{output}: absolute error", xlabel="log10 |error|", ylabel="elements", yscale="log")
        ax.legend(fontsize=8)
        name = f"error_hist_{output}.png"
        fig.savefig(out / name)
        names.append(name)
    return names


def plot_layers(result: DiffResult, out: Path) -> str | None:
    """layer_profile.png: relative error per MatMul/Gemm layer and the error each one adds."""
    if not result.layers:
        return None
    from trt_seer.quantize.layers import first_jumps

    x = np.arange(len(result.layers))
    fig, ax = _figure(max(7.0, len(x) * 0.12), 4.0)
    ax.plot(x, [r["rel_error"] for r in result.layers], marker=".", label="relative error ||c-r||/||r||")
    ax.bar(x, [max(r["added_error"], 0.0) for r in result.layers], alpha=0.4, color="tab:orange", label="added error")
    for r in first_jumps(result.layers):
        ax.annotate(r["node"], (r["index"], r["rel_error"]), fontsize=6, rotation=45)
    ax.set(title=f"per-layer error: {result.layer_pair[1].name} vs {result.layer_pair[0].name}",
           xlabel="MatMul/Gemm layer (graph order)", ylabel="relative error")
    ax.legend(fontsize=8)
    fig.savefig(out / "layer_profile.png")
    return "layer_profile.png"


def report_json(result: DiffResult, files: dict, commands: list[str]) -> dict:
    from trt_seer.quantize.layers import first_jumps

    t = result.target
    layers = None if result.layers is None else {
        "reference": result.layer_pair[0].name, "candidate": result.layer_pair[1].name,
        "profile": result.layers, "first_jumps": [r["node"] for r in first_jumps(result.layers)]}
    return {"schema": 1, "target": str(t.path), "kind": t.kind, "name": t.name, "precision": t.precision,
            "task": result.task, "against": result.against, "reference": result.reference.label,
            "candidates": [c.label for c in result.candidates], "samples": result.samples,
            "batches": len(result.batches), "passed": result.passed, "comparisons": result.comparisons,
            "skipped": result.skipped, "layers": layers, "files": files, "reproduce": commands}


def report_markdown(result: DiffResult, files: dict, commands: list[str]) -> str:
    rows = [TABLE_HEADER, tuple("---" for _ in TABLE_HEADER), *table_rows(result)]
    lines = [f"# Accuracy diff: {result.target.name} {result.target.precision}", "", _headline(result) + ".", "",
             f"**Result: {'PASS' if result.passed else 'FAIL'}**", ""]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "## Skipped", ""] + ([f"- {s['comparison']}: {s['reason']}" for s in result.skipped] or ["- none"])
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in files["plots"]]
    if result.layers:
        lines += ["", "## Per-layer error", "", "| # | node | rel error | received | added error |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['index']} | {r['node']} | {r['rel_error']:.3e} | {r['received_error']:.3e} | "
                  f"{r['added_error']:+.3e} |" for r in result.layers]
    lines += ["", "## Reproduce with Polygraphy", "", "```sh",
              "# From this directory: reruns each candidate on the saved inputs and compares it with the",
              "# saved outputs (candidates first, the reference last), with the tolerances used here.",
              f"# {MASK_SCRIPT_NAME} zeroes token-level outputs at padded positions, as trt-seer compared them.",
              *(["# Judged by the task metric only (INT8): Polygraphy checks the cosine similarity of the",
                 "# sentence embedding per batch (-1: not checked), the closest it has to the per-sentence gate."]
                if any("cosine_similarity" in c for c in commands) else []),
              *commands, "```", ""]
    return "\n".join(lines)


def write_report(result: DiffResult, out: Path) -> Path:
    """report.md, report.json, PNG plots and Polygraphy inputs/outputs in `out`; returns report.md."""
    from trt_seer.files import atomic_write_json, atomic_write_text, ensure_out_dir

    out = ensure_out_dir(out)
    with polygraphy_logs(False):
        files = save_polygraphy_data(result, out)
    files["plots"] = plot_histograms(result, out) + [p for p in [plot_layers(result, out)] if p]
    commands = reproduce_commands(result, out)
    atomic_write_json(out / "report.json", report_json(result, files, commands))
    return atomic_write_text(out / "report.md", report_markdown(result, files, commands))
