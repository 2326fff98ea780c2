"""Which backend runs an artifact, for `load` (models) and `load_generator` (decoders): the load
options split between the backends, whether a TensorRT runs engines here, and the ONNX Runtime
fallback (the engine's ONNX sibling) for an engine none runs.

    from trt_seer.runtime.backends import runnable, split_options
    engine_opts, ort_opts = split_options({"device": 0, "threads": 4})
    path, backend = runnable(Path("m.fp16.engine"), "auto", engine_opts.device)  # or the .onnx sibling
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from pathlib import Path

from trt_seer.errors import DependencyError, InputError, UnsupportedError

BACKENDS = ("auto", "tensorrt", "onnxruntime")


def split_options(opts: dict):
    """(EngineOptions, OrtOptions) from `load`'s keyword options; InputError naming unknown ones."""
    from trt_seer.runtime.loader import EngineOptions
    from trt_seer.runtime.ort import OrtOptions

    engine_keys = {f.name for f in dataclasses.fields(EngineOptions)}
    ort_keys = {f.name for f in dataclasses.fields(OrtOptions)}
    unknown = sorted(set(opts) - engine_keys - ort_keys)
    if unknown:
        raise InputError(f"unknown load option(s) {', '.join(unknown)}; TensorRT takes "
                         f"{', '.join(sorted(engine_keys))}; ONNX Runtime takes {', '.join(sorted(ort_keys))}")
    engine = EngineOptions(**{k: v for k, v in opts.items() if k in engine_keys})
    ort = OrtOptions(**{k: v for k, v in opts.items() if k in ort_keys})
    return engine, ort


def runnable(path: Path, backend: str, device: int = 0, stacklevel: int = 3) -> tuple[Path, str]:
    """(the file to open, "tensorrt" or "onnxruntime") for artifact `path` and `backend` ("auto":
    TensorRT for an engine where it runs on `device`, else the engine's ONNX sibling, with a warning)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if path.suffix == ".onnx":
        if backend == "tensorrt":
            raise InputError(f"{path.name} is an ONNX graph; build an engine from it "
                             "(python -m trt_seer build) to run it on TensorRT, or use backend='onnxruntime'")
        return path, "onnxruntime"
    if path.suffix != ".engine":
        raise InputError(f"{path} is neither a .engine nor a .onnx file")
    if backend == "onnxruntime":
        return onnx_sibling(path), "onnxruntime"
    if not path.is_file():  # before any TensorRT or CUDA check, which would be blamed instead
        raise InputError(f"engine not found: {path}")
    reason = tensorrt_unavailable_reason(device)
    if reason is None:
        return path, "tensorrt"
    return onnx_instead(path, backend, reason, stacklevel + 1), "onnxruntime"


def onnx_instead(path: Path, backend: str, reason: str, stacklevel: int = 3) -> Path:
    """The ONNX sibling that runs in place of engine `path`, which no TensorRT runs here (`reason`),
    with a warning; DependencyError when `backend` is "tensorrt" or there is no sibling."""
    if backend == "tensorrt":
        raise DependencyError(f"cannot run {path.name} on TensorRT: {reason}")
    sibling = onnx_sibling(path)
    if not sibling.is_file():
        raise DependencyError(f"cannot run {path.name} on TensorRT ({reason}) and there is no "
                              f"{sibling.name} beside it to run on ONNX Runtime instead")
    message = f"running {sibling.name} on ONNX Runtime (CPU) instead of {path.name}: {reason}"
    damage = engine_damage(path)
    if damage is not None:
        message += f"; {damage}"
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
    return sibling


CPU_FORMS = {"fp32": "fp32", "fp16": "fp32", "int8": "int8", "int4": "int4"}  # engine precision -> its CPU artifact's


def onnx_sibling(engine_path: Path) -> Path:
    """The ONNX graph ONNX Runtime's CPU provider runs in an engine's place: the fast CPU form
    `build` writes beside it when there is one, else the graph the engine was built from.

    `x.int8.engine` -> `x.int8.cpu.onnx` (dynamic INT8 on the fused graph; a decoder's MatMulNBits
    form, as `x.int4.engine` -> `x.int4.cpu.onnx`), `x.fp32.engine` and
    `x.fp16.engine` -> `x.fp32.cpu.onnx` (fused FP32: faster on the CPU than the FP16-typed graph,
    which runs no faster than the plain FP32 one there, and exact); else `x.<precision>.onnx`.
    A CPU form counts only with its record (`x.int8.cpu.onnx.json`) beside it: one without is what
    an interrupted older build left, never a finished artifact."""
    from trt_seer.engine import manifest

    engine_path = Path(engine_path)
    stem = engine_path.name.removesuffix(".engine")
    name, _, precision = stem.rpartition(".")
    cpu_form = CPU_FORMS.get(precision)
    cpu = engine_path.with_name(f"{name}.{cpu_form}.cpu.onnx") if name and cpu_form else None
    if cpu is not None and cpu.is_file() and manifest.record_path(cpu).is_file():
        return cpu
    return engine_path.with_name(stem + ".onnx")


def tensorrt_unavailable_reason(device: int = 0) -> str | None:
    """None when a TensorRT flavor imports and runs engines on CUDA GPU `device`; else why not.
    TensorRT itself decides: a one-layer engine is built and deserialized once per process."""
    from trt_seer.engine import trt
    import trt_seer.runtime.cuda as cuda

    try:
        flavor = trt.load()
    except (DependencyError, UnsupportedError) as e:
        return str(e)
    reason = cuda.gpu_unavailable_reason(device)
    if reason is not None:
        return reason
    return _probe_engine(flavor, device)


@functools.lru_cache(maxsize=None)
def _probe_engine(flavor, device: int) -> str | None:
    from trt_seer.engine import trt
    import trt_seer.runtime.cuda as cuda

    t, logger = flavor.trt, trt.logger(flavor)
    builder = t.Builder(logger)
    network = trt.strongly_typed_network(flavor, builder)
    x = network.add_input("x", t.float32, (1, 4))
    network.mark_output(network.add_identity(x).get_output(0))
    blob = builder.build_serialized_network(network, builder.create_builder_config())
    engine = None if blob is None else t.Runtime(logger).deserialize_cuda_engine(blob)
    if engine is not None:
        return None
    gpu = cuda.device_info(device)
    why = logger.errors[-1].splitlines()[0] if logger.errors else "no reason logged"
    return (f"{flavor.name} {flavor.version} does not run engines on {gpu.name} (compute capability "
            f"{gpu.major}.{gpu.minor}): {why}")


def engine_damage(path: Path) -> str | None:
    """Why the engine file is not the one its manifest describes (size, then sha256), or None
    (also when there is no manifest to compare with). Checked on the fallback, where TensorRT never
    reads the file, so a damaged engine is not mistaken for a good one that only lacks a GPU."""
    from trt_seer.engine import manifest
    from trt_seer.files import sha256_file

    try:
        record = manifest.read_if_exists(manifest.engine_manifest_path(path))
    except InputError as e:
        return f"its manifest is unusable ({e})"
    described = (record or {}).get("engine") or {}
    size = path.stat().st_size
    if described.get("size_bytes") not in (None, size):
        return (f"{path.name} is damaged: {size} bytes, its manifest says {described['size_bytes']}; "
                "rebuild it with python -m trt_seer build")
    if described.get("sha256") and described["sha256"] != sha256_file(path):
        return f"{path.name} is damaged: its sha256 differs from its manifest's; rebuild it with python -m trt_seer build"
    return None
