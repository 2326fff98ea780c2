"""The Python side of libtrt_seer (trt_seer.c calls these functions with the GIL held).

It only calls the public runtime API (`trt_seer.runtime.load`, `Model.infer`), so the C library
runs exactly what Python services run. Caller memory arrives as memoryviews over the C buffers
(`PyMemoryView_FromMemory`): inputs become numpy views without a copy; each output is copied once
into the caller's buffer. Dtype codes are the indices of `DTYPES` (the `trt_seer_dtype` enum).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import time
from typing import Sequence

import numpy as np

from trt_seer import errors
from trt_seer.runtime import Model, load
from trt_seer.runtime.io import validate_feeds

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")
# trt_seer_status codes, most specific class first.
STATUS = ((errors.ManifestMismatchError, 2), (errors.InputError, 1), (errors.DependencyError, 3),
          (errors.CudaError, 5), (errors.TrtSeerError, 6))
DTYPE_CODES = {np.dtype(n): i for i, n in enumerate(DTYPES) if n != "bfloat16"}
BUFFER_TOO_SMALL, INTERNAL = 4, 7
log = logging.getLogger(__name__)


class BufferTooSmall(errors.TrtSeerError):
    """An output buffer cannot hold the output."""


def status_of(exc: BaseException) -> tuple[int, str]:
    """(trt_seer_status, one-line message) for an exception raised by the functions below."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else type(exc).__name__
    if isinstance(exc, BufferTooSmall):
        return BUFFER_TOO_SMALL, message
    for cls, code in STATUS:
        if isinstance(exc, cls):
            return code, message
    return INTERNAL, f"{type(exc).__name__}: {message}"


class Handle:
    """What the C library holds for an open model: the Model and per-output facts looked up once."""

    def __init__(self, model: Model):
        self.model, self.backend = model, model.backend
        self.outputs = {s.name: s for s in model.outputs}
        self.plans: dict[tuple, tuple] = {}  # a call's checked inputs -> (its outputs' shapes, _direct)

    def close(self) -> None:
        self.model.close()


def open_model(path: str, backend: str, options_json: str) -> Handle:
    try:
        options = json.loads(options_json) if options_json else {}
    except json.JSONDecodeError as e:
        raise errors.InputError(f"options are not JSON ({e}): {options_json!r}") from e
    if not isinstance(options, dict):
        raise errors.InputError(f"options must be a JSON object, got {options_json!r}")
    check_option_types(options)
    return Handle(load(path, backend=backend or "auto", **options))


JSON_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "Path": (str,),
              "None": (type(None),)}


def check_option_types(options: dict) -> None:
    """InputError for an option whose JSON value has the wrong type ({"threads": "2"}); names
    neither backend takes are left to load(), which lists them."""
    import dataclasses

    from trt_seer.runtime.engine import EngineOptions
    from trt_seer.runtime.ort import OrtOptions

    declared = {f.name: str(f.type) for cls in (EngineOptions, OrtOptions) for f in dataclasses.fields(cls)}
    for key, value in options.items():
        if key not in declared:
            continue
        names = [t.strip() for t in declared[key].split("|")]
        allowed = tuple(t for n in names for t in JSON_TYPES.get(n, ()))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise errors.InputError(f"option {key} must be {' or '.join(names)}, got {json.dumps(value)}")


def describe(handle: Handle) -> tuple[list, list]:
    """Per input and output: (name, dtype code, shape, min_shape, max_shape, id_lo, id_hi), -1
    where unknown; a "seq" axis the model's positions bound has that bound in max_shape; [id_lo,
    id_hi) bounds a token input's values (id_hi -1: no bound)."""

    def one(spec):
        unknown = (-1,) * len(spec.shape)
        hi = spec.max_shape
        if hi is None and spec.max_positions is not None:
            hi = tuple(spec.max_positions if a == "seq" else -1 for a in spec.axes)
        elif hi is not None and spec.max_positions is not None:
            hi = tuple(min(d, spec.max_positions) if a == "seq" else d for d, a in zip(hi, spec.axes))
        lo, top = spec.id_range or (0, -1)
        return (spec.name, dtype_code(spec.dtype), tuple(spec.shape),
                tuple(spec.min_shape or unknown), tuple(hi or unknown), lo, top)

    return [one(s) for s in handle.model.inputs], [one(s) for s in handle.model.outputs]


def dtype_code(name: str) -> int:
    if name not in DTYPES:
        raise errors.UnsupportedError(f"dtype {name} has no trt_seer_dtype code")
    return DTYPES.index(name)


@functools.lru_cache(maxsize=None)
def numpy_dtype(code: int) -> np.dtype:
    try:
        return np.dtype(DTYPES[code])
    except TypeError as e:  # bfloat16: numpy has none
        raise errors.UnsupportedError(f"numpy has no {DTYPES[code]} dtype to hold this tensor") from e


def _feeds(names: Sequence[str], codes: Sequence[int], shapes: Sequence[tuple], buffers: Sequence) -> dict:
    """numpy views over the caller's memory; a broadcast zero where a buffer is None (shape queries)."""
    feeds = {}
    for name, code, shape, buf in zip(names, codes, shapes, buffers):
        if name in feeds:
            raise errors.InputError(f"input {name} is given twice")
        dtype = numpy_dtype(code)
        feeds[name] = (np.broadcast_to(np.zeros((), dtype), shape) if buf is None
                       else np.frombuffer(buf, dtype).reshape(shape))
    return feeds


def _output_specs(handle: Handle, out_names: Sequence[str | None]):
    outputs, chosen = handle.model.outputs, []
    for i, name in enumerate(out_names):
        if name is None:
            if i >= len(outputs):
                raise errors.InputError(f"output entry {i} has no name and the model has "
                                        f"{len(outputs)} outputs: {', '.join(handle.outputs)}")
            name = outputs[i].name
        spec = handle.outputs.get(name)
        if spec is None:
            raise errors.InputError(f"unknown output {name}; the model returns {', '.join(handle.outputs)}")
        chosen.append(spec)
    return chosen


def output_shapes(handle: Handle, names, codes, shapes, out_names) -> list[tuple[int, tuple]]:
    """(dtype code, shape) per requested output for these input shapes, from the model's
    description: dynamic output axes take the size of the input axis of the same name."""
    plan, _ = _plan(handle, names, codes, shapes, out_names)
    for spec, shape, _ in plan:
        if shape is None:
            raise errors.UnsupportedError(f"output {spec.name} axis {spec.shape.index(-1)} does not follow from "
                                          "the input shapes; size its buffer generously and read the shape "
                                          "trt_seer_run returns")
    return [(dtype_code(spec.dtype), shape) for spec, shape, _ in plan]


def _plan(handle: Handle, names, codes, shapes, out_names) -> tuple:
    """([(output spec, shape, bytes; None where the input shapes do not give them)], `_direct` of it)
    for a call: the inputs' names, dtypes and shapes validated (InputError) on the first call of
    each combination."""
    key = (tuple(names), tuple(codes), tuple(shapes), tuple(out_names))
    plan = handle.plans.get(key)
    if plan is None:
        model = handle.model
        validate_feeds(model.inputs, _feeds(names, codes, shapes, [None] * len(names)))
        sizes, by_name = {}, dict(zip(names, shapes))
        for spec in model.inputs:
            for axis, label in enumerate(spec.axes):
                if label is not None:
                    sizes.setdefault(label, by_name[spec.name][axis])
        plan = []
        for spec in _output_specs(handle, out_names):
            shape = _resolve(spec, sizes)
            nbytes = None if shape is None else math.prod(shape) * np.dtype(spec.dtype).itemsize
            plan.append((spec, shape, nbytes))
        plan = (plan, _direct(plan))
        if len(handle.plans) < 256:
            handle.plans[key] = plan
    return plan


def _resolve(spec, sizes: dict) -> tuple[int, ...] | None:
    dims = []
    for axis, d in enumerate(spec.shape):
        label = spec.axes[axis] if axis < len(spec.axes) else None
        if d < 0 and label not in sizes:
            return None
        dims.append(int(sizes[label]) if d < 0 else d)
    return tuple(dims)


def _too_small(name: str, dtype, shape, nbytes: int, buf) -> BufferTooSmall:
    return BufferTooSmall(f"output {name} is {np.dtype(dtype)}{list(shape)} = {nbytes} bytes; "
                          f"its buffer holds {len(buf)}")


def run(handle: Handle, names, codes, shapes, buffers, out_names, out_buffers) -> list[tuple[int, tuple]]:
    """Runs one batch computing only the requested outputs; every buffer's size is checked before
    any is written (before the run where the input shapes give the output's); copies each output
    into its buffer; returns (dtype code, shape). Where the input shapes give every output's shape,
    `infer` writes straight into the caller's buffers (`out=`): one copy, no array in between."""
    plan, direct = _plan(handle, names, codes, shapes, out_names)
    for (spec, shape, nbytes), buf in zip(plan, out_buffers):
        if nbytes is not None and nbytes > len(buf):
            raise _too_small(spec.name, spec.dtype, shape, nbytes, buf)
    feeds = _feeds(names, codes, shapes, buffers)
    if direct:
        selected, returned = direct
        out = {spec.name: np.frombuffer(buf, spec.dtype, count=math.prod(shape)).reshape(shape)
               for (spec, shape, _), buf in zip(plan, out_buffers)}
        handle.model.infer(feeds, outputs=selected, out=out)
        return returned
    outputs = handle.model.infer(feeds, outputs=[spec.name for spec, _, _ in plan])
    values = [np.ascontiguousarray(outputs[spec.name]) for spec, _, _ in plan]
    result = []
    for (spec, _, _), value, buf in zip(plan, values, out_buffers):
        if value.nbytes > len(buf):
            raise _too_small(spec.name, value.dtype, value.shape, value.nbytes, buf)
        code = DTYPE_CODES.get(value.dtype)
        if code is None:
            raise errors.UnsupportedError(f"output {spec.name} has dtype {value.dtype}, which trt_seer.h has no code for")
        result.append((code, value.shape))
    for value, buf in zip(values, out_buffers):
        np.copyto(np.frombuffer(buf, value.dtype, count=value.size).reshape(value.shape), value)
    return result


def _direct(plan: list) -> tuple:
    """(output names, the run's [(dtype code, shape)]) when every output's shape and dtype code are
    known before the run and no output is asked for twice (the caller's buffers can take the
    outputs directly); () otherwise."""
    if len({spec.name for spec, _, _ in plan}) != len(plan):
        return ()
    returned = []
    for spec, shape, _ in plan:
        code = DTYPES.index(spec.dtype) if spec.dtype in DTYPES and spec.dtype != "bfloat16" else None
        if shape is None or code is None:
            return ()
        returned.append((code, shape))
    return [spec.name for spec, _, _ in plan], returned


def prepare(handle: Handle, names, codes, shapes, out_names) -> tuple:
    """A prepared call (Model.prepare) for these input shapes and outputs, and the fixed memory the C
    library copies through: per input (address, bytes) in the caller's order, per output (name,
    dtype code, shape, address, bytes). The call's arrays keep that memory alive."""
    model = handle.model
    if len(set(names)) != len(names):
        raise errors.InputError(f"inputs name {', '.join(n for n in dict.fromkeys(names) if names.count(n) > 1)} "
                                "more than once")
    takes = {s.name: s for s in model.inputs}
    for name, code in zip(names, codes):
        if name in takes and DTYPES[code] != takes[name].dtype:
            raise errors.InputError(f"input {name} has dtype {DTYPES[code]}; the model takes {takes[name].dtype}")
    specs = _output_specs(handle, out_names)
    call = model.prepare(dict(zip(names, shapes)), outputs=[s.name for s in specs])
    ins = [(call.inputs[n].ctypes.data, call.inputs[n].nbytes) for n in names]
    outs = []
    for spec in specs:
        value = call.outputs[spec.name]
        code = DTYPE_CODES.get(value.dtype)
        if code is None:
            raise errors.UnsupportedError(f"output {spec.name} has dtype {value.dtype}, which trt_seer.h has no code for")
        outs.append((spec.name, code, value.shape, value.ctypes.data, value.nbytes))
    return call, ins, outs


def prepare_for_run(handle: Handle, names, codes, shapes, out_names) -> tuple | None:
    """`prepare` for the C library's run cache (trt_seer.c, "the run cache"): a prepared call that
    trt_seer_run may use for these inputs and outputs from now on, or None where it would not
    return what `run` returns: an output whose shape the input shapes do not give (`run` reads it
    after the run), one asked for twice, or shapes the prepared call's first run disagrees with.
    Called after a run of exactly these succeeded, which the caller has been told: a failure here
    (no GPU memory for one more execution context, ...) is logged and gives None, never an error."""
    start = time.perf_counter()
    try:
        _, direct = _plan(handle, names, codes, shapes, out_names)
        if not direct:
            log.info("trt_seer_run keeps no prepared call for %s: an output's shape follows only from the run",
                     _key_text(names, shapes, out_names))
            return None
        prepared = prepare(handle, names, codes, shapes, out_names)
    except Exception:
        log.info("trt_seer_run goes on without a prepared call for %s", _key_text(names, shapes, out_names),
                 exc_info=True)
        return None
    if [(code, tuple(shape)) for _, code, shape, _, _ in prepared[2]] != direct[1]:
        release(prepared[0])
        log.info("trt_seer_run keeps no prepared call for %s: its outputs' shapes differ from the run's",
                 _key_text(names, shapes, out_names))
        return None
    log.info("trt_seer_run keeps a prepared call for %s (made in %.1f ms)", _key_text(names, shapes, out_names),
             1e3 * (time.perf_counter() - start))
    return prepared


def _key_text(names, shapes, out_names) -> str:
    ins = ", ".join(f"{n}{list(s)}" for n, s in zip(names, shapes))
    outs = ", ".join(n if n is not None else f"#{i}" for i, n in enumerate(out_names))
    return f"inputs {ins} -> outputs {outs}"


def release(call) -> None:
    """Closes a prepared call of the run cache that trt_seer_run replaces; a failure is logged, not
    raised: the run replacing it has succeeded and written its outputs."""
    try:
        call.close()
    except Exception:
        log.info("closing a prepared call of trt_seer_run's cache failed", exc_info=True)
