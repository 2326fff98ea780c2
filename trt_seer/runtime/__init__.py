"""Loading and running what `build` produces: numpy in, dict of numpy out.

    from trt_seer.runtime import load
    with load("engines/all-MiniLM-L6-v2.fp16.engine") as m:   # or an .onnx artifact on a CPU box
        out = m.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        emb = m.infer(feeds, outputs=["sentence_embedding"])      # copies back only that output

`.engine` runs on TensorRT (engine.py, CUDA through cuda-python in cuda.py), `.onnx` on ONNX
Runtime's CPU provider (ort.py). No torch, transformers or onnx is imported; TensorRT, cuda-python
and onnxruntime load only when a model of theirs does. docs/RUNTIME.md is the contract for services.
"""
from __future__ import annotations

import functools
from pathlib import Path

from trt_seer.errors import DependencyError, InputError, UnsupportedError
from trt_seer.runtime.base import Model, Pending
from trt_seer.runtime.io import IOSpec

__all__ = ["load", "Model", "Pending", "IOSpec", "onnx_sibling", "tensorrt_unavailable_reason"]
CPU_FORMS = {"fp32": "fp32", "fp16": "fp32", "int8": "int8", "int4": "int4"}  # engine precision -> its CPU artifact's


def onnx_sibling(engine_path: Path) -> Path:
    """The ONNX graph ONNX Runtime's CPU provider runs in an engine's place: the fast CPU form
    `build` writes beside it when there is one, else the graph the engine was built from.

    `x.int8.engine` -> `x.int8.cpu.onnx` (dynamic INT8 on the fused graph; a decoder's MatMulNBits
    form, as `x.int4.engine` -> `x.int4.cpu.onnx`), `x.fp32.engine` and
    `x.fp16.engine` -> `x.fp32.cpu.onnx` (fused FP32: faster on the CPU than the FP16-typed graph,
    which runs no faster than the plain FP32 one there, and exact); else `x.<precision>.onnx`."""
    engine_path = Path(engine_path)
    stem = engine_path.name.removesuffix(".engine")
    name, _, precision = stem.rpartition(".")
    cpu_form = CPU_FORMS.get(precision)
    cpu = engine_path.with_name(f"{name}.{cpu_form}.cpu.onnx") if name and cpu_form else None
    return cpu if cpu is not None and cpu.is_file() else engine_path.with_name(stem + ".onnx")


def tensorrt_unavailable_reason(device: int = 0) -> str | None:
    """None when a TensorRT flavor imports and runs engines on CUDA GPU `device`; else why not.
    TensorRT itself decides: a one-layer engine is built and deserialized once per process."""
    from trt_seer.engine import trt
    from trt_seer.runtime import cuda

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
    from trt_seer.runtime import cuda

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


def load(path: str | Path, backend: str = "auto", **opts) -> Model:
    """Opens an engine or ONNX artifact.

    Args:
        path: `<name>.<precision>.engine` (with its manifest beside it) or `<name>.<precision>.onnx`.
        backend: "tensorrt", "onnxruntime", or "auto": TensorRT for an engine where a TensorRT
            runtime and a GPU are usable, else the engine's sibling `.onnx` on ONNX Runtime (with a
            warning).
        opts: EngineOptions fields (device, contexts, use_cuda_graph (default: on where the flavor
            allows), max_graphs, runtime_cache, verbose) and OrtOptions fields (threads,
            optimization); each backend takes its own.
    """
    from trt_seer.runtime.backends import runnable, split_options
    from trt_seer.runtime.engine import TensorRTModel
    from trt_seer.runtime.ort import OnnxRuntimeModel

    engine_opts, ort_opts = split_options(opts)
    chosen, which = runnable(Path(path), backend, engine_opts.device, stacklevel=3)
    return TensorRTModel(chosen, engine_opts) if which == "tensorrt" else OnnxRuntimeModel(chosen, ort_opts)


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
