"""Kernel launches per decode step on the GPU: torch.profiler (CUPTI) around a DecoderStep's greedy
decode steps (a TensorRT decoder, or anything with the same `reset` / `step`).

    from trt_seer.bench.kernels import decode_kernels, kernels_text
    found = decode_kernels(decoder, vocab=32000, batch=1, context=128)
    print(kernels_text([found]))

Launches are every device activity CUPTI records in the profiled steps (kernels, memsets, memory
copies), divided by the number of steps; kernels inside a replayed CUDA graph count one by one.
"""
from __future__ import annotations

import numpy as np

from trt_seer.bench.generate import next_token_fn

TOP = 12


def _kind(name: str) -> str:
    low = name.lower()
    return "memset" if "memset" in low else "memcpy" if "memcpy" in low else "kernel"


def decode_kernels(step, vocab: int, batch: int, context: int = 128, steps: int = 40, warm: int = 20) -> dict:
    """Profiles `steps` decode steps after a `context`-token prompt and `warm` untimed steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    rng = np.random.default_rng(0)
    ids = rng.integers(100, vocab - 1, (batch, context), dtype=np.int64)
    greedy = next_token_fn(step)
    step.reset(batch)
    token = greedy(ids, np.ones_like(ids), np.tile(np.arange(context, dtype=np.int64), (batch, 1)))

    def run(n: int, start: int):
        nonlocal token
        for i in range(n):
            mask = np.ones((batch, start + i + 1), np.int64)
            token = greedy(token[:, None], mask, np.full((batch, 1), start + i, np.int64))

    run(warm, context)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(steps, context + warm)
    torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    per = {"kernel": 0, "memset": 0, "memcpy": 0}
    for e in events:
        per[_kind(e.key)] += e.count
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:TOP]
    return {"batch": batch, "context": context, "steps": steps,
            "launches_per_step": sum(per.values()) / steps, **{f"{k}s_per_step": v / steps for k, v in per.items()},
            "device_ms_per_step": sum(e.self_device_time_total for e in events) / steps / 1e3,
            "top": [{"name": e.key[:100], "per_step": e.count / steps, "us_per_step": e.self_device_time_total / steps}
                    for e in top]}


def kernels_text(found: list[dict]) -> str:
    """Markdown: one row per profiled batch, then each one's costliest kernels."""
    lines = ["| batch | context | launches / step | kernels | memsets | memcpys | device ms / step |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for f in found:
        lines.append(f"| {f['batch']} | {f['context']} | {f['launches_per_step']:.0f} | {f['kernels_per_step']:.0f} | "
                     f"{f['memsets_per_step']:.0f} | {f['memcpys_per_step']:.0f} | {f['device_ms_per_step']:.3f} |")
    for f in found:
        lines += ["", f"Batch {f['batch']}, costliest:", ""]
        lines += [f"- {t['us_per_step']:.1f} us, {t['per_step']:.0f}/step: `{t['name']}`" for t in f["top"]]
    return "\n".join(lines)
