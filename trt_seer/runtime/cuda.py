"""CUDA through cuda-python: error checking, pinned + device buffers, streams, events, graphs.

    from trt_seer.runtime.cuda import HostDeviceBuffer, Stream
    with Stream() as s, HostDeviceBuffer(4096) as buf:
        buf.host_view((1024,), np.float32)[:] = 1.0
        buf.h2d_async(s); s.synchronize()

cuda-python is imported on first use (`cuda.bindings.runtime`, or `cuda.cudart` from older
releases), so importing this module needs no GPU. Every call goes through `cuda_call`, which raises
`CudaError` with CUDA's error name: errors are never swallowed. Device memory is freed by `close()`
(or the context manager, or at garbage collection); pinned host memory when the last numpy view of
it is gone, so arrays over it stay valid.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import os
import shutil
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from trt_seer.errors import CudaError, DependencyError

_MODULES = ("cuda.bindings.runtime", "cuda.cudart")  # cuda-bindings >= 12.8 (13.x), then older
VIEW_CACHE = 256  # numpy views kept per pinned buffer (one per shape and dtype staged)


@functools.lru_cache(maxsize=None)
def cudart():
    """The cuda-python runtime module. DependencyError when cuda-python is not installed."""
    errors = []
    for name in _MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("cuda"):  # installed but broken: that is the news
                errors.append(f"{name}: {e}")
        except ImportError as e:
            errors.append(f"{name}: {e}")
    broken = f" ({'; '.join(errors)})" if errors else ""
    gpu = "this machine has an NVIDIA GPU but " if nvidia_driver_present() else ""
    raise DependencyError(f"{gpu}cuda-python is not installed{broken}, so TensorRT engines cannot run on the GPU; "
                          'pip install "trt-seer[gpu]" (from a checkout: pip install -e ".[gpu]")')


def nvidia_driver_present() -> bool:
    """Whether an NVIDIA driver is loaded (Linux) or its tool is on PATH; asks no CUDA library."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def error_name(err) -> str:
    rt = cudart()
    if type(err).__name__ == "CUresult":  # a driver-API error slipped in: name it with the driver
        from cuda.bindings import driver

        status, name = driver.cuGetErrorName(err)
    else:
        status, name = rt.cudaGetErrorName(err)
    return name.decode() if int(status) == 0 and name else f"CUDA error {int(err)}"


def check(err, what: str = "") -> None:
    """Raises CudaError naming the CUDA error unless `err` is success."""
    if int(err) != 0:
        name = error_name(err)
        where = f" in {what}" if what else ""
        raise CudaError(f"{name} ({int(err)}){where}", int(err), name)


def cuda_call(result, what: str = ""):
    """Unpacks cuda-python's `(err, *values)`: raises CudaError on failure, returns None, the one
    value, or a tuple of values."""
    if not isinstance(result, tuple):
        result = (result,)
    check(result[0], what)
    values = result[1:]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    major: int
    minor: int
    total_bytes: int

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.major, self.minor


def gpu_unavailable_reason(device: int = 0) -> str | None:
    """None when cuda-python is importable and `device` exists; else why not (never raises)."""
    try:
        rt = cudart()
    except DependencyError as e:
        return str(e)
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0:
        return f"no usable CUDA GPU ({error_name(err)})"
    if count <= device:
        return f"no CUDA GPU {device} (this machine has {count})"
    return None


def device_info(device: int = 0) -> DeviceInfo:
    prop = cuda_call(cudart().cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = prop.name.split(b"\0", 1)[0].decode() if isinstance(prop.name, bytes) else str(prop.name)
    return DeviceInfo(device, name, int(prop.major), int(prop.minor), int(prop.totalGlobalMem))


def set_device(device: int = 0) -> None:
    """Makes `device` current and initialises its primary context (TensorRT shares it)."""
    rt = cudart()
    cuda_call(rt.cudaSetDevice(device), "cudaSetDevice")
    cuda_call(rt.cudaFree(0), "cudaFree(0)")


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of the current device."""
    return tuple(int(v) for v in cuda_call(cudart().cudaMemGetInfo(), "cudaMemGetInfo"))


def pointer_device(ptr: int) -> int | None:
    """The device that owns `ptr` if it is device (or managed) memory, else None."""
    rt = cudart()
    attrs = cuda_call(rt.cudaPointerGetAttributes(ptr), "cudaPointerGetAttributes")
    device_types = (rt.cudaMemoryType.cudaMemoryTypeDevice, rt.cudaMemoryType.cudaMemoryTypeManaged)
    return int(attrs.device) if attrs.type in device_types else None


@functools.lru_cache(maxsize=None)
def memcpy_kind(name: str):
    """cudaMemcpyKind by name ("HostToDevice", ...), as cudaMemcpyAsync takes it."""
    return getattr(cudart().cudaMemcpyKind, f"cudaMemcpy{name}")


def copy_async(dst: int, src: int, nbytes: int, kind: str, stream: "Stream | int") -> None:
    """cudaMemcpyAsync; `kind` is "HostToDevice", "DeviceToHost" or "DeviceToDevice"."""
    if nbytes:
        (err,) = cudart().cudaMemcpyAsync(dst, src, nbytes, memcpy_kind(kind), stream_handle(stream))
        if int(err):  # the message is built only on failure: this runs several times per call
            check(err, f"cudaMemcpyAsync({kind}, {nbytes} bytes)")


def copy2d_async(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, kind: str,
                 stream: "Stream | int") -> None:
    """cudaMemcpy2DAsync: `height` rows of `width` bytes, rows `src_pitch` / `dst_pitch` bytes apart."""
    if width and height:
        cuda_call(cudart().cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, memcpy_kind(kind),
                                             stream_handle(stream)),
                  f"cudaMemcpy2DAsync({kind}, {height} rows of {width} bytes)")


def memset_async(ptr: int, value: int, nbytes: int, stream: "Stream | int") -> None:
    """cudaMemsetAsync: `nbytes` bytes at `ptr` set to `value`."""
    if nbytes:
        cuda_call(cudart().cudaMemsetAsync(ptr, value, nbytes, stream_handle(stream)), f"cudaMemsetAsync({nbytes} bytes)")


def stream_handle(stream):
    """The CUDA handle of a `Stream`, a torch stream (`.cuda_stream`), a cupy stream (`.ptr`),
    or a raw handle (int or cudaStream_t) as given."""
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if isinstance(getattr(stream, attr, None), int):
            return getattr(stream, attr)
    return stream


def synchronize(stream: "Stream | int") -> None:
    """Blocks until the work on `stream` (a `Stream` or a raw handle) has completed."""
    cuda_call(cudart().cudaStreamSynchronize(stream_handle(stream)), "cudaStreamSynchronize")


def wait_event(stream: "Stream | int", event: "Event") -> None:
    """Later work on `stream` waits until `event` has completed (no host block)."""
    cuda_call(cudart().cudaStreamWaitEvent(stream_handle(stream), event.handle, 0), "cudaStreamWaitEvent")


class _Owned:
    """Frees its CUDA resource once: on close(), on `with` exit, or at garbage collection."""

    _finalizer: weakref.finalize

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ByteViews:
    """Typed numpy views of one byte array (no copies), kept per (shape, dtype) up to VIEW_CACHE, so
    a caller that stages the same shapes allocates nothing per call. `what` names the bytes in the
    error for a view that does not fit."""

    def __init__(self, raw: np.ndarray, what: str):
        self.raw, self.what = raw, what
        self._views: dict[tuple, np.ndarray] = {}

    def get(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        key = (tuple(shape), dtype)
        view = self._views.get(key)
        if view is None:
            dt = np.dtype(dtype)
            need = int(np.prod(key[0], dtype=np.int64)) * dt.itemsize
            if need > self.raw.nbytes:
                raise ValueError(f"{list(key[0])} {dt.name} needs {need} bytes; {self.what} holds {self.raw.nbytes}")
            view = self.raw[:need].view(dt).reshape(key[0])
            if len(self._views) < VIEW_CACHE:
                self._views[key] = view
        return view


class _PinnedHost:
    """Page-locked host memory (cudaMallocHost), freed when this object is collected."""

    def __init__(self, size: int):
        self.ptr = int(cuda_call(cudart().cudaMallocHost(size), f"cudaMallocHost({size})"))
        self._finalizer = weakref.finalize(self, _destroy, "cudaFreeHost", self.ptr)


def pinned_array(size: int) -> np.ndarray:
    """`size` bytes of new page-locked host memory as a uint8 array. The memory lives as long as the
    array or any view of it does, so an array handed to a caller never outlives its memory."""
    owner = _PinnedHost(size)
    raw = (ctypes.c_uint8 * size).from_address(owner.ptr)
    raw.keepalive = owner  # numpy views reach `raw` through their base; `raw` keeps the owner
    return np.ctypeslib.as_array(raw)


class HostDeviceBuffer(_Owned):
    """`nbytes` of page-locked host memory (cudaMallocHost) and of device memory (cudaMalloc).

    Pinned memory lets copies run asynchronously on a stream at full PCIe/NVLink bandwidth;
    `host_view` is a numpy array over it. `close()` frees the device memory at once; the host
    memory goes with the last numpy view of it (a result handed out stays readable).
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        size = max(self.nbytes, 1)
        host = pinned_array(size)  # freed by reference counting if cudaMalloc fails below
        device_ptr = int(cuda_call(cudart().cudaMalloc(size), f"cudaMalloc({size})"))
        self.host_ptr, self.device_ptr = int(host.ctypes.data), device_ptr
        self._views = ByteViews(host[:self.nbytes], "the buffer")
        self._finalizer = weakref.finalize(self, _destroy, "cudaFree", device_ptr)

    def host_view(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A numpy array of `shape` over the start of the pinned memory (no copy). Views are kept
        per (shape, dtype), so a caller that stages the same shapes allocates nothing per call."""
        if self.closed:
            raise CudaError("buffer is closed", name="closed")
        return self._views.get(shape, dtype)

    def h2d_async(self, stream: "Stream | int", nbytes: int | None = None) -> None:
        copy_async(self.device_ptr, self.host_ptr, self._size(nbytes), "HostToDevice", stream)

    def d2h_async(self, stream: "Stream | int", nbytes: int | None = None) -> None:
        copy_async(self.host_ptr, self.device_ptr, self._size(nbytes), "DeviceToHost", stream)

    def _size(self, nbytes: int | None) -> int:
        n = self.nbytes if nbytes is None else int(nbytes)
        if n > self.nbytes or self.closed:
            raise ValueError(f"copy of {n} bytes does not fit a {'closed ' if self.closed else ''}"
                             f"buffer of {self.nbytes}")
        return n

    def close(self) -> None:
        self._views = None
        super().close()


class DeviceBuffer(_Owned):
    """`nbytes` of device memory (cudaMalloc) with no host side: state that stays on the GPU,
    such as a decoder's KV cache."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        ptr = cuda_call(cudart().cudaMalloc(max(self.nbytes, 1)), f"cudaMalloc({self.nbytes})")
        self.device_ptr = int(ptr)
        self._finalizer = weakref.finalize(self, _destroy, "cudaFree", self.device_ptr)


def _destroy(fn_name: str, handle) -> None:
    cuda_call(getattr(cudart(), fn_name)(handle), fn_name)


class Stream(_Owned):
    """A non-blocking CUDA stream: it does not synchronise with the legacy default stream."""

    def __init__(self, non_blocking: bool = True):
        rt = cudart()
        flags = rt.cudaStreamNonBlocking if non_blocking else rt.cudaStreamDefault
        self.handle = cuda_call(rt.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")
        self.ptr = int(self.handle)
        self._finalizer = weakref.finalize(self, _destroy, "cudaStreamDestroy", self.handle)

    def synchronize(self) -> None:
        cuda_call(cudart().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def wait(self, event: "Event") -> None:
        wait_event(self, event)


class Event(_Owned):
    """A CUDA event; with `timing`, two of them give the GPU time between their records."""

    def __init__(self, timing: bool = True):
        rt = cudart()
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        self.handle = cuda_call(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")
        self._finalizer = weakref.finalize(self, _destroy, "cudaEventDestroy", self.handle)

    def record(self, stream: "Stream | int") -> None:
        cuda_call(cudart().cudaEventRecord(self.handle, stream_handle(stream)), "cudaEventRecord")

    def synchronize(self) -> None:
        cuda_call(cudart().cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def query(self) -> bool:
        """True once the recorded work has completed."""
        rt = cudart()
        (err,) = rt.cudaEventQuery(self.handle)
        if err == rt.cudaError_t.cudaErrorNotReady:
            return False
        check(err, "cudaEventQuery")
        return True

    def elapsed_ms(self, start: "Event") -> float:
        """Milliseconds from `start` to this event (both recorded and completed)."""
        return float(cuda_call(cudart().cudaEventElapsedTime(start.handle, self.handle),
                               "cudaEventElapsedTime"))


class CudaGraph(_Owned):
    """An executable CUDA graph; `launch(stream)` replays the captured work."""

    def __init__(self, graph_exec):
        self.handle = graph_exec
        self._finalizer = weakref.finalize(self, _destroy, "cudaGraphExecDestroy", graph_exec)

    @classmethod
    def capture(cls, stream: Stream, enqueue: Callable[[], None]) -> "CudaGraph":
        """Records what `enqueue()` puts on `stream` (nothing runs) and instantiates it.

        Thread-local capture mode: other threads may keep using CUDA meanwhile.
        """
        rt = cudart()
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda_call(rt.cudaStreamBeginCapture(stream.handle, mode), "cudaStreamBeginCapture")
        try:
            enqueue()
        except BaseException as e:
            err, graph = rt.cudaStreamEndCapture(stream.handle)  # leave capture mode before raising
            if int(err) == 0 and graph:
                _destroy("cudaGraphDestroy", graph)
            elif int(err) != 0:
                e.add_note(f"ending the aborted capture also failed: {error_name(err)}")
            raise
        graph = cuda_call(rt.cudaStreamEndCapture(stream.handle), "cudaStreamEndCapture")
        try:
            graph_exec = cuda_call(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            _destroy("cudaGraphDestroy", graph)
        return cls(graph_exec)

    def launch(self, stream: "Stream | int") -> None:
        cuda_call(cudart().cudaGraphLaunch(self.handle, stream_handle(stream)), "cudaGraphLaunch")
