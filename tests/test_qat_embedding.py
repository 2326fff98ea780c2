"""`finetune --task feature-extraction --qat int8` -> `build --int8 --int8-mode w8a8` on a tiny BERT
embedding model (CPU): weights frozen, activation ranges (and attention BMM ranges) distilled on
the calibration corpus against the FP32 model's sentence embedding; build takes them as its Q/DQ
scales instead of calibrating and its cosine gate passes; bad options exit 2 with one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_finetune import save_tokenizer
from test_qat import PROFILE, assert_scales_are_trained_amax, needs_trt, one_line_error, ranges_by_module
from tiny import make_tiny_checkpoint

from trt_seer.cli import main
from trt_seer.engine import trt
from trt_seer.quantize import calibrate, qat_ranges

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TASK = "feature-extraction"


def qat_args(tmp, out, *extra):
    return ["finetune", "--task", TASK, "--model", str(tmp / "emb"), "--qat", "int8", "--device", "cpu",
            "--batch", "8", "--out", str(tmp / out), *extra]


@pytest.fixture(scope="module")
def emb_built(tmp_path_factory):
    """A tiny BERT embedding model (BertModel, dropout off, with tokenizer), its QAT (attention BMMs
    too, 4 steps) and the W8A8 build of the result."""
    tmp = tmp_path_factory.mktemp("qat_emb")
    make_tiny_checkpoint("bert", TASK, tmp / "emb", hidden_size=64, intermediate_size=128, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    save_tokenizer(tmp / "emb")
    assert main(qat_args(tmp, "qat", "--int8-attention", "--max-steps", "4", "--range-lr", "0.05")) == 0
    if trt.available():
        assert main(["build", "--model", str(tmp / "qat"), "--int8", "--int8-mode", "w8a8", "--int8-attention",
                     *PROFILE, "--out", str(tmp / "eng"), "--calib-cache", str(tmp / "c.cache")]) == 0
    return tmp


def test_weights_stay_and_every_encoder_gemm_input_gets_a_learned_range(emb_built):
    from safetensors.numpy import load_file

    start, out = (load_file(str(emb_built / d / "model.safetensors")) for d in ("emb", "qat"))
    assert set(start) == set(out) and all(np.array_equal(start[k], out[k]) for k in start)
    doc, amax = ranges_by_module(emb_built / "qat")
    assert doc["trained"] == "ranges" and doc["loss"] == "distill" and doc["ranges_trained"] == "learned"
    attention = [f"encoder.layer.{k}.attention.self" for k in (0, 1)]
    assert doc["attention_modules"] == attention
    linears = {f"encoder.layer.{k}.{m}" for k in (0, 1) for m in ("attention.self.query", "attention.self.key",
                                                                  "attention.self.value", "attention.output.dense",
                                                                  "intermediate.dense", "output.dense")}
    assert set(amax) == linears | {f"{a}#{x}" for a in attention for x in "qkpv"}  # no pooler: not in the graph
    assert any(abs(r["amax"] / r["initial_amax"] - 1) > 1e-3 for r in doc["ranges"])
    record = json.loads((emb_built / "qat" / "training.json").read_text())
    assert record["task"] == TASK and record["data"]["eval_examples"] > 0
    assert record["settings"]["qat"]["data"] == "calib" and record["settings"]["qat"]["train"] == "ranges"
    final = record["metrics"]["final"]
    assert final["eval_mean_cosine"] == pytest.approx(1 - final["eval_loss"]) and final["eval_mean_cosine"] > 0.99
    config = json.loads((emb_built / "qat" / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]


def test_loss_is_one_minus_cosine_of_the_sentence_embeddings():
    import torch

    from trt_seer.finetune.objective import for_task

    a, b = (torch.nn.functional.normalize(torch.randn(5, 16, generator=torch.Generator().manual_seed(s)), dim=1)
            for s in (0, 1))
    expected = (1 - torch.nn.functional.cosine_similarity(a, b, dim=1)).sum()
    assert float(for_task(TASK).loss_sum(a, b)) == pytest.approx(float(expected), rel=1e-5)


@needs_trt
def test_build_takes_the_trained_ranges_and_passes_the_cosine_gate(emb_built):
    _, amax = ranges_by_module(emb_built / "qat")
    eng = emb_built / "eng"
    rec = json.loads((eng / "qat.int8.onnx.json").read_text())
    assert rec["calibration"]["qat_ranges"].endswith(qat_ranges.RANGES_FILE)
    gate = rec["accuracy"]["gate"]
    assert gate["passed"] and rec["quantization"]["int8_gemms"]["fp16_fallback"] == []
    checked = assert_scales_are_trained_amax(eng, emb_built / "qat", TASK, amax)
    assert checked == len(amax) == 12 + 8
    doc, _ = ranges_by_module(emb_built / "qat")
    cache = calibrate.read_cache(emb_built / "c.cache")  # TensorRT's cache carries the trained ranges
    assert max(abs(cache[r["tensor"]] * calibrate.INT8_MAX / r["amax"] - 1) for r in doc["ranges"]) < 1e-5


def test_embeddings_only_take_distilled_ranges(emb_built, capsys):
    args = qat_args(emb_built, "bad")
    code = main([a for a in args if a not in ("--qat", "int8")])
    one_line_error(capsys, code, "no training objective for --task feature-extraction")
    for extra in (["--qat-train", "all"], ["--qat-loss", "labels"], ["--qat-data", "task"]):
        code = main(qat_args(emb_built, "bad", *extra))
        one_line_error(capsys, code, "--qat-train ranges, --qat-loss distill and --qat-data calib")
    code = main(qat_args(emb_built, "bad", "--train", str(emb_built / "t.jsonl")))
    one_line_error(capsys, code, "calib/default.txt")
    code = main(qat_args(emb_built, "bad", "--qat", "int4"))
    one_line_error(capsys, code, "add --qat int8")
    assert not (emb_built / "bad").exists()
