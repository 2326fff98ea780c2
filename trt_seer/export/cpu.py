"""FP32 ONNX -> `<name>.fp32.cpu.onnx`: the same graph with ONNX Runtime's fused CPU kernels.

    from trt_seer.export.cpu import cpu_onnx_from_fp32
    report = cpu_onnx_from_fp32(info, Path("m.fp32.onnx"), Path("m.fp32.cpu.onnx"))

The dynamo export spells attention, residual LayerNorm and GELU out op by op (with a NaN guard
after each Softmax); ONNX Runtime's own `transformers.optimizer` does not recognise that form.
onnxscript's ORT fusions (`onnxscript.rewriter.ort_fusions`) do: Attention / MultiHeadAttention,
SkipLayerNormalization, BiasGelu / FastGelu. Constant folding then packs the Q, K and V weights
into one initializer, and ORT's optimizer runs last for whatever it matches on top (on RoBERTa and
DistilBERT: EmbedLayerNormalization). Attention whose additive bias is only the padding mask takes
the 2-D mask as `mask_index` instead, the form ONNX Runtime's QAttention (INT8) accepts. The result
is verified against the FP32 graph on held-out inputs (ExportMismatchError if it disagrees) and
rejected when nothing fused (UnsupportedError: the plain graph is then the CPU form).
"""
from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from trt_seer.errors import ExportMismatchError, UnsupportedError
from trt_seer.export import onnxio
from trt_seer.export.checkpoint import Tolerance, VERIFY_SHAPES, defined_values, sample_inputs
from trt_seer.export.families import ModelInfo
from trt_seer.logs import quieted  # the fusion libraries log expected fallbacks at WARNING

log = logging.getLogger(__name__)
FUSED_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization",
             "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "BiasGelu", "FastGelu",
             "Gelu", "RotaryEmbedding", "EmbedLayerNormalization")
ORT_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "electra": "bert",
                   "distilbert": "bert", "mpnet": "bert"}  # encoders, by ONNX Runtime optimizer's name


def fused_ops(model) -> dict[str, int]:
    """How many nodes of each fused (com.microsoft) kernel `model` holds."""
    counts = Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in FUSED_OPS)
    return dict(sorted(counts.items()))


def _onnxscript_fusions(src: Path):
    """onnxscript's ORT fusions, then constant folding (packs QKV weights that the fusion concats)."""
    import onnxscript.optimizer
    from onnxscript import ir

    try:
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    except ImportError as e:
        raise UnsupportedError(f"this onnxscript has no ONNX Runtime fusions ({e}); pip install -U onnxscript") from e

    with quieted("onnxscript"):
        model, _ = optimize_for_ort(ir.load(str(src)))
        onnxscript.optimizer.fold_constants(model, input_size_limit=1 << 31, output_size_limit=1 << 31)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    return ir.serde.serialize_model(model)


def _padding_only(model, tensor: str) -> bool:
    """Whether `tensor` is computed from the attention mask and shapes alone: no learned weights
    (a relative-position bias reads an embedding table) feed it."""
    producer = {o: n for n in model.graph.node for o in n.output}
    sizes = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
    stack, seen, inputs = [tensor], set(), set()
    while stack:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if sizes.get(t, 0) > 16:
            return False
        if t in producer:
            stack.extend(producer[t].input)
        elif t not in sizes:
            inputs.add(t)
    return "attention_mask" in inputs


def _mask_index(model) -> int:
    """Feeds each Attention whose additive bias is only the padding mask the 2-D mask itself
    (`mask_index`, int32) instead: ONNX Runtime's QAttention takes a mask_index, not a bias, and the
    (batch, 1, seq, seq) bias no longer has to be built. Returns how many nodes changed."""
    from onnx import TensorProto, helper

    names = {i.name for i in model.graph.input}
    nodes = [n for n in model.graph.node if n.op_type == "Attention" and len(n.input) == 6
             and not n.input[3] and not n.input[4] and _padding_only(model, n.input[5])]
    if "attention_mask" not in names or not nodes:
        return 0
    model.graph.node.insert(0, helper.make_node("Cast", ["attention_mask"], ["attention_mask_int32"],
                                                name="attention_mask_int32", to=TensorProto.INT32))
    for node in nodes:
        node.input[3], node.input[5] = "attention_mask_int32", ""
        del node.input[4:]
        plain = [a for a in node.attribute if a.name != "qkv_hidden_sizes" or len(set(a.ints)) != 1]
        del node.attribute[:]
        node.attribute.extend(plain)  # ONNX Runtime's quantizer skips Attention with qkv_hidden_sizes
    return len(nodes)


def _ort_optimizer(model, info: ModelInfo):
    """ONNX Runtime's transformer optimizer (Python fusions only: the session applies its own
    graph optimizations at load time) for what it matches after onnxscript's pass."""
    from onnxruntime.transformers.optimizer import optimize_by_fusion

    model_type = ORT_MODEL_TYPES.get(info.model_type)
    if model_type is None:
        return model
    said = io.StringIO()
    try:
        # it logs on the root logger and its modules' own, and prints; its fusions' expected fallbacks
        # ("symbolic shape inference disabled or failed.") go to DEBUG, errors stay
        with quieted(None, *_ort_transformers_loggers(), debug_to=log), contextlib.redirect_stdout(said):
            return optimize_by_fusion(model, model_type=model_type, num_heads=0, hidden_size=0).model
    finally:
        log.debug("onnxruntime.transformers.optimizer: %s", said.getvalue().strip())


def _ort_transformers_loggers() -> tuple[str, ...]:
    """The loggers of ONNX Runtime's transformer optimizer: its folder goes on sys.path and its
    modules log under their bare names (`fusion_skiplayernorm`, `onnx_model`, ...)."""
    import onnxruntime.transformers as ort_transformers

    return ("onnxruntime", *sorted(p.stem for p in Path(ort_transformers.__file__).parent.glob("*.py")))


def verify_against(info: ModelInfo, ref_path: Path, cand_path: Path, tol: Tolerance = Tolerance()) -> dict:
    """max |Δ| of `cand_path` against `ref_path` (ONNX Runtime CPU) on random held-out token ids at
    VERIFY_SHAPES, padding included; ExportMismatchError above `tol`."""
    from trt_seer.eval.evaluate import session

    ref, cand = session(ref_path), session(cand_path)
    names = [o.name for o in ref.get_outputs()]
    report = {"shapes": [list(s) for s in VERIFY_SHAPES], "outputs": {}}
    for i, (batch, seq) in enumerate(VERIFY_SHAPES):
        feeds = sample_inputs(info, batch, seq, seed=20 + i)
        for name, r, g in zip(names, ref.run(names, feeds), cand.run(names, feeds)):
            r, g = (defined_values(info, name, x, feeds["attention_mask"]) for x in (r, g))
            delta = float(np.max(np.abs(g.astype(np.float64) - r))) if r.size else 0.0
            allowed = tol.atol + tol.rtol * float(np.max(np.abs(r), initial=0.0))
            if not delta <= allowed:  # also catches NaN
                raise ExportMismatchError(f"{cand_path.name} disagrees with {ref_path.name} on {name}: max |Δ| "
                                          f"{delta:.3g} > {allowed:.3g} at batch={batch} seq={seq}")
            prev = report["outputs"].get(name, {"max_abs_diff": 0.0})
            report["outputs"][name] = {"max_abs_diff": max(prev["max_abs_diff"], delta), "allowed": allowed}
    return report


def _drop_unused(model) -> None:
    """Removes nodes and initializers nothing reads (the attention-bias subgraph after _mask_index)."""
    while True:
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        keep = [n for n in model.graph.node if any(o in used for o in n.output)]
        if len(keep) == len(model.graph.node):
            break
        del model.graph.node[:]
        model.graph.node.extend(keep)
    inits = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)


def cpu_onnx_from_fp32(info: ModelInfo, src: Path, dest: Path, tol: Tolerance = Tolerance()) -> dict:
    """Writes the fused CPU graph of `src` to `dest` and verifies it against `src`.

    Returns {"fused_ops": {op: count}, "attention_mask_index": Attention nodes fed the 2-D mask,
    "verification": verify_against's report}."""
    model = _ort_optimizer(_onnxscript_fusions(src), info)
    masked = _mask_index(model)
    _drop_unused(model)
    fused = fused_ops(model)
    if not fused:
        raise UnsupportedError(f"no ONNX Runtime fusion matched {info.name} ({info.model_type}); "
                               f"run {src.name} on ONNX Runtime as it is")
    onnxio.save(model, dest)
    try:
        report = verify_against(info, src, dest, tol)
    except ExportMismatchError:
        dest.unlink(missing_ok=True)
        onnxio.data_path(dest).unlink(missing_ok=True)
        raise
    return {"fused_ops": fused, "attention_mask_index": masked, "verification": report}
