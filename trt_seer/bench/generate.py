"""Generation speed of a causal LM: decode tokens/s, time to first token (TTFT), memory and cost
per 1M generated tokens, for any `DecoderStep` (TensorRT engine or ONNX Runtime graph) and for
Hugging Face `generate` as the reference.

    from trt_seer.bench.generate import GenBenchSpec, measure_step
    rows = measure_step(step, vocab=32000, spec=GenBenchSpec())

Every figure is end to end as a caller sees it: token ids from the host in, the next token on the
host (greedy: the step's `next_tokens` where it has one, else the argmax of its logits). Decode
tokens/s counts `batch x new_tokens` tokens over the decode steps after a prompt of each of
`contexts` tokens, the prompt step timed apart; TTFT is one prompt step at batch 1 (median of
`repeats`). Hugging Face `generate` (eager, or its static cache compiled by transformers) is timed
the same way: a logits processor stamps the end of every step, so the prompt step and the compile
are left out. Token ids are random: speed does not depend on what the tokens say.
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
    contexts: tuple[int, ...] = ()  # more prompt lengths to decode after (decode cost vs context)
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


def contexts(spec: GenBenchSpec) -> tuple[int, ...]:
    return (spec.prompt, *[c for c in spec.contexts if c != spec.prompt])


def next_token_fn(step, sampling=None, rng: np.random.Generator | None = None):
    """(input_ids, attention_mask, position_ids) -> the next token per row (batch,) int64: greedy
    (the step's `next_tokens` where it has one, else the argmax of its logits), or with `sampling`
    (a runtime.generate.Sampling of temperature > 0) runtime/sampling.py's choice on the host,
    drawing from `rng`."""
    if sampling is not None and sampling.temperature > 0:
        from trt_seer.runtime.sampling import choose

        return lambda *feeds: choose(step.step(*feeds), sampling, rng)
    return getattr(step, "next_tokens", None) or (lambda *feeds: step.step(*feeds).argmax(axis=-1).astype(np.int64))


def decode_rate(step, batch: int, spec: GenBenchSpec, vocab: int, context: int | None = None,
                sampling=None) -> dict:
    """Decode of `spec.new_tokens` after a prompt of `context` (default `spec.prompt`) tokens:
    tokens/s and ms per step. Greedy (on the device where the step can; with the tokens fed back on
    the device, one step in flight while the host takes the last, where the step `pipelines`, as
    `generate` runs it), or `sampling` (a runtime.generate.Sampling: drawn by the device sampler
    and fed back the same way where the step `samples`, else the logits come back and
    runtime/sampling.py chooses on the host)."""
    context = spec.prompt if context is None else context
    rng = np.random.default_rng(spec.seed)
    ids, mask, pos = _prompt(rng, batch, context, vocab)
    step.reset(batch)
    device_ms = []
    on_device = sampling is not None and not sampling.top_k and getattr(step, "samples", False)
    if on_device or (sampling is None and getattr(step, "pipelines", False)):  # as generation runs it
        tokens = (step.sampled_tokens(ids, mask, spec.new_tokens + 1, sampling, np.random.default_rng(spec.seed + 1))
                  if on_device else step.greedy_tokens(ids, mask, spec.new_tokens + 1))
        next(tokens)  # the prompt step's token; the first decode step is already under way
        start = time.perf_counter()
        for _ in tokens:
            device_ms.append(step.last_gpu_ms)
        seconds = time.perf_counter() - start
    else:
        next_of = next_token_fn(step, sampling, np.random.default_rng(spec.seed + 1))
        token = next_of(ids, mask, pos)
        start = time.perf_counter()
        for t in range(spec.new_tokens):
            mask = np.ones((batch, context + t + 1), dtype=np.int64)
            token = next_of(token[:, None], mask, np.full((batch, 1), context + t, dtype=np.int64))
            if getattr(step, "last_gpu_ms", None) is not None:
                device_ms.append(step.last_gpu_ms)
        seconds = time.perf_counter() - start
    return {"batch": batch, "context": context, "tokens_per_s": batch * spec.new_tokens / seconds,
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


def measure_step(step, vocab: int, spec: GenBenchSpec = GenBenchSpec(), sampling=None) -> dict:
    """{"decode": [per batch], "ttft_ms": {prompt: ms}} for one DecoderStep; `sampling` as for
    `decode_rate` (default greedy)."""
    small = GenBenchSpec(**{**spec.__dict__, "new_tokens": 8})
    decode_rate(step, spec.batches[0], small, vocab, sampling=sampling)  # warm-up: first-run kernels, allocations
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
    """The same figures for Hugging Face `generate` (greedy) on a CUDA model, in the same form.
    `generate_kw`: e.g. cache_implementation="static" (transformers then compiles the step; each
    new batch and length compiles once, in the untimed first run)."""
    import torch
    import transformers

    device = model.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class Stamps(transformers.LogitsProcessor):  # called once per step, after the step's forward
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            sync()
            self.times.append(time.perf_counter())
            return scores

    def run(batch: int, prompt: int, new: int) -> list[float]:
        ids = torch.randint(100, vocab - 1, (batch, prompt), device=device)
        stamps = Stamps()
        sync()
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, logits_processor=[stamps], **generate_kw)
        out.cpu()  # the tokens reach the host, as the engines' do
        return [start, *stamps.times]

    decode = []
    for c in contexts(spec):
        for b in spec.batches:
            # warm-up (and compile) at the timed run's very shape: a static cache of another
            # length would be compiled again inside the timed run
            run(b, c, spec.new_tokens + 1)
            times = run(b, c, spec.new_tokens + 1)
            seconds = times[-1] - times[1]  # decode steps only: from the prompt step's end
            decode.append({"batch": b, "context": c, "tokens_per_s": b * spec.new_tokens / seconds,
                           "ms_per_step": seconds / spec.new_tokens * 1e3})
    ttft = {}
    for p in spec.ttft_prompts:
        run(1, p, 1)
        ttft[p] = statistics.median((lambda t: (t[1] - t[0]) * 1e3)(run(1, p, 1)) for _ in range(spec.repeats))
    return {"decode": decode, "ttft_ms": ttft}


def table(rows: dict[str, dict], spec: GenBenchSpec, baseline: str | None = None) -> str:
    """Markdown: one row per path; decode tokens/s per batch, TTFT per prompt, memory, cost."""
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
        cells = [name, *(f"{x:,.0f}" for x in rates)]
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
