"""Per-layer error of a reduced-precision ONNX graph (FP16-typed or Q/DQ INT8) against its reference.

    from trt_seer.eval.layers import layer_error_profile, first_jumps
    profile = layer_error_profile(Path("m.fp32.onnx"), Path("m.int8.onnx"), batches)
    for row in first_jumps(profile):
        print(row["node"], row["rel_error"], row["added_error"])

The outputs of MatMul/Gemm nodes that exist in both graphs under the same tensor name become extra
graph outputs in ONNX Runtime (CPU); each layer's error is ||cand - ref|| / ||ref|| over all batches,
in the reference graph's order, with the error each layer adds to what it received from upstream.
`diff` reports it; the INT8 precision fallback uses it to pick the layers to keep in FP16.
Needs only onnx, onnxruntime and numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError

PROFILED_OPS = ("MatMul", "Gemm")


@dataclass(frozen=True)
class JumpRule:
    """A layer's error 'jumps' when it adds at least `ratio` x the error it received and at least
    `min_added` (relative errors)."""

    ratio: float = 0.5
    min_added: float = 0.01


def profiled_tensors(ref_model, cand_model, nodes=None, ops: tuple = PROFILED_OPS) -> list[dict]:
    """[{node, op, tensor}] for the reference's MatMul/Gemm outputs present in both graphs (made by
    any op in the candidate, e.g. ONNX Runtime's dynamic INT8 MatMulInteger + Mul), in reference order.

    Args:
        nodes: reference node names to keep (default: every matched MatMul/Gemm).
        ops: the reference op types profiled (e.g. add "Attention" for a fused graph).
    """
    cand = {o for n in cand_model.graph.node for o in n.output}
    rows = [{"node": n.name, "op": n.op_type, "tensor": n.output[0]} for n in ref_model.graph.node
            if n.op_type in ops and n.output[0] in cand]
    if nodes is None:
        return rows
    wanted = list(nodes)
    missing = sorted(set(wanted) - {r["node"] for r in rows})
    if missing:
        raise InputError(f"no MatMul/Gemm output shared by both graphs for node(s) {', '.join(missing)}")
    return [r for r in rows if r["node"] in set(wanted)]


def with_outputs(model, tensors: list[str]):
    """A copy of `model` with `tensors` appended as graph outputs (typed by shape inference)."""
    import onnx

    from trt_seer.export import onnxio

    inferred = onnxio.infer_shapes(model)
    typed = {v.name: v for v in inferred.graph.value_info}
    present = {o.name for o in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in tensors:
        if t in present:
            continue
        if t not in typed:
            raise InputError(f"cannot type intermediate tensor {t!r}; shape inference found no type for it")
        out.graph.output.append(typed[t])
    return out


def _session(model):
    from trt_seer.runtime.ort import OrtOptions, create_session

    # Basic level only: later fusions (QDQ -> QLinearMatMul, attention) would change which
    # arithmetic the profiled tensors come from.
    return create_session(model.SerializeToString(), OrtOptions(optimization="basic"))


def _accumulate(ref_sess, cand_sess, tensors: list[str], batches: list[dict]) -> tuple[np.ndarray, ...]:
    """Sums over batches of ||cand - ref||^2 and ||ref||^2 per tensor, and the max |cand - ref|."""
    diff_sq, ref_sq, max_abs = (np.zeros(len(tensors)) for _ in range(3))
    for feeds in batches:
        refs = ref_sess.run(tensors, feeds)
        cands = cand_sess.run(tensors, feeds)
        for i, (r, c) in enumerate(zip(refs, cands)):
            if r.shape != c.shape:
                raise InputError(f"tensor {tensors[i]!r} has shape {c.shape} in the candidate, {r.shape} "
                                 "in the reference")
            d = c.astype(np.float64) - r.astype(np.float64)
            diff_sq[i] += float(np.sum(d * d))
            ref_sq[i] += float(np.sum(np.square(r.astype(np.float64))))
            max_abs[i] = max(max_abs[i], float(np.max(np.abs(d))) if d.size else 0.0)
    return diff_sq, ref_sq, max_abs


def received_errors(model, rows: list[dict], rel: np.ndarray) -> np.ndarray:
    """Per profiled layer, the largest error among its nearest profiled ancestors (0 for none):
    the error the layer received, so parallel branches (Q, K, V) are not charged for each other."""
    producer = {o: n for n in model.graph.node for o in n.output}
    index = {r["tensor"]: i for i, r in enumerate(rows)}
    received = np.zeros(len(rows))
    for i, row in enumerate(rows):
        stack, seen = list(producer[row["tensor"]].input), set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in index:
                received[i] = max(received[i], rel[index[t]])
            elif t in producer:
                stack.extend(producer[t].input)
    return received


def layer_error_profile(ref_onnx: Path, cand_onnx: Path, batches: list[dict], nodes=None,
                        ops: tuple = PROFILED_OPS) -> list[dict]:
    """Relative error per MatMul/Gemm layer of `cand_onnx` against `ref_onnx`, in graph order.

    Args:
        ref_onnx: the reference graph (usually FP32).
        cand_onnx: the reduced-precision graph with the same node outputs (FP16-typed or Q/DQ).
        batches: feeds dicts for both graphs.
        nodes: reference node names to profile (default: every MatMul/Gemm found in both graphs).
        ops: the reference op types profiled (MatMul and Gemm by default).

    Returns:
        [{index, node, op, tensor, rel_error, received_error, added_error, max_abs_error}]:
        `received_error` is the largest error of the nearest profiled layers upstream, and
        `added_error` = rel_error - received_error, what this layer adds.
    """
    import onnx

    if not batches:
        raise InputError("layer error profile needs at least one batch of inputs")
    ref_model, cand_model = onnx.load(str(ref_onnx)), onnx.load(str(cand_onnx))
    rows = profiled_tensors(ref_model, cand_model, nodes, ops)
    if not rows:
        raise InputError(f"{Path(cand_onnx).name} and {Path(ref_onnx).name} share no MatMul/Gemm outputs")
    tensors = [r["tensor"] for r in rows]
    ref_sess = _session(with_outputs(ref_model, tensors))
    cand_sess = _session(with_outputs(cand_model, tensors))
    diff_sq, ref_sq, max_abs = _accumulate(ref_sess, cand_sess, tensors, batches)
    rel = np.sqrt(diff_sq) / np.maximum(np.sqrt(ref_sq), 1e-30)
    received = received_errors(ref_model, rows, rel)
    return [{"index": i, **row, "rel_error": float(rel[i]), "received_error": float(received[i]),
             "added_error": float(rel[i] - received[i]), "max_abs_error": float(max_abs[i])}
            for i, row in enumerate(rows)]


def first_jumps(profile: list[dict], n: int = 5, rule: JumpRule = JumpRule()) -> list[dict]:
    """The first `n` layers (graph order) whose error jumps by `rule`."""
    jumps = [r for r in profile if r["added_error"] >= max(rule.ratio * r["received_error"], rule.min_added)]
    return jumps[:n]


def most_sensitive(profile: list[dict], n: int | None = None) -> list[str]:
    """Node names by added error, largest first: the layers to keep out of INT8 first."""
    ranked = sorted(profile, key=lambda r: (-r["added_error"], r["index"]))
    return [r["node"] for r in ranked[:n]]
