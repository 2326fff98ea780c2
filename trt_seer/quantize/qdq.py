"""Ranges + FP16 ONNX -> Q/DQ INT8 ONNX for strongly typed TensorRT builds.

TensorRT fuses DequantizeLinear into the consumer GEMM, so Q/DQ go exactly where INT8 pays: on
both inputs of MatMul/Gemm nodes with a constant weight. Activations: symmetric per-tensor INT8
(zero point 0) from calibrated amax. Weights: symmetric per-output-channel INT8 stored as int8
initializers with a DequantizeLinear. Everything else (LayerNorm, Softmax, GELU, residual Add,
embedding Gather, the output head) keeps the FP16 graph's types. Attention batched matmuls
(activation x activation) are quantized only with `QuantSpec.attention`. `QuantSpec.weight_only`
leaves activations in FP16: TensorRT-RTX runs INT8 only as weight-only GEMMs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_seer.quantize.calibrate import INT8_MAX
from trt_seer.errors import InputError

QDQ_OPSET = 19  # Quantize/DequantizeLinear with float16 scales
GEMM_OPS = ("MatMul", "Gemm")


MODES = ("w8a8", "weight-only")


@dataclass(frozen=True)
class QuantSpec:
    attention: bool = False
    exclude: frozenset = field(default_factory=frozenset)  # node names kept out of INT8
    weight_only: bool = False  # INT8 weights, activations stay FP16 (TensorRT-RTX's INT8 GEMM)


@dataclass(frozen=True)
class Target:
    """One GEMM to quantize: its node name, which inputs are activations, which is the weight."""

    node: str
    activations: tuple[int, ...]
    weight: int | None
    weight_axis: int | None


def _initializers(model) -> dict:
    return {t.name: t for t in model.graph.initializer}


def nearest_gemms(model, output: str) -> set[str]:
    """The GEMMs nearest `output` on every path back from it (the head that computes it)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    heads, stack, seen = set(), [output], set()
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in GEMM_OPS:
            heads.add(node.name)
            continue
        stack.extend(node.input)
    return heads


def _head_gemms(model) -> set[str]:
    """The GEMM nearest each graph output (the classifier / LM head): kept out of INT8."""
    return set().union(*(nearest_gemms(model, out.name) for out in model.graph.output))


def _weight_axis(node, weight_index: int) -> int:
    """Output-channel axis of the weight: columns of MatMul's B, rows of Gemm's B if transB."""
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 1 if weight_index == 1 else 0


def find_targets(model, spec: QuantSpec, task: str) -> list[Target]:
    """GEMMs to quantize, in graph order."""
    inits = _initializers(model)
    heads = _head_gemms(model) if task != "feature-extraction" else set()
    targets = []
    for n in model.graph.node:
        if n.op_type not in GEMM_OPS or n.name in spec.exclude or n.name in heads:
            continue
        const = [i for i in (0, 1) if n.input[i] in inits and len(inits[n.input[i]].dims) == 2]
        if const:
            w = const[0]
            targets.append(Target(n.name, () if spec.weight_only else (1 - w,), w, _weight_axis(n, w)))
        elif spec.attention and not spec.weight_only:
            targets.append(Target(n.name, (0, 1), None, None))
    return targets


def activation_tensors(model, targets: list[Target]) -> dict[tuple[str, int], str]:
    """(node, input index) -> tensor name in `model` (calibrate these on the FP32 graph)."""
    nodes = {n.name: n for n in model.graph.node}
    missing = [t.node for t in targets if t.node not in nodes]
    if missing:
        raise InputError(f"nodes {', '.join(missing[:3])} not in the calibration graph")
    return {(t.node, i): nodes[t.node].input[i] for t in targets for i in t.activations}


FP16_MIN_SCALE = 2.0**-14  # the smallest normal FP16 number: smaller scales go subnormal or to 0


def min_scale(dtype) -> float:
    """The smallest scale a Q/DQ pair stores in `dtype` without underflow (0 for float32)."""
    return FP16_MIN_SCALE if np.dtype(dtype) == np.float16 else 0.0


def activation_scale(amax: float, dtype) -> np.ndarray:
    """amax / 127 as a `dtype` scalar, never 0 or subnormal (a zero scale divides by zero in Q)."""
    return np.array(max(amax / INT8_MAX, min_scale(dtype), 1e-30), dtype=dtype)


def quantize_weight(w: np.ndarray, axis: int, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel INT8: (int8 weights, float32 scales along `axis`), scales >= `floor`
    (so that they survive the cast to the graph's scale type; see `min_scale`)."""
    w = w.astype(np.float32)
    reduce_axes = tuple(a for a in range(w.ndim) if a != axis)
    amax = np.abs(w).max(axis=reduce_axes)
    scale = np.where(amax > 0, np.maximum(amax / INT8_MAX, floor), 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


class _Rewriter:
    def __init__(self, model):
        from onnx import helper, numpy_helper

        self.model, self.helper, self.nh = model, helper, numpy_helper
        self.inits = _initializers(model)
        self.new_inits, self.done_weights = [], {}

    def const(self, name: str, arr: np.ndarray) -> str:
        self.new_inits.append(self.nh.from_array(arr, name))
        return name

    def scale_dtype(self, tensor: str):
        t = self.inits.get(tensor)
        return np.float16 if t is None or t.data_type == 10 else np.float32

    def activation_qdq(self, tensor: str, amax: float, dtype, tag: str) -> list:
        scale = self.const(f"{tag}__scale", activation_scale(amax, dtype))
        zp = self.const(f"{tag}__zp", np.array(0, dtype=np.int8))
        q, dq = f"{tag}__q", f"{tag}__dq"
        return [self.helper.make_node("QuantizeLinear", [tensor, scale, zp], [q], name=f"{tag}_Q"),
                self.helper.make_node("DequantizeLinear", [q, scale, zp], [dq], name=f"{tag}_DQ")], dq

    def weight_dq(self, name: str, axis: int) -> tuple[list, str]:
        if name in self.done_weights:
            return [], self.done_weights[name]
        t = self.inits[name]
        dtype = np.float16 if t.data_type == 10 else np.float32
        q, scale = quantize_weight(self.nh.to_array(t), axis, min_scale(dtype))
        qname = self.const(f"{name}__int8", q)
        sname = self.const(f"{name}__wscale", scale.astype(dtype))
        zname = self.const(f"{name}__wzp", np.zeros_like(q, shape=scale.shape))
        out = f"{name}__wdq"
        node = self.helper.make_node("DequantizeLinear", [qname, sname, zname], [out], axis=axis,
                                     name=f"{name}_wDQ")
        self.done_weights[name] = out
        return [node], out


def _tensor_types(model) -> dict[str, int]:
    from trt_seer.export import onnxio

    inferred = onnxio.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def qdq_model(model, amax: dict[tuple[str, int], float], targets: list[Target]):
    """Inserts Q/DQ into `model` (the FP16-typed graph) for `targets`; `amax` is keyed by
    (node name, input index). Returns the model (modified in place), opset raised to 19."""
    types = _tensor_types(model)
    rw = _Rewriter(model)
    by_name = {t.node: t for t in targets}
    nodes = []
    for n in model.graph.node:
        t = by_name.get(n.name)
        if t is not None:
            for i in t.activations:
                if (t.node, i) not in amax:
                    raise InputError(f"no calibrated range for input {i} of {t.node}")
                dtype = np.float16 if types.get(n.input[i]) == 10 else np.float32
                qdq, out = rw.activation_qdq(n.input[i], amax[(t.node, i)], dtype, f"{n.name}_in{i}")
                nodes.extend(qdq)
                n.input[i] = out
            if t.weight is not None:
                dq, out = rw.weight_dq(n.input[t.weight], t.weight_axis)
                nodes.extend(dq)
                n.input[t.weight] = out
        nodes.append(n)
    _replace_weights(model, rw)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, QDQ_OPSET)
    return model


def _replace_weights(model, rw: _Rewriter) -> None:
    """Float weights now read only through their DQ are dropped; int8 copies take their place."""
    used = {x for n in model.graph.node for x in n.input}
    keep = [t for t in model.graph.initializer if t.name not in rw.done_weights or t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep + rw.new_inits)


def count_qdq(model) -> dict:
    ops = [n.op_type for n in model.graph.node]
    return {"quantize": ops.count("QuantizeLinear"), "dequantize": ops.count("DequantizeLinear")}


def ort_dynamic_int8(fp32_path, dest, exclude: frozenset = frozenset(), ops: tuple = ("MatMul",)):
    """FP32 ONNX -> ONNX Runtime dynamic INT8 (per-channel weights, activations quantized at run
    time) for the CPU backend: `ops` nodes (MatMul with constant weights; Attention becomes
    QAttention) except `exclude` stay FP32. Written atomically."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from trt_seer.export import onnxio
    from trt_seer.logs import quieted

    # it advises pre-processing (meant for vision models) on the root logger
    with quieted(None), onnxio.staged(dest) as tmp:
        quantize_dynamic(str(fp32_path), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=list(ops), nodes_to_exclude=sorted(exclude),
                         extra_options={"MatMulConstBOnly": True})
    return dest
