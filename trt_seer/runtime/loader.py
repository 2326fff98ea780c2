"""Opening a TensorRT engine file, shared by `TensorRTModel` (engine.py) and `TensorRTDecoder`
(decoder_trt.py): the manifest checked against the installed flavor and the GPU before anything is
deserialized, the device made current, the engine deserialized with a logger that keeps errors,
and the runtime cache file of TensorRT-RTX's JIT kernels.

    from trt_seer.runtime.loader import EngineOptions, load_engine
    loaded = load_engine(Path("engines/m.fp16.engine"), EngineOptions(device=0))
    context = loaded.engine.create_execution_context()
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_seer.engine import manifest as manifest_io
from trt_seer.engine import trt as trt_adapter
from trt_seer.errors import DependencyError, InputError, ManifestMismatchError
import trt_seer.runtime.cuda as cuda
from trt_seer.runtime.jit_cache import RuntimeCacheFile


@dataclass(frozen=True)
class EngineOptions:
    """How to run an engine. `runtime_cache`: "auto" keeps TensorRT-RTX's JIT kernels in
    `<engine stem>.runtime.cache` beside the engine, a path puts them there, None turns it off."""

    device: int = 0
    contexts: int = 1
    # None: on where the flavor allows (TensorRT: captured per input shape; TensorRT-RTX: its own
    # per-shape capture), off quietly where it cannot; True: the same, warning when it cannot.
    use_cuda_graph: bool | None = None
    max_graphs: int = 32  # captured shapes kept per context (least recently used dropped)
    runtime_cache: str | Path | None = "auto"
    # True: CUDA events around the engine give `last_gpu_ms` (benchmarks, `trt-seer run`); off by
    # default: the two event records cost a call ~12 us end to end on an H200 (docs/BENCHMARKS.md).
    time_gpu: bool = False
    verbose: bool = False

    def __post_init__(self):
        for name in ("device", "contexts", "max_graphs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(f"{name} must be an integer, got {value!r}")
        if self.contexts < 1:
            raise InputError(f"contexts must be >= 1, got {self.contexts}")


@dataclass
class LoadedEngine:
    """A deserialized engine and what came with it. `runtime` must outlive `engine`."""

    path: Path
    manifest: dict
    flavor: object  # trt_adapter.Flavor
    gpu: cuda.DeviceInfo
    logger: object  # trt_adapter.logger(): TensorRT's log, errors kept
    runtime: object
    engine: object
    jit_cache: RuntimeCacheFile

    def last_error(self, default: str = "see the TensorRT log") -> str:
        """The first line of TensorRT's last error message, for one-line errors."""
        return self.logger.errors[-1].splitlines()[0] if self.logger.errors else default


def load_engine(path: Path, options: EngineOptions, manifest: dict | None = None) -> LoadedEngine:
    """Checks and deserializes `path` (InputError if missing; ManifestMismatchError or
    DependencyError when it cannot run here). `manifest`: already read, else read beside the engine."""
    if not path.is_file():
        raise InputError(f"engine not found: {path}")
    if manifest is None:
        manifest = manifest_io.read_engine_manifest(manifest_io.engine_manifest_path(path))
    flavor = trt_adapter.load()
    gpu = open_device(options.device)
    check_manifest(manifest, flavor.describe(), gpu.compute_capability, gpu.name)
    logger = trt_adapter.logger(flavor, options.verbose)
    runtime, engine = deserialize(path, manifest, flavor, gpu, logger)
    jit_cache = RuntimeCacheFile.for_engine(path, options.runtime_cache, flavor)
    return LoadedEngine(path, manifest, flavor, gpu, logger, runtime, engine, jit_cache)


def runtime_config(engine, flavor, jit_cache: RuntimeCacheFile, capture: bool):
    """A per-context IRuntimeConfig (TensorRT-RTX) with the engine's runtime cache attached and,
    with `capture`, whole-graph capture: TensorRT-RTX does not let callers capture its launches (its
    JIT may compile kernels mid-launch); it captures and replays a graph per input shape itself when
    asked. None where the flavor has no runtime configs."""
    if not hasattr(engine, "create_runtime_config"):
        return None
    config = engine.create_runtime_config()
    jit_cache.attach(config)
    if capture and hasattr(config, "cuda_graph_strategy"):
        config.cuda_graph_strategy = flavor.trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    return config


def check_manifest(manifest: dict, installed: dict, device_cc: tuple[int, int], gpu: str = "this GPU") -> None:
    """Raises ManifestMismatchError, naming both sides, if the engine cannot run here.

    Args:
        manifest: the engine manifest.
        installed: the installed flavor, `{"flavor": ..., "version": ...}` (Flavor.describe()).
        device_cc: the GPU's compute capability, e.g. (8, 9).
        gpu: the GPU's name, for the message.
    Whether the installed runtime drives this GPU at all is TensorRT's own call at deserialization,
    reported with the GPU and TensorRT's reason.
    """
    name = manifest.get("engine", {}).get("file", manifest.get("name", "engine"))
    built = manifest["tensorrt"]
    built_as = f"{built.get('flavor')} {built.get('version')}"
    here = f"{installed['flavor']} {installed['version']}"
    if built.get("flavor") != installed["flavor"]:
        raise ManifestMismatchError(f"{name} was built with {built_as}; this runtime has {here}: "
                                    f"install {built.get('flavor')} or rebuild the engine here")
    compat = bool(manifest.get("build", {}).get("settings", {}).get("version_compatible", False))
    if not trt_adapter.engine_version_compatible(installed["flavor"], built["version"], installed["version"], compat):
        raise ManifestMismatchError(f"{name} was built with {built_as}; this runtime has {here}: engines "
                                    "load only in the release that built them; rebuild the engine "
                                    f"(python -m trt_seer build) or install {built_as}")
    cc = f"{device_cc[0]}.{device_cc[1]}"
    targets = manifest["targets"]
    why = trt_adapter.build_gpu_mismatch(targets, device_cc, gpu)
    if why:
        raise ManifestMismatchError(f"{name} {why}")
    if not trt_adapter.target_allows(targets, device_cc, targets.get("build_compute_capability")):
        want = ", ".join(targets.get("compute_capabilities") or []) or targets.get("mode", "?")
        raise ManifestMismatchError(f"{name} targets compute capability {want}; {gpu} is {cc}: "
                                    f"rebuild with --compute-capability {cc}")


def deserialize(path: Path, manifest: dict, flavor, gpu: cuda.DeviceInfo, logger):
    """(runtime, engine) from an engine file whose manifest was checked; ManifestMismatchError when
    the file is not the one the manifest describes or TensorRT cannot load it on this GPU."""
    blob = path.read_bytes()
    expected = manifest["engine"].get("size_bytes")
    if expected is not None and expected != len(blob):
        raise ManifestMismatchError(f"{path.name} is {len(blob)} bytes but its manifest says {expected}: "
                                    "the engine was replaced without its manifest; rebuild it")
    runtime = flavor.trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        why = logger.errors[-1].splitlines()[0] if logger.errors else "see the TensorRT log"
        raise ManifestMismatchError(
            f"{flavor.name} {flavor.version} could not load {path.name} on {gpu.name} "
            f"(compute capability {gpu.major}.{gpu.minor}): {why}; rebuild it here with "
            "python -m trt_seer build, or run the .onnx on CPU")
    return runtime, engine


def open_device(device: int) -> cuda.DeviceInfo:
    """Makes `device` current; DependencyError when there is no usable GPU."""
    reason = cuda.gpu_unavailable_reason(device)
    if reason is not None:
        raise DependencyError(f"cannot run a TensorRT engine: {reason}; use the .onnx artifact on CPU "
                              "(backend='onnxruntime')")
    cuda.set_device(device)
    return cuda.device_info(device)
