"""Next-token choice on the host: greedy, or seeded sampling with temperature, top-k and top-p.

    from trt_seer.runtime.sampling import choose
    tokens = choose(logits, Sampling(temperature=0.8, top_p=0.9, seed=0), rng)   # (batch,) int64

No row's vocabulary is sorted. Sampling draws the token that inverse-CDF sampling over the
vocabulary sorted likeliest first (ties by lower id) would draw for the same uniform number, so a
seed gives the tokens a full sort gives, except where float32 rounding moves a boundary between two
tokens. How, per row, in float32 (masses in float64):
- without top-k, when the tokens within `NEAR` of the best score are few (`NEAR_MAX`) and hold the
  mass needed (top-p, or the drawn quantile), only those are sorted: the usual case for a trained LM.
- else each token's distance below the row's best score goes into one of `BINS` equal
  bins over the row's range of scores (at most `SPAN` wide; bin order is sorted order). One weighted
  `bincount` gives each bin's mass; the bin where the cumulative mass crosses top-p (then the drawn
  quantile) is the only one sorted: about vocab / BINS tokens, even for a nearly flat distribution.
- with top-k: `np.argpartition` keeps the k likeliest, and only those are sorted.
"""
from __future__ import annotations

import numpy as np

BINS, SPAN = 512, 32.0  # scores more than SPAN below the best share the last bin (mass < 1e-13)
NEAR = np.float32(8.0)  # the first candidates: scores within NEAR of the best (probability ratio > 3e-4)
NEAR_MAX = 2048  # ... when there are at most this many (else the bins)


def choose(logits: np.ndarray, sampling, rng: np.random.Generator) -> np.ndarray:
    """Next token per row (batch,) int64 from logits (batch, vocab); `sampling` has temperature,
    top_k and top_p (runtime.generate.Sampling). One uniform draw per row from `rng` when sampling."""
    if sampling.temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    logits = np.asarray(logits, dtype=np.float32)  # (batch, vocab)
    u = rng.random(len(logits))  # drawn first: the same numbers whatever path the rows take
    inverse = np.float32(1 / sampling.temperature)
    if 0 < sampling.top_k < logits.shape[-1]:
        return _top_k(logits * inverse, sampling.top_k, sampling.top_p, u)
    # distance below the row's best score (>= 0); in place: each pass over the vocabulary counts
    below = np.subtract(logits.max(axis=-1, keepdims=True), logits)
    below *= inverse
    probs = np.negative(below)
    np.exp(probs, out=probs)  # unnormalized
    total = probs.sum(axis=-1, dtype=np.float64)  # (batch,)
    near = below < NEAR  # (batch, vocab): a prefix of each row's sorted order
    few = np.count_nonzero(near, axis=-1) <= NEAR_MAX
    out = np.empty(len(logits), np.int64)
    binned = []
    for r in range(len(logits)):
        token = _draw_near(np.flatnonzero(near[r]), below[r], probs[r], total[r], sampling.top_p, u[r]) \
            if few[r] else None
        if token is None:
            binned.append(r)
        else:
            out[r] = token
    if binned:  # rows whose head is wide: bins over each row's range of scores
        span = np.clip(below[binned].max(axis=-1, keepdims=True), np.float32(1e-6), np.float32(SPAN))
        bins = np.multiply(below[binned], np.float32(BINS) / span)
        np.minimum(bins, np.float32(BINS - 1), out=bins)
        bins = bins.astype(np.int32)  # int32 converts several times faster than int64
        for i, r in enumerate(binned):
            out[r] = _draw_binned(below[r], bins[i], probs[r], sampling.top_p, u[r])
    return out


def _draw_near(ids, below, probs, total: float, top_p: float, u: float) -> int | None:
    """The token among `ids` (the tokens nearest the best, ascending), or None when they do not hold
    the mass the draw needs. Kept mass: all, or the smallest head reaching top_p; then the token where
    the running mass first exceeds u times it."""
    need = top_p * total if top_p < 1 else u * total
    mass = probs[ids].sum(dtype=np.float64)
    if not (mass > need or (top_p < 1 and mass >= need)):
        return None
    ids = ids[np.argsort(below[ids], kind="stable")]  # ids ascending already: ties by lower id
    cum = np.cumsum(probs[ids], dtype=np.float64)
    kept = total if top_p == 1 else cum[min(int((cum < need).sum()), len(cum) - 1)]
    return int(ids[min(int((cum <= u * kept).sum()), len(ids) - 1)])


def _draw_binned(below, bins, probs, top_p: float, u: float) -> int:
    """As `_draw_near`, over the bins: only the bin where the running mass crosses is sorted."""
    cum = np.cumsum(np.bincount(bins, probs, BINS))  # (BINS,) float64, likeliest bins first
    kept = cum[-1]
    if top_p < 1:  # the head ends at the first token whose running mass reaches top_p
        ids, before, inside = _crossing(below, bins, probs, cum, top_p * cum[-1], strict=False)
        kept = before + inside[min(int((inside < top_p * cum[-1] - before).sum()), len(inside) - 1)]
    ids, before, inside = _crossing(below, bins, probs, cum, u * kept, strict=True)
    return int(ids[min(int((before + inside <= u * kept).sum()), len(ids) - 1)])


def _crossing(below, bins, probs, cum, target: float, strict: bool):
    """The bin where the cumulative mass crosses `target` (first > target if strict, else >=): its
    ids in sorted order, the mass of the bins before it and the running mass inside it."""
    b = min(int(np.searchsorted(cum, target, side="right" if strict else "left")), len(cum) - 1)
    while not cum[b] - (cum[b - 1] if b else 0.0) and b:  # an empty bin: the crossing is in the last full one
        b -= 1
    ids = np.flatnonzero(bins == b)
    ids = ids[np.argsort(below[ids], kind="stable")]  # ids ascending already: ties by lower id
    return ids, (cum[b - 1] if b else 0.0), np.cumsum(probs[ids], dtype=np.float64)


def _top_k(scores: np.ndarray, k: int, top_p: float, u: np.ndarray) -> np.ndarray:
    """The k likeliest per row, sorted; probabilities over the k; top-p within them."""
    ids = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
    ids.sort(axis=-1)  # so that the stable sort below breaks ties by id
    head = np.take_along_axis(scores, ids, axis=-1)
    order = np.argsort(-head, axis=-1, kind="stable")
    ids, head = np.take_along_axis(ids, order, axis=-1), np.take_along_axis(head, order, axis=-1)
    probs = np.exp(head - head[:, :1])
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    cdf /= cdf[:, -1:]
    if top_p < 1:  # the smallest head whose mass reaches top_p; the first always kept
        cdf = np.cumsum(np.where(cdf - probs / probs.sum(-1, keepdims=True) < top_p, probs, 0), -1, np.float64)
        cdf /= cdf[:, -1:]
    picked = np.minimum((cdf <= u[:, None]).sum(axis=-1), ids.shape[-1] - 1)
    return ids[np.arange(len(ids)), picked].astype(np.int64)
