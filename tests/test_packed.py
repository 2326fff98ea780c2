"""Batches without padding: packing (runtime/packed.py), the packed graph (export/packed.py) against
the padded one, the packed network pass (engine/attention.py) and the build's packed artifacts."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trt_seer.engine import trt
from trt_seer.errors import InputError, UnsupportedError
from trt_seer.export import checkpoint as export
from trt_seer.export.families import ShapeProfile, resolve_model
from trt_seer.runtime.packed import pack, unpack

FE = "feature-extraction"
needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")


def _padded(batch=3, seq=7, left=True):
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[0, 4:] = 0  # right padding
    if left:
        mask[-1, :3] = 0  # left padding
    ids = np.where(mask == 1, rng.integers(5, 100, (batch, seq)), 0)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": rng.integers(0, 2, (batch, seq)) * mask}


def test_pack_then_unpack_gives_the_padded_layout_back():
    feeds = _padded()
    packed, layout = pack(feeds, {"positions": "column"})
    tokens = int(feeds["attention_mask"].sum())
    assert packed["input_ids"].shape == (1, tokens) and packed["cu_seqlens"].dtype == np.int32
    assert packed["cu_seqlens"].tolist() == [0, 4, 11, 15]
    assert packed["sequence_ids"][0].tolist() == [0] * 4 + [1] * 7 + [2] * 4
    assert packed["position_ids"][0, -4:].tolist() == [3, 4, 5, 6]  # the left-padded row keeps its columns
    ranked, _ = pack(feeds, {"positions": "rank", "offset": 2})
    assert ranked["position_ids"][0, -4:].tolist() == [2, 3, 4, 5]  # counted from pad id 1 + 1
    hidden = packed["input_ids"][..., None].astype(np.float32) * np.ones((1, 1, 3), np.float32)  # (1, tokens, 3)
    back = unpack({"last_hidden_state": hidden}, layout)["last_hidden_state"]  # (batch, seq, 3)
    assert np.array_equal(back[..., 0], (feeds["input_ids"] * feeds["attention_mask"]).astype(np.float32))


def test_pack_refuses_a_batch_of_padding_only():
    feeds = _padded()
    feeds["attention_mask"][:] = 0
    with pytest.raises(InputError, match="no token"):
        pack(feeds, {"positions": "column"})


def _cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("model_type,positions", [("bert", "column"), ("roberta", "rank")])
def test_packed_graph_equals_padded_per_sentence(tiny_checkpoint, tmp_path, model_type, positions):
    from trt_seer.export.packed import packed_onnx_from_checkpoint
    from trt_seer.runtime.ort import OnnxRuntimeModel
    from trt_seer.runtime.packed import PackedModel

    info = resolve_model(tiny_checkpoint(model_type, FE))
    export.onnx_from_checkpoint(info, tmp_path / "m.fp32.onnx")
    report = packed_onnx_from_checkpoint(info, tmp_path / "m.fp32.onnx", tmp_path / "m.fp32.packed.onnx")
    assert report["rule"]["positions"] == positions and report["attention"] == 2
    record = {"packed": {**report, "padded_inputs": list(info.inputs)}}
    (tmp_path / "m.fp32.packed.onnx.json").write_text(json.dumps(record))

    feeds = export.sample_inputs(info, 4, 19, seed=3)
    with PackedModel(OnnxRuntimeModel(tmp_path / "m.fp32.packed.onnx")) as packed, \
            OnnxRuntimeModel(tmp_path / "m.fp32.onnx") as padded:
        got, ref = packed.infer(feeds), padded.infer(feeds)
    assert (_cosines(got["sentence_embedding"], ref["sentence_embedding"]) >= 0.9999).all()
    keep = feeds["attention_mask"].astype(bool)
    assert got["last_hidden_state"].shape == ref["last_hidden_state"].shape
    assert np.abs(got["last_hidden_state"][keep] - ref["last_hidden_state"][keep]).max() < 1e-4
    assert not got["last_hidden_state"][~keep].any()  # zeros at padding


def test_a_classifier_has_no_packed_form(tiny_checkpoint, tmp_path):
    from trt_seer.export.packed import packed_onnx_from_checkpoint

    info = resolve_model(tiny_checkpoint("bert", "text-classification"))
    with pytest.raises(UnsupportedError, match="feature-extraction"):
        packed_onnx_from_checkpoint(info, tmp_path / "m.fp32.onnx", tmp_path / "m.fp32.packed.onnx")
    assert not (tmp_path / "m.fp32.packed.onnx").exists()


@pytest.fixture
def packed_fp16(tiny_checkpoint, tmp_path):
    """A packed FP16 graph of a tiny BERT with heads TensorRT has a fused kernel for (head_dim 32)."""
    from trt_seer.export.engine_form import FP16_OPS
    from trt_seer.export.packed import packed_onnx_from_checkpoint
    from trt_seer.export.precision import KEEP_FP32_OPS, Fp16Spec, fp16_from_onnx

    info = resolve_model(tiny_checkpoint("bert", FE, hidden_size=64, num_attention_heads=2))
    export.onnx_from_checkpoint(info, tmp_path / "m.fp32.onnx")
    packed_onnx_from_checkpoint(info, tmp_path / "m.fp32.onnx", tmp_path / "m.fp32.packed.onnx")
    return fp16_from_onnx(tmp_path / "m.fp32.packed.onnx", tmp_path / "m.fp16.packed.onnx",
                          Fp16Spec(keep_ops=KEEP_FP32_OPS - FP16_OPS))


@needs_trt
def test_network_pass_makes_each_attention_packed(packed_fp16):
    from tiny import LAYERS, parsed_network

    from trt_seer.engine import attention

    flavor, _builder, network, _parser = parsed_network(packed_fp16)
    assert attention.make_packed(flavor, network) == LAYERS

    packed = attention.packed_attentions(flavor, network)
    form = flavor.trt.AttentionIOForm.PACKED_NHD
    assert len(packed) == LAYERS
    for a in packed:
        assert a.query_form == form and a.key_value_form == form and a.mask is None
        assert a.query_lengths.name == a.key_value_lengths.name == "cu_seqlens"
        assert tuple(a.get_input(0).shape) == (-1, 2, 32) and tuple(a.get_output(0).shape) == (-1, 2, 32)


@pytest.mark.gpu
def test_packed_engine_runs_as_the_padded_graph(packed_fp16, tmp_path):
    """TensorRT-RTX 1.7.1 builds packed attention only where its fused packed kernel is available:
    not without a GPU ("CUDA-Tile conditions not met"), so the engine is built and run on a GPU."""
    from trt_seer.runtime import cuda, load, tensorrt_unavailable_reason

    if cuda.gpu_unavailable_reason() or tensorrt_unavailable_reason():
        pytest.skip(f"no TensorRT that runs on a GPU here: {cuda.gpu_unavailable_reason() or tensorrt_unavailable_reason()}")
    from trt_seer.engine.build import BuildSpec, engine_from_onnx

    spec = BuildSpec(profile=ShapeProfile((1, 4, 8), (1, 16, 32)))
    m = engine_from_onnx(packed_fp16, tmp_path / "m.fp16.packed.engine", spec,
                         extra={"packed": {"rule": {"positions": "column"}, "padded_inputs": list(_padded())}})
    assert m["build"]["packed_attention"] == 2
    shapes = m["optimization_profiles"][0]["shapes"]
    assert shapes["cu_seqlens"] == [[2], [5], [9]] and shapes["input_ids"] == [[1, 1], [1, 64], [1, 256]]
    feeds = _padded(4, 19)
    with load(tmp_path / "m.fp16.packed.engine", backend="tensorrt") as packed, \
            load(tmp_path / "m.fp32.onnx") as padded:
        got, ref = packed.infer(feeds), padded.infer(feeds)
    assert (_cosines(got["sentence_embedding"], ref["sentence_embedding"]) >= 0.9999).all()


@needs_trt
def test_build_writes_the_packed_graph_with_its_record(tiny_checkpoint, tmp_path):
    """The build goes on where TensorRT cannot build the packed engine (no GPU here); the packed
    FP16 graph and its record are there, and load() runs it behind the padded interface."""
    from trt_seer.build import BuildRequest, build
    from trt_seer.engine.build import BuildSpec
    from trt_seer.runtime import load

    ckpt = tiny_checkpoint("bert", FE)
    out = tmp_path / "out"
    build(BuildRequest(model=str(ckpt), out=out, spec=BuildSpec(profile=ShapeProfile((1, 2, 4), (8, 16, 32))), packed=True))

    name = resolve_model(ckpt).name
    record = json.loads((out / f"{name}.fp16.packed.onnx.json").read_text())
    assert record["packed"]["rule"] == {"positions": "column"} and record["packed"]["attention"] == 2
    assert record["accuracy"]["onnx_vs_fp32"]["min_cosine"] >= 0.999
    feeds = _padded(3, 11)
    with load(out / f"{name}.fp16.packed.onnx") as packed, load(out / f"{name}.fp16.onnx") as padded:
        got, ref = packed.infer(feeds), padded.infer(feeds)
    assert (_cosines(got["sentence_embedding"], ref["sentence_embedding"]) >= 0.9999).all()
    padded_manifest = json.loads((out / f"{name}.fp16.manifest.json").read_text())
    built = (out / f"{name}.fp16.packed.engine").is_file()
    assert ("packed_sibling" in padded_manifest) == built  # named only where a packed engine was built
