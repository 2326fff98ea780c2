"""The accuracy gate shared by INT8, weight-only INT8/INT4 and `diff`: thresholds, the per-layer
fallback loop and its table.

    from trt_seer.eval.gate import Gate, fallback, rank_by_added_error
    excluded, metrics, fails, rows = fallback(write, evaluate, Gate(), task,
                                              lambda: rank_by_added_error(ref, cand, batches, nodes))

`fallback` writes the candidate with every layer reduced, measures it, and while the gate fails
keeps the layers that add the most error (eval/layers.py) out of the reduced precision, 1, 2, 4, ...
of them. Quantize stages call it; it imports nothing from quantize.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gate:
    min_cosine: float = 0.99  # mean sentence-embedding cosine
    min_cosine_each: float = 0.97  # worst sample
    min_top1: float = 0.99  # classification / LM top-1 agreement

    def check(self, task: str, m: dict) -> list[str]:
        """The failed conditions, empty when the metrics pass."""
        if task == "feature-extraction":
            fails = [f"mean cosine {m['mean_cosine']:.4f} < {self.min_cosine}"] if m["mean_cosine"] < self.min_cosine else []
            if m["min_cosine"] < self.min_cosine_each:
                fails.append(f"min cosine {m['min_cosine']:.4f} < {self.min_cosine_each}")
            return fails
        return [f"top-1 agreement {m['top1_agreement']:.4f} < {self.min_top1}"] if m["top1_agreement"] < self.min_top1 else []


def fallback(write, evaluate, gate, task: str, rank, label: str = "INT8") -> tuple[frozenset, dict, list, list]:
    """Writes the artifact with every layer in `label`; while `gate.check(task, evaluate())` fails,
    takes the layers `rank()` orders by added error out of it, 1, 2, 4, ... of them.

    Args:
        write: `write(excluded)` writes the candidate with the layers in `excluded` kept out.
        evaluate: `evaluate()` measures the candidate last written; returns the gate's metrics.
        gate: anything with `check(task, metrics) -> list[str]` (the failed conditions).
        rank: `rank()` the layer names, most added error first (called only if the first try fails).
    Returns:
        (excluded, metrics, fails, rows): the last try; rows (label, metrics, fails) per try.
    """
    excluded = frozenset()
    write(excluded)
    metrics = evaluate()
    fails = gate.check(task, metrics)
    rows = [("none", metrics, fails)]
    if not fails:
        return excluded, metrics, fails, rows
    log.info("%s misses the gate (%s); measuring per-layer sensitivity ...", label, "; ".join(fails))
    order, k = rank(), 1
    while fails and len(excluded) < len(order):
        excluded = frozenset(order[:min(k, len(order))])
        write(excluded)
        metrics = evaluate()
        fails = gate.check(task, metrics)
        rows.append((f"{len(excluded)} most sensitive", metrics, fails))
        k *= 2
    return excluded, metrics, fails, rows


def rank_by_added_error(ref_path: Path, cand: Path, batches: list, nodes: list[str] | None,
                        ops: tuple = ("MatMul", "Gemm")) -> list[str]:
    """Layer names of `cand` by the error each adds against `ref_path` (first 4 batches), largest first."""
    from trt_seer.eval import layers

    profile_rows = layers.layer_error_profile(ref_path, cand, batches[:4], nodes, ops)
    return [r["node"] for r in sorted(profile_rows, key=lambda r: -r["added_error"])]


def table(rows: list[tuple[str, dict, list[str]]], label: str = "INT8") -> str:
    """The fallback's tries as a text table, one line per try."""
    keys = [k for k in rows[0][1] if k != "samples"]
    lines = ["  " + " | ".join([f"layers kept out of {label}".ljust(26), *(k.rjust(12) for k in keys), "gate"])]
    for name, m, fails in rows:
        vals = [f"{m[k]:12.5f}" for k in keys]
        lines.append("  " + " | ".join([name.ljust(26), *vals, "pass" if not fails else "FAIL"]))
    return "\n".join(lines)
