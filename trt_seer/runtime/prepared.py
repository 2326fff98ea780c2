"""A prepared call: input shapes and outputs fixed once, then run many times.

    shapes = {name: (1, 128) for name in model.input_names}
    with model.prepare(shapes, outputs=["sentence_embedding"]) as call:
        for feeds in requests:                # host numpy arrays of exactly those shapes
            vector = call.run(feeds)["sentence_embedding"].copy()

`prepare()` checks names, dtypes, shapes and the engine's profile once; `run(feeds)` then only
checks that each feed has the prepared shape and dtype, copies it into `inputs`, and runs. The
arrays `run()` returns are the call's `outputs`, overwritten by its next run: copy what you keep.
Writing `call.inputs[name][...]` directly and calling `run()` with no feeds skips that copy too;
`inputs` and `outputs` stay at the same addresses for the call's life (the C ABI relies on it).

`PreparedCall` works on any backend by calling `infer` and copying the results into its own output
arrays, whose shapes it learns at prepare() from one run on zeros. The TensorRT backend's `EnginePreparedCall`
owns an execution context of its own (stream, pinned staging and output buffers, created at
prepare() and freed by close(), by the model's close() or when the call is collected), so its run is
one copy in, the engine, one copy out per returned output and a wait: no pool, no full feed check,
no array allocated. One thread at a time may run a prepared call; prepare one per thread for more.
"""
from __future__ import annotations

import threading
from typing import Mapping, Sequence

import numpy as np

from trt_seer.errors import InputError, UnsupportedError
from trt_seer.runtime.io import check_shapes, check_values


class PreparedCall:
    """A backend-neutral prepared call; see the module docstring."""

    def __init__(self, model, shapes: Mapping, outputs: Sequence[str] | str | None = None):
        self.model = model
        self.selected = model.selected_outputs(outputs)
        self.shapes = check_shapes(model.inputs, shapes)  # in the model's input order
        self._names = [s.name for s in self.selected]
        self._busy = threading.Lock()
        self._closed = False
        self.inputs, self.outputs = self._places()
        self._staging = tuple(self.inputs.items())
        self._ranged = tuple((i, s) for i, s in enumerate(model.inputs) if s.id_range is not None)

    def _places(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Where feeds are staged (one array per input, in the model's input order) and where each
        returned output is written; here, output shapes come from one run on zeros."""
        inputs = {s.name: np.zeros(shape, s.dtype) for s, shape in zip(self.model.inputs, self.shapes)}
        first = self.model.infer(inputs, outputs=self._names)
        return inputs, {name: np.empty_like(value) for name, value in first.items()}

    def run(self, feeds: Mapping | None = None) -> dict[str, np.ndarray]:
        """Copies `feeds` (if given) into `inputs` and runs; {output name: array} of the outputs
        asked for at prepare(), overwritten by the next run. InputError for feeds of other names,
        shapes or dtypes, and once this call or its model is closed."""
        if not self._busy.acquire(blocking=False):
            raise InputError("this prepared call is running in another thread; prepare one call per thread")
        try:
            if self._closed:
                raise InputError("this prepared call is closed")
            return self._run(feeds)
        finally:
            self._busy.release()

    def _stage(self, feeds: Mapping) -> None:
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        if len(feeds) != len(self._staging):
            self._check_names(feeds)
        values = [feeds.get(name) for name, _ in self._staging]
        for (name, place), value in zip(self._staging, values):  # all checked before any is copied
            if ((type(value) is not np.ndarray and not isinstance(value, np.ndarray)) or value.shape != place.shape
                    or (value.dtype is not place.dtype and value.dtype.name != place.dtype.name)):
                raise InputError(self._mismatch(name, value, place))  # (another byte order is copied)
        for i, spec in self._ranged:
            check_values(spec, values[i])
        for (_, place), value in zip(self._staging, values):
            place[...] = value

    def _check_names(self, feeds: Mapping) -> None:
        names = [n for n, _ in self._staging]
        missing, unknown = [n for n in names if n not in feeds], sorted(str(n) for n in feeds if n not in names)
        problems = ([f"missing input(s) {', '.join(missing)}"] if missing else []) + (
            [f"unknown input(s) {', '.join(unknown)}"] if unknown else [])
        raise InputError(f"{'; '.join(problems)}; this call was prepared for {', '.join(names)}")

    @staticmethod
    def _mismatch(name: str, value, place: np.ndarray) -> str:
        wanted = f"{list(place.shape)} {place.dtype.name}"
        if value is None:
            return f"missing input {name}; this call was prepared for {wanted}"
        if not isinstance(value, np.ndarray):
            return f"input {name} is {type(value).__name__}; a prepared call takes numpy arrays ({wanted})"
        if value.shape != place.shape:
            return (f"input {name} has shape {list(value.shape)}; this call was prepared for {list(place.shape)}: "
                    "prepare another call for these shapes, or use infer()")
        return (f"input {name} has dtype {value.dtype.name}; this call takes {place.dtype.name} "
                f"(convert with .astype(np.{place.dtype.name}))")

    def _run(self, feeds: Mapping | None) -> dict[str, np.ndarray]:
        if feeds is not None:
            self._stage(feeds)
        for name, value in self.model.infer(self.inputs, outputs=self._names).items():
            place = self.outputs[name]
            if value.shape != place.shape:
                raise UnsupportedError(f"output {name} came out {list(value.shape)} after {list(place.shape)} for "
                                       "the same input shapes; prepared calls need outputs whose shapes follow "
                                       "from the input shapes: use infer()")
            place[...] = value
        return dict(self.outputs)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Waits for a run in flight in another thread; later runs raise InputError. Idempotent."""
        with self._busy:
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
