"""TensorRT engine -> `TensorRTModel`: numpy (or GPU tensors) in, numpy out.

    from trt_seer.runtime.engine import EngineOptions, TensorRTModel
    with TensorRTModel("engines/all-MiniLM-L6-v2.fp16.engine", EngineOptions(contexts=2, time_gpu=True)) as m:
        out = m.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        print(out["sentence_embedding"].shape, m.last_gpu_ms)

The manifest beside the engine is checked against the installed TensorRT flavor and version and
the GPU's compute capability before anything is deserialized. Device buffers are sized once for
the profile's largest shapes; each call stages inputs in pinned memory, copies them on a stream,
runs the engine (a replayed CUDA graph for a shape seen before) and copies back only the outputs
asked for (`outputs=[...]`). Inputs that already live on the GPU (`__cuda_array_interface__` or
DLPack) are bound by pointer, not copied; so are caller GPU buffers given as `out=`;
`device_outputs=True` hands out the context's own output buffers (valid until the next call).

Threads: each of `contexts` execution contexts has its own stream, buffers and graphs (slot.py);
a call takes a free one (waiting if none is free), so any number of threads may call `infer` at
once. `close()` waits for the calls in flight and makes later ones raise InputError.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import CudaError, InputError, ManifestMismatchError, TrtSeerError
import trt_seer.runtime.cuda as cuda
from trt_seer.runtime.base import Model
from trt_seer.runtime.io import DeviceTensor, FeedCheck, IOSpec, out_view, token_axes, validate_out
from trt_seer.runtime.loader import EngineOptions, load_engine, runtime_config
from trt_seer.runtime.limits import engine_token_limits
from trt_seer.runtime.prepared_engine import EnginePreparedCall
from trt_seer.runtime.slot import EnginePending, Plan, Slot, SlotPool

log = logging.getLogger(__name__)


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


class TensorRTModel(Model):
    """A deserialized engine ready to run; see the module docstring."""

    backend = "tensorrt"

    def __init__(self, path: str | Path, options: EngineOptions = EngineOptions()):
        super().__init__()
        self.path, self.options = Path(path), options
        loaded = load_engine(self.path, options)
        self.manifest, self.flavor, self.gpu, self.engine = loaded.manifest, loaded.flavor, loaded.gpu, loaded.engine
        self._logger, self._runtime, self._jit_cache = loaded.logger, loaded.runtime, loaded.jit_cache
        self.inputs, self.outputs = engine_specs(self.engine, self.flavor.trt)
        _check_io_names(self.manifest, self.inputs, self.outputs, self.path)
        self.inputs = engine_token_limits(self.manifest, self.path).apply(self.inputs)
        self._check_feeds = FeedCheck(self.inputs)
        self._graphs_ok = options.use_cuda_graph is not False
        self.graph_mode = "capture" if self._graphs_ok else None  # "runtime": the flavor's own
        self.pool = SlotPool(self.path.name, [Slot(self) for _ in range(options.contexts)])
        self._gate = self.pool

    # --- loading -----------------------------------------------------------------------------

    def _runtime_config(self):
        """A per-context IRuntimeConfig sharing one runtime cache (TensorRT-RTX), or None."""
        config = runtime_config(self.engine, self.flavor, self._jit_cache, self._graphs_ok)
        if config is not None and self._graphs_ok and hasattr(config, "cuda_graph_strategy"):
            self.graph_mode = "runtime"  # the flavor captures and replays per shape itself
        return config

    def new_context(self) -> tuple:
        """(a new execution context, its IRuntimeConfig or None); the slot keeps both."""
        config = self._runtime_config()
        context = (self.engine.create_execution_context(config) if config is not None
                   else self.engine.create_execution_context())
        if context is None:
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "out of GPU memory?"
            raise TrtSeerError(f"TensorRT could not create an execution context for {self.path.name}: {why}")
        return context, config

    # --- running -----------------------------------------------------------------------------

    def infer_async(self, feeds, stream=None, *, outputs=None, out=None, device_outputs: bool = False) -> EnginePending:
        """Enqueues one call and returns at once; `.result()` waits for the outputs.

        Args:
            feeds: {input name: numpy array or GPU tensor}.
            stream: a `cuda.Stream` or raw CUDA stream handle to run on (default: the context's).
            outputs: output names to return (default: all); only these are copied back.
            out: {output name: host numpy or GPU array} to write into; GPU arrays are bound as the
                engine's output address (written directly, no copy).
            device_outputs: return `DeviceTensor`s over the context's own output buffers (no copy),
                valid until another call on this model starts; see docs/RUNTIME.md.
        """
        selected = self.selected_outputs(outputs)
        slot = self.pool.acquire()
        handle = cuda.stream_handle(stream) if stream is not None else slot.stream.handle
        try:
            results, keepalive = self._start(slot, feeds, selected, out, device_outputs, handle)
            pending = EnginePending(self, slot, results, keepalive)
        except BaseException:
            self._release_after_sync(slot, handle)
            raise
        self.pool.leave()
        return pending

    def prepare(self, shapes, outputs=None) -> EnginePreparedCall:
        """A prepared call (see Model.prepare) with an execution context, stream and buffers of its
        own, freed by its close() or the model's; each costs the GPU memory of one more context."""
        return EnginePreparedCall(self, shapes, outputs)

    def infer(self, feeds, outputs=None, *, out=None, device_outputs: bool = False) -> dict:
        """`infer_async(...).result()` without a pending call's bookkeeping: the call keeps its
        execution context from the first copy to the last (see Model.infer for the arguments)."""
        selected = self.selected_outputs(outputs)
        slot = self.pool.acquire()
        handle = slot.stream.handle
        try:
            seen = None if device_outputs or slot.foreign else self._check_feeds.seen(feeds)
            plan = None if seen is None else slot.plan(seen[1], selected)
            if plan is not None and (not out or _host_outs_fit(plan, out)):
                # host feeds of shapes that passed before; outputs to fresh arrays or the caller's
                values = self._run_plan(slot, plan, seen[0], out)
            else:
                results, _ = self._start(slot, feeds, selected, out, device_outputs, handle, done_event=False)
                slot.stream.synchronize()
                self.note_gpu_time(slot)
                values = {name: value.copy() if copy else value for name, value, copy in results}
        except BaseException:
            self._release_after_sync(slot, handle)
            raise
        self.pool.release_and_leave(slot)
        return values

    def _run_plan(self, slot: Slot, plan: Plan, feeds: tuple, out: dict | None = None) -> dict:
        """The common call, worked out beforehand (`Slot.plan`; `feeds` in input order): the same
        CUDA work as `_enqueue` with every tensor in the slot's own buffers, the wait, the copies out
        (into `out`'s host arrays where it names the output, checked by `_host_outs_fit`)."""
        for view, value in zip(plan.views, feeds):
            view[...] = value  # same shape and dtype: a plain copy, cheaper to call than np.copyto
        slot.set_shapes(plan.key)
        slot.launch(plan, self)
        if not out:
            return {name: view.copy() for name, view in plan.returns}
        values = {}
        for name, view in plan.returns:
            dest = out.get(name)
            if dest is None:
                values[name] = view.copy()
            else:
                dest[...] = view
                values[name] = dest
        return values

    def _start(self, slot: Slot, feeds, selected: tuple, out, device_outputs: bool, handle,
               done_event: bool = True) -> tuple[list, tuple]:
        """Checks the call and enqueues it on `handle`; (results, what must stay alive until done).
        `done_event`: record `slot.done` after the work (a caller that syncs the slot's own stream
        needs none)."""
        valid, key = self._check_feeds(feeds, allow_device=True, consumer_stream=int(handle))
        buffers = validate_out(selected, out, allow_device=True, consumer_stream=int(handle))
        results = self._enqueue(slot, valid, key, _Call(selected, buffers, device_outputs), handle)
        if done_event:
            slot.done.record(handle)
        return results, (valid, buffers)

    def _release_after_sync(self, slot: Slot, stream) -> None:
        try:
            cuda.synchronize(stream)
        finally:
            self.pool.release(slot)
            self.pool.leave()

    def _enqueue(self, slot: Slot, feeds: dict, key: tuple, call: "_Call", stream) -> list:
        """`key`: the feeds' shapes, in input order (as `feeds` is)."""
        out_shapes = slot.output_shapes(key)
        views = {n: out_view(n, b, out_shapes[n]) for n, b in call.buffers.items()}  # sizes before any work
        self._stage_inputs(slot, feeds, stream)
        if views or slot.foreign:  # else every output is bound to the slot's own buffer already
            self._bind_outputs(slot, views, stream)
        self.run_engine(slot, key, stream)
        return [self._result(slot, spec, out_shapes[spec.name], views.get(spec.name), call, stream)
                for spec in call.outputs]

    def _stage_inputs(self, slot: Slot, feeds: dict, stream) -> None:
        """Binds every input: host arrays go to their place in the slot's staging buffer and move
        to the GPU in one copy; GPU tensors are bound where they are."""
        staged = 0  # bytes of the staging buffer this call fills
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                region = slot.inputs[name]
                np.copyto(region.host_view(value.shape, value.dtype), value)
                slot.bind(name, region.device_ptr)
                staged = max(staged, region.offset + value.nbytes)
            else:
                slot.bind(name, self._device_address(slot, f"input {name}", value, stream))
        if staged:
            slot.staging.h2d_async(stream, staged)

    def _bind_outputs(self, slot: Slot, views: dict, stream) -> None:
        for name in slot.output_names:  # every output needs an address, returned or not
            view = views.get(name)
            on_gpu = isinstance(view, DeviceTensor)
            slot.bind(name, self._device_address(slot, f"out[{name}]", view, stream) if on_gpu
                      else slot.own[name])

    def _result(self, slot: Slot, spec: IOSpec, shape, view, call: "_Call", stream) -> tuple:
        """(name, value, copy?) for one returned output, enqueuing its copy back if it has one."""
        buf = slot.outputs[spec.name]
        if isinstance(view, DeviceTensor):
            return spec.name, view, False  # the engine wrote into the caller's GPU memory
        if view is not None:  # the caller's host array: copied straight into it
            cuda.copy_async(view.ctypes.data, buf.device_ptr, view.nbytes, "DeviceToHost", stream)
            return spec.name, view, False
        if call.device_outputs:
            tensor = DeviceTensor(buf.device_ptr, shape, np.dtype(spec.dtype), self.gpu.index, None, buf)
            return spec.name, tensor, False
        host = buf.host_view(shape, spec.dtype)
        buf.d2h_async(stream, host.nbytes)
        return spec.name, host, True

    def _device_address(self, slot: Slot, label: str, value: DeviceTensor, stream) -> int:
        """The caller's GPU memory, checked to be on this engine's GPU; the call waits for the
        producer's stream where the array names one."""
        owner = cuda.pointer_device(value.ptr)
        if owner is None:
            raise InputError(f"{label} claims to be on a GPU but its memory is not device memory")
        if owner != self.gpu.index:
            raise InputError(f"{label} is on GPU {owner}; this engine runs on GPU {self.gpu.index}: "
                             f"move the tensor there or load the engine with device={owner}")
        if value.stream is not None and value.stream != int(stream):
            slot.ready.record(value.stream)  # the producer's pending work comes first
            cuda.wait_event(stream, slot.ready)
        return value.ptr

    def run_engine(self, slot: Slot, key: tuple, stream) -> None:
        """`_execute` between the slot's timing events when `time_gpu` is on."""
        timed = self.options.time_gpu
        if timed:
            slot.start.record(stream)
        self._execute(slot, key, stream)
        if timed:
            slot.end.record(stream)

    def note_gpu_time(self, slot: Slot) -> None:
        """Sets `last_gpu_ms` from the slot's timing events (their work done), or None untimed."""
        self.last_gpu_ms = slot.end.elapsed_ms(slot.start) if self.options.time_gpu else None

    def _execute(self, slot: Slot, key: tuple, stream) -> None:
        """Replays the captured graph of this shape when the context is in the state it was captured
        in (same shapes, this slot's own buffers, an eager enqueue since the last change); otherwise
        enqueues eagerly, and captures the shape if it has no graph yet."""
        if not self._graphs_ok or self.graph_mode == "runtime" or slot.foreign:
            return self.enqueue_engine(slot, stream)
        graph = None if slot.dirty else slot.graphs.get(key)
        if graph is not None:
            slot.graphs.move_to_end(key)
            return graph.launch(stream)
        self.enqueue_engine(slot, stream)  # after a shape switch TensorRT must enqueue before a replay
        if key not in slot.graphs:
            self._capture(slot, key)
        return None

    def enqueue_engine(self, slot: Slot, stream) -> None:
        if not slot.context.execute_async_v3(int(stream)):
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "see the TensorRT log"
            raise TrtSeerError(f"TensorRT failed to run {self.path.name}: {why}")
        slot.dirty = False

    def _capture(self, slot: Slot, key) -> None:
        """Captures the engine's launch for this shape on the context's own stream."""
        if not slot.context.is_stream_capturable(int(slot.stream.handle)):
            return self._disable_graphs("TensorRT says this engine's stream is not capturable")
        try:
            graph = cuda.CudaGraph.capture(slot.stream, lambda: self.enqueue_engine(slot, slot.stream.handle))
        except (CudaError, TrtSeerError) as e:
            return self._disable_graphs(f"capture failed: {e}")
        slot.graphs[key] = graph
        while len(slot.graphs) > self.options.max_graphs:
            slot.graphs.popitem(last=False)[1].close()
        return None

    def _disable_graphs(self, why: str) -> None:
        self._graphs_ok, self.graph_mode = False, None
        message = f"CUDA graphs turned off for {self.path.name}: {why}; running eagerly"
        if self.options.use_cuda_graph:  # asked for explicitly: say so loudly
            warnings.warn(message, RuntimeWarning, stacklevel=5)
        else:
            log.info(message)

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Refuses new calls, waits for the calls in flight (other threads), then waits for the
        GPU, saves the runtime cache and frees contexts and memory. Idempotent and thread-safe;
        a pending call whose result was not read yet raises InputError when read afterwards."""
        if not self.pool.close():
            return
        for slot in self.pool.slots:
            slot.stream.synchronize()
            slot.done.synchronize()  # work enqueued on a caller's stream
        self._jit_cache.save()
        for slot in self.pool.slots:
            slot.close()
        self.pool.slots.clear()
        self.engine = self._runtime = None


@dataclass(frozen=True)
class _Call:
    """What one call asked for: the outputs to return, caller buffers for some, GPU or host."""

    outputs: tuple[IOSpec, ...]
    buffers: dict
    device_outputs: bool


def _host_outs_fit(plan: Plan, out) -> bool:
    """Whether every array of `out` is a writable host numpy array of exactly the shape and dtype
    the plan returns under its name (the fast path copies into it); else the full check runs."""
    if type(out) is not dict:
        return False
    returns = dict(plan.returns)
    for name, dest in out.items():
        view = returns.get(name)
        if (view is None or type(dest) is not np.ndarray or dest.shape != view.shape or dest.dtype != view.dtype
                or not dest.flags.writeable):
            return False
    return True
