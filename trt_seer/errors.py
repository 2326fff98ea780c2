"""The project's exceptions. The CLI turns each into one line on stderr and its exit code.

Exit codes of every command: 0 success, 1 a check failed, 2 bad input, 3 not verified (a check
that could not run here), 4 internal error (a bug: any exception that is not one of these), 5 a
resource failed at run time (a CUDA error: out of memory, a lost device), 130 interrupted.
"""

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_VERIFIED = 3
EXIT_INTERNAL = 4
EXIT_RESOURCE = 5
EXIT_INTERRUPTED = 130


class TrtSeerError(Exception):
    """Base class. `exit_code` is what the CLI returns."""

    exit_code = EXIT_CHECK_FAILED


class InputError(TrtSeerError):
    """Bad user input: a missing model, a malformed option, unreadable data. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class UnsupportedError(InputError):
    """An architecture, task or TensorRT feature this build does not support. Exit code 2."""


class DependencyError(TrtSeerError):
    """An optional dependency (TensorRT, cuda-python, ...) is missing. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class ExportMismatchError(TrtSeerError):
    """The exported ONNX graph disagrees with PyTorch beyond tolerance. Exit code 1."""


class AccuracyGateError(TrtSeerError):
    """A reduced-precision artifact failed its accuracy gate. Exit code 1."""


class TrainingDivergedError(TrtSeerError):
    """Fine-tuning produced a non-finite loss; no checkpoint is written. Exit code 1."""


class BuildError(TrtSeerError):
    """TensorRT failed to parse or build. Exit code 1."""


class ManifestMismatchError(InputError):
    """An engine's manifest does not match this runtime (flavor, version, GPU). Exit code 2."""


class CudaError(TrtSeerError):
    """A CUDA runtime call failed; `name` is CUDA's error name (cudaErrorMemoryAllocation, ...).
    Exit code 5: the GPU's resources failed the run, no check did (nor is it a bug of ours)."""

    exit_code = EXIT_RESOURCE

    def __init__(self, message: str, code: int = -1, name: str = ""):
        super().__init__(message)
        self.code = code
        self.name = name
