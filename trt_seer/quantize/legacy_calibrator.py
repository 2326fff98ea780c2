"""Implicit INT8 calibration for TensorRT <= 10 (`BuilderFlag.INT8` + `IInt8EntropyCalibrator2`).

TensorRT 11 and TensorRT-RTX removed this API; trt_seer's main path is explicit Q/DQ. This thin
extra serves a TensorRT calibration cache written by `build --int8` (<out>/calib/<name>/calibration.cache)
so an older implicit-mode pipeline takes the same scales, and, given batches, feeds them to
TensorRT through pinned host buffers on a CUDA stream.

    calibrator = entropy_calibrator(trt.load(), cache_path, batches=None)   # cache only
    config.set_flag(trt.BuilderFlag.INT8); config.int8_calibrator = calibrator
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_seer.errors import UnsupportedError


def entropy_calibrator(flavor, cache_path: Path, batches: list[dict] | None = None):
    """An `IInt8EntropyCalibrator2` of the installed TensorRT; UnsupportedError where it has none."""
    if not flavor.has_implicit_int8:
        raise UnsupportedError(f"{flavor.name} {flavor.version} has no implicit INT8 calibrator "
                               "(removed in TensorRT 11 and absent in TensorRT-RTX); use the Q/DQ graph")
    base = flavor.trt.IInt8EntropyCalibrator2

    class EntropyCalibrator(base):
        def __init__(self):
            base.__init__(self)
            self.cache_path, self.batches = Path(cache_path), list(batches or [])
            self._next, self._buffers, self._stream = 0, {}, None

        def get_batch_size(self):
            return int(next(iter(self.batches[0].values())).shape[0]) if self.batches else 1

        def get_batch(self, names):
            if self._next >= len(self.batches):
                return None  # TensorRT stops calibrating
            feeds = self.batches[self._next]
            self._next += 1
            return [self._stage(name, np.ascontiguousarray(feeds[name])) for name in names]

        def _stage(self, name, array):
            from trt_seer.runtime import cuda

            if self._stream is None:
                self._stream = cuda.Stream()
            buf = self._buffers.get(name)
            if buf is None or buf.nbytes < array.nbytes:
                buf = self._buffers[name] = cuda.HostDeviceBuffer(array.nbytes)
            buf.host_view(array.shape, array.dtype)[...] = array  # pinned staging
            buf.h2d_async(self._stream, array.nbytes)
            self._stream.synchronize()
            return buf.device_ptr

        def read_calibration_cache(self):
            return self.cache_path.read_bytes() if self.cache_path.is_file() else None

        def write_calibration_cache(self, cache):
            from trt_seer.files import atomic_write_bytes

            atomic_write_bytes(self.cache_path, bytes(cache))

    return EntropyCalibrator()
