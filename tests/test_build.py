"""Real TensorRT(-RTX) engine builds on CPU: default model FP32 + FP16, tiny families, manifest
contents and the cache hit. Skips only when no TensorRT flavor is importable."""
import json
import os
import subprocess
import sys

import pytest

from tiny import make_tiny_checkpoint
from trt_seer.engine import manifest
from trt_seer.engine import trt
from trt_seer.decoder_io import new_of
from trt_seer.engine.build import BuildSpec, cache_key
from trt_seer.engine.kv_outputs import mark_new_kv_outputs
from trt_seer.errors import BuildError, ManifestMismatchError, UnsupportedError
from trt_seer.export.engine_form import FORM
from trt_seer.export.families import ShapeProfile
from trt_seer.runtime.loader import check_manifest

pytestmark = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")


def build(*args):
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", *args], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def default_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    first = build("--fp32", "--fp16", "--out", str(out))
    return out, first


@pytest.mark.slow
def test_default_model_artifacts(default_build):
    out, _ = default_build
    names = {p.name for p in out.iterdir()}
    stem = "all-MiniLM-L6-v2"
    for suffix in ("fp32.onnx", "fp16.onnx", "fp32.engine", "fp16.engine",
                   "fp32.manifest.json", "fp16.manifest.json", "fp32.onnx.json", "fp16.onnx.json"):
        assert f"{stem}.{suffix}" in names
    assert not [n for n in names if n.startswith(".")], names  # no temp files left behind


@pytest.mark.slow
def test_default_model_manifest(default_build):
    out, _ = default_build
    m = manifest.read_engine_manifest(out / "all-MiniLM-L6-v2.fp16.manifest.json")
    flavor = trt.load()
    assert m["tensorrt"] == {"flavor": flavor.name, "version": str(flavor.version)}
    assert m["precision"] == "fp16" and m["task"] == "feature-extraction" and m["model_type"] == "bert"
    assert m["profiles"] == [{"batch": [1, 8, 32], "seq": [8, 128, 256]}]
    assert [i["name"] for i in m["io"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["dtype"] == "int64" and i["shape"] == [-1, -1] for i in m["io"]["inputs"])
    outs = {o["name"]: o for o in m["io"]["outputs"]}
    assert outs["sentence_embedding"]["shape"] == [-1, 384] and outs["sentence_embedding"]["dtype"] == "float32"
    engine = out / m["engine"]["file"]
    assert m["engine"]["size_bytes"] == engine.stat().st_size
    from trt_seer.files import sha256_file
    assert m["engine"]["sha256"] == sha256_file(engine)
    assert m["source"]["config_sha256"] and m["source"]["checkpoint"]
    assert "accuracy" not in m  # nothing was measured on the engine itself
    acc = m["accuracy_of_source_graph"]["onnx_vs_fp32"]  # the FP16 graph on ONNX Runtime
    assert acc["mean_cosine"] >= 0.999 and acc["samples"] >= 100
    assert acc["measured_on"] == {"artifact": "all-MiniLM-L6-v2.fp16.onnx", "backend": "onnxruntime CPU"}
    assert acc["reference_measured_on"]["artifact"] == "all-MiniLM-L6-v2.fp32.onnx"
    assert m["targets"]["mode"] in ("ampere+", "build-gpu", "listed", "same-cc")
    fp32 = manifest.read_engine_manifest(out / "all-MiniLM-L6-v2.fp32.manifest.json")
    assert fp32["engine"]["size_bytes"] > 1.5 * m["engine"]["size_bytes"]  # FP16 weights halve it


@pytest.mark.slow
def test_second_run_is_a_cache_hit(default_build):
    out, _ = default_build
    engine = out / "all-MiniLM-L6-v2.fp16.engine"
    before = engine.stat().st_mtime_ns
    r = build("--fp16", "--out", str(out))
    assert "fp16 engine up to date" in r.stderr
    assert "exporting" not in r.stderr and "building" not in r.stderr
    assert engine.stat().st_mtime_ns == before


@pytest.mark.slow
def test_changed_profile_rebuilds(default_build):
    out, _ = default_build
    r = build("--fp16", "--batch", "1,4,16", "--out", str(out))
    assert "building the fp16 engine" in r.stderr and "fp32 ONNX up to date" in r.stderr
    m = manifest.read_engine_manifest(out / "all-MiniLM-L6-v2.fp16.manifest.json")
    assert m["profiles"][0]["batch"] == [1, 4, 16]


def test_cache_key_covers_settings_and_flavor():
    flavor = trt.load()
    base = cache_key("abc", BuildSpec(), flavor)
    assert base != cache_key("abc", BuildSpec(), flavor, decoder=True)  # decoders' engines give new_key_values
    assert base == cache_key("abc", BuildSpec(), flavor)
    assert base != cache_key("abd", BuildSpec(), flavor)
    assert base != cache_key("abc", BuildSpec(profile=ShapeProfile((1, 2, 4))), flavor)
    assert base != cache_key("abc", BuildSpec(opt_level=5), flavor)


@pytest.mark.parametrize("module,name", [("weight_layout", "WEIGHT_LAYOUT"), ("gemm_fusion", "GEMM_FUSION")])
def test_decoder_cache_key_records_the_network_passes(monkeypatch, module, name):
    """A decoder engine built before engine/weight_layout.py or gemm_fusion.py (or with another
    version of them) is no cache hit; an encoder's key does not depend on them."""
    import importlib

    flavor = trt.load()
    now = cache_key("abc", BuildSpec(), flavor, decoder=True)
    encoder = cache_key("abc", BuildSpec(), flavor)
    monkeypatch.setattr(importlib.import_module(f"trt_seer.engine.{module}"), name, "another")
    assert cache_key("abc", BuildSpec(), flavor, decoder=True) != now
    assert cache_key("abc", BuildSpec(), flavor) == encoder


def test_a_decoder_engine_from_earlier_network_passes_is_built_again(tmp_path, monkeypatch):
    """The build's fast path (every engine up to date for this request) also asks that a decoder
    engine's cache key be today's: after a pass changes, the same request builds the engine again."""
    from trt_seer.build import _cache_hit
    from trt_seer.cli import build_parser
    from trt_seer.cli.build import request_from_args
    from trt_seer.engine import gemm_fusion

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "ckpt")
    args = ["build", "--model", str(ckpt), "--fp16", "--batch", "1,2,4", "--seq", "8,16,32", "--out", str(tmp_path / "out")]
    build(*args[1:])
    request = request_from_args(build_parser().parse_args(args))
    assert set(_cache_hit(request)) == {"fp16"}
    monkeypatch.setattr(gemm_fusion, "GEMM_FUSION", "another")
    assert _cache_hit(request) is None


def test_chunked_attention_builds_with_room_for_its_prompt_scores(tmp_path):
    """TensorRT-RTX refuses at run time a workspace allocation over the engine's limit, and chunked
    attention keeps a prompt step's scores there: its build raises a lower limit to what the scores
    of the profile's largest prompt can take (a higher one stays), the engine records the limit, and
    the same command is then a cache hit. Eager attention keeps the limit it is given."""
    from trt_seer.build import with_decoder_limits
    from trt_seer.cli import build_parser
    from trt_seer.cli.build import request_from_args

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "ckpt", max_position_embeddings=256)
    config = json.loads((ckpt / "config.json").read_text())
    args = ["build", "--model", str(ckpt), "--fp16", "--batch", "1,8,16", "--seq", "1,16,250", "--max-total", "256",
            "--attention", "chunked", "--workspace-mb", "16", "--out", str(tmp_path / "out")]
    # 16 prompts of 250 tokens, the cache padded to 4 chunks of 64 positions; per score FP16 twice,
    # float32 twice, and the float32 mask over the key/value heads
    scores = 16 * config["num_attention_heads"] * 250 * 256
    need_mb = -(-(scores * 12 + scores * 4 // config["num_key_value_heads"]) // 2**20)
    assert need_mb > 16
    parse = build_parser().parse_args
    assert with_decoder_limits(request_from_args(parse(args))).spec.workspace_mb == need_mb
    higher = [a if a != "16" else str(need_mb + 1) for a in args]
    assert with_decoder_limits(request_from_args(parse(higher))).spec.workspace_mb == need_mb + 1
    eager = [a if a != "chunked" else "eager" for a in args]
    assert with_decoder_limits(request_from_args(parse(eager))).spec.workspace_mb == 16

    r = build(*args[1:])
    assert f"workspace limit {need_mb} MiB" in r.stderr
    m = manifest.read_engine_manifest(tmp_path / "out" / "ckpt.fp16.manifest.json")
    assert m["build"]["settings"]["workspace_mb"] == need_mb
    assert "fp16 engine up to date" in build(*args[1:]).stderr


def test_a_prompt_slice_gives_the_prefill_profile_a_cache_and_bounds_the_workspace(tmp_path):
    """`--prompt-slice` (default 512 with chunked attention, none with eager, none where no prompt
    is longer): the engine's prefill profile takes up to that many tokens on a cache as long as the
    decode profile's, its manifest says the slice to the runtime, and chunked attention's workspace
    bound covers a slice on the longest cache as well as the longest prompt at once."""
    from trt_seer.build import PROMPT_SLICE, with_decoder_limits
    from trt_seer.cli import build_parser
    from trt_seer.cli.build import request_from_args
    from trt_seer.export.attention import prompt_scratch_bytes

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "ckpt", max_position_embeddings=1024)
    config = json.loads((ckpt / "config.json").read_text())
    args = ["build", "--model", str(ckpt), "--fp16", "--batch", "1,2,4", "--seq", "4,16,32", "--max-total", "64",
            "--attention", "chunked", "--prompt-slice", "8", "--workspace-mb", "1", "--out", str(tmp_path / "out")]

    def limits(*changes):
        argv = list(args)
        for old, new in changes:
            argv[argv.index(old)] = new
        return with_decoder_limits(request_from_args(build_parser().parse_args(argv))).spec

    spec = limits()
    assert spec.prompt_slice == 8
    need = max(prompt_scratch_bytes(config, 4, 32), prompt_scratch_bytes(config, 4, 8, 63))
    assert spec.workspace_mb == -(-need // 2**20)
    assert limits(("8", "0")).prompt_slice is None and limits(("8", "32")).prompt_slice is None
    assert limits(("chunked", "eager")).prompt_slice == 8 and limits(("chunked", "eager")).workspace_mb == 1
    defaults = [a for a in args if a not in ("--prompt-slice", "8")]
    parse = build_parser().parse_args
    assert with_decoder_limits(request_from_args(parse(defaults))).spec.prompt_slice is None  # 512 >= 32
    longer = [a if a != "4,16,32" else f"4,16,{PROMPT_SLICE + 1}" for a in defaults]
    longer[longer.index("64")] = str(2 * PROMPT_SLICE)
    assert with_decoder_limits(request_from_args(parse(longer))).spec.prompt_slice == PROMPT_SLICE
    eager = [a if a != "chunked" else "eager" for a in longer]
    assert with_decoder_limits(request_from_args(parse(eager))).spec.prompt_slice is None

    built = [a for a in args[1:] if a not in ("--workspace-mb", "1")]  # GEMMs need more than the scores' 1 MiB
    r = build(*built)
    assert "takes prompts over 8 tokens in slices of 8" in r.stderr
    m = manifest.read_engine_manifest(tmp_path / "out" / "ckpt.fp16.manifest.json")
    assert m["decoder"]["prompt_slice"] == 8 and m["build"]["settings"]["prompt_slice"] == 8
    decode, prefill = (p["shapes"] for p in m["optimization_profiles"])
    assert prefill["past_key_values.0.key"][2][2] == 63 and prefill["past_key_values.0.key"][0][2] == 0
    assert prefill["attention_mask"] == [[1, 1], [2, 16], [4, 63 + 8]] and prefill["input_ids"][2] == [4, 32]
    assert decode["input_ids"] == [[1, 1], [2, 1], [4, 1]]
    assert "fp16 engine up to date" in build(*built).stderr


def test_an_encoder_takes_no_prompt_slice(tmp_path):
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "ckpt")
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--prompt-slice", "8", "--seq", "8,16,32",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--prompt-slice is for causal LMs" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type,task", [("bert", "text-classification"), ("llama", "causal-lm"),
                                             ("distilbert", "feature-extraction")])
def test_tiny_family_fp16_engine(tmp_path, model_type, task):
    ckpt = make_tiny_checkpoint(model_type, task, tmp_path / "ckpt")
    build("--model", str(ckpt), "--fp16", "--batch", "1,2,4", "--seq", "8,16,32", "--out", str(tmp_path / "out"))
    m = manifest.read_engine_manifest(tmp_path / "out" / "ckpt.fp16.manifest.json")
    assert m["task"] == task and m["model_type"] == model_type
    assert (tmp_path / "out" / m["engine"]["file"]).stat().st_size == m["engine"]["size_bytes"]
    record = json.loads((tmp_path / "out" / "ckpt.fp16.onnx.json").read_text())
    assert record["precision"] == "fp16"
    # the FP16 graph's accuracy, measured on ONNX Runtime, reaches the manifest named as the graph's
    on_graph = {"artifact": "ckpt.fp16.onnx", "backend": "onnxruntime CPU"}
    # decoders are exported in FP16 straight from the checkpoint and checked against PyTorch FP16
    entry = "onnx_vs_pytorch_fp16" if task == "causal-lm" else "onnx_vs_fp32"
    assert record["accuracy"][entry]["measured_on"] == on_graph
    assert m["accuracy_of_source_graph"] == record["accuracy"] and "accuracy" not in m
    gpu = trt.build_gpu()  # recorded, null when built without a GPU, and then a target needing none
    assert "build_gpu" in m and m["build_gpu"] == gpu
    assert m["targets"]["build_compute_capability"] == (gpu["compute_capability"] if gpu else None)
    assert gpu is not None or m["targets"]["mode"] not in trt.NEEDS_BUILD_GPU
    if task == "causal-lm":  # a KV-cache decoder: prompts up to --seq max, 2 x that in all (--max-total), cache in float16
        assert {k: m["decoder"][k] for k in ("max_batch", "max_prompt", "max_total", "kv_dtype")} == \
            {"max_batch": 4, "max_prompt": 32, "max_total": 64, "kv_dtype": "float16"}
        past = next(v for v in m["io"]["inputs"] if v["name"] == "past_key_values.0.key")
        assert past["dtype"] in ("float16", "half") and past["shape"][2] == -1
        # the engine gives each step's own keys and values, not the grown cache (engine/kv_outputs.py)
        pasts = [v for v in m["io"]["inputs"] if v["name"].startswith("past_key_values.")]
        outs = {v["name"]: v for v in m["io"]["outputs"]}
        assert not [n for n in outs if n.startswith("present.")] and pasts
        for v in pasts:
            assert outs[new_of(v["name"])]["shape"] == v["shape"] and outs[new_of(v["name"])]["dtype"] == v["dtype"]
        # every Linear's FP16 weight stored [N, K] (engine/weight_layout.py): 7 per layer + the LM head;
        # k and v folded into q, up into gate (engine/gemm_fusion.py: small weights)
        assert m["build"]["gemm_weights_nk"] == 7 * 2 + 1 and m["build"]["gemms_fused"] == 3 * 2
    else:
        assert "gemm_weights_nk" not in m["build"] and "gemms_fused" not in m["build"]
        # each attention one ONNX Attention, LayerNorm in FP16 (export/engine_form.py), said in the manifest
        assert m["graph_form"]["attention"] == FORM and m["graph_form"]["fused"] == 2
        assert m["graph_form"] == record["graph_form"] and m["graph_form"]["fp16_ops"] == ["LayerNormalization"]


@pytest.mark.slow
def test_decomposed_attention_on_request_and_back(tmp_path):
    """`--attention decomposed` keeps the exporter's attention; the next default build is no cache hit
    and fuses it."""
    import onnx

    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "ckpt")
    args = ["--model", str(ckpt), "--fp16", "--batch", "1,2,4", "--seq", "8,16,32", "--out", str(tmp_path / "out")]
    path = tmp_path / "out" / "ckpt.fp16.manifest.json"

    build(*args, "--attention", "decomposed")
    m = manifest.read_engine_manifest(path)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "out" / "ckpt.fp16.onnx")).graph.node}
    assert m["graph_form"]["attention"] == "decomposed" and "Softmax" in ops and "Attention" not in ops

    r = build(*args)
    assert "up to date" not in r.stderr.splitlines()[-1]
    assert manifest.read_engine_manifest(path)["graph_form"]["attention"] == FORM
    assert "up to date" in build(*args).stderr


@pytest.mark.skipif(not trt.available() or not trt.load().is_rtx, reason="compute-capability targets are TensorRT-RTX's")
def test_compute_capability_target(tmp_path):
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "ckpt")
    build("--model", str(ckpt), "--fp16", "--compute-capability", "7.5", "--batch", "1,1,2",
          "--seq", "8,8,16", "--out", str(tmp_path))
    m = manifest.read_engine_manifest(tmp_path / "ckpt.fp16.manifest.json")
    gpu = trt.build_gpu()
    assert m["build_gpu"] == gpu  # null on a machine without a GPU, said so in the manifest
    assert m["targets"] == {"mode": "listed", "compute_capabilities": ["7.5"],
                            "build_compute_capability": gpu["compute_capability"] if gpu else None}
    assert trt.target_allows(m["targets"], (7, 5)) and not trt.target_allows(m["targets"], (8, 6))
    check_manifest(m, trt.load().describe(), (7, 5), "T4")  # the real manifest passes the load check
    with pytest.raises(ManifestMismatchError, match="targets compute capability 7.5; A100 is 8.0"):
        check_manifest(m, trt.load().describe(), (8, 0), "A100")


# --- the build GPU's compute capability, recorded at build and enforced at load ----------------

INSTALLED = {"flavor": "tensorrt", "version": "10.13.0.35"}


def fabricated(mode: str, build_cc: str | None, **extra) -> dict:
    """An engine manifest as `build` writes it, with the targets under test."""
    return {"schema": 1, "name": "m", "precision": "fp16", "task": "feature-extraction",
            "engine": {"file": "m.fp16.engine"}, "tensorrt": dict(INSTALLED), "profiles": [], "io": {},
            "build": {"settings": {}}, "build_gpu": {"name": "GPU", "compute_capability": build_cc} if build_cc else None,
            "targets": {"mode": mode, "compute_capabilities": [], "build_compute_capability": build_cc, **extra}}


@pytest.mark.parametrize("mode", ["build-gpu", "same-cc"])
def test_build_gpu_engine_loads_only_on_its_cc(mode):
    m = fabricated(mode, "8.9")
    check_manifest(m, INSTALLED, (8, 9), "RTX 4090")  # the current GPU's cc is the parameter
    for other in ((8, 6), (9, 0), (7, 5)):
        with pytest.raises(ManifestMismatchError, match=rf"built for the compute capability 8\.9 of its build GPU "
                                                        rf"\({mode}\); H200 is {other[0]}\.{other[1]}: rebuild") as e:
            check_manifest(m, INSTALLED, other, "H200")
        assert "\n" not in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("mode", ["build-gpu", "same-cc"])
def test_build_gpu_target_without_a_recorded_cc_is_rejected(mode):
    m = fabricated(mode, None)
    with pytest.raises(ManifestMismatchError, match=rf"targets the build GPU \({mode}\) but its manifest records "
                                                    "no build compute capability"):
        check_manifest(m, INSTALLED, (8, 9))
    del m["targets"]["build_compute_capability"]  # manifests written before the cc was recorded
    with pytest.raises(ManifestMismatchError, match="records no build compute capability"):
        check_manifest(m, INSTALLED, (8, 9))


def test_portable_targets_need_no_build_gpu():
    check_manifest(fabricated("ampere+", None), INSTALLED, (9, 0))
    check_manifest(fabricated("listed", None, compute_capabilities=["7.5"]), INSTALLED, (7, 5))


def test_build_gpu_recorded_in_targets():
    h200 = {"name": "NVIDIA H200", "compute_capability": "9.0"}
    assert trt.with_build_gpu({"mode": "build-gpu", "compute_capabilities": []}, h200) == {
        "mode": "build-gpu", "compute_capabilities": [], "build_compute_capability": "9.0"}
    assert trt.with_build_gpu({"mode": "ampere+", "compute_capabilities": []}, None)["build_compute_capability"] is None
    for mode in trt.NEEDS_BUILD_GPU:  # a CPU-only build cannot make an engine tied to its GPU
        with pytest.raises(UnsupportedError, match=f"target '{mode}' ties the engine to the build GPU"):
            trt.with_build_gpu({"mode": mode, "compute_capabilities": []}, None)



def test_tensorrt_log_goes_to_the_trt_seer_logger_not_stderr(caplog, capfd):
    """TensorRT's messages reach `trt_seer.tensorrt` (errors also kept for one-line reasons); INFO
    and VERBOSE only when verbose, at DEBUG; nothing is printed."""
    import logging

    flavor = trt.load()
    severity = flavor.trt.ILogger.Severity
    quiet, verbose = trt.logger(flavor), trt.logger(flavor, verbose=True)
    with caplog.at_level(logging.DEBUG, logger="trt_seer.tensorrt"):
        for lg in (quiet, verbose):
            lg.log(severity.ERROR, "bad\nsecond line")
            lg.log(severity.WARNING, "careful")
            lg.log(severity.INFO, "fyi")
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [("trt_seer.tensorrt", logging.ERROR, "[TensorRT] ERROR: bad\nsecond line"),
                   ("trt_seer.tensorrt", logging.WARNING, "[TensorRT] WARNING: careful")] * 2 + [
                   ("trt_seer.tensorrt", logging.DEBUG, "[TensorRT] INFO: fyi")]
    assert quiet.errors == verbose.errors == ["bad\nsecond line"]
    assert capfd.readouterr() == ("", "")


def test_a_present_output_that_is_not_the_concat_of_its_past_is_refused():
    """engine/kv_outputs.py rewires `present = Concat(past, new)` (new computed in the graph); any
    other producer is a graph it does not know, and the build stops with one line instead of giving
    an engine the runtime would misread."""
    flavor = trt.load()
    builder = flavor.trt.Builder(trt.logger(flavor))

    def network_with(present_of):
        network = trt.strongly_typed_network(flavor, builder)
        past = network.add_input("past_key_values.0.key", flavor.trt.float16, (1, 2, 4, 8))
        x = network.add_input("x", flavor.trt.float16, (1, 2, 4, 8))
        out = present_of(network, past, x)
        out.name = "present.0.key"
        network.mark_output(out)
        return network

    def concat(network, past, new):
        layer = network.add_concatenation([past, new])
        layer.axis = 2
        return layer.get_output(0)

    refused = {"a sum": lambda n, p, x: n.add_elementwise(p, x, flavor.trt.ElementWiseOperation.SUM).get_output(0),
               "the past second": lambda n, p, x: concat(n, n.add_identity(x).get_output(0), p),
               "an input as the new part": concat}
    for why, made in refused.items():
        with pytest.raises(BuildError, match=r"present\.0\.key is not Concat\(past_key_values\.0\.key, new\)"):
            mark_new_kv_outputs(flavor, network_with(made))
            pytest.fail(why)
    network = network_with(lambda n, p, x: concat(n, p, n.add_identity(x).get_output(0)))
    assert mark_new_kv_outputs(flavor, network) == 1
    assert [network.get_output(i).name for i in range(network.num_outputs)] == ["new_key_values.0.key"]


def test_build_progress_draws_nested_phases_at_a_bounded_rate(capsys):
    """TensorRT starts thousands of nested phases in a build; each used to redraw the bar, so a
    build's log held thousands of copies of it. Now the bar is drawn at most every tqdm interval,
    still shows the phase, and completes its steps."""
    import types

    class Monitor:
        def __init__(self):
            pass

    flavor = types.SimpleNamespace(has_progress_monitor=True, trt=types.SimpleNamespace(IProgressMonitor=Monitor))
    bars = trt.make_progress_monitor(flavor)
    bars.phase_start("Building engine", None, 3)
    for i in range(2000):
        bars.phase_start("Computing reformatting costs", "Building engine", 1)
        bars.phase_finish("Computing reformatting costs")
    assert bars.step_complete("Building engine", 0) is True
    assert bars._bar.n == 1 and "Computing reformatting costs" in str(bars._bar)
    bars.phase_finish("Building engine")
    drawn = capsys.readouterr().err.count("Building engine")
    assert 1 <= drawn < 200, drawn


@pytest.mark.slow
@pytest.mark.parametrize("precision,logits", [("fp32", "float32"), ("fp16", "float16")])
def test_a_decoder_built_where_no_engine_runs_keeps_what_generate_runs_there(tmp_path, capsys, precision, logits):
    """Built where no engine runs (no GPU / CUDA here), a decoder keeps the graph ONNX Runtime runs in
    its engine's place, says so, and `generate` on the engine works; only the asked precision's
    engine and its sampler are built (no FP16 engine for --fp32)."""
    from test_generate import hf_greedy, save_tokenizer

    from trt_seer import cli
    from trt_seer.runtime import tensorrt_unavailable_reason

    if tensorrt_unavailable_reason() is None:
        pytest.skip("engines run on this machine")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama", initializer_range=0.3)
    save_tokenizer(ckpt)
    out = tmp_path / "out"
    assert cli.main(["build", "--model", str(ckpt), f"--{precision}", "--seq", "1,16,128", "--out", str(out)]) == 0
    assert "keeping the ONNX graphs that ONNX Runtime runs in the engines' place" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("*.engine")) == [f"llama.{precision}.engine", f"llama.sampler.{logits}.engine"]
    argv = ["generate", str(out / f"llama.{precision}.engine"), "--prompt", "w5 w9 w17 w33", "--max-new-tokens", "6"]
    assert cli.main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert f"on ONNX Runtime (CPU) instead of llama.{precision}.engine" in captured.err
    result = json.loads(captured.out)["results"][0]
    want = hf_greedy(ckpt, [result["prompt_ids"]], 6)[0]
    agree = sum(a == b for a, b in zip(result["token_ids"], want))
    assert agree == len(want) if precision == "fp32" else agree >= len(want) - 1
