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

Engines built by this version give `new_key_values` (the step's own keys and values) instead of
`present` (engine/kv_outputs.py), so the runtime holds the cache once: `slot_copy` puts the new
position into its slot, and moves within the one buffer (a promotion to the next window, the
right-aligned slide, the prompt's landing from where the engine wrote it) go through a staging
buffer in chunks of rows (`staged_moves`), ordered so that no chunk overwrites rows not yet moved.
A long prompt may run in slices (the engine's `decoder.prompt_slice`): the first lands as a whole
prompt does; each later slice reads the window as a decode step does (`window_mask` with `seq` new
tokens) and its keys and values go after the sequence, so that layout is left-aligned only.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trt_seer.errors import InputError

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



def resolve_windows(windows: tuple[int, ...] | str | None, max_total: int) -> tuple[int, ...]:
    """The window sizes a decoder steps in, ascending, the largest max_total - 1: "ladder" (None)
    gives `window_sizes`, "single" that one window, sizes are capped at it. InputError otherwise."""
    if windows in (None, "ladder"):
        sizes = window_sizes(max_total)
    elif windows == "single":
        sizes = (max_total - 1,)
    elif isinstance(windows, str):
        raise InputError(f'windows must be "ladder", "single" or window sizes, got {windows!r}')
    else:
        sizes = windows
    out = tuple(sorted({min(int(w), max_total - 1) for w in sizes} | {max_total - 1}))
    if out[0] < 1:
        raise InputError(f"window sizes must be >= 1, got {list(sizes)}")
    return out


def default_align(decoder: dict, largest: int) -> str:
    """"left" where the manifest's `decoder` section says the attention is full (`sliding_window`
    null) or slides over more than the `largest` window; else "right", also where it does not say
    (a sliding-window mask needs true distances)."""
    if "sliding_window" not in decoder:
        return "right"
    sliding = int(decoder["sliding_window"] or 0)
    return "right" if 0 < sliding <= largest else "left"  # the step's query sits `largest` slots after slot 0


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


def window_mask(mask: np.ndarray, window: int, align: str, seq: int = 1) -> np.ndarray:
    """A step's [batch, past + seq] mask over the window's [batch, window + seq] slots, 0 elsewhere:
    left, the past in the first slots and the `seq` new tokens after the window; right, all
    right-aligned."""
    out = np.zeros((mask.shape[0], window + seq), np.int64)
    if align == "left":
        past = mask.shape[1] - seq
        out[:, :past] = mask[:, :past]
        out[:, window:] = mask[:, past:]
    else:
        out[:, window + seq - mask.shape[1]:] = mask
    return out


def slot_copy(rows: int, window: int, row_bytes: int, slot: int, positions: int = 1) -> Copy2D:
    """`positions` per row of the engine's new keys/values (packed, pitch positions) into slot
    `slot` of a window of `window` slots."""
    width = positions * row_bytes
    return Copy2D(slot * row_bytes, window * row_bytes, 0, width, width, rows)


class Staged(NamedTuple):
    """One chunk of a move within a buffer: `out` (buffer -> staging, packed) then `back`."""

    out: Copy2D
    back: Copy2D


def staged_moves(rows: int, src: tuple[int, int], dst: tuple[int, int], width: int,
                 staging_bytes: int) -> list[Staged]:
    """Moves `rows` rows of `width` bytes within one buffer from (offset, pitch) `src` to `dst`
    through a staging buffer, as many rows a chunk as it holds. A destination ahead of the source
    (offset and pitch both at least the source's: a window growing, the prompt landing) is moved
    from the last chunk back, one behind it (the right-aligned slide) from the first on; either
    way a chunk lands only on its own rows' or already moved rows' bytes."""
    if src == dst or not rows:
        return []
    ahead = dst[0] >= src[0] and dst[1] >= src[1]
    if not ahead and not (dst[0] <= src[0] and dst[1] <= src[1]):
        raise ValueError(f"cannot order a move from {src} to {dst}: one of offset and pitch grows, the other shrinks")
    if width > staging_bytes:
        raise ValueError(f"a row of {width} bytes does not fit the {staging_bytes}-byte staging buffer")
    per = staging_bytes // width
    starts = range(0, rows, per)
    moves = []
    for first in (reversed(starts) if ahead else starts):
        n = min(per, rows - first)
        moves.append(Staged(Copy2D(0, width, src[0] + first * src[1], src[1], width, n),
                            Copy2D(dst[0] + first * dst[1], dst[1], 0, width, width, n)))
    return moves


class Keep(NamedTuple):
    """What follows a step on an engine with `new_key_values`: `moves` within the cache buffer,
    then `new` (None: nothing) from the step's new keys/values into their slot; `window` is the
    window the next step reads (None: the cache is full)."""

    moves: list[Staged]
    new: Copy2D | None
    window: int | None


def keep_new(rows: int, row_bytes: int, windows: tuple[int, ...], window: int | None, past: int, seq: int,
             align: str, staging_bytes: int) -> Keep:
    """The window layout after a step of `seq` tokens on `past` cached ones (`window`: the one the
    step read, its new keys and values packed, `seq` per row; None for the prompt's first step, whose
    keys and values the engine wrote packed at the buffer's start). A step of several tokens on a
    window (a prompt's later slice) is laid out left-aligned only."""
    used = past + seq
    if window is not None and seq > 1 and align != "left":
        raise ValueError("a step of several tokens on a window is laid out left-aligned only")
    if window is not None and used <= window:
        if align == "left":
            return Keep([], slot_copy(rows, window, row_bytes, past, seq), window)
        w = window * row_bytes
        return Keep(staged_moves(rows, (row_bytes, w), (0, w), w - row_bytes, staging_bytes),
                    slot_copy(rows, window, row_bytes, window - 1), window)
    target = pick_window(windows, used)
    if target is None:
        return Keep([], None, None)
    held = seq if window is None else window  # positions per row in the buffer now
    land = 0 if align == "left" else target - used
    moves = staged_moves(rows, (0, held * row_bytes), (land * row_bytes, target * row_bytes), held * row_bytes,
                         staging_bytes)
    # right-aligned, a promoted window was full (past == window): the new position follows it
    return Keep(moves, None if window is None else slot_copy(rows, target, row_bytes, land + past, seq), target)


def grow_copies(rows: int, row_bytes: int, past: int, seq: int = 1) -> tuple[Copy2D, Copy2D]:
    """The "grow" layout on an engine with `new_key_values`: the cache of `past` positions per row
    into the other buffer at pitch past + seq, then the step's `seq` new positions into slot `past`."""
    width = past * row_bytes
    return (Copy2D(0, width + seq * row_bytes, 0, width, width, rows),
            slot_copy(rows, past + seq, row_bytes, past, seq))
