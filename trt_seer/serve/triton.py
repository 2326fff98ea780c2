"""A Triton Inference Server model repository entry from an engine or ONNX artifact.

    from trt_seer.serve.triton import triton_repo_from_artifact
    from trt_seer.serve.config import TritonSpec
    triton_repo_from_artifact("engines/m.fp16.engine", "models", TritonSpec(instances=2))
    # -> models/m-fp16/{config.pbtxt, 1/model.plan, trt_seer.manifest.json}

Everything is checked before anything is written: the manifest (engine file, hash, TensorRT flavor,
no KV-cache decoder), the batch settings against the profiles, and the text against Triton's
ModelConfig schema when tritonclient is installed. The entry is assembled in a temp directory
inside the repository and renamed into place, so Triton never sees half of one.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trt_seer.engine import manifest as manifest_io
from trt_seer.engine.profiles import PAST_PREFIX
from trt_seer.errors import InputError, TrtSeerError, UnsupportedError
from trt_seer.export import onnxio
from trt_seer.export.families import ShapeProfile
from trt_seer.files import ensure_out_dir, sha256_file
from trt_seer.serve import config, schema

log = logging.getLogger("trt_seer")
MANIFEST_COPY = "trt_seer.manifest.json"
VERSION = "1"


@dataclass(frozen=True)
class Artifact:
    """What gets served: the file(s) to copy into the version directory and their manifest."""

    path: Path
    manifest: dict
    manifest_path: Path
    platform: str  # config.TENSORRT | config.ONNXRUNTIME
    files: tuple[tuple[Path, str], ...]  # (source, name inside the version directory)


def _read(path: Path, reader) -> dict:
    if not path.is_file():
        raise InputError(f"no manifest {path.name} beside the artifact: serve what `trt-seer build` wrote")
    return reader(path)


def _engine(manifest_path: Path) -> Artifact:
    m = _read(manifest_path, manifest_io.read_engine_manifest)
    engine = manifest_path.parent / m["engine"]["file"]
    return Artifact(engine, m, manifest_path, config.TENSORRT, ((engine, "model.plan"),))


def _onnx(onnx: Path) -> Artifact:
    record_path = manifest_io.record_path(onnx)
    m = _read(record_path, manifest_io.read)
    files = [(onnx, "model.onnx")]
    if onnxio.data_path(onnx).is_file():  # the graph names its external data file; keep that name
        files.append((onnxio.data_path(onnx), onnxio.data_path(onnx).name))
    return Artifact(onnx, m, record_path, config.ONNXRUNTIME, tuple(files))


def artifact_from_path(path: Path) -> Artifact:
    """An engine, engine manifest, .onnx file or ONNX record -> the Artifact with its manifest."""
    path = Path(path)
    name = path.name
    if name.endswith(".manifest.json"):
        return _engine(path)
    if name.endswith(".engine"):
        return _engine(manifest_io.engine_manifest_path(path))
    if name.endswith(".onnx.json"):
        return _onnx(path.with_name(name.removesuffix(".json")))
    if name.endswith(".onnx"):
        return _onnx(path)
    raise InputError(f"{path}: expected an engine (.engine / .manifest.json) or an ONNX artifact (.onnx / .onnx.json)")


def check_servable(a: Artifact) -> None:
    """Refuses what Triton's tensorrt / onnxruntime backends would not load or serve correctly."""
    m, where = a.manifest, a.path.name
    if "io" not in m:
        raise InputError(f"manifest {a.manifest_path.name} lacks io (inputs/outputs); rebuild with `trt-seer build`")
    if "decoder" in m or any(t["name"].startswith(PAST_PREFIX) for t in m["io"]["inputs"]):
        raise UnsupportedError(f"{where} is a decoder with a KV cache: stateful generation needs Triton's "
                               f"sequence batcher or the TensorRT-LLM backend, which trt-seer does not write yet")
    if a.platform == config.TENSORRT and m["tensorrt"].get("flavor") == "tensorrt_rtx":
        raise UnsupportedError(f"{where} was built with TensorRT-RTX, whose engines Triton's tensorrt backend "
                               f"cannot load; build with full TensorRT (pip install 'trt-seer[tensorrt]') "
                               f"or serve the ONNX artifact")
    for source, _ in a.files:
        if not source.is_file():
            raise InputError(f"{source} not found (named by {a.manifest_path.name})")
    recorded = m["engine"].get("sha256") if a.platform == config.TENSORRT else m.get("sha256")
    if not recorded:
        raise InputError(f"manifest {a.manifest_path.name} records no sha256 for {where}; rebuild it")
    actual = sha256_file(a.path) if a.platform == config.TENSORRT else onnxio.sha256(a.path)
    if recorded != actual:
        raise InputError(f"{where} does not match the sha256 in {a.manifest_path.name}: "
                         f"the file changed after it was built; rebuild it")


def default_name(a: Artifact) -> str:
    """`<name>-<precision>` for an engine, `<name>-<precision>-onnx` for its ONNX graph (no clash)."""
    m = a.manifest
    parts = [m.get("name") or a.path.name.split(".")[0], m.get("precision")]
    parts += ["onnx"] if a.platform == config.ONNXRUNTIME else []
    return config.check_name("-".join(p for p in parts if p))


def comments(a: Artifact) -> list[str]:
    lines = [f"written by trt-seer from {a.manifest_path.name}"]
    if a.platform == config.TENSORRT:
        trt = a.manifest["tensorrt"]
        lines.append(f"engine built with {trt.get('flavor')} {trt.get('version')}: serve it with a tritonserver "
                     f"whose TensorRT is the same version (see the NGC container release notes)")
    return lines


def config_text(a: Artifact, spec: config.TritonSpec) -> str:
    """The config.pbtxt for `a`, checked against Triton's schema when tritonclient is installed."""
    if a.platform == config.TENSORRT:
        ranges = config.engine_batch_ranges(a.manifest)
    else:  # ONNX Runtime takes any batch; serve up to the build's default profile unless told
        top = spec.max_batch_size or ShapeProfile().batch[2]
        ranges = [config.BatchRange(1, 1, top)]
    cfg = config.model_config(spec.name or default_name(a), a.platform, a.manifest["io"], ranges, spec,
                              a.path.name)
    text = config.to_pbtxt(cfg, comments(a))
    if schema.available():
        parsed = schema.parse(text)
        if parsed.max_batch_size != cfg["max_batch_size"] or len(parsed.input) != len(cfg["input"]):
            raise TrtSeerError(f"config.pbtxt for {a.path.name} reads back differently under Triton's schema")
    else:
        log.warning("tritonclient not installed (pip install 'trt-seer[serve]'): "
                    "config.pbtxt not checked against Triton's schema")
    return text


def _stage(a: Artifact, text: str, tmp: Path) -> None:
    (tmp / "config.pbtxt").write_text(text)
    (tmp / VERSION).mkdir()
    for source, name in a.files:
        shutil.copyfile(source, tmp / VERSION / name)
    shutil.copyfile(a.manifest_path, tmp / MANIFEST_COPY)


def _install(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Renames `tmp` to `dest`; an existing `dest` is moved aside first and removed after."""
    if not dest.exists():
        os.rename(tmp, dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
    os.rename(dest, old / dest.name)
    os.rename(tmp, dest)
    shutil.rmtree(old)


def triton_repo_from_artifact(artifact: Path, repo: Path, spec: config.TritonSpec) -> Path:
    """Writes `repo/<name>/{config.pbtxt, 1/model.plan | 1/model.onnx}`; returns the model directory."""
    a = artifact_from_path(artifact)
    check_servable(a)
    text = config_text(a, spec)
    name = spec.name or default_name(a)
    repo = ensure_out_dir(repo)
    dest = repo / name
    if dest.exists() and not spec.overwrite:
        raise InputError(f"{dest} exists; pass --overwrite to replace it or --name to pick another name")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=repo))
    try:
        _stage(a, text, tmp)
        _install(tmp, dest, spec.overwrite)
    except OSError as e:
        raise InputError(f"cannot write {dest}: {e.strerror or e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("wrote %s (%s)", dest, a.platform)
    return dest
