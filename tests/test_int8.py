"""`build --int8` end to end: calibration data, the accuracy gate, the fallback, bad input."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from tiny import make_tiny_checkpoint
from trt_seer.quantize import calibrate, int8
from trt_seer.engine import manifest
from trt_seer.engine import trt
from trt_seer.errors import AccuracyGateError

needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")


def build(*args, cwd=None, expect=0):
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", *args], capture_output=True, text=True,
                       timeout=1200, cwd=cwd, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == expect, r.stderr[-3000:]
    return r


def npz_batches(folder, n=10, batch=4, seq=12, seed=0):
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        ids = rng.integers(5, 120, size=(batch, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[0, seq // 2:] = 0
        np.savez(folder / f"b{i:03d}.npz", input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("int8")
    # large initial weights give the activation outliers that make INT8 lossy, as in real checkpoints
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", d / "ckpt", initializer_range=1.0)
    return ckpt, npz_batches(d / "calib", n=80), d  # every 5th batch held out: 64 samples, the gate's minimum


TINY_PROFILE = ("--batch", "1,4,4", "--seq", "8,12,16")


@needs_trt
def test_fallback_keeps_sensitive_layers_in_fp16(tiny, tmp_path):
    ckpt, calib, _ = tiny
    r = build("--model", str(ckpt), "--int8", "--int8-mode", "w8a8", "--calib", str(calib), *TINY_PROFILE,
              "--min-cosine", "0.9995", "--min-cosine-each", "0.995", "--out", str(tmp_path / "out"),
              "--calib-cache", str(tmp_path / "c.cache"))
    assert "measuring per-layer sensitivity" in r.stderr and "most sensitive" in r.stderr
    rec = json.loads((tmp_path / "out" / "ckpt.int8.onnx.json").read_text())
    gemms = rec["quantization"]["int8_gemms"]
    assert rec["quantization"]["mode"] == "w8a8" and gemms["fp16_fallback"]
    assert 0 < gemms["int8"] == gemms["total"] - len(gemms["fp16_fallback"])
    assert len(rec["accuracy"]["gate"]["table"]) >= 2 and rec["accuracy"]["gate"]["table"][-1][2] is True
    assert rec["accuracy"]["onnx_vs_fp32"]["mean_cosine"] >= 0.9995
    assert rec["accuracy"]["onnx_vs_fp32"]["measured_on"] == {"artifact": "ckpt.int8.onnx",
                                                              "backend": "onnxruntime CPU"}
    assert rec["accuracy"]["gate"]["table"][0][2] is False  # all-INT8 missed the gate first
    m = manifest.read_engine_manifest(tmp_path / "out" / "ckpt.int8.manifest.json")
    assert m["precision"] == "int8" and (tmp_path / "out" / m["engine"]["file"]).is_file()
    assert m["quantization"]["int8_gemms"] == gemms  # the count travels with the engine
    assert f"INT8 GEMMs: {gemms['int8']} of {gemms['total']}" in r.stderr
    assert "unverified on a GPU" in r.stderr  # w8a8 asked for by name warns
    scales = calibrate.read_cache(tmp_path / "c.cache")
    assert scales and all(v > 0 for v in scales.values())
    assert (tmp_path / "c.cache").read_text().startswith("TRT-")


@needs_trt
def test_gate_that_only_fp16_passes_fails_unless_allowed(tiny, tmp_path):
    """A gate so strict that the fallback puts every GEMM back in FP16: the "INT8" engine would be an
    FP16 engine, so build exits 1 with the table; --allow-no-int8 accepts it, loudly, and says so."""
    ckpt, calib, _ = tiny
    args = ("--model", str(ckpt), "--int8", "--int8-mode", "w8a8", "--calib", str(calib), *TINY_PROFILE,
            "--min-cosine", "0.99995", "--min-cosine-each", "0.9998", "--out", str(tmp_path / "out"),
            "--calib-cache", str(tmp_path / "c.cache"))
    r = build(*args, expect=1)
    assert "trt-seer: error: no GEMM remains INT8 (0 of " in r.stderr and "most sensitive" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "ckpt.int8.onnx").exists() and not (tmp_path / "out" / "ckpt.int8.engine").exists()

    r = build(*args, "--allow-no-int8")
    assert "warning: no GEMM remains INT8" in r.stderr and "kept because of --allow-no-int8" in r.stderr
    gemms = json.loads((tmp_path / "out" / "ckpt.int8.onnx.json").read_text())["quantization"]["int8_gemms"]
    assert gemms["int8"] == 0 and gemms["total"] == len(gemms["fp16_fallback"]) > 0
    m = manifest.read_engine_manifest(tmp_path / "out" / "ckpt.int8.manifest.json")
    assert m["quantization"]["int8_gemms"] == gemms
    r = build(*args, expect=1)  # the accepted artifact is up to date, but still refused without the flag
    assert "int8 ONNX up to date" in r.stderr and "no GEMM remains INT8" in r.stderr


@needs_trt
def test_impossible_gate_exits_1_with_a_table(tiny, tmp_path):
    ckpt, calib, _ = tiny
    r = build("--model", str(ckpt), "--int8", "--calib", str(calib), *TINY_PROFILE, "--min-cosine", "1.5",
              "--out", str(tmp_path), "--calib-cache", str(tmp_path / "c.cache"), expect=1)
    assert "cannot pass the accuracy gate" in r.stderr and "mean_cosine" in r.stderr
    assert not (tmp_path / "ckpt.int8.onnx").exists() and not (tmp_path / "ckpt.int8.engine").exists()


@needs_trt
def test_seed_cache_for_other_tensors_is_refused(tiny, tmp_path):
    ckpt, calib, _ = tiny
    cache = tmp_path / "other.cache"
    calibrate.write_cache(cache, {"some_other_tensor": 0.1}, "100100")
    r = build("--model", str(ckpt), "--int8", "--int8-mode", "w8a8", "--calib", str(calib), *TINY_PROFILE,
              "--from-cache", str(cache), "--out", str(tmp_path / "out"), expect=2)
    last = r.stderr.strip().splitlines()[-1]  # progress lines of the finished stages come first
    assert last.startswith("trt-seer: error:") and "is for other tensors" in last and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "ckpt.int8.onnx").exists()


def test_seed_cache_is_refused_for_weight_only_int8(tiny, tmp_path):
    ckpt, calib, _ = tiny
    cache = tmp_path / "seed.cache"
    calibrate.write_cache(cache, {"x": 0.1}, "100100")
    r = build("--model", str(ckpt), "--int8", "--calib", str(calib), *TINY_PROFILE, "--from-cache", str(cache),
              "--out", str(tmp_path / "out"), expect=2)
    assert r.stderr.strip().splitlines()[-1].startswith("trt-seer: error: --from-cache seeds activation ranges")
    assert not (tmp_path / "out").exists()  # refused before any work


def test_auto_mode_is_weight_only_everywhere():
    from types import SimpleNamespace

    assert int8.resolve_mode(SimpleNamespace(int8_mode="auto")) == "weight-only"
    assert int8.resolve_mode(SimpleNamespace(int8_mode="w8a8")) == "w8a8"


def test_no_int8_gemm_left_fails_unless_allowed(caplog, monkeypatch):
    # an in-process CLI run earlier in the session stops trt_seer's logger propagating to caplog
    monkeypatch.setattr(logging.getLogger("trt_seer"), "propagate", True)
    some = int8.gemm_counts(12, {"b", "a"})
    assert some == {"int8": 10, "total": 12, "fp16_fallback": ["a", "b"]}
    int8.check_int8_left(some, allow_no_int8=False)  # some INT8 left: nothing to say
    none = int8.gemm_counts(2, {"a", "b"})
    with pytest.raises(AccuracyGateError, match=r"no GEMM remains INT8 \(0 of 2; 2 put back in FP16.*--allow-no-int8") as e:
        int8.check_int8_left(none, allow_no_int8=False, table="  gate table")
    assert e.value.exit_code == 1 and "\n" not in str(e.value)  # one line; the table was logged above it
    assert str(e.value).endswith("the table above has every attempt")
    with pytest.raises(AccuracyGateError, match=r"0 of 0"):  # a graph with no GEMM to quantize at all
        int8.check_int8_left(int8.gemm_counts(0, ()), allow_no_int8=False)
    with caplog.at_level("WARNING"):
        int8.check_int8_left(none, allow_no_int8=True)
    assert "no GEMM remains INT8" in caplog.text and "kept because of --allow-no-int8" in caplog.text


def bad(tmp_path, calib_args, needle):
    r = build("--int8", *calib_args, "--out", str(tmp_path / "out"), cwd=tmp_path, expect=2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "calib").exists()


def test_missing_calibration_data(tmp_path):
    bad(tmp_path, ["--calib", str(tmp_path / "nope.txt")], "calibration data not found")


def test_empty_calibration_data(tmp_path):
    (tmp_path / "e.txt").write_text("\n\n")
    bad(tmp_path, ["--calib", str(tmp_path / "e.txt")], "is empty")


def test_undecodable_calibration_data(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe\x00binary\x80\x81")
    bad(tmp_path, ["--calib", str(tmp_path / "b.txt")], "is not UTF-8 text")


def test_missing_text_field(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"sentence": "hello"}\n')
    bad(tmp_path, ["--calib", str(tmp_path / "d.jsonl")], "no field 'text'")


def test_fewer_samples_than_a_batch(tmp_path):
    """Only W8A8 calibrates (weight-only INT8, the default, reads no calibration batch)."""
    (tmp_path / "s.txt").write_text("one\ntwo\nthree\n")
    bad(tmp_path, ["--calib", str(tmp_path / "s.txt"), "--calib-batch", "8", "--int8-mode", "w8a8"],
        "has 3 calibration samples (after the held-out split), fewer than one batch (8)")


def test_malformed_seed_cache(tmp_path):
    (tmp_path / "c.cache").write_text("not a cache\n")
    bad(tmp_path, ["--from-cache", str(tmp_path / "c.cache")], "c.cache")


@needs_trt
@pytest.mark.slow
def test_default_model_int8_passes_the_gate(tmp_path):
    r = build("--int8", "--out", str(tmp_path / "engines"), cwd=tmp_path)
    name = "all-MiniLM-L6-v2"
    rec = json.loads((tmp_path / "engines" / f"{name}.int8.onnx.json").read_text())
    acc = rec["accuracy"]["onnx_vs_fp32"]
    assert rec["accuracy"]["gate"]["passed"] and acc["mean_cosine"] >= 0.99 and acc["min_cosine"] >= 0.97
    assert acc["samples"] >= 100
    # weight-only INT8 (the default) keeps no activation range: nothing is calibrated, no cache written
    assert rec["calibration"]["cache"] is None and rec["calibration"]["method"].startswith("none")
    assert not (tmp_path / "engines" / "calib").exists()
    assert not (tmp_path / "calib").exists()
    m = manifest.read_engine_manifest(tmp_path / "engines" / f"{name}.int8.manifest.json")
    assert m["accuracy_of_source_graph"]["onnx_vs_fp32"] == acc and m["precision"] == "int8"
    assert acc["measured_on"] == {"artifact": f"{name}.int8.onnx", "backend": "onnxruntime CPU"}
    assert (tmp_path / "engines" / f"{name}.fp16.engine").exists()  # the baseline INT8 is judged by
    assert not (tmp_path / "engines" / f"{name}.fp32.engine").exists()
    # weight-only Q/DQ go into the FP16 graph's fused form (export/engine_form.py), and the record says so
    ops = {n.op_type for n in onnx.load(str(tmp_path / "engines" / f"{name}.int8.onnx")).graph.node}
    assert {"Attention", "DequantizeLinear"} <= ops and "Softmax" not in ops
    assert rec["graph_form"]["attention"] == m["graph_form"]["attention"] != "decomposed"
    assert "INT8 accuracy vs FP32" in r.stderr
    cpu = rec["cpu"]  # the CPU backend's own INT8 graph, gated the same way
    assert cpu["file"] == f"{name}.int8.cpu.onnx" and (tmp_path / "engines" / cpu["file"]).is_file()
    assert cpu["accuracy"]["mean_cosine"] >= 0.99 and cpu["accuracy"]["min_cosine"] >= 0.97
    assert cpu["source_graph"] == f"{name}.fp32.cpu.onnx"  # quantized from the fused graph
    fused = json.loads((tmp_path / "engines" / f"{name}.fp32.cpu.onnx.json").read_text())
    assert fused["fused_ops"] == {"Attention": 6, "BiasGelu": 6, "SkipLayerNormalization": 12}
    cpu_record = json.loads((tmp_path / "engines" / f"{cpu['file']}.json").read_text())
    assert cpu_record["source"] == rec["source"] and cpu_record["sha256"] == cpu["sha256"]
    run = subprocess.run([sys.executable, "-m", "trt_seer", "run", str(tmp_path / "engines" / cpu["file"]),
                          "--text", "hello world", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["results"][0]["embedding"]) == 384


# --- held-out samples for the gate: a minimum, else the shipped corpus ----------------------------

@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory):
    from test_finetune import FILLER, save_tokenizer

    d = tmp_path_factory.mktemp("heldout")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", d / "ckpt")
    save_tokenizer(ckpt)

    def texts(n):
        path = d / f"calib{n}.txt"
        path.write_text("".join(f"{FILLER[i % 24]} {FILLER[(7 * i) % 24]} {FILLER[(3 * i) % 24]}\n" for i in range(n)))
        return path
    return ckpt, texts


@pytest.mark.parametrize("lines", [3, 50])
def test_too_few_heldout_samples_fall_back_to_the_shipped_corpus(with_tokenizer, lines, caplog):
    from trt_seer.export.families import ShapeProfile, resolve_model
    from trt_seer.quantize.spec import QuantStageSpec

    ckpt, texts = with_tokenizer
    path = texts(lines)
    quant = QuantStageSpec(out=path.parent, calib=str(path), calib_batch=1)
    with caplog.at_level(logging.WARNING, "trt_seer"):
        cd = int8.load_calib_data(resolve_model(ckpt), quant, ShapeProfile((1, 4, 16), (8, 12, 16)), calibrates=False)
    assert cd.heldout_data == int8.SHIPPED_HELDOUT and cd.heldout_samples == int8.HELDOUT_SAMPLES
    assert cd.calib == []  # weight-only: nothing calibrates, so nothing is tokenized for it
    assert (f"{path} gives {lines // int8.HELDOUT_EVERY} held-out sample" in caplog.text
            and f"fewer than the {int8.MIN_HELDOUT_SAMPLES}" in caplog.text)


def test_enough_heldout_samples_of_the_users_file_are_used(with_tokenizer, caplog):
    from trt_seer.export.families import ShapeProfile, resolve_model
    from trt_seer.quantize.spec import QuantStageSpec

    ckpt, texts = with_tokenizer
    path = texts(int8.MIN_HELDOUT_SAMPLES * int8.HELDOUT_EVERY)
    quant = QuantStageSpec(out=path.parent, calib=str(path), calib_batch=4, int8_mode="w8a8")
    with caplog.at_level(logging.WARNING, "trt_seer"):
        cd = int8.load_calib_data(resolve_model(ckpt), quant, ShapeProfile((1, 4, 16), (8, 12, 16)))
    assert cd.heldout_data == str(path) and cd.heldout_samples == int8.MIN_HELDOUT_SAMPLES
    assert cd.calib and "held-out sample" not in caplog.text


@needs_trt
@pytest.mark.slow
def test_three_line_calibration_file_builds_and_records_the_heldout_count(with_tokenizer, tmp_path):
    ckpt, texts = with_tokenizer
    r = build("--model", str(ckpt), "--int8", "--calib", str(texts(3)), "--calib-batch", "1", *TINY_PROFILE,
              "--out", str(tmp_path / "out"))
    gate = json.loads((tmp_path / "out" / "ckpt.int8.onnx.json").read_text())["accuracy"]["gate"]
    assert gate["heldout"] == {"samples": int8.HELDOUT_SAMPLES, "data": int8.SHIPPED_HELDOUT,
                               "minimum": int8.MIN_HELDOUT_SAMPLES}
    assert f"INT8 accuracy vs FP32 on {int8.HELDOUT_SAMPLES} held-out samples ({int8.SHIPPED_HELDOUT})" in r.stderr
    assert "gives 0 held-out samples, fewer than" in r.stderr and "calibration samples" not in r.stderr
    assert "symbolic shape inference" not in r.stderr and "Int64 binding" not in r.stderr  # at DEBUG (-v)
