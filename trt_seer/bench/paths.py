"""The benchmark paths: every way `bench` can run a model, its row label, its artifact and why it
cannot run on a given machine."""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from trt_seer.errors import InputError


@dataclass(frozen=True)
class PathSpec:
    """One way to run the model. `title` names the method; the row label adds where it ran."""

    key: str
    backend: str  # torch | onnxruntime | tensorrt
    precision: str  # fp32 | tf32 | fp16 | bf16 | int8: what the matrix products compute in
    mode: str  # eager | autocast | half | dynamic-int8 | compile-<torch.compile mode> | onnx | onnx-cpu | engine | engine-graph
    device: str  # cpu | cuda
    title: str


PATHS = (
    PathSpec("torch-fp32-cpu", "torch", "fp32", "eager", "cpu", "PyTorch FP32 eager"),
    PathSpec("torch-int8-cpu", "torch", "int8", "dynamic-int8", "cpu", "PyTorch dynamic INT8"),
    # torch.compile on the CPU: inductor's default mode (reduce-overhead's CUDA graphs do not apply there)
    PathSpec("torch-compile-cpu", "torch", "fp32", "compile-default", "cpu", "PyTorch FP32 torch.compile"),
    PathSpec("ort-fp32-cpu", "onnxruntime", "fp32", "onnx", "cpu", "ONNX Runtime FP32"),
    PathSpec("ort-fp32fused-cpu", "onnxruntime", "fp32", "onnx-cpu", "cpu", "ONNX Runtime FP32 fused (fp32.cpu.onnx)"),
    PathSpec("ort-fp16-cpu", "onnxruntime", "fp16", "onnx", "cpu", "ONNX Runtime FP16"),
    PathSpec("ort-int8-cpu", "onnxruntime", "int8", "onnx", "cpu", "ONNX Runtime Q/DQ INT8"),
    PathSpec("ort-int8dyn-cpu", "onnxruntime", "int8", "onnx-cpu", "cpu", "ONNX Runtime dynamic INT8 fused (int8.cpu.onnx)"),
    PathSpec("torch-fp32-gpu", "torch", "fp32", "eager", "cuda", "PyTorch FP32 eager (TF32 off)"),
    PathSpec("torch-tf32-gpu", "torch", "tf32", "eager", "cuda", "PyTorch FP32 eager (TF32 on)"),
    PathSpec("torch-amp-fp16-gpu", "torch", "fp16", "autocast", "cuda", "PyTorch AMP FP16"),
    PathSpec("torch-amp-bf16-gpu", "torch", "bf16", "autocast", "cuda", "PyTorch AMP BF16"),
    PathSpec("torch-half-gpu", "torch", "fp16", "half", "cuda", "PyTorch .half() FP16"),
    PathSpec("torch-compile-ro-fp16-gpu", "torch", "fp16", "compile-reduce-overhead", "cuda",
             "PyTorch FP16 torch.compile reduce-overhead"),
    PathSpec("torch-compile-ma-fp16-gpu", "torch", "fp16", "compile-max-autotune", "cuda",
             "PyTorch FP16 torch.compile max-autotune"),
    PathSpec("trt-fp32", "tensorrt", "fp32", "engine", "cuda", "FP32"),
    PathSpec("trt-fp16", "tensorrt", "fp16", "engine", "cuda", "FP16"),
    PathSpec("trt-int8", "tensorrt", "int8", "engine", "cuda", "INT8"),
    PathSpec("trt-fp16-graph", "tensorrt", "fp16", "engine-graph", "cuda", "FP16 + CUDA graph"),
)
PATH_BY_KEY = {p.key: p for p in PATHS}
INT8_PAIRS = (("torch-int8-cpu", "torch-fp32-cpu"), ("ort-int8-cpu", "ort-fp32-cpu"),
              ("ort-int8dyn-cpu", "ort-fp32fused-cpu"), ("trt-int8", "trt-fp16"))
FLAVOR_NAMES = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT-RTX"}


def select_paths(patterns: list[str] | None) -> tuple[str, ...]:
    """Path keys matching any of `patterns` (keys or globs, comma-separated too); all by default."""
    if not patterns:
        return tuple(PATH_BY_KEY)
    wanted = [p for item in patterns for p in item.split(",") if p]
    for pattern in wanted:
        if not any(fnmatch(k, pattern) for k in PATH_BY_KEY):
            raise InputError(f"--paths {pattern!r} matches no path; known: {', '.join(PATH_BY_KEY)}")
    return tuple(k for k in PATH_BY_KEY if any(fnmatch(k, p) for p in wanted))


def short_gpu_name(name: str) -> str:
    """'NVIDIA H200' -> 'H200'; 'NVIDIA GeForce RTX 4090' -> 'GeForce RTX 4090'."""
    return name.removeprefix("NVIDIA ").strip() or name


def label(path: PathSpec, host) -> str:
    """The row name: method plus where it ran, e.g. 'TensorRT-RTX FP16 on H200'."""
    where = "CPU" if path.device == "cpu" else short_gpu_name(host.gpu) if host.gpu else "GPU"
    if path.backend == "tensorrt":
        flavor = (host.tensorrt or {}).get("flavor", "tensorrt")
        return f"{FLAVOR_NAMES.get(flavor, flavor)} {path.title} on {where}"
    return f"{path.title} on {where}"


def artifact_path(path: PathSpec, engines: Path, name: str) -> Path | None:
    if path.backend == "onnxruntime":
        cpu = ".cpu" if path.mode == "onnx-cpu" else ""  # build's CPU forms: fp32.cpu.onnx, int8.cpu.onnx
        return Path(engines) / f"{name}.{path.precision}{cpu}.onnx"
    if path.backend == "tensorrt":
        return Path(engines) / f"{name}.{path.precision}.engine"
    return None


def skip_reason(path: PathSpec, host, artifact: Path | None) -> str | None:
    """Why `path` cannot run on `host` (a bench.host.Host; all reasons, '; '-joined), or None."""
    reasons = []
    if path.backend == "torch" and path.device == "cuda" and host.torch_gpu_reason:
        reasons.append(host.torch_gpu_reason)
    if path.precision == "bf16" and not host.torch_gpu_reason and not host.bf16:
        reasons.append(f"{host.gpu} has no BF16 support")
    if path.mode.startswith("compile-") and host.compile_reasons.get(path.device):
        reasons.append(host.compile_reasons[path.device])
    if path.mode == "dynamic-int8" and not host.torch_int8:
        reasons.append("this PyTorch build has no quantized CPU engine (fbgemm / x86 / qnnpack)")
    if path.backend == "onnxruntime" and not host.onnxruntime:
        reasons.append("onnxruntime is not installed")
    if path.backend == "tensorrt" and host.engine_reason:
        reasons.append(f"engines cannot run here: {host.engine_reason}")
    if artifact is not None and not artifact.is_file():
        reasons.append(f"no {artifact.name} in {artifact.parent}/ ({_how_to_make(path, artifact.parent)})")
    return "; ".join(reasons) or None


def _how_to_make(path: PathSpec, folder: Path) -> str:
    if path.backend == "tensorrt":
        return f"make it with: trt-seer build --{path.precision} --out {folder}"
    if path.precision == "int8":
        return f"make it with: trt-seer build --int8 --out {folder}"
    if path.mode == "onnx-cpu":
        return f"make it with: trt-seer export --out {folder} (encoders)"
    flag = " --fp16" if path.precision == "fp16" else ""
    return f"make it with: trt-seer export{flag} --out {folder}"
