"""Watching a run: progress bar, metrics.jsonl (one line per optimizer step and per epoch), one log
line per epoch, peak memory, and curves.png drawn from the metrics file.

metrics.jsonl records:
  {"kind": "step", "step", "epoch", "loss", "examples", "tokens", "elapsed_s" (since the epoch
   began, when the step's results were read), "grad_norm" (before clipping; null if inf/nan), "lr" (this step's),
   "loss_scale" (after the step; null unless fp16), "skipped" (fp16 overflow: no update)}
  {"kind": "epoch", "epoch", "step_end", "steps", "skipped_steps", "train_loss", "samples_per_s",
   "tokens_per_s", "seconds", "peak_memory_bytes", "peak_memory_kind", "eval_loss",
   "eval_accuracy" (text-classification) | "eval_perplexity" (causal-lm: exp(eval_loss)) |
   "eval_mean_cosine" (feature-extraction --qat int8: 1 - eval_loss, vs the FP32 model), "loss_scale"}
Losses are means over all ranks' examples (causal-lm: over predicted tokens, padding excluded;
feature-extraction: 1 - cosine to the FP32 model's sentence embedding);
tokens count non-padding tokens.
"""
from __future__ import annotations

import json
import logging
import resource
import sys
import time
from pathlib import Path

log = logging.getLogger("trt_seer.finetune")

METRICS_FILE = "metrics.jsonl"
PROGRESS_EVERY_S = 30.0  # a progress line this often where no bar is drawn (stderr not a terminal)
PLOT_FILE = "curves.png"


class Reporter:
    """Rank 0 writes metrics and draws the progress bar; other ranks' reporters (folder None)
    do nothing."""

    def __init__(self, folder: Path | None):
        self.path = None if folder is None else Path(folder) / METRICS_FILE
        self._progress = None  # [desc, steps done, total, last line's time] of the open bar

    def bar(self, total: int, desc: str):
        """A tqdm bar (hidden when stderr is not a terminal or on ranks other than 0); where it is
        hidden on rank 0, `tick` says the progress in a log line every PROGRESS_EVERY_S seconds."""
        from tqdm.auto import tqdm

        self._progress = [desc, 0, total, time.monotonic()]
        return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False,
                    disable=True if self.path is None else None, dynamic_ncols=True)

    def tick(self, bar, loss: float) -> None:
        """One step done: the bar moves, or (no bar drawn) a line is logged now and then."""
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if self._progress is None:
            return
        self._progress[1] += 1
        desc, done, total, last = self._progress
        if self.path is not None and bar.disable and time.monotonic() - last >= PROGRESS_EVERY_S:
            self._progress[3] = time.monotonic()
            log.info("%s: step %d of %d, loss %.4f", desc, done, total, loss)

    def record(self, row: dict) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def info(self, message: str) -> None:
        if self.path is not None:
            log.info(message)


def reset_peak_memory(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device) -> dict:
    """GPU: the caching allocator's peak since the last reset. CPU: the process's peak RSS."""
    import torch

    if device.type == "cuda":
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_memory_kind": "cuda_max_allocated"}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_memory_bytes": int(rss_kib) * 1024, "peak_memory_kind": "process_peak_rss"}


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: Path, dest: Path) -> Path:
    """Loss per step and per epoch, eval accuracy (or perplexity), and the fp16 loss scale, as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(metrics_path)
    steps = [r for r in rows if r["kind"] == "step"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    loss_ax, metric_ax, scale_ax = fig.subplots(1, 3)
    loss_ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, alpha=0.6, label="train (step)")
    ends = [r["step_end"] for r in epochs]
    loss_ax.plot(ends, [r["train_loss"] for r in epochs], "o-", label="train (epoch)")
    loss_ax.plot(ends, [_nan(r["eval_loss"]) for r in epochs], "s-", label="eval")
    loss_ax.set(title="loss", xlabel="optimizer step")
    loss_ax.legend()
    _plot_eval_metric(metric_ax, epochs)
    metric_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    scaled = [r for r in steps if r["loss_scale"] is not None]
    scale_ax.plot([r["step"] for r in scaled], [r["loss_scale"] for r in scaled], drawstyle="steps-post")
    scale_ax.set(title="fp16 loss scale" if scaled else "loss scale (fp16 only)", xlabel="optimizer step")
    if scaled:
        scale_ax.set_yscale("log", base=2)
    fig.savefig(dest, dpi=100)
    return Path(dest)


def _plot_eval_metric(ax, epochs: list[dict]) -> None:
    """Eval accuracy (0..1), or for causal-lm runs eval perplexity (log scale), or for
    feature-extraction the mean cosine of the embeddings to the FP32 model's."""
    if any("eval_perplexity" in r for r in epochs):
        values = [r["eval_perplexity"] for r in epochs]
        ax.plot([r["epoch"] for r in epochs], [_nan(v) for v in values], "o-")
        ax.set(title="eval perplexity", xlabel="epoch")
        if any(v is not None for v in values):  # log of nothing but NaN warns
            ax.set_yscale("log")
        return
    if any("eval_mean_cosine" in r for r in epochs):  # feature-extraction: 1 - cosine is eval_loss
        ax.plot([r["epoch"] for r in epochs], [_nan(r["eval_mean_cosine"]) for r in epochs], "o-")
        ax.set(title="eval mean cosine to FP32", xlabel="epoch")
        return
    ax.plot([r["epoch"] for r in epochs], [_nan(r["eval_accuracy"]) for r in epochs], "o-")
    ax.set(title="eval accuracy", xlabel="epoch", ylim=(0, 1))


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
