"""Saving, hashing and describing ONNX files (external data included for models over 2 GB)."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import hashlib

from trt_seer.errors import InputError
from trt_seer.files import fsync_dir, fsync_file

EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes; protobuf's hard limit is 2 GiB


def data_path(onnx_path: Path) -> Path:
    return Path(str(onnx_path) + ".data")


@contextmanager
def staged(dest: Path):
    """Yields a path with `dest`'s file name inside a temp dir beside `dest`; when the block
    succeeds, publishes the graph and its external-data file (if the block wrote one) together.

    The rule that makes them appear together: both are written and flushed to disk in the temp
    dir first; then the data file is renamed into place, and the graph last. A reader that finds
    the new graph therefore always finds its data beside it; a stale data file of an older graph
    is removed only after the new graph (which does not reference it) has replaced the old one.
    (While an old pair is being replaced, a reader that opened the old graph just before may meet
    the new data: records hash graph and data together, so such a mix never matches a record.)
    On failure or Ctrl-C the temp dir is removed and `dest` is untouched.
    """
    dest = Path(dest)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield tmpdir / dest.name
        graph, data = tmpdir / dest.name, data_path(tmpdir / dest.name)
        wrote_data = data.exists()
        for path in (data, graph) if wrote_data else (graph,):
            fsync_file(path)
        if wrote_data:
            os.replace(data, data_path(dest))
        os.replace(graph, dest)
        if not wrote_data and data_path(dest).exists():  # an older, larger graph's: now unreferenced
            data_path(dest).unlink()
        fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def save(model, dest: Path, give_back: bool = True) -> Path:
    """Saves an onnx.ModelProto atomically; weights go to `<dest>.data` when the model is large.
    save_model moves them out of `model`; `give_back` reads them in again (the caller keeps a whole
    model), else `model` is left without them (a caller that is done with it saves the memory)."""
    import onnx

    with staged(dest) as tmp:
        if too_large(model):
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_path(dest).name, size_threshold=1024)
            if give_back:
                onnx.external_data_helper.load_external_data_for_model(model, str(tmp.parent))
        else:
            onnx.save_model(model, tmp)
    return Path(dest)


def load(path: Path, load_external_data: bool = True):
    import onnx

    return onnx.load(str(path), load_external_data=load_external_data)


def check_readable(path: Path) -> None:
    """InputError naming `path` when it is not a well-formed ONNX graph (truncated, corrupt, not
    ONNX at all, or its external-data file is missing)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        onnx.checker.check_model(str(path))  # by path: external data is checked beside it
    except (OSError, DecodeError, RuntimeError, onnx.checker.ValidationError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path} is not a readable ONNX graph (truncated or corrupt?): {first}") from e


def sha256(path: Path) -> str:
    """Hash of the graph file and its external data, if any."""
    h = hashlib.sha256()
    for p in (Path(path), data_path(path)):
        if p.exists():
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
    return h.hexdigest()


_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32", 9: "bool", 3: "int8"}


def describe_io(model) -> dict:
    """{"inputs": [{name, dtype, shape}], "outputs": [...]} with -1 for symbolic dimensions."""

    def one(v):
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        return {"name": v.name, "dtype": _ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), "shape": shape}

    return {"inputs": [one(v) for v in model.graph.input],
            "outputs": [one(v) for v in model.graph.output]}


LIGHT_MIN_BYTES = 1 << 20  # initializers this large lose their values in `lightweight` copies


def lightweight(model):
    """A copy of `model` whose large initializers keep name, type and dims but not their values:
    small enough for protobuf (2 GB), for passes that need only shapes (shape inference). Small initializers (shapes, axes) keep their values, which
    shape inference reads."""
    import onnx

    light = onnx.ModelProto()
    light.CopyFrom(model)
    for t in light.graph.initializer:
        if t.ByteSize() >= LIGHT_MIN_BYTES:
            t.CopyFrom(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
    return light


def tensor_bytes(model) -> int:
    """The bytes of the model's initializers: protobuf's own ByteSize() fails past 2 GB."""
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)


def too_large(model) -> bool:
    return tensor_bytes(model) >= EXTERNAL_DATA_THRESHOLD


def infer_shapes(model):
    """onnx shape inference for models of any size: over protobuf's limit it runs on a
    `lightweight` copy and the inferred value_info is put back on `model` (returned)."""
    import onnx

    if not too_large(model):
        return onnx.shape_inference.infer_shapes(model)
    inferred = onnx.shape_inference.infer_shapes(lightweight(model))
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    return model


def check_model(model) -> None:
    """onnx.checker on models under protobuf's 2 GB limit. The checker cannot take a larger model
    in memory (nor one whose weight values are left out), so those are checked by ONNX Runtime
    when the graph is loaded and verified, and the skip is logged."""
    import logging

    import onnx

    if too_large(model):
        logging.getLogger(__name__).info("graph over 2 GB: onnx.checker skipped; ONNX Runtime checks it on load")
        return
    onnx.checker.check_model(model)
