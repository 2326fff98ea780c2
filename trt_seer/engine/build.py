"""ONNX + BuildSpec -> serialized TensorRT engine + manifest.

One strongly typed path for TensorRT 10.x, 11.x and TensorRT-RTX: the ONNX graph's types decide
precision (FP16-typed tensors, Q/DQ nodes), the builder only gets profiles, memory and targets.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.engine import trt as trt_adapter
from trt_seer.errors import BuildError
from trt_seer.export.families import ShapeProfile
from trt_seer.files import atomic_write_bytes, sha256_file, sha256_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildSpec:
    """Everything that changes the engine (and so is part of its cache key)."""

    precision: str = "fp16"
    profile: ShapeProfile = field(default_factory=ShapeProfile)
    workspace_mb: int = 4096
    opt_level: int = 3
    hardware_compat: str | None = None  # None | "ampere+" | "same-cc" (full TensorRT)
    compute_caps: tuple[str, ...] = ()  # TensorRT-RTX targets, e.g. ("7.5",)
    detailed: bool = False  # keep per-layer information for the engine inspector
    verbose: bool = False

    def settings(self) -> dict:
        d = asdict(self)
        d["profile"] = self.profile.to_dict()
        d["compute_caps"] = list(self.compute_caps)
        d.pop("verbose")
        return d


def cache_key(onnx_sha: str, spec: BuildSpec, flavor: trt_adapter.Flavor) -> str:
    """Engine cache key: ONNX hash + build settings + TensorRT flavor and version + targets."""
    targets = trt_adapter.target_description(flavor, spec.hardware_compat, spec.compute_caps)
    return sha256_json({"onnx": onnx_sha, "settings": spec.settings(), **flavor.describe(),
                        "targets": targets})


def _parse(flavor, builder, onnx_path: Path):
    network = trt_adapter.strongly_typed_network(flavor, builder)
    parser = flavor.trt.OnnxParser(network, builder.logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i).desc()).splitlines()[0] for i in range(parser.num_errors))
        raise BuildError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    return network, parser


def _profile(flavor, builder, network, profile: ShapeProfile):
    p = builder.create_optimization_profile()
    names = [network.get_input(i).name for i in range(network.num_inputs)]
    decoder = any(n.startswith(PAST_PREFIX) for n in names)
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if decoder:
            p.set_shape(t.name, *decoder_shapes(t.name, tuple(t.shape), profile))
            continue
        if len(t.shape) != 2:
            raise BuildError(f"input {t.name} has rank {len(t.shape)}; profiles cover (batch, seq) inputs")
        p.set_shape(t.name, *profile.shapes())
    return p


PAST_PREFIX = "past_key_values."


def decoder_shapes(name: str, shape: tuple, profile: ShapeProfile) -> tuple[tuple, tuple, tuple]:
    """(min, opt, max) of a KV-cache decoder input. The seq range bounds the context (prompt plus
    generated tokens): a step feeds 1..max tokens on top of a cache of 0..max-1."""
    (b0, b1, b2), (_, s1, s2) = profile.batch, profile.seq
    if name.startswith(PAST_PREFIX):  # (batch, kv_heads, past, head_dim)
        heads, dim = shape[1], shape[3]
        return (b0, heads, 0, dim), (b1, heads, s1, dim), (b2, heads, s2 - 1, dim)
    return (b0, 1), (b1, s1), (b2, s2)  # input_ids, position_ids, attention_mask


def _config(flavor, builder, network, spec: BuildSpec, timing_cache: Path | None):
    config = builder.create_builder_config()
    config.add_optimization_profile(_profile(flavor, builder, network, spec.profile))
    config.set_memory_pool_limit(flavor.trt.MemoryPoolType.WORKSPACE, spec.workspace_mb << 20)
    config.builder_optimization_level = spec.opt_level
    if spec.detailed:
        config.profiling_verbosity = flavor.trt.ProfilingVerbosity.DETAILED
    targets = trt_adapter.set_targets(flavor, config, spec.hardware_compat, spec.compute_caps)
    monitor = trt_adapter.make_progress_monitor(flavor)
    if monitor is not None:
        config.progress_monitor = monitor
    if timing_cache is not None and flavor.has_timing_cache:
        blob = timing_cache.read_bytes() if timing_cache.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False)
    return config, targets, monitor


def _io(flavor, network) -> dict:
    def one(t):
        dtype = np.dtype(flavor.trt.nptype(t.dtype)).name  # numpy names: float32, float16, int64
        return {"name": t.name, "dtype": dtype, "shape": list(t.shape)}

    return {"inputs": [one(network.get_input(i)) for i in range(network.num_inputs)],
            "outputs": [one(network.get_output(i)) for i in range(network.num_outputs)]}


def engine_from_onnx(onnx_path: Path, engine_path: Path, spec: BuildSpec,
                     timing_cache: Path | None = None, extra: dict | None = None) -> dict:
    """Builds `engine_path` from `onnx_path`; writes the manifest beside it and returns it."""
    flavor = trt_adapter.load()
    onnx_sha = onnxio.sha256(onnx_path)
    trt_logger = trt_adapter.logger(flavor, spec.verbose)
    builder = flavor.trt.Builder(trt_logger)
    network, _parser = _parse(flavor, builder, Path(onnx_path))
    config, targets, _monitor = _config(flavor, builder, network, spec, timing_cache)
    start = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if blob is None:
        why = trt_logger.errors[-1].splitlines()[0] if trt_logger.errors else "run with -v for the builder log"
        raise BuildError(f"TensorRT failed to build {Path(onnx_path).name}: {why}")
    atomic_write_bytes(engine_path, bytes(memoryview(blob)))
    if timing_cache is not None and flavor.has_timing_cache:
        atomic_write_bytes(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    data = {
        "precision": spec.precision,
        "engine": {"file": Path(engine_path).name, "sha256": sha256_file(engine_path),
                   "size_bytes": Path(engine_path).stat().st_size,
                   "stat": [Path(engine_path).stat().st_size, Path(engine_path).stat().st_mtime_ns]},
        "onnx": {"file": Path(onnx_path).name, "sha256": onnx_sha},
        "tensorrt": flavor.describe(), "targets": targets,
        "profiles": [spec.profile.to_dict()], "io": _io(flavor, network),
        "build": {"key": cache_key(onnx_sha, spec, flavor), "settings": spec.settings(),
                  "seconds": round(seconds, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "timing_cache": str(timing_cache.name) if timing_cache and flavor.has_timing_cache else None},
        **(extra or {}),
    }
    manifest.write(manifest.engine_manifest_path(engine_path), data)
    return manifest.read(manifest.engine_manifest_path(engine_path))
