"""Batches without padding: a padded encoder batch packed into one row of real tokens, and the model
that runs a packed artifact (`<name>.fp16.packed.engine` or `.onnx`) behind the padded interface.

    from trt_seer.runtime import load
    with load("engines/m.fp16.packed.engine") as m:      # takes and returns what m.fp16.engine does
        emb = m.infer({"input_ids": ids, "attention_mask": mask}, outputs=["sentence_embedding"])

The packed graph (export/packed.py) takes input_ids, token_type_ids, position_ids and sequence_ids
as [1, tokens] (every sequence's real tokens one after another) and cu_seqlens [batch + 1] (int32
cumulative token counts). Attention stays inside each sequence, so a batch costs its real tokens,
not batch x longest. Position ids follow the family's rule, recorded with the artifact: "column"
(the token's column in the padded row, as BERT numbers a padded row) or "rank" (its rank among the
row's real tokens plus an offset, as RoBERTa-likes count from pad_token_id + 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_seer.errors import InputError, ManifestMismatchError
from trt_seer.runtime.base import CallGate, Completed, Model
from trt_seer.runtime.io import IOSpec, out_view, validate_feeds, validate_out

PACKED_INPUTS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "cu_seqlens")


@dataclass(frozen=True)
class Layout:
    """What unpack needs: which cells of the padded (batch, seq) batch hold real tokens."""

    mask: np.ndarray  # (batch, seq) bool

    @property
    def batch(self) -> int:
        return self.mask.shape[0]


def positions(mask: np.ndarray, rule: dict) -> np.ndarray:
    """Position ids (batch, seq) of a padded batch under `rule` ({"positions": "column"} or
    {"positions": "rank", "offset": n}); meaningful at real tokens only."""
    if rule["positions"] == "column":
        return np.broadcast_to(np.arange(mask.shape[1], dtype=np.int64), mask.shape)
    if rule["positions"] == "rank":
        return np.cumsum(mask, axis=1, dtype=np.int64) - 1 + int(rule["offset"])
    raise ManifestMismatchError(f"unknown position rule {rule['positions']!r} in the packed artifact's record")


def pack(feeds: dict, rule: dict) -> tuple[dict[str, np.ndarray], Layout]:
    """(packed feeds, layout) from padded feeds (input_ids, attention_mask[, token_type_ids],
    each (batch, seq)). InputError when the batch has no real token."""
    mask = np.asarray(feeds["attention_mask"]).astype(bool)  # (batch, seq)
    lengths = mask.sum(axis=1)
    if not lengths.any():
        raise InputError("attention_mask marks no token of the batch as real: nothing to run")
    packed = {"input_ids": np.asarray(feeds["input_ids"], dtype=np.int64)[mask][None]}  # (1, tokens)
    if "token_type_ids" in feeds:
        packed["token_type_ids"] = np.asarray(feeds["token_type_ids"], dtype=np.int64)[mask][None]
    packed["position_ids"] = positions(mask, rule)[mask][None]
    packed["sequence_ids"] = np.repeat(np.arange(mask.shape[0], dtype=np.int64), lengths)[None]
    packed["cu_seqlens"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)  # (batch + 1,)
    return packed, Layout(mask)


def unpack(outputs: dict[str, np.ndarray], layout: Layout) -> dict[str, np.ndarray]:
    """The padded model's outputs from the packed ones: last_hidden_state [1, tokens, hidden]
    scattered to [batch, seq, hidden] (zeros at padding); sentence_embedding as it is."""
    out = dict(outputs)
    if "last_hidden_state" in outputs:
        hidden = outputs["last_hidden_state"][0]  # (tokens, hidden)
        full = np.zeros((*layout.mask.shape, hidden.shape[-1]), hidden.dtype)
        full[layout.mask] = hidden
        out["last_hidden_state"] = full
    return out


def padded_specs(inner: Model, section: dict) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """The padded inputs and outputs a packed model takes and gives, from its packed graph's specs."""
    by_name = {s.name: s for s in inner.inputs}
    ids = by_name["input_ids"]
    hi = ids.max_shape[1] if ids.max_shape else -1
    seq = None if hi < 0 else int(section.get("max_seq") or hi)
    batch = int(section.get("max_batch") or max(1, (by_name["cu_seqlens"].max_shape or (2,))[0] - 1))

    def token(name):
        lo, high = ((1, 1), (batch, seq)) if seq else (None, None)
        return IOSpec(name, "int64", (-1, -1), ("batch", "seq"), lo, high, ids.id_range if name == "input_ids" else None)

    inputs = tuple(token(n) for n in section["padded_inputs"])
    out = {s.name: s for s in inner.outputs}
    hidden = out["last_hidden_state"].shape[-1]
    outputs = (IOSpec("last_hidden_state", out["last_hidden_state"].dtype, (-1, -1, hidden), ("batch", "seq", None)),
               IOSpec("sentence_embedding", out["sentence_embedding"].dtype, (-1, hidden), ("batch", None)))
    return inputs, outputs


class PackedModel(Model):
    """A packed artifact behind the padded interface: padded feeds in, packed, run, unpacked."""

    def __init__(self, inner: Model):
        super().__init__()
        section = (inner.manifest or {}).get("packed")
        if not section:
            raise ManifestMismatchError(f"{inner.path.name} has no `packed` section in its record: "
                                        "it is not a packed artifact; rebuild it with python -m trt_seer build")
        self.inner, self.rule, self.path = inner, section["rule"], inner.path
        self.backend, self.manifest, self._gate = inner.backend, inner.manifest, CallGate(inner.path.name)
        self.inputs, self.outputs = padded_specs(inner, section)

    def infer_async(self, feeds, stream=None, *, outputs=None, out=None, device_outputs: bool = False) -> Completed:
        """Packs, runs the packed artifact, unpacks; runs to completion before it returns."""
        if device_outputs:
            raise InputError("a packed model returns host arrays (its outputs are unpacked on the host)")
        selected = self.selected_outputs(outputs)
        buffers = validate_out(selected, out)
        packed, layout = pack(validate_feeds(self.inputs, feeds), self.rule)
        names = [s.name for s in selected]
        self._gate.enter()
        try:
            results = unpack(self.inner.infer_async(packed, stream, outputs=names).result(), layout)
        finally:
            self._gate.leave()
        results = {n: results[n] for n in names}
        for name, buf in buffers.items():
            view = out_view(name, buf, results[name].shape)
            np.copyto(view, results[name])
            results[name] = view
        return Completed(results)

    def close(self) -> None:
        """Waits for calls in flight, then closes the packed artifact's model. Idempotent."""
        if self._gate.close():
            self.inner.close()
