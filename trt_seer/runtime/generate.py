"""Text generation against any `DecoderStep` (ONNX Runtime on CPU, TensorRT on GPU).

    from trt_seer.runtime.generate import Sampling, load_generator
    gen = load_generator("engines/my-llama.fp16.onnx")          # or .engine
    for result in gen.generate(["Once upon a time", "Hi"], Sampling(max_new_tokens=20)):
        print(result.text)
    for row, token_id, piece in gen.stream(["Hi"], Sampling(temperature=0.8, top_p=0.9, seed=0)):
        print(piece, end="", flush=True)

Prompts of different lengths share a batch, padded on the left (so every row's next token comes from
the last position) with position_ids counted over real tokens. Greedy when temperature is 0, else
seeded sampling with top-k / top-p. Each row stops at an EOS token or after max_new_tokens.
Imports neither torch nor transformers: tokenization is the `tokenizers` package.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from trt_seer.decoder_io import position_ids
from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError
from trt_seer.runtime.sampling import choose


class DecoderStep(Protocol):
    max_total: int

    def reset(self, batch: int) -> None: ...  # empty cache (past_seq = 0)

    def step(self, input_ids, attention_mask, position_ids) -> np.ndarray: ...  # (batch, vocab) float32

    # optional: `next_tokens(input_ids, attention_mask, position_ids)` -> (batch,) int64, the greedy
    # next token per row, which greedy generation uses instead of `step` (TensorRTDecoder); and
    # `pipelines` True with `greedy_tokens(input_ids, attention_mask, count)`, greedy decoding that
    # feeds the tokens back on the device, which greedy generation then uses instead of both; and
    # `samples` True with `sampled_tokens(input_ids, attention_mask, count, sampling, rng)`, the same
    # for temperature / top-p sampling with a device sampler (the host's draws, runtime/sampling.py)


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. temperature 0: greedy (argmax); top_k 0 and top_p 1: no cut."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]  # generated, the final EOS included
    text: str  # the generated text, special tokens skipped
    finish_reason: str  # "eos" | "length"


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both (batch, longest prompt), padded on the left."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):], mask[row, width - len(p):] = p, 1
    return ids, mask


def generate_ids(step: DecoderStep, prompts: list[list[int]], sampling: Sampling, eos_ids: set[int],
                 pad_id: int, rng: np.random.Generator | None = None) -> Iterator[tuple[int, int]]:
    """Yields (row, token id) as each row's tokens are produced; a row ends after an EOS token.
    `rng` (default: seeded with `sampling.seed`) draws the samples."""
    ids, mask = left_pad(prompts, pad_id)
    budget = min(sampling.max_new_tokens, step.max_total - ids.shape[1] + 1)
    if budget < 1:
        raise InputError(f"a prompt of {ids.shape[1]} tokens leaves no room in the {step.max_total} tokens "
                         "the model takes")
    rng = rng or np.random.default_rng(sampling.seed)
    eos = np.array(sorted(eos_ids), dtype=np.int64)
    step.reset(len(prompts))
    if sampling.temperature == 0 and getattr(step, "pipelines", False):
        yield from _pipelined(step.greedy_tokens(ids, mask, budget), eos, pad_id)
        return
    if sampling.temperature > 0 and not sampling.top_k and getattr(step, "samples", False):
        yield from _pipelined(step.sampled_tokens(ids, mask, budget, sampling, rng), eos, pad_id)
        return
    greedy_ids = getattr(step, "next_tokens", None) if sampling.temperature == 0 else None

    def next_of(ids, mask, seq):  # the next token per row; greedy on the device where the step can
        if greedy_ids is not None:
            return greedy_ids(ids, mask, position_ids(mask, seq))
        return choose(step.step(ids, mask, position_ids(mask, seq)), sampling, rng)

    chosen = next_of(ids, mask, ids.shape[1])
    done = np.zeros(len(prompts), dtype=bool)
    for t in range(budget):
        tokens = np.where(done, pad_id, chosen)
        for row in np.flatnonzero(~done):
            yield int(row), int(tokens[row])
        done |= np.isin(tokens, eos)
        if done.all() or t == budget - 1:
            return
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
        chosen = next_of(tokens[:, None], mask, 1)


def _pipelined(steps: Iterator[np.ndarray], eos: np.ndarray, pad_id: int) -> Iterator[tuple[int, int]]:
    """`generate_ids` over a decoder that feeds its greedy tokens back on the device
    (TensorRTDecoder.greedy_tokens): the same (row, token) pairs, a row's end read from its tokens."""
    done = None
    for chosen in steps:
        done = np.zeros(len(chosen), dtype=bool) if done is None else done
        tokens = np.where(done, pad_id, chosen)
        for row in np.flatnonzero(~done):
            yield int(row), int(tokens[row])
        done |= np.isin(tokens, eos)
        if done.all():
            steps.close()
            return


class TextStream:
    """Turns one row's token ids into text pieces; holds back a piece that ends inside a character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence of byte-level tokens
            return ""
        piece, self.text = text[len(self.text):], text
        return piece


class Generator:
    """A DecoderStep with its tokenizer and the artifact's `decoder` section."""

    def __init__(self, step: DecoderStep, decoder: dict, tokenizer):
        self.step, self.decoder, self.tokenizer = step, decoder, tokenizer
        eos = decoder.get("eos_token_id")
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = decoder.get("pad_token_id")
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self.max_batch = int(decoder.get("max_batch") or 1)
        self.max_prompt = int(min(decoder.get("max_prompt") or step.max_total, step.max_total))

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids per prompt; InputError for an empty prompt or one longer than the artifact takes."""
        rows = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        for i, ids in enumerate(rows):
            if not ids:
                raise InputError(f"prompt {i + 1} is empty after tokenization")
            if len(ids) > self.max_prompt:
                raise InputError(f"prompt {i + 1} has {len(ids)} tokens; the artifact takes at most "
                                 f"{self.max_prompt}")
        return rows

    def stream_ids(self, prompts: list[list[int]], sampling: Sampling) -> Iterator[tuple[int, int]]:
        """(row, token id) over all prompts, max_batch rows per batch, one random stream for all."""
        rng = np.random.default_rng(sampling.seed)
        for start in range(0, len(prompts), self.max_batch):
            chunk = prompts[start:start + self.max_batch]
            for row, token in generate_ids(self.step, chunk, sampling, self.eos_ids, self.pad_id, rng):
                yield start + row, token

    def stream(self, texts: list[str], sampling: Sampling = Sampling()) -> Iterator[tuple[int, int, str]]:
        """Yields (row, token id, text piece) as tokens are produced."""
        streams = {}
        for row, token in self.stream_ids(self.encode(texts), sampling):
            piece = streams.setdefault(row, TextStream(self.tokenizer)).push(token)
            yield row, token, piece

    def generate(self, texts: list[str], sampling: Sampling = Sampling()) -> list[Generation]:
        """One Generation per prompt, in order."""
        prompts = self.encode(texts)
        tokens: list[list[int]] = [[] for _ in texts]
        for row, token in self.stream_ids(prompts, sampling):
            tokens[row].append(token)
        return [Generation(t, p, ids, self.tokenizer.decode(ids, skip_special_tokens=True),
                           "eos" if ids and ids[-1] in self.eos_ids else "length")
                for t, p, ids in zip(texts, prompts, tokens)]


def load_step(artifact: str | Path, backend: str = "auto", **opts) -> DecoderStep:
    """The DecoderStep of an artifact: `.engine` on TensorRT, `.onnx` on ONNX Runtime (CPU); an engine
    where no TensorRT runs falls back to its `.onnx` sibling with a warning. `backend` and `opts` as
    for `runtime.load` (EngineOptions and OrtOptions fields)."""
    from trt_seer.runtime.backends import runnable, split_options

    engine_opts, ort_opts = split_options(opts)
    path, chosen = runnable(Path(artifact), backend, engine_opts.device, stacklevel=4)
    if chosen == "tensorrt":
        from trt_seer.runtime import decoder_trt  # TensorRT and CUDA load only for engines

        return decoder_trt.TensorRTDecoder(path, engine_opts)
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    return OrtDecoderStep(path, ort_opts)


def artifact_decoder(artifact: str | Path) -> dict:
    """The `decoder` section of an artifact's manifest (engine) or record (ONNX)."""
    from trt_seer.runtime.decoder_ort import decoder_record

    path = Path(artifact)
    if not path.is_file():
        raise InputError(f"artifact not found: {path}")
    meta = (manifest_io.engine_manifest_path(path) if path.suffix == ".engine"
            else manifest_io.record_path(path))
    return decoder_record(path, manifest_io.read_if_exists(meta), meta)


def load_tokenizer(artifact: Path, decoder: dict, directory: str | Path | None = None):
    """The `tokenizers` tokenizer copied beside the artifact (or from `directory`)."""
    from trt_seer.tokenizer import load_tokenizer as from_directory

    return from_directory(tokenizer_folder(artifact, decoder, directory), hint="pass trt-seer generate --tokenizer DIR")


def tokenizer_folder(artifact: Path, decoder: dict, directory: str | Path | None = None) -> Path:
    """Where the artifact's tokenizer files are: `directory`, else the folder copied beside it."""
    if directory is None and not decoder.get("tokenizer"):
        raise InputError(f"{Path(artifact).name} has no tokenizer beside it; pass a directory with "
                         "tokenizer.json (trt-seer generate --tokenizer DIR)")
    return Path(directory) if directory is not None else Path(artifact).parent / decoder["tokenizer"]


def load_generator(artifact: str | Path, backend: str = "auto", *, tokenizer_dir: str | Path | None = None,
                   **opts) -> Generator:
    """Opens a causal-LM artifact (`.onnx` or `.engine`) for generation. `backend` and `opts` as for
    `runtime.load` (device, use_cuda_graph, runtime_cache, verbose, ...; threads, optimization, ...);
    `tokenizer_dir`: where tokenizer.json is when it is not beside the artifact."""
    decoder = artifact_decoder(artifact)
    tokenizer = load_tokenizer(Path(artifact), decoder, tokenizer_dir)
    return Generator(load_step(artifact, backend, **opts), decoder, tokenizer)
