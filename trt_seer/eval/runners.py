"""The runners of `diff`: Polygraphy's ONNX Runtime (CPU) and TensorRT(-RTX) runners, a PyTorch
runner for the source checkpoint, and the held-out feeds they all run on.

    from trt_seer.eval.runners import eval_data, run_sides
    run_results = run_sides([candidate, reference], info, eval_data(info, target, spec))
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError
from trt_seer.eval.plan import DiffSpec, Side, Target

ONNXRT_PROVIDERS = ["cpu"]  # diff runs ONNX graphs on ONNX Runtime's CPU execution provider
TORCH_DEVICE = "cpu"


def torch_runner(info, name: str):
    """A Polygraphy runner for the checkpoint in PyTorch (FP32, on TORCH_DEVICE), with the ONNX graph's I/O."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class TorchRunner(BaseRunner):
        def activate_impl(self):
            from trt_seer.export.checkpoint import load_model, wrap

            self.module = wrap(load_model(info), info)

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for n in info.inputs:
                meta.add(n, np.int64, (None, None))  # (batch, seq)
            return meta

        def infer_impl(self, feed_dict):
            from collections import OrderedDict

            from trt_seer.export.checkpoint import torch_outputs

            start = time.perf_counter()
            outs = torch_outputs(self.module, {n: feed_dict[n] for n in info.inputs})
            self.inference_time = time.perf_counter() - start
            return OrderedDict(zip(info.outputs, outs))

        def deactivate_impl(self):
            del self.module

    return TorchRunner(name=name)


def trt_runner(side: Side):
    """Polygraphy's TensorRT runner; Polygraphy selects TensorRT-RTX by an environment variable."""
    from trt_seer.engine import trt

    if trt.load().is_rtx:
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
        import polygraphy.config

        polygraphy.config.USE_TENSORRT_RTX = True  # in case polygraphy was imported before
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(side.path))), name=side.label)


def make_runner(side: Side, info):
    if side.backend == "pytorch":
        return torch_runner(info, side.label)
    if side.backend == "tensorrt":
        return trt_runner(side)
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    return OnnxrtRunner(SessionFromOnnx(str(side.path), providers=ONNXRT_PROVIDERS), name=side.label)


def run_sides(sides: list[Side], info, batches: list[dict]):
    """Comparator.run over `sides` (in that order) -> RunResults."""
    from polygraphy.comparator import Comparator
    from polygraphy.exception import PolygraphyException

    runners = [make_runner(s, info) for s in sides]
    try:
        return Comparator.run(runners, data_loader=batches)
    except PolygraphyException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"Polygraphy could not run {', '.join(s.label for s in sides)}: {first}") from e




def backend_name(side: Side) -> str:
    """What runs a side, as reports and manifests name it: "onnxruntime CPU", "PyTorch cpu",
    "TensorRT-RTX 1.7.0 on NVIDIA H200"."""
    if side.backend == "onnxrt":
        return "onnxruntime " + "+".join(p.upper() for p in ONNXRT_PROVIDERS)
    if side.backend == "pytorch":
        return f"PyTorch {TORCH_DEVICE}"
    from trt_seer.engine import trt
    from trt_seer.runtime import cuda

    flavor = trt.load()
    return f"{'TensorRT-RTX' if flavor.is_rtx else 'TensorRT'} {flavor.version} on {cuda.device_info(0).name}"


def polygraphy_logs(verbose: bool):
    """Polygraphy's log at INFO with -v, else silent (its critical errors still raise)."""
    from polygraphy.logger import G_LOGGER

    return G_LOGGER.verbosity(G_LOGGER.INFO if verbose else G_LOGGER.CRITICAL)


# --- held-out feeds ----------------------------------------------------------------------------

def eval_data(info, target: Target, spec: DiffSpec) -> list[dict]:
    """Held-out batches, within the engine's shape profile when the target is an engine."""
    from trt_seer import data
    from trt_seer.eval.evaluate import EvalSpec, eval_batches

    profile = (target.data.get("profiles") or [None])[0]
    if profile is None:
        ev = EvalSpec(samples=spec.samples)
    else:
        ev = EvalSpec(samples=spec.samples, batch=min(16, profile["batch"][2]), max_seq=min(256, profile["seq"][2]))
    if spec.data is None:
        batches = eval_batches(info, ev)
    elif not data.has_tokenizer(info):
        raise InputError(f"--data needs the model's tokenizer.json; {info.path} has none")
    else:
        batches = eval_batches(info, ev, data.load_texts(Path(spec.data), spec.text_field))
    return batches if profile is None else fit_profile(batches, profile)


def fit_profile(batches: list[dict], profile: dict) -> list[dict]:
    """Feeds cut to the profile's max batch and seq, padded (mask 0) to its min seq; batches
    smaller than its min batch are dropped."""
    (b_lo, _, b_hi), (s_lo, _, s_hi) = profile["batch"], profile["seq"]
    out = []
    for feeds in batches:
        feeds = {k: v[:b_hi, :s_hi] for k, v in feeds.items()}  # (batch, seq)
        rows, seq = next(iter(feeds.values())).shape
        if seq < s_lo:
            feeds = {k: np.pad(v, ((0, 0), (0, s_lo - seq))) for k, v in feeds.items()}
        if rows >= b_lo:
            out.append(feeds)
    if not out:
        raise InputError(f"no held-out batch fits the engine's profile {profile}")
    return out
