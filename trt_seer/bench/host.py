"""What this machine offers `bench`: CPU, GPU (as PyTorch and as the engine runtime see it),
BF16 and quantized-CPU support, ONNX Runtime and TensorRT versions."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Host:
    cpu: str
    cores: int
    gpu: str | None  # "NVIDIA H200", as PyTorch or the engine runtime sees it
    torch_gpu_reason: str | None  # why PyTorch cannot use a GPU here; None when it can
    bf16: bool
    torch_int8: bool
    onnxruntime: str | None  # version
    tensorrt: dict | None  # {"flavor", "version"} when a flavor imports
    engine_reason: str | None  # why engines cannot run here; None when they can
    versions: dict
    cpu_int8_isa: str = "unknown"  # int8_isa(): what CPU INT8 speed depends on
    compile_reasons: dict = field(default_factory=dict)  # device -> why torch.compile cannot run there

    def machine(self, threads: int | None) -> dict:
        return {"cpu": self.cpu, "cores": self.cores, "threads": threads, "gpu": self.gpu,
                "cpu_int8_isa": self.cpu_int8_isa}


# CPU features that decide INT8 GEMM speed, fastest first: with VNNI (or AMX, or Arm's dot product)
# a multiply-add of INT8 pairs is one instruction; with AVX2 only it takes three.
INT8_ISA_FLAGS = (("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"),
                  ("avx512bw", "AVX-512BW"), ("avx2", "AVX2"), ("i8mm", "Arm I8MM"), ("asimddp", "Arm dot product"))
DOT_PRODUCT_FLAGS = frozenset({"amx_int8", "avx512_vnni", "avx_vnni", "i8mm", "asimddp"})


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what platform reports."""
    cpuinfo = Path("/proc/cpuinfo")  # Linux; platform.processor() names it elsewhere
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str) -> set[str] | None:
    """The feature flags of /proc/cpuinfo's text ("flags" on x86, "Features" on Arm), or None."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def int8_isa(flags: set[str] | None) -> str:
    """'AVX-512 VNNI, AVX-512BW, AVX2', or the same with '(no VNNI ...)' when no INT8 dot-product
    instruction is there; 'unknown' without flags (not Linux)."""
    if flags is None:
        return "unknown (no /proc/cpuinfo flags)"
    found = ", ".join(name for flag, name in INT8_ISA_FLAGS if flag in flags) or "none of " + ", ".join(
        name for _, name in INT8_ISA_FLAGS)
    if flags & DOT_PRODUCT_FLAGS:
        return found
    return f"{found} (no VNNI/AMX: each INT8 multiply-add takes several instructions)"


def cpu_int8_isa() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    return int8_isa(cpu_flags(cpuinfo.read_text()) if cpuinfo.is_file() else None)


def machine_text(gpu: str | None = None) -> str:
    """One line for a BENCHMARKS.md header: CPU and cores, GPU (when given), OS and Python."""
    where = f"; {gpu}" if gpu else ""
    return (f"{cpu_name()}, {os.cpu_count()} cores{where}; {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def engine_gpu_text() -> str | None:
    """The GPU engines run on and the TensorRT that runs them ("NVIDIA H200, tensorrt_rtx 1.7.1.116") for a
    BENCHMARKS.md header; None where no GPU is visible."""
    flavor, gpu, _ = _engine_facts()
    if gpu is None:
        return None
    return f"{gpu}, {flavor['flavor']} {flavor['version']}" if flavor else gpu


def _torch_gpu() -> tuple[str | None, str | None, bool]:
    """(GPU name, why PyTorch has no GPU or None, BF16 support)."""
    import torch

    if not torch.cuda.is_available():
        return None, f"no CUDA GPU visible to PyTorch {torch.__version__} (torch.cuda.is_available() is False)", False
    return torch.cuda.get_device_name(0), None, bool(torch.cuda.is_bf16_supported())


def _engine_facts() -> tuple[dict | None, str | None, str | None]:
    """(TensorRT flavor, GPU name as cuda-python sees it, why engines cannot run here or None)."""
    from trt_seer import runtime
    from trt_seer.engine import trt
    from trt_seer.runtime import cuda

    flavor = trt.load().describe() if trt.available() else None
    gpu = None if cuda.gpu_unavailable_reason() else cuda.device_info(0).name
    return flavor, gpu, runtime.tensorrt_unavailable_reason()


def compile_reasons() -> dict:
    """{"cpu": why torch.compile cannot run on the CPU, "cuda": ... on the GPU}; only the devices where it
    cannot. TorchInductor writes C++ kernels on the CPU (a C++ compiler) and Triton ones on the GPU."""
    import importlib.util
    import shutil

    import torch

    if not hasattr(torch, "compile"):
        reason = f"PyTorch {torch.__version__} has no torch.compile"
        return {"cpu": reason, "cuda": reason}
    reasons = {}
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++")):
        reasons["cpu"] = "no C++ compiler for TorchInductor's CPU kernels (install g++ or set CXX)"
    if importlib.util.find_spec("triton") is None:
        reasons["cuda"] = "triton is not installed (TorchInductor's GPU kernels need it)"
    return reasons


def _versions() -> dict:
    import importlib.util

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if importlib.util.find_spec("onnxruntime"):
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    return out


def probe_host() -> Host:
    """What this machine offers; imports torch (and TensorRT, if installed) but starts no work."""
    import torch

    torch_gpu, torch_reason, bf16 = _torch_gpu()
    flavor, engine_gpu, engine_reason = _engine_facts()
    versions = _versions()
    if flavor:
        versions[flavor["flavor"]] = flavor["version"]
    quant = {"fbgemm", "x86", "qnnpack", "onednn"} & set(torch.backends.quantized.supported_engines)
    return Host(cpu_name(), os.cpu_count() or 1, torch_gpu or engine_gpu, torch_reason, bf16, bool(quant),
                versions.get("onnxruntime"), flavor, engine_reason, versions, cpu_int8_isa(), compile_reasons())
