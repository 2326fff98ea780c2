"""The window cache layout of `TensorRTDecoder` (runtime/decoder_trt.py): window sizes, the 2-D copies
that keep a sequence's keys and values in a window, and the step's mask over it. numpy only.

A window of `w` positions per (layer, row, head) is what a decode step reads; the engine writes
`present` = the window + the new token (w + 1 positions). Sizes form a ladder (`window_sizes`:
256, 512, 1024, ... up to max_total - 1), and a sequence uses the smallest window that holds it, so
attention reads about the positions in use, not max_total. Two alignments:
- "left" (default): position i of the sequence sits in slot i; slots past the sequence are empty
  (masked), and the new token is slot w of the step's input. After a step only the new token's keys
  and values are copied into its slot (`append_copy`: one position per row, not the window).
- "right": the sequence ends at the window's last slot and every step drops the oldest slot
  (`slide_copy`, the whole window). Distances between slots equal distances between positions,
  which a sliding-window attention mask needs.
When the sequence outgrows its window, `land_copy` moves `present` into the next window (zeroed
first: empty slots must hold numbers, not NaN). The prompt lands the same way.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

ALIGNS = ("left", "right")
SMALLEST_WINDOW = 256


class Copy2D(NamedTuple):
    """One cudaMemcpy2D: `height` rows of `width` bytes; offsets from the buffers' starts."""

    dst_offset: int
    dst_pitch: int
    src_offset: int
    src_pitch: int
    width: int
    height: int


def window_sizes(max_total: int, smallest: int = SMALLEST_WINDOW) -> tuple[int, ...]:
    """Decode windows, doubling from `smallest`, the last max_total - 1 (the longest cache)."""
    largest, sizes, w = max_total - 1, [], max(1, smallest)
    while w < largest:
        sizes.append(w)
        w *= 2
    return (*sizes, largest)


def pick_window(windows: tuple[int, ...], used: int) -> int | None:
    """The smallest window holding `used` positions; None past the largest."""
    return next((w for w in windows if w >= used), None)


def land_copy(rows: int, window: int, row_bytes: int, positions: int, align: str) -> Copy2D:
    """A `present` of `positions` per row (pitch positions) into a window of `window` slots: at its
    start (left) or its end (right). `rows` = layers x batch x heads."""
    width = positions * row_bytes
    dst = 0 if align == "left" else (window - positions) * row_bytes
    return Copy2D(dst, window * row_bytes, 0, width, width, rows)


def append_copy(rows: int, window: int, row_bytes: int, slot: int) -> Copy2D:
    """Left: the step's new position (the last of `present`'s window + 1) into slot `slot`."""
    return Copy2D(slot * row_bytes, window * row_bytes, window * row_bytes, (window + 1) * row_bytes,
                  row_bytes, rows)


def slide_copy(rows: int, window: int, row_bytes: int) -> Copy2D:
    """Right: `present`'s window + 1 positions back into the window, the oldest dropped."""
    w = window * row_bytes
    return Copy2D(0, w, row_bytes, w + row_bytes, w, rows)


def window_mask(mask: np.ndarray, window: int, align: str) -> np.ndarray:
    """A decode step's [batch, past + 1] mask over the window's [batch, window + 1] slots, 0 elsewhere:
    left, the past in the first slots and the new token in the last; right, all right-aligned."""
    out = np.zeros((mask.shape[0], window + 1), np.int64)
    if align == "left":
        out[:, :mask.shape[1] - 1] = mask[:, :-1]
        out[:, window] = mask[:, -1]
    else:
        out[:, window + 1 - mask.shape[1]:] = mask
    return out
