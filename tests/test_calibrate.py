"""Tests for trt_seer.quantize.calibrate: histograms, threshold methods, activation collection, caches."""
from __future__ import annotations

import gc
import struct
import tracemalloc
import warnings

import numpy as np
import pytest

from trt_seer.quantize.calibrate import (ZERO_AMAX, CalibSpec, Histogram, amax_from_histogram,
                                cache_version_tag, collect_ranges, entropy_bin, read_cache,
                                scales_from_ranges, write_cache)
from trt_seer.errors import InputError

ENTROPY, MAX, PERCENTILE = CalibSpec("entropy"), CalibSpec("max"), CalibSpec("percentile")


def histogram_of(*arrays, num_bins=2048) -> Histogram:
    h = Histogram(num_bins)
    for a in arrays:
        h.update(a)
    return h


# --- Histogram ---------------------------------------------------------------------------------

def test_single_batch_matches_numpy_histogram_of_abs():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    h = histogram_of(x)
    expected, _ = np.histogram(np.abs(x), bins=2048, range=(0, np.abs(x).max()))
    assert h.upper == h.amax == np.abs(x).max()
    np.testing.assert_array_equal(h.bins, expected)


def test_growth_within_capacity_adds_bins_of_the_same_width():
    rng = np.random.default_rng(1)
    small = rng.standard_normal(5_000).astype(np.float32)
    large = small * 1.5 + rng.standard_normal(5_000).astype(np.float32)
    h = histogram_of(small, large)
    width = np.abs(small).max() / 2048
    assert h.width == width and 2048 < h.used <= 4096
    assert h.upper - width < np.abs(large).max() <= h.upper
    old, _ = np.histogram(np.abs(small), bins=2048, range=(0, 2048 * width))
    new, _ = np.histogram(np.abs(large), bins=h.used, range=(0, h.upper))
    np.testing.assert_array_equal(h.bins, np.pad(old, (0, h.used - 2048)) + new)


def test_growth_past_capacity_sums_whole_runs_of_old_bins():
    rng = np.random.default_rng(1)
    small = rng.standard_normal(5_000).astype(np.float32)
    large = small * 7 + rng.standard_normal(5_000).astype(np.float32)
    h = histogram_of(small, large)
    old, _ = np.histogram(np.abs(small), bins=2048, range=(0, np.abs(small).max()))
    factor = round(h.width / (np.abs(small).max() / 2048))
    assert factor > 1 and h.width == np.abs(small).max() / 2048 * factor
    assert 2048 <= h.used <= 4096 and h.upper >= np.abs(large).max()
    merged = np.add.reduceat(old, np.arange(0, 2048, factor))
    new, _ = np.histogram(np.abs(large), bins=h.used, range=(0, h.upper))
    np.testing.assert_array_equal(h.bins, np.pad(merged, (0, h.used - merged.size)) + new)


def test_many_growths_match_a_one_shot_histogram():
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal(5_000).astype(np.float32) * s for s in (1, 1.5, 7, 0.5, 30)]
    h = histogram_of(*batches)
    every = np.abs(np.concatenate(batches))
    expected, _ = np.histogram(every, bins=h.used, range=(0, h.upper))
    assert h.counts.size == 4096 and h.amax == every.max() <= h.upper
    # Only a batch maximum that set an old range may differ: it sat on that range's closed right
    # edge (the last old bin), which is a left edge on the final grid.
    assert h.bins.sum() == expected.sum() and np.abs(h.bins - expected).sum() <= 2 * 3


def test_memory_does_not_grow_with_batches():
    rng = np.random.default_rng(2)
    h = Histogram()
    for scale in np.geomspace(1, 1e6, 200):
        h.update(rng.standard_normal(100) * scale)
    assert h.counts.size == 4096 and 2048 <= h.used <= 4096 and h.bins.sum() == 200 * 100


def test_zeros_before_data_stay_in_bin_zero():
    h = histogram_of(np.zeros(500), np.array([0.0, 1.0, -2.0]))
    assert h.bins[0] == 501 and h.bins[-1] == 1 and h.bins.sum() == 503


def test_empty_batch_changes_nothing():
    h = histogram_of(np.array([1.0, 2.0]), np.zeros((0, 4)))
    assert h.bins.sum() == 2 and h.amax == 2.0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_activation_is_an_input_error(bad):
    with pytest.raises(InputError, match="inf/NaN"):
        histogram_of(np.array([1.0, bad]))


# --- threshold methods -------------------------------------------------------------------------

def test_gaussian_with_huge_outliers_clips_inside_the_outliers():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(1_000_000), [40.0, -55.0, 60.0]])
    amax = amax_from_histogram(histogram_of(x), ENTROPY)
    assert 3.0 < amax < 0.1 * 60.0
    assert amax_from_histogram(histogram_of(x), MAX) == 60.0


def test_uniform_keeps_nearly_the_whole_range():
    x = np.random.default_rng(4).uniform(-1, 1, 500_000)
    h = histogram_of(x)
    assert amax_from_histogram(h, ENTROPY) > 0.95 * h.amax


def test_exact_zeros_do_not_move_the_entropy_threshold():
    # Bin 0 takes bin 1's count, so ReLU zeros or padding do not pull the threshold.
    rng = np.random.default_rng(5)
    nonzero = np.abs(rng.standard_normal(100_000)) + 1e-3
    few, many = histogram_of(nonzero, np.zeros(10)), histogram_of(nonzero, np.zeros(900_000))
    assert amax_from_histogram(few, ENTROPY) == amax_from_histogram(many, ENTROPY)


@pytest.mark.parametrize("spec", [ENTROPY, MAX, PERCENTILE], ids=lambda s: s.method)
def test_constant_tensor_gives_its_value(spec):
    assert amax_from_histogram(histogram_of(np.full((4, 7), -2.5)), spec) == 2.5


@pytest.mark.parametrize("spec", [ENTROPY, MAX, PERCENTILE], ids=lambda s: s.method)
def test_all_zero_tensor_gives_the_floor(spec):
    assert amax_from_histogram(histogram_of(np.zeros(1000), np.zeros(3)), spec) == ZERO_AMAX
    assert amax_from_histogram(Histogram(), spec) == ZERO_AMAX  # never updated


def test_percentile_keeps_at_least_the_fraction_and_is_one_bin_tight():
    x = np.random.default_rng(6).laplace(size=200_000).astype(np.float32)
    h = histogram_of(x)
    amax = amax_from_histogram(h, CalibSpec("percentile", percentile=99.9))
    inside = np.mean(np.abs(x) <= amax)
    assert inside >= 0.999
    assert np.mean(np.abs(x) <= amax - h.width) < 0.999


def test_spec_validation():
    with pytest.raises(InputError, match="unknown calibration method"):
        CalibSpec("minmax")
    with pytest.raises(InputError, match="percentile"):
        CalibSpec("percentile", percentile=0)
    with pytest.raises(InputError, match="num_bins"):
        CalibSpec(num_bins=64)


# --- against NVIDIA ModelOpt on identical histograms -------------------------------------------

def _modelopt_histogram_module():
    """ModelOpt's histogram calibrator; a skip names the real import error (a missing dependency of
    ModelOpt reads otherwise like ModelOpt itself missing)."""
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module("modelopt.torch.quantization.calib.histogram")
        except ImportError as e:
            pytest.skip(f"nvidia-modelopt not importable ({type(e).__name__}: {e}); pip install 'trt-seer[test]'")


def _reference_histograms():
    rng = np.random.default_rng(7)
    yield "gaussian", rng.standard_normal(100_000), 512
    yield "relu", np.maximum(rng.standard_normal(100_000), 0), 512
    yield "laplace", rng.laplace(size=100_000), 512
    yield "lognormal", rng.lognormal(0, 1, 100_000), 512
    yield "outliers", np.concatenate([rng.standard_normal(100_000), [30.0, -45.0]]), 512
    yield "sparse", rng.standard_normal(2_000), 512  # many empty bins: +inf candidates
    yield "student-t 2048 bins", rng.standard_t(3, 200_000), 2048


@pytest.mark.slow
def test_entropy_and_percentile_match_modelopt_on_the_same_histograms():
    ref = _modelopt_histogram_module()
    for name, x, num_bins in _reference_histograms():
        h = histogram_of(x, num_bins=num_bins)
        expected = float(ref._compute_amax_entropy(h.bins.copy(), h.edges, 8, False))
        assert np.float32(h.edges[entropy_bin(h.bins)]) == expected, name
        assert np.float32(amax_from_histogram(h, ENTROPY)) == expected, name
        # ModelOpt reports the lower edge of the bin reaching the percentile; we report its upper
        # edge. 99 + 1/7 keeps the target count off integers, where ModelOpt's float CDF can land
        # one ULP short of an exact hit.
        lower = float(ref._compute_amax_percentile(h.bins.copy(), h.edges, 99 + 1 / 7))
        upper = amax_from_histogram(h, CalibSpec("percentile", num_bins=num_bins, percentile=99 + 1 / 7))
        assert upper == pytest.approx(lower + h.width, rel=1e-6), name


@pytest.mark.slow
def test_streamed_entropy_matches_modelopt_streaming_calibrator():
    ref = _modelopt_histogram_module()
    import torch

    rng = np.random.default_rng(8)  # a stream where merging bins instead of adding them moves amax 6%
    h, calibrator = Histogram(), ref.HistogramCalibrator(num_bits=8, unsigned=False)
    for _ in range(16):
        x = rng.standard_normal(8192).astype(np.float32)
        h.update(x)
        calibrator.collect(torch.from_numpy(x))
    assert 2048 < h.used == calibrator._calib_hist.numel()  # grew, and within our capacity
    expected = float(calibrator.compute_amax("entropy"))
    assert amax_from_histogram(h, ENTROPY) == pytest.approx(expected, abs=h.width)


# --- collect_ranges on a tiny ONNX model -------------------------------------------------------

IN, HIDDEN, OUT = 256, 512, 32


def tiny_mlp(path, seed=0):
    """x (batch, IN) -> MatMul -> h0 -> Relu -> h -> MatMul -> y (batch, OUT)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((IN, HIDDEN)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / 16, "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
         helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
        initializer=[w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, path)
    return path, onnx.numpy_helper.to_array(w1), onnx.numpy_helper.to_array(w2)


def batches(samples, batch=8, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(samples // batch):
        yield {"x": rng.standard_normal((batch, IN)).astype(np.float32)}


def test_max_ranges_match_a_numpy_forward_pass(tmp_path):
    path, w1, w2 = tiny_mlp(tmp_path / "mlp.onnx")
    got = collect_ranges(path, list(batches(64)), ["x", "h0", "h", "y"], MAX, progress=False)
    x = np.concatenate([b["x"] for b in batches(64)])
    h0 = x @ w1
    expected = {"x": np.abs(x).max(), "h0": np.abs(h0).max(), "h": np.maximum(h0, 0).max(),
                "y": np.abs(np.maximum(h0, 0) @ w2).max()}
    for name, value in expected.items():
        assert got[name] == pytest.approx(float(value), rel=1e-5), name


def test_entropy_ranges_stream_like_a_histogram_and_leave_the_model_alone(tmp_path):
    import onnx

    path, _, _ = tiny_mlp(tmp_path / "mlp.onnx")
    before = path.read_bytes()
    got = collect_ranges(path, batches(256), ["x", "h", "y"], ENTROPY, progress=False)
    assert got["x"] == amax_from_histogram(histogram_of(*(b["x"] for b in batches(256))), ENTROPY)
    maxima = collect_ranges(path, batches(256), ["h", "y"], MAX, progress=False)
    assert all(0 < got[n] <= maxima[n] for n in ("h", "y"))
    assert path.read_bytes() == before
    assert [o.name for o in onnx.load(path).graph.output] == ["y"]


def test_peak_memory_is_flat_in_the_number_of_batches(tmp_path):
    path, _, _ = tiny_mlp(tmp_path / "mlp.onnx")
    names = ["x", "h0", "h", "y"]
    collect_ranges(path, batches(16), names, PERCENTILE, progress=False)  # warm imports and caches
    peaks = []
    for samples in (64, 1024):
        gc.collect()
        tracemalloc.start()
        collect_ranges(path, batches(samples), names, PERCENTILE, progress=False)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    kept_activations = 1024 * (IN + 2 * HIDDEN + OUT) * 4  # what keeping them all would cost
    assert peaks[1] <= 1.10 * peaks[0], peaks
    assert kept_activations > 0.5 * peaks[0]  # so the 10% bound would catch a leak


def test_collect_errors_say_what_to_fix(tmp_path):
    path, _, _ = tiny_mlp(tmp_path / "mlp.onnx")
    with pytest.raises(InputError, match="tensors not in mlp.onnx: nope"):
        collect_ranges(path, batches(8), ["h", "nope"], progress=False)
    with pytest.raises(InputError, match="lacks model inputs x"):
        collect_ranges(path, [{"input_ids": np.zeros((1, 4))}], ["h"], progress=False)
    with pytest.raises(InputError, match="no calibration batches"):
        collect_ranges(path, [], ["h"], progress=False)
    with pytest.raises(InputError, match="not found"):
        collect_ranges(tmp_path / "missing.onnx", batches(8), ["h"], progress=False)


# --- TensorRT calibration cache ----------------------------------------------------------------

def test_cache_round_trip_keeps_float32_scales(tmp_path):
    amax = {"x": 3.7, "/encoder/layer.0/Add_output_0": 12.25, "(Unnamed Layer* 64) [Shuffle]_output": ZERO_AMAX}
    scales = scales_from_ranges(amax)
    path = write_cache(tmp_path / "m.calib", scales, cache_version_tag(10, 1, 0))
    assert path.read_text().splitlines()[0] == "TRT-100100-EntropyCalibration2"
    assert read_cache(path) == {n: float(np.float32(s)) for n, s in scales.items()}


def test_cache_line_is_big_endian_float32_bits(tmp_path):
    # 1/127 = 1.007874 * 2**-7: exponent 120 (0x3c0...), mantissa 0.007874 * 2**23 = 0x010204.
    path = write_cache(tmp_path / "c", {"input": 1 / 127, "h": 2.5 / 127}, "8601")
    assert path.read_text() == ("TRT-8601-EntropyCalibration2\ninput: 3c010204\n"
                                f"h: {struct.pack('>f', 2.5 / 127).hex()}\n")


def test_reads_cache_lines_as_tensorrt_writes_them(tmp_path):
    path = tmp_path / "trt.cache"
    path.write_text("TRT-8401-EntropyCalibration2\ninput: 3c010204\n366: 0\n"
                    "(Unnamed Layer* 64) [Shuffle]_output: 4000889d\nx:0: 3c010204\n")
    scales = read_cache(path)
    assert scales["input"] == float(np.float32(1 / 127))
    assert scales["366"] == 0.0
    assert scales["(Unnamed Layer* 64) [Shuffle]_output"] == pytest.approx(2.008338, abs=1e-6)
    assert scales["x:0"] == scales["input"]


@pytest.mark.parametrize("text, match", [
    ("x: 3c010204\n", "not a TensorRT calibration cache"),
    ("", "not a TensorRT calibration cache"),
    ("TRT-8601-EntropyCalibration2\nx 3c010204\n", r"c:2: malformed line"),
    ("TRT-8601-EntropyCalibration2\nx: 3c01020z\n", "malformed line"),
    ("TRT-8601-EntropyCalibration2\nx: 3c0102040\n", "malformed line"),
    ("TRT-8601-EntropyCalibration2\n: 3c010204\n", "malformed line"),
    ("TRT-8601-EntropyCalibration2\nx: 3c010204\nx: 3c010204\n", "appears twice"),
])
def test_malformed_cache_is_an_input_error(tmp_path, text, match):
    path = tmp_path / "c"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        read_cache(path)


def test_write_cache_rejects_bad_scales_and_tags(tmp_path):
    with pytest.raises(InputError, match="finite"):
        write_cache(tmp_path / "c", {"x": float("nan")}, "100100")
    with pytest.raises(InputError, match="version tag"):
        write_cache(tmp_path / "c", {"x": 0.1}, "10.1")
    assert not (tmp_path / "c").exists()


def test_cache_version_tag_follows_nv_tensorrt_version():
    assert cache_version_tag(10, 1, 0) == "100100"
    assert cache_version_tag(10, 14, 1) == "101401"
    assert cache_version_tag(8, 6, 1) == "8601"


def test_legacy_calibrator_is_only_offered_where_tensorrt_has_it(tmp_path):
    from trt_seer.engine import trt
    from trt_seer.errors import UnsupportedError
    from trt_seer.quantize.legacy_calibrator import entropy_calibrator

    if not trt.available():
        pytest.skip("no TensorRT flavor importable")
    flavor = trt.load()
    if flavor.has_implicit_int8:  # TensorRT <= 10: a real calibrator serving our cache
        cache = write_cache(tmp_path / "c.cache", {"x": 0.5}, "100100")
        calibrator = entropy_calibrator(flavor, cache)
        assert calibrator.read_calibration_cache() == cache.read_bytes()
    else:
        with pytest.raises(UnsupportedError, match="no implicit INT8 calibrator"):
            entropy_calibrator(flavor, tmp_path / "c.cache")
