"""Encoder engines against torch.compile in one process, end to end (token ids from the host,
`sentence_embedding` back to the host): fixed length at batch 1 / 8 / 32, and a length mix from the
held-out corpus at batch 32; kernel launches and device time per forward; appends to docs/BENCHMARKS.md.

    python tools/bench_encoder.py --model ckpt/ --engine fused=engines/m.fp16.engine \\
        --engine decomposed=old/m.fp16.engine [--mix-caps 128,512] [--append docs/BENCHMARKS.md]

PyTorch is the checkpoint in FP16 under `torch.compile(mode="reduce-overhead")` (CUDA graphs), mean
pooling and L2 normalisation included, the strongest path a PyTorch user picks. Each engine runs
through `trt_seer.runtime` as a service would: a prepared call at a fixed shape (the runtime's CUDA
graph), `infer` on the length mix. The length mix is the held-out corpus tokenised, capped at each of
`--mix-caps` tokens, in batches of 32 in file order padded to their longest (what a PyTorch user's
tokenizer call gives) and, as a second PyTorch row, sorted by length first. Every path runs its
batches once untimed (compilation, CUDA graph capture per shape), then `--repeats` timed passes;
the table gives the median time per batch over the passes and the passes' spread (min-max).
Device time is the sum of the kernels CUPTI records per forward (torch.profiler), launches their count.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _torch_embed(model_dir: str):
    """(compiled embed(ids, mask) -> (batch, hidden) float32 on the GPU, the model's layer count)."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float16).cuda().eval()

    def embed(ids, mask):
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    return torch.compile(embed, mode="reduce-overhead"), model.config.num_hidden_layers


def torch_runner(compiled):
    import torch

    def run(feeds: dict) -> np.ndarray:
        with torch.inference_mode():
            ids = torch.from_numpy(feeds["input_ids"]).cuda()
            mask = torch.from_numpy(feeds["attention_mask"]).cuda()
            return compiled(ids, mask).cpu().numpy()

    return run


def engine_runner(model, fixed: bool):
    """The runtime's prepared call (fixed shapes) or `infer` (shapes that vary)."""
    calls = {}

    def run(feeds: dict) -> np.ndarray:
        feeds = {k: v for k, v in feeds.items() if k in model.input_names}
        if not fixed:
            return model.infer(feeds, outputs=["sentence_embedding"])["sentence_embedding"]
        key = tuple(v.shape for v in feeds.values())
        if key not in calls:
            calls[key] = model.prepare({k: v.shape for k, v in feeds.items()}, outputs=["sentence_embedding"])
        return calls[key].run(feeds)["sentence_embedding"]

    return run


def timed(run, batches: list[dict], repeats: int) -> dict:
    """One untimed pass over `batches`, then `repeats` timed ones: ms per batch, median and spread."""
    for feeds in batches:
        run(feeds)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for feeds in batches:
            run(feeds)
        passes.append((time.perf_counter() - start) * 1e3 / len(batches))
    return {"ms": statistics.median(passes), "lo": min(passes), "hi": max(passes)}


def kernels(run, feeds: dict, n: int = 20) -> dict:
    """Launches (kernels, memsets and copies CUPTI records) and kernel time per forward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        run(feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run(feeds)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    compute = [e for e in events if not any(w in e.key.lower() for w in ("memcpy", "memset"))]
    top = sorted(compute, key=lambda e: -e.self_device_time_total)[:8]
    return {"launches": sum(e.count for e in events) / n, "kernels": sum(e.count for e in compute) / n,
            "device_ms": sum(e.self_device_time_total for e in compute) / n / 1e3,
            "top": [(e.key[:90], e.count / n, e.self_device_time_total / n) for e in top]}


def fixed_batches(batch: int, seq: int, vocab: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):  # rotate a few inputs
        ids = rng.integers(1000, vocab - 1, (batch, seq)).astype(np.int64)
        out.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
    return out


def mix_batches(model_dir: str, cap: int, batch: int, sort: bool) -> list[dict]:
    """The held-out corpus tokenised (at most `cap` tokens), in batches padded to their longest."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = [t for t in (ROOT / "calib" / "heldout.txt").read_text().splitlines() if t.strip()]
    texts = [" ".join([t] * (1 + i % 6)) for i, t in enumerate(texts)]  # long texts too, to reach the cap
    ids = [tok(t, truncation=True, max_length=cap)["input_ids"] for t in texts]
    if sort:
        ids.sort(key=len)
    out = []
    for i in range(0, len(ids) - batch + 1, batch):
        rows = ids[i:i + batch]
        width = max(map(len, rows))
        a = np.zeros((len(rows), width), np.int64)
        m = np.zeros_like(a)
        for r, row in enumerate(rows):
            a[r, :len(row)], m[r, :len(row)] = row, 1
        out.append({"input_ids": a, "attention_mask": m, "token_type_ids": np.zeros_like(a)})
    return out


def _cell(t: dict, ref: dict | None = None) -> str:
    ratio = f" ({ref['ms'] / t['ms']:.2f}x)" if ref else ""
    return f"{t['ms']:.3f} [{t['lo']:.3f}-{t['hi']:.3f}]{ratio}"


def fixed_table(paths: dict, args, vocab: int) -> list[str]:
    names = list(paths)
    lines = [f"Fixed length {args.seq}, ms per batch end to end, median [min-max of {args.repeats} passes] "
             f"(x: torch.compile / engine):", "", "| batch | " + " | ".join(names) + " |",
             "|---:|" + "---:|" * len(names)]
    for b in args.batches:
        batches = fixed_batches(b, args.seq, vocab, seed=b)
        t = {n: timed(run, batches * 25, args.repeats) for n, run in paths.items()}
        ref = t[names[0]]
        lines.append(f"| {b} | " + " | ".join(_cell(t[n], ref if n != names[0] else None) for n in names) + " |")
        print(lines[-1], flush=True)
    return lines


def kernel_table(paths: dict, args, vocab: int, layers: int) -> list[str]:
    feeds = fixed_batches(args.profile_batch, args.seq, vocab, seed=99)[0]
    lines = [f"Per forward at batch {args.profile_batch} x {args.seq} (torch.profiler):", "",
             "| path | launches | kernels | device ms | device us per layer |", "|---|---:|---:|---:|---:|"]
    tops = []
    for name, run in paths.items():
        k = kernels(run, feeds)
        lines.append(f"| {name} | {k['launches']:.0f} | {k['kernels']:.0f} | {k['device_ms']:.3f} | "
                     f"{k['device_ms'] * 1e3 / layers:.0f} |")
        tops += ["", f"{name}, costliest kernels:", ""] + [f"- {us:.1f} us, x{c:.0f}: `{n}`" for n, c, us in k["top"]]
        print(lines[-1], flush=True)
    return lines + tops


def mix_table(torch_run, engines: dict, args) -> list[str]:
    lines = [f"Held-out length mix, batch {args.mix_batch}, ms per batch end to end, median [min-max]:", "",
             "| cap | real tokens / padded | torch.compile padded | torch.compile sorted | "
             + " | ".join(f"{n} (x padded, x sorted)" for n in engines) + " | min cosine vs torch |",
             "|---:|---:|---:|---:|" + "---:|" * len(engines) + "---:|"]
    for cap in args.mix_caps:
        plain, ordered = (mix_batches(args.model, cap, args.mix_batch, s) for s in (False, True))
        real = sum(int(b["attention_mask"].sum()) for b in plain)
        padded = sum(b["attention_mask"].size for b in plain)
        tp, ts = timed(torch_run, plain, args.repeats), timed(torch_run, ordered, args.repeats)
        cells, cos = [], 1.0
        for run in engines.values():
            t = timed(run, plain, args.repeats)
            cells.append(f"{t['ms']:.3f} [{t['lo']:.3f}-{t['hi']:.3f}] ({tp['ms'] / t['ms']:.2f}x, {ts['ms'] / t['ms']:.2f}x)")
            for feeds in plain[:4]:
                a, b = run(feeds).astype(np.float64), torch_run(feeds).astype(np.float64)
                cos = min(cos, float(np.min(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))))
        lines.append(f"| {cap} | {real / padded:.2f} | {_cell(tp)} | {_cell(ts)} | " + " | ".join(cells) + f" | {cos:.5f} |")
        print(lines[-1], flush=True)
    return lines


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the checkpoint the engines were built from")
    p.add_argument("--engine", action="append", required=True, metavar="LABEL=PATH", help="an engine to time (repeatable)")
    p.add_argument("--batches", type=_ints, default=[1, 8, 32])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mix-caps", type=_ints, default=[128, 512], help="length-mix caps (empty: no mix)")
    p.add_argument("--mix-batch", type=int, default=32)
    p.add_argument("--profile-batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--append", type=Path, default=None, help="append the tables to this BENCHMARKS.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from trt_seer.runtime import load

    compiled, layers = _torch_embed(args.model)
    torch_run = torch_runner(compiled)
    models = {label: load(path) for label, path in (e.split("=", 1) for e in args.engine)}
    vocab = 30000
    fixed = {"torch.compile": torch_run, **{n: engine_runner(m, True) for n, m in models.items()}}
    body = fixed_table(fixed, args, vocab) + [""] + kernel_table(fixed, args, vocab, layers)
    if args.mix_caps:
        body += [""] + mix_table(torch_run, {n: engine_runner(m, False) for n, m in models.items()}, args)
    for m in models.values():
        m.close()
    text = "\n".join(body)
    print(text)
    if args.append:
        from trt_seer.bench.host import engine_gpu_text, machine_text
        from trt_seer.bench.report import append_benchmark

        title = f"Encoder engines against torch.compile: {Path(args.model).name}"
        engines = ", ".join(f"{n}: {Path(e.split('=', 1)[1]).name}" for n, e in zip(models, args.engine))
        append_benchmark(args.append, title, "python tools/bench_encoder.py " + " ".join(argv or sys.argv[1:]),
                         machine_text(engine_gpu_text()), f"Engines: {engines}.\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
