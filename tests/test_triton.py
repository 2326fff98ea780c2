"""`trt-seer triton`: every config.pbtxt written parses with Triton's own ModelConfig schema and agrees
with the manifest; inconsistent settings exit 2 with the reason and leave nothing behind.

A real tiny BERT FP16 build (TensorRT-RTX here) supplies the engine, its manifest and the ONNX
artifact; manifests for shapes a build does not produce here (several profiles, no batch dim,
KV-cache decoders) are written by the tests, with real hashes of the files they name."""
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import HIDDEN, make_tiny_checkpoint
from trt_seer.cli import main
from trt_seer.engine import trt
from trt_seer.errors import InputError
from trt_seer.files import sha256_file
from trt_seer.serve import schema
from trt_seer.serve.config import TritonSpec
from trt_seer.serve.triton import triton_repo_from_artifact

needs_schema = pytest.mark.skipif(not schema.available(), reason="tritonclient not installed: schema not checked")
needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")

# Triton's enum names for the numpy dtypes manifests record (written out here, not imported)
TRITON_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32",
                "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "bool": "TYPE_BOOL"}


def cli(*args):
    """Runs `trt-seer triton ARGS` in process: (exit code, stdout, stderr) via the real CLI."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["triton", *map(str, args)])
        except SystemExit as e:  # argparse usage errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def read_config(model_dir: Path):
    """config.pbtxt parsed with Triton's ModelConfig (text_format.Parse raises on any bad field)."""
    from google.protobuf import text_format

    return text_format.Parse((model_dir / "config.pbtxt").read_text(), schema.model_config_module().ModelConfig())


def type_name(value: int) -> str:
    return schema.model_config_module().DataType.Name(value)


def assert_agrees(cfg, m: dict, batching: bool):
    """Each config tensor matches the manifest's: name, Triton type, dims (batch dim left out if batching)."""
    for section, tensors in (("input", m["io"]["inputs"]), ("output", m["io"]["outputs"])):
        got = {t.name: t for t in getattr(cfg, section)}
        assert list(got) == [t["name"] for t in tensors]
        for t in tensors:
            entry = got[t["name"]]
            assert type_name(entry.data_type) == TRITON_TYPES[t["dtype"]]
            want = t["shape"][1:] if batching else t["shape"]
            assert list(entry.dims) == (want or [1])


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ---------------------------------------------------------------- real build (TensorRT-RTX on CPU)

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not trt.available():
        pytest.skip("no TensorRT / TensorRT-RTX importable")
    root = tmp_path_factory.mktemp("triton_build")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", root / "tiny")
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp16",
                        "--batch", "1,4,16", "--seq", "8,16,32", "--out", str(root / "out")],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return root / "out"


def as_full_tensorrt(built: Path, dest: Path) -> Path:
    """The real engine + manifest, the manifest's flavor set to full TensorRT (what Triton loads)."""
    dest.mkdir()
    shutil.copy(built / "tiny.fp16.engine", dest)
    m = json.loads((built / "tiny.fp16.manifest.json").read_text())
    m["tensorrt"] = {"flavor": "tensorrt", "version": "10.13.3.9"}
    (dest / "tiny.fp16.manifest.json").write_text(json.dumps(m))
    return dest / "tiny.fp16.engine"


@needs_trt
def test_rtx_engine_refused_or_served(built, tmp_path):
    m = json.loads((built / "tiny.fp16.manifest.json").read_text())
    rc, out, err = cli(built / "tiny.fp16.engine", "--repo", tmp_path / "repo")
    if m["tensorrt"]["flavor"] == "tensorrt_rtx":
        assert rc == 2 and "TensorRT-RTX" in err and "ONNX artifact" in err and len(err.splitlines()) == 1
        assert tree(tmp_path / "repo") == []
    else:
        assert rc == 0 and (tmp_path / "repo" / "tiny-fp16" / "1" / "model.plan").is_file()


@needs_trt
@needs_schema
def test_engine_config_agrees_with_manifest(built, tmp_path):
    engine = as_full_tensorrt(built, tmp_path / "e")
    m = json.loads(engine.with_name("tiny.fp16.manifest.json").read_text())
    rc, out, err = cli(engine, "--repo", tmp_path / "repo", "--instances", 2, "--max-queue-delay-us", 500)
    assert rc == 0, err
    model = Path(out.strip())
    assert model == tmp_path / "repo" / "tiny-fp16"
    assert tree(tmp_path / "repo") == ["tiny-fp16", "tiny-fp16/1", "tiny-fp16/1/model.plan",
                                       "tiny-fp16/config.pbtxt", "tiny-fp16/trt_seer.manifest.json"]
    assert sha256_file(model / "1" / "model.plan") == m["engine"]["sha256"]
    cfg = read_config(model)
    assert cfg.name == "tiny-fp16" and cfg.platform == "tensorrt_plan"
    assert cfg.max_batch_size == m["profiles"][0]["batch"][2] == 16
    assert_agrees(cfg, m, batching=True)
    assert [list(t.dims) for t in cfg.output] == [[-1, HIDDEN], [HIDDEN]]
    groups = [(g.count, list(g.profile), g.kind) for g in cfg.instance_group]
    assert groups == [(2, ["0"], cfg.instance_group[0].KIND_GPU)]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 16]  # the profile's opt and max
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert "10.13.3.9" in (model / "config.pbtxt").read_text().splitlines()[1]


@needs_trt
@needs_schema
def test_onnx_artifact_served_by_onnxruntime(built, tmp_path):
    import onnxruntime as ort

    record = json.loads((built / "tiny.fp16.onnx.json").read_text())
    rc, out, err = cli(built / "tiny.fp16.onnx", "--repo", tmp_path, "--preferred-batch", "2,8")
    assert rc == 0, err
    model = Path(out.strip())
    assert model.name == "tiny-fp16-onnx"
    cfg = read_config(model)
    assert cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 32
    assert [(g.kind, list(g.profile)) for g in cfg.instance_group] == [(cfg.instance_group[0].KIND_CPU, [])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2, 8]
    assert_agrees(cfg, record, batching=True)
    # the copied graph is the artifact, and ONNX Runtime sees the I/O the config declares
    assert (model / "1" / "model.onnx").read_bytes() == (built / "tiny.fp16.onnx").read_bytes()
    session = ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [t.name for t in cfg.input]
    assert [o.name for o in session.get_outputs()] == [t.name for t in cfg.output]


# ---------------------------------------------------------------- written manifests

def io(inputs, outputs):
    return {"inputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in inputs],
            "outputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in outputs]}


ENCODER_IO = io([("input_ids", "int64", [-1, -1]), ("attention_mask", "int64", [-1, -1])],
                [("logits", "float16", [-1, 3]), ("score", "float32", [-1])])


def opt_profile(name, batch, seq=(8, 64, 128)):
    shape = {n: [[batch[i], seq[i]] for i in range(3)] for n in ("input_ids", "attention_mask")}
    return {"name": name, "shapes": shape}


def write_engine(dest: Path, io_=ENCODER_IO, profiles=((1, 8, 32),), flavor="tensorrt", **extra) -> Path:
    """`dest/m.fp16.engine` (placeholder bytes) and a manifest naming it with its real hash."""
    dest.mkdir(parents=True, exist_ok=True)
    engine = dest / "m.fp16.engine"
    engine.write_bytes(b"plan bytes " * 100)
    m = {"schema": 1, "name": "m", "precision": "fp16", "task": "text-classification",
         "engine": {"file": engine.name, "sha256": sha256_file(engine), "size_bytes": engine.stat().st_size},
         "tensorrt": {"flavor": flavor, "version": "10.13.3.9"}, "targets": {"mode": "build-gpu"},
         "profiles": [{"batch": list(profiles[0]), "seq": [8, 64, 128]}], "io": copy.deepcopy(io_),
         "optimization_profiles": [opt_profile(f"p{i}", b) for i, b in enumerate(profiles)],
         "build": {"key": "fabricated"}, **extra}
    engine.with_name("m.fp16.manifest.json").write_text(json.dumps(m))
    return engine


def manifest_of(engine: Path) -> dict:
    return json.loads(engine.with_name(engine.name.removesuffix(".engine") + ".manifest.json").read_text())


@needs_schema
def test_one_instance_group_per_profile(tmp_path):
    engine = write_engine(tmp_path / "e", profiles=((1, 4, 8), (1, 16, 32)))
    rc, out, err = cli(engine, "--repo", tmp_path / "repo", "--name", "two")
    assert rc == 0, err
    cfg = read_config(Path(out.strip()))
    assert [list(g.profile) for g in cfg.instance_group] == [["0"], ["1"]]
    assert cfg.max_batch_size == 8  # every profile must accept every batch Triton forms
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert_agrees(cfg, manifest_of(engine), batching=True)
    score = next(t for t in cfg.output if t.name == "score")
    assert list(score.dims) == [1] and list(score.reshape.shape) == []  # per-row scalar


@needs_schema
def test_no_batch_dim_gives_max_batch_size_0_and_full_dims(tmp_path):
    fixed = io([("input_ids", "int64", [1, -1])], [("logits", "float32", [1, -1, 3])])
    engine = write_engine(tmp_path / "e", io_=fixed, profiles=((1, 1, 1),))
    rc, out, err = cli(engine, "--repo", tmp_path / "repo")
    assert rc == 0, err
    cfg = read_config(Path(out.strip()))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert_agrees(cfg, manifest_of(engine), batching=False)
    assert list(cfg.input[0].dims) == [1, -1]
    rc, _, err = cli(engine, "--repo", tmp_path / "repo2", "--preferred-batch", "2")
    assert rc == 2 and "no dynamic batch dim 0" in err and tree(tmp_path / "repo2") == []


@pytest.mark.parametrize("args,reason", [
    (["--max-batch-size", "64"], "--max-batch-size 64 exceeds the engine's profile (batch 1..32)"),
    (["--preferred-batch", "4,48"], "--preferred-batch 48 outside the batches the model serves (1..32"),
    (["--max-batch-size", "8", "--preferred-batch", "16"], "--preferred-batch 16 outside"),
    (["--instances", "0"], "expected an integer >= 1"),
    (["--preferred-batch", "0,4"], "expected integers >= 1"),
    (["--name", "../up"], "--name '../up'"),
])
def test_inconsistent_settings_exit_2(tmp_path, args, reason):
    engine = write_engine(tmp_path / "e")
    rc, out, err = cli(engine, "--repo", tmp_path / "repo", *args)
    assert rc == 2 and reason in err and len(err.strip().splitlines()) == 1, err
    assert out == "" and tree(tmp_path / "repo") == []


def test_profile_not_starting_at_batch_1_is_refused(tmp_path):
    engine = write_engine(tmp_path / "e", profiles=((4, 8, 16),))
    rc, _, err = cli(engine, "--repo", tmp_path / "repo")
    assert rc == 2 and "profile 0 accepts batch 4..16" in err and "--batch 1,OPT,MAX" in err
    assert tree(tmp_path / "repo") == []


def test_decoder_with_kv_cache_refused(tmp_path):
    dec = io([("input_ids", "int64", [-1, -1]), ("past_key_values.0.key", "float16", [-1, 2, -1, 16])],
             [("logits", "float32", [-1, -1, 128]), ("present.0.key", "float16", [-1, 2, -1, 16])])
    engine = write_engine(tmp_path / "e", io_=dec)
    rc, _, err = cli(engine, "--repo", tmp_path / "repo")
    assert rc == 2 and "sequence batcher" in err and "TensorRT-LLM" in err and len(err.splitlines()) == 1
    assert tree(tmp_path / "repo") == []


def test_rtx_manifest_refused(tmp_path):
    engine = write_engine(tmp_path / "e", flavor="tensorrt_rtx")
    rc, _, err = cli(engine, "--repo", tmp_path / "repo")
    assert rc == 2 and "TensorRT-RTX" in err and tree(tmp_path / "repo") == []


def test_artifact_without_manifest_or_with_stale_hash(tmp_path):
    (tmp_path / "lone.fp16.engine").write_bytes(b"x")
    rc, _, err = cli(tmp_path / "lone.fp16.engine", "--repo", tmp_path / "repo")
    assert rc == 2 and "no manifest lone.fp16.manifest.json" in err
    engine = write_engine(tmp_path / "e")
    engine.write_bytes(b"rebuilt since")
    rc, _, err = cli(engine, "--repo", tmp_path / "repo")
    assert rc == 2 and "does not match the sha256" in err and tree(tmp_path / "repo") == []


def test_unknown_dtype_refused(tmp_path):
    odd = io([("input_ids", "int64", [-1, -1])], [("q", "float8_e4m3fn", [-1, 4])])
    rc, _, err = cli(write_engine(tmp_path / "e", io_=odd), "--repo", tmp_path / "repo")
    assert rc == 2 and "float8_e4m3fn has no Triton data type" in err


@needs_schema
def test_existing_model_kept_unless_overwrite(tmp_path):
    engine = write_engine(tmp_path / "e")
    assert cli(engine, "--repo", tmp_path / "repo")[0] == 0
    before = (tmp_path / "repo" / "m-fp16" / "config.pbtxt").read_text()
    rc, _, err = cli(engine, "--repo", tmp_path / "repo", "--preferred-batch", "2")
    assert rc == 2 and "--overwrite" in err
    assert (tmp_path / "repo" / "m-fp16" / "config.pbtxt").read_text() == before
    assert cli(engine, "--repo", tmp_path / "repo", "--preferred-batch", "2", "--overwrite")[0] == 0
    cfg = read_config(tmp_path / "repo" / "m-fp16")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2]
    assert tree(tmp_path / "repo")[0] == "m-fp16"  # no temp or old directories left


def test_failed_copy_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails halfway (disk full) leaves neither the model nor its temp directory."""
    engine = write_engine(tmp_path / "e")
    real = shutil.copyfile

    def fails_on_manifest(src, dst, **kw):
        if str(dst).endswith("trt_seer.manifest.json"):
            raise OSError(28, "No space left on device")
        return real(src, dst, **kw)

    monkeypatch.setattr(shutil, "copyfile", fails_on_manifest)
    with pytest.raises(InputError, match="No space left on device"):
        triton_repo_from_artifact(engine, tmp_path / "repo", TritonSpec())
    assert os.listdir(tmp_path / "repo") == []


@needs_schema
def test_onnx_with_external_data(tmp_path):
    """An ONNX graph whose weights live in `<file>.data`: both copied, and the served graph runs."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from trt_seer.export import onnxio

    bias = numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")
    graph = helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [bias])
    path = tmp_path / "g.fp32.onnx"
    onnx.save_model(helper.make_model(graph), str(path), save_as_external_data=True,
                    location=onnxio.data_path(path).name, size_threshold=0)
    record = {"schema": 1, "kind": "onnx", "name": "g", "precision": "fp32", "sha256": onnxio.sha256(path),
              "io": onnxio.describe_io(onnx.load(str(path), load_external_data=False))}
    (tmp_path / "g.fp32.onnx.json").write_text(json.dumps(record))
    rc, out, err = cli(tmp_path / "g.fp32.onnx.json", "--repo", tmp_path / "repo", "--max-batch-size", 8)
    assert rc == 0, err
    model = Path(out.strip())
    assert model.name == "g-fp32-onnx"
    assert tree(model / "1") == ["g.fp32.onnx.data", "model.onnx"]
    cfg = read_config(model)
    assert cfg.max_batch_size == 8 and list(cfg.dynamic_batching.preferred_batch_size) == [8]
    assert_agrees(cfg, record, batching=True)
    session = ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + np.arange(4))


def test_without_tritonclient_writes_and_warns(tmp_path):
    """The base install (no tritonclient) still writes the entry and says the schema check did not run."""
    engine = write_engine(tmp_path / "e")
    hide = ("import sys; sys.modules['tritonclient'] = None  # Python's own 'not importable' marker\n"
            "from trt_seer.cli import main; sys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", hide, "triton", str(engine), "--repo", str(tmp_path / "repo")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "config.pbtxt not checked against Triton's schema" in r.stderr
    assert (tmp_path / "repo" / "m-fp16" / "config.pbtxt").is_file()


def test_spec_checks_its_own_values():
    with pytest.raises(InputError, match="--instances must be >= 1"):
        TritonSpec(instances=0)
    with pytest.raises(InputError, match="--max-queue-delay-us"):
        TritonSpec(max_queue_delay_us=-1)
