"""Accuracy of one ONNX artifact against another on held-out data, with ONNX Runtime on CPU.

Used by the FP16 stage (FP16 vs FP32), the INT8 gate and `diff`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer import data
from trt_seer.export.checkpoint import sample_inputs
from trt_seer.export.families import ModelInfo, ShapeProfile, max_positions
from trt_seer.eval.metrics import task_metrics


BACKEND = "onnxruntime CPU"  # what session() runs: ONNX Runtime's CPU execution provider


def measured_on(artifact) -> dict:
    """Where an accuracy entry was measured: {"artifact": file name, "backend": BACKEND}."""
    return {"artifact": Path(artifact).name, "backend": BACKEND}


def accuracy_entry(metrics: dict, candidate, reference) -> dict:
    """`metrics` of ONNX `candidate` against ONNX `reference` (both run by session()) as a manifest
    accuracy entry that names what was measured, and where: no reader takes an ONNX graph's
    accuracy for an engine's."""
    return {**metrics, "measured_on": measured_on(candidate), "reference_measured_on": measured_on(reference)}


@dataclass(frozen=True)
class EvalSpec:
    samples: int = 128
    batch: int = 16
    max_seq: int = 256


def eval_batches(info: ModelInfo, spec: EvalSpec = EvalSpec(), texts: list[str] | None = None) -> list[dict]:
    """Held-out token batches (the shipped held-out corpus, or random tokens for a model without a
    tokenizer, e.g. a tiny test checkpoint)."""
    from trt_seer.tokenizer import model_max_length

    own = model_max_length(info.path)  # what `run` cuts texts to as well (runtime/texts.py)
    max_seq = min(spec.max_seq, max_positions(info) or spec.max_seq, own[0] if own else spec.max_seq)
    profile = ShapeProfile((1, spec.batch, spec.batch), (2, min(128, max_seq), max_seq))
    if data.has_tokenizer(info):
        texts = texts if texts is not None else data.load_texts(data.default_corpus("heldout"))
        return list(data.token_batches(info, texts[:spec.samples], profile, spec.batch))
    n = max(1, spec.samples // spec.batch)
    return [sample_inputs(info, spec.batch, 16 + 8 * i, seed=100 + i) for i in range(n)]


def session(path, threads: int = 0):
    from trt_seer.runtime.ort import OrtOptions, create_session

    return create_session(path, OrtOptions(threads=threads))


def run_batches(sess, batches: list[dict]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, feeds))) for feeds in batches]


def merge(task: str, outs: list[dict], batches: list[dict]) -> dict[str, np.ndarray]:
    """Concatenates per-batch outputs; token-level logits keep only unmasked positions."""
    if task == "feature-extraction":
        return {"sentence_embedding": np.concatenate([o["sentence_embedding"] for o in outs])}
    rows = []
    for o, b in zip(outs, batches):
        logits = o["logits"]
        rows.append(logits[b["attention_mask"].astype(bool)] if logits.ndim == 3 else logits)
    return {"logits": np.concatenate(rows)}


def compare_outputs(task: str, ref: list[dict], cand: list[dict], batches: list[dict]) -> dict:
    return task_metrics(task, merge(task, ref, batches), merge(task, cand, batches))


def compare_onnx(info: ModelInfo, ref, cand_path, batches: list[dict]) -> dict:
    """Task metrics of `cand_path` against `ref` (an ONNX path, or its outputs from `run_batches`
    on the same `batches`, so a reference is run once for many candidates) on `batches`."""
    ref_outs = ref if isinstance(ref, list) else run_batches(session(ref), batches)
    cand = run_batches(session(cand_path), batches)
    return compare_outputs(info.task, ref_outs, cand, batches)
