"""One benchmark path in its own Python process: load the model the path's way, time it per batch
size, keep its held-out outputs for the accuracy column.

    python -c "from trt_seer.bench.worker import main; main('job.json')"   # what `bench` runs

The job file names the path, model, artifact, batches and timing rules; the process prints
`POINT` per finished point (the parent's progress bar) and writes result.json (or the one-line
error) and eval.npz beside it. A fresh process per path makes the peak RSS (VmHWM), the CUDA
allocator's peak, TF32 settings and thread pools that path's own.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

from trt_seer.bench import PATH_BY_KEY, PathSpec, TimingSpec, measure, summarize


def peak_rss_bytes() -> int:
    """This process's peak resident set size. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    would carry over the parent's peak from the fork); elsewhere ru_maxrss."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


def _wall_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def _weights_bytes(module) -> int:
    """Bytes of a module's state as it runs (INT8 packed weights count 1 byte per element)."""

    def size(v) -> int:
        if hasattr(v, "element_size") and hasattr(v, "numel"):
            return v.numel() * v.element_size()
        return sum(size(x) for x in v) if isinstance(v, (tuple, list)) else 0

    return sum(size(v) for v in module.state_dict().values())


class TorchRunner:
    """A wrapped module on one device, optionally under autocast."""

    timing_kind = "wall clock (time.perf_counter)"
    memory_kind = "host peak RSS"
    size_kind = "weights in memory"

    def __init__(self, module, info, device: str, autocast_dtype=None):
        import torch

        self.torch, self.module, self.info = torch, module, info
        self.device = torch.device(device)
        self.autocast = autocast_dtype
        self.size_bytes = _weights_bytes(module)
        if self.device.type == "cuda":
            self.timing_kind, self.memory_kind = "CUDA events", "torch.cuda.max_memory_allocated"

    def _args(self, feeds: dict):
        return tuple(self.torch.from_numpy(feeds[n]).to(self.device) for n in self.info.inputs)

    def _forward(self, args):
        torch = self.torch
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.autocast,
                                                    enabled=self.autocast is not None):
            out = self.module(*args)
        return out if isinstance(out, tuple) else (out,)

    def timer(self, feeds: dict):
        args = self._args(feeds)
        if self.device.type != "cuda":
            return lambda: _wall_ms(lambda: self._forward(args))
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)  # the input copies are done before the first event

        def once() -> float:
            start.record()
            self._forward(args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        return once

    def outputs(self, feeds: dict) -> dict:
        out = self._forward(self._args(feeds))
        return {n: o.float().cpu().numpy() for n, o in zip(self.info.outputs, out)}

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def memory(self) -> dict:
        host = peak_rss_bytes()
        if self.device.type != "cuda":
            return {"memory_bytes": host, "host_peak_rss_bytes": host}
        return {"memory_bytes": int(self.torch.cuda.max_memory_allocated(self.device)), "host_peak_rss_bytes": host}


def _quantize_dynamic(model):
    import warnings

    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch 2.13 marks quantized tensor creation deprecated
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)  # no FP32 copy kept


def torch_runner(path: PathSpec, info) -> TorchRunner:
    """Loads the checkpoint fresh in this process, so `.half()` converts this copy only."""
    import torch

    from trt_seer.export.checkpoint import load_model, wrap

    model = load_model(info)
    if path.mode == "dynamic-int8":
        model = _quantize_dynamic(model)
    if path.device == "cuda":
        torch.set_float32_matmul_precision("high" if path.precision == "tf32" else "highest")
        model = model.to(path.device)
        if path.mode == "half":
            model = model.half()
    autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}[path.precision] if path.mode == "autocast" else None
    return TorchRunner(wrap(model, info), info, path.device, autocast)


def load_onnx(path: Path, threads: int | None):
    """The one place benchmark ONNX files are opened: a callable feeds -> {output: array}, through
    the product's runtime (ONNX Runtime's CPU provider)."""
    from trt_seer import runtime

    return runtime.load(path, backend="onnxruntime", threads=threads or 0).infer


def artifact_bytes(path: Path) -> int:
    from trt_seer.export.onnxio import data_path

    return sum(p.stat().st_size for p in (Path(path), data_path(path)) if p.is_file())


class CallRunner:
    """A CPU callable feeds -> outputs (ONNX Runtime), timed with perf_counter."""

    timing_kind = "wall clock (time.perf_counter)"
    memory_kind = "host peak RSS"
    size_kind = "file on disk"

    def __init__(self, call, size_bytes: int):
        self.call, self.size_bytes = call, size_bytes

    def timer(self, feeds: dict):
        return lambda: _wall_ms(lambda: self.call(feeds))

    def outputs(self, feeds: dict) -> dict:
        return self.call(feeds)

    def reset_peak(self) -> None:
        """The peak RSS only grows; batches run in ascending order, so each reading is that batch's peak."""

    def memory(self) -> dict:
        host = peak_rss_bytes()
        return {"memory_bytes": host, "host_peak_rss_bytes": host}


class EngineRunner(CallRunner):
    """A TensorRT engine through trt_seer.runtime (never its ONNX fallback); the runtime's own GPU
    time where it reports one. Memory: device memory in use after a batch minus before loading."""

    memory_kind = "GPU memory in use (cudaMemGetInfo delta)"

    def __init__(self, engine_path: Path):
        from trt_seer import runtime
        from trt_seer.runtime import cuda

        cuda.set_device(0)  # the context exists before the baseline, so only the engine counts
        self.mem_info = cuda.mem_info
        self.baseline = self._used()
        self.model = runtime.load(engine_path, backend="tensorrt")
        super().__init__(self.model.infer, artifact_bytes(engine_path))

    def _used(self) -> int:
        free, total = self.mem_info()
        return total - free

    def timer(self, feeds: dict):
        def once() -> float:
            wall = _wall_ms(lambda: self.model.infer(feeds))
            gpu = self.model.last_gpu_ms
            self.timing_kind = "engine GPU time (runtime)" if gpu is not None else "wall clock, host copies included"
            return gpu if gpu is not None else wall

        return once

    def memory(self) -> dict:
        return {"memory_bytes": self._used() - self.baseline, "host_peak_rss_bytes": peak_rss_bytes()}


def make_runner(path: PathSpec, info, artifact: Path | None, threads: int | None):
    if path.backend == "torch":
        return torch_runner(path, info)
    if path.backend == "onnxruntime":
        return CallRunner(load_onnx(artifact, threads), artifact_bytes(artifact))
    return EngineRunner(artifact)


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
    once = runner.timer(timing_feeds(info, batch, job["seq"]))
    runner.reset_peak()
    times, stopped = measure(once, TimingSpec(**job["timing"]))
    return {"batch": batch, **summarize(times), "stopped_by": stopped, **runner.memory()}


def _eval(runner, info, job: dict) -> dict:
    from trt_seer.eval.evaluate import EvalSpec, eval_batches, merge

    spec = EvalSpec(samples=job["eval_samples"], batch=job["eval_batch"], max_seq=job["seq"])
    batches = eval_batches(info, spec)
    return merge(info.task, [runner.outputs(b) for b in batches], batches)


def work(job: dict) -> dict:
    """Runs one path's timing points and held-out outputs; writes eval.npz into job["out"]."""
    import numpy as np

    from trt_seer.export.families import resolve_model

    info = resolve_model(job["model"], job["task"])
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
    return {"points": points, "eval_error": eval_error, "size_bytes": runner.size_bytes,
            "size_kind": runner.size_kind, "timing_kind": runner.timing_kind, "memory_kind": runner.memory_kind,
            "rss_before_load_bytes": rss_before, "rss_peak_bytes": peak_rss_bytes()}


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
