"""The runtime on CPU: the full API on the ONNX Runtime backend with small graphs built here,
input validation (shared with the TensorRT backend), the manifest checks an engine must pass
before it is deserialized, backend selection and fallback, import hygiene and `run`."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.errors import DependencyError, InputError, ManifestMismatchError
from trt_seer.runtime import load, onnx_sibling, tensorrt_unavailable_reason
from trt_seer.runtime.loader import check_manifest
from trt_seer.runtime.jit_cache import runtime_cache_path
from trt_seer.runtime.io import IOSpec, specs_from_description, validate_feeds

OPSET = 17


def build_graph(path, *, task="feature-extraction", features=False, fp16=False):
    """A small ONNX model with the default model's calling convention and a known result:
    masked = ids * mask (float), pooled = sum over seq; "classify" adds logits [p, 10 - p, 5]."""
    import onnx
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
              for n in ("input_ids", "attention_mask")]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=f32),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=f32),
        helper.make_node("Mul", ["ids_f", "mask_f"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["pooled"], keepdims=0),
    ]
    inits = [helper.make_tensor("axis1", TensorProto.INT64, [1], [1])]
    outputs = [helper.make_tensor_value_info("masked", f32, ["batch", "seq"]),
               helper.make_tensor_value_info("pooled", f32, ["batch"])]
    if task == "text-classification":
        nodes += [helper.make_node("Unsqueeze", ["pooled", "axis1"], ["p"]),
                  helper.make_node("Sub", ["ten", "p"], ["q"]),
                  helper.make_node("Mul", ["p", "zero"], ["z"]),
                  helper.make_node("Add", ["z", "five"], ["r"]),
                  helper.make_node("Concat", ["p", "q", "r"], ["logits"], axis=1)]
        inits += [helper.make_tensor(n, f32, [], [v]) for n, v in (("ten", 10.0), ("zero", 0.0), ("five", 5.0))]
        outputs = [helper.make_tensor_value_info("logits", f32, ["batch", 3])]
    if task == "feature-extraction-embedding":  # sentence_embedding = [p, 2p]
        nodes += [helper.make_node("Unsqueeze", ["pooled", "axis1"], ["p"]),
                  helper.make_node("Add", ["p", "p"], ["p2"]),
                  helper.make_node("Concat", ["p", "p2"], ["sentence_embedding"], axis=1)]
        outputs = [helper.make_tensor_value_info("sentence_embedding", f32, ["batch", 2])]
    if features:
        inputs.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4]))
        nodes.append(helper.make_node("Add", ["features", "features"], ["doubled"]))
        outputs.append(helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["batch", 4]))
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnxio.save(model, path)
    return path


def write_record(onnx_path, **extra):
    io = onnxio.describe_io(onnxio.load(onnx_path))
    manifest.write(manifest.record_path(onnx_path), {"kind": "onnx", "precision": "fp32", "io": io, **extra})


def token_feeds(batch, seq, seed=0, features=False):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(1, 50, size=(batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, seq), dtype=np.int64)}
    feeds["attention_mask"][0, seq // 2:] = 0
    if features:
        feeds["features"] = rng.standard_normal((batch, 4)).astype(np.float32)
    return feeds


@pytest.fixture
def tiny_onnx(tmp_path):
    return build_graph(tmp_path / "tiny.fp32.onnx")


# --- the ONNX Runtime backend --------------------------------------------------------------------

@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 7), (5, 64)])
def test_infer_matches_the_graphs_arithmetic_at_dynamic_shapes(tiny_onnx, batch, seq):
    feeds = token_feeds(batch, seq, seed=batch * seq)
    with load(tiny_onnx) as m:
        out = m.infer(feeds)
    masked = (feeds["input_ids"] * feeds["attention_mask"]).astype(np.float32)
    assert set(out) == {"masked", "pooled"}
    np.testing.assert_array_equal(out["masked"], masked)
    np.testing.assert_allclose(out["pooled"], masked.sum(axis=1), rtol=1e-6)
    assert out["pooled"].dtype == np.float32 and out["pooled"].shape == (batch,)


def test_model_describes_itself_from_the_session_without_a_record(tiny_onnx):
    with load(tiny_onnx) as m:
        assert m.backend == "onnxruntime" and m.manifest is None
        assert m.input_names == ("input_ids", "attention_mask")
        assert m.inputs[0] == IOSpec("input_ids", "int64", (-1, -1), ("batch", "seq"))
        assert m.outputs[1].shape == (-1,)
        assert m.last_gpu_ms is None


def test_record_supplies_io_and_profile_bounds(tiny_onnx):
    write_record(tiny_onnx, profiles=[{"batch": [1, 2, 4], "seq": [2, 8, 16]}], task="feature-extraction")
    with load(tiny_onnx) as m:
        assert m.manifest["task"] == "feature-extraction"
        assert m.inputs[0].min_shape == (1, 2) and m.inputs[0].max_shape == (4, 16)
        m.infer(token_feeds(4, 16))  # the profile's max is allowed
        with pytest.raises(InputError, match=r"outside the profile \[1, 2\]\.\.\[4, 16\]"):
            m.infer(token_feeds(5, 8))
        with pytest.raises(InputError, match="outside the profile"):
            m.infer(token_feeds(2, 1))


def test_stale_record_is_a_manifest_mismatch(tiny_onnx):
    manifest.write(manifest.record_path(tiny_onnx), {"io": {
        "inputs": [{"name": "ids", "dtype": "int64", "shape": [-1, -1]}],
        "outputs": [{"name": "pooled", "dtype": "float32", "shape": [-1]}]}})
    with pytest.raises(ManifestMismatchError, match=r"lists inputs \['ids'\].*re-export"):
        load(tiny_onnx)


def test_session_options(tiny_onnx):
    import onnxruntime as ort

    with load(tiny_onnx, threads=1) as m:
        so = m.session.get_session_options()
        assert so.intra_op_num_threads == 1
        assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL


def test_fp16_typed_graph_runs_and_returns_fp16(tmp_path):
    path = build_graph(tmp_path / "tiny.fp16.onnx", fp16=True)
    feeds = token_feeds(2, 5)
    with load(path) as m:
        out = m.infer(feeds)
    assert out["pooled"].dtype == np.float16
    expected = (feeds["input_ids"] * feeds["attention_mask"]).sum(axis=1)
    np.testing.assert_allclose(out["pooled"].astype(np.float64), expected, rtol=1e-3)


def test_infer_async_and_concurrent_threads(tiny_onnx):
    with load(tiny_onnx) as m:
        pending = m.infer_async(token_feeds(2, 3))
        assert pending.done() and pending.result()["pooled"].shape == (2,)
        with pytest.raises(InputError, match="takes no CUDA stream"):
            m.infer_async(token_feeds(2, 3), stream=7)
        results, errors = {}, []

        def worker(i):
            try:
                results[i] = m.infer(token_feeds(1 + i % 3, 4 + i, seed=i))["pooled"]
            except Exception as e:  # collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for i, got in results.items():
        f = token_feeds(1 + i % 3, 4 + i, seed=i)
        np.testing.assert_allclose(got, (f["input_ids"] * f["attention_mask"]).sum(1), rtol=1e-6)


def test_closed_model_refuses_calls(tiny_onnx):
    m = load(tiny_onnx)
    m.close()
    m.close()  # idempotent
    with pytest.raises(InputError, match="is closed"):
        m.infer(token_feeds(1, 2))


def test_outputs_selects_what_comes_back(tiny_onnx):
    feeds = token_feeds(3, 5, seed=1)
    want = (feeds["input_ids"] * feeds["attention_mask"]).sum(1)
    with load(tiny_onnx) as m:
        out = m.infer(feeds, outputs=["pooled"])
        assert list(out) == ["pooled"]
        np.testing.assert_allclose(out["pooled"], want, rtol=1e-6)
        assert list(m.infer(feeds, outputs=("masked", "pooled", "masked"))) == ["masked", "pooled"]
        assert list(m.infer(feeds, outputs="pooled")) == ["pooled"]
        with pytest.raises(InputError, match=r"unknown output\(s\) sentence_embedding; the model returns "
                                             r"masked: float32\[batch, seq\], pooled: float32\[batch\]"):
            m.infer(feeds, outputs=["pooled", "sentence_embedding"])
        with pytest.raises(InputError, match="outputs is empty"):
            m.infer(feeds, outputs=[])


def test_out_buffers_are_written_in_place(tiny_onnx):
    feeds = token_feeds(3, 5, seed=2)
    masked = (feeds["input_ids"] * feeds["attention_mask"]).astype(np.float32)
    pooled_buf = np.full(8, -1, np.float32)  # sized for a larger batch: the first rows are used
    masked_buf = np.empty((3, 5), np.float32)
    with load(tiny_onnx) as m:
        out = m.infer(feeds, out={"pooled": pooled_buf, "masked": masked_buf})
    assert out["masked"] is masked_buf
    assert out["pooled"].shape == (3,) and np.shares_memory(out["pooled"], pooled_buf)
    np.testing.assert_array_equal(masked_buf, masked)
    np.testing.assert_allclose(pooled_buf[:3], masked.sum(1), rtol=1e-6)
    assert (pooled_buf[3:] == -1).all()


BAD_OUT = {
    "dtype": ({"pooled": np.empty(3, np.float64)}, None, r"out\[pooled\] has dtype float64; output pooled is float32"),
    "too small": ({"masked": np.empty((3, 5), np.float32), "pooled": np.empty(2, np.float32)}, None,
                  r"out\[pooled\] has shape \[2\] \(2 elements\); this call's pooled is \[3\] \(3\): pass a larger"),
    "strided": ({"pooled": np.empty(6, np.float32)[::2]}, None, r"out\[pooled\] must be a writable C-contiguous"),
    "read-only": ({"pooled": np.broadcast_to(np.float32(0), (3,))}, None, "must be a writable C-contiguous"),
    "not asked for": ({"masked": np.empty((3, 5), np.float32)}, ["pooled"],
                      r"out names masked, which this call does not return; it returns pooled"),
    "unknown": ({"logits": np.empty(3, np.float32)}, None, "out names logits, which this call does not return"),
    "not an array": ({"pooled": [0.0, 0.0, 0.0]}, None, r"out\[pooled\] is not an array \(list\)"),
    "gpu": ({"pooled": type("G", (), {"__cuda_array_interface__": {"shape": (3,), "typestr": "<f4", "version": 3,
                                                                      "data": (4096, False)}})()},
            None, r"out\[pooled\] is a GPU array; this backend writes host arrays"),
}


@pytest.mark.parametrize("case", sorted(BAD_OUT))
def test_bad_out_buffers_fail_with_one_message_and_write_nothing(tiny_onnx, case):
    out, outputs, message = BAD_OUT[case]
    sentinels = {k: v.copy() for k, v in out.items() if isinstance(v, np.ndarray)}
    with load(tiny_onnx) as m, pytest.raises(InputError, match=message):
        m.infer(token_feeds(3, 5), outputs=outputs, out=out)
    for name, before in sentinels.items():
        np.testing.assert_array_equal(out[name], before, err_msg=f"out[{name}] was written")


def test_device_outputs_need_the_tensorrt_backend(tiny_onnx):
    with load(tiny_onnx) as m, pytest.raises(InputError, match="device_outputs=True needs a TensorRT engine"):
        m.infer(token_feeds(1, 2), device_outputs=True)


def test_close_waits_for_the_calls_inside_and_refuses_later_ones():
    from trt_seer.runtime.base import CallGate

    gate, closed = CallGate("m.onnx"), threading.Event()
    gate.enter()
    closer = threading.Thread(target=lambda: (gate.close(), closed.set()))
    closer.start()
    assert not closed.wait(0.3), "close returned while a call was inside"
    with pytest.raises(InputError, match="m.onnx is closed"):
        gate.enter()  # refused at once, while close is still waiting
    gate.leave()
    assert closed.wait(10)
    closer.join()
    assert gate.close() is False  # idempotent


def test_engine_slot_pool_hands_out_contexts_and_wakes_waiters_on_close():
    """The pool behind TensorRTModel's contexts (tokens stand in for execution contexts)."""
    from trt_seer.runtime.slot import SlotPool

    pool = SlotPool("m.engine", ["ctx0"])
    assert pool.acquire() == "ctx0"  # the caller is now inside
    waiter_error = []

    def waiter():
        try:
            pool.acquire()
        except InputError as e:
            waiter_error.append(str(e))

    t = threading.Thread(target=waiter)
    t.start()
    t.join(0.2)
    assert t.is_alive()  # no free context: it waits
    closer = threading.Thread(target=pool.close)
    closer.start()
    t.join(10)
    assert waiter_error == ["m.engine is closed"]  # woken by close, gives up
    closer.join(0.2)
    assert closer.is_alive()  # still waiting for the call inside
    pool.release_and_leave("ctx0")
    closer.join(10)
    assert not closer.is_alive()
    assert pool.try_enter() is False
    with pytest.raises(InputError, match="m.engine was closed before this call's result was read"):
        pool.reenter()


def test_onnxruntime_close_keeps_the_session_until_the_call_inside_leaves(tiny_onnx):
    m = load(tiny_onnx)
    m._gate.enter()  # what infer does around session.run
    closer = threading.Thread(target=m.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive() and m.session is not None, "the session went away under a running call"
    m._gate.leave()
    closer.join(10)
    assert not closer.is_alive() and m.session is None and m.closed


def close_while_threads_call(m, call, threads: int, before_close: int, join_s: float) -> tuple[list, list]:
    """`threads` threads call `call()` (True: a right result) until `m` is closed from this thread
    after `before_close` results; returns (finished, refused). Any error other than the refusal
    of a closed model fails here."""
    finished, refused, errors = [], [], []

    def worker():
        while True:
            try:
                finished.append(call())
            except InputError as e:
                refused.append(str(e))
                return
            except Exception as e:  # collected and asserted below
                errors.append(e)
                return

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for t in running:
        t.start()
    while len(finished) < before_close:
        time.sleep(0.001)
    m.close()
    for t in running:
        t.join(timeout=join_s)
    assert not errors, errors
    return finished, refused


def test_close_from_another_thread_while_threads_call(tiny_onnx):
    """Every call either finishes with the right result before close() returns or raises
    InputError; none sees a half-closed model."""
    m = load(tiny_onnx, threads=1)
    feeds = token_feeds(4, 256, seed=3)
    want = (feeds["input_ids"] * feeds["attention_mask"]).sum(1)
    finished, refused = close_while_threads_call(
        m, lambda: bool(np.allclose(m.infer(feeds, outputs=["pooled"])["pooled"], want)), 4, 20, 60)
    assert len(refused) == 4 and all("is closed" in r for r in refused)
    assert all(finished)
    assert m.session is None


# --- validation: one message per mistake, on every backend ---------------------------------------

@pytest.fixture
def feature_onnx(tmp_path):
    return build_graph(tmp_path / "feat.fp32.onnx", features=True)


BAD_FEEDS = {
    "missing": (lambda f: {k: v for k, v in f.items() if k != "attention_mask"},
                r"missing input\(s\) attention_mask; the model takes input_ids: int64\[batch, seq\]"),
    "unknown": (lambda f: {**f, "position_ids": f["input_ids"]}, r"unknown input\(s\) position_ids"),
    "dtype": (lambda f: {**f, "input_ids": f["input_ids"].astype(np.int32)},
              r"input input_ids has dtype int32; the model takes int64 \(convert with \.astype\(np\.int64\)\)"),
    "rank": (lambda f: {**f, "input_ids": f["input_ids"][0]}, r"input input_ids has rank 1 \(shape \[6\]\); "
             r"the model takes rank 2"),
    "fixed axis": (lambda f: {**f, "features": np.zeros((2, 5), np.float32)},
                   r"input features has shape \[2, 5\]; axis 1 must be 4"),
    "shared axis": (lambda f: {**f, "attention_mask": np.ones((2, 7), np.int64)},
                    r"inputs input_ids and attention_mask disagree on the seq axis: 6 vs 7"),
    "empty": (lambda f: {k: v[:, :0] if v.dtype == np.int64 else v for k, v in f.items()},
              r"input input_ids has shape \[2, 0\]; axis 1 is empty"),
    "not a dict": (lambda f: list(f.values()), r"feeds must be a dict of input name -> array, got list"),
}


@pytest.mark.parametrize("case", sorted(BAD_FEEDS))
def test_bad_feeds_fail_before_running_with_one_clear_message(feature_onnx, case):
    change, message = BAD_FEEDS[case]
    with load(feature_onnx) as m:
        with pytest.raises(InputError, match=message):
            m.infer(change(token_feeds(2, 6, features=True)))


@pytest.mark.parametrize("case", sorted(BAD_FEEDS))
def test_engine_specs_from_a_manifest_give_the_same_messages(feature_onnx, case):
    """The TensorRT backend validates with specs read from the engine and its manifest; the
    messages must match the ONNX Runtime backend's word for word."""
    change, _ = BAD_FEEDS[case]
    io = onnxio.describe_io(onnxio.load(feature_onnx))
    engine_like = specs_from_description(io["inputs"])
    feeds = change(token_feeds(2, 6, features=True))
    with pytest.raises(InputError) as from_manifest:
        validate_feeds(engine_like, feeds, allow_device=True)
    with load(feature_onnx) as m, pytest.raises(InputError) as from_ort:
        m.infer(feeds)
    assert str(from_manifest.value) == str(from_ort.value)


@pytest.mark.parametrize("case", sorted(BAD_FEEDS))
def test_remembered_shapes_do_not_let_bad_feeds_through(feature_onnx, case):
    """The TensorRT backend's FeedCheck skips the checks for numpy feeds whose shapes passed before;
    a bad feed after good ones of the same shapes still fails with validate_feeds' message."""
    from trt_seer.runtime.io import FeedCheck

    io = onnxio.describe_io(onnxio.load(feature_onnx))
    specs = specs_from_description(io["inputs"])
    check = FeedCheck(specs)
    good = token_feeds(2, 6, features=True)
    for _ in range(2):  # the second call takes the remembered path
        valid, key = check(good, allow_device=True)
        assert list(valid) == [s.name for s in specs] and all(valid[n] is good[n] for n in good)
        assert key == tuple(good[s.name].shape for s in specs)
    change, message = BAD_FEEDS[case]
    with pytest.raises(InputError, match=message):
        check(change(token_feeds(2, 6, features=True)), allow_device=True)
    assert len(check._passed) == 1
    strided = {**good, "input_ids": np.asfortranarray(np.tile(good["input_ids"], (1, 1)))}
    valid, _ = check(strided)  # not C-contiguous: the full path makes a contiguous copy
    assert valid["input_ids"].flags.c_contiguous and valid["input_ids"] is not strided["input_ids"]


def test_tensorrt_dtype_names_in_manifests_are_understood():
    specs = specs_from_description([{"name": "x", "dtype": "float", "shape": [-1, 4]},
                                    {"name": "y", "dtype": "half", "shape": [2]}],
                                   {"batch": [1, 2, 8], "seq": [1, 4, 16]})
    assert [s.dtype for s in specs] == ["float32", "float16"]
    assert specs[0].min_shape == (1, 4) and specs[0].max_shape == (8, 4)


def test_gpu_tensors_are_refused_by_the_cpu_backend(tiny_onnx):
    class DeviceArray:  # what torch/cupy CUDA tensors expose
        shape = (1, 2)
        __cuda_array_interface__ = {"shape": (1, 2), "typestr": "<i8", "data": (1 << 20, False), "version": 3}

    with load(tiny_onnx) as m, pytest.raises(InputError, match="input input_ids is a GPU tensor"):
        m.infer({"input_ids": DeviceArray(), "attention_mask": np.ones((1, 2), np.int64)})


def test_strided_cuda_view_is_refused_before_binding():
    from trt_seer.runtime.io import from_cuda_array_interface

    class View:
        __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<i8", "data": (4096, False),
                                    "strides": (8, 16), "version": 3}

    with pytest.raises(InputError, match="strided GPU view"):
        from_cuda_array_interface(View(), "input_ids")
    View.__cuda_array_interface__ = {**View.__cuda_array_interface__, "strides": (24, 8), "stream": 1}
    t = from_cuda_array_interface(View(), "input_ids")
    assert (t.ptr, t.shape, t.dtype, t.stream, t.nbytes) == (4096, (2, 3), np.dtype("int64"), 1, 48)


# --- manifests an engine must match before it is deserialized ------------------------------------

def engine_manifest(tmp_path, flavor="tensorrt_rtx", version="1.7.1.116", targets=None, **build):
    path = tmp_path / "m.fp16.engine"
    data = {"name": "m", "precision": "fp16", "task": "feature-extraction",
            "engine": {"file": path.name, "sha256": "0" * 64, "size_bytes": 1},
            "tensorrt": {"flavor": flavor, "version": version},
            "targets": targets or {"mode": "ampere+", "compute_capabilities": []},
            "profiles": [{"batch": [1, 8, 32], "seq": [8, 128, 256]}],
            "io": {"inputs": [], "outputs": []}, "build": {"key": "fabricated", "settings": build}}
    manifest.write(manifest.engine_manifest_path(path), data)
    return manifest.read_engine_manifest(manifest.engine_manifest_path(path))


RTX = {"flavor": "tensorrt_rtx", "version": "1.7.1.116"}


def test_matching_manifest_passes(tmp_path):
    check_manifest(engine_manifest(tmp_path), RTX, (8, 9), "RTX 4090")
    check_manifest(engine_manifest(tmp_path, version="1.7.1.200"), RTX, (9, 0))  # same release, other build


def test_flavor_mismatch_names_both_sides(tmp_path):
    m = engine_manifest(tmp_path, flavor="tensorrt", version="10.13.0.35")
    with pytest.raises(ManifestMismatchError, match=r"built with tensorrt 10\.13\.0\.35; this runtime has "
                                                    r"tensorrt_rtx 1\.7\.1\.116"):
        check_manifest(m, RTX, (8, 9))


def test_version_mismatch_names_both_sides(tmp_path):
    m = engine_manifest(tmp_path, version="1.6.0.20")
    with pytest.raises(ManifestMismatchError, match=r"built with tensorrt_rtx 1\.6\.0\.20; this runtime has "
                                                    r"tensorrt_rtx 1\.7\.1\.116.*rebuild"):
        check_manifest(m, RTX, (8, 9))


def test_version_compatible_tensorrt_engines_load_in_later_releases(tmp_path):
    trt10 = {"flavor": "tensorrt", "version": "10.14.1.48"}
    m = engine_manifest(tmp_path, flavor="tensorrt", version="10.13.0.35", version_compatible=True)
    check_manifest(m, trt10, (9, 0))
    with pytest.raises(ManifestMismatchError):
        check_manifest(engine_manifest(tmp_path, flavor="tensorrt", version="10.13.0.35"), trt10, (9, 0))


def test_compute_capability_mismatch_names_both_sides(tmp_path):
    listed = engine_manifest(tmp_path, targets={"mode": "listed", "compute_capabilities": ["8.6", "8.9"]})
    check_manifest(listed, RTX, (8, 6))
    with pytest.raises(ManifestMismatchError, match=r"targets compute capability 8\.6, 8\.9; H200 is 9\.0: "
                                                    r"rebuild with --compute-capability 9\.0"):
        check_manifest(listed, RTX, (9, 0), "H200")
    with pytest.raises(ManifestMismatchError, match=r"targets compute capability ampere\+; T4 is 7\.5"):
        check_manifest(engine_manifest(tmp_path), RTX, (7, 5), "T4")


def test_artifact_naming():
    assert runtime_cache_path("e/x.fp16.engine").name == "x.fp16.runtime.cache"
    assert onnx_sibling("e/x.int8.engine").name == "x.int8.onnx"


# --- load(): backends, options, fallback ---------------------------------------------------------

def test_load_rejects_bad_requests(tiny_onnx, tmp_path):
    with pytest.raises(InputError, match="unknown backend 'cuda'"):
        load(tiny_onnx, backend="cuda")
    with pytest.raises(InputError, match="is an ONNX graph; build an engine"):
        load(tiny_onnx, backend="tensorrt")
    with pytest.raises(InputError, match=r"unknown load option\(s\) thread;"):
        load(tiny_onnx, thread=2)
    with pytest.raises(InputError, match="neither a .engine nor a .onnx"):
        load(tmp_path / "model.plan")
    with pytest.raises(InputError, match="ONNX file not found"):
        load(tmp_path / "missing.onnx")


def test_engine_on_onnxruntime_backend_uses_its_sibling(tmp_path):
    build_graph(tmp_path / "x.fp32.onnx")
    with load(tmp_path / "x.fp32.engine", backend="onnxruntime") as m:
        assert m.backend == "onnxruntime" and m.path.name == "x.fp32.onnx"


no_trt = tensorrt_unavailable_reason()


@pytest.mark.skipif(no_trt is None, reason="a GPU and TensorRT are usable here: nothing to fall back from")
def test_auto_falls_back_to_the_sibling_onnx_and_says_so(tmp_path):
    engine = tmp_path / "x.fp32.engine"
    engine.write_bytes(b"not run here")
    with pytest.raises(DependencyError, match="no x.fp32.onnx beside it"):
        load(engine)
    build_graph(tmp_path / "x.fp32.onnx")
    fallback = r"running x\.fp32\.onnx on ONNX Runtime \(CPU\) instead of x\.fp32\.engine"
    with pytest.warns(RuntimeWarning, match=fallback):
        m = load(engine, contexts=2)  # engine-only options are ignored by the fallback
    with m:
        assert m.backend == "onnxruntime"
        assert m.infer(token_feeds(1, 3))["pooled"].shape == (1,)
    with pytest.raises(DependencyError, match="cannot run x.fp32.engine on TensorRT"):
        load(engine, backend="tensorrt")


@pytest.mark.skipif(no_trt is None, reason="a GPU and TensorRT are usable here: nothing to fall back from")
def test_damaged_engine_falls_back_saying_it_is_damaged(tmp_path):
    engine = tmp_path / "x.fp32.engine"
    engine.write_bytes(b"truncated")
    build_graph(tmp_path / "x.fp32.onnx")
    described = {"schema": 1, "engine": {"file": engine.name, "sha256": "0" * 64, "size_bytes": 4096}}
    path = manifest.engine_manifest_path(engine)
    path.write_text(json.dumps(described))
    with pytest.warns(RuntimeWarning, match=r"x\.fp32\.engine is damaged: 9 bytes, its manifest says 4096"):
        load(engine).close()
    path.write_text(json.dumps({**described, "engine": {**described["engine"], "size_bytes": 9}}))
    with pytest.warns(RuntimeWarning, match="is damaged: its sha256 differs"):
        load(engine).close()


def test_missing_engine_is_named_missing_even_with_its_onnx_beside_it(tmp_path):
    build_graph(tmp_path / "x.fp32.onnx")
    for backend in ("auto", "tensorrt"):
        with pytest.raises(InputError, match="engine not found: .*x.fp32.engine"):
            load(tmp_path / "x.fp32.engine", backend=backend)
    r = subprocess.run([sys.executable, "-m", "trt_seer", "run", str(tmp_path / "y.fp16.engine"), "--text", "a"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().endswith("y.fp16.engine"), r.stderr
    assert "cuda" not in r.stderr.lower()


@pytest.mark.skipif(no_trt is None or "cuda-python" not in no_trt, reason="cuda-python is importable here")
def test_fallback_without_cuda_python_names_the_gpu_extra(tmp_path):
    engine = tmp_path / "x.fp32.engine"
    engine.write_bytes(b"not run here")
    build_graph(tmp_path / "x.fp32.onnx")
    with pytest.warns(RuntimeWarning, match=r"ONNX Runtime \(CPU\) instead of x\.fp32\.engine: .*cuda-python is not installed, "
                      r"so TensorRT engines cannot run on the GPU; pip install \"trt-seer\[gpu\]\""):
        load(engine).close()


@pytest.mark.skipif(no_trt is None, reason="a GPU and TensorRT are usable here")
def test_reason_says_what_is_missing():
    assert "cuda" in no_trt.lower() or "tensorrt" in no_trt.lower()


# --- import hygiene ------------------------------------------------------------------------------

def test_runtime_imports_no_torch_transformers_or_onnx(tiny_onnx, tmp_path):
    engine = tmp_path / "y.fp32.engine"
    build_graph(tmp_path / "y.fp32.onnx")
    script = f"""
import sys, warnings
import numpy as np
from trt_seer.runtime import load
feeds = {{"input_ids": np.array([[3, 4, 5]]), "attention_mask": np.array([[1, 1, 0]])}}
with load({str(tiny_onnx)!r}) as m:
    assert m.infer(feeds)["pooled"].tolist() == [7.0]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        with load({str(engine)!r}) as m:   # TensorRT where usable, else the sibling ONNX
            pass
    except Exception as e:   # an engine that is not one: only the import side matters here
        print("engine path:", type(e).__name__)
print("HEAVY", sorted(n for n in ("torch", "transformers", "onnx") if n in sys.modules))
"""
    engine.write_bytes(b"x")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout


# --- the `run` command ---------------------------------------------------------------------------

VOCAB = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "foo": 4}


@pytest.fixture
def classifier(tmp_path):
    """A classification graph with a record naming a checkpoint dir that holds a real tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "config.json").write_text(json.dumps({"id2label": {"0": "big", "1": "small", "2": "mid"}}))
    path = build_graph(tmp_path / "clf.fp32.onnx", task="text-classification")
    write_record(path, task="text-classification", source={"checkpoint": str(ckpt)})
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "trt_seer", "run", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def expected_label(text):
    p = sum(VOCAB.get(w, 1) for w in text.split())
    logits = [p, 10 - p, 5]
    return ["big", "small", "mid"][int(np.argmax(logits))], logits


def test_run_cli_labels_texts_with_the_recorded_tokenizer(classifier, tmp_path):
    texts = ["hello", "foo foo foo", "world hello unknown"]
    file = tmp_path / "texts.txt"
    file.write_text("\n".join(texts[1:]) + "\n\n")
    r = run_cli(str(classifier), "--text", texts[0], "--file", str(file), "--json", "--batch-size", "2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "onnxruntime" and doc["task"] == "text-classification"
    assert [row["text"] for row in doc["results"]] == texts
    for row in doc["results"]:
        label, logits = expected_label(row["text"])
        assert row["label"] == label and row["logits"] == pytest.approx(logits)


def test_run_cli_prints_sentence_embeddings(classifier, tmp_path):
    path = build_graph(tmp_path / "emb.fp32.onnx", task="feature-extraction-embedding")
    write_record(path, task="feature-extraction", source={"checkpoint": str(tmp_path / "ckpt")})
    r = run_cli(str(path), "--text", "hello world", "--text", "foo", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert [row["embedding"] for row in rows] == [[5.0, 10.0], [4.0, 8.0]]
    assert rows[0]["dim"] == 2 and rows[0]["norm"] == pytest.approx(5 * 5 ** 0.5, rel=1e-5)


def test_run_cli_plain_output_and_errors(classifier, tiny_onnx):
    r = run_cli(str(classifier), "--text", "foo foo foo")
    assert r.returncode == 0 and "'foo foo foo': label=big" in r.stdout, r.stderr
    r = run_cli(str(classifier))
    assert r.returncode == 2 and "nothing to run" in r.stderr
    r = run_cli(str(tiny_onnx), "--text", "hi")  # no record: no checkpoint to take a tokenizer from
    assert r.returncode == 2 and "pass --tokenizer DIR" in r.stderr


def test_int8_fallback_prefers_the_cpu_int8_graph(tmp_path):
    (tmp_path / "x.int8.onnx").write_bytes(b"")
    assert onnx_sibling(tmp_path / "x.int8.engine").name == "x.int8.onnx"
    (tmp_path / "x.int8.cpu.onnx").write_bytes(b"")
    assert onnx_sibling(tmp_path / "x.int8.engine").name == "x.int8.onnx"  # without its record: absent
    (tmp_path / "x.int8.cpu.onnx.json").write_text("{}")
    assert onnx_sibling(tmp_path / "x.int8.engine").name == "x.int8.cpu.onnx"
    assert onnx_sibling(tmp_path / "x.fp16.engine").name == "x.fp16.onnx"
    assert onnx_sibling(tmp_path / "x.fp32.engine").name == "x.fp32.onnx"


def test_cpu_fallback_prefers_the_fused_fp32_graph(tmp_path):
    (tmp_path / "x.fp32.cpu.onnx").write_bytes(b"")
    (tmp_path / "x.fp32.cpu.onnx.json").write_text("{}")
    assert onnx_sibling(tmp_path / "x.fp32.engine").name == "x.fp32.cpu.onnx"
    assert onnx_sibling(tmp_path / "x.fp16.engine").name == "x.fp32.cpu.onnx"  # faster there than the FP16-typed graph
    assert onnx_sibling(tmp_path / "x.int8.engine").name == "x.int8.onnx"  # INT8 without its CPU form
    assert onnx_sibling(tmp_path / "y.fp32.engine").name == "y.fp32.onnx"  # another model's is not taken


def test_staging_regions_give_each_input_its_own_aligned_place(monkeypatch):
    """TensorRT slots stage every host input in one pinned buffer (one copy per call); the layout
    is checked here on a numpy stand-in for the pinned/device pair."""
    from trt_seer.runtime import slot as slot_mod

    class Pinned:
        def __init__(self, n):
            self.nbytes, self.device_ptr, self.mem = n, 4096, np.zeros(n, np.uint8)

        def host_view(self, shape, dtype):
            return self.mem.view(dtype).reshape(shape)

    monkeypatch.setattr(slot_mod.cuda, "HostDeviceBuffer", Pinned)
    specs = [IOSpec("input_ids", "int64", (-1, -1), max_shape=(4, 5)),
             IOSpec("mask", "int32", (-1, -1), max_shape=(4, 5)),
             IOSpec("scale", "float16", (3,), max_shape=(3,))]
    staging, regions = slot_mod.staging_regions(specs)
    assert [r.offset for r in regions.values()] == [0, 256, 512]  # 160 and 80 bytes, rounded up to 256
    assert staging.nbytes == 768 and regions["mask"].device_ptr == 4096 + 256
    regions["mask"].host_view((2, 5), np.dtype(np.int32))[:] = 7
    regions["input_ids"].host_view((4, 5), np.dtype(np.int64))[:] = -1  # its largest shape stays in place
    assert (staging.mem[256:296].view(np.int32) == 7).all() and (staging.mem[296:512] == 0).all()
    with pytest.raises(ValueError, match="needs 100 bytes; the region holds 80"):
        regions["mask"].host_view((5, 5), np.dtype(np.int32))


# --- prepared calls ------------------------------------------------------------------------------

def test_prepared_call_matches_infer_and_returns_only_what_was_asked(tiny_onnx):
    with load(tiny_onnx) as m:
        call = m.prepare({"input_ids": (3, 7), "attention_mask": (3, 7)}, outputs=["pooled"])
        for seed in range(3):
            feeds = token_feeds(3, 7, seed=seed)
            got = call.run(feeds)
            assert list(got) == ["pooled"]
            np.testing.assert_array_equal(got["pooled"], m.infer(feeds, outputs=["pooled"])["pooled"])
        feeds = token_feeds(3, 7, seed=9)
        for name, value in feeds.items():
            call.inputs[name][...] = value
        np.testing.assert_array_equal(call.run()["pooled"], m.infer(feeds)["pooled"])
        with pytest.raises(InputError, match=r"input input_ids has shape \[2, 7\]; this call was prepared for \[3, 7\]"):
            call.run(token_feeds(2, 7))
        with pytest.raises(InputError, match=r"missing input\(s\) attention_mask; this call was prepared for"):
            call.run({"input_ids": feeds["input_ids"]})
    with pytest.raises(InputError, match="is closed"):
        call.run(feeds)


@pytest.mark.parametrize("case", ["missing", "unknown", "rank", "fixed axis", "shared axis", "empty"])
def test_prepare_refuses_shapes_with_infers_message(feature_onnx, case):
    """prepare() checks shapes as infer() checks feeds of those shapes, word for word."""
    change, message = BAD_FEEDS[case]
    feeds = change(token_feeds(2, 6, features=True))
    with load(feature_onnx) as m:
        with pytest.raises(InputError, match=message) as prepared:
            m.prepare({name: value.shape for name, value in feeds.items()})
        with pytest.raises(InputError) as inferred:
            m.infer(feeds)
    assert str(prepared.value) == str(inferred.value)


def test_big_endian_feeds_are_read_as_numbers_not_bytes(tiny_onnx):
    """Backends read raw bytes: a big-endian int64 feed is converted, not misread (on infer and on a
    prepared call alike)."""
    feeds = token_feeds(2, 5, seed=3)
    swapped = {name: value.astype(value.dtype.newbyteorder(">")) for name, value in feeds.items()}
    with load(tiny_onnx) as m:
        want = m.infer(feeds)["pooled"]
        np.testing.assert_array_equal(m.infer(swapped)["pooled"], want)
        call = m.prepare({name: value.shape for name, value in feeds.items()}, outputs="pooled")
        np.testing.assert_array_equal(call.run(swapped)["pooled"], want)


def test_a_prepared_call_refuses_an_output_whose_shape_changes():
    """The backend-neutral prepared call copies each run's results into arrays sized at prepare();
    a model whose output shape does not follow from the input shapes is refused, not truncated."""
    from trt_seer.errors import UnsupportedError
    from trt_seer.runtime.base import Model

    class Drifting(Model):  # its output grows by one element per call
        def __init__(self):
            super().__init__()
            self.inputs, self.outputs, self.calls = (IOSpec("x", "float32", (-1,)),), (IOSpec("y", "float32", (-1,)),), 0

        def infer(self, feeds, outputs=None, *, out=None, device_outputs=False):
            self.calls += 1
            return {"y": np.full(self.calls, float(feeds["x"].sum()), np.float32)}

    call = Drifting().prepare({"x": (3,)})
    assert call.outputs["y"].shape == (1,)
    with pytest.raises(UnsupportedError, match=r"output y came out \[2\] after \[1\] for the same input shapes"):
        call.run({"x": np.ones(3, np.float32)})


def _fp16_matmul_chain(path, layers: int, width: int):
    """A chain of FP16 MatMul+Relu layers whose weights are external data (as a decoder's are)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float16)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"h{i}"])]
        x = f"h{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT16, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return path


PEAK_RSS = """
import sys, numpy as np
from trt_seer.runtime.ort import OrtOptions, create_session
s = create_session(sys.argv[1], OrtOptions(lean=sys.argv[2] == "lean"))
out = s.run(None, {"x": np.full((1, int(sys.argv[3])), 0.5, np.float16)})[0]
np.save(sys.argv[4], out)
print(next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak from /proc/self/status")
def test_lean_session_holds_fp16_weights_once(tmp_path):
    """ONNX Runtime's CPU kernels take FP32: by default every FP16 weight is cast up front (2x its
    bytes held); a lean session casts each where it is used. Same outputs, peak memory lower by
    about the weights' FP32 copy (each run in a fresh process)."""
    import onnxruntime as ort

    layers, width = 12, 2048  # 96 MiB of FP16 weights
    path = _fp16_matmul_chain(tmp_path / "chain.fp16.onnx", layers, width)
    peak = {}
    for mode in ("default", "lean"):
        r = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path), mode, str(width), str(tmp_path / mode)],
                           capture_output=True, text=True, check=True)
        peak[mode] = int(r.stdout.split()[-1])
    np.testing.assert_allclose(np.load(tmp_path / "lean.npy").astype(np.float32),
                               np.load(tmp_path / "default.npy").astype(np.float32), rtol=2e-2, atol=2e-2)
    fp16_bytes = layers * width * width * 2
    assert peak["default"] - peak["lean"] > 0.5 * fp16_bytes, peak
    from trt_seer.runtime.ort import OrtOptions, session_options

    so = session_options(OrtOptions(lean=True))
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_order == ort.ExecutionOrder.PRIORITY_BASED and not so.enable_cpu_mem_arena


@pytest.mark.skipif(no_trt is None or "cuda-python" not in no_trt, reason="cuda-python is importable here")
def test_a_gpu_machine_without_cuda_python_is_told_its_engines_need_the_gpu_extra(monkeypatch):
    import trt_seer.runtime.cuda as cuda

    monkeypatch.setattr(cuda, "nvidia_driver_present", lambda: True)  # as on a machine with a driver
    cuda.cudart.cache_clear()
    try:
        with pytest.raises(DependencyError, match=r'^this machine has an NVIDIA GPU but cuda-python is not installed, '
                                                  r'so TensorRT engines cannot run on the GPU; pip install "trt-seer\[gpu\]"'):
            cuda.cudart()
    finally:
        cuda.cudart.cache_clear()
