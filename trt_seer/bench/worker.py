"""One benchmark path in its own Python process: load the model the path's way, time it per batch
size, keep its held-out outputs for the accuracy column.

    python -c "from trt_seer.bench.worker import main; main('job.json')"   # what `bench` runs

The job file (bench.run.job) names the path, model, artifact, batches and timing rules; the process
prints `POINT` per finished point (the parent's progress bar) and writes result.json (or the
one-line error) and eval.npz beside it. A fresh process per path makes the peak RSS (VmHWM), the
CUDA allocator's peak, TF32 settings and thread pools that path's own.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from trt_seer.bench.measure import TimingSpec, device_pass, measure, summarize_apart
from trt_seer.bench.paths import PATH_BY_KEY
from trt_seer.bench.runners import copy_bandwidth, make_runner, peak_rss_bytes

MAIN_KEYS = ("p50_ms", "p90_ms", "p99_ms", "device_p50_ms")  # kept as main_p50_ms, ... per point


@functools.lru_cache(maxsize=None)
def heldout_texts() -> tuple[str, ...]:
    from trt_seer import data

    return tuple(data.load_texts(data.default_corpus("heldout")))


def inputs_description(info) -> str:
    from trt_seer import data

    if data.has_tokenizer(info):
        return "held-out text (calib/heldout.txt), tokenised and padded / truncated to batch x seq"
    return "random token ids (the model has no tokenizer.json)"


def timing_feeds(info, batch: int, seq: int) -> dict:
    """Exactly (batch, seq) feeds: held-out text (repeated if short of `batch` rows), truncated
    or right-padded to `seq`; random token ids for a model without a tokenizer."""
    from trt_seer import data
    from trt_seer.export.checkpoint import sample_inputs

    if not data.has_tokenizer(info):
        return sample_inputs(info, batch, seq, seed=batch)
    texts = heldout_texts()
    rows = data.Tokenizer(info.path).encode([texts[i % len(texts)] for i in range(batch)], seq)
    return data.pad_batch(rows, info.inputs, seq, int(info.config.get("pad_token_id") or 0))


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def attempt(fn):
    """(fn(), None), or (None, the error in one line): one failed batch (out of memory, outside a
    profile) is reported for that batch and the others still run."""
    try:
        return fn(), None
    except Exception as e:  # reported by the caller, never dropped
        return None, one_line(e)
    finally:
        print("POINT", flush=True)  # the parent's progress bar counts these


def _point(runner, info, job: dict, batch: int) -> dict:
    feeds = timing_feeds(info, batch, job["seq"])
    spec = TimingSpec(**job["timing"])
    runner.reset_peak()
    point = {"batch": batch, **_timed(runner, feeds, spec, None), **runner.memory()}
    main = getattr(runner, "main_output", None) if job.get("main_output") and hasattr(runner, "main_timer") else None
    if main is not None and runner.main_timer(feeds) is not None:  # the same call, copying back only the main output
        only = _timed(runner, feeds, spec, [main])
        point.update(main_output=main, **{f"main_{k}": only[k] for k in MAIN_KEYS})
    return point


def _timed(runner, feeds: dict, spec: TimingSpec, outputs: list[str] | None) -> dict:
    """Plain calls for the end-to-end figures, then (GPU paths) a separate pass with CUDA events
    for the device ones; `outputs`: only these copied back (None: all)."""
    once = runner.timer(feeds) if outputs is None else runner.main_timer(feeds)
    samples, stopped = measure(once, spec)
    device = runner.device_timer(feeds, outputs) if hasattr(runner, "device_timer") else None
    device_samples = measure(device, device_pass(spec))[0] if device is not None else []
    return {**summarize_apart(samples, device_samples), "stopped_by": stopped}


def _eval(runner, info, job: dict) -> dict:
    from trt_seer.eval.evaluate import EvalSpec, eval_batches, merge

    spec = EvalSpec(samples=job["eval_samples"], batch=job["eval_batch"], max_seq=job["seq"])
    batches = eval_batches(info, spec)
    return merge(info.task, [runner.outputs(b) for b in batches], batches)


def work(job: dict) -> dict:
    """Runs one path's timing points and held-out outputs (and, when the job asks, the copy
    bandwidth); writes eval.npz into job["out"]."""
    import numpy as np

    from trt_seer.export.families import ModelInfo

    info = ModelInfo.from_dict(job["info"])  # as the parent resolved it: no transformers (or torch) here
    path = PATH_BY_KEY[job["path"]]
    if path.backend == "torch":
        _set_threads(job["threads"])
    rss_before = peak_rss_bytes()
    artifact = Path(job["artifact"]) if job["artifact"] else None
    runner = make_runner(path, info, artifact, job["threads"])
    points = []
    for batch in job["batches"]:
        point, error = attempt(functools.partial(_point, runner, info, job, batch))
        points.append(point or {"batch": batch, "error": error})
    outputs, eval_error = attempt(functools.partial(_eval, runner, info, job))
    if outputs is not None:
        np.savez(Path(job["out"]) / "eval.npz", **outputs)
    result = {"points": points, "eval_error": eval_error, "size_bytes": runner.size_bytes,
              "size_kind": runner.size_kind, "timing_kind": runner.timing_kind, "memory_kind": runner.memory_kind,
              "rss_before_load_bytes": rss_before, "rss_peak_bytes": peak_rss_bytes()}
    if job.get("copies"):
        result["copy_bandwidth"] = copy_bandwidth()
    return result


def main(job_file: str) -> int:
    """Entry point of the per-path process: result.json holds the result or the one-line error."""
    job = json.loads(Path(job_file).read_text())
    result_file = Path(job["out"]) / "result.json"
    try:
        result = work(job)
    except Exception as e:  # any failure becomes this path's reported reason, never a silent drop
        result_file.write_text(json.dumps({"error": one_line(e)}))
        raise
    result_file.write_text(json.dumps(result))
    return 0
