"""Generation speed of a causal LM: decode tokens/s, time to first token (TTFT), memory and cost
per 1M generated tokens, for any `DecoderStep` (TensorRT engine or ONNX Runtime graph) and for
Hugging Face `generate` as the reference.

    from trt_seer.bench.generate import GenBenchSpec, measure_step
    rows = measure_step(step, vocab=32000, spec=GenBenchSpec())

Every path is timed the same way, as its users run it, with nothing added inside its loop: one
whole generation call (`new_tokens + 1` tokens per row, on the host: the engine's through
`runtime.generate.generate_ids`, as `Generator.generate` runs it; Hugging Face's `generate`), minus
one call that makes a single token (the prompt step alone). Decode tokens/s is `batch x new_tokens`
over that difference: the median of `repeats` (at least 3) runs, with the runs' spread ((max - min)
/ median of their rates). TTFT is the 1-token call at batch 1 (median). Both shapes run once,
untimed, first (compiles, CUDA graphs, allocations). An engine's own GPU time per step (CUDA events
it records anyway) is read in one more, untimed, run. Token ids are random: speed does not depend
on what the tokens say.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

MIN_RUNS = 3


@dataclass(frozen=True)
class GenBenchSpec:
    batches: tuple[int, ...] = (1, 8)
    prompt: int = 128  # prompt tokens before the timed decode steps
    contexts: tuple[int, ...] = ()  # more prompt lengths to decode after (decode cost vs context)
    new_tokens: int = 128
    ttft_prompts: tuple[int, ...] = (128, 1024)
    repeats: int = 3  # timed runs per point (at least MIN_RUNS)
    price_per_hour: float = 2.5  # the GPU's hourly price, for cost per 1M generated tokens
    seed: int = 0


def cost_per_million(price_per_hour: float, tokens_per_s: float) -> float:
    return price_per_hour / 3600.0 / tokens_per_s * 1e6


def _prompt(rng, batch: int, length: int, vocab: int) -> np.ndarray:
    return rng.integers(100, max(101, vocab - 1), size=(batch, length), dtype=np.int64)  # (batch, length)


def contexts(spec: GenBenchSpec) -> tuple[int, ...]:
    return (spec.prompt, *[c for c in spec.contexts if c != spec.prompt])


def next_token_fn(step):
    """(input_ids, attention_mask, position_ids) -> the greedy next token per row (batch,) int64:
    the step's `next_tokens` where it has one, else the argmax of its logits (bench/kernels.py)."""
    return getattr(step, "next_tokens", None) or (lambda *feeds: step.step(*feeds).argmax(axis=-1).astype(np.int64))


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def whole_minus_prompt(call: Callable[[int], None], new_tokens: int, runs: int) -> tuple[list[float], list[float]]:
    """(decode seconds, prompt seconds) per run: `call(n)` is one whole generation of `n` tokens per
    row; each run times `call(new_tokens + 1)`, then `call(1)` (the prompt step alone), and the
    decode time is the difference. Both shapes run once, untimed, first."""
    call(new_tokens + 1)
    call(1)
    decode, prompt = [], []
    for _ in range(max(MIN_RUNS, runs)):
        whole = seconds(lambda: call(new_tokens + 1))
        first = seconds(lambda: call(1))
        decode.append(whole - first)
        prompt.append(first)
    return decode, prompt


def rate_row(batch: int, context: int, new_tokens: int, decode_s: list[float]) -> dict:
    """Decode tokens/s at the median decode time, ms per step, and the runs' spread."""
    median = statistics.median(decode_s)
    if median <= 0:
        raise ValueError(f"decode time {median * 1e3:.3f} ms: the whole call was not slower than its prompt step; "
                         "time more new tokens")
    rates = [batch * new_tokens / s for s in decode_s if s > 0]
    return {"batch": batch, "context": context, "tokens_per_s": batch * new_tokens / median,
            "ms_per_step": median / new_tokens * 1e3, "runs": len(decode_s),
            "spread": (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else None}


def engine_call(step, prompt: np.ndarray, sampling=None) -> Callable[[int], None]:
    """`call(n)`: one generation of `n` new tokens per row from `prompt` through the product's own
    loop (`generate_ids`, greedy unless `sampling`), every token on the host; no EOS ends it early."""
    from trt_seer.runtime.generate import Sampling, generate_ids

    rows = [list(map(int, r)) for r in prompt]
    chosen = sampling or Sampling()

    def call(n: int) -> None:
        for _ in generate_ids(step, rows, replace(chosen, max_new_tokens=n), set(), pad_id=0):
            pass

    return call


def device_ms_per_step(step, prompt: np.ndarray, new_tokens: int, sampling=None) -> float | None:
    """Median of the engine's own GPU time per step (`last_gpu_ms`) over one untimed generation."""
    from trt_seer.runtime.generate import Sampling, generate_ids

    if not hasattr(step, "last_gpu_ms"):
        return None
    rows, chosen = [list(map(int, r)) for r in prompt], replace(sampling or Sampling(), max_new_tokens=new_tokens + 1)
    seen = [step.last_gpu_ms for _ in generate_ids(step, rows, chosen, set(), pad_id=0)][len(rows):]  # after the prompt's
    seen = [ms for ms in seen if ms is not None]
    return statistics.median(seen) if seen else None


def decode_rate(step, batch: int, spec: GenBenchSpec, vocab: int, context: int | None = None,
                sampling=None) -> dict:
    """Decode of `spec.new_tokens` after a prompt of `context` (default `spec.prompt`) tokens,
    timed as the module docstring says; `sampling`: a runtime.generate.Sampling (default greedy),
    drawn where the product's loop draws it (the device sampler where the step has one)."""
    context = spec.prompt if context is None else context
    prompt = _prompt(np.random.default_rng(spec.seed), batch, context, vocab)
    decode_s, _ = whole_minus_prompt(engine_call(step, prompt, sampling), spec.new_tokens, spec.repeats)
    return {**rate_row(batch, context, spec.new_tokens, decode_s),
            "device_ms_per_step": device_ms_per_step(step, prompt, spec.new_tokens, sampling)}


def ttft_ms(step, prompt: int, spec: GenBenchSpec, vocab: int) -> float:
    """Median wall time of a 1-token generation at batch 1 (prefill and the first token on the host)."""
    call = engine_call(step, _prompt(np.random.default_rng(spec.seed + prompt), 1, prompt, vocab))
    call(1)  # warms the shape up, untimed
    return statistics.median(seconds(lambda: call(1)) * 1e3 for _ in range(max(MIN_RUNS, spec.repeats)))


def measure_step(step, vocab: int, spec: GenBenchSpec = GenBenchSpec(), sampling=None) -> dict:
    """{"decode": [per batch], "ttft_ms": {prompt: ms}} for one DecoderStep; `sampling` as for
    `decode_rate` (default greedy)."""
    for b in spec.batches:  # every cache window's context and graph, before any timing
        getattr(step, "warm_up", lambda batch: None)(b)
    limit = getattr(step, "max_total", None)
    out = {"decode": [decode_rate(step, b, spec, vocab, c, sampling) for c in contexts(spec) for b in spec.batches],
           "ttft_ms": {}}
    for p in spec.ttft_prompts:
        if limit is None or p < limit:
            out["ttft_ms"][p] = ttft_ms(step, p, spec, vocab)
    return out


def hf_generate_rows(model, vocab: int, spec: GenBenchSpec = GenBenchSpec(), **generate_kw) -> dict:
    """The same figures for Hugging Face `generate` (greedy) in the same form, timed the same way:
    the whole call (tokens copied to the host) minus a 1-token call, nothing inside its loop.
    `generate_kw`: e.g. cache_implementation="static" (transformers then compiles the step; each
    new batch and length compiles once, in the untimed first runs)."""
    import torch

    def hf_call(ids):
        def call(n: int) -> None:
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, **generate_kw)
            out.cpu()  # the tokens reach the host, as the engines' do (and the GPU is done)
        return call

    def prompt(batch: int, length: int):
        return torch.from_numpy(_prompt(np.random.default_rng(spec.seed), batch, length, vocab)).to(model.device)

    decode = []
    for c in contexts(spec):
        for b in spec.batches:
            decode_s, _ = whole_minus_prompt(hf_call(prompt(b, c)), spec.new_tokens, spec.repeats)
            decode.append(rate_row(b, c, spec.new_tokens, decode_s))
    ttft = {}
    for p in spec.ttft_prompts:
        call = hf_call(prompt(1, p))
        call(1)
        ttft[p] = statistics.median(seconds(lambda: call(1)) * 1e3 for _ in range(max(MIN_RUNS, spec.repeats)))
    return {"decode": decode, "ttft_ms": ttft}


def table(rows: dict[str, dict], spec: GenBenchSpec, baseline: str | None = None) -> str:
    """Markdown: one row per path; decode tokens/s per batch (the median run, ± half the runs'
    range), TTFT per prompt, memory, cost."""
    ctx = contexts(spec)
    cols = [(b, c) for c in ctx for b in spec.batches]
    names = [f"decode tok/s b{b}" + (f" ctx {c}" if len(ctx) > 1 else "") for b, c in cols]
    head = ["Path", *names, f"step ms b{spec.batches[0]} (device)",
            *(f"TTFT {p} ms" for p in spec.ttft_prompts),
            "GPU memory", f"$ / 1M tokens b{spec.batches[-1]}"]
    if baseline:  # decode tokens/s against the baseline's, per batch at the first context
        head[1 + len(cols):1 + len(cols)] = [f"vs {baseline} b{b}" for b in spec.batches]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = [d["tokens_per_s"] for d in rows[baseline]["decode"]] if baseline in rows else None
    for name, r in rows.items():
        rates = [d["tokens_per_s"] for d in r["decode"]]  # in `cols` order
        cells = [name, *(f"{d['tokens_per_s']:,.0f}" + _spread(d) for d in r["decode"])]
        if baseline:
            cells += [f"{rates[i] / base[i]:.2f}x" if base else "n/a" for i in range(len(spec.batches))]
        first = r["decode"][0]
        device = first.get("device_ms_per_step")
        cells.append(f"{first['ms_per_step']:.2f}" + (f" ({device:.2f})" if device is not None else ""))
        cells += [f"{r['ttft_ms'][p]:.1f}" if p in r["ttft_ms"] else "n/a" for p in spec.ttft_prompts]
        mem = r.get("memory_bytes")
        cells.append("n/a" if mem is None else f"{mem / 2**30:.2f} GiB")
        cells.append(f"{cost_per_million(spec.price_per_hour, rates[len(spec.batches) - 1]):.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spread(row: dict) -> str:
    spread = row.get("spread")
    return f" ±{50 * spread:.1f}%" if spread is not None else ""
