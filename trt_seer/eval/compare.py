"""How `diff` judges: per-precision tolerances (overridable per output), Polygraphy's elementwise
check on padding-masked outputs, error statistics and histograms, the task metric and its gate,
and the per-layer error profile of an ONNX candidate.

Gates by the candidate's precision: FP32 elementwise (atol = rtol = 1e-4); FP16 elementwise
(1e-2) and the task metric; INT8 the task metric only (elementwise errors are reported), plus the
elementwise check of any output given an explicit --atol/--rtol.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError
from trt_seer.eval.plan import PRECISIONS, DiffSpec, Side
from trt_seer.eval.result import DiffResult

HIST_EDGES = np.linspace(-10.0, 2.0, 61)  # log10 |error| bins of the histograms


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


def task_output(task: str) -> str:
    """The output the task metric judges."""
    return "sentence_embedding" if task == "feature-extraction" else "logits"


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
    """Per-output tolerances: the precision's defaults, overridden by --atol/--rtol. A tolerance
    given for an output (by name or bare) always gates it, INT8 too: a check the user asked for is
    never reported as passed when it failed."""
    unknown = sorted({n for n, _ in spec.atol + spec.rtol if n and n not in outputs})
    if unknown:
        raise InputError(f"unknown output {', '.join(map(repr, unknown))} in --atol/--rtol; "
                         f"outputs are {', '.join(outputs)}")
    base = DEFAULT_TOLERANCES[precision]
    given = {n for n, _ in spec.atol + spec.rtol}
    return {o: Tolerance(_override(spec.atol, o, base.atol), _override(spec.rtol, o, base.rtol),
                         base.gating or o in given or "" in given)
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
    from trt_seer.eval.gate import Gate

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


# --- per-layer error profile -------------------------------------------------------------------

def _layer_pair(result: DiffResult) -> tuple[tuple[Path, Path] | None, str | None]:
    """((reference ONNX, candidate ONNX), None) for the layer profile, or (None, why not)."""
    cand = next((c for c in result.candidates if c.backend == "onnxrt"), None)
    if cand is None:
        return None, "no ONNX candidate ran"
    ref = result.reference
    ref_path = ref.path if ref.backend == "onnxrt" else result.target.artifact("fp32.onnx")
    if cand.path.name.endswith(".cpu.onnx"):  # a CPU form: its layers are named after the fused graph
        ref_path = result.target.artifact("fp32.cpu.onnx")
    if not ref_path.is_file():
        return None, f"{ref_path.name} not found"
    if ref_path == cand.path:
        return None, "the candidate is the FP32 reference graph"
    return (ref_path, cand.path), None


def profile_layers(result: DiffResult, spec: DiffSpec) -> None:
    """The per-layer error profile of the ONNX candidate (on by default for INT8)."""
    from trt_seer.eval.layers import layer_error_profile

    if not (spec.layers if spec.layers is not None else result.target.precision == "int8"):
        return
    pair, reason = _layer_pair(result)
    if reason:
        result.layers_not_run = reason
        return
    result.layers = layer_error_profile(*pair, result.batches[:4])  # 4 batches: up to 64 samples
    result.layer_pair = pair

