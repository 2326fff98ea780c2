"""The TensorRT backend's per-context state and call lifecycle.

`Slot`: one execution context with its stream, events, staging and output buffers, captured CUDA
graphs and the shape / address state TensorRT was last enqueued with. `SlotPool`: the free slots
behind a `CallGate`, so `close()` waits for calls in flight and callers waiting for a slot give up.
`EnginePending`: an enqueued call; `result()` waits and returns what the call asked for.
`Plan`: what a repeated synchronous call needs, worked out once per input shapes and outputs.
`SlotOwner`: what a slot needs from its model (TensorRTModel, engine.py) - the seam between them.
"""
from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trt_seer.errors import CudaError, InputError, UnsupportedError
import trt_seer.runtime.cuda as cuda
from trt_seer.runtime.base import CallGate, Pending
from trt_seer.runtime.io import IOSpec

CACHE_LIMIT = 256  # output shapes kept per slot (one entry per input shape seen)
ALIGN = 256  # bytes; each input's place in the staging buffer starts on such a boundary


def nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class Region:
    """One input's fixed place in a slot's staging buffer: numpy views of its pinned host bytes
    (kept per shape and dtype) and the device address the engine reads it from."""

    def __init__(self, staging: cuda.HostDeviceBuffer, offset: int, size: int):
        self.offset, self.size = offset, size
        self.device_ptr = staging.device_ptr + offset
        self._views = cuda.ByteViews(staging.host_view((staging.nbytes,), np.uint8)[offset:offset + size], "the region")

    def host_view(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return self._views.get(shape, dtype)


def staging_regions(specs) -> tuple[cuda.HostDeviceBuffer, dict[str, Region]]:
    """One pinned + device buffer holding every input at its largest shape, so one copy moves
    all of a call's host inputs to the GPU; {input name: its Region}."""
    offsets, end = {}, 0
    for s in specs:
        offsets[s.name] = (end, nbytes(s.max_shape, s.dtype))
        end += -(-offsets[s.name][1] // ALIGN) * ALIGN
    staging = cuda.HostDeviceBuffer(end)
    return staging, {name: Region(staging, off, size) for name, (off, size) in offsets.items()}


@dataclass(frozen=True)
class Plan:
    """A repeated call's work on one slot, for one combination of input shapes (`key`) and returned
    outputs (`selected`, the model's cached selection): where each input is staged (`views`, in
    input order), the arguments of cudaMemcpyAsync for the staged inputs (`copy_in`) and for each
    returned output's copy back (`copies_out`), and (name, pinned host view) per returned output."""

    key: tuple
    selected: tuple
    views: tuple
    copy_in: tuple
    copies_out: tuple
    returns: tuple


class SlotOwner(Protocol):
    """The model side of a slot: its I/O, how to make a context, how to run the engine on one."""

    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    options: object  # EngineOptions: `time_gpu`
    graph_mode: str | None
    pool: "SlotPool"

    @property
    def input_names(self) -> tuple[str, ...]: ...

    @property
    def output_names(self) -> tuple[str, ...]: ...

    def new_context(self) -> tuple:
        """(execution context, its runtime config or None)."""

    def enqueue_engine(self, slot: "Slot", stream) -> None:
        """One plain enqueue of the engine on `slot`'s context."""

    def run_engine(self, slot: "Slot", key: tuple, stream) -> None:
        """The engine for input shapes `key`: a replayed graph or an enqueue, timed if asked."""

    def note_gpu_time(self, slot: "Slot") -> None:
        """Reads the GPU time of the slot's last call."""


class Slot:
    """One execution context. `dirty` is True while the context's input shapes or tensor addresses
    differ from those of its last `enqueueV3`: TensorRT redoes shape-dependent work on the next
    enqueue, so a captured graph may replay only once an eager enqueue has run in the current state."""

    def __init__(self, model: SlotOwner):
        self.context, self.config = model.new_context()  # the config lives as long as its context
        self.input_names = model.input_names
        self.input_dtypes = tuple(np.dtype(s.dtype) for s in model.inputs)
        self.stream = cuda.Stream()
        rt = cuda.cudart()
        self._memcpy, self._sync = rt.cudaMemcpyAsync, rt.cudaStreamSynchronize
        self.start, self.end = cuda.Event(), cuda.Event()
        self.done, self.ready = cuda.Event(timing=False), cuda.Event(timing=False)
        self.staging, self.inputs = staging_regions(model.inputs)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._key: tuple | None = None  # the shapes last set, all inputs at once
        self.addresses: dict[str, int] = {}
        self.foreign: set[str] = set()  # tensors bound to caller memory, not this slot's buffers
        self.dirty = True
        self.graphs: collections.OrderedDict = collections.OrderedDict()
        self._out_shapes: dict[tuple, dict[str, tuple[int, ...]]] = {}
        self._plans: dict[tuple, Plan] = {}
        self.output_names = model.output_names
        max_out = self._max_output_shapes(model)
        self.outputs = {s.name: cuda.HostDeviceBuffer(nbytes(max_out[s.name], s.dtype)) for s in model.outputs}
        self.own = {**{n: b.device_ptr for n, b in self.inputs.items()},
                    **{n: b.device_ptr for n, b in self.outputs.items()}}
        for name, address in self.own.items():  # so `not foreign` means every tensor is in place
            self.bind(name, address)

    def _max_output_shapes(self, model: SlotOwner) -> dict[str, tuple[int, ...]]:
        shapes = self.output_shapes(tuple(s.max_shape for s in model.inputs))
        unknown = [n for n, shape in shapes.items() if min(shape, default=0) < 0]
        if unknown:
            raise UnsupportedError(f"outputs {unknown} have data-dependent shapes; this runtime sizes "
                                   "outputs from the profile's max input shapes")
        return shapes

    def set_shapes(self, key: tuple[tuple[int, ...], ...]) -> None:
        """Sets every input's shape (`key`: one shape per input, in the model's input order)."""
        if key == self._key:
            return
        for name, shape in zip(self.input_names, key):
            if self.shapes.get(name) != shape:
                if not self.context.set_input_shape(name, shape):
                    raise InputError(f"TensorRT rejected shape {list(shape)} for input {name}")
                self.shapes[name] = shape
                self.dirty = True
        self._key = key

    def output_shapes(self, key: tuple) -> dict[str, tuple[int, ...]]:
        """Every output's shape for the input shapes `key` (set here; cached per key)."""
        self.set_shapes(key)
        shapes = self._out_shapes.get(key)
        if shapes is None:
            shapes = {n: tuple(self.context.get_tensor_shape(n)) for n in self.output_names}
            if len(self._out_shapes) < CACHE_LIMIT:
                self._out_shapes[key] = shapes
        return shapes

    def plan(self, key: tuple, selected: tuple) -> Plan:
        """The Plan of host inputs of shapes `key` returning `selected` (cached per slot)."""
        cached = self._plans.get((key, id(selected)))
        if cached is not None:  # a stored plan keeps `selected` alive, so no other tuple has its id
            return cached
        shapes = self.output_shapes(key)
        regions = [self.inputs[n] for n in self.input_names]
        views = tuple(r.host_view(shape, dt) for r, shape, dt in zip(regions, key, self.input_dtypes))
        staged = max(r.offset + v.nbytes for r, v in zip(regions, views))
        handle = self.stream.handle
        copy_in = (self.staging.device_ptr, self.staging.host_ptr, staged, cuda.memcpy_kind("HostToDevice"), handle)
        d2h, copies, returns = cuda.memcpy_kind("DeviceToHost"), [], []
        for spec in selected:
            buf, view = self.outputs[spec.name], self.outputs[spec.name].host_view(shapes[spec.name], spec.dtype)
            copies.append((buf.host_ptr, buf.device_ptr, view.nbytes, d2h, handle))
            returns.append((spec.name, view))
        plan = Plan(key, selected, views, copy_in, tuple(copies), tuple(returns))
        if len(self._plans) < CACHE_LIMIT:
            self._plans[(key, id(selected))] = plan
        return plan

    def launch(self, plan: Plan, model: SlotOwner) -> None:
        """The planned call's CUDA work on this slot's stream, its inputs staged and shapes set: the
        staged bytes in, the engine (enqueued straight on the context when the flavor replays its
        own graphs and no events are wanted), the returned outputs back, then the wait."""
        (err,) = self._memcpy(*plan.copy_in)
        if err:
            cuda.check(err, "cudaMemcpyAsync(HostToDevice)")
        timed = model.options.time_gpu
        if model.graph_mode == "runtime" and not timed:
            model.enqueue_engine(self, self.stream.ptr)
        else:
            model.run_engine(self, plan.key, self.stream.handle)
        for args in plan.copies_out:
            (err,) = self._memcpy(*args)
            if err:
                cuda.check(err, "cudaMemcpyAsync(DeviceToHost)")
        (err,) = self._sync(self.stream.handle)
        if err:
            cuda.check(err, "cudaStreamSynchronize")
        model.note_gpu_time(self)

    def bind(self, name: str, address: int) -> None:
        if self.addresses.get(name) != address:
            self.context.set_tensor_address(name, address)
            self.addresses[name] = address
            self.dirty = True
            if address == self.own.get(name):
                self.foreign.discard(name)
            else:
                self.foreign.add(name)

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
        self.context = self.config = None
        self.inputs, self._plans, self._out_shapes = {}, {}, {}  # drop this slot's views of pinned memory
        for buf in (self.staging, *self.outputs.values()):
            buf.close()
        for owned in (self.start, self.end, self.done, self.ready, self.stream):
            owned.close()


class SlotPool(CallGate):
    """Free slots (last released first, so one caller keeps reusing a slot whose graphs are warm).
    `slots`: every slot of the model, including those made outside the pool (`add`, prepared calls),
    which the model's close() frees."""

    def __init__(self, name: str, slots: list[Slot]):
        super().__init__(name)
        self.slots = list(slots)
        self._free = list(slots)

    def add(self, slot: Slot) -> None:
        """Counts `slot` among the model's slots without handing it out."""
        with self.lock:
            self.slots.append(slot)

    def remove(self, slot: Slot) -> None:
        """Forgets a slot given to `add`."""
        with self.lock:
            self.slots.remove(slot)

    def is_free(self, slot: Slot) -> bool:
        with self.lock:
            return slot in self._free

    def acquire(self) -> Slot:
        """A free slot, waiting while all are busy; InputError once the model is closed. The caller
        is inside the gate until it calls `leave()`."""
        with self.lock:
            if not self._free:
                self.wait_for(lambda: self._free or self.closed)
            self.check_open()
            self.inside += 1
            return self._free.pop()

    def release(self, slot: Slot) -> None:
        with self.lock:
            self._free.append(slot)
            self.notify()

    def release_and_leave(self, slot: Slot) -> None:
        """`release(slot)` then `leave()`, under one lock."""
        with self.lock:
            self._free.append(slot)
            self.inside -= 1
            self.notify()

    def reenter(self) -> None:
        """Enters to read a call's result; InputError when the model was closed meanwhile."""
        with self.lock:
            if self.closed:
                raise InputError(f"{self.name} was closed before this call's result was read")
            self.inside += 1

    def try_enter(self) -> bool:
        with self.lock:
            if not self.closed:
                self.inside += 1
            return not self.closed


def _abandon(pool_ref, slot: Slot, keepalive) -> None:
    """A Pending dropped without result(): wait for its work, then give its slot back."""
    pool = pool_ref()
    if pool is None or not pool.try_enter():
        return  # the model is gone or closed: close() waited for this work and freed the slot
    try:
        slot.done.synchronize()
    finally:
        pool.release(slot)
        pool.leave()


class EnginePending(Pending):
    """Work enqueued on a context's stream. `results` holds, per returned output, (name, value,
    copy): host views of pinned buffers are copied into fresh arrays (copy=True); caller buffers
    and device tensors are returned as they are."""

    def __init__(self, model: SlotOwner, slot: Slot, results: list, keepalive):
        self._model, self._slot, self._results = model, slot, results
        self._outputs: dict | None = None
        self._lock = threading.Lock()
        # Keeps the caller's GPU tensors and buffers alive until the work is done, even if dropped.
        self._finalizer = weakref.finalize(self, _abandon, weakref.ref(model.pool), slot, keepalive)

    def done(self) -> bool:
        if self._outputs is not None:
            return True
        return self._slot is not None and not self._model.closed and self._slot.done.query()

    def result(self) -> dict:
        with self._lock:
            if self._outputs is None:
                if self._slot is None:
                    raise CudaError("this call failed when its result was first read", name="failed")
                pool = self._model.pool
                pool.reenter()
                slot, self._slot = self._slot, None
                self._finalizer.detach()
                try:
                    self._outputs = self._collect(slot)
                finally:
                    pool.release(slot)
                    pool.leave()
        return self._outputs

    def _collect(self, slot: Slot) -> dict:
        slot.done.synchronize()
        self._model.note_gpu_time(slot)
        return {name: value.copy() if copy else value for name, value, copy in self._results}
