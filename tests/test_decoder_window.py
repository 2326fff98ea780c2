"""The window cache layout of `TensorRTDecoder` (runtime/decoder_trt.py), on the CPU: the 2-D copies
and masks it issues, replayed on numpy byte buffers exactly as cudaMemcpy2D would, give the same
cache as growing it by one position per step (what ONNX Runtime and the exported graph see)."""
from __future__ import annotations

import numpy as np
import pytest

from trt_seer.runtime.decoder_trt import slide_copy, window_mask

LAYERS, BATCH, HEADS, DIM = 3, 2, 2, 4  # rows = layers x batch x heads; fp16 positions of DIM values
ROW = DIM * 2


def memcpy2d(dst: np.ndarray, src: np.ndarray, c) -> None:
    """cudaMemcpy2D on flat uint8 buffers."""
    for r in range(c.height):
        d, s = c.dst_offset + r * c.dst_pitch, c.src_offset + r * c.src_pitch
        dst[d:d + c.width] = src[s:s + c.width]


def as_bytes(kv: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(kv.astype(np.float16)).view(np.uint8).reshape(-1)


def window_rows(buf: np.ndarray, window: int) -> np.ndarray:
    return buf[:LAYERS * BATCH * HEADS * window * ROW].view(np.float16).reshape(-1, window, DIM)


@pytest.mark.parametrize("prompt,steps,window", [(3, 4, 8), (5, 2, 7), (1, 6, 7)])
def test_window_copies_hold_the_grown_cache_right_aligned(prompt, steps, window):
    rng = np.random.default_rng(prompt)
    rows = LAYERS * BATCH * HEADS
    win = np.zeros(rows * window * ROW, np.uint8)  # zeroed at reset
    grown = rng.standard_normal((rows, prompt, DIM)).astype(np.float16)  # the prefill's present
    memcpy2d(win, as_bytes(grown), slide_copy(False, rows, window, ROW, prompt))
    for _ in range(steps):
        new = rng.standard_normal((rows, 1, DIM)).astype(np.float16)
        present = np.concatenate([window_rows(win, window), new], axis=1)  # what the engine writes
        memcpy2d(win, as_bytes(present), slide_copy(True, rows, window, ROW, 1))
        grown = np.concatenate([grown, new], axis=1)
        got = window_rows(win, window)
        np.testing.assert_array_equal(got[:, window - grown.shape[1]:], grown)
        assert not got[:, :window - grown.shape[1]].any()  # empty slots stay zero (masked, not NaN)


def test_window_mask_right_aligns_the_callers_mask():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # row 0 left-padded; past 4 + 1 new
    out = window_mask(mask, 7)
    assert out.shape == (2, 8)
    np.testing.assert_array_equal(out[:, 3:], mask)
    assert not out[:, :3].any()
