"""The interface every backend implements: `infer(feeds, outputs=..., out=...) -> {output name:
array}`, an async variant returning a `Pending`, `close()` and use as a context manager; and
`CallGate`, which lets `close()` wait for the calls in flight and refuse later ones."""
from __future__ import annotations

import threading
from typing import Mapping, Sequence

import numpy as np

from trt_seer.errors import InputError
from trt_seer.runtime.io import IOSpec, select_outputs
from trt_seer.runtime.prepared import PreparedCall


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


class CallGate:
    """Counts the calls inside a model. `close()` refuses new calls at once, then waits until the
    calls already inside have left, so nothing they use is freed under them."""

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()  # `with lock` is `with cond`, entered without a Python call
        self.cond = threading.Condition(self.lock)
        self.inside = 0
        self.closed = False
        self.waiting = 0  # threads in cond.wait: only then is there anyone to notify

    def wait_for(self, predicate) -> None:
        """cond.wait_for(predicate), counted in `waiting`; call with `cond` held."""
        self.waiting += 1
        try:
            self.cond.wait_for(predicate)
        finally:
            self.waiting -= 1

    def notify(self) -> None:
        """Wakes the waiting threads, if any; call with `cond` held."""
        if self.waiting:
            self.cond.notify_all()

    def enter(self) -> None:
        """InputError once the model is closed (or closing)."""
        with self.lock:
            self.check_open()
            self.inside += 1

    def check_open(self) -> None:
        if self.closed:
            raise InputError(f"{self.name} is closed")

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1
            self.notify()

    def close(self) -> bool:
        """Closes the gate and waits for the calls inside; False if it was closed already."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            self.notify()  # wakes callers waiting for an execution context: they give up
            self.wait_for(lambda: self.inside == 0)
        return True


class Model:
    """A loaded artifact. Subclasses set `backend`, `path`, `inputs`, `outputs`, `manifest`."""

    backend = ""

    def __init__(self):
        self.inputs: tuple[IOSpec, ...] = ()
        self.outputs: tuple[IOSpec, ...] = ()
        self.manifest: dict | None = None
        self.last_gpu_ms: float | None = None  # the engine's own GPU time of the last call
        self._selections: dict[tuple, tuple[IOSpec, ...]] = {}
        self._gate = CallGate("the model")  # backends name it after their file

    @property
    def closed(self) -> bool:
        return self._gate.closed

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def selected_outputs(self, names: Sequence[str] | str | None) -> tuple[IOSpec, ...]:
        """The specs of `names` (all outputs for None); InputError naming an unknown one."""
        if names is None:
            return self.outputs
        key = (names,) if isinstance(names, str) else tuple(names)
        specs = self._selections.get(key)
        if specs is None:
            specs = select_outputs(self.outputs, key)
            if len(self._selections) < 64:  # callers use a few selections; do not grow without bound
                self._selections[key] = specs
        return specs

    def infer(self, feeds: Mapping, outputs: Sequence[str] | None = None, *, out: Mapping | None = None,
              device_outputs: bool = False) -> dict:
        """Runs one batch: numpy (or, on TensorRT, GPU tensors) in, numpy out.

        Args:
            feeds: {input name: array}.
            outputs: the output names to return (default: all); only these are copied back.
            out: {output name: array} to write results into (host numpy, or on TensorRT a GPU
                array); the returned value is a view of it with this call's shape.
            device_outputs: TensorRT only: return GPU arrays over the runtime's own output
                buffers instead of copying to the host (valid until the next call; see RUNTIME.md).
        """
        return self.infer_async(feeds, outputs=outputs, out=out, device_outputs=device_outputs).result()

    def infer_async(self, feeds: Mapping, stream=None, *, outputs: Sequence[str] | None = None,
                    out: Mapping | None = None, device_outputs: bool = False) -> Pending:
        raise NotImplementedError

    def prepare(self, shapes: Mapping, outputs: Sequence[str] | str | None = None) -> PreparedCall:
        """A call of fixed input shapes ({input name: shape}) returning `outputs` (default: all),
        checked once and then run many times with `.run(feeds)`; see prepared.py. InputError for
        shapes the model does not take."""
        self._gate.check_open()
        return PreparedCall(self, shapes, outputs)

    def close(self) -> None:
        self._gate.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {"backend": self.backend, "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs]}
