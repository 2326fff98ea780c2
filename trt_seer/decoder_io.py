"""The decoder I/O contract: one place for the names, positions, empty cache and step feeds of a
causal-LM graph with a KV cache, shared by export (writes it), eval (teacher forcing, gates) and
runtime (steps it). Needs only numpy (and trt_seer.errors), so every stage may import it.

    inputs, outputs = decoder_io(num_layers)   # input_ids, attention_mask, position_ids, past_key_values.{i}.key/value
    feeds = step_feeds(ids, mask, seq=1)       # position_ids counted over real tokens

Cache tensors are (batch, kv_heads, past, head_dim); `present.{i}.key/value` come out with past+seq.
A TensorRT decoder engine gives `new_key_values.{i}.key/value` instead of `present`: the step's own
keys and values (batch, kv_heads, seq, head_dim), which the runtime writes into its one cache
(engine/kv_outputs.py, runtime/decoder_trt.py).
"""
from __future__ import annotations

import numpy as np

from trt_seer.errors import InputError

TOKEN_AXES = {0: "batch", 1: "seq"}  # the dynamic axes of token tensors
TOKEN_INPUTS = ("input_ids", "attention_mask", "position_ids")
KV_KINDS = ("key", "value")
PAST_PREFIX, PRESENT_PREFIX, NEW_PREFIX = "past_key_values.", "present.", "new_key_values."
NEXT_TOKEN = "next_token"  # the greedy next token per row, [batch, 1] int64 (ArgMax of the last logits)


def decoder_io(num_layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs) of a causal-LM graph with a KV cache, in graph order."""
    past = tuple(f"{PAST_PREFIX}{i}.{k}" for i in range(num_layers) for k in KV_KINDS)
    present = tuple(f"{PRESENT_PREFIX}{i}.{k}" for i in range(num_layers) for k in KV_KINDS)
    return TOKEN_INPUTS + past, ("logits",) + present


def exported_outputs(num_layers: int) -> tuple[str, ...]:
    """The outputs an export writes: `decoder_io`'s, then `next_token` (graphs exported before it
    lack it; every reader asks for its outputs by name)."""
    return decoder_io(num_layers)[1] + (NEXT_TOKEN,)


def is_past(name: str) -> bool:
    return name.startswith(PAST_PREFIX)


def present_of(past_name: str) -> str:
    """The output that carries input `past_name` to the next step."""
    return PRESENT_PREFIX + past_name.removeprefix(PAST_PREFIX)


def new_of(past_name: str) -> str:
    """The engine output with the step's own keys or values for cache input `past_name`."""
    return NEW_PREFIX + past_name.removeprefix(PAST_PREFIX)


def check_step(input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, batch: int, past: int,
               max_total: int, model: str) -> int:
    """What every decoder step checks before it runs (InputError, nothing run): a batch was started,
    the feeds fit it and the cache, and the sequence fits `max_total`. Returns the step's length."""
    if not batch:
        raise InputError("call reset(batch) before step()")
    rows, seq = input_ids.shape
    if rows != batch or position_ids.shape != (rows, seq):
        raise InputError(f"step got input_ids {list(input_ids.shape)} and position_ids {list(position_ids.shape)} "
                         f"for a batch of {batch}")
    if attention_mask.shape != (rows, past + seq):
        raise InputError(f"attention_mask must be [{rows}, {past + seq}] (cache {past} + {seq} new), got "
                         f"{list(attention_mask.shape)}")
    if past + seq > max_total:
        raise InputError(f"sequence of {past + seq} tokens exceeds the {max_total} that {model} takes; "
                         "rebuild with a larger --max-total")
    return seq


def prompt_slices(feeds: dict, size: int) -> list[dict]:
    """A prompt's feeds {input_ids, attention_mask, position_ids} as consecutive slices of at most
    `size` tokens, each with the attention mask up to its end; [feeds] for `size` 0 or a prompt no
    longer than it."""
    seq = feeds["input_ids"].shape[1]
    if not size or seq <= size:
        return [feeds]
    return [{"input_ids": feeds["input_ids"][:, a:a + size], "attention_mask": feeds["attention_mask"][:, :a + size],
             "position_ids": feeds["position_ids"][:, a:a + size]} for a in range(0, seq, size)]


def position_ids(mask: np.ndarray, seq: int | None = None) -> np.ndarray:
    """Positions of the last `seq` tokens (all for None), counting real tokens only: left padding
    does not shift them. (batch, seq) int64."""
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)
    return positions if seq is None else positions[:, -seq:]


def step_feeds(input_ids: np.ndarray, attention_mask: np.ndarray, seq: int | None = None) -> dict:
    """The token feeds of one step: `input_ids` (batch, seq) and the mask over past + seq."""
    seq = input_ids.shape[1] if seq is None else seq
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids(attention_mask, seq)}


def empty_cache(batch: int, kv_heads: int, head_dim: int, dtype=np.float32) -> np.ndarray:
    """One cache tensor with no past: (batch, kv_heads, 0, head_dim)."""
    return np.zeros((batch, kv_heads, 0, head_dim), dtype=dtype)
