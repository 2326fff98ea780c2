"""FP32 -> FP16-typed ONNX: graph structure and numerics on ONNX Runtime (CPU)."""
import numpy as np
import onnx
import pytest

from tiny import make_tiny_checkpoint
from trt_seer.eval import evaluate
from trt_seer.export.checkpoint import onnx_from_checkpoint
from trt_seer.export.families import resolve_model
from trt_seer.export.precision import FLOAT, FLOAT16, fp16_from_onnx


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp16")
    info = resolve_model(make_tiny_checkpoint("bert", "feature-extraction", d / "ckpt"))
    onnx_from_checkpoint(info, d / "m.fp32.onnx")
    fp16_from_onnx(d / "m.fp32.onnx", d / "m.fp16.onnx")
    return info, d / "m.fp32.onnx", d / "m.fp16.onnx"


def _types(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    vi = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    return inferred, vi


def test_io_types_kept_and_weights_fp16(tiny_pair):
    _, fp32, fp16 = tiny_pair
    a, b = onnx.load(fp32), onnx.load(fp16)
    assert [(i.name, i.type.tensor_type.elem_type) for i in a.graph.input] == \
           [(i.name, i.type.tensor_type.elem_type) for i in b.graph.input]
    assert all(o.type.tensor_type.elem_type == FLOAT for o in b.graph.output)
    matmul_weights = {n.input[1] for n in b.graph.node if n.op_type == "MatMul"}
    inits = {t.name: t.data_type for t in b.graph.initializer}
    typed = [inits[w] for w in matmul_weights if w in inits]
    assert typed and all(t == FLOAT16 for t in typed)


def test_sensitive_ops_stay_fp32(tiny_pair):
    _, _, fp16 = tiny_pair
    model, vi = _types(onnx.load(fp16))
    sensitive = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "Softmax", "ReduceL2")]
    assert sensitive
    for n in sensitive:
        assert vi.get(n.output[0], FLOAT) == FLOAT, n.name
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert all(vi[n.output[0]] == FLOAT16 for n in matmuls)


def test_pooled_head_is_fp32(tiny_pair):
    _, _, fp16 = tiny_pair
    model, vi = _types(onnx.load(fp16))
    reduce_sum = [n for n in model.graph.node if n.op_type == "ReduceSum"]
    assert reduce_sum and all(vi.get(n.output[0], FLOAT) == FLOAT for n in reduce_sum)


def test_fp16_numerics_tiny(tiny_pair):
    info, fp32, fp16 = tiny_pair
    m = evaluate.compare_onnx(info, fp32, fp16, evaluate.eval_batches(info))
    assert m["mean_cosine"] >= 0.999 and m["min_cosine"] >= 0.995, m


@pytest.mark.slow
def test_fp16_numerics_default_model(tmp_path):
    info = resolve_model(None)
    onnx_from_checkpoint(info, tmp_path / "d.fp32.onnx")
    fp16_from_onnx(tmp_path / "d.fp32.onnx", tmp_path / "d.fp16.onnx")
    m = evaluate.compare_onnx(info, tmp_path / "d.fp32.onnx", tmp_path / "d.fp16.onnx",
                              evaluate.eval_batches(info))
    assert m["mean_cosine"] >= 0.999 and m["min_cosine"] >= 0.999, m
    assert m["samples"] >= 100


def test_decoder_fp16_runs(tmp_path):
    info = resolve_model(make_tiny_checkpoint("llama", "causal-lm", tmp_path / "ckpt"))
    onnx_from_checkpoint(info, tmp_path / "l.fp32.onnx")
    from trt_seer.export.decoder import compare_decoders
    from trt_seer.decoder_io import decoder_io
    from trt_seer.export.precision import Fp16Spec

    kv = [n for n in sum(decoder_io(2), ()) if n.startswith(("past_", "present."))]
    fp16_from_onnx(tmp_path / "l.fp32.onnx", tmp_path / "l.fp16.onnx", Fp16Spec(fp16_io=frozenset(kv)))
    graph = onnx.load(str(tmp_path / "l.fp16.onnx")).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)}
    assert {types[n] for n in kv} == {onnx.TensorProto.FLOAT16}  # the cache is float16, no casts per step
    assert types["logits"] == onnx.TensorProto.FLOAT and types["input_ids"] == onnx.TensorProto.INT64
    m = compare_decoders(tmp_path / "l.fp32.onnx", tmp_path / "l.fp16.onnx", info.config)
    assert m["top1_agreement"] >= 0.95 and np.isfinite(m["max_abs_diff"]), m
