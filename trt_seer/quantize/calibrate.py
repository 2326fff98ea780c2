"""Batches + ONNX -> per-tensor INT8 activation ranges (amax), the way TensorRT calibrates.

    from trt_seer.quantize.calibrate import CalibSpec, collect_ranges, scales_from_ranges, write_cache
    amax = collect_ranges(Path("m.fp32.onnx"), batches, ["/encoder/layer.0/Add_output_0"])
    write_cache(Path("m.calib"), scales_from_ranges(amax), cache_version_tag(10, 1, 0))

Each tensor gets a streaming histogram of |x| in a fixed-size array (memory does not grow with
the number of batches). A threshold method turns it into amax: `entropy` is TensorRT's
EntropyCalibration2 KL search as NVIDIA's ModelOpt re-implements it (same candidates, same
bin-zero handling, same amax convention), `max` the largest |x| seen, `percentile` the smallest
bin edge that keeps the requested fraction of |x|. Scales are amax / 127. docs/DESIGN.md
("INT8 calibration: KL threshold search") has the details and how this differs from
ONNX Runtime's Entropy calibrator.
"""
from __future__ import annotations

import math
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from trt_seer.export import onnxio
from trt_seer.errors import InputError
from trt_seer.files import atomic_write_text

METHODS = ("entropy", "max", "percentile")
INT8_MAX = 127
QUANT_LEVELS = 128  # |x| is quantized to 2**7 levels; the sign is the eighth bit
START_BIN = 128  # the smallest KL candidate keeps this many bins
# amax for a tensor that was exactly zero in every batch: positive so that its scale is usable,
# and amax / 127 = 2**-14 is still a normal float16 (a Q/DQ scale may be stored in FP16).
ZERO_AMAX = INT8_MAX * 2.0**-14
CACHE_ALGORITHM = "EntropyCalibration2"


@dataclass(frozen=True)
class CalibSpec:
    """How histograms become ranges: `method` in METHODS, `percentile` in (0, 100]."""

    method: str = "entropy"
    num_bins: int = 2048
    percentile: float = 99.99

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"unknown calibration method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.num_bins <= START_BIN:
            raise InputError(f"num_bins must exceed {START_BIN} (got {self.num_bins}); the default is 2048")
        if not 0 < self.percentile <= 100:
            raise InputError(f"percentile must be in (0, 100], got {self.percentile}")


class Histogram:
    """Streaming histogram of |x| in bins of one width, in a fixed array of 2 * num_bins counts.

    The first non-zero batch sets the width to its max / num_bins. A later, larger batch adds bins
    of that width up to the array's capacity (what ModelOpt does, so its histograms match ours);
    past capacity, the width is multiplied by the smallest integer factor that fits and each run
    of `factor` bins is summed into one. Old counts stay exact, memory never grows, and the
    histogram keeps between num_bins and 2 * num_bins bins over [0, >= max |x|]. Zeros always
    land in bin 0, so batches of zeros before the first non-zero one need no width.
    """

    def __init__(self, num_bins: int = 2048):
        self.num_bins = num_bins
        self.counts = np.zeros(2 * num_bins, dtype=np.int64)  # capacity; bins in use: counts[:used]
        self.used = num_bins
        self.width = 0.0
        self.amax = 0.0  # exact largest |x| seen

    @property
    def bins(self) -> np.ndarray:
        return self.counts[: self.used]

    @property
    def upper(self) -> float:
        return self.used * self.width

    @property
    def edges(self) -> np.ndarray:
        return np.arange(self.used + 1) * self.width

    def update(self, x) -> None:
        a = np.abs(np.asarray(x, dtype=np.float32)).ravel()
        if a.size == 0:
            return
        top = float(a.max())
        if not math.isfinite(top):
            raise InputError("calibration produced inf/NaN activations; check the model and the batches")
        self.amax = max(self.amax, top)
        if top > self.upper:
            self._grow(top)
        if self.width == 0.0:
            self.counts[0] += a.size
            return
        self.counts[: self.used] += np.histogram(a, bins=self.used, range=(0.0, self.upper))[0]

    def _grow(self, top: float) -> None:
        if self.width == 0.0:  # only zeros so far; they stay in bin 0 at any width
            self.width = top / self.num_bins
            return
        capacity = self.counts.size
        factor = math.ceil(_bins_to_cover(top, self.width) / capacity)
        while _bins_to_cover(top, self.width * factor) > capacity:  # rounding guard
            factor += 1
        if factor > 1:
            merged = np.add.reduceat(self.counts[: self.used], np.arange(0, self.used, factor))
            self.counts[:] = 0
            self.counts[: merged.size] = merged
            self.width *= factor
        self.used = _bins_to_cover(top, self.width)


def _bins_to_cover(top: float, width: float) -> int:
    n = math.ceil(top / width)
    return n + 1 if n * width < top else n


def amax_from_histogram(hist: Histogram, spec: CalibSpec = CalibSpec()) -> float:
    """The clipping threshold for `hist` by `spec.method`; ZERO_AMAX when every value was 0."""
    if hist.amax == 0.0:
        return ZERO_AMAX
    if spec.method == "max":
        return hist.amax
    if spec.method == "percentile":
        edge = percentile_bin(hist.bins, spec.percentile) + 1
    else:
        edge = entropy_bin(hist.bins)
    return min(edge * hist.width, hist.amax)  # the last bin may reach past the data


def percentile_bin(counts: np.ndarray, percentile: float) -> int:
    """Index of the first bin at which the cumulative count reaches `percentile` % of the total."""
    cumulative = np.cumsum(counts)
    return int(np.searchsorted(cumulative, percentile * cumulative[-1] / 100.0))


def entropy_bin(counts: np.ndarray) -> int:
    """TensorRT's EntropyCalibration2 search: the bin count i (the threshold is the right edge of
    bin i - 1) minimising KL(P || Q), ties going to the largest i.

    P is bins [0, i) with everything above folded into bin i - 1; Q is those bins (without the
    fold) summed into QUANT_LEVELS groups, each group's sum spread evenly over its non-empty bins.
    Bin 0 first takes bin 1's count so that exact zeros (ReLU, padding) do not dominate P.
    A candidate where P has mass that Q cannot represent scores +inf (KL's value), not a smoothed one.
    """
    bins = counts.astype(np.float64)
    bins[0] = bins[1]
    above = bins.sum() - np.cumsum(bins)  # above[i - 1]: the outliers of candidate i
    positions = np.arange(bins.size) * QUANT_LEVELS
    best_i, best_kl = bins.size, math.inf
    for i in range(START_BIN, bins.size + 1):
        kl = _kl_candidate(bins[:i], positions[:i] // i, above[i - 1])
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return best_i


def _kl_candidate(kept: np.ndarray, level: np.ndarray, outliers: float) -> float:
    """KL(P || Q) for one candidate: `kept` are the bins below the threshold, `level` the
    quantization level each falls in, `outliers` the count above."""
    nonzero = kept > 0
    if outliers > 0 and not nonzero[-1]:
        return math.inf  # P's folded last bin would face an empty Q bin
    if not nonzero.any():
        return math.inf  # all mass above the threshold: Q is empty
    kept, level = kept[nonzero], level[nonzero]  # empty bins add 0 to KL and nothing to Q
    q = np.bincount(level, weights=kept, minlength=QUANT_LEVELS)[level]
    q /= np.bincount(level, minlength=QUANT_LEVELS)[level]
    p = kept.copy()
    p[-1] += outliers  # outliers > 0 only when the last kept bin is non-empty
    p /= p.sum()
    q /= q.sum()
    return float(np.sum(p * np.log(p / q)))


def collect_ranges(onnx_path: Path, batches: Iterable[Mapping[str, np.ndarray]],
                   tensor_names: list[str], spec: CalibSpec = CalibSpec(), *,
                   progress: bool = True) -> dict[str, float]:
    """Runs ONNX Runtime (CPU) over `batches` and returns {tensor name: amax}.

    Args:
        onnx_path: the FP32 (or FP16) ONNX model.
        batches: dicts of model input name -> array, consumed one at a time (a generator is fine;
            nothing is kept between batches but the histograms).
        tensor_names: graph inputs or node outputs to calibrate.
        spec: threshold method and histogram size.
        progress: show a tqdm bar over batches.
    """
    hists = {name: Histogram(spec.num_bins) for name in tensor_names}
    seen = 0
    for _, values in tensor_batches(onnx_path, batches, tensor_names, progress=progress):
        for name, value in values.items():
            hists[name].update(value)
        seen += 1
    if seen == 0:
        raise InputError("no calibration batches; pass at least one batch of model inputs")
    return {name: amax_from_histogram(h, spec) for name, h in hists.items()}


def tensor_batches(onnx_path: Path, batches: Iterable[Mapping[str, np.ndarray]], tensor_names: list[str], *,
                   progress: bool = True, desc: str = "calibrate"):
    """Yields (feed, {tensor name: value}) per batch: ONNX Runtime (CPU) on a copy of the model whose
    outputs include `tensor_names` (graph inputs are taken from the feed)."""
    from tqdm import tqdm

    with tempfile.TemporaryDirectory(prefix="trt_seer_calib_") as tmp:
        session, inputs = _session_with_outputs(Path(onnx_path), tensor_names, Path(tmp))
        outputs = [n for n in dict.fromkeys(tensor_names) if n not in inputs]
        total = len(batches) if hasattr(batches, "__len__") else None
        for batch in tqdm(batches, total=total, desc=desc, unit="batch", disable=not progress):
            feed = _feed(batch, inputs)
            values = dict(zip(outputs, session.run(outputs, feed)))
            values.update({n: feed[n] for n in tensor_names if n in feed})
            yield feed, values


def _session_with_outputs(onnx_path: Path, tensor_names: list[str], tmp: Path):
    """An ORT CPU session on a copy of the model whose outputs include `tensor_names`,
    and the model's input names."""
    import onnx

    from trt_seer.runtime.ort import create_session

    if not onnx_path.is_file():
        raise InputError(f"ONNX model not found: {onnx_path}")
    model = onnxio.load(onnx_path)
    graph = model.graph
    inputs = [v.name for v in graph.input]
    produced = {o for node in graph.node for o in node.output} | set(inputs)
    unknown = [n for n in tensor_names if n not in produced]
    if unknown:
        raise InputError(f"tensors not in {onnx_path.name}: {', '.join(unknown[:5])}; "
                         "pass graph inputs or node output names")
    existing = {v.name for v in graph.output}
    graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(tensor_names)
                        if n not in existing and n not in inputs)
    path = onnxio.save(model, tmp / "calibrate.onnx")
    del model
    session = create_session(path)
    return session, inputs


def _feed(batch: Mapping[str, np.ndarray], inputs: list[str]) -> dict[str, np.ndarray]:
    missing = [n for n in inputs if n not in batch]
    if missing:
        raise InputError(f"calibration batch lacks model inputs {', '.join(missing)}; "
                         f"it has {', '.join(batch) or 'nothing'}")
    return {n: np.asarray(batch[n]) for n in inputs}


def scales_from_ranges(amax: Mapping[str, float]) -> dict[str, float]:
    """Symmetric INT8 scales: amax / 127."""
    return {name: a / INT8_MAX for name, a in amax.items()}


def cache_version_tag(major: int, minor: int, patch: int) -> str:
    """TensorRT's NV_TENSORRT_VERSION as its caches spell it: 10.1.0 -> '100100', 8.6.1 -> '8601'."""
    if major >= 10:
        return str(major * 10000 + minor * 100 + patch)
    return str(major * 1000 + minor * 100 + patch)


def write_cache(path: Path, scales: Mapping[str, float], version_tag: str) -> Path:
    """Writes a TensorRT calibration cache: `TRT-<version>-EntropyCalibration2`, then one
    `name: <hex>` line per tensor, hex being the float32 bits of the scale (big-endian)."""
    if not re.fullmatch(r"\d+", str(version_tag)):
        raise InputError(f"malformed TensorRT version tag {version_tag!r}; use e.g. cache_version_tag(10, 1, 0)")
    lines = [f"TRT-{version_tag}-{CACHE_ALGORITHM}"]
    for name, scale in scales.items():
        if not name or "\n" in name or not (math.isfinite(scale) and scale >= 0):
            raise InputError(f"cannot write calibration scale {scale!r} for tensor {name!r}; "
                             "scales must be finite and >= 0, names one line")
        lines.append(f"{name}: {struct.pack('>f', scale).hex()}")
    return atomic_write_text(Path(path), "\n".join(lines) + "\n")


def read_cache(path: Path) -> dict[str, float]:
    """Reads a TensorRT calibration cache into {tensor name: scale}. InputError if malformed."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read calibration cache {path}: {e}") from e
    if not lines or not re.fullmatch(r"TRT-\d+-\w+", lines[0].strip()):
        raise InputError(f"{path} is not a TensorRT calibration cache (first line should be like "
                         f"TRT-100100-{CACHE_ALGORITHM}); regenerate it")
    scales = {}
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            name, scale = _parse_cache_line(line, f"{path}:{number}")
            if name in scales:
                raise InputError(f"{path}:{number}: tensor {name!r} appears twice; regenerate the cache")
            scales[name] = scale
    return scales


def _parse_cache_line(line: str, where: str) -> tuple[str, float]:
    # rpartition: tensor names may contain ':'; the value never does.
    name, sep, value = line.rstrip().rpartition(": ")
    if not sep or not name or not re.fullmatch(r"[0-9a-fA-F]{1,8}", value):
        raise InputError(f"{where}: malformed line {line!r}; expected 'tensor_name: <up to 8 hex digits>'")
    return name, struct.unpack(">f", int(value, 16).to_bytes(4, "big"))[0]
