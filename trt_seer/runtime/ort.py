"""ONNX artifact -> `OnnxRuntimeModel`: the same `infer` as the TensorRT backend, on the CPU.

    from trt_seer.runtime.ort import OnnxRuntimeModel, OrtOptions
    with OnnxRuntimeModel("engines/all-MiniLM-L6-v2.fp32.onnx", OrtOptions(threads=2)) as m:
        out = m.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})

Runs FP32, FP16-typed and Q/DQ INT8 graphs. Inputs are validated by the same code as the engine
backend, so errors read the same; the I/O description comes from the artifact's record
(`<file>.onnx.json`) when there is one, else from the ONNX Runtime session.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, ManifestMismatchError, UnsupportedError
from trt_seer.runtime.base import CallGate, Completed, Model
from trt_seer.runtime.io import IOSpec, dtype_name, out_view, specs_from_description, validate_feeds, validate_out
from trt_seer.runtime.limits import token_limits

OPTIMIZATION_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
                       "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass(frozen=True)
class OrtOptions:
    """`threads`: intra-op threads (0: ONNX Runtime's default, one per physical core). `spinning`:
    idle pool threads busy-wait for the next op (lower latency on dedicated cores); turn it off
    where other processes share the cores, which it slows (docs/BENCHMARKS.md). `lean`: hold each
    weight once, for graphs as large as the machine's memory: FP16 weights are cast for the CPU's
    kernels one at a time where they are used (priority-based order; at "extended" and "all" the
    cast of every weight is folded in at load, so those levels drop to "basic"), and no memory arena
    keeps the largest transients (docs/BENCHMARKS.md: a 1.1B FP16 decoder's check)."""

    threads: int = 0
    optimization: str = "all"
    spinning: bool = True
    lean: bool = False

    def __post_init__(self):
        if not isinstance(self.threads, int) or isinstance(self.threads, bool):
            raise InputError(f"threads must be an integer, got {self.threads!r}")
        if self.threads < 0:
            raise InputError(f"threads must be >= 0, got {self.threads}")
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise InputError(f"optimization must be one of {', '.join(OPTIMIZATION_LEVELS)}, "
                             f"got {self.optimization!r}")


def session_options(options: OrtOptions):
    import onnxruntime as ort

    so = ort.SessionOptions()
    level = options.optimization
    if options.lean:
        level = "disable" if level == "disable" else "basic"
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # a Cast of a weight runs just before its use
        so.enable_cpu_mem_arena = False
        so.enable_mem_pattern = False
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[level])
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # transformer graphs are chains: no gain from parallel
    so.intra_op_num_threads = options.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # fatal only: a failure comes back as the exception, not a line on stderr
    if not options.spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def create_session(source: str | Path | bytes, options: OrtOptions = OrtOptions()):
    """The one way trt_seer opens ONNX Runtime: a CPU InferenceSession over an ONNX file or a
    serialized model, quiet below errors; UnsupportedError naming the file when ONNX Runtime rejects it."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    rejected = (state.Fail, state.InvalidGraph, state.InvalidArgument, state.NotImplemented,
                state.InvalidProtobuf, state.RuntimeException)
    model, name = (source, "the graph") if isinstance(source, bytes) else (str(source), Path(source).name)
    try:
        return ort.InferenceSession(model, session_options(options), providers=["CPUExecutionProvider"])
    except rejected as e:
        raise UnsupportedError(f"ONNX Runtime cannot run {name}: {str(e).splitlines()[0]}") from e


def session_specs(session) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """IOSpecs from the session; symbolic dimensions (e.g. 'batch', 'seq') become shared axes."""

    def one(arg) -> IOSpec:
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
        axes = tuple(d if isinstance(d, str) else None for d in arg.shape)
        return IOSpec(arg.name, dtype_name(arg.type), shape, axes)

    return tuple(one(a) for a in session.get_inputs()), tuple(one(a) for a in session.get_outputs())


def record_specs(record: dict, session, path: Path) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """IOSpecs from the artifact's record (bounded by its profile, if it has one)."""
    profiles = record.get("profiles") or []
    profile = profiles[0] if profiles else None
    inputs = specs_from_description(record["io"]["inputs"], profile)
    outputs = specs_from_description(record["io"]["outputs"])
    for kind, specs, actual in (("inputs", inputs, session.get_inputs()), ("outputs", outputs, session.get_outputs())):
        if sorted(s.name for s in specs) != sorted(a.name for a in actual):
            raise ManifestMismatchError(f"the record of {path.name} lists {kind} {[s.name for s in specs]} but "
                                        f"the graph has {[a.name for a in actual]}: it belongs to another "
                                        "export; re-export the model")
    return inputs, outputs


class OnnxRuntimeModel(Model):
    """An ONNX artifact on ONNX Runtime's CPU provider."""

    backend = "onnxruntime"

    def __init__(self, path: str | Path, options: OrtOptions = OrtOptions()):
        super().__init__()
        self.path, self.options = Path(path), options
        self._gate = CallGate(self.path.name)
        if not self.path.is_file():
            raise InputError(f"ONNX file not found: {self.path}")
        self.manifest = manifest_io.read_if_exists(manifest_io.record_path(self.path))
        self.session = create_session(self.path, options)
        if self.manifest and "io" in self.manifest:
            self.inputs, self.outputs = record_specs(self.manifest, self.session, self.path)
        else:
            self.inputs, self.outputs = session_specs(self.session)
        self.inputs = token_limits(self.manifest, self.path).apply(self.inputs)

    def infer_async(self, feeds, stream=None, *, outputs=None, out=None, device_outputs: bool = False) -> Completed:
        """Runs at once (ONNX Runtime's run() is synchronous); returns the finished outputs.

        Only `outputs` (default: all) are computed and returned; `out` buffers (host numpy) get
        their results written in place and the returned arrays are views of them.
        """
        self._gate.enter()
        try:
            return Completed(self._run(feeds, stream, outputs, out, device_outputs))
        finally:
            self._gate.leave()

    def _run(self, feeds, stream, outputs, out, device_outputs: bool) -> dict:
        if stream is not None:
            raise InputError("the ONNX Runtime backend runs on the CPU and takes no CUDA stream")
        if device_outputs:
            raise InputError("the ONNX Runtime backend runs on the CPU and has no GPU outputs "
                             "(device_outputs=True needs a TensorRT engine)")
        selected = self.selected_outputs(outputs)
        valid = validate_feeds(self.inputs, feeds)
        buffers = validate_out(selected, out)
        names = [s.name for s in selected]
        results = dict(zip(names, self.session.run(names, valid)))
        views = {name: out_view(name, buf, results[name].shape) for name, buf in buffers.items()}
        for name, view in views.items():  # every size checked before any buffer is written
            np.copyto(view, results[name])
        results.update(views)
        return results

    def close(self) -> None:
        """Waits for calls in flight (other threads), then drops the session. Idempotent."""
        if self._gate.close():
            self.session = None
