"""Next-token choice (runtime/sampling.py): the draw equals a plain full-sort reference of the same
rule for the same uniform numbers, its tokens follow the top-p distribution, a seed reproduces itself,
top-k 1 is greedy and top-k / top-p keep to their candidates; the device sampler's graph
(export/sampler.py, run here by ONNX Runtime) draws the host's tokens. Speed: tools/bench_sampling.py."""
from __future__ import annotations

import numpy as np
import pytest

from trt_seer.runtime.generate import Sampling
from trt_seer.runtime import sampling as sampling_mod
from trt_seer.runtime.sampling import DRAWS, choose, draws, nucleus_draw, numpy_draw

COMPILED = pytest.mark.skipif(not sampling_mod.compiled(), reason="trt_seer was installed without its C extension "
                              "(runtime/_nucleus.c: no C compiler or Python headers at install): numpy draws")
DRAWERS = [pytest.param(nucleus_draw, id="compiled", marks=COMPILED), pytest.param(numpy_draw, id="numpy")]


def reference_draw(logits, temperature, top_p, u):
    """The rule, written plainly in float64 with a full sort: candidates by inverse CDF in id order,
    the first whose likelier tokens hold less than top_p, else the inverse CDF over the nucleus at u_0."""
    out = []
    for row, us in zip(logits.astype(np.float64) / temperature, u):
        p = np.exp(row - row.max())
        total = p.sum()
        likelier = np.array([p[p > x].sum() for x in p]) if len(p) <= 64 else None
        values = np.sort(p)[::-1]
        before = np.cumsum(values) - values
        first = np.searchsorted(-values, -values, side="left")
        cut = values[before[first] < top_p * total].min() if top_p < 1 else 0.0
        if likelier is not None:  # small rows: the definition itself
            assert np.array_equal(likelier < top_p * total, p >= cut) or top_p >= 1
        cdf = np.cumsum(p)
        token = None
        for uj in us:
            x = min(int((cdf <= uj * total).sum()), len(p) - 1)
            if p[x] >= cut:
                token = x
                break
        if token is None:
            kept = np.cumsum(np.where(p >= cut, p, 0.0))
            token = min(int((kept <= us[0] * kept[-1]).sum()), len(p) - 1)
        out.append(token)
    return np.array(out)


def lm_like_logits(rng, batch, vocab, spread):
    """Logits with a few strong candidates over a flat tail, as a trained LM gives (spread 0: flat)."""
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    logits[:, rng.integers(0, vocab, 8)] += spread * rng.random((batch, 8)).astype(np.float32)
    return logits


@pytest.mark.parametrize("draw", DRAWERS)
@pytest.mark.parametrize("spread", [0.0, 6.0, 15.0, 40.0])  # flat .. peaked
@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                dict(temperature=0.5, top_p=0.5), dict(temperature=1.2, top_p=0.05)])
def test_the_draw_is_the_full_sort_references_for_the_same_numbers(kw, spread, draw):
    """Same uniform numbers, same tokens, over 8 x 10 draws on a 32k vocabulary (float32 rounding
    may move a boundary between two tokens: at most one draw in a hundred). top_p 0.05 on flat
    logits sends most rows through the exact fallback (no candidate in the nucleus)."""
    rng, uniforms = np.random.default_rng(int(spread) + len(kw)), np.random.default_rng(5)
    sampling = Sampling(**kw)
    got, want = [], []
    for _ in range(10):
        logits = lm_like_logits(rng, 8, 32000, spread)
        u = draws(uniforms, 8)
        got.append(draw(logits, np.float32(1 / sampling.temperature), sampling.top_p, u))
        want.append(reference_draw(logits, sampling.temperature, sampling.top_p, u))
    same = np.mean(np.concatenate(got) == np.concatenate(want))
    assert same >= 0.99, f"{same:.3f} of draws agree"


@COMPILED
@pytest.mark.parametrize("vocab", [32000, 5000, 32064, 100])  # whole blocks of 256, a remainder, less than one
def test_the_compiled_draw_gives_numpys_tokens(vocab):
    """runtime/_nucleus.c against the numpy draw, same numbers: the same token but where float32
    rounding moves a boundary (at most one draw in a hundred), on flat to peaked logits."""
    rng = np.random.default_rng(vocab)
    got, want = [], []
    for spread in (0.0, 4.0, 12.0, 30.0):
        for temperature, top_p in [(0.8, 0.9), (1.0, 1.0), (0.5, 0.3)]:
            logits = lm_like_logits(rng, 16, vocab, spread)
            u = draws(rng, 16)
            got.append(nucleus_draw(logits, np.float32(1 / temperature), top_p, u))
            want.append(numpy_draw(logits, np.float32(1 / temperature), top_p, u))
    same = np.mean(np.concatenate(got) == np.concatenate(want))
    assert same >= 0.99, f"{same:.3f} of draws agree"


@COMPILED
def test_rows_the_compiled_draw_leaves_go_to_numpy():
    """The C loop marks a row with a NaN or +inf logit, or none above -inf, -2 and a row where no
    candidate fell inside the nucleus -1; nucleus_draw gives both to the numpy draw, whose tokens
    they then are: a NaN logit is never drawn, +inf logits are the only ones drawn, a row of -inf
    gives greedy's token. A -inf logit weighs nothing on both paths. Bad arrays are refused with
    the argument's name."""
    rng = np.random.default_rng(4)
    logits = lm_like_logits(rng, 7, 3000, 0.0)
    logits[1, :] = 5.0
    logits[1, 7], logits[2, 9], logits[6] = np.nan, np.inf, -np.inf
    u = draws(rng, 7)
    u[3] = 0.999  # flat logits, top_p 0.05: every candidate at the top of the CDF, outside a tiny nucleus
    out = np.empty(7, np.int64)
    work, cum = np.empty(3000, np.float32), np.empty(12, np.float64)
    extension = pytest.importorskip("trt_seer.runtime._nucleus")
    extension.draw(logits, u, sampling_mod.LOG2E, 0.05, work, cum, out)
    assert list(out[[1, 2, 3, 6]]) == [-2, -2, -1, -2] and (out[[0, 4, 5]] >= -1).all()
    tokens = nucleus_draw(logits, np.float32(1.0), 0.05, u)
    assert (tokens[[1, 2, 3, 6]] == numpy_draw(logits[[1, 2, 3, 6]], np.float32(1.0), 0.05, u[[1, 2, 3, 6]])).all()
    assert tokens[1] != 7 and tokens[2] == 9 and tokens[6] == 0
    nan_row = np.repeat(logits[1:2], 300, 0)
    assert 7 not in set(numpy_draw(nan_row, np.float32(1.0), 1.0, draws(rng, 300)))

    masked = np.where(np.arange(3000) % 7 == 0, logits[0], -np.inf)[None].repeat(400, 0)
    for draw in (nucleus_draw, numpy_draw):
        picks = draw(masked, np.float32(1.0), 0.9, draws(rng, 400))
        assert (picks % 7 == 0).all() and len(set(picks)) > 100
    with pytest.raises(ValueError, match="uniforms"):
        extension.draw(logits, u.astype(np.float64), 1.0, 0.9, work, cum, out)
    with pytest.raises(ValueError, match="shapes"):
        extension.draw(logits, u, 1.0, 0.9, work[:100], cum, out)


@pytest.mark.parametrize("draw", DRAWERS)
def test_a_masked_token_is_never_drawn_where_rounding_leaves_the_target_past_a_blocks_sum(draw):
    """A block's float sum can exceed the running sum of its weights in double: a draw whose target
    falls in that gap takes the block's last token with weight, never a masked one after it (top_p 1
    keeps every candidate, so nothing else would catch it). u just under 1 puts targets there."""
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((400, 300)).astype(np.float32)
    logits[:, 100:] = -np.inf
    u = np.full((400, DRAWS), np.float32(1 - 2 ** -24))
    assert (draw(logits, np.float32(1.0), 1.0, u) < 100).all()


def test_sampling_edge_cases_give_numpys_or_no_tokens():
    """An empty batch gives no tokens on every path; a score that overflows float32 once scaled by
    1 / temperature counts as +inf (the compiled top-k gives such rows to numpy)."""
    from trt_seer.runtime.sampling import _top_k, top_k_draw

    empty = np.zeros((0, 500), np.float32)
    for tokens in (nucleus_draw(empty, np.float32(1), 0.9, np.zeros((0, DRAWS), np.float32)),
                   numpy_draw(empty, np.float32(1), 0.9, np.zeros((0, DRAWS), np.float32)),
                   top_k_draw(empty, np.float32(1), 5, 0.9, np.zeros(0, np.float32))):
        assert tokens.shape == (0,) and tokens.dtype == np.int64
    logits = np.array([[0, 1, -np.inf, -np.inf, 2e38]], np.float32)
    u0 = np.float32([0.5])
    with np.errstate(over="ignore"):
        scores = logits * np.float32(2)
    assert top_k_draw(logits, np.float32(2), 3, 1.0, u0)[0] == _top_k(scores, 3, 1.0, u0)[0] == 4


@pytest.mark.parametrize("shift", [300.0, -400.0, 60.0])
def test_far_logits_draw_the_same_tokens_as_centred_ones(shift):
    """The weights skip the shift by each row's best while they stay inside float32; logits far
    above (exp overflows) or below (it underflows) go through the shifted pass, and a shift of every
    logit by a constant changes no token. Rows mixed: only the far ones take the other pass."""
    rng = np.random.default_rng(3)
    logits = lm_like_logits(rng, 8, 32000, 6.0)
    u = draws(rng, 8)
    moved = logits.copy()
    moved[::2] += np.float32(shift)
    for temperature, top_p in [(0.7, 0.9), (1.0, 1.0)]:
        inverse = np.float32(1 / temperature)
        want = reference_draw(logits, temperature, top_p, u)
        assert (nucleus_draw(moved, inverse, top_p, u) == want).all()
        assert (nucleus_draw(logits, inverse, top_p, u) == want).all()


def test_tokens_follow_the_top_p_distribution():
    """20,000 draws over 6 tokens: each kept token's share is its probability renormalized over the
    nucleus (within 4 standard errors); the tokens outside it never come."""
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = np.log(np.tile(probs, (20000, 1))).astype(np.float32)
    tokens = choose(logits, Sampling(temperature=1.0, top_p=0.75), np.random.default_rng(0))
    want = np.array([0.4, 0.25, 0.15, 0, 0, 0]) / 0.8  # 0.4 + 0.25 < 0.75: the third is kept, then no more
    share = np.bincount(tokens, minlength=6) / len(tokens)
    tolerance = 4 * np.sqrt(want * (1 - want) / len(tokens)) + 1e-12
    assert np.all(np.abs(share - want) <= tolerance), (share, want)


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
    rng = np.random.default_rng(9)
    choose(logits, hot, rng)
    assert rng.bit_generator.state == _after(np.random.default_rng(9), (8, DRAWS))  # DRAWS numbers per row, always


def _after(rng, shape):
    rng.random(shape, dtype=np.float32)
    return rng.bit_generator.state


@pytest.mark.parametrize("vocab, k", [(32000, 50), (32000, 1), (3000, 40), (500, 7)])
def test_top_k_candidates_are_a_full_sorts_head(vocab, k):
    """The k likeliest per row (found under the block-maximum bound, or by a partition where the row
    has fewer than k blocks) equal a full sort's first k, ties broken by the lower id: scores here
    are small integers, so most tokens tie."""
    from trt_seer.runtime.sampling import _likeliest

    scores = np.random.default_rng(vocab + k).integers(-20, 12, (8, vocab)).astype(np.float32)
    ids, head = _likeliest(scores, k)
    want = np.array([np.lexsort((np.arange(vocab), -row))[:k] for row in scores])
    assert (ids == want).all()
    assert (head == np.take_along_axis(scores, want, axis=-1)).all()
    scores[:, ::3] = np.nan  # a broken row: NaN ranks below every score
    ids, _ = _likeliest(scores, k)
    finite = np.where(np.isnan(scores), -np.inf, scores)
    assert (ids == np.array([np.lexsort((np.arange(vocab), -row))[:k] for row in finite])).all()


@COMPILED
@pytest.mark.parametrize("vocab, k", [(32000, 50), (32000, 1), (32000, 2000), (32000, 9000), (3000, 40), (500, 7),
                                      (100, 99)])
def test_the_compiled_top_k_draws_numpys_tokens(vocab, k):
    """runtime/_nucleus.c's top-k (candidates above the k-th highest of about 4k block maxima,
    sorted) against numpy's, same numbers: the same tokens on flat, peaked and tied logits (ties:
    the lower id), with and without top-p; rows with a NaN or infinite logit go to numpy."""
    from trt_seer.runtime.sampling import _top_k, top_k_draw

    rng = np.random.default_rng(vocab + k)
    cases = [lm_like_logits(rng, 8, vocab, spread) for spread in (0.0, 6.0, 40.0)]
    cases.append(rng.integers(-20, 12, (8, vocab)).astype(np.float32))  # most tokens tie
    cases[0][1, 3], cases[0][2, 5] = np.nan, np.inf
    cases[1][3, ::2] = -np.inf  # masked tokens: the compiled loop's own, never drawn
    for logits in cases:
        for temperature, top_p in [(0.8, 1.0), (0.8, 0.9), (1.5, 0.3)]:
            u0, inverse = rng.random(8, dtype=np.float32), np.float32(1 / temperature)
            got = top_k_draw(logits, inverse, k, top_p, u0)
            assert (got == _top_k(logits * inverse, k, top_p, u0)).all()
            assert logits is not cases[0] or (got[2] == 5 and got[1] != 3)  # +inf: the only one drawn; NaN: never
            assert logits is not cases[1] or got[3] % 2 == 1


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


@pytest.mark.parametrize("spread", [0.0, 6.0, 40.0])
@pytest.mark.parametrize("temperature, top_p", [(0.8, 0.9), (1.0, 1.0), (0.6, 0.3)])
def test_the_device_samplers_graph_draws_the_hosts_tokens(spread, temperature, top_p):
    """export/sampler.py's graph, run by ONNX Runtime on float16 logits as a decoder engine gives
    them: the host's tokens for the same uniform numbers (at most one draw in a hundred apart)."""
    import onnxruntime as ort

    from trt_seer.export.sampler import sampler_model

    vocab = 5000
    session = ort.InferenceSession(sampler_model(vocab, "float16").SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(int(spread))
    got, want = [], []
    for _ in range(6):
        logits = lm_like_logits(rng, 8, vocab, spread).astype(np.float16)
        u = draws(rng, 8)
        settings = np.tile(np.float32([1 / temperature, top_p]), (8, 1))
        got.append(session.run(None, {"logits": logits[:, None], "uniforms": u, "settings": settings})[0][:, 0])
        want.append(nucleus_draw(logits.astype(np.float32), np.float32(1 / temperature), top_p, u))
    same = np.mean(np.concatenate(got) == np.concatenate(want))
    assert same >= 0.99, f"{same:.3f} of draws agree"
