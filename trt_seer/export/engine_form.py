"""FP32 encoder ONNX -> the graph TensorRT engines are built from: each attention one ONNX `Attention`.

    from trt_seer.export.engine_form import engine_form_from_fp32
    report = engine_form_from_fp32(info, Path("m.fp32.onnx"), Path("m.fp32.attention.onnx"))

The dynamo export spells scaled-dot-product attention out op by op: two MatMuls, the mask added,
Softmax (kept FP32 by the FP16 typing, with Casts in and out), an IsNaN / Where guard, and the key
transposed through Reshape / Transpose. TensorRT runs that as a dozen kernels per layer. Its ONNX
parser maps the opset-23 `Attention` operator to `IAttention`, one fused kernel. onnxscript's
SDPA pattern (`onnxscript.rewriter.ort_fusions.sdpa`, the one the CPU form's fusions start from)
finds the decomposition; each match becomes `Attention(q, k, v, mask)` with its scale.

The mask: where it is only the padding mask broadcast over query rows (checked numerically on
padded inputs, so a sliding-window or relative-position bias is never mistaken for it), every layer
reads one boolean `[batch, 1, seq, seq]` made from `attention_mask`, instead of the float
`[batch, 1, seq, seq]` bias built by a kernel of its own. Otherwise the node keeps the bias.

The result is verified against the FP32 graph on ONNX Runtime (ExportMismatchError if it
disagrees); a graph with no match raises UnsupportedError and the build keeps the decomposed form.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trt_seer.errors import ExportMismatchError, UnsupportedError
from trt_seer.export import onnxio
from trt_seer.export.families import ModelInfo
from trt_seer.logs import quieted

log = logging.getLogger(__name__)
FORM = "onnx-attention-23"  # the form's name: in the FP16 graph's record and cache key
ATTENTION_OPSET = 23
FP16_OPS = frozenset({"LayerNormalization"})  # computed in FP16 in this form (the FP16 typing keeps them FP32 elsewhere)
PADDING_MASK = "attention_mask_bool"  # the one [batch, 1, seq, seq] mask every padding-only Attention reads
_FUSION_DOMAIN = "ai.onnxruntime._fusion"
MASK_CHECK_MAX = 512  # tokens; masks are compared with the padding mask at the model's length up to this


def _fused_sdpa(src: Path):
    """The FP32 graph as an onnxscript IR model with each matched attention an `SDPA` node."""
    import onnxscript.optimizer
    from onnxscript import ir
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa

    model = ir.load(str(src))
    with quieted("onnxscript"):
        ir.passes.common.ShapeInferencePass()(model)
        onnxscript.optimizer.optimize(model)
        count = fuse_sdpa(model)
    return model, count


def _mask_values(model, masks: list[str], feeds: dict) -> list[np.ndarray]:
    """The additive masks `masks` of the IR `model` on `feeds`: the nodes they are computed from, run
    on ONNX Runtime CPU."""
    import onnx
    import onnxruntime as ort
    from onnxscript import ir

    proto = ir.serde.serialize_model(model)
    producer = {o: n for n in proto.graph.node for o in n.output}
    keep, stack = {}, list(masks)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in keep:
            keep[id(node)] = node
            stack.extend(node.input)
    nodes = [n for n in proto.graph.node if id(n) in keep]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    del proto.graph.output[:]
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(m) for m in masks)
    used = {i for n in nodes for i in n.input}
    inputs = [i for i in proto.graph.input if i.name in used]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(masks, {k: v for k, v in feeds.items() if k in used})


def _mask_check_length(info: ModelInfo) -> int:
    """A sequence length at which a mask that is not the padding mask shows it: as long as the model
    takes (a sliding window is narrower), at most MASK_CHECK_MAX."""
    return max(9, min(int(info.config.get("max_position_embeddings") or MASK_CHECK_MAX), MASK_CHECK_MAX))


def padding_only(values: list[np.ndarray], attention_mask: np.ndarray) -> list[bool]:
    """For each additive mask (batch, 1 | heads, q, k): whether it is 0 where `attention_mask` keeps a
    key and below -1e4 where it drops one, the same for every query row and head."""
    keep = attention_mask.astype(bool)[:, None, None, :]
    out = []
    for v in values:
        if v.ndim != 4 or v.shape[0] != keep.shape[0] or v.shape[-1] != keep.shape[-1]:
            out.append(False)
            continue
        kept = np.broadcast_to(keep, v.shape)
        out.append(bool(np.all(v[kept] == 0) and np.all(v[~kept] <= -1e4)))
    return out


def _padding_mask(graph, ir):
    """The boolean [batch, 1, seq, seq] mask from `attention_mask` (key j of row b kept where
    attention_mask[b, j] is 1), made once at the graph's start. Expanded over query rows, since ONNX
    Runtime's Attention takes no mask broadcast along them."""
    mask = next(v for v in graph.inputs if v.name == "attention_mask")

    def const(name, values):
        return ir.node("Constant", [], attributes={"value": ir.tensor(np.array(values, np.int64))}, name=name)

    axes, ones, one = const(f"{PADDING_MASK}_axes", [1, 2]), const(f"{PADDING_MASK}_11", [1, 1]), const(f"{PADDING_MASK}_1", [1])
    cast = ir.node("Cast", [mask], attributes={"to": ir.DataType.BOOL}, name=f"{PADDING_MASK}_cast")
    unsq = ir.node("Unsqueeze", [cast.outputs[0], axes.outputs[0]], name=f"{PADDING_MASK}_keys")  # (b, 1, 1, s)
    seq = ir.node("Shape", [mask], attributes={"start": 1, "end": 2}, name=f"{PADDING_MASK}_seq")
    shape = ir.node("Concat", [ones.outputs[0], seq.outputs[0], one.outputs[0]], attributes={"axis": 0},
                    name=f"{PADDING_MASK}_shape")  # (1, 1, s, 1)
    full = ir.node("Expand", [unsq.outputs[0], shape.outputs[0]], name=PADDING_MASK)  # (b, 1, s, s)
    full.outputs[0].name = PADDING_MASK
    graph.insert_before(next(iter(graph)), [axes, ones, one, cast, unsq, seq, shape, full])
    return full.outputs[0]


def _attention(node, mask, ir):
    """`Attention` (opset 23) computing what the fused `SDPA` node does: q, k, v (batch, heads, seq, d)."""
    q, k, v = node.inputs[:3]
    pre = []
    if node.attributes.get_string("key_format", "BHSd") == "BSHd":
        pre.append(ir.node("Transpose", [k], attributes={"perm": [0, 2, 1, 3]}, name=f"{node.name}_key_bhsd"))
        k = pre[-1].outputs[0]
    scale = node.attributes.get_float("scale", None)
    attrs = {} if scale is None else {"scale": float(scale)}
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    return pre, ir.node("Attention", inputs, attributes=attrs, name=f"{node.name}_attention")


def _replace(model, padding: list[bool]) -> int:
    """Every `SDPA` node becomes an `Attention`; those whose mask is padding-only (`padding`, in graph
    order) read the shared boolean mask. Returns how many read it."""
    from onnxscript import ir

    graph = model.graph
    nodes = [n for n in graph if n.op_type == "SDPA" and n.domain == _FUSION_DOMAIN]
    shared = _padding_mask(graph, ir) if any(padding) else None
    for node, plain in zip(nodes, padding):
        mask = shared if plain else (node.inputs[3] if len(node.inputs) > 3 else None)
        pre, attention = _attention(node, mask, ir)
        graph.insert_before(node, [*pre, attention])
        ir.convenience.replace_all_uses_with(node.outputs[0], attention.outputs[0])
        attention.outputs[0].name = node.outputs[0].name
        graph.remove(node, safe=True)
    model.opset_imports[""] = max(model.opset_imports.get("", 0), ATTENTION_OPSET)
    model.opset_imports.pop(_FUSION_DOMAIN, None)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    return sum(padding)


def own_mask_form(info: ModelInfo, src: Path, dest: Path) -> int:
    """Writes `src` to `dest` with each attention one ONNX `Attention` that keeps the mask it reads
    (a packed graph's block-diagonal mask: export/packed.py, which verifies the result); returns how
    many. UnsupportedError when no attention matches."""
    from onnxscript import ir

    model, count = _fused_sdpa(src)
    if count == 0:
        raise UnsupportedError(f"no attention of {info.name} ({info.model_type}) matched the fused form")
    _replace(model, [False] * count)
    onnxio.save(ir.serde.serialize_model(model), dest)
    return count


def engine_form_from_fp32(info: ModelInfo, src: Path, dest: Path) -> dict:
    """Writes the fused-attention graph of `src` to `dest`, verified against `src` on ONNX Runtime.

    Returns {"form": FORM, "attention": nodes fused, "padding_mask": of them reading the shared
    boolean mask, "verification": the report of export.cpu.verify_against}."""
    from onnxscript import ir

    from trt_seer.export.checkpoint import sample_inputs
    from trt_seer.export.cpu import verify_against

    if info.family.kind == "decoder":
        raise UnsupportedError("the fused-attention form is for encoders")
    model, count = _fused_sdpa(src)
    if count == 0:
        raise UnsupportedError(f"no attention of {info.name} ({info.model_type}) matched the fused form")
    nodes = [n for n in model.graph if n.op_type == "SDPA" and n.domain == _FUSION_DOMAIN]
    masks = [n.inputs[3].name if len(n.inputs) > 3 else None for n in nodes]
    feeds = sample_inputs(info, 3, _mask_check_length(info), seed=7)  # rows padded on either side
    named = [m for m in masks if m]
    values = dict(zip(named, padding_only(_mask_values(model, named, feeds), feeds["attention_mask"])))
    has_mask_input = any(v.name == "attention_mask" for v in model.graph.inputs)
    padding = [bool(m) and has_mask_input and values[m] for m in masks]
    shared = _replace(model, padding)
    onnxio.save(ir.serde.serialize_model(model), dest)
    try:
        report = verify_against(info, src, dest)
    except ExportMismatchError:
        dest.unlink(missing_ok=True)
        onnxio.data_path(dest).unlink(missing_ok=True)
        raise
    return {"form": FORM, "attention": len(nodes), "padding_mask": shared, "verification": report}
