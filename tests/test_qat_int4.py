"""`finetune --task causal-lm --qat int4` -> `build --int4 --model CKPT` on a tiny Llama (CPU): the
fake-quantized Linears are the GEMMs build quantizes, the INT4 values build writes are the ones the
weights were trained with, AWQ is skipped, the gate runs; bad input exits 2 with one line."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_finetune import lm_lines, save_lm_tokenizer
from tiny import make_tiny_checkpoint

from trt_seer.cli import main
from trt_seer.engine import trt
from trt_seer.export import onnxio
from trt_seer.quantize import qat_ranges
from trt_seer.quantize import weightonly as wo

needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
PROFILE = ["--batch", "1,2,4", "--seq", "8,16,32"]
BLOCK = 32
WIDE = {"hidden_size": 128, "intermediate_size": 256}  # K = 128 / 256: whole blocks of 32

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("qat4")
    save_lm_tokenizer(make_tiny_checkpoint("llama", "causal-lm", tmp / "llama", **WIDE))
    (tmp / "corpus.txt").write_text("\n".join(lm_lines(32, seed=1)) + "\n")
    return tmp


def finetune_args(lm: Path, out: str, *extra) -> list[str]:
    return ["finetune", "--task", "causal-lm", "--model", str(lm / "llama"), "--train", str(lm / "corpus.txt"),
            "--eval", str(lm / "corpus.txt"), "--device", "cpu", "--batch", "8", "--lr", "1e-2", "--epochs", "1",
            "--out", str(lm / out), *extra]


@pytest.fixture(scope="module")
def qat_built(lm) -> Path:
    assert main(finetune_args(lm, "qat", "--qat", "int4", "--int4-block", str(BLOCK))) == 0
    if trt.available():
        assert main(["build", "--model", str(lm / "qat"), "--int4", "--int4-block", str(BLOCK), *PROFILE,
                     "--keep-intermediates", "--out", str(lm / "eng")]) == 0  # the graphs are inspected
    return lm


def test_qat_file_names_every_int4_gemm_but_the_lm_head(qat_built):
    import torch
    from transformers import AutoModelForCausalLM

    doc = json.loads((qat_built / "qat" / qat_ranges.RANGES_FILE).read_text())
    assert doc["mode"] == "int4" and doc["bits"] == 4 and doc["block"] == BLOCK and doc["lm_head"] is False
    model = AutoModelForCausalLM.from_pretrained(str(qat_built / "qat"))
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(doc["modules"]) == linears - {"lm_head"} and len(doc["modules"]) == 14
    assert not any("qat" in k for k in model.state_dict())
    assert json.loads((qat_built / "qat" / "training.json").read_text())["settings"]["qat"]["mode"] == "int4"


def test_fake_quant_is_builds_rounding_with_straight_through_gradients():
    import torch

    from trt_seer.finetune.fakequant import fake_quant_int4_blocks

    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0)) * 0.05
    w.requires_grad_(True)
    y = fake_quant_int4_blocks(w, BLOCK)
    q, scale = wo.quantize_int4(w.detach().numpy().astype(np.float16).astype(np.float32).T, BLOCK)
    expected = wo.dequantize(q, scale.astype(np.float16).astype(np.float32), BLOCK).T
    np.testing.assert_array_equal(y.detach().numpy(), expected)
    y.backward(torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape))
    np.testing.assert_array_equal(w.grad.numpy(), np.arange(w.numel()).reshape(w.shape))


@needs_trt
def test_build_writes_the_int4_values_the_weights_were_trained_for(qat_built):
    import torch

    from trt_seer.finetune.fakequant import fake_quant_int4_blocks

    eng = qat_built / "eng"
    rec = json.loads((eng / "qat.int4.onnx.json").read_text())
    q = rec["quantization"]
    assert q["awq"] is None and q["qat"]["block"] == BLOCK and q["qat"]["awq"].startswith("skipped")
    assert rec["accuracy"]["gate"]["passed"] and rec["accuracy"]["gate"]["table"]
    fp32 = onnxio.load(eng / "qat.fp32.onnx")
    targets = wo.find_targets(fp32, wo.WeightOnlySpec(4, BLOCK))
    gemms = [type("T", (), {"node": t.node, "weight": 1}) for t in targets]
    weights = qat_ranges.checkpoint_weights(qat_built / "qat")
    modules = qat_ranges.linear_nodes(fp32, weights, gemms)
    from onnx import numpy_helper

    int4 = onnxio.load(eng / "qat.int4.onnx")
    inits = {t.name: t for t in int4.graph.initializer}
    dq = {n.output[0]: n for n in int4.graph.node if n.op_type == "DequantizeLinear"}
    checked = 0
    for n in int4.graph.node:
        if n.name not in modules or n.name in q["fp16_gemms"]:
            continue
        node = dq[n.input[1]]
        values = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        trained = fake_quant_int4_blocks(torch.from_numpy(weights[modules[n.name]]), BLOCK).numpy().T
        np.testing.assert_array_equal(values * np.repeat(scale, BLOCK, axis=0), trained)
        checked += 1
    assert checked == 14 - len(q["fp16_gemms"]) and checked > 0


@needs_trt
def test_rounded_weights_are_the_int4_graph_and_match_its_fp16_reference(lm, tmp_path):
    import torch

    from trt_seer.finetune.fakequant import fake_quant_int4_blocks

    assert main(finetune_args(lm, "rounded", "--qat", "int4", "--int4-block", str(BLOCK), "--qat-weights",
                              "rounded", "--max-steps", "2")) == 0
    assert json.loads((lm / "rounded" / qat_ranges.RANGES_FILE).read_text())["weights"] == "rounded"
    weights = qat_ranges.checkpoint_weights(lm / "rounded")
    for name in json.loads((lm / "rounded" / qat_ranges.RANGES_FILE).read_text())["modules"]:
        w = weights[name]  # already on the INT4 grid: rounding again moves it by FP16 rounding at most
        np.testing.assert_allclose(fake_quant_int4_blocks(torch.from_numpy(w), BLOCK).numpy(), w, rtol=2e-3, atol=0)
    assert main(["build", "--model", str(lm / "rounded"), "--int4", "--int4-block", str(BLOCK), *PROFILE,
                 "--out", str(tmp_path / "eng")]) == 0
    rec = json.loads((tmp_path / "eng" / "rounded.int4.onnx.json").read_text())
    first = rec["accuracy"]["gate"]["table"][0][1]  # the all-INT4 graph against the checkpoint's FP16
    assert rec["quantization"]["qat"]["weights"] == "rounded" and rec["quantization"]["fp16_gemms"] == []
    assert first["agreement"] >= 0.99 and abs(first["ppl_increase"]) < 2e-3  # scales may differ by one FP16 ulp


# -- bad input --------------------------------------------------------------------------------------

def one_line_error(capsys, code, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and err[-1].startswith("trt-seer: error:") and needle in err[-1], err


@needs_trt
def test_build_with_another_block_or_the_lm_head_is_refused(qat_built, tmp_path, capsys):
    code = main(["build", "--model", str(qat_built / "qat"), "--int4", "--int4-block", "64", *PROFILE,
                 "--out", str(tmp_path / "eng")])
    one_line_error(capsys, code, f"--int4-block {BLOCK}")
    code = main(["build", "--model", str(qat_built / "qat"), "--int4", "--int4-block", str(BLOCK),
                 "--quantize-lm-head", *PROFILE, "--out", str(tmp_path / "eng")])
    one_line_error(capsys, code, "--quantize-lm-head")
    assert not (tmp_path / "eng").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--task", "text-classification"], "causal"),
    (["--int8-attention"], "--int8-attention"),
    (["--qat-train", "ranges", "--smooth-alpha", "0.5"], "--qat-train, --smooth-alpha"),
    (["--from-calib", "x.cache"], "--from-calib"),
    (["--int4-block", "48"], "--int4-block 48"),
])
def test_int4_qat_bad_input_is_one_line_exit_2(lm, capsys, extra, needle):
    code = main(finetune_args(lm, "bad", "--qat", "int4", *extra))
    one_line_error(capsys, code, needle)
    assert not (lm / "bad").exists()


def test_int4_block_without_int4_qat_is_refused(lm, capsys):
    code = main(finetune_args(lm, "bad", "--qat", "int8", "--int4-block", "32", "--task", "text-classification"))
    one_line_error(capsys, code, "--int4-block is for --qat int4")
    code = main(finetune_args(lm, "bad", "--qat", "int8", "--qat-weights", "rounded", "--task", "text-classification"))
    one_line_error(capsys, code, "--qat-weights is for --qat int4")


def test_causal_distillation_counts_the_task_losss_positions_only():
    import torch

    from trt_seer.finetune.objective import for_task
    from trt_seer.finetune.train import distill_sum

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    labels = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, -100, -100]])
    tr = SimpleNamespace(teacher=lambda **_: SimpleNamespace(logits=teacher),
                         objective=for_task("causal-lm"))
    got = distill_sum(tr, {}, student, labels)
    p, q = torch.log_softmax(teacher, -1), torch.log_softmax(student, -1)
    kl = (p.exp() * (p - q)).sum(-1)  # (2, 5): position t predicts token t + 1
    assert got.item() == pytest.approx((kl[0, :4].sum() + kl[1, :2].sum()).item(), rel=1e-5)
    assert distill_sum(SimpleNamespace(teacher=lambda **_: SimpleNamespace(logits=student),
                                       objective=tr.objective), {}, student, labels).item() == pytest.approx(0, abs=1e-5)
