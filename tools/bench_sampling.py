"""Next-token choice against greedy, per generated token: a tiny Llama with a 32k vocabulary on ONNX
Runtime (CPU), batch 8, the model's own logits; appends the table to docs/BENCHMARKS.md.

    python tools/bench_sampling.py --work out/sampling [--append docs/BENCHMARKS.md]

Each decode step is timed in two parts, the ONNX Runtime step and the host's choice of the next
token (runtime/sampling.py), over `--new-tokens` steps after a `--prompt`-token prompt, `--repeats`
times; medians per part. Cost per token = (step + choice) / batch; the ratio of a sampling mode to
greedy is what the target (top-p <= 1.25x greedy per token) reads. The choice alone is also shown
against the previous full float64 sort of the vocabulary, and on synthetic "trained-LM" logits (a
few strong candidates over a flat tail): a random model's logits are nearly flat, the costliest case.
A control row, greedy with a 0.5 ms busy wait after each choice, shows what any pause of that
length between two steps costs the next ONNX Runtime step on the machine at hand. Sampling draws in
runtime/_nucleus.c's compiled loops where the install built them; the "numpy draw" row times the
numpy path that installs without a C compiler take, in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)
MODES = {"greedy": dict(), "top-p 0.9, T 0.8": dict(temperature=0.8, top_p=0.9),
         "top-k 50, T 0.8": dict(temperature=0.8, top_k=50), "T 1.0 (no cut)": dict(temperature=1.0)}
NUMPY = "top-p 0.9, T 0.8 (numpy draw)"  # the draw of an install without the C extension
PAUSED = "greedy, then a 0.5 ms busy wait"  # a control row: what any half-millisecond between steps costs the next step
PAUSE_S = 0.0005


def tiny_decoder(work: Path) -> Path:
    """A random tiny Llama (32k vocabulary) exported with its KV cache: the FP32 graph's path."""
    import torch
    import transformers

    from trt_seer import pipeline
    from trt_seer.export.families import resolve_model

    ckpt = work / "llama-tiny-32k"
    if not (ckpt / "config.json").is_file():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**SHAPE, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(str(ckpt))
    info = resolve_model(ckpt, "causal-lm")
    art = pipeline.Artifacts(work, info.name)
    art.out.mkdir(parents=True, exist_ok=True)
    if not art.path("fp32.onnx").is_file():
        pipeline.fp32_onnx(info, art)
    return art.path("fp32.onnx")


def full_sort_ms(logits, sampling, rng) -> float:
    """The previous choice (every row's vocabulary sorted in float64), timed on the same logits."""
    import numpy as np

    start = time.perf_counter()
    scores = logits.astype(np.float64) / sampling.temperature
    order = np.argsort(-scores, axis=-1, kind="stable")
    probs = np.exp(np.take_along_axis(scores, order, axis=-1) - scores.max(-1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(-1, keepdims=True), axis=-1)
    (cdf <= rng.random((len(scores), 1))).sum(-1)
    return (time.perf_counter() - start) * 1e3


def numpy_choice(logits, sampling, rng):
    """`choose` for top-p without top-k, drawn by the numpy path."""
    import numpy as np

    from trt_seer.runtime.sampling import draws, numpy_draw

    return numpy_draw(np.asarray(logits, np.float32), np.float32(1 / sampling.temperature), sampling.top_p,
                      draws(rng, len(logits)))


def peaked_choice_ms(batch: int, sampling, chooser=None, repeats: int = 30) -> float:
    """Median choice time on logits with 8 strong candidates (+8 to +16) over a N(0, 1) tail."""
    import numpy as np

    from trt_seer.runtime.sampling import choose

    choose = chooser or choose
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((batch, SHAPE["vocab_size"])).astype(np.float32)
    logits[:, rng.integers(0, SHAPE["vocab_size"], 8)] += 8 + 8 * rng.random((batch, 8)).astype(np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        choose(logits, sampling, rng)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(step, batch: int, prompt: int, new: int, repeats: int) -> dict[str, dict]:
    """Medians per mode; the modes take turns within each repeat, so a slow spell of the machine
    falls on all of them rather than on one."""
    import numpy as np

    from trt_seer.runtime.generate import Sampling

    samplings = {mode: (Sampling(**kw), np.random.default_rng(0), None) for mode, kw in MODES.items()}
    samplings[NUMPY] = (samplings["top-p 0.9, T 0.8"][0], np.random.default_rng(0), numpy_choice)
    samplings[PAUSED] = samplings["greedy"]
    times = {mode: ([], [], []) for mode in samplings}  # step ms, choice ms, full-sort ms
    for r in range(repeats + 1):  # the first round warms up and is dropped
        for mode, (sampling, rng, chooser) in samplings.items():
            ids = np.random.default_rng(r).integers(3, 32000, (batch, prompt))
            _decode(step, ids, new, sampling, rng, times[mode] if r else None, full_sort=r == 1,
                    pause=PAUSE_S if mode == PAUSED else 0.0, chooser=chooser)
    rows = {}
    for mode, (step_ms, choice_ms, old_ms) in times.items():
        s, c = statistics.median(step_ms), statistics.median(choice_ms)
        rows[mode] = {"step_ms": s, "choice_ms": c, "per_token_ms": (s + c) / batch,
                      "full_sort_ms": statistics.median(old_ms) if old_ms else None,
                      "peaked_choice_ms": peaked_choice_ms(batch, samplings[mode][0], samplings[mode][2])}
        print(mode, rows[mode], flush=True)
    return rows


def _decode(step, ids, new: int, sampling, rng, times, full_sort: bool, pause: float = 0.0, chooser=None) -> None:
    """`new` decode steps after the prompt `ids`; appends (step, choice, full sort) ms to `times`.
    `pause`: seconds of busy waiting after each choice, counted in it (the control row); `chooser`:
    instead of runtime/sampling.choose."""
    import numpy as np

    from trt_seer.decoder_io import position_ids
    from trt_seer.runtime.sampling import choose

    choose = chooser or choose
    batch = len(ids)
    mask = np.ones_like(ids)
    step.reset(batch)
    logits = step.step(ids, mask, position_ids(mask))
    for _ in range(new):
        t0 = time.perf_counter()
        token = choose(logits, sampling, rng)
        while time.perf_counter() - t0 < pause:
            pass
        t1 = time.perf_counter()
        mask = np.ones((batch, mask.shape[1] + 1), np.int64)
        logits = step.step(token[:, None], mask, position_ids(mask, 1))
        t2 = time.perf_counter()
        if times is not None:
            times[0].append((t2 - t1) * 1e3)
            times[1].append((t1 - t0) * 1e3)
            if sampling.temperature and full_sort:
                times[2].append(full_sort_ms(logits, sampling, rng))


def table(rows: dict[str, dict]) -> str:
    greedy = rows["greedy"]
    lines = ["| Choice | step ms | choice ms | per token ms | vs greedy per token | choice, full float64 sort ms "
             "| choice ms, LM-like logits |", "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, r in rows.items():
        old = "" if r["full_sort_ms"] is None else f"{r['full_sort_ms']:.2f}"
        lines.append(f"| {mode} | {r['step_ms']:.2f} | {r['choice_ms']:.3f} | {r['per_token_ms']:.3f} | "
                     f"{r['per_token_ms'] / greedy['per_token_ms']:.2f}x | {old} | {r['peaked_choice_ms']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "sampling")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    step = OrtDecoderStep(tiny_decoder(args.work))
    rows = measure(step, args.batch, args.prompt, args.new_tokens, args.repeats)
    text = table(rows)
    print(text)
    if args.append:
        from trt_seer.bench.host import machine_text
        from trt_seer.bench.report import append_benchmark

        from trt_seer.runtime import sampling

        drawn = ("the compiled draw (runtime/_nucleus.c)" if sampling.compiled()
                 else "the numpy draw (this install has no C extension)")
        body = (f"Tiny Llama (random init, 2 layers, hidden 64, vocabulary 32,000), ONNX Runtime FP32 on the CPU, "
                f"batch {args.batch}, {args.new_tokens} decode steps after a {args.prompt}-token prompt, median of "
                f"{args.repeats} runs per part, the modes taking turns within each run. Per token = (step + choice) / "
                f"batch. The last row is greedy with a {PAUSE_S * 1e3:.1f} ms busy wait after each choice: what a "
                f"pause of that length between steps costs the next step here. Sampling rows: {drawn}, but the "
                f"one marked numpy draw.\n\n{text}\n")
        append_benchmark(args.append, "Next-token choice vs greedy", "python " + " ".join(sys.argv), machine_text(),
                         body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
