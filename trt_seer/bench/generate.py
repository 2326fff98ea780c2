"""Generation speed of a causal LM: decode tokens/s, time to first token (TTFT), memory and cost
per 1M generated tokens, for any `DecoderStep` (TensorRT engine or ONNX Runtime graph) and for
Hugging Face `generate` as the reference.

    from trt_seer.bench.generate import GenBenchSpec, measure_step
    rows = measure_step(step, vocab=32000, spec=GenBenchSpec())

Every figure is end to end as a caller sees it: token ids from the host in, logits back on the
host, the next token chosen on the host (greedy). Decode tokens/s counts `batch x new_tokens`
tokens over the decode steps after the prompt; TTFT is one prompt step at batch 1 (median of
`repeats`). Token ids are random: speed does not depend on what the tokens say.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GenBenchSpec:
    batches: tuple[int, ...] = (1, 8)
    prompt: int = 128  # prompt tokens before the timed decode steps
    new_tokens: int = 128
    ttft_prompts: tuple[int, ...] = (128, 1024)
    repeats: int = 3
    price_per_hour: float = 2.5  # the GPU's hourly price, for cost per 1M generated tokens
    seed: int = 0


def cost_per_million(price_per_hour: float, tokens_per_s: float) -> float:
    return price_per_hour / 3600.0 / tokens_per_s * 1e6


def _prompt(rng, batch: int, length: int, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = rng.integers(100, max(101, vocab - 1), size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), dtype=np.int64)
    pos = np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length)).copy()
    return ids, mask, pos


def decode_rate(step, batch: int, spec: GenBenchSpec, vocab: int) -> dict:
    """Greedy decode of `spec.new_tokens` after a `spec.prompt` prompt: tokens/s and ms per step."""
    rng = np.random.default_rng(spec.seed)
    ids, mask, pos = _prompt(rng, batch, spec.prompt, vocab)
    step.reset(batch)
    logits = step.step(ids, mask, pos)
    device_ms = []
    start = time.perf_counter()
    for t in range(spec.new_tokens):
        token = logits.argmax(axis=-1).astype(np.int64)[:, None]  # (batch, 1)
        mask = np.ones((batch, spec.prompt + t + 1), dtype=np.int64)
        logits = step.step(token, mask, np.full((batch, 1), spec.prompt + t, dtype=np.int64))
        if getattr(step, "last_gpu_ms", None) is not None:
            device_ms.append(step.last_gpu_ms)
    seconds = time.perf_counter() - start
    return {"batch": batch, "tokens_per_s": batch * spec.new_tokens / seconds,
            "ms_per_step": seconds / spec.new_tokens * 1e3,
            "device_ms_per_step": statistics.median(device_ms) if device_ms else None}


def ttft_ms(step, prompt: int, spec: GenBenchSpec, vocab: int) -> float:
    """Median wall time of one prompt step at batch 1 (prefill + the first token's logits)."""
    rng = np.random.default_rng(spec.seed + prompt)
    times = []
    for _ in range(spec.repeats + 1):  # the first run warms the shape up and is dropped
        ids, mask, pos = _prompt(rng, 1, prompt, vocab)
        step.reset(1)
        start = time.perf_counter()
        step.step(ids, mask, pos)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def measure_step(step, vocab: int, spec: GenBenchSpec = GenBenchSpec()) -> dict:
    """{"decode": [per batch], "ttft_ms": {prompt: ms}} for one DecoderStep."""
    small = GenBenchSpec(**{**spec.__dict__, "new_tokens": 8})
    decode_rate(step, spec.batches[0], small, vocab)  # warm-up: first-run kernels, allocations
    limit = getattr(step, "max_total", None)
    out = {"decode": [decode_rate(step, b, spec, vocab) for b in spec.batches], "ttft_ms": {}}
    for p in spec.ttft_prompts:
        if limit is None or p < limit:
            out["ttft_ms"][p] = ttft_ms(step, p, spec, vocab)
    return out


def hf_generate_rows(model, vocab: int, spec: GenBenchSpec = GenBenchSpec()) -> dict:
    """The same figures for Hugging Face `generate` (greedy) on a CUDA model, in the same form."""
    import torch

    def run(batch: int, prompt: int, new: int) -> float:
        ids = torch.randint(100, vocab - 1, (batch, prompt), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False)
        out.cpu()  # the tokens reach the host, as the engines' do
        return time.perf_counter() - start

    run(spec.batches[0], spec.prompt, 8)
    decode = []
    for b in spec.batches:
        total, first = run(b, spec.prompt, spec.new_tokens), run(b, spec.prompt, 1)
        seconds = max(total - first, 1e-9)  # decode steps only: the prompt step is timed apart
        decode.append({"batch": b, "tokens_per_s": b * (spec.new_tokens - 1) / seconds,
                       "ms_per_step": seconds / (spec.new_tokens - 1) * 1e3})
    ttft = {p: statistics.median(run(1, p, 1) * 1e3 for _ in range(spec.repeats)) for p in spec.ttft_prompts}
    return {"decode": decode, "ttft_ms": ttft}


def table(rows: dict[str, dict], spec: GenBenchSpec, baseline: str | None = None) -> str:
    """Markdown: one row per path; decode tokens/s per batch, TTFT per prompt, memory, cost."""
    head = ["Path", *(f"decode tok/s b{b}" for b in spec.batches), f"step ms b{spec.batches[0]} (device)",
            *(f"TTFT {p} ms" for p in spec.ttft_prompts),
            "GPU memory", f"$ / 1M tokens b{spec.batches[-1]}"]
    if baseline:
        head.insert(1 + len(spec.batches), f"vs {baseline} b{spec.batches[0]}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = rows.get(baseline, {}).get("decode", [{}])[0].get("tokens_per_s") if baseline else None
    for name, r in rows.items():
        rates = [d["tokens_per_s"] for d in r["decode"]]
        cells = [name, *(f"{x:,.0f}" for x in rates)]
        if baseline:
            cells.append(f"{rates[0] / base:.2f}x" if base else "n/a")
        first = r["decode"][0]
        device = first.get("device_ms_per_step")
        cells.append(f"{first['ms_per_step']:.2f}" + (f" ({device:.2f})" if device is not None else ""))
        cells += [f"{r['ttft_ms'][p]:.1f}" if p in r["ttft_ms"] else "n/a" for p in spec.ttft_prompts]
        mem = r.get("memory_bytes")
        cells.append("n/a" if mem is None else f"{mem / 2**30:.2f} GiB")
        cells.append(f"{cost_per_million(spec.price_per_hour, rates[-1]):.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
