"""The interface every backend implements: `infer(feeds) -> {output name: ndarray}`, an async
variant returning a `Pending`, `close()` and use as a context manager."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from trt_seer.runtime.io import IOSpec


class Pending:
    """The outputs of an enqueued call; `result()` waits for them (once)."""

    def result(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError


class Completed(Pending):
    """A call that finished when it was made (the CPU backend runs synchronously)."""

    def __init__(self, outputs: dict[str, np.ndarray]):
        self._outputs = outputs

    def result(self) -> dict[str, np.ndarray]:
        return self._outputs

    def done(self) -> bool:
        return True


class Model:
    """A loaded artifact. Subclasses set `backend`, `path`, `inputs`, `outputs`, `manifest`."""

    backend = ""

    def __init__(self):
        self.inputs: tuple[IOSpec, ...] = ()
        self.outputs: tuple[IOSpec, ...] = ()
        self.manifest: dict | None = None
        self.last_gpu_ms: float | None = None  # the engine's own GPU time of the last call
        self.closed = False

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def infer(self, feeds: Mapping) -> dict[str, np.ndarray]:
        """Runs one batch: numpy (or, on TensorRT, GPU tensors) in, numpy out."""
        return self.infer_async(feeds).result()

    def infer_async(self, feeds: Mapping, stream=None) -> Pending:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {"backend": self.backend, "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs]}
