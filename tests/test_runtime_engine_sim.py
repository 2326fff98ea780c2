"""The TensorRT backend's call path (engine.py, slot.py) on CPU: CUDA copies are real memory moves
between numpy "host" and "device" arrays and the execution context computes from the memory it is
bound to, so staging, binding, shape switches and copies back are checked without a GPU. With
`CaptureRuntime`, stream capture records the context's launches (shapes and addresses frozen) and
graph launches replay them, so the runtime's own CUDA-graph path (full TensorRT) runs too. Real
kernels, streams and graphs are covered by test_runtime_gpu.py."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import trt_seer.runtime.cuda as cuda
from trt_seer.runtime import engine as engine_mod
from trt_seer.runtime import slot as slot_mod
from trt_seer.runtime.io import DeviceTensor, IOSpec, token_axes

HIDDEN = 3


class FakeRuntime:
    """cudart: copies move bytes at once (the stream is synchronous); nothing else does anything."""

    def __init__(self):
        self.copies = []

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        self.copies.append((kind, nbytes))
        ctypes.memmove(int(dst), int(src), int(nbytes))
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaEventRecord(self, event, stream):
        return (0,)

    def cudaEventSynchronize(self, event):
        return (0,)

    def cudaEventElapsedTime(self, start, end):
        return (0, 0.25)

    def cudaPointerGetAttributes(self, ptr):
        return (0, types.SimpleNamespace(device=0, type="device"))

    cudaMemoryType = types.SimpleNamespace(cudaMemoryTypeDevice="device", cudaMemoryTypeManaged="managed")


class Buffer:
    """A pinned + device pair as two numpy byte arrays."""

    def __init__(self, nbytes):
        self.nbytes = int(nbytes)
        self.host, self.dev = np.zeros(max(self.nbytes, 1), np.uint8), np.zeros(max(self.nbytes, 1), np.uint8)
        self.host_ptr, self.device_ptr = self.host.ctypes.data, self.dev.ctypes.data
        self._views = cuda.ByteViews(self.host[:self.nbytes], "the buffer")

    def host_view(self, shape, dtype):
        return self._views.get(shape, dtype)

    def h2d_async(self, stream, nbytes=None):
        cuda.copy_async(self.device_ptr, self.host_ptr, self.nbytes if nbytes is None else nbytes, "HostToDevice", stream)

    def d2h_async(self, stream, nbytes=None):
        cuda.copy_async(self.host_ptr, self.device_ptr, self.nbytes if nbytes is None else nbytes, "DeviceToHost", stream)

    def close(self):
        self.closes = getattr(self, "closes", 0) + 1


class Handle:
    def __init__(self, timing=True):
        self.handle = self.ptr = 7

    def synchronize(self):
        pass

    def record(self, stream):
        cuda.cudart().cudaEventRecord(self.handle, 7)

    def elapsed_ms(self, start):
        return 0.25

    def close(self):
        pass


def array_at(address, shape, dtype):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_uint8 * n).from_address(address), dtype=dtype).reshape(shape)


class Context:
    """An "engine": sum = (ids * mask).sum(1); hidden[b, s, k] = ids[b, s] + k. It reads and writes
    whatever memory it is bound to, as TensorRT does."""

    def __init__(self):
        self.shapes, self.addresses, self.runs = {}, {}, 0

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        b, s = self.shapes["input_ids"]
        return (b,) if name == "sum" else (b, s, HIDDEN)

    def set_tensor_address(self, name, address):
        self.addresses[name] = int(address)
        return True

    def execute_async_v3(self, stream):
        capture = getattr(cuda.cudart(), "capturing", None)
        if capture is not None:  # a graph freezes the shapes and addresses of its launch
            shapes, addresses = dict(self.shapes), dict(self.addresses)
            capture.append(lambda: self.compute(shapes, addresses))
        else:
            self.compute(self.shapes, self.addresses)
            self.eager = getattr(self, "eager", 0) + 1
        return True

    def is_stream_capturable(self, stream):
        return True

    def compute(self, shapes, addresses):
        shape = shapes["input_ids"]
        ids = array_at(addresses["input_ids"], shape, np.int64)
        mask = array_at(addresses["attention_mask"], shape, np.int64)
        array_at(addresses["sum"], shape[:1], np.float32)[:] = (ids * mask).sum(1)
        array_at(addresses["hidden"], shape + (HIDDEN,), np.float32)[:] = ids[..., None] + np.arange(HIDDEN)
        self.runs += 1


def contexts(kind):
    """A model's `new_context` making contexts of class `kind` (no runtime config, as TensorRT)."""
    return lambda: (kind(), None)


def expected(feeds):
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    return {"sum": (ids * mask).sum(1).astype(np.float32),
            "hidden": (ids[..., None] + np.arange(HIDDEN)).astype(np.float32)}


class CaptureRuntime(FakeRuntime):
    """cudart with stream capture: between Begin- and EndCapture the context's enqueues are recorded
    (with the shapes and addresses bound then, as a CUDA graph freezes them) instead of run;
    cudaGraphLaunch replays them."""

    cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)

    def __init__(self):
        super().__init__()
        self.capturing, self.launches, self.destroyed = None, 0, []

    def cudaStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cudaStreamEndCapture(self, stream):
        work, self.capturing = tuple(self.capturing), None
        return (0, work)

    def cudaGraphInstantiate(self, graph, flags):
        return (0, list(graph))

    def cudaGraphLaunch(self, graph_exec, stream):
        self.launches += 1
        for work in graph_exec:
            work()
        return (0,)

    def cudaGraphDestroy(self, graph):
        return (0,)

    def cudaGraphExecDestroy(self, graph_exec):
        self.destroyed.append(graph_exec)
        return (0,)


def simulated_model(monkeypatch, rt, options, graph_mode):
    """A TensorRTModel over the fake context, CUDA runtime and buffers above."""
    monkeypatch.setattr(cuda, "cudart", lambda: rt)
    monkeypatch.setattr(cuda, "memcpy_kind", lambda kind: kind)
    monkeypatch.setattr(cuda, "HostDeviceBuffer", Buffer)
    monkeypatch.setattr(cuda, "Stream", Handle)
    monkeypatch.setattr(cuda, "Event", Handle)
    m = object.__new__(engine_mod.TensorRTModel)
    engine_mod.Model.__init__(m)
    m.inputs = tuple(IOSpec(n, "int64", (-1, -1), token_axes((-1, -1)), (1, 1), (4, 8))
                     for n in ("input_ids", "attention_mask"))
    m.outputs = (IOSpec("hidden", "float32", (-1, -1, HIDDEN)), IOSpec("sum", "float32", (-1,)))
    m.options, m.path = options, types.SimpleNamespace(name="sim.engine")
    m._graphs_ok, m.graph_mode, m.gpu = True, graph_mode, types.SimpleNamespace(index=0)
    m.new_context = contexts(Context)
    m._check_feeds = engine_mod.FeedCheck(m.inputs)
    m._jit_cache = types.SimpleNamespace(save=lambda: None)
    m.pool = m._gate = slot_mod.SlotPool("sim.engine", [slot_mod.Slot(m)])
    m.rt = rt
    return m


class EncoderContext(Context):
    """An encoder "engine" with the inputs and outputs of all-MiniLM-L6-v2's engines:
    last_hidden_state[b, s, k] = input_ids[b, s] + token_type_ids[b, s] + k, sentence_embedding the
    attention_mask-weighted sum of it over s."""

    def get_tensor_shape(self, name):
        b, s = self.shapes["input_ids"]
        return (b, HIDDEN) if name == "sentence_embedding" else (b, s, HIDDEN)

    def compute(self, shapes, addresses):
        shape = shapes["input_ids"]
        ids, mask, types_ = (array_at(addresses[n], shape, np.int64) for n in ENCODER_INPUTS)
        hidden = (ids + types_)[..., None] + np.arange(HIDDEN)
        array_at(addresses["last_hidden_state"], shape + (HIDDEN,), np.float32)[:] = hidden
        array_at(addresses["sentence_embedding"], shape[:1] + (HIDDEN,), np.float32)[:] = (hidden * mask[..., None]).sum(1)
        self.runs += 1


ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def encoder_expected(feeds):
    ids, mask, types_ = (feeds[n] for n in ENCODER_INPUTS)
    hidden = ((ids + types_)[..., None] + np.arange(HIDDEN)).astype(np.float32)
    return {"last_hidden_state": hidden, "sentence_embedding": (hidden * mask[..., None]).sum(1)}


def simulated_encoder(monkeypatch, options=engine_mod.EngineOptions(), graph_mode="runtime", vocab=30522):
    """A TensorRTModel over EncoderContext as engine.py would describe an encoder engine: three int64
    [-1, -1] inputs (profile (1, 8)..(32, 256)) with token tables for input_ids (`vocab` ids) and
    token_type_ids (2), none for attention_mask; outputs with their token axes named."""
    m = simulated_model(monkeypatch, FakeRuntime(), options, graph_mode)
    m.pool.close()
    ranges = {"input_ids": (0, vocab), "attention_mask": None, "token_type_ids": (0, 2)}
    m.inputs = tuple(IOSpec(n, "int64", (-1, -1), token_axes((-1, -1)), (1, 8), (32, 256), id_range=ranges[n])
                     for n in ENCODER_INPUTS)
    m.outputs = tuple(IOSpec(n, "float32", shape, token_axes(shape))
                      for n, shape in (("last_hidden_state", (-1, -1, HIDDEN)), ("sentence_embedding", (-1, HIDDEN))))
    m.new_context = contexts(EncoderContext)
    m._check_feeds = engine_mod.FeedCheck(m.inputs)
    m.pool = m._gate = slot_mod.SlotPool("sim.engine", [slot_mod.Slot(m)])
    return m


@pytest.fixture(params=[True, False], ids=["timed", "untimed"])
def model(monkeypatch, request):
    """The flavor replays graphs itself (TensorRT-RTX): every call enqueues the engine."""
    return simulated_model(monkeypatch, FakeRuntime(), engine_mod.EngineOptions(time_gpu=request.param), "runtime")


@pytest.fixture(params=[True, False], ids=["timed", "untimed"])
def captured(monkeypatch, request):
    """Full TensorRT: the runtime captures one CUDA graph per input shape and replays it."""
    options = engine_mod.EngineOptions(time_gpu=request.param, max_graphs=2)
    m = simulated_model(monkeypatch, CaptureRuntime(), options, "capture")
    yield m
    m.close()  # frees the graphs while the fake runtime is in place


def feeds_of(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, 100, (batch, seq)), "attention_mask": rng.integers(0, 2, (batch, seq))}


def test_repeated_calls_take_the_plan_and_stay_right_across_shape_and_output_switches(model):
    """A -> A -> B -> A with changing values and output selections: every result is right, and from the
    second call of a shape on, the call runs from the slot's plan (one staging copy in, one copy out
    per returned output)."""
    slot = model.pool.slots[0]
    calls = [((2, 5), None), ((2, 5), None), ((2, 5), ["sum"]), ((4, 8), ["sum"]), ((2, 5), ["sum"]),
             ((4, 8), ["hidden", "sum"]), ((1, 1), ["sum"]), ((4, 8), ["sum"])]
    for i, ((b, s), outputs) in enumerate(calls):
        feeds = feeds_of(b, s, seed=i)
        model.rt.copies.clear()
        got = model.infer(feeds, outputs=outputs)
        want = expected(feeds)
        assert list(got) == (outputs or ["hidden", "sum"]), i
        for name, value in got.items():
            np.testing.assert_array_equal(value, want[name], err_msg=f"call {i} {name}")
        assert [k for k, _ in model.rt.copies] == ["HostToDevice"] + ["DeviceToHost"] * len(got), i
        assert model.last_gpu_ms == (0.25 if model.options.time_gpu else None)
    assert slot.context.runs == len(calls)
    assert {(plan.key[0], tuple(s.name for s in plan.selected)) for plan in slot._plans.values()} == {
        ((2, 5), ("hidden", "sum")), ((2, 5), ("sum",)), ((4, 8), ("sum",)), ((4, 8), ("hidden", "sum"))}


def test_results_are_the_callers_own_arrays(model):
    """Planned calls return fresh arrays: the next call, which reuses the pinned buffers, leaves them as they were."""
    first = model.infer(feeds_of(3, 4, seed=1), outputs=["sum"])["sum"].copy()
    kept = model.infer(feeds_of(3, 4, seed=1), outputs=["sum"])
    model.infer(feeds_of(3, 4, seed=2), outputs=["sum"])
    np.testing.assert_array_equal(kept["sum"], first)


def test_out_buffers_device_outputs_and_gpu_inputs_mix_with_planned_calls(model):
    """Calls that bind caller memory go the general way and rebind; the planned call after them
    finds every tensor back in the slot's own buffers."""
    slot = model.pool.slots[0]
    feeds = feeds_of(2, 6, seed=3)
    want = expected(feeds)
    model.infer(feeds)
    host_out = {"sum": np.zeros(4, np.float32)}
    np.testing.assert_array_equal(model.infer(feeds, outputs=["sum"], out=host_out)["sum"], want["sum"])
    np.testing.assert_array_equal(host_out["sum"][:2], want["sum"])

    dev = np.zeros(2, np.float32)  # "device" memory the engine writes directly
    dev_out = DeviceTensor(dev.ctypes.data, (2,), np.dtype(np.float32), 0, None, dev)
    model.infer(feeds, outputs=["sum"], out={"sum": dev_out})
    np.testing.assert_array_equal(dev, want["sum"])
    assert slot.foreign == {"sum"}

    again = feeds_of(2, 6, seed=4)
    got = model.infer(again, outputs=["sum"])  # bound back to its own buffer on the general path
    np.testing.assert_array_equal(got["sum"], expected(again)["sum"])
    assert not slot.foreign
    got = model.infer(again, outputs=["sum"])  # and planned again
    np.testing.assert_array_equal(got["sum"], expected(again)["sum"])

    held = model.infer(feeds, outputs=["sum"], device_outputs=True)["sum"]  # the slot's own buffer
    np.testing.assert_array_equal(array_at(held.ptr, held.shape, held.dtype), want["sum"])

    ids = feeds["input_ids"].copy()
    gpu_feeds = {"input_ids": DeviceTensor(ids.ctypes.data, ids.shape, ids.dtype, 0, None, ids),
                 "attention_mask": feeds["attention_mask"]}
    np.testing.assert_array_equal(model.infer(gpu_feeds, outputs=["sum"])["sum"], want["sum"])
    assert slot.foreign == {"input_ids"}
    np.testing.assert_array_equal(model.infer(again, outputs=["sum"])["sum"], expected(again)["sum"])
    assert not slot.foreign


def test_exactly_sized_host_out_arrays_take_the_plan_and_receive_the_outputs(model, monkeypatch):
    """A repeated call whose `out` arrays have the planned shape and dtype runs from the plan: one
    staging copy in, one copy back per returned output, written into the caller's arrays (which
    are what infer returns); other outputs come back as fresh arrays; a wrong dtype still gets the
    general check's error."""
    slot = model.pool.slots[0]
    feeds = feeds_of(3, 5, seed=7)
    model.infer(feeds, outputs=["sum", "hidden"])  # the shapes pass the full check once
    general = []
    start = model._start
    monkeypatch.setattr(model, "_start", lambda *a, **k: general.append(1) or start(*a, **k))
    for seed in (8, 9):
        feeds = feeds_of(3, 5, seed=seed)
        want = expected(feeds)
        mine = np.full(3, -1, np.float32)
        model.rt.copies.clear()
        runs = slot.context.runs
        got = model.infer(feeds, outputs=["sum", "hidden"], out={"sum": mine})
        assert got["sum"] is mine
        np.testing.assert_array_equal(mine, want["sum"])
        np.testing.assert_array_equal(got["hidden"], want["hidden"])
        assert [k for k, _ in model.rt.copies] == ["HostToDevice", "DeviceToHost", "DeviceToHost"]
        assert slot.context.runs == runs + 1
    assert not general  # no call took the general path
    with pytest.raises(engine_mod.InputError, match=r"out\[sum\] has dtype float64"):
        model.infer(feeds, outputs=["sum"], out={"sum": np.zeros(3, np.float64)})
    assert general
    np.testing.assert_array_equal(model.infer(feeds, outputs=["sum"])["sum"], expected(feeds)["sum"])


def test_bad_feeds_after_planned_calls_fail_and_leave_the_slot_usable(model):
    good = feeds_of(2, 3, seed=5)
    model.infer(good)
    model.infer(good)
    bad = {"input_ids": good["input_ids"].astype(np.int32), "attention_mask": good["attention_mask"]}
    with pytest.raises(engine_mod.InputError, match="input_ids has dtype int32"):
        model.infer(bad)
    with pytest.raises(engine_mod.InputError, match="outside the profile"):
        model.infer(feeds_of(5, 3, seed=6))
    np.testing.assert_array_equal(model.infer(good)["sum"], expected(good)["sum"])
    assert all(model.pool.is_free(s) for s in model.pool.slots)


def waits_for(fn, go, busy) -> None:
    """Calls `fn` in a thread while thread `busy` is held up until `go` is set: `fn` must still be
    waiting 0.2 s later, and both must finish once `go` is set."""
    import threading

    caller = threading.Thread(target=fn)
    caller.start()
    caller.join(0.2)
    assert caller.is_alive(), f"{fn.__qualname__} did not wait"
    go.set()
    busy.join(5)
    caller.join(5)
    assert not caller.is_alive() and not busy.is_alive()


def test_prepared_call_runs_on_its_own_context_with_one_copy_each_way(model):
    """prepare() adds a context outside the pool: runs give the right results with one staging copy in
    and one copy out per returned output, and plain calls keep using the pool meanwhile."""
    call = model.prepare({"input_ids": (3, 4), "attention_mask": (3, 4)}, outputs=["sum"])
    assert call.slot in model.pool.slots and not model.pool.is_free(call.slot) and len(model.pool.slots) == 2
    for seed in range(3):
        feeds = feeds_of(3, 4, seed=seed)
        model.rt.copies.clear()
        got = call.run(feeds)
        assert list(got) == ["sum"]
        np.testing.assert_array_equal(got["sum"], expected(feeds)["sum"])
        assert [k for k, _ in model.rt.copies] == ["HostToDevice", "DeviceToHost"]
        assert model.last_gpu_ms == (0.25 if model.options.time_gpu else None)
        other = feeds_of(2, 5, seed=10 + seed)
        np.testing.assert_array_equal(model.infer(other)["hidden"], expected(other)["hidden"])
    assert call.slot.context.runs == 3 and model.pool.slots[0].context.runs == 3
    direct = feeds_of(3, 4, seed=7)  # written straight into the staging places, run() with no feeds
    for name, value in direct.items():
        call.inputs[name][...] = value
    np.testing.assert_array_equal(call.run()["sum"], expected(direct)["sum"])


def test_prepared_call_refuses_other_feeds_without_touching_its_inputs(model):
    call = model.prepare({"input_ids": (2, 3), "attention_mask": (2, 3)})
    good = feeds_of(2, 3, seed=1)
    call.run(good)
    before = {n: v.copy() for n, v in call.inputs.items()}
    bad = {"input_ids": feeds_of(2, 3, seed=2)["input_ids"], "attention_mask": good["attention_mask"][:1]}
    with pytest.raises(engine_mod.InputError, match=r"attention_mask has shape \[1, 3\]; this call was prepared for \[2, 3\]"):
        call.run(bad)
    for name, value in before.items():  # input_ids was fine but is not copied either
        np.testing.assert_array_equal(call.inputs[name], value)
    with pytest.raises(engine_mod.InputError, match="outside the profile"):
        model.prepare({"input_ids": (5, 3), "attention_mask": (5, 3)})
    assert len(model.pool.slots) == 2  # the refused prepare made no context


def test_prepared_call_close_and_model_close_free_its_context_once(model):
    first = model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)}, outputs="sum")
    second = model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)}, outputs="sum")
    first.close()
    first.close()
    assert first.slot not in model.pool.slots and first.slot.context is None
    with pytest.raises(engine_mod.InputError, match="this prepared call is closed"):
        first.run(feeds_of(1, 2, seed=0))
    model.close()
    assert second.slot.context is None  # the model's close() freed it with its own
    with pytest.raises(engine_mod.InputError, match="is closed"):
        second.run(feeds_of(1, 2, seed=0))
    second.close()
    with pytest.raises(engine_mod.InputError, match="is closed"):
        model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)})
    for call in (first, second):  # each buffer freed exactly once
        assert [b.closes for b in (call.slot.staging, *call.slot.outputs.values())] == [1, 1, 1]


def test_a_dropped_prepared_call_frees_its_context(model):
    import gc

    call = model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)}, outputs="sum")
    slot = call.slot
    first = call.run(feeds_of(1, 2, seed=0))
    first.pop("sum")  # the caller's own dict: the next run is not affected
    assert list(call.run(feeds_of(1, 2, seed=1))) == ["sum"]
    del call
    gc.collect()
    assert slot not in model.pool.slots and slot.context is None and slot.staging.closes == 1


def test_prepare_and_close_from_two_threads_never_leave_a_half_made_context(model):
    """close() while prepare() makes its context waits for it (then frees it with the others), and a
    prepare() that fails after making its context frees it."""
    import threading

    made, go = threading.Event(), threading.Event()

    class SlowContext(Context):
        def __init__(self):
            super().__init__()
            made.set()
            go.wait(5)

    model.new_context = contexts(SlowContext)
    prepared = []
    maker = threading.Thread(target=lambda: prepared.append(model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)})))
    maker.start()
    assert made.wait(5)
    waits_for(model.close, go, maker)  # close() waits for the prepare inside
    assert prepared[0].slot.context is None and not model.pool.slots
    with pytest.raises(engine_mod.InputError, match="is closed"):
        prepared[0].run(feeds_of(1, 2, seed=0))


def test_a_prepare_that_fails_after_making_its_context_frees_it(model, monkeypatch):
    class PickyContext(Context):  # takes the profile's max shapes (buffers are sized with them), not (1, 2)
        def set_input_shape(self, name, shape):
            return tuple(shape) != (1, 2) and super().set_input_shape(name, shape)

    closed, close = [], slot_mod.Slot.close
    monkeypatch.setattr(slot_mod.Slot, "close", lambda slot: (closed.append(slot), close(slot)))
    model.new_context = contexts(PickyContext)
    before = list(model.pool.slots)
    with pytest.raises(engine_mod.InputError, match="TensorRT rejected shape"):
        model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)})
    assert model.pool.slots == before and model.pool.inside == 0
    assert len(closed) == 1 and isinstance(closed[0].staging, Buffer) and closed[0].staging.closes == 1


def test_prepared_call_runs_one_thread_at_a_time(model):
    """A second thread's run() while one is inside fails at once, and close() waits for the run."""
    import threading

    inside, go = threading.Event(), threading.Event()

    class SlowContext(Context):
        def execute_async_v3(self, stream):
            inside.set()
            go.wait(5)
            return super().execute_async_v3(stream)

    model.new_context = contexts(SlowContext)  # the prepared call's own context
    call = model.prepare({"input_ids": (1, 2), "attention_mask": (1, 2)}, outputs="sum")
    feeds = feeds_of(1, 2, seed=3)
    results = []
    worker = threading.Thread(target=lambda: results.append(call.run(feeds)["sum"].copy()))
    worker.start()
    assert inside.wait(5)
    with pytest.raises(engine_mod.InputError, match="running in another thread"):
        call.run(feeds)
    waits_for(call.close, go, worker)  # close() waits for the run inside
    np.testing.assert_array_equal(results[0], expected(feeds)["sum"])
    assert call.closed and call.slot not in model.pool.slots


class AllocRuntime:
    """cudart's allocators over ordinary memory, recording what is freed."""

    def __init__(self):
        self.blocks, self.freed = {}, []

    def _alloc(self, size):
        block = ctypes.create_string_buffer(size)
        self.blocks[ctypes.addressof(block)] = block
        return (0, ctypes.addressof(block))

    cudaMallocHost = cudaMalloc = _alloc

    def cudaFreeHost(self, ptr):
        self.freed.append(("host", ptr))
        return (0,)

    def cudaFree(self, ptr):
        self.freed.append(("device", ptr))
        return (0,)


def test_pinned_memory_outlives_close_while_a_view_of_it_is_held(monkeypatch):
    """close() frees the device side at once; the pinned host side goes with the last numpy view,
    so a result array handed out is never left over freed memory."""
    import gc

    rt = AllocRuntime()
    monkeypatch.setattr(cuda, "cudart", lambda: rt)
    buf = cuda.HostDeviceBuffer(64)
    kept = buf.host_view((8,), np.float32)
    kept[:] = np.arange(8)
    buf.close()
    assert rt.freed == [("device", buf.device_ptr)]
    with pytest.raises(cuda.CudaError, match="closed"):
        buf.host_view((8,), np.float32)
    np.testing.assert_array_equal(kept, np.arange(8))
    del kept
    gc.collect()
    assert rt.freed == [("device", buf.device_ptr), ("host", buf.host_ptr)]
    unused = cuda.HostDeviceBuffer(16)
    unused.close()
    assert set(rt.freed[-2:]) == {("device", unused.device_ptr), ("host", unused.host_ptr)}  # no view: both at close


def test_a_failed_prepared_run_raises_the_engines_reason_and_the_call_stays_usable(model):
    fail = [True]

    class FlakyContext(Context):
        def execute_async_v3(self, stream):
            if fail.pop():
                return False
            return super().execute_async_v3(stream)

    model.new_context = contexts(FlakyContext)
    model._logger = types.SimpleNamespace(errors=["IExecutionContext::enqueueV3: out of memory"])
    call = model.prepare({"input_ids": (2, 2), "attention_mask": (2, 2)}, outputs=["sum"])
    feeds = feeds_of(2, 2, seed=4)
    with pytest.raises(engine_mod.TrtSeerError, match="TensorRT failed to run sim.engine: IExecutionContext"):
        call.run(feeds)
    fail.append(False)
    np.testing.assert_array_equal(call.run(feeds)["sum"], expected(feeds)["sum"])
    assert model.pool.inside == 0


def test_big_endian_feeds_reach_the_engine_as_numbers(model):
    feeds = feeds_of(2, 3, seed=8)
    swapped = {name: value.astype(value.dtype.newbyteorder(">")) for name, value in feeds.items()}
    for _ in range(2):  # the second call of these shapes may take the remembered path
        np.testing.assert_array_equal(model.infer(swapped)["sum"], expected(feeds)["sum"])
    call = model.prepare({"input_ids": (2, 3), "attention_mask": (2, 3)}, outputs="sum")
    np.testing.assert_array_equal(call.run(swapped)["sum"], expected(feeds)["sum"])


def test_capture_mode_replays_one_graph_per_shape_once_the_context_is_in_its_state(captured):
    """graph_mode "capture": the first call of a shape runs eagerly and captures it; later calls of
    that shape replay the graph (the new inputs staged where the graph reads them); after a shape
    switch, one eager enqueue comes before a replay; calls binding caller memory never replay; the
    least recently used graph goes past max_graphs."""
    slot, rt = captured.pool.slots[0], captured.rt
    runs = [((2, 5), None, 1, 0), ((2, 5), None, 0, 1), ((2, 5), ["sum"], 0, 1),  # (shape, outputs, eager, replays)
            ((3, 4), ["sum"], 1, 0), ((3, 4), None, 0, 1), ((2, 5), ["sum"], 1, 0), ((2, 5), ["hidden"], 0, 1)]
    for i, ((b, s), outputs, eager, replays) in enumerate(runs):
        before = (getattr(slot.context, "eager", 0), rt.launches)
        feeds = feeds_of(b, s, seed=20 + i)
        got = captured.infer(feeds, outputs=outputs)
        for name, value in got.items():
            np.testing.assert_array_equal(value, expected(feeds)[name], err_msg=f"call {i} {name}")
        assert (slot.context.eager - before[0], rt.launches - before[1]) == (eager, replays), i
    assert set(slot.graphs) == {((2, 5),) * 2, ((3, 4),) * 2} and not rt.destroyed

    feeds = feeds_of(2, 5, seed=40)
    dev = np.zeros(2, np.float32)
    launches = rt.launches
    captured.infer(feeds, outputs=["sum"], out={"sum": DeviceTensor(dev.ctypes.data, (2,), np.dtype(np.float32), 0, None, dev)})
    np.testing.assert_array_equal(dev, expected(feeds)["sum"])
    assert rt.launches == launches  # bound to caller memory: eager, the graph's addresses are not these
    for _ in range(2):  # back in its own buffers: one eager enqueue, then replays again
        np.testing.assert_array_equal(captured.infer(feeds, outputs=["sum"])["sum"], expected(feeds)["sum"])
    assert rt.launches == launches + 1

    captured.infer(feeds_of(1, 1, seed=41))  # a third shape: the least recently used graph goes
    assert set(slot.graphs) == {((2, 5),) * 2, ((1, 1),) * 2} and len(rt.destroyed) == 1


def test_capture_mode_async_calls_and_prepared_calls_replay_too(captured):
    """infer_async and a prepared call take the same capture path and give the right results."""
    for seed in range(3):
        feeds = feeds_of(3, 2, seed=50 + seed)
        np.testing.assert_array_equal(captured.infer_async(feeds).result()["hidden"], expected(feeds)["hidden"])
    call = captured.prepare({"input_ids": (2, 2), "attention_mask": (2, 2)}, outputs=["sum"])
    launches = captured.rt.launches
    for seed in range(3):
        feeds = feeds_of(2, 2, seed=60 + seed)
        np.testing.assert_array_equal(call.run(feeds)["sum"], expected(feeds)["sum"])
    assert captured.rt.launches == launches + 2 and call.slot.context.eager == 1


def test_encoder_engine_prepared_calls_match_infer(monkeypatch):
    """The encoder-shaped engine the C ABI's TensorRT tests use (test_capi_service.py): infer and a
    prepared call (each on a context of its own) give the expected outputs; a token_type_ids value
    outside its table is refused."""
    m = simulated_encoder(monkeypatch)
    ids = np.arange(16, dtype=np.int64).reshape(2, 8) % 50 + 5
    feeds = dict(zip(ENCODER_INPUTS, (ids, np.ones_like(ids), np.zeros_like(ids))))
    want = encoder_expected(feeds)
    got = m.infer(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    call = m.prepare({n: (2, 8) for n in ENCODER_INPUTS}, outputs=["sentence_embedding"])
    np.testing.assert_array_equal(call.run(feeds)["sentence_embedding"], want["sentence_embedding"])
    assert len(m.pool.slots) == 2
    with pytest.raises(engine_mod.InputError, match="token_type_ids"):
        m.infer({**feeds, "token_type_ids": np.full_like(ids, 2)})
    call.close()
    m.close()
