"""TensorRT engine -> `TensorRTModel`: numpy (or GPU tensors) in, numpy out.

    from trt_seer.runtime.engine import EngineOptions, TensorRTModel
    with TensorRTModel("engines/all-MiniLM-L6-v2.fp16.engine", EngineOptions(contexts=2)) as m:
        out = m.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        print(out["sentence_embedding"].shape, m.last_gpu_ms)

The manifest beside the engine is checked against the installed TensorRT flavor and version and
the GPU's compute capability before anything is deserialized. Device buffers are sized once for
the profile's largest shapes; each call stages inputs in pinned memory, copies them on a stream,
runs `execute_async_v3` and copies the outputs back. Inputs that already live on the GPU
(`__cuda_array_interface__` or DLPack) are bound by pointer, not copied.

Threads: each of `contexts` execution contexts has its own stream, buffers and graphs; a call
takes a free one (waiting if none is free), so any number of threads may call `infer` at once.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.engine import manifest as manifest_io
from trt_seer.engine import trt as trt_adapter
from trt_seer.errors import CudaError, DependencyError, InputError, ManifestMismatchError, TrtSeerError, \
    UnsupportedError
from trt_seer.files import atomic_write_bytes
from trt_seer.runtime import cuda
from trt_seer.runtime.base import Model, Pending
from trt_seer.runtime.io import DeviceTensor, IOSpec, token_axes, validate_feeds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """How to run an engine. `runtime_cache`: "auto" keeps TensorRT-RTX's JIT kernels in
    `<engine stem>.runtime.cache` beside the engine, a path puts them there, None turns it off."""

    device: int = 0
    contexts: int = 1
    use_cuda_graph: bool = False
    max_graphs: int = 32  # captured shapes kept per context (least recently used dropped)
    runtime_cache: str | Path | None = "auto"
    verbose: bool = False

    def __post_init__(self):
        if self.contexts < 1:
            raise InputError(f"contexts must be >= 1, got {self.contexts}")


def runtime_cache_path(engine_path: Path) -> Path:
    """`x.fp16.engine` -> `x.fp16.runtime.cache`."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.stem + ".runtime.cache")


def check_manifest(manifest: dict, installed: dict, device_cc: tuple[int, int], gpu: str = "this GPU") -> None:
    """Raises ManifestMismatchError, naming both sides, if the engine cannot run here.

    Args:
        manifest: the engine manifest.
        installed: the installed flavor, `{"flavor": ..., "version": ...}` (Flavor.describe()).
        device_cc: the GPU's compute capability, e.g. (8, 9).
        gpu: the GPU's name, for the message.
    Whether the installed runtime drives this GPU at all is TensorRT's own call at deserialization,
    reported with the GPU and TensorRT's reason.
    """
    name = manifest.get("engine", {}).get("file", manifest.get("name", "engine"))
    built = manifest["tensorrt"]
    built_as = f"{built.get('flavor')} {built.get('version')}"
    here = f"{installed['flavor']} {installed['version']}"
    if built.get("flavor") != installed["flavor"]:
        raise ManifestMismatchError(f"{name} was built with {built_as}; this runtime has {here}: "
                                    f"install {built.get('flavor')} or rebuild the engine here")
    compat = bool(manifest.get("build", {}).get("settings", {}).get("version_compatible", False))
    if not trt_adapter.engine_version_compatible(installed["flavor"], built["version"], installed["version"], compat):
        raise ManifestMismatchError(f"{name} was built with {built_as}; this runtime has {here}: engines "
                                    "load only in the release that built them; rebuild the engine "
                                    f"(python -m trt_seer build) or install {built_as}")
    cc = f"{device_cc[0]}.{device_cc[1]}"
    targets = manifest["targets"]
    why = trt_adapter.build_gpu_mismatch(targets, device_cc, gpu)
    if why:
        raise ManifestMismatchError(f"{name} {why}")
    if not trt_adapter.target_allows(targets, device_cc, targets.get("build_compute_capability")):
        want = ", ".join(targets.get("compute_capabilities") or []) or targets.get("mode", "?")
        raise ManifestMismatchError(f"{name} targets compute capability {want}; {gpu} is {cc}: "
                                    f"rebuild with --compute-capability {cc}")


def engine_specs(engine, trt, profile: int = 0) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """Inputs (with the profile's min/max shapes) and outputs, as the engine itself reports them."""
    inputs, outputs = [], []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name))).name
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            lo, _, hi = engine.get_tensor_profile_shape(name, profile)
            inputs.append(IOSpec(name, dtype, shape, token_axes(shape), tuple(lo), tuple(hi)))
        else:
            outputs.append(IOSpec(name, dtype, shape, token_axes(shape)))
    return tuple(inputs), tuple(outputs)


def _check_io_names(manifest: dict, inputs, outputs, path: Path) -> None:
    for kind, specs in (("inputs", inputs), ("outputs", outputs)):
        listed = [t["name"] for t in manifest["io"][kind]]
        actual = [s.name for s in specs]
        if sorted(listed) != sorted(actual):
            raise ManifestMismatchError(f"the manifest of {path.name} lists {kind} {listed} but the engine has "
                                        f"{actual}: the manifest belongs to another build; rebuild the engine")


def _nbytes(shape, dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class _Slot:
    """One execution context with its own stream, events, staging buffers and captured graphs."""

    def __init__(self, model: "TensorRTModel"):
        self.context = model._new_context()
        self.stream = cuda.Stream()
        self.start, self.end = cuda.Event(), cuda.Event()
        self.done, self.ready = cuda.Event(timing=False), cuda.Event(timing=False)
        self.inputs = {s.name: cuda.HostDeviceBuffer(_nbytes(s.max_shape, s.dtype)) for s in model.inputs}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.graphs: collections.OrderedDict = collections.OrderedDict()
        max_out = self._max_output_shapes(model)
        self.outputs = {s.name: cuda.HostDeviceBuffer(_nbytes(max_out[s.name], s.dtype)) for s in model.outputs}
        for name, buf in self.outputs.items():
            self.bind(name, buf.device_ptr)

    def _max_output_shapes(self, model: "TensorRTModel") -> dict[str, tuple[int, ...]]:
        self.set_shapes({s.name: s.max_shape for s in model.inputs})
        shapes = {s.name: tuple(self.context.get_tensor_shape(s.name)) for s in model.outputs}
        unknown = [n for n, shape in shapes.items() if min(shape, default=0) < 0]
        if unknown:
            raise UnsupportedError(f"outputs {unknown} have data-dependent shapes; this runtime sizes "
                                   "outputs from the profile's max input shapes")
        return shapes

    def set_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        for name, shape in shapes.items():
            if self.shapes.get(name) != shape:
                if not self.context.set_input_shape(name, shape):
                    raise InputError(f"TensorRT rejected shape {list(shape)} for input {name}")
                self.shapes[name] = shape

    def bind(self, name: str, address: int) -> None:
        if self.addresses.get(name) != address:
            self.context.set_tensor_address(name, address)
            self.addresses[name] = address

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
        self.context = None
        for buf in (*self.inputs.values(), *self.outputs.values()):
            buf.close()
        for owned in (self.start, self.end, self.done, self.ready, self.stream):
            owned.close()


def _abandon(model_ref, slot: _Slot, keepalive) -> None:
    """A Pending dropped without result(): wait for its work, then free its context."""
    model = model_ref()
    if model is not None and not model.closed:
        slot.done.synchronize()
        model._release(slot)


class EnginePending(Pending):
    """Work enqueued on a context's stream; `result()` waits and returns fresh numpy arrays."""

    def __init__(self, model: "TensorRTModel", slot: _Slot, out_shapes: dict, keepalive):
        self._model, self._slot, self._shapes = model, slot, out_shapes
        self._outputs: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()
        # Keeps the caller's GPU tensors alive until the work is done, even if this is dropped.
        self._finalizer = weakref.finalize(self, _abandon, weakref.ref(model), slot, keepalive)

    def done(self) -> bool:
        return self._outputs is not None or (self._slot is not None and self._slot.done.query())

    def result(self) -> dict[str, np.ndarray]:
        with self._lock:
            if self._outputs is None:
                if self._slot is None:
                    raise CudaError("this call failed when its result was first read", name="failed")
                slot, self._slot = self._slot, None
                self._finalizer.detach()
                try:
                    self._outputs = self._collect(slot)
                finally:
                    self._model._release(slot)
        return self._outputs

    def _collect(self, slot: _Slot) -> dict[str, np.ndarray]:
        if self._model.closed:
            raise CudaError("the model was closed before this call's result was read", name="closed")
        slot.done.synchronize()
        self._model.last_gpu_ms = slot.end.elapsed_ms(slot.start)
        dtypes = {s.name: s.dtype for s in self._model.outputs}
        return {name: slot.outputs[name].host_view(shape, dtypes[name]).copy()
                for name, shape in self._shapes.items()}


class TensorRTModel(Model):
    """A deserialized engine ready to run; see the module docstring."""

    backend = "tensorrt"

    def __init__(self, path: str | Path, options: EngineOptions = EngineOptions()):
        super().__init__()
        self.path, self.options = Path(path), options
        if not self.path.is_file():
            raise InputError(f"engine not found: {self.path}")
        self.manifest = manifest_io.read_engine_manifest(manifest_io.engine_manifest_path(self.path))
        self.flavor = trt_adapter.load()
        self.gpu = _open_device(options.device)
        check_manifest(self.manifest, self.flavor.describe(), self.gpu.compute_capability, self.gpu.name)
        self._logger = trt_adapter.logger(self.flavor, options.verbose)
        self._runtime, self.engine = self._deserialize()
        self.inputs, self.outputs = engine_specs(self.engine, self.flavor.trt)
        _check_io_names(self.manifest, self.inputs, self.outputs, self.path)
        self._cache_path = self._resolve_cache_path()
        self._cache, self._cache_blob = None, b""
        self._configs: list = []
        self._graphs_ok = options.use_cuda_graph
        self.graph_mode = "capture" if options.use_cuda_graph else None  # "runtime": the flavor's own
        self._slots = [_Slot(self) for _ in range(options.contexts)]
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for slot in self._slots:
            self._free.put(slot)
        self._close_lock = threading.Lock()

    # --- loading -----------------------------------------------------------------------------

    def _deserialize(self):
        blob = self.path.read_bytes()
        expected = self.manifest["engine"].get("size_bytes")
        if expected is not None and expected != len(blob):
            raise ManifestMismatchError(f"{self.path.name} is {len(blob)} bytes but its manifest says {expected}: "
                                        "the engine was replaced without its manifest; rebuild it")
        runtime = self.flavor.trt.Runtime(self._logger)
        engine = runtime.deserialize_cuda_engine(blob)
        if engine is None:
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "see the TensorRT log"
            raise ManifestMismatchError(
                f"{self.flavor.name} {self.flavor.version} could not load {self.path.name} on {self.gpu.name} "
                f"(compute capability {self.gpu.major}.{self.gpu.minor}): {why}; rebuild it here with "
                "python -m trt_seer build, or run the .onnx on CPU")
        return runtime, engine

    def _resolve_cache_path(self) -> Path | None:
        if self.options.runtime_cache is None or not self.flavor.has_runtime_cache:
            return None
        if self.options.runtime_cache == "auto":
            return runtime_cache_path(self.path)
        return Path(self.options.runtime_cache)

    def _runtime_config(self):
        """A per-context IRuntimeConfig sharing one runtime cache (TensorRT-RTX), or None."""
        if not hasattr(self.engine, "create_runtime_config"):
            return None
        config = self.engine.create_runtime_config()
        if self._cache_path is not None:
            if self._cache is None:
                self._cache = config.create_runtime_cache()
                self._load_cache()
            config.set_runtime_cache(self._cache)
        if self._graphs_ok and hasattr(config, "cuda_graph_strategy"):
            # TensorRT-RTX does not let callers capture its launches (its JIT may compile kernels
            # mid-launch); it captures and replays a graph per input shape itself when asked.
            config.cuda_graph_strategy = self.flavor.trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
            self.graph_mode = "runtime"
        self._configs.append(config)
        return config

    def _load_cache(self) -> None:
        if not self._cache_path.is_file():
            return
        blob = self._cache_path.read_bytes()
        if self._cache.deserialize(blob):
            self._cache_blob = blob
            log.debug("loaded runtime cache %s (%d bytes)", self._cache_path, len(blob))
        else:
            log.info("runtime cache %s is from another GPU, driver or TensorRT-RTX release; "
                     "kernels will be compiled again and the cache rewritten", self._cache_path)

    def _new_context(self):
        config = self._runtime_config()
        context = (self.engine.create_execution_context(config) if config is not None
                   else self.engine.create_execution_context())
        if context is None:
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "out of GPU memory?"
            raise TrtSeerError(f"TensorRT could not create an execution context for {self.path.name}: {why}")
        return context

    # --- running -----------------------------------------------------------------------------

    def infer_async(self, feeds, stream=None) -> EnginePending:
        """Enqueues one call and returns at once; `.result()` waits for the outputs.

        Args:
            feeds: {input name: numpy array or GPU tensor}.
            stream: a `cuda.Stream` or raw CUDA stream handle to run on (default: the context's).
        """
        if self.closed:
            raise InputError(f"{self.path.name} is closed")
        slot = self._acquire()
        try:
            handle = cuda.stream_handle(stream) if stream is not None else slot.stream.handle
            valid = validate_feeds(self.inputs, feeds, allow_device=True, consumer_stream=int(handle))
            out_shapes = self._enqueue(slot, valid, handle)
        except BaseException:
            self._release_after_sync(slot)
            raise
        return EnginePending(self, slot, out_shapes, valid)

    def _acquire(self) -> _Slot:
        return self._free.get()

    def _release(self, slot: _Slot) -> None:
        self._free.put(slot)

    def _release_after_sync(self, slot: _Slot) -> None:
        try:
            slot.stream.synchronize()
        finally:
            self._release(slot)

    def _enqueue(self, slot: _Slot, feeds: dict, stream) -> dict[str, tuple[int, ...]]:
        slot.set_shapes({name: tuple(v.shape) for name, v in feeds.items()})
        for name, value in feeds.items():
            slot.bind(name, self._stage(slot, name, value, stream))
        dtypes = {s.name: s.dtype for s in self.outputs}
        out_shapes = {s.name: tuple(slot.context.get_tensor_shape(s.name)) for s in self.outputs}
        slot.start.record(stream)
        self._execute(slot, feeds, stream)
        slot.end.record(stream)
        for name, shape in out_shapes.items():
            slot.outputs[name].d2h_async(stream, _nbytes(shape, dtypes[name]))
        slot.done.record(stream)
        return out_shapes

    def _stage(self, slot: _Slot, name: str, value, stream) -> int:
        """The device address to bind for one input: a staged copy, or the caller's GPU memory."""
        if isinstance(value, np.ndarray):
            buf = slot.inputs[name]
            np.copyto(buf.host_view(value.shape, value.dtype), value)
            buf.h2d_async(stream, value.nbytes)
            return buf.device_ptr
        owner = cuda.pointer_device(value.ptr)
        if owner is None:
            raise InputError(f"input {name} claims to be on a GPU but its memory is not device memory")
        if owner != self.gpu.index:
            raise InputError(f"input {name} is on GPU {owner}; this engine runs on GPU {self.gpu.index}: "
                             f"move the tensor there or load the engine with device={owner}")
        if value.stream is not None and value.stream != int(stream):
            slot.ready.record(value.stream)  # the producer's pending writes come first
            cuda.wait_event(stream, slot.ready)
        return value.ptr

    def _execute(self, slot: _Slot, feeds: dict, stream) -> None:
        staged = all(isinstance(v, np.ndarray) for v in feeds.values())
        if not (self._graphs_ok and staged) or self.graph_mode == "runtime":
            return self._enqueue_engine(slot, stream)
        key = tuple(tuple(v.shape) for v in feeds.values())
        graph = slot.graphs.get(key)
        if graph is None:
            self._enqueue_engine(slot, stream)  # runs this call eagerly and warms the shape up
            self._capture(slot, key)
            return None
        slot.graphs.move_to_end(key)
        graph.launch(stream)
        return None

    def _enqueue_engine(self, slot: _Slot, stream) -> None:
        if not slot.context.execute_async_v3(int(stream)):
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "see the TensorRT log"
            raise TrtSeerError(f"TensorRT failed to run {self.path.name}: {why}")

    def _capture(self, slot: _Slot, key) -> None:
        """Captures the engine's launch for this shape on the context's own stream."""
        if not slot.context.is_stream_capturable(int(slot.stream.handle)):
            return self._disable_graphs("TensorRT says this engine's stream is not capturable")
        try:
            graph = cuda.CudaGraph.capture(slot.stream, lambda: self._enqueue_engine(slot, slot.stream.handle))
        except (CudaError, TrtSeerError) as e:
            return self._disable_graphs(f"capture failed: {e}")
        slot.graphs[key] = graph
        while len(slot.graphs) > self.options.max_graphs:
            slot.graphs.popitem(last=False)[1].close()
        return None

    def _disable_graphs(self, why: str) -> None:
        self._graphs_ok, self.graph_mode = False, None
        warnings.warn(f"CUDA graphs turned off for {self.path.name}: {why}; running eagerly", RuntimeWarning,
                      stacklevel=4)

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for in-flight work, saves the runtime cache, frees contexts and memory. Idempotent."""
        with self._close_lock:
            if self.closed:
                return
            for slot in self._slots:
                slot.stream.synchronize()
            self._save_cache()
            self.closed = True
            for slot in self._slots:
                slot.close()
            self._slots, self._configs, self._cache = [], [], None
            self.engine = self._runtime = None

    def _save_cache(self) -> None:
        if self._cache is None:
            return
        blob = bytes(memoryview(self._cache.serialize()))
        if not blob or blob == self._cache_blob:
            return
        try:
            atomic_write_bytes(self._cache_path, blob)
        except OSError as e:
            warnings.warn(f"could not save the runtime cache {self._cache_path}: {e}; JIT kernels will "
                          "be compiled again next time", RuntimeWarning, stacklevel=3)
            return
        log.debug("saved runtime cache %s (%d bytes)", self._cache_path, len(blob))


def _open_device(device: int) -> cuda.DeviceInfo:
    """Makes `device` current; DependencyError when there is no usable GPU."""
    reason = cuda.gpu_unavailable_reason(device)
    if reason is not None:
        raise DependencyError(f"cannot run a TensorRT engine: {reason}; use the .onnx artifact on CPU "
                              "(backend='onnxruntime')")
    cuda.set_device(device)
    return cuda.device_info(device)
