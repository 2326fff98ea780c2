"""`trt-seer diff` on a tiny BERT: PyTorch / FP32 / FP16 ONNX through Polygraphy, tolerances and
exit codes, the report directory (Markdown, JSON, PNG, Polygraphy inputs/outputs that
`polygraphy run` accepts), the per-layer error profile, the verdict (passed / failed / not
verified) and the engine comparison that cannot run on CPU leaving the result not verified."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from tiny import make_tiny_checkpoint

from trt_seer import pipeline
from trt_seer.eval import diff
from trt_seer.eval import evaluate
from trt_seer.engine import manifest
from trt_seer.engine import trt
from trt_seer.cli import main
from trt_seer.errors import InputError
from trt_seer.export.families import resolve_model
from trt_seer.eval.layers import first_jumps, layer_error_profile, most_sensitive
from trt_seer.runtime import cuda

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """FP32 + FP16 ONNX with their records, made by the export pipeline from a tiny checkpoint."""
    d = tmp_path_factory.mktemp("diff")
    info = resolve_model(make_tiny_checkpoint("bert", "feature-extraction", d / "tiny-bert"))
    art = pipeline.Artifacts(d / "engines", info.name)
    art.out.mkdir()
    fp32 = pipeline.fp32_onnx(info, art)
    pipeline.fp16_onnx(info, art, fp32)
    return info, art


def record(art, precision):
    return manifest.record_path(art.path(f"{precision}.onnx"))


def run_diff(capsys, *argv):
    code = main(["diff", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *argv) -> str:
    code, _, err = run_diff(capsys, *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trt-seer: error: "), err
    return lines[0]


def test_fp32_onnx_vs_pytorch_passes(tiny, capsys):
    _, art = tiny
    code, out, _ = run_diff(capsys, record(art, "fp32"))
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("onnxrt-fp32 vs pytorch-fp32")]
    assert [r.split()[3] for r in rows] == ["last_hidden_state", "sentence_embedding"]
    assert all(r.endswith("PASS") for r in rows) and out.rstrip().endswith("result: PASS")
    assert f"ran: onnxrt-fp32 ({art.name}.fp32.onnx, onnxruntime CPU) vs pytorch-fp32 (" in out
    acc = manifest.read(record(art, "fp32"))["accuracy"]["diff_vs_pytorch"]
    assert acc["verdict"] == "passed" and acc["reference"] == "pytorch-fp32" and acc["not_run"] == []
    assert "passed" not in acc  # the verdict is the one top-level answer
    (ran,) = acc["ran"]
    assert ran["comparison"] == "onnxrt-fp32 vs pytorch-fp32" and ran["passed"] is True
    assert ran["reference"]["backend"] == "PyTorch cpu"
    assert acc["comparisons"]["onnxrt-fp32"]["measured_on"] == {"artifact": f"{art.name}.fp32.onnx",
                                                                "backend": "onnxruntime CPU"}
    emb = acc["comparisons"]["onnxrt-fp32"]["outputs"]["sentence_embedding"]
    assert 0 < emb["max_abs"] < 1e-4 and emb["mean_cosine"] > 0.99999


def test_fp16_passes_defaults_and_fails_a_tiny_tolerance(tiny, capsys):
    _, art = tiny
    code, out, _ = run_diff(capsys, record(art, "fp16"))
    assert code == 0, out
    assert "onnxrt-fp16 vs onnxrt-fp32" in out
    code, out, _ = run_diff(capsys, record(art, "fp16"), "--atol", "sentence_embedding=1e-9",
                            "--rtol", "sentence_embedding=1e-9")
    assert code == 1
    verdicts = {line.split()[3]: line.split()[-1] for line in out.splitlines() if line.startswith("onnxrt-fp16 vs")}
    assert verdicts == {"last_hidden_state": "PASS", "sentence_embedding": "FAIL"}
    assert out.rstrip().endswith("result: FAIL")
    acc = manifest.read(record(art, "fp16"))["accuracy"]["diff_vs_fp32"]
    assert acc["verdict"] == "failed"  # the latest run is what the record keeps
    assert run_diff(capsys, record(art, "fp16"), "--atol", "1e-9", "--rtol", "1e-9")[0] == 1


def test_report_contents(tiny, capsys, tmp_path):
    info, art = tiny
    out_dir = tmp_path / "report"
    before = record(art, "fp16").read_text()
    code, _, _ = run_diff(capsys, art.path("fp16.onnx"), "--samples", "48", "--layers", "--report", out_dir)
    assert code == 0
    assert record(art, "fp16").read_text() == before  # named as a bare .onnx: no record is written
    rep = json.loads((out_dir / "report.json").read_text())
    assert {"target", "task", "against", "reference", "candidates", "samples", "verdict", "ran", "not_run",
            "comparisons", "layers", "files", "reproduce"} <= set(rep)
    assert rep["samples"] == 48 and rep["verdict"] == "passed" and rep["not_run"] == []
    assert [r["candidate"]["backend"] for r in rep["ran"]] == ["onnxruntime CPU"]
    (cmp,) = rep["comparisons"]
    assert set(cmp["outputs"]) == set(info.outputs)
    assert {"max_abs", "mean_abs", "max_rel", "mean_rel", "mean_cosine", "elementwise_passed", "atol",
            "rtol"} <= set(cmp["outputs"]["sentence_embedding"])
    assert cmp["outputs"]["last_hidden_state"]["atol"] == diff.DEFAULT_TOLERANCES["fp16"].atol
    md = (out_dir / "report.md").read_text()
    assert "| comparison | output | max abs | mean abs | max rel | mean rel | cosine | task metric | result |" in md
    assert md.count("| onnxrt-fp16 vs onnxrt-fp32 |") == 2 and "**Result: PASS**" in md
    assert "## Not run\n\n- none" in md
    assert len(rep["layers"]["profile"]) > 0 and "## Per-layer error" in md


def test_report_files_load_back(tiny, capsys, tmp_path):
    from matplotlib.image import imread
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    info, art = tiny
    out_dir = tmp_path / "report"
    assert run_diff(capsys, record(art, "fp16"), "--samples", "32", "--layers", "--report", out_dir)[0] == 0
    feeds = load_json(str(out_dir / "inputs.json"))
    assert len(feeds) == 2 and list(feeds[0]) == list(info.inputs)
    results = RunResults.load(str(out_dir / "outputs.json"))
    assert [name for name, _ in results] == ["onnxrt-fp16", "onnxrt-fp32"]
    fresh = evaluate.run_batches(evaluate.session(art.path("fp32.onnx")), feeds)
    for saved, again in zip(dict(results)["onnxrt-fp32"], fresh):
        np.testing.assert_allclose(saved["sentence_embedding"], again["sentence_embedding"], rtol=1e-6, atol=1e-7)
    plots = json.loads((out_dir / "report.json").read_text())["files"]["plots"]
    assert set(plots) == {"error_hist_last_hidden_state.png", "error_hist_sentence_embedding.png", "layer_profile.png"}
    for name in plots:
        assert (out_dir / name).read_bytes()[:8] == PNG_SIGNATURE
        image = imread(out_dir / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def _reproduce_lines(md: str) -> list[str]:
    block = md.split("## Reproduce with Polygraphy", 1)[1]
    return [line for line in block.splitlines() if "polygraphy run " in line and not line.startswith("#")]


def _shell(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs a reproduce line as a user would paste it, in the report directory."""
    return subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_polygraphy_run_reproduces_fp32_comparison(tiny, capsys, tmp_path):
    _, art = tiny
    out_dir = tmp_path / "report"
    assert run_diff(capsys, record(art, "fp32"), "--samples", "32", "--report", out_dir)[0] == 0
    (cmd,) = _reproduce_lines((out_dir / "report.md").read_text())
    assert re.match(r"polygraphy run \S+fp32\.onnx --onnxrt --load-inputs inputs\.json "
                    r"--load-outputs outputs\.json", cmd)
    plain = f"polygraphy run {cmd.split()[2]} --onnxrt --load-inputs inputs.json --load-outputs outputs.json"
    for line in (cmd, plain):
        r = _shell(line, out_dir)
        assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
        assert "PASSED" in r.stdout + r.stderr


@pytest.mark.slow
def test_polygraphy_run_reproduces_fp16_comparison(tiny, capsys, tmp_path):
    _, art = tiny
    out_dir = tmp_path / "report"
    assert run_diff(capsys, record(art, "fp16"), "--samples", "32", "--report", out_dir)[0] == 0
    (cmd,) = _reproduce_lines((out_dir / "report.md").read_text())
    r = _shell(cmd, out_dir)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    strict = cmd.replace("sentence_embedding:0.01", "sentence_embedding:1e-9")  # must then fail
    r = _shell(strict, out_dir)
    assert r.returncode != 0


@pytest.mark.slow
def test_readme_polygraphy_line_is_what_the_report_writes_and_passes(tiny, capsys, tmp_path):
    """The README's `diff ... fp16.onnx.json --against fp32 --report out/`, then its `cd out/ &&
    polygraphy run ...` line, on the tiny model in the default model's place."""
    info, art = tiny
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Accuracy: `trt-seer diff`", 1)[1].split("\n## ", 1)[0].replace("\\\n", " ")
    lines = [" ".join(line.split()) for line in section.splitlines()]
    (diff_line,) = [line for line in lines if line.startswith("trt-seer diff") and "--report out/" in line]
    (poly,) = [line for line in lines if line.startswith("cd out/ && polygraphy run") and "--onnxrt" in line]
    work = tmp_path / "work"
    shutil.copytree(art.out, work / "engines")
    argv = [w.replace("engines/all-MiniLM-L6-v2", str(work / "engines" / info.name)) for w in diff_line.split()[2:]]
    assert run_diff(capsys, *[w.replace("out/", str(work / "out")) for w in argv])[0] == 0
    poly = poly.replace("all-MiniLM-L6-v2", info.name).removeprefix("cd out/ && ")
    assert poly in _reproduce_lines((work / "out" / "report.md").read_text())
    r = _shell(poly, work / "out")
    assert r.returncode == 0 and "PASSED" in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])


def test_layer_profile_fp16_vs_fp32(tiny):
    info, art = tiny
    fp32, fp16 = art.path("fp32.onnx"), art.path("fp16.onnx")
    batches = evaluate.eval_batches(info)[:2]
    profile = layer_error_profile(fp32, fp16, batches)
    # each attention is one Attention node in the FP16 graph: of its two matmuls, the one whose output
    # that node gives is compared, the scores' one is not in the FP16 graph
    in_fp16 = {o for n in onnx.load(str(fp16)).graph.node for o in n.output}
    graph_order = [n.name for n in onnx.load(str(fp32)).graph.node if n.op_type in ("MatMul", "Gemm")
                   and n.output[0] in in_fp16]
    assert len(graph_order) == 2 * (6 + 1)  # per layer 6 Linear layers and the attention's output
    assert [r["node"] for r in profile] == graph_order  # every GEMM both graphs have, in graph order
    assert all(0 < r["rel_error"] < 1e-2 for r in profile)  # FP16 rounding, not breakage
    assert all(r["added_error"] == pytest.approx(r["rel_error"] - r["received_error"]) for r in profile)
    assert profile[0]["received_error"] == 0.0
    picked = layer_error_profile(fp32, fp16, batches, nodes=graph_order[2:4])
    assert [r["node"] for r in picked] == graph_order[2:4]
    same = layer_error_profile(fp32, fp32, batches)
    assert all(r["rel_error"] == 0.0 for r in same) and first_jumps(same) == []
    with pytest.raises(InputError, match="no-such-node"):
        layer_error_profile(fp32, fp16, batches, nodes=["no-such-node"])


def test_layer_profile_finds_the_damaged_layer(tiny, tmp_path):
    """One GEMM's weights perturbed by 5%: that layer is the first jump and the most sensitive."""
    from onnx import numpy_helper

    info, art = tiny
    model = onnx.load(str(art.path("fp32.onnx")))
    inits = {t.name: t for t in model.graph.initializer}
    gemms = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    victim = gemms[len(gemms) // 2]
    w = numpy_helper.to_array(inits[victim.input[1]])
    noise = np.random.default_rng(0).standard_normal(w.shape).astype(w.dtype) * 0.05 * np.abs(w).mean()
    inits[victim.input[1]].CopyFrom(numpy_helper.from_array(w + noise, victim.input[1]))
    damaged = tmp_path / "damaged.onnx"
    onnx.save(model, str(damaged))
    profile = layer_error_profile(art.path("fp32.onnx"), damaged, evaluate.eval_batches(info)[:2])
    before = [r for r in profile if r["index"] < next(r["index"] for r in profile if r["node"] == victim.name)]
    assert all(r["rel_error"] == 0.0 for r in before)
    assert first_jumps(profile)[0]["node"] == victim.name
    assert most_sensitive(profile, 1) == [victim.name]


def test_int8_policy_gates_on_the_task_metric(tiny, capsys, tmp_path):
    """INT8 rules on an INT8-named artifact (the FP16 graph stands in for a Q/DQ graph): elementwise
    errors are reported but do not gate, the task metric gates and the layer profile is on."""
    _, art = tiny
    d = tmp_path / "engines"
    d.mkdir()
    shutil.copy(art.path("fp32.onnx"), d / f"{art.name}.fp32.onnx")
    shutil.copy(art.path("fp16.onnx"), d / f"{art.name}.int8.onnx")
    target = d / f"{art.name}.int8.onnx"
    code, out, _ = run_diff(capsys, target, "--model", resolve_model_path(art), "--report", tmp_path / "report")
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("onnxrt-int8 vs onnxrt-fp32")]
    assert "info (" in rows[0] and rows[1].endswith("PASS")
    assert "per-layer error" in out and (tmp_path / "report" / "layer_profile.png").is_file()
    assert not manifest.record_path(target).exists()  # a bare .onnx gets no record written
    # Polygraphy reproduces the verdict with its cosine check on the task output only
    (cmd,) = _reproduce_lines((tmp_path / "report" / "report.md").read_text())
    assert "--compare-func cosine_similarity --cosine-similarity-threshold last_hidden_state:-1 " \
           "sentence_embedding:0.99" in cmd
    for line, passes in ((cmd, True), (cmd.replace("sentence_embedding:0.99", "sentence_embedding:1.01"), False)):
        r = _shell(line, tmp_path / "report")
        assert (r.returncode == 0) is passes, (line, r.stdout[-2000:], r.stderr[-2000:])


def test_a_tolerance_given_for_int8_gates_it(tiny, capsys, tmp_path):
    """The README's INT8 example: `--atol sentence_embedding=1e-3`; the FP16 graph, as an INT8-named
    artifact, is over 1e-9 but within the task gate. The verdict must follow the check asked for."""
    _, art = tiny
    shutil.copy(art.path("fp32.onnx"), tmp_path / f"{art.name}.fp32.onnx")
    shutil.copy(art.path("fp16.onnx"), tmp_path / f"{art.name}.int8.onnx")
    target = tmp_path / f"{art.name}.int8.onnx"
    code, out, _ = run_diff(capsys, target, "--model", resolve_model_path(art), "--atol", "sentence_embedding=1e-9",
                            "--rtol", "sentence_embedding=1e-9", "--samples", "16")
    rows = [line for line in out.splitlines() if line.startswith("onnxrt-int8 vs onnxrt-fp32")]
    assert code == 1 and rows[1].endswith("FAIL") and "result: FAIL" in out, out
    assert rows[0].split()[-2:] != ["PASS"]  # last_hidden_state: no tolerance given, reported only
    assert diff.tolerances("int8", ["a", "b"], diff.DiffSpec(atol=(("a", 1e-3),)))["b"].gating is False


def resolve_model_path(art) -> Path:
    return Path(manifest.read(record(art, "fp32"))["source"]["checkpoint"])


def test_bad_inputs_exit_2(tiny, capsys, tmp_path):
    _, art = tiny
    assert "manifest not found" in one_line_error(capsys, tmp_path / "x.fp16.manifest.json")
    assert "unknown --against 'int4'" in one_line_error(capsys, record(art, "fp16"), "--against", "int4")
    assert "expected an engine (.engine, or its .manifest.json) or an ONNX artifact" in one_line_error(capsys, tmp_path / "model.bin")
    assert "reference itself" in one_line_error(capsys, record(art, "fp32"), "--against", "fp32")
    for bad in ("abc", "=1e-3", "x=-1", "nan"):
        assert "malformed --atol" in one_line_error(capsys, record(art, "fp16"), "--atol", bad)
    assert "unknown output 'logits'" in one_line_error(capsys, record(art, "fp16"), "--rtol", "logits=1e-3")
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(art.path("fp32.onnx"), lone / "m.fp32.onnx")
    assert "no such artifact" in one_line_error(capsys, lone / "m.fp32.onnx", "--against", "fp16")
    assert "pass --model DIR" in one_line_error(capsys, lone / "m.fp32.onnx")
    shutil.copy(art.path("fp32.onnx"), lone / "model.onnx")
    assert "cannot tell name and precision" in one_line_error(capsys, lone / "model.onnx")


def test_diff_never_replaces_a_bench_report(tiny, capsys, tmp_path):
    _, art = tiny
    theirs = tmp_path / "out"
    theirs.mkdir()
    (theirs / "report.json").write_text(json.dumps({"rows": [], "machine": {}}))
    assert "holds `trt-seer bench`'s report" in one_line_error(capsys, record(art, "fp16"), "--report", theirs)
    assert sorted(p.name for p in theirs.iterdir()) == ["report.json"]


def test_tolerance_overrides():
    spec = diff.DiffSpec(atol=(("", 1e-3), ("b", 5e-2), ("", 2e-3)), rtol=(("a", 0.5),))
    tols = diff.tolerances("fp16", ["a", "b"], spec)
    assert (tols["a"].atol, tols["a"].rtol) == (2e-3, 0.5)  # last bare atol, named rtol
    assert (tols["b"].atol, tols["b"].rtol) == (5e-2, diff.DEFAULT_TOLERANCES["fp16"].rtol)
    assert diff.tolerances("int8", ["a"], diff.DiffSpec())["a"].gating is False
    assert diff.parse_tolerance("--atol", "sentence_embedding=1e-3") == ("sentence_embedding", 1e-3)
    assert diff.parse_tolerance("--rtol", "0") == ("", 0.0)


@pytest.fixture(scope="module")
def tiny_engine(tiny):
    """A real TensorRT(-RTX) FP16 engine + manifest for the tiny model (the builder runs on CPU)."""
    from trt_seer.engine.build import BuildSpec
    from trt_seer.export.families import ShapeProfile

    if not trt.available():
        pytest.skip("no TensorRT / TensorRT-RTX importable to build an engine")
    _, art = tiny
    spec = BuildSpec(precision="fp16", profile=ShapeProfile((1, 4, 16), (8, 32, 64)), workspace_mb=256)
    pipeline.engine(manifest.read(record(art, "fp16")), art, spec)
    return art.path("fp16.manifest.json")


def test_engine_not_run_without_gpu_is_not_verified(tiny_engine, capsys, tmp_path):
    """The engine cannot run here: its ONNX graph is compared, yet the result is "not verified"
    (exit 3) and the manifest records that verdict, never a pass."""
    reason = cuda.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a CUDA device is present: the engine comparison runs (see the gpu test)")
    manifest_path = tiny_engine
    code, out, _ = run_diff(capsys, manifest_path, "--report", tmp_path / "report")
    assert code == 3, out
    assert f"not run: tensorrt-fp16 vs onnxrt-fp32: {reason}" in out
    assert "onnxrt-fp16 vs onnxrt-fp32" in out  # its ONNX graph is still compared
    assert out.rstrip().endswith("result: NOT VERIFIED (1 comparison asked for did not run)")
    not_run = [{"comparison": "tensorrt-fp16 vs onnxrt-fp32", "reason": reason}]
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["verdict"] == "not verified" and rep["not_run"] == not_run
    assert [r["comparison"] for r in rep["ran"]] == ["onnxrt-fp16 vs onnxrt-fp32"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**Result: NOT VERIFIED" in md and f"- tensorrt-fp16 vs onnxrt-fp32: {reason}" in md
    acc = manifest.read_engine_manifest(manifest_path)["accuracy"]["diff_vs_fp32"]
    assert acc["verdict"] == "not verified" and "passed" not in acc and acc["not_run"] == not_run
    assert list(acc["comparisons"]) == ["onnxrt-fp16"]
    assert acc["comparisons"]["onnxrt-fp16"]["measured_on"]["backend"] == "onnxruntime CPU"


def test_nothing_runnable_is_not_verified(tiny_engine, capsys, tmp_path):
    """An engine beside no ONNX graph of its own, on a machine that cannot run it: nothing is
    compared, exit 3, and the manifest says what did not run and why."""
    reason = cuda.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a CUDA device is present: the engine comparison runs")
    src = tiny_engine.parent
    data = manifest.read_engine_manifest(tiny_engine)
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in (tiny_engine.name, data["engine"]["file"], tiny_engine.name.replace("fp16.manifest.json", "fp32.onnx")):
        shutil.copy(src / name, alone / name)
    code, out, _ = run_diff(capsys, alone / tiny_engine.name, "--report", tmp_path / "report")
    assert code == 3, out
    assert "nothing could run here" in out
    assert out.rstrip().endswith("result: NOT VERIFIED (2 comparisons asked for did not run)")
    acc = manifest.read_engine_manifest(alone / tiny_engine.name)["accuracy"]["diff_vs_fp32"]
    assert acc["verdict"] == "not verified" and acc["ran"] == [] and acc["comparisons"] == {}
    assert [n["comparison"] for n in acc["not_run"]] == ["onnxrt-fp16 vs onnxrt-fp32", "tensorrt-fp16 vs onnxrt-fp32"]
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["verdict"] == "not verified" and rep["reproduce"] == []


@pytest.mark.gpu
def test_engine_compared_on_gpu(tiny_engine, capsys, tmp_path):
    manifest_path = tiny_engine
    reason = diff.engine_unavailable_reason(manifest.read_engine_manifest(manifest_path))
    if reason:
        pytest.skip(f"engine cannot run here: {reason}")
    code, out, _ = run_diff(capsys, manifest_path, "--report", tmp_path / "report")
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("tensorrt-fp16 vs onnxrt-fp32")]
    assert len(rows) == 2 and all(r.endswith("PASS") for r in rows)
    acc = manifest.read_engine_manifest(manifest_path)["accuracy"]["diff_vs_fp32"]
    assert acc["verdict"] == "passed" and acc["not_run"] == []
    engine_on = acc["comparisons"]["tensorrt-fp16"]["measured_on"]
    assert engine_on["artifact"].endswith(".engine") and f" on {cuda.device_info(0).name}" in engine_on["backend"]
    cmds = _reproduce_lines((tmp_path / "report" / "report.md").read_text())
    assert any("--model-type engine --trt" in c for c in cmds)


def _ran(passed: bool) -> dict:
    return {"candidate": "onnxrt-fp16", "reference": "onnxrt-fp32", "passed": passed}


SKIPPED = {"comparison": "tensorrt-fp16 vs onnxrt-fp32", "reason": "no usable CUDA GPU"}


def test_verdict_rules():
    assert diff.verdict([_ran(True)], []) == diff.PASSED
    assert diff.verdict([_ran(True)], [SKIPPED]) == diff.NOT_VERIFIED  # asked for, did not run
    assert diff.verdict([], [SKIPPED]) == diff.NOT_VERIFIED
    assert diff.verdict([], []) == diff.NOT_VERIFIED  # nothing compared is nothing verified
    assert diff.verdict([_ran(True), _ran(False)], []) == diff.FAILED
    assert diff.verdict([_ran(False)], [SKIPPED]) == diff.FAILED  # a failure that ran decides
    assert diff.EXIT_CODES == {diff.PASSED: 0, diff.FAILED: 1, diff.NOT_VERIFIED: 3}


def test_result_with_a_requested_comparison_not_run_is_not_verified(tmp_path):
    target = diff.Target(tmp_path / "m.fp16.manifest.json", "engine", "m", "fp16", None, {})
    ref = diff.Side("onnxrt-fp32", "onnxrt", "fp32", tmp_path / "m.fp32.onnx")
    cand = diff.Side("onnxrt-fp16", "onnxrt", "fp16", tmp_path / "m.fp16.onnx")
    result = diff.DiffResult(target, "feature-extraction", "fp32", ref, [cand], [SKIPPED], [], None,
                             backends={"onnxrt-fp16": "onnxruntime CPU", "onnxrt-fp32": "onnxruntime CPU"},
                             artifacts={"onnxrt-fp16": "m.fp16.onnx", "onnxrt-fp32": "m.fp32.onnx"})
    result.comparisons = [_ran(True)]
    assert result.verdict == "not verified" and not result.passed and result.exit_code == 3
    on_cpu = {"backend": "onnxruntime CPU"}
    assert result.ran() == [{"comparison": "onnxrt-fp16 vs onnxrt-fp32", "passed": True,
                             "candidate": {"label": "onnxrt-fp16", "artifact": "m.fp16.onnx", **on_cpu},
                             "reference": {"label": "onnxrt-fp32", "artifact": "m.fp32.onnx", **on_cpu}}]
    result.comparisons = [_ran(False)]
    assert result.verdict == "failed" and result.exit_code == 1
    result.not_run = []
    result.comparisons = [_ran(True)]
    assert result.verdict == "passed" and result.passed and result.exit_code == 0
