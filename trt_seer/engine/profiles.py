"""Optimization profiles: the (min, opt, max) shape of every engine input.

Encoders get one profile over (batch, seq) inputs; packed encoders (an input `cu_seqlens`) one over
tokens (1 .. max_batch x max_seq) and cu_seqlens (2 .. max_batch + 1). Decoders with a KV cache (inputs
`past_key_values.{i}.key/value`, see export/decoder.py) get two:

- profile 0, `decode`: one new token per row (seq 1) on a cache of 1 .. total-1 positions, the
  step that runs once per generated token and so the one the builder should tune for;
- profile 1, `prefill`: the prompt (seq from the profile's seq range) on an empty cache; with a
  prompt slice (`build --prompt-slice N`), also up to N tokens on a cache as long as the decode
  profile's, so that the runtime can take a long prompt N tokens at a time (runtime/decoder_trt.py).

Plain functions over TensorRT's network description; no TensorRT import of their own.
"""
from __future__ import annotations

from trt_seer.decoder_io import PAST_PREFIX
from trt_seer.errors import BuildError, InputError
from trt_seer.export.families import ShapeProfile

DECODE, PREFILL = "decode", "prefill"
PACKED_BOUNDS = "cu_seqlens"  # the input of a packed encoder (export/packed.py)


def is_decoder(input_names) -> bool:
    return any(n.startswith(PAST_PREFIX) for n in input_names)


def check_total(profile: ShapeProfile, total: int | None) -> int:
    """The longest prompt + generated sequence a decoder engine serves (default: 2 x max prompt)."""
    total = 2 * profile.seq[2] if total is None else int(total)
    if total <= profile.seq[2]:
        raise InputError(f"--max-total {total} must exceed the longest prompt (--seq max {profile.seq[2]})")
    return total


def encoder_profile(inputs: dict[str, tuple], profile: ShapeProfile) -> dict[str, tuple]:
    """{input: (min, opt, max)} for (batch, seq) inputs."""
    bad = [n for n, shape in inputs.items() if len(shape) != 2]
    if bad:
        raise BuildError(f"inputs {bad} are not (batch, seq); profiles cover (batch, seq) inputs")
    return {name: profile.shapes() for name in inputs}


def packed_profile(inputs: dict[str, tuple], profile: ShapeProfile) -> dict[str, tuple]:
    """{input: (min, opt, max)} for a packed encoder (export/packed.py): [1, tokens] inputs over
    1 .. batch x seq tokens, cu_seqlens over batch + 1 bounds."""
    (_, b1, b2), (_, s1, s2) = profile.batch, profile.seq
    out = {}
    for name, shape in inputs.items():
        if name == PACKED_BOUNDS:
            out[name] = ((2,), (b1 + 1,), (b2 + 1,))
        elif len(shape) == 2:
            out[name] = ((1, 1), (1, b1 * s1), (1, b2 * s2))
        else:
            raise BuildError(f"packed input {name} of shape {list(shape)} is neither [1, tokens] nor cu_seqlens")
    return out


def _kv(shape: tuple, batch: int, past: int) -> tuple[int, ...]:
    heads, head_dim = shape[1], shape[3]
    if heads < 0 or head_dim < 0:
        raise BuildError(f"KV input of shape {list(shape)}: heads and head_dim must be static")
    return (batch, heads, past, head_dim)


def decoder_profiles(inputs: dict[str, tuple], profile: ShapeProfile, total: int,
                     prompt_slice: int | None = None) -> list[tuple[str, dict]]:
    """[(name, {input: (min, opt, max)})] for the decode and prefill profiles (`prompt_slice`: the
    module docstring)."""
    (b0, b1, b2), (s0, s1, s2) = profile.batch, profile.seq
    t1 = max(2, (s1 + total) // 2)  # a typical position mid-generation
    cached = total - 1 if prompt_slice else 0  # the longest cache a prompt step reads
    first = 1 if prompt_slice else s0  # a prompt's last slice may be a single token
    mask_max = max(s2, cached + (prompt_slice or 0))
    decode, prefill = {}, {}
    for name, shape in inputs.items():
        if name.startswith(PAST_PREFIX):
            decode[name] = (_kv(shape, b0, 1), _kv(shape, b1, t1 - 1), _kv(shape, b2, total - 1))
            prefill[name] = (_kv(shape, b0, 0), _kv(shape, b1, 0), _kv(shape, b2, cached))
        elif name == "attention_mask":
            decode[name] = ((b0, 2), (b1, t1), (b2, total))
            prefill[name] = ((b0, first), (b1, s1), (b2, mask_max))
        elif len(shape) == 2:  # input_ids, position_ids
            decode[name] = ((b0, 1), (b1, 1), (b2, 1))
            prefill[name] = ((b0, first), (b1, s1), (b2, s2))
        else:
            raise BuildError(f"decoder input {name} of shape {list(shape)} is not part of the KV-cache layout")
    return [(DECODE, decode), (PREFILL, prefill)]


def batch_only(inputs: dict[str, tuple]) -> bool:
    """Every input's only dynamic axis is the first (the sampler graph, export/sampler.py)."""
    return all(len(s) >= 2 and s[0] < 0 and min(s[1:]) > 0 for s in inputs.values())


def batch_profile(inputs: dict[str, tuple], profile: ShapeProfile) -> dict[str, tuple]:
    """{input: (min, opt, max)} over the batch axis; the other axes as the graph fixes them."""
    return {name: tuple((b, *shape[1:]) for b in profile.batch) for name, shape in inputs.items()}


def profiles_for(inputs: dict[str, tuple], profile: ShapeProfile, total: int | None,
                 prompt_slice: int | None = None) -> list[tuple[str, dict]]:
    if is_decoder(inputs):
        return decoder_profiles(inputs, profile, check_total(profile, total), prompt_slice)
    if PACKED_BOUNDS in inputs:
        return [("packed", packed_profile(inputs, profile))]
    if batch_only(inputs):
        return [("batch", batch_profile(inputs, profile))]
    return [("default", encoder_profile(inputs, profile))]


def describe(profiles: list[tuple[str, dict]]) -> list[dict]:
    """The manifest's `optimization_profiles`: [{name, shapes: {input: [min, opt, max]}}]."""
    return [{"name": name, "shapes": {k: [list(s) for s in v] for k, v in shapes.items()}}
            for name, shapes in profiles]
