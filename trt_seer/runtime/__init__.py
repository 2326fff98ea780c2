"""Loading and running what `build` produces: numpy in, dict of numpy out.

    from trt_seer.runtime import load
    with load("engines/all-MiniLM-L6-v2.fp16.engine") as m:   # or an .onnx artifact on a CPU box
        out = m.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        emb = m.infer(feeds, outputs=["sentence_embedding"])      # copies back only that output

`.engine` runs on TensorRT (engine.py, CUDA through cuda-python in cuda.py), `.onnx` on ONNX
Runtime's CPU provider (ort.py); `<name>.fp16.packed.engine` (or `.onnx`) runs batches without
padding, taking and returning what the padded model does (packed.py). No torch, transformers or
onnx is imported; TensorRT, cuda-python and onnxruntime load only when a model of theirs does. docs/RUNTIME.md is the contract for services.
"""
from __future__ import annotations

from pathlib import Path

from trt_seer.runtime.backends import engine_damage, onnx_sibling, tensorrt_unavailable_reason  # noqa: F401
from trt_seer.runtime.base import Model, Pending
from trt_seer.runtime.io import IOSpec

__all__ = ["load", "Model", "Pending", "IOSpec", "onnx_sibling", "tensorrt_unavailable_reason"]
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
    model = TensorRTModel(chosen, engine_opts) if which == "tensorrt" else OnnxRuntimeModel(chosen, ort_opts)
    if chosen.name.endswith((".packed.engine", ".packed.onnx")):  # packed tokens behind the padded interface
        from trt_seer.runtime.packed import PackedModel

        try:
            return PackedModel(model)
        except BaseException:
            model.close()  # an artifact that is not packed after all: its engine or session goes
            raise
    return model
