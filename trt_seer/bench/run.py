"""Runs a `bench` plan: one fresh Python process per path (bench.worker), then the report dict:
settings, machine, one row per path (ok, skipped or failed), accuracy against the FP32
reference, INT8 findings, copy bandwidth; and each artifact's results in its manifest."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from trt_seer.bench.host import Host, probe_host
from trt_seer.bench.measure import COST_ASSUMPTION, NOISY_CV, cost_per_million, throughput
from trt_seer.bench.model import model_info
from trt_seer.bench.paths import PATH_BY_KEY
from trt_seer.bench.plan import BenchSpec, Planned, copies_path, eval_batch_size, plan
from trt_seer.bench.verdict import against_pytorch, int8_findings

REFERENCE = "torch-fp32-cpu"  # accuracy reference: PyTorch FP32 eager on the CPU
TIMING_NOTE = ("p50/p90/p99, samples/s and cost: end to end, host inputs to host outputs (time.perf_counter); "
               "device p50: the model's own GPU work between CUDA events, copies excluded, n/a on the CPU")


def job(planned: Planned, info, spec: BenchSpec, out: Path, eval_batch: int, timed: bool = True,
        copies: bool = False) -> dict:
    """The job file one worker process reads."""
    return {"path": planned.path.key, "model": str(info.path), "task": info.task, "info": info.to_dict(),
            "artifact": str(planned.artifact) if planned.artifact else None,
            "batches": list(planned.batches) if timed else [], "seq": spec.seq, "threads": spec.threads,
            "timing": asdict(spec.timing), "eval_samples": spec.eval_samples, "eval_batch": eval_batch,
            "copies": copies, "main_output": spec.main_output, "out": str(out)}


def run_worker(job: dict, bar) -> dict:
    """Runs one path in a fresh Python process; advances `bar` per finished point."""
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(job))
    code = "import sys; from trt_seer.bench.worker import main; sys.exit(main(sys.argv[1]))"
    with open(out / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, str(out / "job.json")], stdout=subprocess.PIPE,
                                stderr=err, text=True)
        for line in proc.stdout:
            if line.strip() == "POINT":
                bar.update(1)
        rc = proc.wait()
    result_file = out / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    tail = [line for line in (out / "stderr.txt").read_text().splitlines() if line.strip()]
    return {"error": tail[-1] if tail else f"the benchmark process exited with code {rc}"}


def _eval_outputs(out: Path):
    import numpy as np

    f = out / "eval.npz"
    if not f.is_file():
        return None
    with np.load(f) as z:
        return {k: z[k] for k in z.files}


def _run_all(planned: list[Planned], info, spec: BenchSpec, tmp: Path) -> tuple[dict, dict]:
    from tqdm import tqdm

    runnable = [p for p in planned if not p.reason]
    extra_ref = REFERENCE not in {p.path.key for p in runnable}
    total = sum(len(p.batches) + 1 for p in runnable) + int(extra_ref)
    eval_batch, copies = eval_batch_size(planned), copies_path(planned)
    results, outputs = {}, {}
    with tqdm(total=total, desc="bench", unit="point", dynamic_ncols=True) as bar:
        for p in runnable:
            bar.set_postfix_str(p.path.key)
            out = tmp / p.path.key
            results[p.path.key] = run_worker(job(p, info, spec, out, eval_batch, copies=p.path.key == copies), bar)
            outputs[p.path.key] = _eval_outputs(out)
        if extra_ref:  # accuracy needs the FP32 reference even when its timing was not asked for
            ref = Planned(PATH_BY_KEY[REFERENCE], "", None)
            results["_reference"] = run_worker(job(ref, info, spec, tmp / "_reference", eval_batch, False), bar)
            outputs[REFERENCE] = _eval_outputs(tmp / "_reference")
    return results, outputs


def with_cost(point: dict, price: float) -> dict:
    """The point with samples/s and cost per 1M inferences, both from its end-to-end p50."""
    thr = throughput(point["batch"], point["p50_ms"])
    return {**point, "throughput": thr, "cost_per_million": cost_per_million(price, thr)}


def row(planned: Planned, result: dict | None, price_per_hour: float) -> dict:
    """One report row from a path's plan and its worker's result."""
    out = {"key": planned.path.key, "label": planned.label, "backend": planned.path.backend,
           "precision": planned.path.precision, "mode": planned.path.mode, "device": planned.path.device,
           "artifact": str(planned.artifact) if planned.artifact else None,
           "skipped_batches": [{"batch": b, "reason": r} for b, r in planned.skipped_batches]}
    if planned.reason or result is None:
        return {**out, "status": "skipped", "reason": planned.reason or "not run", "points": []}
    if "error" in result:
        return {**out, "status": "failed", "reason": result["error"], "points": []}
    failed = [p for p in result["points"] if "error" in p]
    out["skipped_batches"] += [{"batch": p["batch"], "reason": f"failed: {p['error']}"} for p in failed]
    points = [with_cost(p, price_per_hour) for p in result["points"] if "error" not in p]
    if failed and not points:
        return {**out, "status": "failed", "reason": failed[0]["error"], "points": []}
    keep = ("size_bytes", "size_kind", "timing_kind", "memory_kind", "rss_before_load_bytes", "rss_peak_bytes")
    out["accuracy_note"] = f"held-out run failed: {result['eval_error']}" if result.get("eval_error") else None
    return {**out, "status": "ok", "reason": None, "points": points, **{k: result[k] for k in keep}}


def _accuracy(task: str, ref: dict | None, cand: dict | None) -> dict | None:
    from trt_seer.eval.metrics import task_metrics

    if ref is None or cand is None:
        return None
    if any(ref[k].shape != cand[k].shape for k in ref):
        return None
    return task_metrics(task, ref, cand)


def accuracy_summary(task: str, metrics: dict | None, is_reference: bool) -> str:
    if is_reference:
        return "reference"
    if not metrics:
        return "n/a"
    if task == "feature-extraction":
        return f"cos {metrics['mean_cosine']:.5f}"
    return f"top-1 {metrics['top1_agreement']:.4f}"


def _add_accuracy(rows: list[dict], outputs: dict, task: str, ref_status: str) -> None:
    ref = outputs.get(REFERENCE)
    for r in rows:
        if r["status"] != "ok":
            continue
        is_ref = r["key"] == REFERENCE
        r["accuracy"] = None if is_ref else _accuracy(task, ref, outputs.get(r["key"]))
        r["accuracy_summary"] = accuracy_summary(task, r["accuracy"], is_ref)
        if ref is None and not is_ref:
            r["accuracy_note"] = r.get("accuracy_note") or f"no FP32 reference: {ref_status}"


def _reference_status(results: dict, outputs: dict) -> str:
    if outputs.get(REFERENCE) is not None:
        return "ok"
    result = results.get(REFERENCE) or results.get("_reference") or {}
    return result.get("error", "the reference path did not run")


def copy_bandwidth(results: dict) -> dict | None:
    """{"path": key, "rows": [...]} from the worker that measured host<->device copies, if any."""
    return next(({"path": k, "rows": r["copy_bandwidth"]} for k, r in results.items() if r.get("copy_bandwidth")),
                None)


def assemble(spec: BenchSpec, info, host: Host, planned: list[Planned], results: dict, outputs: dict) -> dict:
    """The report: settings, machine, one row per path (ok, skipped or failed), INT8 findings."""
    from trt_seer.bench.worker import inputs_description

    rows = [row(p, results.get(p.path.key), spec.price_per_hour) for p in planned]
    _add_accuracy(rows, outputs, info.task, _reference_status(results, outputs))
    machine = host.machine(spec.threads)
    return {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": spec.command,
        "model": {"name": info.name, "path": str(info.path), "task": info.task, "model_type": info.model_type,
                  "random_init": spec.model_config},
        "machine": {**machine, "versions": host.versions, "tensorrt": host.tensorrt},
        "settings": {"batches": list(spec.batches), "seq": spec.seq, "price_per_hour": spec.price_per_hour,
                     "quick": spec.quick, "timing": asdict(spec.timing), "eval_samples": spec.eval_samples,
                     "inputs": inputs_description(info), "engines": str(spec.engines)},
        "method": {"isolation": "each path in a fresh Python process; host memory is that process's peak RSS "
                                "(VmHWM), so it includes the Python runtime and the libraries the path imports",
                   "noisy_cv": NOISY_CV, "accuracy_reference": REFERENCE, "cost": COST_ASSUMPTION,
                   "timing": TIMING_NOTE},
        "rows": rows,
        "int8": int8_findings(rows, spec.seq, machine),
        "vs_pytorch": against_pytorch(rows),
        "copy_bandwidth": copy_bandwidth(results),
    }


def record_in_manifests(report: dict) -> list[Path]:
    """Writes each artifact's results under `bench` in its engine manifest / ONNX record. The
    CUDA-graph run of an engine is left out: the section holds the plain run, which is what
    `build --int8` compares across engines."""
    from trt_seer.engine import manifest

    written = []
    for r in report["rows"]:
        if r["status"] != "ok" or not r["artifact"] or r["mode"] == "engine-graph":
            continue
        artifact = Path(r["artifact"])
        target = (manifest.engine_manifest_path(artifact) if r["backend"] == "tensorrt"
                  else manifest.record_path(artifact))
        if target.is_file():
            manifest.update_section(target, "bench", bench_section(report, r))
            written.append(target)
    return written


def bench_section(report: dict, row: dict) -> dict:
    """A manifest's `bench` section: p50_ms is end to end, device_p50_ms the GPU time (or None)."""
    keep = ("batch", "p50_ms", "p90_ms", "p99_ms", "device_p50_ms", "cv", "noisy", "throughput", "memory_bytes",
            "cost_per_million", "main_output", "main_p50_ms", "main_device_p50_ms")
    machine = {k: report["machine"][k] for k in ("cpu", "cores", "threads", "gpu")}  # as Host.machine()
    return {"measured_at": report["created_at"], "label": row["label"], "path": row["key"],
            "machine": {**machine, "device": row["device"]},
            "seq": report["settings"]["seq"], "timing_kind": row["timing_kind"], "memory_kind": row["memory_kind"],
            "price_per_hour": report["settings"]["price_per_hour"],
            "points": [{k: p[k] for k in keep if k in p} for p in row["points"]],
            "accuracy_vs_fp32": row.get("accuracy")}


def bench(spec: BenchSpec) -> dict:
    """Runs the sweep and returns the report (see `assemble`); records results in manifests."""
    host = probe_host()
    with model_info(spec.model, spec.model_config, spec.task) as info, \
            tempfile.TemporaryDirectory(prefix="trt-seer-bench-") as tmp:
        planned = plan(spec, info.name, host)
        results, outputs = _run_all(planned, info, spec, Path(tmp))
        report = assemble(spec, info, host, planned, results, outputs)
    if spec.write_manifests:
        report["manifests_updated"] = [str(p) for p in record_in_manifests(report)]
    return report
