"""Accuracy diff of an engine or ONNX artifact against FP32 ONNX, FP16 ONNX or PyTorch, run through
Polygraphy: ONNX Runtime on CPU, TensorRT(-RTX) where it runs on a GPU, PyTorch through a runner here.

    python -m trt_seer diff engines/all-MiniLM-L6-v2.fp16.manifest.json --against fp32 --report out/

    from trt_seer.eval.diff import DiffSpec, diff, resolve_target
    result = diff(resolve_target(Path("engines/all-MiniLM-L6-v2.fp16.onnx.json")), DiffSpec())
    result.verdict  # "passed" | "failed" | "not verified"

The stages, one module each: `plan` (the target, its reference, what can run here), `runners`
(Polygraphy's ONNX Runtime and TensorRT runners, a PyTorch runner, the held-out feeds), `compare`
(tolerances, elementwise and task-metric checks, per-layer profile), `result` (the verdict) and
`report` (table, manifest summary, report directory). An engine is compared only where a TensorRT
runtime runs it on a GPU; a comparison that cannot run is listed with its reason and leaves the
verdict "not verified", never "passed".
"""
from __future__ import annotations

from trt_seer.eval.compare import (DEFAULT_TOLERANCES, Tolerance, compare, masked_results, parse_tolerance,
                                   profile_layers, tolerances)
from trt_seer.eval.plan import (DiffSpec, Side, Target, default_against, engine_unavailable_reason, model_info, plan,
                                resolve_target)
from trt_seer.eval.report import accuracy_summary, format_table, record_accuracy, write_report
from trt_seer.eval.result import EXIT_CODES, FAILED, NOT_VERIFIED, PASSED, DiffResult, verdict
from trt_seer.eval.runners import backend_name, eval_data, polygraphy_logs, run_sides

__all__ = ["DEFAULT_TOLERANCES", "EXIT_CODES", "FAILED", "NOT_VERIFIED", "PASSED", "DiffResult", "DiffSpec", "Side",
           "Target", "Tolerance", "accuracy_summary", "default_against", "diff", "engine_unavailable_reason",
           "format_table", "model_info", "parse_tolerance", "plan", "record_accuracy", "resolve_target",
           "tolerances", "verdict", "write_report"]


def diff(target: Target, spec: DiffSpec = DiffSpec()) -> DiffResult:
    """Runs the reference and every candidate that can run here on held-out data and compares them;
    the comparisons that cannot run are in the result's `not_run`, and its verdict says so."""
    against = spec.against or default_against(target)
    ref, cands, not_run = plan(target, against)
    recorded = [o["name"] for o in target.data.get("io", {}).get("outputs", [])]
    if recorded:
        tolerances(ref.precision, recorded, spec)  # unknown output names fail before the slow part
    info = model_info(target, spec)
    if not cands:
        return DiffResult(target, info.task, against, ref, [], not_run, [], None)
    sides = cands + [ref]
    batches = eval_data(info, target, spec)
    with polygraphy_logs(spec.verbose):
        run_results = run_sides(sides, info, batches)
        result = DiffResult(target, info.task, against, ref, cands, not_run, batches, run_results,
                            masked_results(run_results, batches),
                            backends={s.label: backend_name(s) for s in sides},
                            artifacts={s.label: s.path.name if s.path else str(info.path) for s in sides})
        result.comparisons = [compare(result, c, spec) for c in cands]
    profile_layers(result, spec)
    return result
