"""Which backend runs an artifact, for `load` (models) and `load_generator` (decoders): the load
options split between the backends and the ONNX Runtime fallback for an engine no TensorRT runs.

    from trt_seer.runtime.backends import runnable, split_options
    engine_opts, ort_opts = split_options({"device": 0, "threads": 4})
    path, backend = runnable(Path("m.fp16.engine"), "auto", engine_opts.device)  # or the .onnx sibling
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from trt_seer.errors import DependencyError, InputError

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
    from trt_seer.runtime import onnx_sibling, tensorrt_unavailable_reason

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
    from trt_seer.runtime import engine_damage, onnx_sibling

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
