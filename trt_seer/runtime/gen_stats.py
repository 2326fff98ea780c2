"""Generation timing: a `DecoderStep` wrapper that times every step, for `trt-seer generate --stats`.

    timed = TimedStep(generator.step)
    Generator(timed, generator.decoder, generator.tokenizer).generate(texts, sampling)
    timed.stats()   # {"ttft_ms": ..., "decode_tokens_per_s": ..., "device_ms_per_step": ..., ...}

TTFT is the prompt step (prefill and the first token's choice; tokenization aside). Decode
tokens/s counts batch x decode steps over the wall time from the first token to the last, host
choice of each next token included (as a caller sees it). Device ms per step is the median of the
backend's own GPU time per decode step (`last_gpu_ms`, CUDA events), None where it has none.
"""
from __future__ import annotations

import statistics
import time


class TimedStep:
    """A DecoderStep that forwards to `inner` and records when each step ends."""

    def __init__(self, inner):
        self.inner, self.max_total = inner, inner.max_total
        self.batches: list[dict] = []  # per reset: batch, prompt ms, decode step ends, device ms
        if callable(getattr(inner, "next_tokens", None)):
            self.next_tokens = lambda *feeds: self._timed(inner.next_tokens, feeds)

    def reset(self, batch: int) -> None:
        self.inner.reset(batch)
        self.batches.append({"batch": int(batch), "prompt_ms": None, "ends": [], "device_ms": []})

    def step(self, input_ids, attention_mask, position_ids):
        return self._timed(self.inner.step, (input_ids, attention_mask, position_ids))

    def _timed(self, call, feeds):
        current = self.batches[-1]
        start = time.perf_counter()
        out = call(*feeds)
        end = time.perf_counter()
        if current["prompt_ms"] is None:
            current["prompt_ms"], current["prompt_end"] = (end - start) * 1e3, end
        else:
            current["ends"].append(end)
            device = getattr(self.inner, "last_gpu_ms", None)
            if device is not None:
                current["device_ms"].append(float(device))
        return out

    def stats(self) -> dict:
        """Figures over every batch run so far (module docstring)."""
        runs = [b for b in self.batches if b["prompt_ms"] is not None]
        tokens = sum(b["batch"] * len(b["ends"]) for b in runs)
        seconds = sum(b["ends"][-1] - b["prompt_end"] for b in runs if b["ends"])
        device = [ms for b in runs for ms in b["device_ms"]]
        return {"ttft_ms": statistics.median(b["prompt_ms"] for b in runs) if runs else None,
                "decode_tokens_per_s": tokens / seconds if seconds > 0 else None,
                "decode_steps": sum(len(b["ends"]) for b in runs), "batches": len(runs),
                "device_ms_per_step": statistics.median(device) if device else None}


def stats_text(stats: dict) -> str:
    """One line for people."""
    parts = [f"TTFT {stats['ttft_ms']:.1f} ms" if stats["ttft_ms"] is not None else "TTFT n/a"]
    rate = stats["decode_tokens_per_s"]
    parts.append(f"decode {rate:,.1f} tokens/s over {stats['decode_steps']} steps" if rate else "decode n/a")
    device = stats["device_ms_per_step"]
    parts.append(f"device {device:.3f} ms/step" if device is not None else "device time n/a (no GPU backend)")
    return "stats: " + ", ".join(parts)
