"""What a model takes and returns (`IOSpec`), and the one input validation every backend runs.

Both backends call `validate_feeds` before any work of their own, so a wrong name, dtype, rank or
shape fails with the same message on TensorRT and on ONNX Runtime. Inputs may be numpy arrays or,
for the TensorRT backend, GPU tensors that expose `__cuda_array_interface__` or DLPack
(`DeviceTensor`: bound by pointer, never copied). Outputs may go to caller-provided buffers
(`validate_out`, `out_view`); TensorRT hands its device-resident outputs out as `DeviceTensor`s,
which expose `__cuda_array_interface__` (torch.as_tensor(t, device="cuda"), cupy.asarray(t)).
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from trt_seer.errors import InputError
from trt_seer.decoder_io import TOKEN_AXES

# TensorRT's DataType names (as build.py writes them) and ONNX's, to numpy's.
_DTYPE_ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp16": "float16",
                  "fp32": "float32", "int64": "int64", "int32": "int32", "int8": "int8",
                  "uint8": "uint8", "bool": "bool", "float32": "float32", "float16": "float16",
                  "bfloat16": "bfloat16", "double": "float64", "float64": "float64"}
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
              "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(bfloat16)": "bfloat16"}
DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def dtype_name(text: str) -> str:
    """'float' / 'DataType.HALF' / 'tensor(int64)' / 'int64' -> numpy's name ('float32', ...)."""
    key = str(text)
    if key in _ORT_TYPES:
        return _ORT_TYPES[key]
    key = key.split(".")[-1].lower()
    if key not in _DTYPE_ALIASES:
        raise InputError(f"unknown tensor dtype {text!r} in the model description")
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True)
class IOSpec:
    """One input or output. `shape` has -1 for dynamic axes; `axes` names them ("batch", "seq")
    so inputs that share an axis must agree on it; `min_shape`/`max_shape` bound the dynamic
    axes where a profile is known (always for engines). `id_range` [lo, hi) bounds the values of
    a token input and `max_positions` its "seq" axis, where the model says (runtime/limits.py)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...] = ()
    min_shape: tuple[int, ...] | None = None
    max_shape: tuple[int, ...] | None = None
    id_range: tuple[int, int] | None = field(default=None, compare=False)  # checks, not the description
    max_positions: int | None = field(default=None, compare=False)

    def describe(self) -> str:
        dims = ["?" if d < 0 else str(d) for d in self.shape]
        if self.axes:
            dims = [a if d < 0 and a else s for d, a, s in zip(self.shape, self.axes, dims)]
        return f"{self.name}: {self.dtype}[{', '.join(dims)}]"

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.min_shape is not None:
            d.update(min_shape=list(self.min_shape), max_shape=list(self.max_shape))
        return d


def token_axes(shape: Sequence[int]) -> tuple[str | None, ...]:
    """Dynamic axes of a token input named as the model families name them (0 batch, 1 seq)."""
    return tuple(TOKEN_AXES.get(i) if d < 0 else None for i, d in enumerate(shape))


def specs_from_description(items: Sequence[dict], profile: dict | None = None) -> tuple[IOSpec, ...]:
    """IOSpecs from a manifest's / record's io list; a {batch, seq} profile bounds the token axes."""
    specs = []
    for item in items:
        shape = tuple(int(d) for d in item["shape"])
        axes = token_axes(shape)
        lo = hi = None
        if profile and all(a is None or a in profile for a in axes):
            lo = tuple(profile[a][0] if a else d for d, a in zip(shape, axes))
            hi = tuple(profile[a][2] if a else d for d, a in zip(shape, axes))
        specs.append(IOSpec(item["name"], dtype_name(item["dtype"]), shape, axes, lo, hi))
    return tuple(specs)


@dataclass(frozen=True)
class DeviceTensor:
    """A GPU tensor bound by pointer. `device` is -1 where the exporter does not say (the engine
    asks CUDA about the pointer); `stream` is the producer's CUDA stream to wait on (or None);
    `owner` keeps the exporting object (and any DLPack capsule) alive until the work completes."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: int
    stream: int | None
    owner: Any

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3, no stream: the runtime hands a DeviceTensor out only once its writes are done."""
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}


def is_device_array(value) -> bool:
    if hasattr(value, "__cuda_array_interface__"):
        return True
    dev = getattr(value, "__dlpack_device__", None)
    return dev is not None and not isinstance(value, np.ndarray) and dev()[0] in DLPACK_CUDA_DEVICES


def _contiguous(shape, strides, itemsize: int) -> bool:
    """C-contiguous, ignoring axes of size 1 (whose strides carry no meaning)."""
    step = itemsize
    for d, st in zip(reversed(shape), reversed(strides)):
        if d != 1 and st != step:
            return False
        step *= d
    return True


def from_cuda_array_interface(value, name: str) -> DeviceTensor:
    cai = value.__cuda_array_interface__
    shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and not _contiguous(shape, strides, dtype.itemsize):
        raise InputError(f"input {name} is a strided GPU view; pass a contiguous tensor (.contiguous())")
    # Version 3 names the producer's stream (None: nothing to wait for); older versions say
    # nothing, so wait for the legacy default stream (1), where such producers work.
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else 1
    return DeviceTensor(int(cai["data"][0]), shape, dtype, -1, stream, value)  # device: from the pointer


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}  # kDLInt, kDLUInt, kDLFloat, kDLBool


def from_dlpack(value, name: str, consumer_stream: int | None) -> DeviceTensor:
    """Reads the DLTensor inside `value.__dlpack__(stream=...)` without consuming the capsule:
    its destructor still frees it once `owner` goes away. The producer orders its pending work
    before `consumer_stream`, so no extra wait is needed."""
    capsule = value.__dlpack__(stream=consumer_stream or 1)  # 1: the legacy default stream
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    kind = _DL_KINDS.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise InputError(f"input {name} has a DLPack dtype this runtime does not take (code {t.dtype.code})")
    dtype = np.dtype("bool") if kind == "b" else np.dtype(f"{kind}{t.dtype.bits // 8}")
    if t.strides and not _contiguous(shape, [t.strides[i] for i in range(t.ndim)], 1):
        raise InputError(f"input {name} is a strided GPU view; pass a contiguous tensor")
    return DeviceTensor(int(t.data or 0) + int(t.byte_offset), shape, dtype, int(t.device.device_id),
                        None, (value, capsule))


def _as_array(name: str, value, consumer_stream: int | None):
    if isinstance(value, np.ndarray):
        return value
    dev = getattr(value, "__dlpack_device__", None)
    if dev is not None and dev()[0] in DLPACK_CUDA_DEVICES:
        return from_dlpack(value, name, consumer_stream)  # preferred: it orders the producer's stream
    if hasattr(value, "__cuda_array_interface__"):
        return from_cuda_array_interface(value, name)
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InputError(f"input {name} is not an array ({type(value).__name__}): {e}") from e


def validate_feeds(specs: Sequence[IOSpec], feeds: Mapping, *, allow_device: bool = False,
                   consumer_stream: int | None = None) -> dict:
    """Checks names, dtypes, ranks and shapes; returns {name: ndarray | DeviceTensor} in spec order.

    Raises InputError with the same message on every backend.
    """
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
    _check_names(specs, feeds)
    out, sizes = {}, {}
    for spec in specs:
        value = feeds[spec.name]
        if not allow_device and is_device_array(value):
            raise InputError(f"input {spec.name} is a GPU tensor; this backend takes host arrays "
                             "(numpy): copy it to the host first")
        arr = _as_array(spec.name, value, consumer_stream)
        _check_one(spec, tuple(int(d) for d in arr.shape), np.dtype(arr.dtype))
        _check_shared_axes(spec, arr.shape, sizes)
        out[spec.name] = _native_contiguous(arr) if isinstance(arr, np.ndarray) else arr
    for spec in specs:  # shapes first: a wrong shape is named before a wrong value
        check_values(spec, out[spec.name])
    return out


_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # ndarray.min() without its Python wrapper


def check_values(spec: IOSpec, value) -> None:
    """InputError for a token id outside `spec.id_range` (host arrays; a GPU tensor is not read)."""
    if spec.id_range is None or not isinstance(value, np.ndarray) or value.size == 0:
        return
    lo, hi = spec.id_range
    if _MIN(value, axis=None) >= lo and _MAX(value, axis=None) < hi:
        return
    bad = (value < lo) | (value >= hi)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), value.shape))
    got = int(value[where])
    if got < lo:
        raise InputError(f"input {spec.name} holds {got} at {list(where)}; token ids are never negative")
    raise InputError(f"input {spec.name} holds {got} at {list(where)}; the model's table has {hi} ids "
                     f"({lo}..{hi - 1}): tokenize with the model's own tokenizer")


def _native_contiguous(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous array in this machine's byte order (a copy only where it is not):
    engines and ONNX Runtime read raw bytes, so a big-endian int64 would otherwise be misread."""
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="), order="C")
    return np.ascontiguousarray(arr)


def check_shapes(specs: Sequence[IOSpec], shapes: Mapping) -> tuple[tuple[int, ...], ...]:
    """Checks {input name: shape} as `validate_feeds` checks feeds of those shapes (names, ranks,
    fixed axes, the profile, shared axes) without making any array; the shapes in spec order."""
    if not isinstance(shapes, Mapping):
        raise InputError(f"shapes must be a dict of input name -> shape, got {type(shapes).__name__}")
    _check_names(specs, shapes)
    out, sizes = [], {}
    for spec in specs:
        try:
            shape = tuple(int(d) for d in shapes[spec.name])
        except (TypeError, ValueError) as e:
            raise InputError(f"shape of input {spec.name} must be a sequence of integers, got "
                             f"{shapes[spec.name]!r}") from e
        _check_one(spec, shape, np.dtype(spec.dtype))
        _check_shared_axes(spec, shape, sizes)
        out.append(shape)
    return tuple(out)


class FeedCheck:
    """`validate_feeds` with a memory: numpy feeds whose names, dtypes and shapes passed once pass
    again after a few dict lookups (a serving loop sends the same shapes over and over). Returns
    (feeds in spec order, their shapes) either way."""

    LIMIT = 256  # shape combinations remembered

    def __init__(self, specs: Sequence[IOSpec]):
        self.specs = tuple(specs)
        self._names = tuple(s.name for s in self.specs)
        self._np_dtypes = tuple(np.dtype(s.dtype) for s in self.specs)
        self._limited = tuple((i, s.id_range) for i, s in enumerate(self.specs) if s.id_range is not None)
        self._passed: set[tuple] = set()

    def __call__(self, feeds: Mapping, *, allow_device: bool = False,
                 consumer_stream: int | None = None) -> tuple[dict, tuple]:
        fast = self.seen(feeds)
        if fast is not None and all(v.flags.c_contiguous for v in fast[0]):
            return dict(zip(self._names, fast[0])), fast[1]
        valid = validate_feeds(self.specs, feeds, allow_device=allow_device, consumer_stream=consumer_stream)
        key = tuple(tuple(int(d) for d in v.shape) for v in valid.values())
        if len(self._passed) < self.LIMIT and all(isinstance(v, np.ndarray) for v in valid.values()):
            self._passed.add(key)
        return valid, key

    def seen(self, feeds) -> tuple[tuple, tuple] | None:
        """(the feeds in input order, their shapes) when they are numpy arrays of the right dtypes
        in shapes that passed before, whatever their memory layout (a caller that copies them
        needs nothing more); None when anything differs."""
        if type(feeds) is not dict or len(feeds) != len(self._names):
            return None
        values = tuple(map(feeds.get, self._names))
        for value, dtype in zip(values, self._np_dtypes):
            if type(value) is not np.ndarray or value.dtype is not dtype:  # numpy's own dtype objects
                return None
        key = tuple([v.shape for v in values])
        if key not in self._passed:
            return None
        for i, (lo, hi) in self._limited:  # values change every call: a bad one takes the full check
            if _MIN(values[i], axis=None) < lo or _MAX(values[i], axis=None) >= hi:
                return None
        return values, key


def _check_names(specs: Sequence[IOSpec], feeds: Mapping) -> None:
    wanted = [s.name for s in specs]
    missing = [n for n in wanted if n not in feeds]
    unknown = sorted(str(n) for n in feeds if n not in wanted)
    if not missing and not unknown:
        return
    takes = ", ".join(s.describe() for s in specs)
    if missing:
        raise InputError(f"missing input(s) {', '.join(missing)}; the model takes {takes}")
    if unknown:
        raise InputError(f"unknown input(s) {', '.join(unknown)}; the model takes {takes}")


@functools.cache
def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _check_one(spec: IOSpec, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if dtype != _np_dtype(spec.dtype) and dtype.name != spec.dtype:  # (another byte order passes; it is copied)
        raise InputError(f"input {spec.name} has dtype {dtype.name}; the model takes {spec.dtype} "
                         f"(convert with .astype(np.{spec.dtype}))")
    if len(shape) != len(spec.shape):
        raise InputError(f"input {spec.name} has rank {len(shape)} (shape {list(shape)}); "
                         f"the model takes rank {len(spec.shape)} ({spec.describe()})")
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if want >= 0 and got != want:
            raise InputError(f"input {spec.name} has shape {list(shape)}; axis {axis} must be {want} "
                             f"({spec.describe()})")
        if got < 1:
            raise InputError(f"input {spec.name} has shape {list(shape)}; axis {axis} is empty")
    if spec.min_shape is not None and not all(
            lo <= d <= hi for d, lo, hi in zip(shape, spec.min_shape, spec.max_shape)):
        raise InputError(f"input {spec.name} has shape {list(shape)}, outside the profile "
                         f"{list(spec.min_shape)}..{list(spec.max_shape)}; split the batch or "
                         "truncate the sequence, or rebuild with a wider --batch/--seq")
    if spec.max_positions is not None:
        for axis, label in enumerate(spec.axes):
            if label == "seq" and shape[axis] > spec.max_positions:
                raise InputError(f"input {spec.name} has shape {list(shape)}: {shape[axis]} positions; the "
                                 f"model has {spec.max_positions}: truncate the sequence")


def _check_shared_axes(spec: IOSpec, shape, sizes: dict) -> None:
    for axis, name in enumerate(spec.axes):
        if name is None:
            continue
        first = sizes.setdefault(name, (spec.name, int(shape[axis])))
        if first[1] != int(shape[axis]):
            raise InputError(f"inputs {first[0]} and {spec.name} disagree on the {name} axis: "
                             f"{first[1]} vs {int(shape[axis])}")


def select_outputs(specs: Sequence[IOSpec], names: Sequence[str]) -> tuple[IOSpec, ...]:
    """The specs of `names` in the order given (duplicates dropped); InputError for an unknown name."""
    by_name = {s.name: s for s in specs}
    returns = ", ".join(s.describe() for s in specs)
    unknown = [str(n) for n in names if n not in by_name]
    if unknown:
        raise InputError(f"unknown output(s) {', '.join(unknown)}; the model returns {returns}")
    if not names:
        raise InputError(f"outputs is empty; name at least one of {returns}")
    return tuple(by_name[n] for n in dict.fromkeys(names))


def validate_out(selected: Sequence[IOSpec], out: Mapping | None, *, allow_device: bool = False,
                 consumer_stream: int | None = None) -> dict:
    """Checks caller-provided output buffers: names among `selected`, dtype, C-contiguous and
    writable memory. Returns {name: ndarray | DeviceTensor}; sizes are checked per call by `out_view`."""
    if not out:
        return {}
    if not isinstance(out, Mapping):
        raise InputError(f"out must be a dict of output name -> array, got {type(out).__name__}")
    wanted = {s.name: s for s in selected}
    unknown = sorted(str(n) for n in out if n not in wanted)
    if unknown:
        raise InputError(f"out names {', '.join(unknown)}, which this call does not return; it returns "
                         f"{', '.join(wanted)}")
    return {name: _out_buffer(wanted[name], value, allow_device, consumer_stream) for name, value in out.items()}


def _out_buffer(spec: IOSpec, value, allow_device: bool, consumer_stream: int | None):
    label = f"out[{spec.name}]"
    if is_device_array(value):
        if not allow_device:
            raise InputError(f"{label} is a GPU array; this backend writes host arrays (numpy)")
        buf = _as_array(label, value, consumer_stream)
    elif isinstance(value, np.ndarray):
        if not (value.flags.c_contiguous and value.flags.writeable):
            raise InputError(f"{label} must be a writable C-contiguous array (np.empty(shape, dtype))")
        buf = value
    else:
        raise InputError(f"{label} is not an array ({type(value).__name__}); pass a numpy or GPU array")
    if np.dtype(buf.dtype).name != spec.dtype:
        raise InputError(f"{label} has dtype {np.dtype(buf.dtype).name}; output {spec.name} is {spec.dtype}")
    return buf


def out_view(name: str, buf, shape: tuple[int, ...]):
    """The first prod(shape) elements of a caller's buffer, as an array of `shape` (no copy);
    InputError when the buffer is too small. A [max_batch, hidden] buffer thus takes a smaller
    batch in its first rows."""
    need = int(np.prod(shape, dtype=np.int64))
    have = int(np.prod(buf.shape, dtype=np.int64))
    if have < need:
        raise InputError(f"out[{name}] has shape {list(buf.shape)} ({have} elements); this call's {name} "
                         f"is {list(shape)} ({need}): pass a larger buffer")
    if isinstance(buf, np.ndarray):
        return buf if buf.shape == shape else buf.reshape(-1)[:need].reshape(shape)
    return DeviceTensor(buf.ptr, shape, buf.dtype, buf.device, buf.stream, buf.owner)
