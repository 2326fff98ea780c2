"""Activation-aware weight scales (AWQ) for INT4 weight-only GEMMs.

    stats = activation_stats(Path("m.fp32.onnx"), batches, ["/model/layers.0/mlp/Mul_output_0"])
    choice = search(stats[name], [w_up, w_gate], WeightOnlySpec(bits=4))
    choice.alpha, choice.s, choice.error, choice.rtn_error

A few input channels of a GEMM carry much larger activations than the rest; rounding errors in
their weight rows cost the most. With s_j = mean|x_j|^alpha, the GEMM computes (x / s) @ Q(s W):
exact in real arithmetic, but the salient rows are scaled up before rounding, so their relative
rounding error shrinks. Per activation (the GEMMs that read it share one s, so 1/s can be folded
into the op before them), alpha is searched on a grid and the one with the smallest output error
on calibration activations wins; alpha 0 is plain round-to-nearest, so the chosen scales are never
worse than RTN on that objective. (Lin et al., "AWQ", 2023; no weight clipping search here.)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.quantize.weightonly import WeightOnlySpec, fake_quant

ALPHAS = tuple(i / 10 for i in range(11))
MAX_ROWS = 512  # calibration token rows kept per activation for the error objective
S_MIN, S_MAX = 1e-4, 1e4


@dataclass(frozen=True)
class ActStats:
    """Per input channel mean |x| over calibration tokens, and a sample of token rows."""

    mean_abs: np.ndarray  # (K,)
    sample: np.ndarray  # (rows, K) float32


@dataclass(frozen=True)
class Choice:
    alpha: float
    s: np.ndarray  # (K,)
    error: float  # sum of squared output errors with s
    rtn_error: float  # the same with s = 1 (round-to-nearest)
    ref_energy: float  # sum of squared reference outputs, for relative errors


def _tokens(value: np.ndarray, feed: dict) -> np.ndarray:
    """(tokens, K) rows of an activation, padding positions dropped when the mask lines up."""
    mask = feed.get("attention_mask")
    if value.ndim == 3 and mask is not None and mask.shape == value.shape[:2]:
        return value[mask.astype(bool)]
    return value.reshape(-1, value.shape[-1])


def activation_stats(onnx_path: Path, batches: list[dict], tensors: list[str], max_rows: int = MAX_ROWS,
                     seed: int = 0) -> dict[str, ActStats]:
    """Mean |x| per channel and a random sample of token rows for each tensor (ONNX Runtime, CPU)."""
    from trt_seer.quantize import calibrate

    rng = np.random.default_rng(seed)
    per_batch = -(-max_rows // max(1, len(batches)))
    sums, counts, samples = {}, {}, {t: [] for t in tensors}
    for feed, values in calibrate.tensor_batches(onnx_path, batches, tensors, desc="activation statistics"):
        for t, v in values.items():
            rows = _tokens(np.asarray(v, dtype=np.float32), feed)
            sums[t] = sums.get(t, 0.0) + np.abs(rows).sum(axis=0)
            counts[t] = counts.get(t, 0) + rows.shape[0]
            pick = rng.choice(rows.shape[0], size=min(per_batch, rows.shape[0]), replace=False)
            samples[t].append(rows[pick])
    return {t: ActStats(sums[t] / max(counts[t], 1), np.concatenate(samples[t])[:max_rows]) for t in tensors}


def scales_for(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """s = mean|x|^alpha, normalised so that max(s) * min(s) = 1 (as AWQ does), clipped."""
    s = np.maximum(mean_abs.astype(np.float64), 1e-6) ** alpha
    s = s / np.sqrt(s.max() * s.min())
    return np.clip(s, S_MIN, S_MAX).astype(np.float32)


def output_error(x: np.ndarray, weights: list[np.ndarray], s: np.ndarray, spec: WeightOnlySpec) -> float:
    """sum ||x W - (x / s) Q(s W)||^2 over the GEMMs reading x."""
    xs = x / s
    err = 0.0
    for w in weights:
        d = x @ w - xs @ fake_quant(w * s[:, None], spec.bits, spec.block_size)
        err += float(np.sum(d.astype(np.float64) ** 2))
    return err


def search(stats: ActStats, weights: list[np.ndarray], spec: WeightOnlySpec, alphas=ALPHAS) -> Choice:
    """The alpha (and its s) minimising the output error of the GEMMs that read one activation.
    Ties go to the smaller alpha, so s = 1 (RTN) unless scaling helps."""
    x = stats.sample
    ref = sum(float(np.sum((x @ w).astype(np.float64) ** 2)) for w in weights)
    rtn = output_error(x, weights, np.ones(x.shape[1], np.float32), spec)
    best = Choice(0.0, np.ones(x.shape[1], np.float32), rtn, rtn, ref)
    for a in alphas:
        if a == 0:
            continue
        s = scales_for(stats.mean_abs, a)
        err = output_error(x, weights, s, spec)
        if err < best.error:
            best = Choice(a, s, err, rtn, ref)
    return best
