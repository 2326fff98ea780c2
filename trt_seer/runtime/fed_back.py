"""Decoding with each step's token fed back on the device (`TensorRTDecoder.greedy_tokens` and
`sampled_tokens`): the token a step chooses (the engine's `next_token`, or the device sampler's
draw written over it) is copied into the next step's `input_ids` on the GPU, and that step is
enqueued before the host reads the token, so the host's work per step hides behind the GPU's.

    for tokens in fed_back(decoder, input_ids, attention_mask, count):   # (batch,) int64 each
        ...

Two lanes of page-locked host memory take turns: the host fills one while the GPU may still read
the other, and a lane is filled again only after the step that used it has ended.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import trt_seer.runtime.cuda as cuda
from trt_seer.decoder_io import position_ids


class Lane:
    """Page-locked host memory for one step in flight: the small inputs on their way up, the token on
    its way down, and the step's start and end events."""

    def __init__(self, small: dict, batch: int):
        self._small = {name: cuda.pinned_array(buf.nbytes).view(np.int64) for name, buf in small.items()}
        self.token = cuda.pinned_array(batch * 8).view(np.int64)
        self.start, self.end = cuda.Event(), cuda.Event()

    def host(self, name: str) -> np.ndarray:
        return self._small[name]

    def close(self) -> None:
        self._small = self.token = None  # the pinned memory goes now (no view of it was handed out)
        self.start.close()
        self.end.close()


def fed_back(dec, input_ids, attention_mask, count: int, then=None) -> Iterator[np.ndarray]:
    """Yields `count` token arrays (batch,) int64 of `dec` (a TensorRTDecoder after `reset`), the
    prompt's first, each while the following step already runs. Every row takes a step each time
    (a caller ignores a row after its end); each step's mask and positions are the last ones grown
    by one. `then(lane)`, where given, makes each step's extra work before its token comes back."""
    mask = np.asarray(attention_mask, np.int64)
    feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids(mask)}
    lanes = dec.lanes
    then = then or (lambda lane: None)
    dec.enqueue_token_step(feeds, lanes[0], then=then(0))
    try:
        for t in range(1, count + 1):
            if t < count:
                mask = np.concatenate([mask, np.ones((dec.batch, 1), np.int64)], axis=1)
                feeds = {"input_ids": np.zeros((dec.batch, 1), np.int64), "attention_mask": mask,
                         "position_ids": position_ids(mask, 1)}
                lane = lanes[t % 2]
                dec.enqueue_token_step(feeds, lane, ids_on_device=True, then=then(t % 2))
            done = lanes[(t - 1) % 2]
            done.end.synchronize()
            dec.last_gpu_ms = done.end.elapsed_ms(done.start)
            yield done.token[:dec.batch].copy()
    finally:
        dec.stream.synchronize()  # a caller that stops early leaves no step in flight
