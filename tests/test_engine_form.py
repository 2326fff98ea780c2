"""export/engine_form.py: the encoder's fused-attention graph (one ONNX Attention per layer) on tiny
families: what fuses, which masks become the shared padding mask, agreement with the FP32 graph, the
FP16 typing of the form, and the network TensorRT's parser makes of it."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from tiny import LAYERS

from trt_seer.engine import trt
from trt_seer.errors import UnsupportedError
from trt_seer.export import checkpoint as export
from trt_seer.export import onnxio
from trt_seer.export.engine_form import FORM, PADDING_MASK, engine_form_from_fp32, padding_only
from trt_seer.export.families import resolve_model

FE, TC = "feature-extraction", "text-classification"


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnxio.load(path, False).graph.node)


def _exported(tiny_checkpoint, tmp_path, model_type, task):
    info = resolve_model(tiny_checkpoint(model_type, task))
    src = tmp_path / "m.fp32.onnx"
    export.onnx_from_checkpoint(info, src)
    return info, src


@pytest.mark.parametrize("model_type,task,padding", [
    ("bert", FE, LAYERS), ("distilbert", TC, LAYERS),
    pytest.param("roberta", TC, LAYERS, marks=pytest.mark.slow),
    pytest.param("modernbert", FE, LAYERS // 2, marks=pytest.mark.slow),  # local layers: a sliding-window mask
])
def test_each_attention_becomes_one_onnx_attention(tiny_checkpoint, tmp_path, model_type, task, padding):
    info, src = _exported(tiny_checkpoint, tmp_path, model_type, task)
    dest = tmp_path / "m.attention.onnx"

    report = engine_form_from_fp32(info, src, dest)

    ops = _ops(dest)
    assert report["form"] == FORM and report["attention"] == LAYERS == ops["Attention"]
    assert ops["Softmax"] == 0 and ops["IsNaN"] == 0  # no decomposition, no NaN guard left
    assert report["padding_mask"] == padding  # only masks that are the padding mask share it
    graph = onnxio.load(dest, False).graph
    readers = [n for n in graph.node if n.op_type == "Attention" and PADDING_MASK in n.input]
    assert len(readers) == padding
    for name, r in report["verification"]["outputs"].items():
        assert r["max_abs_diff"] <= r["allowed"], name
    assert next(o.version for o in onnxio.load(dest, False).opset_import if o.domain in ("", "ai.onnx")) >= 23


@pytest.mark.slow
def test_attention_that_does_not_match_is_refused(tiny_checkpoint, tmp_path):
    """MPNet adds its relative-position bias in an attention of its own, no scaled-dot-product attention:
    no fused form (the build then keeps the decomposed graph)."""
    info, src = _exported(tiny_checkpoint, tmp_path, "mpnet", FE)
    dest = tmp_path / "m.attention.onnx"

    with pytest.raises(UnsupportedError, match="matched the fused form"):
        engine_form_from_fp32(info, src, dest)
    assert not dest.exists()


def test_padding_only_tells_the_padding_mask_from_other_masks():
    keep = np.array([[1, 1, 1, 0], [0, 1, 1, 1]])
    neg = np.float32(-3.4e38)
    plain = np.where(keep[:, None, None, :] == 1, 0.0, neg).astype(np.float32)
    full = np.broadcast_to(plain, (2, 1, 4, 4)).copy()
    causal = full.copy()
    causal[:, :, 0, 2] = neg  # differs along query rows: not the padding mask
    biased = full + np.float32(0.5) * (full == 0)  # a learned bias on kept keys
    wrong_batch = full[:1]
    assert padding_only([full, plain, causal, biased, wrong_batch], keep) == [True, True, False, False, False]


@pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
def test_tensorrt_parses_each_attention_into_one_attention_layer(tiny_checkpoint, tmp_path):
    from tiny import parsed_network

    from trt_seer.export.precision import KEEP_FP32_OPS, Fp16Spec, fp16_from_onnx

    info, src = _exported(tiny_checkpoint, tmp_path, "bert", FE)
    engine_form_from_fp32(info, src, tmp_path / "m.attention.onnx")
    fp16 = fp16_from_onnx(tmp_path / "m.attention.onnx", tmp_path / "m.fp16.onnx",
                          Fp16Spec(keep_ops=KEEP_FP32_OPS - {"LayerNormalization"}))

    _flavor, _builder, network, _parser = parsed_network(fp16)

    layers = [network.get_layer(i) for i in range(network.num_layers)]
    kinds = collections.Counter(str(layer.type).split(".")[-1] for layer in layers)
    assert kinds["ATTENTION_INPUT"] == LAYERS and kinds["SOFTMAX"] == 0
    norms = [layer for layer in layers if str(layer.type).endswith("NORMALIZATION")]
    assert norms and all(str(layer.get_input(0).dtype).endswith("HALF") for layer in norms)  # FP16 in
