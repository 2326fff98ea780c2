"""TensorRT flavor adapter: the one place that imports `tensorrt` or `tensorrt_rtx`, checks
versions and features, and hides their differences.

Both flavors take the same strongly typed path: precision comes from the ONNX graph (FP16-typed
tensors, explicit Q/DQ), never from builder flags. `TRT_SEER_TENSORRT=tensorrt|tensorrt_rtx`
forces a flavor when both are installed.
"""
from __future__ import annotations

import functools
import logging
import importlib
import os
from dataclasses import dataclass
from types import ModuleType

from packaging.version import Version

from trt_seer.errors import DependencyError, UnsupportedError

FLAVORS = ("tensorrt", "tensorrt_rtx")
MIN_TENSORRT = Version("10.0")
HARDWARE_COMPAT = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-cc": "SAME_COMPUTE_CAPABILITY"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Flavor:
    """The imported TensorRT module with its name and version."""

    trt: ModuleType
    name: str
    version: Version

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"

    @property
    def has_timing_cache(self) -> bool:
        # TensorRT-RTX keeps the API but its timing cache calls are no-ops; it caches JIT kernels
        # in a runtime cache at execution time instead.
        return not self.is_rtx

    @property
    def has_progress_monitor(self) -> bool:
        return hasattr(self.trt, "IProgressMonitor")

    @property
    def has_implicit_int8(self) -> bool:
        """Legacy calibrator API (TensorRT <= 10); removed in TensorRT 11 and absent in RTX."""
        return hasattr(self.trt, "IInt8EntropyCalibrator2") and hasattr(self.trt.BuilderFlag, "INT8")

    @property
    def has_runtime_cache(self) -> bool:
        """TensorRT-RTX's on-disk cache of JIT-compiled kernels (IRuntimeConfig/IRuntimeCache)."""
        return hasattr(self.trt, "IRuntimeCache") and hasattr(self.trt, "IRuntimeConfig")

    def describe(self) -> dict:
        return {"flavor": self.name, "version": str(self.version)}


def _import(name: str) -> Flavor:
    trt = importlib.import_module(name)
    version = Version(trt.__version__)
    if name == "tensorrt" and version < MIN_TENSORRT:
        raise UnsupportedError(f"TensorRT {version} is too old; trt_seer needs >= {MIN_TENSORRT} "
                               "(strongly typed networks)")
    return Flavor(trt, name, version)


@functools.lru_cache(maxsize=None)
def load(prefer: str | None = None) -> Flavor:
    """Imports `tensorrt` if present, else `tensorrt_rtx`. DependencyError when neither is."""
    prefer = prefer or os.environ.get("TRT_SEER_TENSORRT") or None
    order = [prefer] if prefer else list(FLAVORS)
    errors = []
    for name in order:
        if name not in FLAVORS:
            raise UnsupportedError(f"unknown TensorRT flavor {name!r}; choose one of {FLAVORS}")
        try:
            return _import(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # installed but broken (a missing library): that is the news
                errors.append(f"{name}: {e}")
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise DependencyError(missing_tensorrt_message(prefer, errors))


GPU_INSTALL = {"tensorrt_rtx": 'pip install "trt-seer[rtx,gpu]"',  # [gpu]: TensorRT-RTX + cuda-python
               "tensorrt": 'pip install "trt-seer[tensorrt]" "cuda-python>=12.6"'}
CPU_INSTALL = {"tensorrt_rtx": '"trt-seer[rtx]"', "tensorrt": '"trt-seer[tensorrt]"'}


def missing_tensorrt_message(prefer: str | None, errors: list[str]) -> str:
    """One line: which TensorRT is missing and the install line that adds it (with cuda-python,
    which a GPU machine needs to run engines), or `export` for ONNX alone."""
    flavor = prefer or "tensorrt_rtx"
    what = f"{prefer} (TRT_SEER_TENSORRT) is" if prefer else "TensorRT (tensorrt_rtx or tensorrt) is"
    broken = f" ({'; '.join(errors)})" if errors else ""
    return (f"{what} not installed{broken}; on a GPU machine: {GPU_INSTALL[flavor]} "
            f"(on a machine without a GPU, {CPU_INSTALL[flavor]} builds engines for a GPU one); "
            "for ONNX alone: trt-seer export")


def available() -> bool:
    """True if some TensorRT flavor imports; never raises."""
    try:
        load()
    except (DependencyError, UnsupportedError):
        return False
    return True


def logger(flavor: Flavor, verbose: bool = False):
    """A TensorRT logger that keeps the errors, so a failed build can say why in one line, and
    passes TensorRT's messages to the `trt_seer.tensorrt` logger: errors and warnings at their level,
    INFO and VERBOSE at DEBUG and only when `verbose` (the builder's VERBOSE log is large). Whether
    and where they show is the application's choice (the CLI shows WARNING, DEBUG with -v)."""
    trt = flavor.trt
    severity = trt.ILogger.Severity
    threshold = severity.VERBOSE if verbose else severity.WARNING
    levels = {severity.INTERNAL_ERROR: logging.CRITICAL, severity.ERROR: logging.ERROR, severity.WARNING: logging.WARNING}
    out = logging.getLogger("trt_seer.tensorrt")

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self.cancelled = lambda: False  # once a build is cancelled, its teardown's errors are not news

        def log(self, sev, msg):
            if sev <= severity.ERROR:
                self.errors.append(msg)
            if self.cancelled() or "BuildCanceled" in msg or (sev == severity.WARNING and known_harmless(msg)):
                out.debug("[TensorRT] %s: %s", sev.name, msg)  # Ctrl-C: the CLI says "interrupted"
            elif sev <= threshold:
                out.log(levels.get(sev, logging.DEBUG), "[TensorRT] %s: %s", sev.name, msg)

    return _Logger()


# Builder warnings every build of ours gets, about nothing the user can or should change: the
# parser's reminder that token-id inputs are int64 (they are, by design: runtime/io.py feeds int64).
HARMLESS_WARNINGS = ("has Int64 binding",)


def known_harmless(message: str) -> bool:
    """Whether a TensorRT warning is one of HARMLESS_WARNINGS (said at DEBUG instead)."""
    return any(text in message for text in HARMLESS_WARNINGS)


def strongly_typed_network(flavor: Flavor, builder):
    flags = 1 << int(flavor.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def parse_compute_capability(text: str) -> str:
    """'7.5' / '75' / 'sm75' -> 'SM75' (the enum member name)."""
    digits = text.lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
    if not digits.isdigit() or len(digits) not in (2, 3):
        raise UnsupportedError(f"malformed compute capability {text!r}; use e.g. 7.5 or 8.6")
    return f"SM{digits}"


def check_targets(flavor: Flavor, compute_caps: tuple[str, ...]) -> list[str]:
    """The enum names of `compute_caps`; UnsupportedError (exit 2) for one this flavor cannot
    target, so a build refuses it before any work rather than at the engine stage."""
    if not compute_caps:
        return []
    if not hasattr(flavor.trt, "ComputeCapability"):
        raise UnsupportedError(f"{flavor.name} {flavor.version} cannot target compute capabilities; "
                               "use --hardware-compat with full TensorRT")
    names = [parse_compute_capability(c) for c in compute_caps]
    unknown = [n for n in names if not hasattr(flavor.trt.ComputeCapability, n)]
    if unknown:
        known = [m for m in dir(flavor.trt.ComputeCapability) if m.startswith("SM")]
        raise UnsupportedError(f"{flavor.name} cannot target {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def set_targets(flavor: Flavor, config, hardware_compat: str | None, compute_caps: tuple[str, ...]):
    """Applies target GPUs. Returns the manifest's `targets` section."""
    trt = flavor.trt
    names = check_targets(flavor, compute_caps)
    if compute_caps:
        config.num_compute_capabilities = len(names)
        for i, n in enumerate(names):
            config.set_compute_capability(getattr(trt.ComputeCapability, n), i)
    if hardware_compat:
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel,
                                                      HARDWARE_COMPAT[hardware_compat])
    return target_description(flavor, hardware_compat, compute_caps)


def target_description(flavor: Flavor, hardware_compat: str | None, compute_caps: tuple[str, ...]) -> dict:
    caps = [f"{n[2:-1]}.{n[-1]}" for n in (parse_compute_capability(c) for c in compute_caps)]
    if caps:
        mode = "listed"
    elif hardware_compat in ("ampere+",) or (flavor.is_rtx and not hardware_compat):
        mode = "ampere+"  # TensorRT-RTX's default: portable across Ampere and newer
    elif hardware_compat == "same-cc":
        mode = "same-cc"
    else:
        mode = "build-gpu"
    return {"mode": mode, "compute_capabilities": caps}


NEEDS_BUILD_GPU = ("build-gpu", "same-cc")  # target modes that tie an engine to the build GPU's cc
_CUDART = ("cuda.bindings.runtime", "cuda.cudart")  # cuda-python >= 12.8, then older


def _cudart_gpu() -> dict | None:
    """Device 0 through cuda-python: {"name", "compute_capability"}, None without a GPU."""
    for name in _CUDART:
        try:
            rt = importlib.import_module(name)
        except ImportError:
            continue
        err, count = rt.cudaGetDeviceCount()
        if int(err) != 0 or count < 1:
            return None
        err, prop = rt.cudaGetDeviceProperties(0)
        if int(err) != 0:
            return None
        gpu = prop.name.split(b"\0", 1)[0].decode() if isinstance(prop.name, bytes) else str(prop.name)
        return {"name": gpu, "compute_capability": f"{prop.major}.{prop.minor}"}
    raise ImportError("cuda-python is not installed")


@functools.lru_cache(maxsize=None)
def build_gpu() -> dict | None:
    """The GPU the builder runs on (CUDA device 0): {"name", "compute_capability": "8.9"}, or None
    on a machine without one (TensorRT-RTX builds on CPU). Asks cuda-python, else torch."""
    try:
        return _cudart_gpu()
    except ImportError as e:  # no cuda-python: torch, which every export needs, can tell as well
        log.debug("no cuda-python (%s); asking torch for the build GPU", e)
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}


def with_build_gpu(targets: dict, gpu: dict | None) -> dict:
    """`targets` plus the build GPU's compute capability (None without a GPU). UnsupportedError for
    a target mode that needs the build GPU when there is none."""
    cc = gpu["compute_capability"] if gpu else None
    if cc is None and targets.get("mode") in NEEDS_BUILD_GPU:
        raise UnsupportedError(f"target {targets['mode']!r} ties the engine to the build GPU, but no CUDA GPU is "
                               "visible here; build on the target GPU or pass --compute-capability / "
                               "--hardware-compat ampere+")
    return {**targets, "build_compute_capability": cc}


def build_gpu_mismatch(targets: dict, device_cc: tuple[int, int], gpu: str = "this GPU") -> str | None:
    """Why an engine tied to its build GPU ("build-gpu", "same-cc") cannot run on `device_cc`: a
    manifest without the build GPU's compute capability, or another one; None when it can."""
    mode, build_cc = targets.get("mode"), targets.get("build_compute_capability")
    if mode not in NEEDS_BUILD_GPU:
        return None
    if build_cc is None:
        return f"targets the build GPU ({mode}) but its manifest records no build compute capability; rebuild the engine"
    if target_allows(targets, device_cc, build_cc):
        return None
    return (f"was built for the compute capability {build_cc} of its build GPU ({mode}); {gpu} is "
            f"{device_cc[0]}.{device_cc[1]}: rebuild it on this GPU")


def target_allows(targets: dict, device_cc: tuple[int, int], build_cc: str | None = None) -> bool:
    """Whether an engine built for `targets` may run on a GPU of compute capability `device_cc`.
    "build-gpu" and "same-cc" engines need the build GPU's `build_cc`; without it they run nowhere."""
    dev = Version(f"{device_cc[0]}.{device_cc[1]}")
    mode = targets.get("mode")
    if mode == "listed":
        return str(dev) in targets.get("compute_capabilities", [])
    if mode == "ampere+":
        return dev >= Version("8.0")
    if build_cc is None:
        return False
    return dev.release[:2] == Version(build_cc).release[:2]


def engine_version_compatible(flavor_name: str, built: str, installed: str | Version,
                              version_compatible: bool = False) -> bool:
    """Whether an engine serialized by release `built` deserializes in release `installed` of the
    same flavor: only the same release (major.minor.patch), except TensorRT engines built with the
    version-compatible flag, which also load in later releases."""
    b, i = Version(str(built)), Version(str(installed))
    if version_compatible and flavor_name == "tensorrt":
        return i >= b
    return b.release[:3] == i.release[:3]


def make_progress_monitor(flavor: Flavor, cancelled=lambda: False):
    """A TensorRT progress monitor that draws tqdm bars and stops the build once `cancelled()` is
    true, or None where the flavor has none."""
    if not flavor.has_progress_monitor:
        return None
    from tqdm import tqdm

    class _Bars(flavor.trt.IProgressMonitor):
        """One bar for the outermost phase; nested phases only name the current step."""

        def __init__(self):
            flavor.trt.IProgressMonitor.__init__(self)
            self._top, self._bar = None, None

        def phase_start(self, phase_name, parent_phase, num_steps):
            if self._bar is None:
                self._top = phase_name
                self._bar = tqdm(total=num_steps, desc=phase_name, unit="step", leave=False,
                                 dynamic_ncols=True)
            else:  # drawn at most every mininterval: a build starts thousands of nested phases
                self._bar.set_postfix_str(phase_name, refresh=False)
                self._bar.update(0)

        def step_complete(self, phase_name, step):
            if self._bar is not None and phase_name == self._top:
                self._bar.update(step + 1 - self._bar.n)
            return not cancelled()  # False makes TensorRT abandon the build

        def phase_finish(self, phase_name):
            if phase_name == self._top and self._bar is not None:
                self._bar.close()
                self._top, self._bar = None, None

    return _Bars()
