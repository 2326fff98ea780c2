"""Intermediate graphs of a decoder build: removed once the engines that need them exist, and the
FP16 model read back without them.

    rec = release_fp16_weights(art, fp16_record)    # fp16.onnx -> fp16.skeleton.onnx (no weights)
    src = FP16Weights(art, rec, ckpt)               # the skeleton, and its weights one by one
    model = src.whole()                             # the FP16 graph again, weights from the checkpoint
    remove_graph(art, "int4")                       # int4.onnx (+ .data) gone, its record marked

A record outlives its graph: it keeps the graph's hash (the engine's cache key is made from it)
and says `removed` with what stays (`skeleton`), so a second identical build is still a cache hit.
"""
from __future__ import annotations

import logging
from pathlib import Path

from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.records import Artifacts

log = logging.getLogger(__name__)


def graph_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (Path(path), onnxio.data_path(path)) if p.exists())


def _mark(path: Path, **fields) -> dict:
    rec_path = manifest.record_path(path)
    record = {**manifest.read(rec_path), **fields}
    manifest.write(rec_path, record)
    return record


def remove_graph(art: Artifacts, precision: str) -> int:
    """Deletes `<name>.<precision>.onnx` and its external data; returns the bytes freed."""
    path = art.path(f"{precision}.onnx")
    if not path.exists():
        return 0
    freed = graph_bytes(path)
    _mark(path, removed=True)
    for p in (onnxio.data_path(path), path):
        p.unlink(missing_ok=True)
    log.info("removed %s (%.1f MiB; its engine is built; --keep-intermediates keeps it)", path.name, freed / 2**20)
    return freed


def skeleton_path(art: Artifacts) -> Path:
    return art.path("fp16.skeleton.onnx")


def can_release(record: dict, ckpt: Path) -> bool:
    """Whether the FP16 graph's weights can be read back from the checkpoint once removed."""
    from trt_seer.export.weights import streamable

    return bool(record.get("weights_from_checkpoint")) and streamable(ckpt)


def release_fp16_weights(art: Artifacts, record: dict) -> dict:
    """Writes the weightless FP16 graph, then removes fp16.onnx and its data; returns the record."""
    from trt_seer.export.weights import weightless

    path = art.path("fp16.onnx")
    if not path.exists():
        return record
    onnxio.save(weightless(path, record["weights_from_checkpoint"]), skeleton_path(art))
    freed = graph_bytes(path)
    record = _mark(path, removed=True, skeleton=skeleton_path(art).name)
    for p in (onnxio.data_path(path), path):
        p.unlink(missing_ok=True)
    log.info("removed the FP16 graph's weights (%.1f MiB): later stages read them from the checkpoint",
             freed / 2**20)
    return record


def fp16_available(art: Artifacts, record: dict | None) -> bool:
    """The FP16 graph, or its skeleton after a release, is there to quantize from."""
    if not record:
        return False
    if record.get("removed"):
        return bool(record.get("skeleton")) and skeleton_path(art).is_file()
    return art.path("fp16.onnx").is_file()


class FP16Weights:
    """The FP16 graph a weight-only stage quantizes, never whole in memory once its weights were
    released: `structure()` is the graph (while on disk) or its weightless skeleton, `read(name)`
    one weight from the checkpoint (None for a value the structure holds itself), `fill(model)`
    the skeleton's remaining weights read in, `whole()` the complete FP16 graph."""

    def __init__(self, art: Artifacts, record: dict, ckpt: Path):
        from trt_seer.export.weights import CheckpointTensors

        self.removed = bool(record.get("removed"))
        self.path = skeleton_path(art) if self.removed else art.path("fp16.onnx")
        self.wmap = (record.get("weights_from_checkpoint") or {}) if self.removed else {}
        self.tensors = CheckpointTensors(ckpt) if self.removed else None

    def structure(self):
        return onnxio.load(self.path)

    def read(self, name: str):
        from trt_seer.export.weights import checkpoint_weight

        return checkpoint_weight(self.wmap[name], self.tensors) if name in self.wmap else None

    def fill(self, model):
        from trt_seer.export.weights import materialize

        return materialize(model, self.wmap, self.tensors) if self.wmap else model

    def whole(self):
        return self.fill(self.structure())
