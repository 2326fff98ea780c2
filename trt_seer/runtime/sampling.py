"""Next-token choice on the host: greedy, or seeded sampling with temperature, top-k and top-p.

    from trt_seer.runtime.sampling import choose
    tokens = choose(logits, Sampling(temperature=0.8, top_p=0.9, seed=0), rng)   # (batch,) int64

Each sampled step draws `DRAWS` uniform numbers per row from `rng`, whatever happens next, so a seed
gives the same tokens on every path. No row's vocabulary is sorted. Temperature and top-p, per row:
- candidate j is the token where the running probability over the vocabulary, in id order, first
  exceeds u_j (inverse-CDF sampling, no sort);
- the first candidate inside the nucleus (the likeliest tokens holding top_p of the mass: a token
  is in it when the tokens likelier than it hold less than top_p) is the token;
- when none of the `DRAWS` is (probability at most (1 - top_p) ** DRAWS), the token is drawn by the
  same inverse CDF over the nucleus alone, at u_0.
That is exact top-p sampling (rejection: each candidate is a draw from the whole distribution, kept
when it falls in the nucleus), at the cost of a few passes over the vocabulary: the weights, their
block sums, and one comparison per candidate. Where the package was built with a C compiler the
draws (top-k's too) run in compiled loops (runtime/_nucleus.c, row by row, the row's work kept in
cache; tokens equal up to float32 rounding); else, and for rows they leave (a NaN or +inf logit,
none above -inf, or no candidate inside), in numpy over the batch. The device sampler (export/sampler.py) draws the same
token for the same numbers, up to float32 rounding. With top-k, the tokens at or above the k-th
highest block maximum (about k) are the only ones sorted; the k likeliest of them (ties: lower id)
are drawn by inverse CDF, likeliest first, at u_0.
"""
from __future__ import annotations

import functools
import logging
import threading

import numpy as np

log = logging.getLogger(__name__)

try:
    from trt_seer.runtime import _nucleus  # setup.py's optional extension
except ImportError as e:  # an install without a C compiler: numpy draws, the same tokens, slower
    _nucleus, _missing = None, e

LOG2E = np.log2(np.e)  # exp(x) = exp2(x * LOG2E)
DRAWS = 8  # uniform numbers per row per step: the candidates before the exact fallback
BLOCK = 256  # tokens per block of the inverse CDF: a search over block sums, then a running sum inside one block
_scratch = threading.local()  # per thread: the last shape's work arrays (a new 1 MB array per step faults its pages in)


def _buffer(name: str, shape: tuple, dtype=np.float32) -> np.ndarray:
    """A work array of this thread, reused while the shape stays (contents undefined)."""
    buf = getattr(_scratch, name, None)
    if buf is None or buf.shape != shape:
        buf = np.empty(shape, dtype)
        setattr(_scratch, name, buf)
    return buf


def choose(logits: np.ndarray, sampling, rng: np.random.Generator) -> np.ndarray:
    """Next token per row (batch,) int64 from logits (batch, vocab); `sampling` has temperature,
    top_k and top_p (runtime.generate.Sampling). `DRAWS` uniform numbers per row from `rng` when sampling."""
    if sampling.temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    logits = np.asarray(logits, dtype=np.float32)  # (batch, vocab)
    u = draws(rng, len(logits))
    inverse = np.float32(1 / sampling.temperature)
    if 0 < sampling.top_k < logits.shape[-1]:
        return top_k_draw(logits, inverse, sampling.top_k, sampling.top_p, u[:, 0])
    return nucleus_draw(logits, inverse, sampling.top_p, u)


def compiled() -> bool:
    """Whether this install draws in runtime/_nucleus.c's compiled loops (else numpy)."""
    return _nucleus is not None


def draws(rng: np.random.Generator, batch: int) -> np.ndarray:
    """One step's uniform numbers (batch, DRAWS) float32 in [0, 1)."""
    return rng.random((batch, DRAWS), dtype=np.float32)


def nucleus_draw(logits: np.ndarray, inverse: np.float32, top_p: float, u: np.ndarray) -> np.ndarray:
    """The module docstring's draw: (batch,) int64 from logits (batch, vocab) float32 and u (batch, DRAWS)."""
    scale = float(inverse) * LOG2E
    if _nucleus is None:
        _say_numpy_once()
        return numpy_draw(logits, inverse, top_p, u)
    if not np.isfinite(scale):  # a temperature below ~1e-38: numpy's shifted weights
        return numpy_draw(logits, inverse, top_p, u)
    logits, u = np.ascontiguousarray(logits, np.float32), np.ascontiguousarray(u, np.float32)
    out = np.empty(len(logits), np.int64)
    vocab = logits.shape[1]
    _nucleus.draw(logits, u, scale, float(top_p), _buffer("row", (vocab,)),
                  _buffer("cum", (-(-vocab // BLOCK),), np.float64), out)
    left = np.flatnonzero(out < 0)  # rare: no candidate inside the nucleus, or logits not finite
    if len(left):
        out[left] = numpy_draw(logits[left], inverse, top_p, u[left])
    return out


@functools.cache  # once per process
def _say_numpy_once() -> None:
    log.info("sampling draws in numpy, about 3x slower per step than the compiled draw: trt_seer was installed "
             "without its C extension (%s); reinstall with a C compiler and Python's headers", _missing)


def numpy_draw(logits: np.ndarray, inverse: np.float32, top_p: float, u: np.ndarray) -> np.ndarray:
    """`nucleus_draw` in numpy over the whole batch: a few passes over the vocabulary per step."""
    batch, vocab = logits.shape
    if not batch:
        return np.empty(0, np.int64)
    e, cum = _weights(logits, inverse)  # (batch, blocks * BLOCK) float32, (batch, blocks) float64
    total = cum[:, -1]
    out = np.empty(batch, np.int64)
    none = ~(total > 0)  # no logit above -inf (or all NaN): the token greedy decoding takes
    out[none] = np.argmax(logits[none], axis=-1)
    rows = np.flatnonzero(~none)
    for j in range(u.shape[1]):
        token = _invert(e, cum, rows, u[rows, j] * total[rows], vocab)
        if top_p >= 1:
            out[rows] = token
            return out
        inside = _likelier_mass(e, rows, token) < top_p * total[rows]
        out[rows[inside]] = token[inside]
        rows = rows[~inside]
        if not len(rows):
            return out
    for r in rows:  # rare: every candidate fell outside the nucleus
        out[r] = _nucleus_only(e[r, :vocab], top_p, u[r, 0])
    return out


def _weights(logits: np.ndarray, inverse: np.float32):
    """exp(logit / T) per row, zero-padded to whole blocks, and the running sum of the block sums.
    No shift by the row's best: exp2 of logit * log2(e) / T while every row's weights stay well
    inside float32 (its total in [2^-60, 2^100]: tokens lost below 2^-149 then weigh under 2^-50
    of the best), which saves two passes; rows outside that are shifted by their best (a rare pass)."""
    batch, vocab = logits.shape
    blocks = -(-vocab // BLOCK)
    e = _buffer("weights", (batch, blocks * BLOCK))
    e[:, vocab:] = 0
    z = e[:, :vocab]
    scale = np.float32(inverse * np.float32(LOG2E))
    np.multiply(logits, scale, out=z)
    with np.errstate(over="ignore"):  # an overflowed row is caught by its total below
        np.exp2(z, out=z)  # numpy's float32 exp2 is vectorized where its exp may not be (2x on AVX2)
        sums = _block_sums(e)
    far = ~((sums[:, -1] >= 2.0 ** -60) & (sums[:, -1] <= 2.0 ** 100))  # also NaN: an overflowed block
    if far.any():
        e[far, :vocab] = np.exp2(_shifted(logits[far]) * scale)
        sums[far] = _block_sums(e[far])
    return e, sums


def _shifted(rows: np.ndarray) -> np.ndarray:
    """Rows less their best logit. A NaN logit is never drawn (-inf); where a row has +inf logits,
    those alone are (0, the rest -inf); a row with nothing above -inf is NaN throughout."""
    rows = np.where(np.isnan(rows), -np.inf, rows)
    best = rows.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # -inf less -inf: NaN, as the docstring says
        return np.where(best == np.inf, np.where(rows == np.inf, 0.0, -np.inf), rows - best).astype(np.float32)


def _block_sums(e: np.ndarray) -> np.ndarray:
    """The running sum (float64) of each row's block sums: (batch, blocks) from (batch, blocks * BLOCK)."""
    sums = e.reshape(-1, BLOCK) @ np.ones(BLOCK, np.float32)  # a matrix-vector product: fast
    return np.cumsum(sums.reshape(len(e), -1), axis=-1, dtype=np.float64)


def _invert(e: np.ndarray, cum: np.ndarray, rows: np.ndarray, target: np.ndarray, vocab: int) -> np.ndarray:
    """Per row of `rows`, the first token whose running weight (id order) exceeds `target`."""
    blocks = cum.shape[1]
    b = np.minimum((cum[rows] <= target[:, None]).sum(axis=-1), blocks - 1)
    base = np.where(b > 0, cum[rows, np.maximum(b - 1, 0)], 0.0)
    block = e.reshape(len(e), blocks, BLOCK)[rows, b]
    inside = np.cumsum(block, axis=-1, dtype=np.float64)
    last = BLOCK - 1 - np.argmax(block[:, ::-1] > 0, axis=-1)  # where float rounding leaves the target past the
    i = np.minimum((inside <= (target - base)[:, None]).sum(axis=-1), last)  # block's running sum: its last weighed token
    return np.minimum(b * BLOCK + i, vocab - 1)


def _likelier_mass(e: np.ndarray, rows: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Per row, the weight of the tokens strictly likelier than `token` (one comparison pass; row by
    row into one row's buffer, which stays in cache, rather than a second array of the batch's size)."""
    above = _buffer("above", e.shape[1:])
    mass = np.empty(len(rows), np.float64)
    for i, (r, t) in enumerate(zip(rows, token)):
        np.greater(e[r], e[r, t], out=above, casting="unsafe")  # 1.0 where likelier: the mass is then a dot product
        mass[i] = np.dot(e[r], above)
    return mass


def _nucleus_only(e: np.ndarray, top_p: float, u: float) -> int:
    """Inverse CDF in id order over the nucleus of one row's weights `e` (sorted once)."""
    values = np.sort(e)[::-1]
    before = np.cumsum(values, dtype=np.float64) - values  # weight of the tokens before, in sorted order
    first = np.searchsorted(-values, -values, side="left")  # a tie's first place: weight strictly likelier
    cut = values[before[first] < top_p * values.sum(dtype=np.float64)].min()
    kept = np.where(e >= cut, e, np.float32(0))
    cum = np.cumsum(kept, dtype=np.float64)
    return int(min(int((cum <= u * cum[-1]).sum()), len(e) - 1))


def top_k_draw(logits: np.ndarray, inverse: np.float32, k: int, top_p: float, u0: np.ndarray) -> np.ndarray:
    """The module docstring's top-k draw: (batch,) int64 from logits (batch, vocab) and u0 (batch,);
    compiled where the extension is; rows with a NaN or +inf score or none above -inf (and installs
    without the extension) in numpy."""
    logits = np.ascontiguousarray(logits, np.float32)
    if _nucleus is None:
        _say_numpy_once()
        return _top_k(_scores(logits, inverse), k, top_p, u0)
    u0 = np.ascontiguousarray(u0, np.float32)
    out = np.empty(len(logits), np.int64)
    vocab = logits.shape[1]
    _nucleus.top_k(logits, u0, float(inverse), int(k), float(top_p), _buffer("scaled", (vocab,)),
                   _buffer("maxima", (vocab,)), _buffer("candidates", (vocab,), np.float64), out)
    left = np.flatnonzero(out < 0)
    if len(left):
        out[left] = _top_k(_scores(logits[left], inverse), k, top_p, u0[left])
    return out


def _scores(logits: np.ndarray, inverse: np.float32) -> np.ndarray:
    with np.errstate(over="ignore"):  # a logit past float32 once scaled: +inf, which _top_k takes
        return logits * inverse


def _top_k(scores: np.ndarray, k: int, top_p: float, u: np.ndarray) -> np.ndarray:
    """The k likeliest per row, sorted; probabilities over the k; top-p within them."""
    if not len(scores):
        return np.empty(0, np.int64)
    ids, head = _likeliest(scores, k)
    probs = np.exp(_shifted(head))  # head - its first; +inf scores alone drawn where there are some
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    cdf /= cdf[:, -1:]
    if top_p < 1:  # the smallest head whose mass reaches top_p; the first always kept
        cdf = np.cumsum(np.where(cdf - probs / probs.sum(-1, keepdims=True) < top_p, probs, 0), -1, np.float64)
        cdf /= cdf[:, -1:]
    picked = np.minimum((cdf <= u[:, None]).sum(axis=-1), ids.shape[-1] - 1)
    return ids[np.arange(len(ids)), picked].astype(np.int64)


def _likeliest(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the k highest scores, highest first (ties: the lower id first), and their ids.
    The k-th highest block maximum (blocks of BLOCK tokens) bounds the k-th highest score from
    below, so only the tokens at or above it (about k) are sorted: no partition of the vocabulary
    (numpy's took 0.3 ms per 32k-token row). NaN scores rank below every other."""
    batch, vocab = scores.shape
    blocks = vocab // BLOCK
    if blocks >= k:
        best = scores[:, :blocks * BLOCK].reshape(batch, blocks, BLOCK).max(axis=-1)
        bound = np.partition(best, blocks - k, axis=-1)[:, blocks - k]
    else:  # too few blocks for the bound: the k-th highest score itself
        bound = np.partition(scores, vocab - k, axis=-1)[:, vocab - k]
    rows, cols = np.divmod(np.flatnonzero(scores >= bound[:, None]), vocab)  # at least k per row (2-D nonzero: 20x slower)
    if (np.bincount(rows, minlength=batch) < k).any():  # only where NaN took part in the bound
        return _likeliest(np.where(np.isnan(scores), -np.inf, scores), k)
    values = scores[rows, cols]
    order = np.lexsort((cols, -values, rows))  # by row, then highest score, then lowest id
    first = np.searchsorted(rows[order], np.arange(batch))
    take = order[first[:, None] + np.arange(k)]
    return cols[take], values[take]
