"""ONNX + BuildSpec -> serialized TensorRT engine + manifest.

One strongly typed path for TensorRT 10.x, 11.x and TensorRT-RTX: the ONNX graph's types decide
precision (FP16-typed tensors, Q/DQ nodes), the builder only gets profiles, memory and targets.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trt_seer.engine import attention, gemm_fusion, kv_outputs, manifest, profiles, weight_layout
from trt_seer.export import onnxio
from trt_seer.engine import trt as trt_adapter
from trt_seer.errors import BuildError
from trt_seer.export.families import ShapeProfile
from trt_seer.files import atomic_path, atomic_write_bytes, publish, sha256_file, sha256_json, staging_dir

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
    max_total: int | None = None  # decoders: longest prompt + generated tokens (profiles.py)
    prompt_slice: int | None = None  # decoders: the prefill profile takes slices of this many on a cache
    detailed: bool = False  # keep per-layer information for the engine inspector
    verbose: bool = False

    def settings(self) -> dict:
        d = asdict(self)
        d["profile"] = self.profile.to_dict()
        d["compute_caps"] = list(self.compute_caps)
        d.pop("verbose")
        for key in ("max_total", "prompt_slice"):  # unset: keep the cache keys of earlier builds
            if d[key] is None:
                d.pop(key)
        return d


def decoder_passes() -> dict:
    """What a decoder's parsed network is changed by before the build (engine/kv_outputs.py,
    weight_layout.py, gemm_fusion.py): part of its engine's cache key."""
    return {"kv_outputs": kv_outputs.KV_OUTPUTS, "weight_layout": weight_layout.WEIGHT_LAYOUT,
            "gemm_fusion": gemm_fusion.GEMM_FUSION}


def cache_key(onnx_sha: str, spec: BuildSpec, flavor: trt_adapter.Flavor, decoder: bool = False,
              packed: bool = False) -> str:
    """Engine cache key: ONNX hash + build settings + TensorRT flavor and version + targets (+ a
    decoder's network passes, decoder_passes; + a packed encoder's, attention.PACKED_PASS)."""
    targets = trt_adapter.target_description(flavor, spec.hardware_compat, spec.compute_caps)
    if targets["mode"] in trt_adapter.NEEDS_BUILD_GPU:  # an engine for another GPU is no cache hit
        targets = trt_adapter.with_build_gpu(targets, trt_adapter.build_gpu())
    extra = {**(decoder_passes() if decoder else {}), **({"packed_pass": attention.PACKED_PASS} if packed else {})}
    return sha256_json({"onnx": onnx_sha, "settings": spec.settings(), **flavor.describe(),
                        "targets": targets, **extra})


def decoder_engine_key(onnx_sha: str, spec: BuildSpec) -> str:
    """`cache_key` of a decoder's engine built here from the graph `onnx_sha` with `spec`."""
    return cache_key(onnx_sha, spec, trt_adapter.load(), decoder=True)


def _parse(flavor, builder, onnx_path: Path):
    network = trt_adapter.strongly_typed_network(flavor, builder)
    parser = flavor.trt.OnnxParser(network, builder.logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i).desc()).splitlines()[0] for i in range(parser.num_errors))
        raise BuildError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    return network, parser


def network_profiles(network, spec: BuildSpec) -> list[tuple[str, dict]]:
    inputs = {t.name: tuple(t.shape) for t in (network.get_input(i) for i in range(network.num_inputs))}
    return profiles.profiles_for(inputs, spec.profile, spec.max_total, spec.prompt_slice)


def _add_profiles(builder, config, chosen: list[tuple[str, dict]]) -> None:
    for _name, shapes in chosen:
        p = builder.create_optimization_profile()
        for tensor, (lo, opt, hi) in shapes.items():
            p.set_shape(tensor, lo, opt, hi)
        config.add_optimization_profile(p)


def _config(flavor, builder, network, spec: BuildSpec, timing_cache: Path | None, cancelled):
    config = builder.create_builder_config()
    _add_profiles(builder, config, network_profiles(network, spec))
    config.set_memory_pool_limit(flavor.trt.MemoryPoolType.WORKSPACE, spec.workspace_mb << 20)
    config.builder_optimization_level = spec.opt_level
    if spec.detailed:
        config.profiling_verbosity = flavor.trt.ProfilingVerbosity.DETAILED
    targets = trt_adapter.set_targets(flavor, config, spec.hardware_compat, spec.compute_caps)
    targets = trt_adapter.with_build_gpu(targets, trt_adapter.build_gpu())
    monitor = trt_adapter.make_progress_monitor(flavor, cancelled)
    if monitor is not None:
        config.progress_monitor = monitor
    if timing_cache is not None and flavor.has_timing_cache:
        blob = timing_cache.read_bytes() if timing_cache.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False)
    return config, targets, monitor


@contextmanager
def sigint_flag():
    """Yields an Event that Ctrl-C sets while TensorRT builds. Python would raise KeyboardInterrupt
    inside a TensorRT callback (logger, progress monitor), where TensorRT swallows it and the build
    goes on; instead the progress monitor sees the flag and cancels the build, and the caller
    raises KeyboardInterrupt once TensorRT returns."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():  # only it can take signals
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _io(flavor, network) -> dict:
    def one(t):
        dtype = np.dtype(flavor.trt.nptype(t.dtype)).name  # numpy names: float32, float16, int64
        return {"name": t.name, "dtype": dtype, "shape": list(t.shape)}

    return {"inputs": [one(network.get_input(i)) for i in range(network.num_inputs)],
            "outputs": [one(network.get_output(i)) for i in range(network.num_outputs)]}


def _serialize(flavor, builder, network, config, engine_path: Path, failed) -> None:
    """Builds the engine into `engine_path` (temp file, fsync, rename; `failed()` raises). Where
    the builder can write to a stream, the serialized engine goes to the file as it is made and
    is never whole in host memory beside the network's weights (a 7B engine: 13 GB less)."""
    if not hasattr(builder, "build_serialized_network_to_stream"):
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            failed()
        atomic_write_bytes(engine_path, memoryview(blob))
        return
    with atomic_path(engine_path) as tmp, open(tmp, "wb") as f:
        writer = _FileWriter(flavor.trt.IStreamWriter, f)
        ok = builder.build_serialized_network_to_stream(network, config, writer)
        if writer.error is not None:
            raise writer.error
        if not ok:
            failed()


def _FileWriter(base, f):
    """A TensorRT IStreamWriter appending to open file `f`; an OSError (disk full) is kept for
    the caller, since an exception cannot cross TensorRT's callback."""

    class Writer(base):
        def __init__(self):
            base.__init__(self)
            self.error = None

        def write(self, data) -> int:
            try:
                return f.write(data)
            except OSError as e:
                self.error = e
                return 0

    return Writer()


def engine_from_onnx(onnx_path: Path, engine_path: Path, spec: BuildSpec,
                     timing_cache: Path | None = None, extra: dict | None = None, onnx_sha: str | None = None) -> dict:
    """Builds `engine_path` from `onnx_path`; writes the manifest beside it and returns it.
    `onnx_sha`: the graph's hash when the caller's record has it (a 7B graph takes seconds to hash)."""
    flavor = trt_adapter.load()
    onnx_sha = onnx_sha or onnxio.sha256(onnx_path)
    trt_logger = trt_adapter.logger(flavor, spec.verbose)
    builder = flavor.trt.Builder(trt_logger)
    network, _parser = _parse(flavor, builder, Path(onnx_path))
    decoder = kv_outputs.mark_new_kv_outputs(flavor, network) > 0
    attentions = attention.make_decomposable(flavor, network)
    packed = attention.make_packed(flavor, network)  # after: the packed attentions copy `decomposable`
    gemms = weight_layout.transposed_gemms(flavor, network) if decoder else []
    kept, fused = gemm_fusion.fuse_shared_input_gemms(flavor, network, gemms)  # read until serialized
    nk_gemms = len(gemms)
    del gemms  # the folded GEMMs' own [N, K] arrays go
    with staging_dir(engine_path) as work:
        staged = work / Path(engine_path).name
        data = _build_staged(flavor, builder, network, trt_logger, spec, timing_cache, Path(onnx_path), staged)
        data["build"] = {"key": cache_key(onnx_sha, spec, flavor, decoder, packed > 0), **data["build"],
                         **({"gemm_weights_nk": nk_gemms, "gemms_fused": fused} if decoder else {}),
                         **({"attention_layers": attentions, "attention_pass": attention.ATTENTION_PASS}
                            if attentions else {}),
                         **({"packed_attention": packed, "packed_pass": attention.PACKED_PASS} if packed else {})}
        del kept
        data = {**data, "onnx": {"file": Path(onnx_path).name, "sha256": onnx_sha}, **(extra or {})}
        publish(staged, engine_path, lambda: manifest.write(manifest.engine_manifest_path(engine_path), data))
    return manifest.read(manifest.engine_manifest_path(engine_path))


def _build_staged(flavor, builder, network, trt_logger, spec: BuildSpec, timing_cache: Path | None, onnx_path: Path,
                  engine_path: Path) -> dict:
    """Builds the engine into `engine_path` (a staging path) and returns its manifest's own sections."""
    with sigint_flag() as interrupted:
        trt_logger.cancelled = interrupted.is_set
        config, targets, _monitor = _config(flavor, builder, network, spec, timing_cache, interrupted.is_set)
        start = time.perf_counter()

        def failed():
            if interrupted.is_set():
                raise KeyboardInterrupt
            why = trt_logger.errors[-1].splitlines()[0] if trt_logger.errors else "run with -v for the builder log"
            raise BuildError(f"TensorRT failed to build {Path(onnx_path).name}: {why}")

        _serialize(flavor, builder, network, config, engine_path, failed)
        seconds = time.perf_counter() - start
    if timing_cache is not None and flavor.has_timing_cache:
        atomic_write_bytes(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    st = engine_path.stat()
    return {
        "precision": spec.precision,
        "engine": {"file": engine_path.name, "sha256": sha256_file(engine_path), "size_bytes": st.st_size,
                   "stat": [st.st_size, st.st_mtime_ns]},
        "tensorrt": flavor.describe(), "targets": targets, "build_gpu": trt_adapter.build_gpu(),
        "profiles": [spec.profile.to_dict()], "io": _io(flavor, network),
        "optimization_profiles": profiles.describe(network_profiles(network, spec)),
        "build": {"settings": spec.settings(), "seconds": round(seconds, 3),
                  "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "timing_cache": str(timing_cache.name) if timing_cache and flavor.has_timing_cache else None},
    }
