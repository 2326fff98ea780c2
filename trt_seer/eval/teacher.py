"""Teacher-forced next-token logits of an ONNX causal LM with ONNX Runtime (CPU): perplexity and
greedy agreement, the decoder quantization gate's metrics.

    rows = token_rows(batches, length=64, max_rows=16)          # (rows, length) int64
    ref = teacher_forced_logits(Path("m.fp16.onnx"), rows)      # (rows, length - 1, vocab)
    lm_metrics(ref, teacher_forced_logits(Path("m.int4.onnx"), rows), rows)

A graph with a KV cache (docs: the decoder contract; `past_key_values.{i}.key` inputs) is fed one
position at a time through `OrtDecoderStep`, the DecoderStep interface, so the metric exercises
the deployed decode path; a graph without a cache (all-position logits) is run once per batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.decoder_io import PAST_PREFIX as PAST, empty_cache, position_ids
from trt_seer.errors import InputError

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def _session(path: Path):
    from trt_seer.eval.evaluate import session

    return session(path)


@dataclass(frozen=True)
class Arg:
    """A graph input as ONNX Runtime describes one: name, shape (str for symbolic axes), type."""

    name: str
    shape: tuple
    type: str


def graph_inputs(path: Path) -> list[Arg]:
    """The graph's inputs, read without loading weights or starting a session."""
    from trt_seer.export import onnxio

    types = {1: "tensor(float)", 10: "tensor(float16)", 7: "tensor(int64)"}
    out = []
    for v in onnxio.load(path, False).graph.input:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
        out.append(Arg(v.name, dims, types.get(t.elem_type, str(t.elem_type))))
    return out


def has_cache(path: Path) -> bool:
    return any(a.name.startswith(PAST) for a in graph_inputs(path))


def decoder_step(path: Path, max_total: int = 1 << 20):
    """The runtime's ONNX Runtime DecoderStep over a KV-cache graph, its cache layout read from the
    graph's own inputs (a candidate graph in a gate has no record beside it)."""
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    past = [a for a in graph_inputs(path) if a.name.startswith(PAST)]
    if not past:
        raise InputError(f"{Path(path).name} has no {PAST}* inputs (not a KV-cache decoder graph)")
    empty = empty_past(past[0], 1)
    layout = {"num_kv_heads": empty.shape[1], "head_dim": empty.shape[3], "kv_dtype": empty.dtype.name,
              "max_total": max_total}
    return OrtDecoderStep(path, decoder=layout)


def empty_past(arg, batch: int) -> np.ndarray:
    """A (batch, kv_heads, 0, head_dim) cache tensor for an ONNX Runtime input description."""
    heads, dim = arg.shape[1], arg.shape[3]
    if not isinstance(heads, int) or not isinstance(dim, int):
        raise InputError(f"input {arg.name} has symbolic heads/head_dim {arg.shape}; expected numbers")
    return empty_cache(batch, heads, dim, _NP.get(arg.type, np.float32))


def prefill_feeds(sess_inputs, feeds: dict) -> dict:
    """`feeds` (input_ids, attention_mask) completed with position_ids and an empty cache where
    the graph takes them: a prefill step, for calibration and layer profiles."""
    out = dict(feeds)
    names = {i.name: i for i in sess_inputs}
    if "position_ids" in names:
        out["position_ids"] = position_ids(feeds["attention_mask"])
    for n, arg in names.items():
        if n.startswith(PAST):
            out[n] = empty_past(arg, feeds["input_ids"].shape[0])
    return {k: v for k, v in out.items() if k in names}


def teacher_forced_logits(path: Path, rows: np.ndarray, batch: int = 16) -> np.ndarray:
    """(rows, length - 1, vocab) float32: the logits predicting rows[:, 1:] from each prefix."""
    if has_cache(path):
        return stepped_logits(decoder_step(path), rows, batch, f"teacher-force {Path(path).name}")
    from tqdm import tqdm

    sess = _session(path)
    return np.concatenate([_full(sess, rows[start:start + batch]) for start in
                           tqdm(range(0, len(rows), batch), desc=f"teacher-force {Path(path).name}",
                                unit="batch", leave=False)])


def stepped_logits(step, rows: np.ndarray, batch: int = 16, desc: str = "teacher-force") -> np.ndarray:
    """teacher_forced_logits through any DecoderStep (ONNX Runtime, or a TensorRT engine)."""
    from tqdm import tqdm

    starts = range(0, len(rows), batch)
    return np.concatenate([_stepped(step, rows[s:s + batch]) for s in
                           tqdm(starts, desc=desc, unit="batch", leave=False)])


def _stepped(step, ids: np.ndarray) -> np.ndarray:
    b, t = ids.shape
    step.reset(b)
    mask = np.ones((b, t), dtype=np.int64)
    return np.stack([step.step(ids[:, i:i + 1], mask[:, :i + 1], np.full((b, 1), i, np.int64))
                     for i in range(t - 1)], axis=1)


def _full(sess, ids: np.ndarray) -> np.ndarray:
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    logits = sess.run(["logits"], {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
    if logits.shape[1] != ids.shape[1]:
        raise InputError(f"logits cover {logits.shape[1]} positions of {ids.shape[1]}; a graph that returns "
                         "only the last position needs past_key_values inputs to be stepped")
    return logits[:, :-1].astype(np.float32)


def token_rows(batches: list[dict], length: int, max_rows: int) -> np.ndarray:
    """Held-out (rows, length) token ids: the unpadded tokens of every sample in `batches`, one
    stream cut into rows (perplexity is measured over whole rows, no padding)."""
    stream = np.concatenate([b["input_ids"][r][b["attention_mask"][r].astype(bool)]
                             for b in batches for r in range(len(b["input_ids"]))])
    n = min(max_rows, len(stream) // length)
    if n < 1:
        raise InputError(f"held-out data has {len(stream)} tokens, fewer than one row of {length}")
    return stream[:n * length].reshape(n, length).astype(np.int64)


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    top = z.max(axis=-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(z - top).sum(axis=-1))
    return lse - np.take_along_axis(z, targets[..., None], axis=-1)[..., 0]


def lm_metrics(ref: np.ndarray, cand: np.ndarray, rows: np.ndarray) -> dict:
    """Perplexity of both on rows[:, 1:], the relative increase, and greedy next-token agreement."""
    targets = rows[:, 1:]
    ppl_ref, ppl = (float(np.exp(_nll(x, targets).mean())) for x in (ref, cand))
    return {"ppl_ref": ppl_ref, "ppl": ppl, "ppl_increase": ppl / ppl_ref - 1.0,
            "agreement": float((ref.argmax(-1) == cand.argmax(-1)).mean()), "samples": int(targets.size)}
