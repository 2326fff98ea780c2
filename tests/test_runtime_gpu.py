"""The runtime on a GPU: the CUDA layer (pinned buffers, async copies, stream ordering, graphs,
error names), then real engines built from a tiny BERT: outputs against ONNX Runtime and PyTorch,
manifest checks before deserializing, zero-copy from torch, CUDA graphs, threads, the runtime
cache and memory stability. Skips with the reason when cuda-python, a GPU, TensorRT or torch is
missing."""
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from test_runtime import close_while_threads_call

from trt_seer.engine import manifest
from trt_seer.engine import trt
from trt_seer.errors import CudaError, DependencyError, InputError, ManifestMismatchError
from trt_seer.runtime import cuda, load, tensorrt_unavailable_reason
from trt_seer.runtime.engine import TensorRTModel

pytestmark = pytest.mark.gpu
CUDA_REASON = cuda.gpu_unavailable_reason()
TRT_REASON = tensorrt_unavailable_reason()  # None: engines run here
needs_cuda = pytest.mark.skipif(CUDA_REASON is not None, reason=f"no usable CUDA: {CUDA_REASON}")
needs_trt = pytest.mark.skipif(TRT_REASON is not None, reason=f"no TensorRT that runs on this GPU: {TRT_REASON}")
# A GPU and an importable TensorRT flavor, whether or not that flavor runs on this GPU.
needs_gpu_and_trt_import = pytest.mark.skipif(CUDA_REASON is not None or not trt.available(),
                                              reason=f"needs a GPU and TensorRT: {CUDA_REASON or 'no TensorRT'}")
MiB = 1 << 20


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


# --- the CUDA layer ------------------------------------------------------------------------------

@needs_cuda
def test_pinned_buffer_round_trip_and_memory_kinds():
    rt = cuda.cudart()
    with cuda.Stream() as s, cuda.HostDeviceBuffer(4 * MiB) as buf:
        data = np.random.default_rng(0).standard_normal(MiB).astype(np.float32)
        buf.host_view((MiB,), np.float32)[:] = data
        buf.h2d_async(s)
        buf.host_view((MiB,), np.float32)[:] = 0
        buf.d2h_async(s)
        s.synchronize()
        np.testing.assert_array_equal(buf.host_view((MiB,), np.float32), data)
        host = cuda.cuda_call(rt.cudaPointerGetAttributes(buf.host_ptr))
        assert host.type == rt.cudaMemoryType.cudaMemoryTypeHost  # page-locked, not pageable
        assert cuda.pointer_device(buf.device_ptr) == 0
    assert buf.closed
    buf.close()  # idempotent
    with pytest.raises(CudaError):
        buf.host_view((1,), np.float32)


@needs_cuda
def test_cuda_errors_carry_the_cuda_error_name():
    with pytest.raises(CudaError, match="cudaErrorMemoryAllocation") as e:
        cuda.HostDeviceBuffer(1 << 55)
    assert e.value.name in ("cudaErrorMemoryAllocation",)
    with cuda.HostDeviceBuffer(16) as buf:  # the failed allocation left no sticky error
        assert buf.nbytes == 16


@needs_cuda
def test_streams_order_through_events_and_time_copies():
    n = 64 * MiB
    src, dst = cuda.HostDeviceBuffer(n), cuda.HostDeviceBuffer(n)
    s1, s2 = cuda.Stream(), cuda.Stream()
    start, copied = cuda.Event(), cuda.Event()
    src.host_view((n,), np.uint8)[:] = 7
    start.record(s1)
    src.h2d_async(s1)
    copied.record(s1)
    s2.wait(copied)  # without this the device-to-device copy could read stale memory
    cuda.copy_async(dst.device_ptr, src.device_ptr, n, "DeviceToDevice", s2)
    dst.d2h_async(s2)
    s2.synchronize()
    assert copied.query() and (dst.host_view((n,), np.uint8) == 7).all()
    ms = copied.elapsed_ms(start)
    assert 0 < ms < 1000, ms
    for owned in (src, dst, s1, s2, start, copied):
        owned.close()


@needs_cuda
def test_graph_capture_and_replay():
    n = MiB
    with cuda.Stream() as s, cuda.HostDeviceBuffer(n) as a, cuda.HostDeviceBuffer(n) as b:
        graph = cuda.CudaGraph.capture(s, lambda: cuda.copy_async(b.device_ptr, a.device_ptr, n, "DeviceToDevice", s))
        for value in (3, 9):  # replays read whatever a holds at launch time
            a.host_view((n,), np.uint8)[:] = value
            a.h2d_async(s)
            graph.launch(s)
            b.d2h_async(s)
            s.synchronize()
            assert (b.host_view((n,), np.uint8) == value).all()
        graph.close()

        def fail():
            raise ValueError("inside capture")

        with pytest.raises(ValueError, match="inside capture"):
            cuda.CudaGraph.capture(s, fail)
        s.synchronize()  # the aborted capture left the stream usable
        cuda.CudaGraph.capture(s, lambda: None).close()


# --- engines -------------------------------------------------------------------------------------

PROFILE = {"batch": (1, 4, 8), "seq": (4, 16, 32)}
SHAPES = [(1, 4), (3, 17), (8, 32)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """FP32 and FP16 engines of a tiny BERT, built by the real `build` command (no GPU needed)."""
    if not trt.available():
        pytest.skip("no TensorRT flavor importable")
    from tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("gpu")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", root / "tinybert")
    out = root / "engines"
    cmd = [sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp32", "--fp16",
           "--batch", ",".join(map(str, PROFILE["batch"])), "--seq", ",".join(map(str, PROFILE["seq"])),
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return ckpt, out


def feeds_for(ckpt, batch, seq, seed=0):
    from trt_seer.export.checkpoint import sample_inputs
    from trt_seer.export.families import resolve_model

    return sample_inputs(resolve_model(ckpt), batch, seq, seed=seed)


def assert_close(got, want, rtol, what):
    scale = max(float(np.max(np.abs(want))), 1e-6)
    delta = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    assert delta <= rtol * scale, f"{what}: max |Δ| {delta:.3g} > {rtol * scale:.3g}"


@needs_trt
@pytest.mark.parametrize("precision,rtol", [("fp32", 2e-3), ("fp16", 2e-2)])
def test_engine_matches_onnxruntime_and_pytorch(engines, precision, rtol):
    from trt_seer.export.checkpoint import load_model, torch_outputs, wrap
    from trt_seer.export.families import resolve_model

    ckpt, out = engines
    info = resolve_model(ckpt)
    wrapped = wrap(load_model(info), info)
    with load(out / f"tinybert.{precision}.engine", backend="tensorrt", time_gpu=True) as m, \
            load(out / f"tinybert.{precision}.onnx") as ref:
        assert m.backend == "tensorrt" and m.inputs[0].max_shape == (8, 32)
        for i, (b, s) in enumerate(SHAPES):
            feeds = feeds_for(ckpt, b, s, seed=i)
            got, want = m.infer(feeds), ref.infer(feeds)
            torch_ref = dict(zip(info.outputs, torch_outputs(wrapped, feeds)))
            assert set(got) == set(want) == {"last_hidden_state", "sentence_embedding"}
            for name in got:
                assert got[name].shape == want[name].shape == torch_ref[name].shape
                assert_close(got[name], want[name], rtol, f"{precision} {name} vs ONNX Runtime at {b}x{s}")
                assert_close(got[name], torch_ref[name], rtol, f"{precision} {name} vs PyTorch at {b}x{s}")
            assert m.last_gpu_ms is not None and m.last_gpu_ms > 0


def copy_engine(engines, tmp_path, precision="fp32", edit=None, blob=None):
    _, out = engines
    src = out / f"tinybert.{precision}.engine"
    dst = tmp_path / src.name
    data = manifest.read(manifest.engine_manifest_path(src))
    if edit:
        edit(data)
    if blob is not None:
        dst.write_bytes(blob)
        data["engine"]["size_bytes"] = len(blob)
    else:
        shutil.copy(src, dst)
    manifest.write(manifest.engine_manifest_path(dst), data)
    return dst


GARBAGE = b"\0" * 1024  # deserializing this would fail with another error


@needs_gpu_and_trt_import
def test_version_mismatch_is_raised_before_deserializing(engines, tmp_path):
    def old_version(d):
        d["tensorrt"]["version"] = "0.9.0.1"

    with pytest.raises(ManifestMismatchError, match=r"built with \S+ 0\.9\.0\.1; this runtime has"):
        TensorRTModel(copy_engine(engines, tmp_path, edit=old_version, blob=GARBAGE))


@needs_gpu_and_trt_import
@pytest.mark.skipif(TRT_REASON is None, reason="the installed TensorRT runs on this GPU")
def test_gpu_the_runtime_cannot_drive_is_refused_with_its_reason(engines, tmp_path):
    """E.g. TensorRT-RTX on a data-center Hopper: a clear error, and `auto` falls back to ONNX."""
    gpu = cuda.device_info(0)
    with pytest.raises(ManifestMismatchError, match=rf"could not load .* on {gpu.name} \(compute capability "
                                                    rf"{gpu.major}\.{gpu.minor}\)"):
        TensorRTModel(copy_engine(engines, tmp_path, blob=GARBAGE))
    ckpt, out = engines
    with pytest.raises(DependencyError, match=rf"cannot run tinybert.fp16.engine on TensorRT: .*does not run on "
                                              rf"{gpu.name}"):
        load(out / "tinybert.fp16.engine", backend="tensorrt")
    with pytest.warns(RuntimeWarning, match="instead of tinybert.fp16.engine: .*does not run on"):
        m = load(out / "tinybert.fp16.engine")
    with m:
        assert m.backend == "onnxruntime"
        assert m.infer(feeds_for(ckpt, 2, 8))["sentence_embedding"].shape == (2, 32)


@needs_trt
def test_target_mismatch_is_raised_before_deserializing(engines, tmp_path):
    def other_gpu(d):
        d["targets"] = {"mode": "listed", "compute_capabilities": ["5.0"]}

    gpu = cuda.device_info(0)
    cc = f"{gpu.major}.{gpu.minor}"
    with pytest.raises(ManifestMismatchError, match=rf"targets compute capability 5\.0; .* is {cc}"):
        TensorRTModel(copy_engine(engines, tmp_path, edit=other_gpu, blob=GARBAGE))
    with pytest.raises(InputError, match="could not load"):
        TensorRTModel(copy_engine(engines, tmp_path, blob=GARBAGE))


@needs_trt
def test_inputs_are_validated_before_the_gpu(engines):
    ckpt, out = engines
    with load(out / "tinybert.fp16.engine", backend="tensorrt") as m:
        with pytest.raises(InputError, match=r"outside the profile \[1, 4\]\.\.\[8, 32\]"):
            m.infer(feeds_for(ckpt, 9, 16))
        with pytest.raises(InputError, match="has dtype int32"):
            m.infer({k: v.astype(np.int32) for k, v in feeds_for(ckpt, 2, 8).items()})
        assert m.infer(feeds_for(ckpt, 2, 8))["sentence_embedding"].shape == (2, 32)  # the slot was released


@needs_trt
def test_zero_copy_from_torch_cuda_tensors(engines, torch_cuda):
    torch = torch_cuda
    ckpt, out = engines
    feeds = feeds_for(ckpt, 4, 16, seed=3)
    with load(out / "tinybert.fp32.engine", backend="tensorrt") as m:
        ref = m.infer(feeds)
        on_gpu = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        got = m.infer(on_gpu)
        slot = m.pool.slots[0]
        assert slot.addresses["input_ids"] == on_gpu["input_ids"].data_ptr()  # bound, not copied
        np.testing.assert_array_equal(got["sentence_embedding"], ref["sentence_embedding"])
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # producer still busy when infer is called
            torch.cuda._sleep(200_000_000)
            late = {k: torch.zeros_like(v).copy_(v) for k, v in on_gpu.items()}
            got = m.infer(late)
        np.testing.assert_array_equal(got["sentence_embedding"], ref["sentence_embedding"])
        with pytest.raises(InputError, match="strided GPU view|contiguous"):
            m.infer({k: v.t().contiguous().t() for k, v in on_gpu.items()})


@needs_trt
def test_cuda_graphs_replay_per_shape_bucket(engines):
    ckpt, out = engines
    path = out / "tinybert.fp16.engine"
    with load(path, backend="tensorrt", use_cuda_graph=True) as g, \
            load(path, backend="tensorrt", use_cuda_graph=False) as e:
        for seed in range(4):  # same shape, new values: the graph reads the staged inputs
            feeds = feeds_for(ckpt, 2, 16, seed=seed)
            assert_close(g.infer(feeds)["sentence_embedding"], e.infer(feeds)["sentence_embedding"], 2e-3,
                         f"graph replay {seed}")
        slot = g.pool.slots[0]
        assert g._graphs_ok, "capture failed"
        feeds = feeds_for(ckpt, 3, 9, seed=9)
        g.infer(feeds)
        assert_close(g.infer(feeds)["last_hidden_state"], e.infer(feeds)["last_hidden_state"], 2e-3, "3x9")
        if g.graph_mode == "runtime":  # TensorRT-RTX captures and replays per shape itself
            assert not slot.graphs
        else:
            assert list(slot.graphs) == [((2, 16), (2, 16), (2, 16)), ((3, 9), (3, 9), (3, 9))]


@needs_trt
def test_cuda_graphs_are_on_by_default_and_right_across_shape_switches(engines):
    """A -> B -> A: the third call sets A's shapes again and must enqueue before any replay; every
    call (new values each time) matches a run without graphs."""
    ckpt, out = engines
    path = out / "tinybert.fp16.engine"
    with load(path, backend="tensorrt") as g, load(path, backend="tensorrt", use_cuda_graph=False) as e:
        assert g.graph_mode in ("capture", "runtime") and e.graph_mode is None
        for i, (b, s) in enumerate([(2, 16), (2, 16), (5, 9), (2, 16), (2, 16), (5, 9), (5, 9), (2, 16)]):
            feeds = feeds_for(ckpt, b, s, seed=10 + i)
            got, want = g.infer(feeds), e.infer(feeds)
            for name in want:
                assert_close(got[name], want[name], 2e-3, f"call {i} ({b}x{s}) {name}")
        assert g._graphs_ok, "capture failed"
        if g.graph_mode == "capture":
            assert set(g.pool.slots[0].graphs) == {((2, 16),) * 3, ((5, 9),) * 3}


@needs_trt
def test_untimed_calls_return_the_same_and_leave_no_gpu_time(engines):
    """time_gpu=False (the default) drops the events around the engine; the same feeds (staged in one copy, then
    the remembered-shape path on the second call) give the same outputs."""
    ckpt, out = engines
    path = out / "tinybert.fp16.engine"
    with load(path, backend="tensorrt", time_gpu=True) as timed, load(path, backend="tensorrt") as fast:
        for i, (b, s) in enumerate([(3, 12), (3, 12), (1, 32)]):
            feeds = feeds_for(ckpt, b, s, seed=40 + i)
            want, got = timed.infer(feeds), fast.infer(feeds, outputs=["sentence_embedding"])
            assert list(got) == ["sentence_embedding"]
            assert_close(got["sentence_embedding"], want["sentence_embedding"], 2e-3, f"call {i} ({b}x{s})")
            assert timed.last_gpu_ms > 0 and fast.last_gpu_ms is None


@needs_trt
@pytest.mark.parametrize("timed", [True, False], ids=["timed", "untimed"])
def test_prepared_calls_match_infer_on_their_own_context(engines, timed):
    """Two prepared calls of different shapes, run alternately with new values (each on its own
    context, graphs warm; untimed, the engine is enqueued straight on the context), match infer;
    closing one leaves the other running; closing the model frees the rest, a result read after it
    is intact and later runs fail with the reason."""
    ckpt, out = engines
    path = out / "tinybert.fp16.engine"
    with load(path, backend="tensorrt", time_gpu=timed) as m:
        names = m.input_names
        small = m.prepare({n: (2, 16) for n in names}, outputs=["sentence_embedding"])
        for i in range(2):  # warm: the pool's context and this call's, graphs captured
            small.run(feeds_for(ckpt, 2, 16, seed=i)), m.infer(feeds_for(ckpt, 2, 16, seed=i))
        large = m.prepare({n: (5, 9) for n in names})
        for i in range(6):
            call, (b, s) = (small, (2, 16)) if i % 2 == 0 else (large, (5, 9))
            feeds = feeds_for(ckpt, b, s, seed=60 + i)
            got, want = call.run(feeds), m.infer(feeds)
            assert list(got) == ([o.name for o in call.selected])
            for name, value in got.items():
                assert_close(value, want[name], 2e-3, f"run {i} ({b}x{s}) {name}")
            assert (m.last_gpu_ms > 0) if timed else (m.last_gpu_ms is None)
        large.close()
        feeds = feeds_for(ckpt, 2, 16, seed=70)
        assert_close(small.run(feeds)["sentence_embedding"], m.infer(feeds)["sentence_embedding"], 2e-3, "after close")
        assert large.slot.context is None and large.slot not in m.pool.slots
        kept, want = small.run(feeds)["sentence_embedding"], m.infer(feeds)["sentence_embedding"]
    assert_close(kept, want, 2e-3, "a result read after the model closed")  # its pinned memory is still held
    with pytest.raises(InputError, match="is closed"):
        small.run(feeds)


@needs_trt
def test_outputs_selection_copies_back_only_what_is_named(engines):
    ckpt, out = engines
    feeds = feeds_for(ckpt, 4, 16, seed=21)
    with load(out / "tinybert.fp32.engine", backend="tensorrt") as m:
        full = m.infer(feeds)
        only = m.infer(feeds, outputs=["sentence_embedding"])
        assert list(only) == ["sentence_embedding"]
        np.testing.assert_array_equal(only["sentence_embedding"], full["sentence_embedding"])
        with pytest.raises(InputError, match=r"unknown output\(s\) logits"):
            m.infer(feeds, outputs=["logits"])
        host = np.empty((8, 32), np.float32)  # max batch; this call fills the first 4 rows
        got = m.infer(feeds, outputs=["sentence_embedding"], out={"sentence_embedding": host})
        assert np.shares_memory(got["sentence_embedding"], host)
        np.testing.assert_array_equal(host[:4], full["sentence_embedding"])
        with pytest.raises(InputError, match=r"out\[sentence_embedding\] has dtype float16"):
            m.infer(feeds, out={"sentence_embedding": np.empty((4, 32), np.float16)})


@needs_trt
def test_device_outputs_are_the_runtimes_own_buffers(engines, torch_cuda):
    torch = torch_cuda
    ckpt, out = engines
    feeds = feeds_for(ckpt, 3, 12, seed=22)
    with load(out / "tinybert.fp32.engine", backend="tensorrt") as m:
        ref = m.infer(feeds)
        dev = m.infer(feeds, outputs=["sentence_embedding"], device_outputs=True)["sentence_embedding"]
        cai = dev.__cuda_array_interface__
        assert cai["shape"] == (3, 32) and cai["typestr"] == "<f4"
        assert cai["data"][0] == m.pool.slots[0].outputs["sentence_embedding"].device_ptr  # no copy
        t = torch.as_tensor(dev, device="cuda")
        np.testing.assert_array_equal(t.cpu().numpy(), ref["sentence_embedding"])
        back = m.infer({k: torch.from_numpy(v).cuda() for k, v in feeds.items()}, device_outputs=True)
        np.testing.assert_array_equal(torch.as_tensor(back["last_hidden_state"], device="cuda").cpu().numpy(),
                                      ref["last_hidden_state"])


@needs_trt
@pytest.mark.parametrize("graphs", [False, True])
def test_caller_device_buffers_are_written_directly(engines, torch_cuda, graphs):
    torch = torch_cuda
    ckpt, out = engines
    with load(out / "tinybert.fp32.engine", backend="tensorrt", use_cuda_graph=graphs) as m:
        emb = torch.full((8, 32), -1.0, device="cuda")
        for seed, (b, s) in enumerate([(4, 16), (4, 16), (2, 8), (4, 16)]):
            feeds = feeds_for(ckpt, b, s, seed=30 + seed)
            want = m.infer(feeds)["sentence_embedding"]  # own buffers (graph replay when on)
            got = m.infer(feeds, outputs=["sentence_embedding"], out={"sentence_embedding": emb})
            assert m.pool.slots[0].addresses["sentence_embedding"] == emb.data_ptr()  # bound, not copied
            assert tuple(got["sentence_embedding"].shape) == (b, 32)
            np.testing.assert_array_equal(emb[:b].cpu().numpy(), want)
            emb.fill_(-1.0)
        with pytest.raises(InputError, match=r"out\[sentence_embedding\] has shape \[2, 32\]"):
            m.infer(feeds_for(ckpt, 4, 16), out={"sentence_embedding": torch.empty((2, 32), device="cuda")})


@needs_trt
def test_close_while_threads_call_the_engine(engines):
    ckpt, out = engines
    feeds = feeds_for(ckpt, 8, 32, seed=40)
    m = load(out / "tinybert.fp32.engine", backend="tensorrt", contexts=2)
    want = m.infer(feeds)["sentence_embedding"]
    finished, refused = close_while_threads_call(
        m, lambda: bool(np.array_equal(m.infer(feeds, outputs=["sentence_embedding"])["sentence_embedding"], want)),
        5, 50, 120)
    assert len(refused) == 5 and all(finished)
    with pytest.raises(InputError, match="is closed"):
        m.infer_async(feeds)
    m2 = load(out / "tinybert.fp32.engine", backend="tensorrt")
    pending = m2.infer_async(feeds)
    m2.close()  # waits for the GPU; the unread result is refused, not read from freed memory
    with pytest.raises(InputError, match="was closed before this call's result was read"):
        pending.result()


@needs_trt
def test_concurrent_threads_on_several_contexts(engines):
    ckpt, out = engines
    path = out / "tinybert.fp32.engine"
    jobs = [feeds_for(ckpt, 1 + i % 8, 4 + i % 29, seed=i) for i in range(48)]
    with load(path, backend="tensorrt") as single:
        expected = [single.infer(f)["sentence_embedding"] for f in jobs]
    results, errors = {}, []
    with load(path, backend="tensorrt", contexts=3) as m:
        def worker(k):
            try:
                for i in range(k, len(jobs), 6):
                    results[i] = m.infer(jobs[i])["sentence_embedding"]
            except Exception as e:  # collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors and len(results) == len(jobs)
    for i, want in enumerate(expected):
        np.testing.assert_allclose(results[i], want, rtol=1e-5, atol=1e-6)


@needs_trt
def test_infer_async_on_a_callers_stream_and_dropped_pendings(engines):
    ckpt, out = engines
    feeds = feeds_for(ckpt, 2, 8, seed=5)
    with load(out / "tinybert.fp32.engine", backend="tensorrt") as m, cuda.Stream() as s:
        ref = m.infer(feeds)
        pending = m.infer_async(feeds, stream=s)
        np.testing.assert_array_equal(pending.result()["sentence_embedding"], ref["sentence_embedding"])
        assert pending.done()
        m.infer_async(feeds)  # dropped without result(): its context must come back
        done = threading.Event()
        threading.Thread(target=lambda: (m.infer(feeds), done.set()), daemon=True).start()
        assert done.wait(60), "the dropped call kept the only execution context"


@needs_trt
def test_runtime_cache_is_written_beside_the_engine_and_reused(engines, tmp_path):
    from trt_seer.engine import trt

    if not trt.load().has_runtime_cache:
        pytest.skip(f"{trt.load().name} has no runtime cache")
    ckpt, _ = engines
    path = copy_engine(engines, tmp_path, "fp16")
    feeds = feeds_for(ckpt, 2, 16)
    with load(path, backend="tensorrt") as m:
        m.infer(feeds)
    cache = tmp_path / "tinybert.fp16.runtime.cache"
    assert cache.is_file() and cache.stat().st_size > 0
    with load(path, backend="tensorrt") as m:
        assert m._jit_cache._blob == cache.read_bytes()  # deserialized and accepted
        m.infer(feeds)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@needs_trt
@pytest.mark.slow
def test_no_memory_growth_over_10k_calls(engines):
    ckpt, out = engines
    feeds = feeds_for(ckpt, 4, 16)
    with load(out / "tinybert.fp16.engine", backend="tensorrt") as m:
        for _ in range(300):
            m.infer(feeds)
        free0, rss0 = cuda.mem_info()[0], rss_bytes()
        for _ in range(10_000):
            m.infer(feeds)
        free1, rss1 = cuda.mem_info()[0], rss_bytes()
    assert free0 - free1 <= 2 * MiB, f"GPU memory fell by {(free0 - free1) / MiB:.1f} MiB"
    assert rss1 - rss0 <= 16 * MiB, f"RSS grew by {(rss1 - rss0) / MiB:.1f} MiB"
