"""The CPU forms `build` writes for ONNX Runtime: the fused FP32 graph (export/cpu.py) and the
dynamic INT8 graph on it (quantize/int8.py `_cpu_int8`), and who picks them."""
from collections import Counter

import numpy as np
import onnx
import pytest

from tiny import make_tiny_checkpoint
from trt_seer import pipeline
from trt_seer.errors import ExportMismatchError, InputError, UnsupportedError
from trt_seer.export import cpu
from trt_seer.export.checkpoint import sample_inputs
from trt_seer.export.families import resolve_model
from trt_seer.quantize import int8


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny BERT (large initial weights, so INT8 is lossy as in real checkpoints), its FP32 graph
    and its fused CPU graph."""
    d = tmp_path_factory.mktemp("cpu")
    info = resolve_model(make_tiny_checkpoint("bert", "feature-extraction", d / "ckpt", initializer_range=1.0))
    art = pipeline.Artifacts(d / "out", info.name)
    art.out.mkdir()
    fp32 = pipeline.fp32_onnx(info, art)
    return info, art, fp32, pipeline.fp32_cpu_onnx(info, art, fp32)


def test_fused_graph_fuses_and_matches_fp32(tiny_bert):
    info, art, _, record = tiny_bert
    ops = Counter(n.op_type for n in onnx.load(art.path("fp32.cpu.onnx")).graph.node)
    # counted in the written file, not taken from the report: fusion that did nothing fails here
    assert ops["Attention"] == 2 and ops["SkipLayerNormalization"] >= 2 and ops["BiasGelu"] + ops["FastGelu"] == 2
    assert "Softmax" not in ops and "Erf" not in ops and ops["MatMul"] < Counter(
        n.op_type for n in onnx.load(art.path("fp32.onnx")).graph.node)["MatMul"]
    assert record["fused_ops"] == {k: ops[k] for k in record["fused_ops"]}
    assert record["attention_mask_index"] == 2 and "Where" not in ops  # the 2-D mask, no (b, 1, s, s) bias
    for out in record["verification"]["outputs"].values():
        assert out["max_abs_diff"] <= out["allowed"] <= 1e-2
    sess_ref, sess_cpu = (pytest.importorskip("onnxruntime").InferenceSession(str(art.path(s)))
                          for s in ("fp32.onnx", "fp32.cpu.onnx"))
    feeds = sample_inputs(info, 4, 37, seed=7)  # padded rows included
    ref, got = sess_ref.run(["sentence_embedding"], feeds)[0], sess_cpu.run(["sentence_embedding"], feeds)[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    held_out = record["accuracy"]["onnx_vs_fp32"]  # held-out accuracy, named as the graph's on ONNX Runtime
    assert held_out["min_cosine"] > 0.9999 and held_out["measured_on"]["artifact"] == art.path("fp32.cpu.onnx").name


def test_fused_graph_is_cached_by_its_record(tiny_bert):
    info, art, fp32, record = tiny_bert
    stat = art.path("fp32.cpu.onnx").stat().st_mtime_ns
    assert pipeline.fp32_cpu_onnx(info, art, fp32)["sha256"] == record["sha256"]
    assert art.path("fp32.cpu.onnx").stat().st_mtime_ns == stat


def test_fused_graph_that_disagrees_is_refused_and_removed(tiny_bert, tmp_path):
    info, art, _, _ = tiny_bert
    other = resolve_model(make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "o", seed=1))
    other_art = pipeline.Artifacts(tmp_path, other.name)
    pipeline.fp32_onnx(other, other_art)
    with pytest.raises(ExportMismatchError, match="disagrees with"):
        cpu.verify_against(info, art.path("fp32.onnx"), other_art.path("fp32.onnx"))


def test_graph_without_transformer_patterns_is_unsupported(tiny_bert, tmp_path):
    info, _, _, _ = tiny_bert
    x = onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "s"])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, ["b", "s"])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["input_ids"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError, match="no ONNX Runtime fusion matched"):
        cpu.cpu_onnx_from_fp32(info, tmp_path / "m.onnx", tmp_path / "m.cpu.onnx")
    assert not (tmp_path / "m.cpu.onnx").exists()


def _calib_data(info) -> int8.CalibData:
    batches = [sample_inputs(info, 4, 12 + 4 * i, seed=50 + i) for i in range(4)]
    return int8.CalibData(batches, batches)


def test_cpu_int8_quantizes_the_fused_graph(tiny_bert):
    info, art, _, _ = tiny_bert
    cd = _calib_data(info)
    out = int8._cpu_int8(info, art, cd, int8.Gate(0.0, 0.0, 0.0))
    assert out["file"] == f"{info.name}.int8.cpu.onnx" and out["source_graph"] == f"{info.name}.fp32.cpu.onnx"
    ops = Counter(n.op_type for n in onnx.load(art.path("int8.cpu.onnx")).graph.node)
    assert ops["MatMulInteger"] == 6 and ops["QAttention"] == 2 and "MatMul" not in ops and "Attention" not in ops
    assert out["fp32_gemms"] == []
    assert 0.5 < out["accuracy"]["mean_cosine"] < 1.0  # lossy: the large-weight model's INT8 error is real


def test_cpu_int8_gate_falls_back_to_fp32_layers(tiny_bert):
    info, art, _, _ = tiny_bert
    cd = _calib_data(info)
    strict = int8.Gate(0.99999, 0.9999, 0.99)
    out = int8._cpu_int8(info, art, cd, strict)
    fused = {n.name: n.op_type for n in onnx.load(art.path("fp32.cpu.onnx")).graph.node}
    assert out["file"] and out["fp32_gemms"] and {fused.get(n) for n in out["fp32_gemms"]} <= {"MatMul", "Attention"}
    assert out["accuracy"]["mean_cosine"] >= 0.99999
    ops = Counter(n.op_type for n in onnx.load(art.path("int8.cpu.onnx")).graph.node)
    assert ops["MatMul"] + ops["Attention"] == len(out["fp32_gemms"])


def test_cpu_int8_that_cannot_pass_writes_nothing(tiny_bert):
    info, art, _, _ = tiny_bert
    out = int8._cpu_int8(info, art, _calib_data(info), int8.Gate(1.01, 1.01, 1.01))
    assert out["file"] is None and "mean cosine" in out["reason"]
    assert not art.path("int8.cpu.onnx").exists()


def test_decoders_get_no_fused_graph(tmp_path):
    info = resolve_model(make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama"))
    assert pipeline.fp32_cpu_onnx(info, pipeline.Artifacts(tmp_path, info.name), {"sha256": "x"}) is None


def test_diff_takes_the_cpu_forms(tiny_bert, capsys):
    from trt_seer.cli import main
    from trt_seer.engine import manifest

    info, art, _, _ = tiny_bert
    # against the FP32 graph: this large-weight model's plain graph misses diff's 1e-4 against PyTorch too
    assert main(["diff", str(manifest.record_path(art.path("fp32.cpu.onnx"))), "--against", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "onnxrt-fp32-cpu vs onnxrt-fp32" in out and out.rstrip().endswith("result: PASS")
    int8._cpu_int8(info, art, _calib_data(info), int8.Gate(0.0, 0.0, 0.0))
    main(["diff", str(art.path("int8.cpu.onnx")), "--samples", "32"])
    out = capsys.readouterr().out
    assert "onnxrt-int8-cpu vs onnxrt-fp32" in out and "per-layer error" in out  # profiled on the fused graph


def test_diff_plans_the_cpu_form_beside_an_engine(tmp_path):
    from trt_seer.eval import plan

    target = plan.Target(tmp_path / "m.int8.manifest.json", "engine", "m", "int8", None, {})
    assert plan._cpu_fallback_side(target) is None  # none written: nothing extra to compare
    (tmp_path / "m.int8.cpu.onnx").write_bytes(b"")
    assert plan._cpu_fallback_side(target) is None  # without its record: an interrupted build's, absent
    (tmp_path / "m.int8.cpu.onnx.json").write_text("{}")
    side = plan._cpu_fallback_side(target)
    assert (side.label, side.precision, side.path.name) == ("onnxrt-int8-cpu", "int8", "m.int8.cpu.onnx")
    (tmp_path / "m.fp32.cpu.onnx").write_bytes(b"")
    (tmp_path / "m.fp32.cpu.onnx.json").write_text("{}")
    fp16 = plan.Target(tmp_path / "m.fp16.manifest.json", "engine", "m", "fp16", None, {})
    assert plan._cpu_fallback_side(fp16).label == "onnxrt-fp32-cpu"  # what the runtime runs instead
    t = plan.resolve_target(tmp_path / "m.int8.cpu.onnx")
    assert (t.name, t.precision, t.cpu) == ("m", "int8", True)
    (tmp_path / "m.cpu.onnx").write_bytes(b"")
    with pytest.raises(InputError, match="cannot tell name and precision"):
        plan.resolve_target(tmp_path / "m.cpu.onnx")


def test_polygraphy_onnxrt_compares_the_fused_graph_with_fp32(tiny_bert, tmp_path):
    """`polygraphy run --onnxrt` reproduces the fused graph against the plain FP32 graph's outputs on
    the same inputs (ORT's contrib ops included), as a user checking the CPU form would."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    _, art, _, _ = tiny_bert
    loader = tmp_path / "data.py"
    loader.write_text("import numpy as np\n"
                      "def load_data():\n"
                      "    rng = np.random.default_rng(0)\n"
                      "    for _ in range(2):\n"
                      "        ids = rng.integers(5, 120, (2, 12)).astype(np.int64)\n"
                      "        mask = np.ones_like(ids); mask[0, 8:] = 0\n"
                      "        yield {'input_ids': ids, 'attention_mask': mask, 'token_type_ids': np.zeros_like(ids)}\n")
    ref = tmp_path / "ref.json"
    polygraphy = shutil.which("polygraphy") or str(Path(sys.executable).with_name("polygraphy"))
    run = ["--onnxrt", "--data-loader-script", str(loader)]
    r = subprocess.run([polygraphy, "run", str(art.path("fp32.onnx")), *run, "--save-outputs", str(ref)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    r = subprocess.run([polygraphy, "run", str(art.path("fp32.cpu.onnx")), *run, "--load-outputs", str(ref),
                        "--atol", "1e-4", "--rtol", "1e-4"], capture_output=True, text=True)
    assert r.returncode == 0 and "PASSED" in r.stdout + r.stderr, r.stdout[-1500:] + r.stderr[-1500:]
