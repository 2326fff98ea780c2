"""Texts in, one output row per text out, batched the way a server batches: one length limit (the
engine profile's and the model's own, read once), every text tokenised and cut to it, texts sorted
by length into batches of at most the engine's largest batch (each padded only to its own longest
text), results returned in input order. `trt-seer run` uses it; so can a service.

    from trt_seer.runtime import load
    from trt_seer.runtime.texts import TextRunner
    with load("engines/all-MiniLM-L6-v2.fp16.engine") as model:
        runner = TextRunner.open(model, "engines/all-MiniLM-L6-v2.fp16.engine")
        rows = runner.run(["hello world", "a longer sentence"])   # [{output name: array}], in order

A text longer than the limit is truncated (its final special token kept); each `run` logs ONE
warning with the number of truncated texts and which limit applied.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, UnsupportedError
from trt_seer.runtime.limits import recorded_max_length
from trt_seer.tokenizer import load_tokenizer, model_max_length

log = logging.getLogger(__name__)
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
UNBOUNDED_LENGTH = 512  # an ONNX graph with no profile, no recorded limit and no model config saying one
UNBOUNDED_BATCH = 32  # texts per call where no engine profile bounds the batch


@dataclass(frozen=True)
class LengthLimit:
    """The longest token sequence fed (`tokens`) and every limit that was known, {what: tokens}."""

    tokens: int
    known: dict

    @property
    def applied(self) -> str:
        """Which limits set `tokens` (several when they agree)."""
        return " and ".join(what for what, n in self.known.items() if n == self.tokens) or "the default"

    def describe(self) -> str:
        """Which limit applied, and the others known: "the limit of A; B is 32"."""
        others = [f"{what} is {n}" for what, n in self.known.items() if n != self.tokens]
        return "; ".join([f"the limit of {self.applied}", *others])


@dataclass(frozen=True)
class BatchShape:
    """Rows and sequence length a call may take: the engine profile's, else what ONNX Runtime takes."""

    min_batch: int = 1
    max_batch: int = UNBOUNDED_BATCH
    min_seq: int = 1


def engine_profile(model, artifact: str | Path | None = None) -> dict | None:
    """The engine's profile {batch, seq: [min, opt, max]}: from the model's manifest, else (the CPU
    fallback runs the engine's ONNX sibling) from the manifest of the engine `artifact` names."""
    profiles = (model.manifest or {}).get("profiles")
    if not profiles and artifact is not None and Path(artifact).suffix == ".engine":
        engine_manifest = manifest_io.read_if_exists(manifest_io.engine_manifest_path(Path(artifact)))
        profiles = (engine_manifest or {}).get("profiles")
    return profiles[0] if profiles else None


def length_limit(model, profile: dict | None, checkpoint: Path | None) -> LengthLimit:
    """The engine profile's max seq, the model's positions and its own max length (recorded at
    build, else read from the checkpoint's sentence-transformers / tokenizer config): the least."""
    known = {}
    if profile:
        known["the engine profile's max seq"] = int(profile["seq"][2])
    ids = _token_input(model)
    if not profile and ids.max_shape is not None:
        known["the model's input profile"] = int(ids.max_shape[1])
    if ids.max_positions:
        known["the model's max positions"] = int(ids.max_positions)
    own = recorded_max_length(model.manifest) or (model_max_length(checkpoint) if checkpoint else None)
    if own:
        known[f"the model's {own[1]}"] = own[0]
    return LengthLimit(min(known.values(), default=UNBOUNDED_LENGTH), known)


def _token_input(model):
    ids = next((s for s in model.inputs if s.name == "input_ids"), None)
    if ids is None or set(model.input_names) - set(TOKEN_INPUTS):
        raise UnsupportedError(f"the model takes {list(model.input_names)}; text runs feed token ids "
                               "(input_ids, attention_mask[, token_type_ids])")
    return ids


def batch_shape(model, profile: dict | None, cap: int | None = None) -> BatchShape:
    """Batches of at most the engine's largest batch (and `cap`, if given); on TensorRT at least
    its smallest batch and seq. The CPU fallback takes any shape, so only the largest batch holds."""
    on_engine = model.backend == "tensorrt" and profile is not None
    largest = int(profile["batch"][2]) if profile else UNBOUNDED_BATCH
    lo_batch = int(profile["batch"][0]) if on_engine else 1
    hi_batch = max(lo_batch, min(largest, cap or largest))
    return BatchShape(lo_batch, hi_batch, int(profile["seq"][0]) if on_engine else 1)


def length_batches(lengths: Sequence[int], max_batch: int) -> list[list[int]]:
    """Indices sorted by length (stable: equal lengths keep input order), cut into batches of at
    most `max_batch`: each batch pads only to its own longest row."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start:start + max_batch] for start in range(0, len(order), max_batch)]


def pad_rows(rows: list[list[int]], inputs: Sequence[str], seq: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Right-padded int64 feeds (`pad_id`, mask 0) for the model's token inputs, (len(rows), seq)."""
    ids = np.full((len(rows), seq), pad_id, dtype=np.int64)  # (batch, seq)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: feeds[name] for name in inputs}


@dataclass
class TextRunner:
    """A model with its tokenizer, length limit and batch shape, all read once at `open`; `run`
    may be called from one thread at a time per runner (a model's `infer` is thread-safe)."""

    model: object
    checkpoint: Path  # the tokenizer's directory (a checkpoint's also has config.json's labels)
    tokenizer: object
    limit: LengthLimit
    shape: BatchShape

    @classmethod
    def open(cls, model, artifact: str | Path | None = None, tokenizer_dir: str | Path | None = None,
             max_batch: int | None = None, hint: str = "pass the tokenizer directory") -> "TextRunner":
        """`artifact`: the file the caller asked for (an engine whose CPU fallback runs still has
        its profile); `tokenizer_dir`: default the checkpoint its manifest names; `hint`: how the
        caller names the tokenizer directory, for errors."""
        checkpoint = Path(tokenizer_dir) if tokenizer_dir else _checkpoint(model, artifact, hint)
        profile = engine_profile(model, artifact)
        limit = length_limit(model, profile, checkpoint)
        tokenizer = load_tokenizer(checkpoint, limit.tokens, hint)
        return cls(model, checkpoint, tokenizer, limit, batch_shape(model, profile, max_batch))

    def encode(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """(token ids per text, cut to the limit; how many texts were cut)."""
        encodings = self.tokenizer.encode_batch(list(texts))
        return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)

    def run(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[dict]:
        """One {output name: array} per text, in input order. `progress(n)`: n more texts done."""
        ids, truncated = self.encode(texts)
        if truncated:
            log.warning("warning: %d of %d texts were longer than %d tokens and were truncated to %d (%s)",
                        truncated, len(ids), self.limit.tokens, self.limit.tokens, self.limit.describe())
        rows: list[dict | None] = [None] * len(ids)
        for batch in length_batches([len(r) for r in ids], self.shape.max_batch):
            for i, row in zip(batch, self._infer([ids[i] for i in batch])):
                rows[i] = row
            if progress is not None:
                progress(len(batch))
        return rows

    def _infer(self, rows: list[list[int]]) -> list[dict]:
        """Runs one batch (rows repeated up to the smallest batch the engine takes); one output
        dict per real row, outputs along the sequence cut to the row's own length."""
        real = len(rows)
        rows = rows + [rows[-1]] * max(0, self.shape.min_batch - real)
        seq = max(self.shape.min_seq, max(len(r) for r in rows))
        out = self.model.infer(pad_rows(rows, self.model.input_names, seq))
        per_seq = {s.name for s in self.model.outputs if len(s.axes) > 1 and s.axes[1] == "seq"}
        return [{name: (v[i, :len(rows[i])] if name in per_seq else v[i]) for name, v in out.items()}
                for i in range(real)]


def _checkpoint(model, artifact, hint: str) -> Path:
    checkpoint = ((model.manifest or {}).get("source") or {}).get("checkpoint")
    if not checkpoint:
        name = Path(artifact or model.path).name
        raise InputError(f"{name} has no manifest naming its checkpoint; {hint} (a directory with tokenizer.json)")
    return Path(checkpoint)
