"""FP32 ONNX -> FP16-typed ONNX for strongly typed TensorRT builds.

Every float tensor becomes FP16 except in numerically sensitive ops, which stay FP32 with Casts at
the boundary: normalisation (LayerNormalization and its decomposition: ReduceMean, Pow, Sqrt,
Reciprocal), Softmax, reductions, and the pooled-embedding head (the nodes that feed only
`sentence_embedding`). Graph inputs and outputs keep their types, except those named in
`Fp16Spec.fp16_io` (a decoder's KV cache), which become float16. The result runs in ONNX Runtime on
CPU, so its numerics are checked without a GPU. Why not onnxconverter-common: docs/DESIGN.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trt_seer.export import onnxio
from trt_seer.errors import UnsupportedError

FLOAT, FLOAT16 = 1, 10
FP16_MAX = 65504.0
KEEP_FP32_OPS = frozenset({
    "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization",
    "InstanceNormalization", "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare",
    "ReduceL2", "ReduceLogSumExp", "Pow", "Sqrt", "Reciprocal", "CumSum",
})
# Elementwise ops that stay FP32 when every float input already comes from the FP32 region
# (so `x / sqrt(var + eps)` in a decomposed norm stays FP32 end to end).
FOLLOW_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Clip", "Max", "Min", "Abs", "Exp", "Log"})
UNSUPPORTED_OPS = frozenset({"If", "Loop", "Scan"})


@dataclass(frozen=True)
class Fp16Spec:
    keep_ops: frozenset = KEEP_FP32_OPS
    fp32_outputs: tuple[str, ...] = ("sentence_embedding",)  # heads computed entirely in FP32
    extra_fp32_nodes: frozenset = field(default_factory=frozenset)
    fp16_io: frozenset = frozenset()  # graph inputs/outputs typed float16 (a decoder's past/present)


def _float_tensors(model) -> set[str]:
    """Names of every FLOAT tensor in the graph (after shape inference)."""
    g = model.graph
    typed = list(g.input) + list(g.output) + list(g.value_info)
    names = {v.name for v in typed if v.type.tensor_type.elem_type == FLOAT}
    names |= {t.name for t in g.initializer if t.data_type == FLOAT}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].t.data_type == FLOAT:
            names.add(n.output[0])
    return names


def _ancestors(nodes, outputs: set[str]) -> set[int]:
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    seen, stack = set(), [producer[o] for o in outputs if o in producer]
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(producer[x] for x in nodes[i].input if x in producer)
    return seen


def _head_nodes(model, spec: Fp16Spec) -> set[int]:
    """Nodes that feed only the FP32 head outputs, not any other graph output."""
    nodes = model.graph.node
    outs = {o.name for o in model.graph.output}
    head = outs & set(spec.fp32_outputs)
    if not head:
        return set()
    return _ancestors(nodes, head) - _ancestors(nodes, outs - head)


def _regions(model, spec: Fp16Spec, floats: set[str]) -> list[bool]:
    """Per node (graph order): True if it computes in FP32."""
    nodes = model.graph.node
    head = _head_nodes(model, spec)
    fp32_tensors = {v.name for v in model.graph.input} - spec.fp16_io  # inputs keep FP32
    init = {t.name for t in model.graph.initializer} | {n.output[0] for n in nodes if n.op_type == "Constant"}
    region = []
    for i, n in enumerate(nodes):
        fin = [x for x in n.input if x in floats and x not in init]
        keep = (i in head or n.op_type in spec.keep_ops or n.name in spec.extra_fp32_nodes
                or (n.op_type in FOLLOW_OPS and fin and all(x in fp32_tensors for x in fin)))
        if n.op_type == "Constant":
            keep = False  # constants follow their consumers (decided at conversion)
        region.append(keep)
        if keep:
            fp32_tensors.update(n.output)
    return region


def _to_fp16_array(arr: np.ndarray) -> np.ndarray:
    return np.clip(arr, -FP16_MAX, FP16_MAX).astype(np.float16)


class _Converter:
    def __init__(self, model, spec: Fp16Spec):
        import onnx

        self.onnx = onnx
        self.model = model
        self.fp16_io = spec.fp16_io
        self.floats = _float_tensors(model)
        self.fp32 = _regions(model, spec, self.floats)
        self.casts: dict[tuple[str, int], str] = {}
        self.new_nodes = []
        self.tensor_is_fp16: dict[str, bool] = {v.name: v.name in spec.fp16_io for v in model.graph.input}
        for v in model.graph.input:
            if v.name in spec.fp16_io:
                v.type.tensor_type.elem_type = FLOAT16

    def cast(self, name: str, to: int) -> str:
        key = (name, to)
        if key not in self.casts:
            out = f"{name}__to{'fp16' if to == FLOAT16 else 'fp32'}"
            self.new_nodes.append(self.onnx.helper.make_node("Cast", [name], [out], to=to, name=f"{out}_cast"))
            self.casts[key] = out
        return self.casts[key]

    def convert_initializers(self, consumers_fp16: dict[str, set[bool]]):
        from onnx import numpy_helper

        g = self.model.graph
        for t in list(g.initializer):
            if t.data_type != FLOAT or t.name not in consumers_fp16:
                continue
            uses = consumers_fp16[t.name]
            if uses == {True}:
                t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(t)), t.name))
                self.tensor_is_fp16[t.name] = True
            else:
                self.tensor_is_fp16[t.name] = False
                if True in uses:
                    half = numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(t)), t.name + "__fp16")
                    g.initializer.append(half)
                    self.tensor_is_fp16[half.name] = True

    def convert_constant(self, node, fp16: bool):
        from onnx import numpy_helper

        attr = node.attribute[0]
        if attr.name == "value" and attr.t.data_type == FLOAT and fp16:
            attr.t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(attr.t)), attr.t.name))
        self.tensor_is_fp16[node.output[0]] = fp16 and attr.t.data_type in (FLOAT, FLOAT16)

    def consumer_regions(self) -> dict[str, set[bool]]:
        """For each tensor, the set of 'consumer computes in FP16' flags (Casts excluded)."""
        uses: dict[str, set[bool]] = {}
        for n, keep in zip(self.model.graph.node, self.fp32):
            if n.op_type == "Cast":
                continue
            for x in n.input:
                uses.setdefault(x, set()).add(not keep)
        return uses

    def rewrite_node(self, node, fp16: bool):
        """Retypes `node` for its region; inserts Casts on float inputs of the other type."""
        if node.op_type in UNSUPPORTED_OPS:
            raise UnsupportedError(f"FP16 conversion does not handle {node.op_type} subgraphs ({node.name})")
        if node.op_type != "Cast":
            for k, x in enumerate(node.input):
                if x not in self.floats or x not in self.tensor_is_fp16:
                    continue
                if self.tensor_is_fp16[x] != fp16:
                    dup = x + "__fp16"
                    node.input[k] = dup if fp16 and self.tensor_is_fp16.get(dup) else \
                        self.cast(x, FLOAT16 if fp16 else FLOAT)
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == FLOAT and fp16:
                a.i = FLOAT16
            if node.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == FLOAT and fp16:
                from onnx import numpy_helper
                a.t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(a.t))))
        for o in node.output:
            if o in self.floats:
                self.tensor_is_fp16[o] = fp16

    def run(self):
        g = self.model.graph
        uses = self.consumer_regions()
        self.convert_initializers(uses)
        out_nodes = []
        for node, keep in zip(list(g.node), self.fp32):
            self.new_nodes = []
            if node.op_type == "Constant":
                self.convert_constant(node, True in uses.get(node.output[0], {False}))
            else:
                self.rewrite_node(node, not keep)
            out_nodes.extend(self.new_nodes + [node])
        self.new_nodes = []
        self.restore_outputs(out_nodes)
        del g.node[:]
        g.node.extend(out_nodes + self.new_nodes)
        del g.value_info[:]
        return self.model

    def restore_outputs(self, nodes):
        """Graph outputs get a final Cast to their type under their own name where the computed
        type differs: FP32, or FP16 for those in `fp16_io`."""
        for out in self.model.graph.output:
            want_fp16 = out.name in self.fp16_io
            if want_fp16:
                out.type.tensor_type.elem_type = FLOAT16
            if out.name not in self.floats or self.tensor_is_fp16.get(out.name, False) == want_fp16:
                continue
            raw = out.name + ("__fp32" if want_fp16 else "__fp16")
            for n in nodes:
                n.input[:] = [raw if x == out.name else x for x in n.input]
                n.output[:] = [raw if x == out.name else x for x in n.output]
            to, suffix = (FLOAT16, "fp16") if want_fp16 else (FLOAT, "fp32")
            self.new_nodes.append(self.onnx.helper.make_node("Cast", [raw], [out.name], to=to,
                                                             name=f"{out.name}_to_{suffix}"))


def fp16_model(model, spec: Fp16Spec = Fp16Spec()):
    """Returns an FP16-typed copy of an FP32 onnx.ModelProto (inputs/outputs keep their types but
    for `spec.fp16_io`); a model over protobuf's 2 GB limit is converted in place."""
    inferred = onnxio.infer_shapes(model)
    converted = _Converter(inferred, spec).run()
    onnxio.check_model(converted)
    return converted


def fp16_from_onnx(src: Path, dest: Path, spec: Fp16Spec = Fp16Spec()) -> Path:
    """FP32 ONNX file -> FP16-typed ONNX file (written atomically)."""
    return onnxio.save(fp16_model(onnxio.load(src), spec), dest)


def fp32_node_names(model) -> list[str]:
    """Names of compute nodes whose float outputs stay FP32 (for reports and tests)."""
    floats = _float_tensors(model)
    return [n.name for n in model.graph.node if n.op_type not in ("Cast", "Constant")
            and any(o in floats for o in n.output)]
