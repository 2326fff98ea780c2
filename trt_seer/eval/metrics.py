"""Task metrics of a candidate's outputs against a reference (usually FP32), shared by the FP16
check, the INT8 gate, `diff` and `bench`."""
from __future__ import annotations

import numpy as np


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of (n, d) arrays, float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(denom, 1e-30)


def neighbour_overlap(ref: np.ndarray, cand: np.ndarray, k: int = 5) -> float:
    """Mean overlap of each row's k nearest neighbours (cosine) in the two embedding sets."""
    n = len(ref)
    if n <= k:
        return float("nan")

    def knn(x):
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)
        sims = x @ x.T
        np.fill_diagonal(sims, -np.inf)
        return np.argsort(-sims, axis=1)[:, :k]

    a, b = knn(ref.astype(np.float64)), knn(cand.astype(np.float64))
    return float(np.mean([len(set(a[i]) & set(b[i])) / k for i in range(n)]))


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def embedding_metrics(ref: np.ndarray, cand: np.ndarray) -> dict:
    cos = cosine_rows(ref, cand)
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
            "neighbour_overlap@5": neighbour_overlap(ref, cand, 5), "samples": int(len(cos))}


def logits_metrics(ref: np.ndarray, cand: np.ndarray) -> dict:
    """Top-1 agreement and mean KL(ref || cand) of the softmax, over all leading positions."""
    ref = ref.reshape(-1, ref.shape[-1])
    cand = cand.reshape(-1, cand.shape[-1])
    p, q = softmax(ref), softmax(cand)
    kl = (p * (np.log(np.maximum(p, 1e-30)) - np.log(np.maximum(q, 1e-30)))).sum(axis=-1)
    return {"top1_agreement": float(np.mean(ref.argmax(-1) == cand.argmax(-1))),
            "mean_kl": float(kl.mean()), "max_abs_diff": float(np.abs(ref - cand).max()),
            "samples": int(len(ref))}


def task_metrics(task: str, ref: dict[str, np.ndarray], cand: dict[str, np.ndarray],
                 mask: np.ndarray | None = None) -> dict:
    """The task's metric. For token-level logits, only unmasked positions count."""
    if task == "feature-extraction":
        return embedding_metrics(ref["sentence_embedding"], cand["sentence_embedding"])
    r, c = ref["logits"], cand["logits"]
    if r.ndim == 3 and mask is not None:
        keep = mask.astype(bool)
        r, c = r[keep], c[keep]
    return logits_metrics(r, c)
