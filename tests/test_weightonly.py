"""Weight-only INT8/INT4 for causal LMs: Q/DQ placement, INT4 packing, AWQ, the decoder gate with
its fallback, and the engines `build --int8 --int4` writes."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiny import VOCAB, make_tiny_checkpoint
from trt_seer import pipeline
from trt_seer.engine import manifest, trt
from trt_seer.export import onnxio
from trt_seer.export.families import resolve_model
from trt_seer.quantize import awq
from trt_seer.quantize import weightonly as wo

needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
PROFILE = ("--batch", "1,2,4", "--seq", "8,16,32")
WIDE = {"hidden_size": 128, "intermediate_size": 256}  # K = 128 / 256: whole INT4 blocks


def build(*args, expect=0):
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", *args], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == expect, r.stderr[-3000:]
    return r


def npz_batches(folder, n=10, batch=4, seq=32):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        ids = rng.integers(3, 128, size=(batch, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[0, seq * 2 // 3:] = 0
        np.savez(folder / f"b{i:03d}.npz", input_ids=ids, attention_mask=mask)
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One `build --int8 --int4` of a tiny Llama; INT4 with a gate its all-INT4 graph misses."""
    d = tmp_path_factory.mktemp("wo")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", d / "llama", **WIDE)
    calib = npz_batches(d / "calib")
    r = build("--model", str(ckpt), "--int8", "--int4", "--calib", str(calib), *PROFILE,
              "--min-agreement", "0.85", "--keep-intermediates", "--out", str(d / "out"))
    return d / "out", ckpt, calib, r


def record(out, precision):
    return json.loads((out / f"llama.{precision}.onnx.json").read_text())


def gemms(model):
    """{GEMM node name: (weight producer op, weight type)} for GEMMs whose input 1 is constant."""
    inits = {t.name: t.data_type for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Gemm"):
            w = n.input[1]
            if w in inits:
                out[n.name] = ("initializer", inits[w])
            elif w in producer and producer[w].op_type == "DequantizeLinear":
                out[n.name] = ("DequantizeLinear", inits[producer[w].input[0]])
    return out


def test_int8_placement_every_constant_gemm_but_the_lm_head(built):
    out = built[0]
    fp16, q = onnxio.load(out / "llama.fp16.onnx"), onnxio.load(out / "llama.int8.onnx")
    before, after = gemms(fp16), gemms(q)
    head = wo.lm_head(fp16)
    assert set(before) == set(after) and len(before) == 2 * 7 + 1  # q k v o up gate down per layer + head
    assert after[head] == ("initializer", TensorProto.FLOAT16)
    assert all(after[n] == ("DequantizeLinear", TensorProto.INT8) for n in before if n != head)
    dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
    assert {a.i for n in dqs for a in n.attribute if a.name == "axis"} == {1}
    # per-channel INT8 with FP16 scales needs opset 19, as the encoder INT8 graphs: not INT4's 21
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) == 19 and q.ir_version == fp16.ir_version
    acts = [n for n in q.graph.node if n.op_type == "MatMul" and n.name not in before]
    assert acts and all(x not in {d.output[0] for d in dqs} for n in acts for x in n.input)  # attention untouched
    rec = record(out, "int8")
    assert rec["quantization"]["bits"] == 8 and rec["quantization"]["lm_head_fp16"] == head
    assert rec["decoder"]["kv_dtype"] == "float16" and rec["io"] == record(out, "fp16")["io"]


def test_int4_blocks_opset_and_lm_head_flag(built):
    out = built[0]
    fp16 = onnxio.load(out / "llama.fp16.onnx")
    model = onnxio.load(out / "llama.fp16.onnx")
    spec = wo.WeightOnlySpec(4, 64, lm_head=True)
    wo.weight_only_model(model, wo.find_targets(model, spec), spec)
    onnx.checker.check_model(model)
    assert all(t == ("DequantizeLinear", TensorProto.INT4) for t in gemms(model).values())  # head included
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 21
    assert model.ir_version >= 10
    for n in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        attrs = {a.name: a.i for a in n.attribute}
        scale = next(t for t in model.graph.initializer if t.name == n.input[1])
        weight = next(t for t in model.graph.initializer if t.name == n.input[0])
        assert attrs == {"axis": 0, "block_size": 64} and scale.data_type == TensorProto.FLOAT16
        assert list(scale.dims) == [weight.dims[0] // 64, weight.dims[1]]
    # K = 128 is not a multiple of 256: those GEMMs stay FP16, only down_proj (K = 256) is INT4
    wide = wo.WeightOnlySpec(4, 256)
    kept = wo.unfit_int4(fp16, wide)
    assert [t.k for t in wo.find_targets(fp16, wide)] == [256, 256] and len(kept) == 12


def test_gpt2_conv1d_gemms_are_quantized(tmp_path):
    ckpt = make_tiny_checkpoint("gpt2", "causal-lm", tmp_path / "gpt2")
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(tmp_path, info.name)
    pipeline.fp16_onnx(info, art, pipeline.fp32_onnx(info, art))
    model = onnxio.load(art.path("fp16.onnx"))
    targets = wo.find_targets(model, wo.WeightOnlySpec(8))
    ops = {n.name: n.op_type for n in model.graph.node}
    assert len(targets) == 2 * 4 and {ops[t.node] for t in targets} == {"Gemm"}  # c_attn c_proj c_fc mlp.c_proj
    wo.weight_only_model(model, targets, wo.WeightOnlySpec(8))
    assert all(gemms(model)[t.node] == ("DequantizeLinear", TensorProto.INT8) for t in targets)


def test_int4_packing_round_trip_within_half_a_step():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 24)) * np.linspace(0.1, 3, 24)).astype(np.float32)
    q, scale = wo.quantize_int4(w, 64)
    assert q.min() >= -8 and q.max() <= 7 and scale.shape == (4, 24)
    t = helper.make_tensor("q", TensorProto.INT4, list(q.shape), q.ravel().astype(np.int32))
    assert len(t.int32_data) == q.size // 2  # two values a byte
    np.testing.assert_array_equal(numpy_helper.to_array(t).astype(np.int8), q)
    deq = wo.dequantize(q, scale, 64)
    assert np.all(np.abs(deq - w) <= np.repeat(scale, 64, axis=0) / 2 + 1e-6)
    # ONNX Runtime's DequantizeLinear (opset 21, block_size) computes the same weight
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=64)],
                              "dq", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 24])],
                              [t, numpy_helper.from_array(scale, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    import onnxruntime as ort

    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_allclose(got, deq, rtol=1e-6)


def test_awq_is_never_worse_than_rtn_and_helps_outlier_channels():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((512, 128)).astype(np.float32)
    x[:, :4] *= 30  # a few salient input channels, as in real LLM activations
    stats = awq.ActStats(np.abs(x).mean(axis=0), x)
    weights = [rng.standard_normal((128, 64)).astype(np.float32) * 0.05 for _ in range(2)]
    c = awq.search(stats, weights, wo.WeightOnlySpec(4, 64))
    assert c.alpha > 0 and c.error < 0.8 * c.rtn_error
    flat = awq.ActStats(np.ones(128, np.float32), rng.standard_normal((256, 128)).astype(np.float32))
    c0 = awq.search(flat, weights, wo.WeightOnlySpec(4, 64))  # nothing salient: s = 1, plain RTN
    assert c0.error <= c0.rtn_error and np.allclose(c0.s, 1.0)


def test_awq_scales_on_the_calibration_data_and_in_the_graph(built):
    out = built[0]
    report = record(out, "int4")["quantization"]["awq"]
    assert len(report) == 8  # activations: qkv, o, up/gate, down per layer
    assert all(r["rel_error"] <= r["rtn_rel_error"] for r in report)
    assert any(r["alpha"] > 0 and r["rel_error"] < r["rtn_rel_error"] for r in report)
    model = onnxio.load(out / "llama.int4.onnx")
    names = {t.name for t in model.graph.initializer}
    assert any(n.endswith("__awq_folded") for n in names) or any(n.endswith("__awq_inv") for n in names)


def test_gate_passes_int8_and_falls_back_for_int4(built):
    out, *_, r = built
    i8, i4 = record(out, "int8"), record(out, "int4")
    assert i8["accuracy"]["gate"]["passed"] and i8["quantization"]["fp16_gemms"] == []
    assert i8["accuracy"]["onnx_vs_fp16"]["ppl_increase"] <= 0.01
    table = i4["accuracy"]["gate"]["table"]
    assert table[0][2] is False and table[-1][2] is True and len(table) >= 2  # all-INT4 missed, fallback passed
    assert i4["quantization"]["fp16_gemms"] and i4["accuracy"]["onnx_vs_fp16"]["agreement"] >= 0.85
    assert "INT4 misses the gate" in r.stderr and "most sensitive" in r.stderr
    assert "through the KV cache" in i4["accuracy"]["measured_on"]


@needs_trt
def test_engines_and_manifests_record_the_quantization(built):
    out = built[0]
    for precision in ("fp16", "int8", "int4"):
        m = manifest.read_engine_manifest(out / f"llama.{precision}.manifest.json")
        assert m["precision"] == precision and (out / m["engine"]["file"]).stat().st_size > 0
        assert any(i["name"].startswith("past_key_values.") for i in m["io"]["inputs"])
    m4 = manifest.read_engine_manifest(out / "llama.int4.manifest.json")
    q = m4["quantization"]
    assert q["bits"] == 4 and q["block_size"] == 128 and q["fp16_gemms"] == record(out, "int4")["quantization"]["fp16_gemms"]
    assert m4["accuracy_of_source_graph"]["measured_on"].startswith("ONNX Runtime") and m4["accuracy_of_source_graph"]["gate"]["passed"]
    assert manifest.read_engine_manifest(out / "llama.int8.manifest.json")["quantization"]["bits"] == 8


def test_impossible_gate_exits_1_with_the_table(built, tmp_path):
    out, ckpt, calib, _ = built
    for f in ("fp32.onnx", "fp32.onnx.json", "fp16.onnx", "fp16.onnx.json"):
        shutil.copy(out / f"llama.{f}", tmp_path / f"llama.{f}")  # stages up to date: no re-export
    r = build("--model", str(ckpt), "--int4", "--calib", str(calib), *PROFILE, "--min-agreement", "1.5",
              "--out", str(tmp_path), expect=1)
    assert "INT4 cannot pass the accuracy gate" in r.stderr and "ppl_increase" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "llama.int4.onnx").exists() and not (tmp_path / "llama.int4.engine").exists()


def test_int4_needs_a_causal_lm(tmp_path):
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "bert")
    r = build("--model", str(ckpt), "--int4", *PROFILE, "--out", str(tmp_path / "out"), expect=2)
    assert "--int4 is weight-only quantization for decoding" in r.stderr and not (tmp_path / "out").exists()


def test_awq_rewrite_is_exact_up_to_rounding(built):
    """Scaled weights with 1/s folded into the norms (q/k/v, gate/up) or a Mul (o, down) compute
    what the unscaled INT8 graph does: the scales only move rounding error around."""
    import onnxruntime as ort

    from trt_seer.eval.teacher import prefill_feeds

    out = built[0]
    rng = np.random.default_rng(0)
    graphs = []
    for scaled in (False, True):
        model = onnxio.load(out / "llama.fp16.onnx")
        spec = wo.WeightOnlySpec(8)
        targets = wo.find_targets(model, spec)
        scales = {t.activation: rng.uniform(0.5, 2.0, t.k).astype(np.float32) for t in targets} if scaled else {}
        wo.weight_only_model(model, targets, spec, scales)
        graphs.append(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
    kinds = {n.op_type for n in model.graph.node if n.name.endswith("_awq")}
    folded = [t for t in model.graph.initializer if t.name.endswith("__awq_folded")]
    assert kinds == {"Mul"} and len(folded) == 4  # o/down get a Mul; 2 norms per layer take the fold
    ids = rng.integers(3, 128, size=(2, 12), dtype=np.int64)
    feeds = prefill_feeds(graphs[0].get_inputs(), {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    plain, scaled = (g.run(["logits"], feeds)[0] for g in graphs)
    ref = onnxruntime_logits(out / "llama.fp16.onnx", feeds)
    assert np.abs(scaled - ref).max() < 3 * np.abs(plain - ref).max() + 1e-3


def onnxruntime_logits(path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]


def test_teacher_forcing_through_the_cache_matches_pytorch(built):
    """The gate's logits: one token per step through the KV cache = PyTorch's full-sequence logits."""
    import torch
    import transformers

    from trt_seer.eval.teacher import lm_metrics, teacher_forced_logits

    out, ckpt, *_ = built
    rows = np.random.default_rng(3).integers(3, 128, size=(3, 10), dtype=np.int64)
    got = teacher_forced_logits(out / "llama.fp32.onnx", rows, batch=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = model(input_ids=torch.from_numpy(rows)).logits[:, :-1].numpy()
    assert got.shape == ref.shape == (3, 9, 128)
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-3)
    m = lm_metrics(ref, got, rows)
    assert m["agreement"] == 1.0 and abs(m["ppl_increase"]) < 1e-4 and m["samples"] == 27


def test_cpu_forms_use_matmulnbits_and_stand_in_for_the_engines(built):
    """Beside each weight-only graph, build writes ONNX Runtime's MatMulNBits form (LM head FP32),
    gated against the FP32 graph; an engine's CPU fallback and `generate` on it run that form."""
    from trt_seer.runtime import onnx_sibling
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    out = built[0]
    for bits in (8, 4):
        path = out / f"llama.int{bits}.cpu.onnx"
        if not path.is_file():  # a form that misses its gate is not written, and says so in the log
            pytest.fail(f"{path.name} was not written")
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
        rec = record(out, f"int{bits}.cpu")
        assert ops.count("MatMulNBits") == rec["quantization"]["matmulnbits"] > 0 and "DequantizeLinear" not in ops
        assert rec["quantization"]["lm_head_fp32"] in {n.name for n in onnx.load(str(path)).graph.node}
        acc = rec["accuracy"]["onnx_vs_fp32"]
        assert acc["measured_on"] == {"artifact": path.name, "backend": "onnxruntime CPU"} and rec["accuracy"]["gate"]["passed"]
        assert onnx_sibling(out / f"llama.int{bits}.engine") == path
        step = OrtDecoderStep(path)
        step.reset(2)
        ids = np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int64)
        logits = step.step(ids, np.ones_like(ids), np.broadcast_to(np.arange(3), (2, 3)).copy())
        assert logits.shape == (2, VOCAB) and np.isfinite(logits).all()


def test_build_says_what_weight_only_engines_buy(built):
    out, r = built[0], built[3]
    size = {p: manifest.read_engine_manifest(out / f"llama.{p}.manifest.json")["engine"]["size_bytes"]
            for p in ("fp16", "int8", "int4")}
    line = next(x for x in r.stderr.splitlines() if "engine size vs FP16" in x)
    assert f"INT8 {size['int8'] / size['fp16']:.2f}x" in line and f"INT4 {size['int4'] / size['fp16']:.2f}x" in line
    assert "whether they also decode faster depends on the GPU" in r.stderr  # no one machine's figure


@pytest.mark.parametrize("bits", [8, 4])
def test_the_fast_quantizer_gives_the_reference_values(bits):
    """weightonly.quantize (PyTorch, every core or the GPU) equals the numpy reference bit for bit,
    on float16 and float32 weights, zero columns and values halfway between two levels included."""
    from trt_seer.quantize.weightonly import quantize, quantize_int4, quantize_int8

    rng = np.random.default_rng(bits)
    w = (rng.standard_normal((256, 96)) * 0.02).astype(np.float32)
    w[:, 5] = 0.0
    w[:128, 7] = np.linspace(-7, 7, 128) / 7 * 0.5  # amax 0.5: level steps land on halves
    w[:, 9] = np.tile([0.5, -0.25, 0.75, 1.0], 64)
    for a in (w, w.astype(np.float16)):
        want = quantize_int8(a.astype(np.float32)) if bits == 8 else quantize_int4(a.astype(np.float32), 128)
        got = quantize(a, bits, 128)
        assert got[0].dtype == np.int8 and got[1].dtype == np.float32
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("shape", [(128, 6), (3, 5)])
def test_int4_weights_are_packed_two_per_byte_in_raw_data(shape):
    """INT4 initializers hold packed raw bytes (external data can take them; a 7B model's INT4
    weights as int32_data would pass protobuf's 2 GB limit) and read back to the same values."""
    q = np.random.default_rng(0).integers(-8, 8, size=shape).astype(np.int8)
    t = wo.int4_tensor(q, "w")
    assert t.data_type == TensorProto.INT4 and len(t.raw_data) == (q.size + 1) // 2 and not t.int32_data
    assert np.array_equal(numpy_helper.to_array(t).astype(np.int8), q)


def test_awq_statistics_from_pytorch_hooks_equal_the_graphs(built):
    """AWQ's statistics taken with PyTorch on the checkpoint's Linear layers (what runs on a GPU)
    are ONNX Runtime's on the FP16 graph: the same GEMM inputs, found through the export's weight
    map, the same unpadded tokens, mean |x| per channel to FP16 rounding. Run here on the CPU."""
    from trt_seer.quantize import awq_torch, decoder_stage

    out, ckpt, calib, _ = built
    graph = out / "llama.fp16.onnx"
    targets = wo.find_targets(onnxio.load(graph, False), wo.WeightOnlySpec(bits=4, block_size=32))
    modules = awq_torch.target_modules(targets, record(out, "fp16")["weights_from_checkpoint"])
    assert modules is not None and len(modules) == len(targets) == 2 * 7
    assert all(name.startswith("model.layers.") for name in modules)
    batches = [dict(np.load(f)) for f in sorted(calib.glob("*.npz"))[:3]]
    want = decoder_stage.awq_statistics(graph, targets, decoder_stage.prefill_batches(graph, batches))
    got = awq_torch.activation_stats(resolve_model(ckpt), batches, modules, "cpu")
    assert set(got) == set(want) == {t.activation for t in targets}
    for x in want:
        assert got[x].sample.shape == want[x].sample.shape
        scale = float(np.max(want[x].mean_abs))
        assert np.max(np.abs(got[x].mean_abs - want[x].mean_abs)) <= 2e-2 * scale, x


def test_awq_search_with_pytorch_picks_what_numpy_picks():
    """awq_torch.search (the GPU's) chooses the alpha awq.search chooses, with the same errors."""
    from trt_seer.quantize import awq_torch

    rng = np.random.default_rng(3)
    k = 256
    mean_abs = np.exp(rng.normal(0, 1.5, k)).astype(np.float32)  # a few salient channels
    x = (rng.standard_normal((96, k)) * mean_abs).astype(np.float32)
    weights = [(rng.standard_normal((k, n)) * 0.02).astype(np.float32) for n in (64, 32)]
    stats = awq.ActStats(mean_abs, x)
    spec = wo.WeightOnlySpec(bits=4, block_size=128)
    want, got = awq.search(stats, weights, spec), awq_torch.search(stats, weights, spec, "cpu")
    assert got.alpha == want.alpha and want.alpha > 0
    assert np.array_equal(got.s, want.s)
    assert np.isclose(got.error, want.error, rtol=1e-3) and np.isclose(got.rtn_error, want.rtn_error, rtol=1e-3)


def test_a_streaming_build_takes_awq_statistics_from_pytorch_where_it_has_a_device(tmp_path, monkeypatch):
    """The build's GPU path for AWQ (PyTorch statistics from the checkpoint, PyTorch scale search),
    with the device it would pick made the CPU: it runs without the FP16 graph's weights being read
    back, ONNX Runtime's statistics are not taken, and the INT4 graph carries the AWQ report."""
    from trt_seer import cli
    from trt_seer.quantize import awq_torch, decoder_stage

    monkeypatch.setattr(awq_torch, "gpu", lambda: "cpu")
    devices, real = [], awq_torch.activation_stats
    monkeypatch.setattr(awq_torch, "activation_stats", lambda *a, **k: devices.append(a[3]) or real(*a, **k))
    monkeypatch.setattr(decoder_stage, "awq_statistics", lambda *a: pytest.fail("ONNX Runtime's AWQ statistics ran"))
    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama", **WIDE)
    calib = npz_batches(tmp_path / "calib")
    out = tmp_path / "out"
    assert cli.main(["build", "--model", str(ckpt), "--int4", "--no-keep-intermediates", "--int4-block", "32", "--calib", str(calib),
                     *PROFILE, "--min-agreement", "0", "--max-ppl-increase", "10", "--out", str(out)]) == 0
    assert devices == ["cpu"]
    report = record(out, "int4")["quantization"]["awq"]
    assert len(report) == 8 and any(r["alpha"] > 0 for r in report)  # qkv, o, up/gate, down per layer
    assert record(out, "fp16")["removed"] and not (out / "llama.fp16.onnx").exists()


def test_awq_statistics_on_the_cpu_take_as_many_batches_as_the_time_bound_allows(caplog):
    """On the CPU, AWQ's statistics stop at a budget of tokens x quantized weights (at least one
    batch), and the log says how many batches were taken; a small model takes them all."""
    import logging

    from trt_seer.quantize import decoder_stage

    batches = [{"input_ids": np.zeros((4, 32), np.int64), "attention_mask": np.ones((4, 32), np.int64)}
               for _ in range(10)]  # 128 tokens each
    assert decoder_stage.cpu_bounded(batches, 10**6) == batches
    with caplog.at_level(logging.INFO, logger="trt_seer.quantize.decoder_stage"):
        kept = decoder_stage.cpu_bounded(batches, 6 * 10**9)  # a 7B model's GEMMs: 333 tokens
    assert kept == batches[:2]
    assert "AWQ statistics on the CPU: 2 of 10 calibration batches (256 tokens)" in caplog.text
    assert decoder_stage.cpu_bounded(batches, 10**13) == batches[:1]  # never none


def test_chunked_attention_needs_a_causal_lm(tmp_path):
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "bert")
    r = build("--model", str(ckpt), "--fp16", "--attention", "chunked", *PROFILE, "--out", str(tmp_path / "out"),
              expect=2)
    assert "--attention chunked is for causal LMs" in r.stderr and not (tmp_path / "out").exists()
    assert "Traceback" not in r.stderr
