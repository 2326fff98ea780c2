"""`finetune --qat int8` -> `build --int8 --int8-mode w8a8 --model CKPT` on a tiny BERT classifier
(CPU): the fake-quantized Linears are the GEMMs build quantizes, the trained ranges become the
Q/DQ scales of the built graph, the gate passes; bad input exits 2 with one line."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_finetune import tiny_bert, toy_rows, write_jsonl

from trt_seer.cli import main
from trt_seer.engine import manifest, trt
from trt_seer.export import onnxio
from trt_seer.quantize import calibrate, qat_ranges, qdq

needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
PROFILE = ["--batch", "1,4,4", "--seq", "8,12,16"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def finetune_args(tmp, out, *extra):
    return ["finetune", "--model", str(tmp / "bert"), "--train", str(tmp / "train.jsonl"), "--eval",
            str(tmp / "eval.jsonl"), "--device", "cpu", "--batch", "8", "--lr", "3e-3", "--epochs", "1",
            "--out", str(tmp / out), *extra]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qat")
    tiny_bert(tmp / "bert")
    write_jsonl(tmp / "train.jsonl", toy_rows(96, seed=1))
    write_jsonl(tmp / "eval.jsonl", toy_rows(32, seed=2))
    return tmp


@pytest.fixture(scope="module")
def qat_built(toy):
    """One QAT run (bf16 autocast, learned ranges, attention BMMs too) and its W8A8 build."""
    assert main(finetune_args(toy, "qat", "--qat", "int8", "--int8-attention", "--amp", "bf16", "--range-lr",
                              "0.02")) == 0
    if trt.available():
        assert main(["build", "--model", str(toy / "qat"), "--int8", "--int8-mode", "w8a8", "--int8-attention", *PROFILE,
                     "--out", str(toy / "eng"), "--calib-cache", str(toy / "c.cache")]) == 0
    return toy


def ranges_by_module(ckpt):
    doc = json.loads((ckpt / qat_ranges.RANGES_FILE).read_text())
    return doc, {m: r["amax"] for r in doc["ranges"] for m in r["modules"]}


def test_ranges_cover_every_quantized_linear_and_were_learned(qat_built):
    import torch
    from transformers import AutoModelForSequenceClassification

    doc, amax = ranges_by_module(qat_built / "qat")
    model = AutoModelForSequenceClassification.from_pretrained(str(qat_built / "qat"))
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    attention = [f"bert.encoder.layer.{k}.attention.self" for k in (0, 1)]
    assert doc["attention_modules"] == attention
    bmm_inputs = {f"{a}#{x}" for a in attention for x in "qkpv"}
    assert set(amax) == (linears - {"classifier"}) | bmm_inputs  # the head stays FP16 in build
    qkv = [r for r in doc["ranges"] if any(m.endswith("self.query") for m in r["modules"])]
    assert all(len(r["modules"]) == 3 for r in qkv) and len(qkv) == 2  # Q, K, V read one tensor
    assert doc["ranges_trained"] == "learned" and doc["initialised_from"] == "entropy calibration"
    assert doc["smooth_alpha"] == 0.5 and sum(r["tensor"].endswith("__smooth") for r in doc["ranges"]) == 8
    assert any(abs(r["amax"] / r["initial_amax"] - 1) > 1e-3 for r in doc["ranges"])
    assert not any("qat" in k for k in model.state_dict())  # fake quantization was taken off
    assert model.config._attn_implementation != "trt_seer_qat"
    record = json.loads((qat_built / "qat" / "training.json").read_text())
    assert record["settings"]["qat"]["mode"] == "int8" and record["settings"]["amp"]["mode"] == "bf16"


@needs_trt
def test_build_takes_the_trained_ranges_as_qdq_scales(qat_built):
    _, amax = ranges_by_module(qat_built / "qat")
    rec = json.loads((qat_built / "eng" / "qat.int8.onnx.json").read_text())
    assert rec["calibration"]["qat_ranges"].endswith(qat_ranges.RANGES_FILE)
    assert rec["calibration"]["smooth_alpha"] == 0.5 and rec["quantization"]["mode"] == "w8a8"
    assert rec["accuracy"]["gate"]["passed"] and rec["quantization"]["int8_gemms"]["fp16_fallback"] == []
    checked = assert_scales_are_trained_amax(qat_built / "eng", qat_built / "qat", "text-classification", amax)
    assert checked == len(amax) == 13 + 8  # 13 Linears, 2 x 4 BMM inputs
    cache = calibrate.read_cache(qat_built / "c.cache")  # TensorRT's cache carries the same ranges
    assert max(abs(cache[t] * calibrate.INT8_MAX / a - 1) for t, a in _tensor_amax(qat_built).items()) < 1e-5
    m = manifest.read_engine_manifest(qat_built / "eng" / "qat.int8.manifest.json")
    assert m["precision"] == "int8" and (qat_built / "eng" / m["engine"]["file"]).is_file()


def assert_scales_are_trained_amax(eng, ckpt, task: str, amax: dict) -> int:
    """Every activation Q/DQ scale of `eng`/qat.int8.onnx is the trained amax / 127 (in FP16) of the
    range key its GEMM input maps to; returns how many scales were checked."""
    fp32 = onnxio.load(eng / "qat.fp32.onnx")
    targets = qdq.find_targets(fp32, qdq.QuantSpec(attention=True), task)
    linear = qat_ranges.linear_nodes(fp32, qat_ranges.checkpoint_weights(ckpt), targets)
    keys = qat_ranges.target_keys(linear, targets, ranges_by_module(ckpt)[0]["attention_modules"])
    scales = {t.name: float(np.asarray(onnxio_array(t)).reshape(-1)[0])
              for t in onnxio.load(eng / "qat.int8.onnx").graph.initializer if t.name.endswith("__scale")}
    checked = 0
    for t in targets:
        for i in t.activations:
            expected = np.float16(amax[qat_ranges.input_key(keys[t.node], i)] / calibrate.INT8_MAX)
            assert scales[f"{t.node}_in{i}__scale"] == pytest.approx(float(expected), rel=1e-6)
            checked += 1
    return checked


def onnxio_array(t):
    from onnx import numpy_helper

    return numpy_helper.to_array(t)


def _tensor_amax(root):
    doc, _ = ranges_by_module(root / "qat")
    return {r["tensor"]: r["amax"] for r in doc["ranges"]}


def torch_inputs(model, feed: dict) -> dict:
    """{range key: the tensor PyTorch QAT fake-quantizes there} on one forward pass: Linear inputs
    by forward pre-hooks, BMM inputs by recording what the QAT attention function quantizes."""
    import torch

    from trt_seer.finetune import qat_attention

    seen, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_pre_hook(lambda mod, a, name=name: seen.__setitem__(name, a[0].numpy())))
    _, attention = qat_attention.attention_modules(model)
    names = {id(m): n for n, m in model.named_modules()}

    def record(x, param):  # stands in for fake_quant_input: keeps the value, quantizes nothing
        seen[f"{names[id(param.module)]}#{param.input}"] = x.detach().numpy()
        return x

    for n in attention:
        m = model.get_submodule(n)
        for x in "qkpv":
            setattr(m, f"qat_bmm_{x}", SimpleNamespace(module=m, input=x))
    original = qat_attention.fake_quant_input
    qat_attention.fake_quant_input = record
    try:
        with torch.no_grad():
            model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    finally:
        qat_attention.fake_quant_input = original
        for h in hooks:
            h.remove()
    return seen, attention


@needs_trt
def test_modules_map_to_the_exported_gemms_they_feed(qat_built):
    """Every quantized GEMM input of the exported graph (ONNX Runtime) equals what QAT quantizes
    for its range key in PyTorch: Linear inputs and the four attention BMM inputs."""
    import torch
    from transformers import AutoModelForSequenceClassification

    onnx_path = qat_built / "eng" / "qat.fp32.onnx"
    graph = onnxio.load(onnx_path)
    targets = qdq.find_targets(graph, qdq.QuantSpec(attention=True), "text-classification")
    model = AutoModelForSequenceClassification.from_pretrained(str(qat_built / "qat")).eval()
    weights = {n: m.weight.detach().numpy() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    nodes = qat_ranges.linear_nodes(graph, weights, targets)
    assert len(nodes) == len(set(nodes.values())) == 13  # 2 x 6 encoder Linears + pooler
    order = list(weights)  # module order == graph order of the exported GEMMs
    positions = [order.index(nodes[t.node]) for t in targets if t.weight is not None]
    assert positions == sorted(positions)
    rng = np.random.default_rng(0)
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0  # padding: the mask enters the softmax
    feed = {"input_ids": rng.integers(5, 50, (2, 9)), "attention_mask": mask, "token_type_ids": np.zeros((2, 9), np.int64)}
    seen, attention = torch_inputs(model, feed)
    keys = qat_ranges.target_keys(nodes, targets, attention)
    tensors = qdq.activation_tensors(graph, targets)
    names = sorted(set(tensors.values()))
    with tempfile.TemporaryDirectory() as tmp:
        session, inputs = calibrate._session_with_outputs(onnx_path, names, Path(tmp))
        values = dict(zip(names, session.run(names, {k: feed[k] for k in inputs})))
    assert len(tensors) == 13 + 8
    for (node, i), tensor in tensors.items():
        key = qat_ranges.input_key(keys[node], i)
        got, want = values[tensor], seen[key]
        assert got.size == want.size, (node, key)
        np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), atol=1e-4, err_msg=f"{node}.{i} vs {key}")


@needs_trt
def test_from_calib_seeds_frozen_ranges(qat_built):
    """A TensorRT cache of the same graph seeds the ranges; frozen ranges come out unchanged."""
    cache = calibrate.read_cache(qat_built / "c.cache")
    assert main(finetune_args(qat_built, "frozen", "--qat", "int8", "--qat-ranges", "frozen", "--max-steps", "2",
                              "--qat-loss", "distill", "--from-calib", str(qat_built / "c.cache"))) == 0
    doc, _ = ranges_by_module(qat_built / "frozen")
    assert doc["ranges_trained"] == "frozen" and "c.cache" in doc["initialised_from"] and doc["loss"] == "distill"
    first = json.loads((qat_built / "frozen" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kind"] == "step" and 0 < first["loss"] < 0.5  # KL to its own FP32 start: small, not CE-sized
    for r in doc["ranges"]:
        assert r["amax"] == pytest.approx(r["initial_amax"], rel=1e-6)
        assert r["amax"] == pytest.approx(cache[r["tensor"]] * calibrate.INT8_MAX, rel=1e-5)


# -- ranges only (--qat-train ranges) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ranges_built(toy):
    """A fine-tuned classifier (confident logits: something to distil), then QAT with its weights
    frozen, ranges and SmoothQuant scales distilled on calib/default.txt; then build."""
    assert main(finetune_args(toy, "plain")) == 0
    args = finetune_args(toy, "ranges", "--qat", "int8", "--qat-train", "ranges", "--qat-smoothing", "learned",
                         "--max-steps", "4", "--range-lr", "0.05")
    args[args.index("--model") + 1] = str(toy / "plain")
    assert main(args) == 0
    if trt.available():
        assert main(["build", "--model", str(toy / "ranges"), "--int8", "--int8-mode", "w8a8", *PROFILE,
                     "--out", str(toy / "eng-ranges"), "--calib-cache", str(toy / "r.cache")]) == 0
    return toy


def test_ranges_only_keeps_the_weights_and_learns_ranges_and_smoothing(ranges_built):
    from safetensors.numpy import load_file

    start, out = (load_file(str(ranges_built / d / "model.safetensors")) for d in ("plain", "ranges"))
    assert set(start) == set(out) and all(np.array_equal(start[k], out[k]) for k in start)  # FP32 == the start's
    doc, _ = ranges_by_module(ranges_built / "ranges")
    assert doc["trained"] == "ranges" and doc["loss"] == "distill" and doc["ranges_trained"] == "learned"
    assert len(doc["smoothing"]) == 8  # 2 layers x (QKV, O, FFN up, FFN down) inputs
    assert sum(len(e["modules"]) for e in doc["smoothing"]) == 12  # Q, K, V share one s
    assert all(np.abs(np.divide(e["s"], e["initial_s"]) - 1).max() > 0.01 for e in doc["smoothing"])
    assert any(abs(r["amax"] / r["initial_amax"] - 1) > 1e-3 for r in doc["ranges"])
    record = json.loads((ranges_built / "ranges" / "training.json").read_text())
    assert record["settings"]["qat"]["train"] == "ranges" and record["settings"]["qat"]["smoothing"] == "learned"


@needs_trt
def test_build_applies_the_learned_smoothing_and_ranges(ranges_built):
    """The built graph's smoothing Muls are 1 / the learned s and its activation Q/DQ scales the
    learned amax / 127: build took both from qat_ranges.json, calibrated nothing, and gated it."""
    from onnx import numpy_helper

    doc, amax = ranges_by_module(ranges_built / "ranges")
    eng = ranges_built / "eng-ranges"
    rec = json.loads((eng / "ranges.int8.onnx.json").read_text())
    assert rec["calibration"]["smoothing"] == "learned (qat_ranges.json)" and rec["accuracy"]["gate"]["passed"]
    fp32 = onnxio.load(eng / "ranges.fp32.onnx")
    targets = qdq.find_targets(fp32, qdq.QuantSpec(), "text-classification")
    modules = qat_ranges.linear_nodes(fp32, qat_ranges.checkpoint_weights(ranges_built / "ranges"), targets)
    inits = {t.name: numpy_helper.to_array(t) for t in onnxio.load(eng / "ranges.int8.onnx").graph.initializer}
    s_by_module = {m: np.asarray(e["s"]) for e in doc["smoothing"] for m in e["modules"]}
    nodes = {n.name: n for n in fp32.graph.node}
    checked = 0
    for t in targets:
        x = nodes[t.node].input[0]
        if f"{x}__smooth_inv" in inits:
            inv = inits[f"{x}__smooth_inv"].astype(np.float64)
            np.testing.assert_allclose(inv, 1 / s_by_module[modules[t.node]], rtol=2e-3)  # FP16 graph
            checked += 1
        if t.node in rec["quantization"]["int8_gemms"]["fp16_fallback"]:
            continue
        scale = float(inits[f"{t.node}_in0__scale"].reshape(-1)[0])
        assert scale == pytest.approx(float(np.float16(amax[modules[t.node]] / calibrate.INT8_MAX)), rel=1e-6)
    assert checked == 12


# -- bad input --------------------------------------------------------------------------------------

def one_line_error(capsys, code, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and err[-1].startswith("trt-seer: error:") and needle in err[-1], err
    return err


def test_qat_on_causal_lm_is_refused(toy, capsys):
    code = main(finetune_args(toy, "lm", "--qat", "int8", "--task", "causal-lm"))
    one_line_error(capsys, code, "text-classification")
    assert not (toy / "lm").exists()


def test_malformed_from_calib_is_refused_before_training(toy, capsys):
    bad = toy / "bad.cache"
    bad.write_text("TRT-100100-EntropyCalibration2\nlayer_norm: not-hex\n")
    code = main(finetune_args(toy, "badcalib", "--qat", "int8", "--from-calib", str(bad)))
    one_line_error(capsys, code, "bad.cache")
    code = main(finetune_args(toy, "badcalib", "--from-calib", str(bad)))
    one_line_error(capsys, code, "--from-calib needs --qat int8")
    code = main(finetune_args(toy, "badcalib", "--qat", "int8", "--from-calib", str(toy / "missing.cache")))
    one_line_error(capsys, code, "not found")
    assert not (toy / "badcalib").exists()


@needs_trt
def test_malformed_ranges_file_stops_build(qat_built, tmp_path, capsys):
    ckpt = shutil.copytree(qat_built / "qat", tmp_path / "broken")
    (ckpt / qat_ranges.RANGES_FILE).write_text('{"schema": 1, "mode": "w8a8", "ranges": [{"amax": -1}]}')
    code = main(["build", "--model", str(ckpt), "--int8", *PROFILE, "--out", str(tmp_path / "eng")])
    one_line_error(capsys, code, qat_ranges.RANGES_FILE)
    assert not (tmp_path / "eng").exists()


@needs_trt
def test_build_with_another_smoothquant_alpha_is_refused(qat_built, tmp_path, capsys):
    code = main(["build", "--model", str(qat_built / "qat"), "--int8", "--int8-mode", "w8a8", "--smooth-alpha", "0",
                 *PROFILE, "--out", str(tmp_path / "eng")])
    one_line_error(capsys, code, "--smooth-alpha 0.5")
    assert not (tmp_path / "eng").exists()


def test_ranges_only_and_calib_data_need_distillation_and_smoothing_needs_smoothquant(toy, capsys):
    code = main(finetune_args(toy, "bad", "--qat", "int8", "--qat-train", "ranges", "--qat-loss", "labels"))
    one_line_error(capsys, code, "--qat-loss distill")
    code = main(finetune_args(toy, "bad", "--qat", "int8", "--qat-smoothing", "learned", "--smooth-alpha", "0"))
    one_line_error(capsys, code, "--smooth-alpha > 0")
    code = main(finetune_args(toy, "bad", "--qat", "int8", "--qat-data", "calib"))
    one_line_error(capsys, code, "--qat-loss distill")
    assert not (toy / "bad").exists()
