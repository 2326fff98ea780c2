"""Next-token choice (runtime/sampling.py): the partial sort draws the token a full float64 sort of
the vocabulary draws for the same uniform number, a seed reproduces itself, top-k 1 is greedy and
top-k / top-p keep to their candidates. Speed: tools/bench_sampling.py."""
from __future__ import annotations

import numpy as np
import pytest

from trt_seer.runtime.generate import Sampling
from trt_seer.runtime.sampling import choose


def full_sort_choose(logits, sampling, rng):
    """The previous choice: the whole vocabulary sorted per row in float64."""
    scores = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = np.partition(scores, -sampling.top_k, axis=-1)[:, -sampling.top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    order = np.argsort(-scores, axis=-1, kind="stable")
    probs = np.take_along_axis(scores, order, axis=-1)
    probs = np.exp(probs - probs[:, :1])
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1:
        before = np.cumsum(probs, axis=-1) - probs
        probs = np.where(before < sampling.top_p, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((len(scores), 1)) * cdf[:, -1:]
    picked = np.minimum((cdf <= u).sum(axis=-1), scores.shape[-1] - 1)
    return order[np.arange(len(scores)), picked].astype(np.int64)


def lm_like_logits(rng, batch, vocab, spread):
    """Logits with a few strong candidates over a flat tail, as a trained LM gives (spread 0: flat)."""
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    logits[:, rng.integers(0, vocab, 8)] += spread * rng.random((batch, 8)).astype(np.float32)
    return logits


@pytest.mark.parametrize("spread", [0.0, 6.0, 15.0, 40.0])  # flat (binned) .. peaked (near head)
@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                dict(temperature=1.3, top_k=40), dict(temperature=1.0, top_k=50, top_p=0.8),
                                dict(temperature=0.5, top_p=0.5)])
def test_partial_sort_draws_the_full_sorts_token(kw, spread):
    """Same uniform numbers, same tokens, over 8 x 20 draws on a 32k vocabulary (float32 rounding
    may move a boundary between two tokens: at most one draw in a hundred)."""
    rng = np.random.default_rng(int(spread) + len(kw))
    sampling = Sampling(**kw)
    got, want = [], []
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(20):
        logits = lm_like_logits(rng, 8, 32000, spread)
        got.append(choose(logits, sampling, a))
        want.append(full_sort_choose(logits, sampling, b))
    same = np.mean(np.concatenate(got) == np.concatenate(want))
    assert same >= 0.99, f"{same:.3f} of draws agree"


def test_a_seed_reproduces_itself_and_top_k_1_is_greedy():
    logits = lm_like_logits(np.random.default_rng(0), 8, 32000, 4.0)
    hot = Sampling(temperature=2.0, top_p=0.95)
    a = [choose(logits, hot, rng) for rng in [np.random.default_rng(7)] * 6]
    b = [choose(logits, hot, rng) for rng in [np.random.default_rng(7)] * 6]
    c = [choose(logits, hot, rng) for rng in [np.random.default_rng(8)] * 6]
    assert all((x == y).all() for x, y in zip(a, b))
    assert not all((x == y).all() for x, y in zip(a, c))
    greedy = choose(logits, Sampling(), None)
    assert (greedy == logits.argmax(-1)).all()
    assert (choose(logits, Sampling(temperature=5.0, top_k=1), np.random.default_rng(3)) == greedy).all()


def test_top_p_keeps_the_smallest_head_that_reaches_its_mass():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]], np.float32))
    rng = np.random.default_rng(0)
    seen = {tuple(choose(logits, Sampling(temperature=1.0, top_p=0.75), rng)) for _ in range(400)}
    assert {row0 for row0, _ in seen} == {0, 1} and {row1 for _, row1 in seen} == {3, 2}
    ties = np.zeros((1, 100), np.float32)  # all equal: top-k keeps the lowest ids
    assert set(np.concatenate([choose(ties, Sampling(temperature=1.0, top_k=3), rng) for _ in range(200)])) \
        == {0, 1, 2}


def test_flat_distribution_grows_the_candidates_to_the_whole_vocabulary():
    """Nearly uniform logits: the top-p head is most of the vocabulary, sampled over all of it."""
    logits = np.zeros((4, 5000), np.float32)
    rng = np.random.default_rng(1)
    picks = np.concatenate([choose(logits, Sampling(temperature=1.0, top_p=0.99), rng) for _ in range(50)])
    assert picks.max() > 4000 and len(set(picks)) > 150
