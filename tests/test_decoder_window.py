"""The window cache layout (runtime/kv_window.py), on the CPU: the 2-D copies and masks that
`TensorRTDecoder` issues, replayed on numpy byte buffers exactly as cudaMemcpy2D would, hold the same
cache as growing it by one position per step (what ONNX Runtime and the exported graph see), across
promotions to larger windows, left- and right-aligned."""
from __future__ import annotations

import numpy as np
import pytest

from trt_seer.runtime.kv_window import (append_copy, grow_copies, keep_new, land_copy, pick_window, slide_copy,
                                        staged_moves, window_mask, window_sizes)

LAYERS, BATCH, HEADS, DIM = 3, 2, 2, 4  # rows = layers x batch x heads; fp16 positions of DIM values
ROW = DIM * 2
ROWS = LAYERS * BATCH * HEADS


def memcpy2d(dst: np.ndarray, src: np.ndarray, c) -> None:
    """cudaMemcpy2D on flat uint8 buffers."""
    for r in range(c.height):
        d, s = c.dst_offset + r * c.dst_pitch, c.src_offset + r * c.src_pitch
        dst[d:d + c.width] = src[s:s + c.width]


def as_bytes(kv: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(kv.astype(np.float16)).view(np.uint8).reshape(-1)


def window_rows(buf: np.ndarray, window: int) -> np.ndarray:
    return buf[:ROWS * window * ROW].view(np.float16).reshape(ROWS, window, DIM)


def in_use(win: np.ndarray, window: int, used: int, align: str) -> tuple[np.ndarray, np.ndarray]:
    """(the slots holding the sequence, the empty ones)."""
    rows = window_rows(win, window)
    if align == "left":
        return rows[:, :used], rows[:, used:]
    return rows[:, window - used:], rows[:, :window - used]


@pytest.mark.parametrize("align", ["left", "right"])
@pytest.mark.parametrize("prompt,steps,windows", [(3, 10, (4, 8, 15)), (5, 2, (7,)), (1, 14, (2, 4, 8, 15))])
def test_window_copies_hold_the_grown_cache_across_promotions(prompt, steps, windows, align):
    rng = np.random.default_rng(prompt)
    buf = np.full(ROWS * windows[-1] * ROW, 0xFF, np.uint8)  # NaN bytes: empty slots must be zeroed
    grown = rng.standard_normal((ROWS, prompt, DIM)).astype(np.float16)  # the prefill's present
    window = pick_window(windows, prompt)
    buf[:ROWS * window * ROW] = 0
    memcpy2d(buf, as_bytes(grown), land_copy(ROWS, window, ROW, prompt, align))
    for _ in range(steps):
        new = rng.standard_normal((ROWS, 1, DIM)).astype(np.float16)
        present = np.concatenate([window_rows(buf, window), new], axis=1)  # what the engine writes
        used = grown.shape[1] + 1
        grown = np.concatenate([grown, new], axis=1)
        if used <= window:
            copy = append_copy(ROWS, window, ROW, used - 1) if align == "left" else slide_copy(ROWS, window, ROW)
            memcpy2d(buf, as_bytes(present), copy)
        else:  # promotion: zero the next window, land the present in it
            window = pick_window(windows, used)
            buf[:ROWS * window * ROW] = 0
            memcpy2d(buf, as_bytes(present), land_copy(ROWS, window, ROW, present.shape[1], align))
        held, empty = in_use(buf, window, used, align)
        np.testing.assert_array_equal(held, grown)
        assert not empty.any()  # empty slots stay zero (masked, not NaN)


@pytest.mark.parametrize("align", ["left", "right"])
@pytest.mark.parametrize("staging_rows", [1, 5, ROWS])
@pytest.mark.parametrize("prompt,steps,windows", [(3, 10, (4, 8, 15)), (5, 2, (7,)), (1, 14, (2, 4, 8, 15))])
def test_one_buffer_holds_the_grown_cache_with_new_key_values(prompt, steps, windows, align, staging_rows):
    """Engines with `new_key_values`: the prompt's keys and values land from where the engine wrote
    them (packed at the buffer's start), each step's go into their slot, promotions and the slide
    move within the one buffer through a staging buffer of a few rows; the buffer holds the grown
    cache and its empty slots numbers (it was zeroed once)."""
    rng = np.random.default_rng(prompt)
    buf = np.zeros(ROWS * windows[-1] * ROW, np.uint8)
    staging = np.full(staging_rows * windows[-1] * ROW, 0xFF, np.uint8)  # NaN bytes: must never reach the cache
    grown = rng.standard_normal((ROWS, prompt, DIM)).astype(np.float16)
    buf[:grown.nbytes] = as_bytes(grown)  # the prompt step's new_key_values, `prompt` per row
    window, past, new = None, 0, as_bytes(grown)
    for step in range(steps + 1):
        seq = prompt if step == 0 else 1
        plan = keep_new(ROWS, ROW, windows, window, past, seq, align, staging.nbytes)
        for move in plan.moves:
            memcpy2d(staging, buf, move.out)
            memcpy2d(buf, staging, move.back)
        if plan.new is not None:
            memcpy2d(buf, new, plan.new)
        window, past = plan.window, past + seq
        held, empty = in_use(buf, window, past, align)
        np.testing.assert_array_equal(held, grown, err_msg=f"step {step}, window {window}")
        assert np.isfinite(empty).all()
        kv = rng.standard_normal((ROWS, 1, DIM)).astype(np.float16)
        grown, new = np.concatenate([grown, kv], axis=1), as_bytes(kv)


@pytest.mark.parametrize("staging_rows", [1, 5, ROWS])
@pytest.mark.parametrize("prompt,size,windows", [(9, 2, (2, 4, 8, 15)), (12, 5, (4, 8, 15)), (7, 3, (15,))])
def test_a_prompt_in_slices_fills_the_window_as_the_whole_prompt_would(prompt, size, windows, staging_rows):
    """Left-aligned: the first slice lands like a prompt, each later one (several positions per row,
    packed as the engine writes them) goes after the sequence, promoting the window when it outgrows
    it; the buffer then holds the whole prompt's keys and values. Right-aligned windows take no
    slices."""
    rng = np.random.default_rng(prompt)
    buf = np.zeros(ROWS * windows[-1] * ROW, np.uint8)
    staging = np.full(staging_rows * windows[-1] * ROW, 0xFF, np.uint8)
    whole = rng.standard_normal((ROWS, prompt, DIM)).astype(np.float16)
    window = None
    for past in range(0, prompt, size):
        part = as_bytes(whole[:, past:past + size])
        seq = min(size, prompt - past)
        if window is None:
            buf[:part.nbytes] = part  # the first slice, packed at the buffer's start
        plan = keep_new(ROWS, ROW, windows, window, past, seq, "left", staging.nbytes)
        for move in plan.moves:
            memcpy2d(staging, buf, move.out)
            memcpy2d(buf, staging, move.back)
        if plan.new is not None:
            memcpy2d(buf, part, plan.new)
        window = plan.window
        np.testing.assert_array_equal(in_use(buf, window, past + seq, "left")[0], whole[:, :past + seq])
    assert window == pick_window(windows, prompt)
    with pytest.raises(ValueError, match="left-aligned only"):
        keep_new(ROWS, ROW, windows, windows[0], 1, 2, "right", staging.nbytes)


def test_staged_moves_refuse_what_they_cannot_order_and_skip_what_is_in_place():
    assert staged_moves(4, (0, 16), (0, 16), 16, 64) == []
    with pytest.raises(ValueError, match="one of offset and pitch grows"):
        staged_moves(4, (8, 16), (0, 32), 16, 64)
    with pytest.raises(ValueError, match="does not fit"):
        staged_moves(4, (0, 16), (0, 32), 16, 8)


@pytest.mark.parametrize("seq", [1, 4])
def test_grow_copies_lengthen_every_row_by_the_new_positions(seq):
    past, rng = 3, np.random.default_rng(0)
    cache = rng.standard_normal((ROWS, past, DIM)).astype(np.float16)
    kv = rng.standard_normal((ROWS, seq, DIM)).astype(np.float16)
    out = np.full(ROWS * (past + seq) * ROW, 0xFF, np.uint8)
    old, new = grow_copies(ROWS, ROW, past, seq)
    memcpy2d(out, as_bytes(cache), old)
    memcpy2d(out, as_bytes(kv), new)
    np.testing.assert_array_equal(out.view(np.float16).reshape(ROWS, past + seq, DIM), np.concatenate([cache, kv], 1))


def test_window_sizes_double_up_to_the_longest_cache():
    assert window_sizes(4096) == (256, 512, 1024, 2048, 4095)
    assert window_sizes(1280) == (256, 512, 1024, 1279)
    assert window_sizes(200) == (199,)
    assert pick_window((4, 8, 15), 5) == 8 and pick_window((4, 8, 15), 16) is None


def test_window_mask_places_the_callers_mask():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # row 0 left-padded; past 4 + 1 new
    right = window_mask(mask, 7, "right")
    assert right.shape == (2, 8)
    np.testing.assert_array_equal(right[:, 3:], mask)
    assert not right[:, :3].any()
    left = window_mask(mask, 7, "left")
    np.testing.assert_array_equal(left[:, :4], mask[:, :4])
    np.testing.assert_array_equal(left[:, 7], mask[:, 4])
    assert not left[:, 4:7].any()
    sliced = window_mask(mask, 7, "left", seq=3)  # past 2 + a slice of 3 new
    assert sliced.shape == (2, 10)
    np.testing.assert_array_equal(sliced[:, :2], mask[:, :2])
    np.testing.assert_array_equal(sliced[:, 7:], mask[:, 2:])
    assert not sliced[:, 2:7].any()
