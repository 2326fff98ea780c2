"""Q/DQ placement: which nodes get Quantize/DequantizeLinear, and that the graph runs on CPU."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tiny import make_tiny_checkpoint
from trt_seer.eval import evaluate
from trt_seer.quantize import qdq as quantize
from trt_seer.export.checkpoint import onnx_from_checkpoint
from trt_seer.export.families import resolve_model
from trt_seer.export.precision import fp16_from_onnx


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdq")
    info = resolve_model(make_tiny_checkpoint("bert", "text-classification", d / "ckpt"))
    onnx_from_checkpoint(info, d / "m.fp32.onnx")
    fp16_from_onnx(d / "m.fp32.onnx", d / "m.fp16.onnx")
    return info, d


def _qdq(info, d, spec, name):
    model = onnx.load(d / "m.fp16.onnx")
    targets = quantize.find_targets(model, spec, info.task)
    amax = {(t.node, i): 2.0 for t in targets for i in t.activations}
    quantize.qdq_model(model, amax, targets)
    onnx.save(model, d / name)
    return model, targets


def _consumers(model):
    out = {}
    for n in model.graph.node:
        for x in n.input:
            out.setdefault(x, []).append(n)
    return out


def test_w8a8_places_qdq_on_gemm_inputs_only(graphs):
    info, d = graphs
    model, targets = _qdq(info, d, quantize.QuantSpec(), "w8a8.onnx")
    gemms = [n for n in model.graph.node if n.op_type == "MatMul"]
    quantized = {t.node for t in targets}
    assert quantized and len(quantized) < len(gemms)  # attention matmuls and the head are left out
    cons = _consumers(model)
    for q in (n for n in model.graph.node if n.op_type == "QuantizeLinear"):
        dq = cons[q.output[0]]
        assert [n.op_type for n in dq] == ["DequantizeLinear"]
        assert {c.op_type for c in cons[dq[0].output[0]]} <= {"MatMul", "Gemm"}
    for op in ("LayerNormalization", "Softmax", "Gather", "Erf"):
        for n in (n for n in model.graph.node if n.op_type == op):
            producers = {p.op_type for p in model.graph.node if set(p.output) & set(n.input)}
            assert "DequantizeLinear" not in producers, f"{op} {n.name} reads a DQ"
    head = [n for n in gemms if n.name not in quantized and any(o in {x.name for x in model.graph.output}
                                                               for o in _reach(model, n))]
    assert head, "the classifier head must stay out of INT8"


def _reach(model, node):
    """Tensors reachable downstream of `node` (to find the head GEMM)."""
    seen, frontier = set(), set(node.output)
    while frontier:
        seen |= frontier
        frontier = {o for n in model.graph.node if set(n.input) & frontier for o in n.output} - seen
    return seen


def test_weights_are_int8_per_channel_and_activations_per_tensor(graphs):
    info, d = graphs
    model, _ = _qdq(info, d, quantize.QuantSpec(), "w8a8b.onnx")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        x, scale, zp = (inits.get(i) for i in n.input)
        assert zp is not None and not zp.any()  # symmetric
        if x is not None:  # a weight: int8 initializer, one scale per output channel
            axis = next(a.i for a in n.attribute if a.name == "axis")
            assert x.dtype == np.int8 and scale.shape == (x.shape[axis],)
        else:
            assert scale.shape == ()


def test_weight_only_has_no_activation_quantizers(graphs):
    info, d = graphs
    model, targets = _qdq(info, d, quantize.QuantSpec(weight_only=True), "wo.onnx")
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len([n for n in model.graph.node if n.op_type == "DequantizeLinear"]) == len(targets)


def test_attention_only_behind_the_flag(graphs):
    info, d = graphs
    plain = quantize.find_targets(onnx.load(d / "m.fp16.onnx"), quantize.QuantSpec(), info.task)
    with_attn = quantize.find_targets(onnx.load(d / "m.fp16.onnx"), quantize.QuantSpec(attention=True), info.task)
    extra = [t for t in with_attn if t.weight is None]
    assert not [t for t in plain if t.weight is None] and extra and all(t.activations == (0, 1) for t in extra)


def test_qdq_graph_runs_in_onnxruntime_close_to_fp32(graphs):
    info, d = graphs
    _qdq(info, d, quantize.QuantSpec(), "run.onnx")
    m = evaluate.compare_onnx(info, d / "m.fp32.onnx", d / "run.onnx", evaluate.eval_batches(info))
    assert m["top1_agreement"] >= 0.8 and np.isfinite(m["mean_kl"]), m


def test_quantize_weight_round_trip():
    w = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    q, scale = quantize.quantize_weight(w, axis=1)
    assert q.dtype == np.int8 and scale.shape == (8,)
    assert np.abs(q).max() == 127
    assert np.max(np.abs(q * scale - w)) <= scale.max() / 2 + 1e-7


def test_fp16_scales_never_underflow():
    """A tiny amax gives a scale of at least FP16's smallest normal number, never 0 or subnormal,
    and weights quantized against that floor still dequantize to within half a step."""
    tiny = quantize.activation_scale(1e-9, np.float16)
    assert tiny.dtype == np.float16 and float(tiny) == quantize.FP16_MIN_SCALE
    assert float(quantize.activation_scale(1.0, np.float16)) == pytest.approx(1 / 127, rel=1e-3)
    assert float(quantize.activation_scale(1e-9, np.float32)) == pytest.approx(1e-9 / 127)
    w = np.random.default_rng(0).normal(0, 1e-5, (8, 4)).astype(np.float32)
    q, scale = quantize.quantize_weight(w, 1, quantize.min_scale(np.float16))
    s16 = scale.astype(np.float16).astype(np.float32)
    assert (s16 >= quantize.FP16_MIN_SCALE).all()
    assert np.abs(q * s16 - w).max() <= s16.max() / 2 + 1e-12
