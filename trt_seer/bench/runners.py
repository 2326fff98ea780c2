"""One runner per backend, loaded the path's way inside the worker process. Each runner's
`timer(feeds)` returns a call that runs the model once from host (numpy) inputs to host outputs,
as a user calls it with nothing added, and returns (end-to-end ms, None). GPU runners also have
`device_timer(feeds, outputs)`: the same call with CUDA events around the model's own GPU work,
returning (end-to-end ms, device ms), timed in a separate pass (bench/measure.py); CPU paths have
no device time."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from trt_seer.bench.measure import wall_ms
from trt_seer.bench.paths import PathSpec

CPU_TIMING = "end to end (time.perf_counter); no device time on the CPU"
MAIN_OUTPUTS = {"feature-extraction": "sentence_embedding", "text-classification": "logits",
                "causal-lm": "logits"}  # what a service of the task keeps


def main_output(task: str, output_names) -> str | None:
    """The task's main output where the model returns others besides it (else None: nothing to save)."""
    name = MAIN_OUTPUTS.get(task)
    return name if name in output_names and len(output_names) > 1 else None


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


def _weights_bytes(module) -> int:
    """Bytes of a module's state as it runs (INT8 packed weights count 1 byte per element)."""

    def size(v) -> int:
        if hasattr(v, "element_size") and hasattr(v, "numel"):
            return v.numel() * v.element_size()
        return sum(size(x) for x in v) if isinstance(v, (tuple, list)) else 0

    return sum(size(v) for v in module.state_dict().values())


class TorchRunner:
    """A wrapped module on one device, optionally under autocast."""

    timing_kind = CPU_TIMING
    memory_kind = "host peak RSS"
    size_kind = "weights in memory"

    def __init__(self, module, info, device: str, autocast_dtype=None):
        import torch

        self.torch, self.module, self.info = torch, module, info
        self.device = torch.device(device)
        self.autocast = autocast_dtype
        self.size_bytes = _weights_bytes(module)
        if self.device.type == "cuda":
            self.timing_kind = ("end to end (time.perf_counter: inputs to the GPU, forward, outputs to numpy; "
                                "nothing added); device: CUDA events around the forward, in a separate pass")
            self.memory_kind = "torch.cuda.max_memory_allocated"

    def _args(self, feeds: dict):
        return tuple(self.torch.from_numpy(feeds[n]).to(self.device) for n in self.info.inputs)

    def _forward(self, args):
        torch = self.torch
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.autocast,
                                                    enabled=self.autocast is not None):
            out = self.module(*args)
        return out if isinstance(out, tuple) else (out,)

    def _to_host(self, out) -> dict:
        return {n: o.float().cpu().numpy() for n, o in zip(self.info.outputs, out)}

    def timer(self, feeds: dict):
        return lambda: (wall_ms(lambda: self.outputs(feeds)), None)

    def device_timer(self, feeds: dict, outputs: list[str] | None = None):
        """On a GPU: the forward between CUDA events (after the input copies); None on the CPU."""
        if self.device.type != "cuda":
            return None
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def once() -> tuple[float, float]:
            t0 = time.perf_counter()
            args = self._args(feeds)
            start.record()  # after the input copies on the same stream
            out = self._forward(args)
            end.record()
            self._to_host(out)  # waits for the GPU
            e2e = (time.perf_counter() - t0) * 1000.0
            end.synchronize()
            return e2e, start.elapsed_time(end)

        return once

    def outputs(self, feeds: dict) -> dict:
        return self._to_host(self._forward(self._args(feeds)))

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def memory(self) -> dict:
        host = peak_rss_bytes()
        if self.device.type != "cuda":
            return {"memory_bytes": host, "host_peak_rss_bytes": host}
        return {"memory_bytes": int(self.torch.cuda.max_memory_allocated(self.device)), "host_peak_rss_bytes": host}


COMPILE_MODES = {"compile-default": "default", "compile-reduce-overhead": "reduce-overhead",
                 "compile-max-autotune": "max-autotune"}
COMPILE_WARMUP_CALLS = 3  # compile for the shape, then (reduce-overhead) record its CUDA graph, then replay


class CompiledTorchRunner(TorchRunner):
    """`torch.compile(module, mode=..., dynamic=False)`: one graph per input shape (as the engine's
    CUDA graphs are per shape), compiled on its first calls, which `timer` makes before the timing
    starts, so compile and autotuning time are not measured. A failure to compile is that batch's
    (or the path's) reported error."""

    def timer(self, feeds: dict):
        for _ in range(COMPILE_WARMUP_CALLS):
            self.outputs(feeds)
        return super().timer(feeds)

    def device_timer(self, feeds: dict, outputs: list[str] | None = None):
        for _ in range(COMPILE_WARMUP_CALLS):  # the events' stream work must not be what a graph replays around
            self.outputs(feeds)
        return super().device_timer(feeds, outputs)


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
        if path.mode == "half" or (path.mode in COMPILE_MODES and path.precision == "fp16"):
            model = model.half()
    if path.mode in COMPILE_MODES:
        compiled = torch.compile(wrap(model, info), mode=COMPILE_MODES[path.mode], dynamic=False)
        return CompiledTorchRunner(compiled, info, path.device)
    autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}[path.precision] if path.mode == "autocast" else None
    return TorchRunner(wrap(model, info), info, path.device, autocast)


def artifact_bytes(path: Path) -> int:
    from trt_seer.export.onnxio import data_path

    return sum(p.stat().st_size for p in (Path(path), data_path(path)) if p.is_file())


class CallRunner:
    """A model from trt_seer.runtime (ONNX Runtime on the CPU), numpy in and out."""

    timing_kind = CPU_TIMING
    memory_kind = "host peak RSS"
    size_kind = "file on disk"

    def __init__(self, model, size_bytes: int):
        self.model, self.size_bytes = model, size_bytes

    def timer(self, feeds: dict):
        return lambda: (wall_ms(lambda: self.model.infer(feeds)), None)

    def outputs(self, feeds: dict) -> dict:
        return self.model.infer(feeds)

    def reset_peak(self) -> None:
        """The peak RSS only grows; batches run in ascending order, so each reading is that batch's peak."""

    def memory(self) -> dict:
        host = peak_rss_bytes()
        return {"memory_bytes": host, "host_peak_rss_bytes": host}


def onnx_runner(path: Path, threads: int | None) -> CallRunner:
    """The one place benchmark ONNX files are opened: the product's runtime, ONNX Runtime's CPU provider."""
    from trt_seer import runtime

    return CallRunner(runtime.load(path, backend="onnxruntime", threads=threads or 0), artifact_bytes(path))


class EngineRunner(CallRunner):
    """A TensorRT engine through trt_seer.runtime (never its ONNX fallback). End to end: one
    `infer` with numpy in and out (staging, copies, execution, sync), loaded as a service loads it
    (no timing events); device: the runtime's CUDA events around the engine's execution, switched
    on for the separate device pass only. Memory: device memory in use minus before loading."""

    timing_kind = ("end to end (time.perf_counter around runtime infer, numpy in and out, nothing added); "
                   "device: the runtime's CUDA events around the engine, in a separate pass")
    memory_kind = "GPU memory in use (cudaMemGetInfo delta)"

    def __init__(self, engine_path: Path, use_cuda_graph: bool = False, task: str | None = None):
        from trt_seer import runtime
        from trt_seer.runtime import cuda

        cuda.set_device(0)  # the context exists before the baseline, so only the engine counts
        self.mem_info = cuda.mem_info
        self.baseline = self._used()
        model = runtime.load(engine_path, backend="tensorrt", use_cuda_graph=use_cuda_graph)
        super().__init__(model, artifact_bytes(engine_path))
        self.main_output = main_output(task, model.output_names)

    def _used(self) -> int:
        free, total = self.mem_info()
        return total - free

    def timer(self, feeds: dict, outputs: list[str] | None = None):
        """All outputs copied back, or only `outputs` (what a service that keeps one would pay)."""
        self._events(False)
        return lambda: (wall_ms(lambda: self.model.infer(feeds, outputs)), None)

    def main_timer(self, feeds: dict):
        """The same call returning only the task's main output; None where there is no other output."""
        return None if self.main_output is None else self.timer(feeds, [self.main_output])

    def device_timer(self, feeds: dict, outputs: list[str] | None = None):
        """The same call with the runtime's timing events on: (end to end, the engine's GPU ms)."""
        self._events(True)

        def once() -> tuple[float, float | None]:
            e2e = wall_ms(lambda: self.model.infer(feeds, outputs))
            return e2e, self.model.last_gpu_ms

        return once

    def _events(self, on: bool) -> None:
        """The runtime's `time_gpu` option, for the device pass only (events change how it enqueues)."""
        self.model.options = dataclasses.replace(self.model.options, time_gpu=on)

    def memory(self) -> dict:
        return {"memory_bytes": self._used() - self.baseline, "host_peak_rss_bytes": peak_rss_bytes()}


def make_runner(path: PathSpec, info, artifact: Path | None, threads: int | None):
    if path.backend == "torch":
        return torch_runner(path, info)
    if path.backend == "onnxruntime":
        return onnx_runner(artifact, threads)
    return EngineRunner(artifact, use_cuda_graph=path.mode == "engine-graph", task=info.task)


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 10) -> list[dict]:
    """GB/s of host->device and device->host copies from pinned and from pageable host memory,
    timed with CUDA events on one stream."""
    import numpy as np

    from trt_seer.runtime import cuda

    rows = []
    with cuda.Stream() as s, cuda.HostDeviceBuffer(nbytes) as pinned:
        pageable = np.ones(nbytes, dtype=np.uint8)
        for kind, host in (("pinned", pinned.host_ptr), ("pageable", pageable.ctypes.data)):
            for direction in ("HostToDevice", "DeviceToHost"):
                src, dst = (host, pinned.device_ptr) if direction == "HostToDevice" else (pinned.device_ptr, host)
                with cuda.Event() as start, cuda.Event() as end:
                    start.record(s)
                    for _ in range(reps):
                        cuda.copy_async(dst, src, nbytes, direction, s)
                    end.record(s)
                    end.synchronize()
                    gbs = nbytes * reps / (end.elapsed_ms(start) / 1e3) / 1e9
                rows.append({"memory": kind, "direction": direction, "bytes": nbytes, "gb_per_s": gbs})
    return rows
