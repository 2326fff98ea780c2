"""What `diff` compares: the target named on the command line (engine manifest, ONNX record or
.onnx file), the reference it is compared with, and which candidates can run here.

    from trt_seer.eval.plan import plan, resolve_target
    target = resolve_target(Path("engines/all-MiniLM-L6-v2.fp16.manifest.json"))
    reference, candidates, not_run = plan(target, "fp32")
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_seer.engine import manifest
from trt_seer.errors import InputError

PRECISIONS = ("fp32", "fp16", "int8")  # most to least precise
AGAINST = ("fp32", "pytorch", "fp16")


@dataclass(frozen=True)
class Target:
    """The artifact under test, named by an engine manifest, an ONNX record or an .onnx file."""

    path: Path
    kind: str  # "engine" | "onnx"
    name: str
    precision: str
    record: Path | None  # the manifest / record that receives the results (None for a bare .onnx)
    data: dict  # its contents ({} when there is none)
    cpu: bool = False  # an ONNX Runtime CPU form (`<name>.<precision>.cpu.onnx`)

    def artifact(self, suffix: str) -> Path:
        return self.path.parent / f"{self.name}.{suffix}"


@dataclass(frozen=True)
class DiffSpec:
    against: str | None = None  # None: PyTorch for an FP32 ONNX, else the FP32 ONNX
    samples: int = 128
    data: Path | None = None  # held-out text (default: calib/heldout.txt)
    text_field: str = "text"
    atol: tuple[tuple[str, float], ...] = ()  # ("", v) applies to every output
    rtol: tuple[tuple[str, float], ...] = ()
    model: Path | None = None  # checkpoint override (default: manifest["source"]["checkpoint"])
    task: str | None = None
    layers: bool | None = None  # per-layer error profile (default: for INT8 candidates)
    verbose: bool = False


@dataclass(frozen=True)
class Side:
    """One runner of the comparison."""

    label: str  # runner name: "pytorch-fp32", "onnxrt-fp16", "tensorrt-fp16"
    backend: str  # "pytorch" | "onnxrt" | "tensorrt"
    precision: str
    path: Path | None = None


def _split_name(path: Path, suffix: str) -> tuple[str, str, bool]:
    """(name, precision, cpu) of `<name>.<precision>[.cpu]<suffix>`."""
    stem = path.name.removesuffix(suffix)
    cpu = suffix != ".manifest.json" and stem.endswith(".cpu")
    name, _, precision = stem.removesuffix(".cpu" if cpu else "").rpartition(".")
    if not name or precision not in PRECISIONS:
        raise InputError(f"cannot tell name and precision from {path.name}; expected "
                         f"<name>.<{'|'.join(PRECISIONS)}>[.cpu]{suffix}")
    return name, precision, cpu


def resolve_target(path: Path) -> Target:
    """Reads the manifest / record named by `path` (InputError if missing or malformed)."""
    path = Path(path)
    if path.name.endswith(".manifest.json"):
        data = manifest.read_engine_manifest(path)
        name, precision, _ = _split_name(path, ".manifest.json")
        return Target(path, "engine", name, precision, path, data)
    if path.name.endswith(".onnx.json"):
        data = manifest.read(path)
        name, precision, cpu = _split_name(path, ".onnx.json")
        return Target(path, "onnx", name, precision, path, data, cpu)
    if path.suffix == ".onnx":
        if not path.is_file():
            raise InputError(f"no such artifact: {path}")
        data = manifest.read_if_exists(manifest.record_path(path)) or {}
        name, precision, cpu = _split_name(path, ".onnx")
        return Target(path, "onnx", name, precision, None, data, cpu)
    raise InputError(f"{path} is neither an engine manifest (*.manifest.json), an ONNX record "
                     "(*.onnx.json) nor an .onnx file")


def model_info(target: Target, spec: DiffSpec):
    """The checkpoint (for PyTorch and the tokenizer) and the task."""
    from trt_seer.export.families import resolve_model

    ckpt = spec.model or target.data.get("source", {}).get("checkpoint")
    if not ckpt:
        raise InputError(f"{target.path.name} records no source checkpoint; pass --model DIR")
    return resolve_model(Path(ckpt), spec.task or target.data.get("task"))


def default_against(target: Target) -> str:
    return "pytorch" if target.kind == "onnx" and target.precision == "fp32" else "fp32"


def _onnx_side(target: Target, precision: str, cpu: bool = False) -> Side:
    form = ".cpu" if cpu else ""
    path = target.artifact(f"{precision}{form}.onnx")
    if not path.is_file():
        hint = "trt-seer export --fp16" if precision != "int8" else "trt-seer build --int8"
        raise InputError(f"no such artifact: {path} (make it with `{hint}`)")
    return Side(f"onnxrt-{precision}{'-cpu' if cpu else ''}", "onnxrt", precision, path)


def _cpu_fallback_side(target: Target) -> Side | None:
    """For an engine: the CPU form ONNX Runtime runs in its place (runtime.onnx_sibling), if `build`
    wrote one; it is compared too, since it is what answers where the engine cannot run."""
    from trt_seer.runtime import onnx_sibling

    path = onnx_sibling(target.artifact(f"{target.precision}.engine"))
    if not path.name.endswith(".cpu.onnx"):
        return None
    precision = path.name.removesuffix(".cpu.onnx").rpartition(".")[2]
    return Side(f"onnxrt-{precision}-cpu", "onnxrt", precision, path)


def reference_side(target: Target, against: str) -> Side:
    if against not in AGAINST:
        raise InputError(f"unknown --against {against!r}; choose one of {', '.join(AGAINST)}")
    if against == "pytorch":
        return Side("pytorch-fp32", "pytorch", "fp32")
    return _onnx_side(target, against)


def plan(target: Target, against: str) -> tuple[Side, list[Side], list[dict]]:
    """(reference, candidates, not_run): every comparison asked for, the target's ONNX graph always
    and its engine for an engine manifest; those that cannot run here come back in `not_run` with
    the reason ({"comparison", "reason"}) and leave the result "not verified"."""
    ref = reference_side(target, against)
    cands, not_run = [], []
    onnx_path = target.artifact(f"{target.precision}.onnx")
    if target.kind == "onnx" or onnx_path.is_file():
        cand = _onnx_side(target, target.precision, target.cpu)  # a missing ONNX target is an input error
        if cand.path != ref.path:
            cands.append(cand)
    else:
        not_run.append({"comparison": f"onnxrt-{target.precision} vs {ref.label}",
                        "reason": f"{onnx_path.name} not found beside the engine"})
    if target.kind == "engine":
        cpu = _cpu_fallback_side(target)
        if cpu is not None and cpu.path != ref.path:
            cands.append(cpu)
        engine = _engine_side(target)
        reason = engine_unavailable_reason(target.data)
        if reason:
            not_run.append({"comparison": f"{engine.label} vs {ref.label}", "reason": reason})
        else:
            cands.append(engine)
    if not cands and not not_run:
        raise InputError(f"{target.path.name} is the --against {against} reference itself; choose another --against")
    return ref, cands, not_run


def _engine_side(target: Target) -> Side:
    path = target.path.parent / target.data["engine"].get("file", f"{target.name}.{target.precision}.engine")
    if not path.is_file():
        raise InputError(f"no such artifact: {path} (rebuild it with `trt-seer build`)")
    return Side(f"tensorrt-{target.precision}", "tensorrt", target.precision, path)


def engine_unavailable_reason(engine_manifest: dict) -> str | None:
    """Why this engine cannot run here, or None: the runtime's own answers (TensorRT importable
    and driving GPU 0, then the manifest's flavor, release and targets against them)."""
    from trt_seer import runtime
    from trt_seer.engine import trt
    from trt_seer.errors import ManifestMismatchError
    from trt_seer.runtime import cuda
    from trt_seer.runtime.loader import check_manifest

    reason = runtime.tensorrt_unavailable_reason()
    if reason:
        return reason
    gpu = cuda.device_info(0)
    try:
        check_manifest(engine_manifest, trt.load().describe(), gpu.compute_capability, gpu.name)
    except ManifestMismatchError as e:
        return str(e)
    return None
