"""SmoothQuant for Q/DQ graphs: moves activation outliers into the weights before INT8.

BERT-family LayerNorm outputs carry a few outlier channels (|x| ~ 30 where most are < 1), so one
per-tensor INT8 scale wastes almost all levels on them. For each group of GEMMs that share an
activation X with weights W (inner dim j), s_j = max|X_j|^a / max|W_j|^(1-a); the graph computes
(X / s) @ (s W), which is exact in real arithmetic but gives X / s a range INT8 can hold. The
division is an explicit Mul on the GEMM branch only, because the same X also feeds residual Adds.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from trt_seer.export import onnxio

S_MIN, S_MAX = 1e-4, 1e4


def groups(model, nodes: list[str]) -> dict[str, list]:
    """Activation tensor -> GEMM nodes (among `nodes`) that read it with a constant weight at input 1."""
    inits = {t.name for t in model.graph.initializer}
    wanted = set(nodes)
    out = defaultdict(list)
    for n in model.graph.node:
        if n.name in wanted and n.op_type == "MatMul" and n.input[1] in inits:
            out[n.input[0]].append(n)
    return dict(out)


def channel_absmax(onnx_path: Path, batches, tensors: list[str]) -> dict[str, np.ndarray]:
    """Per-channel (last axis) max |x| of each tensor over `batches` (ONNX Runtime, CPU)."""
    import tempfile

    import onnx

    from trt_seer.eval.evaluate import session

    model = onnxio.load(onnx_path)
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)
    with tempfile.TemporaryDirectory(prefix="trt_seer_smooth_") as tmp:
        sess = session(onnxio.save(model, Path(tmp) / "m.onnx"))
    inputs = [i.name for i in sess.get_inputs()]
    amax = {}
    for feeds in batches:
        mask = feeds["attention_mask"].astype(bool)
        for t, v in zip(tensors, sess.run(tensors, {k: feeds[k] for k in inputs})):
            cur = np.abs(v[mask] if v.ndim == 3 else v).reshape(-1, v.shape[-1]).max(axis=0)
            amax[t] = np.maximum(amax.get(t, cur), cur)
    return amax


def smooth_model(model, act_amax: dict[str, np.ndarray], alpha: float, nodes: list[str],
                 scales: dict[str, np.ndarray] | None = None):
    """Rewrites `model` (FP32) in place; returns {activation tensor: smoothed tensor name}. With
    `scales` ({tensor: s}, learned by finetune --qat-smoothing learned), those s are applied
    instead of the ones computed from `act_amax` and `alpha`."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    renamed, new_nodes = {}, {}
    for x, gemms in groups(model, nodes).items():
        if x not in (act_amax if scales is None else scales):
            continue
        weights = [numpy_helper.to_array(inits[g.input[1]]).astype(np.float32) for g in gemms]
        if scales is not None:
            s = np.clip(scales[x].astype(np.float64), S_MIN, S_MAX)
        else:
            w_amax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)  # (inner,)
            s = np.clip(np.maximum(act_amax[x], 1e-8) ** alpha / np.maximum(w_amax, 1e-8) ** (1 - alpha), S_MIN, S_MAX)
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{x}__smooth_inv")
        model.graph.initializer.append(inv)
        xs = f"{x}__smooth"
        new_nodes[gemms[0].name] = helper.make_node("Mul", [x, inv.name], [xs], name=f"{x}_smooth")
        for g, w in zip(gemms, weights):
            inits[g.input[1]].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), g.input[1]))
            g.input[0] = xs
        renamed[x] = xs
    _insert_before(model, new_nodes)
    return renamed


def _insert_before(model, new_nodes: dict) -> None:
    ordered = []
    for n in model.graph.node:
        if n.name in new_nodes:
            ordered.append(new_nodes[n.name])
        ordered.append(n)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
