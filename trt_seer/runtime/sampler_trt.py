"""The device sampler beside a decoder engine: `TensorRTDecoder` runs it after each step, on the
same stream, so that sampling brings back only the ids, and the ids go on to the next step on the
device (`TensorRTDecoder.sampled_tokens`), as greedy decoding's do.

    sampler = DeviceSampler.beside(engine_path, decoder_manifest, vocab, "float16", options, max_batch, stream)

The decoder build writes it (`<name>.sampler.<logits dtype>.engine`, from export/sampler.py's
graph); a decoder without one samples on the host (runtime/sampling.py), with the same draw.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

import trt_seer.runtime.cuda as cuda
from trt_seer.errors import TrtSeerError
from trt_seer.runtime.sampling import DRAWS

log = logging.getLogger(__name__)
LANES = 2  # host buffers in turn, as the decoder's lanes: one filled while the GPU may read the other


def sampler_file(engine_path: Path, name: str, logits_dtype: str) -> Path:
    return Path(engine_path).parent / f"{name}.sampler.{logits_dtype}.engine"


class DeviceSampler:
    """The sampler engine, its one execution context and its small inputs (device and pinned host)."""

    def __init__(self, loaded, max_batch: int, stream):
        self._loaded, self.engine, self.stream = loaded, loaded.engine, stream
        self.vocab = int(self.engine.get_tensor_shape("logits")[-1])
        self.ctx = self._context(loaded)
        self._uniforms = cuda.DeviceBuffer(max_batch * DRAWS * 4)
        self._settings = cuda.DeviceBuffer(max_batch * 2 * 4)
        self._host = [cuda.pinned_array(max_batch * DRAWS * 4).view(np.float32) for _ in range(LANES)]
        self._settings_host = cuda.pinned_array(max_batch * 2 * 4).view(np.float32)
        self._bound = None  # (batch, logits address, output address) the context has

    @classmethod
    def beside(cls, engine_path: Path, manifest: dict, vocab: int, logits_dtype: str, options, max_batch: int,
               stream) -> "DeviceSampler | None":
        """The sampler built for this decoder's vocabulary and logits, or None (host sampling)."""
        from trt_seer.engine import manifest as manifest_io
        from trt_seer.runtime.loader import load_engine

        path = sampler_file(engine_path, manifest.get("name", ""), logits_dtype)
        if not path.is_file():
            return None
        own = manifest_io.read_engine_manifest(manifest_io.engine_manifest_path(path))
        want = {"vocab": int(vocab), "logits_dtype": logits_dtype, "draws": DRAWS}
        have = {k: own.get("sampler", {}).get(k) for k in want}
        batch_max = int(own["profiles"][0]["batch"][2])
        if have != want or batch_max < max_batch:
            log.warning("%s does not fit this decoder (%s, up to batch %d; need %s, batch %d): sampling on "
                        "the host", path.name, have, batch_max, want, max_batch)
            return None
        return cls(load_engine(path, options, own), max_batch, stream)

    def _context(self, loaded):
        from trt_seer.runtime.loader import runtime_config

        config = runtime_config(self.engine, loaded.flavor, loaded.jit_cache, capture=True)  # one shape per batch
        ctx = self.engine.create_execution_context(config) if config is not None else self.engine.create_execution_context()
        if ctx is None:
            raise TrtSeerError(f"TensorRT could not create an execution context for {loaded.path.name}")
        return ctx

    def set(self, batch: int, temperature: float, top_p: float) -> None:
        """Sends (1 / temperature, top_p) per row up, once for the steps enqueued after it (stream
        order). Its host buffer is rewritten only by the next call, after a generation's last
        token came back, so the copy from it has run."""
        value = np.tile(np.array([1 / temperature, top_p], np.float32), (batch, 1))
        np.copyto(self._settings_host[:value.size].reshape(value.shape), value)
        cuda.copy_async(self._settings.device_ptr, self._settings_host.ctypes.data, value.nbytes, "HostToDevice",
                        self.stream.handle)

    def draws_after(self, logits_ptr: int, out_ptr: int, batch: int, sampling, rng: np.random.Generator):
        """`then(lane)` for runtime/fed_back.py: after each step, this sampler on the logits at
        `logits_ptr`, its token into `out_ptr`, from DRAWS uniform numbers per row out of `rng`
        (drawn as the step is enqueued, in step order: the host sampler's draws). The settings go
        up once, here."""
        from trt_seer.runtime.sampling import draws

        self.set(batch, sampling.temperature, sampling.top_p)

        def then(lane: int):
            return lambda: self.enqueue(lane, logits_ptr, out_ptr, draws(rng, batch))
        return then

    def enqueue(self, lane: int, logits_ptr: int, out_ptr: int, uniforms: np.ndarray) -> None:
        """Draws the next token per row from the logits at `logits_ptr` into `out_ptr` (int64), after
        whatever the stream holds, with the settings last `set`; `uniforms` (batch, DRAWS) go up
        through host lane `lane`."""
        batch = len(uniforms)
        stream = self.stream.handle
        host = self._host[lane]
        np.copyto(host[:uniforms.size].reshape(uniforms.shape), uniforms, casting="same_kind")
        cuda.copy_async(self._uniforms.device_ptr, host.ctypes.data, uniforms.nbytes, "HostToDevice", stream)
        if self._bound != (batch, logits_ptr, out_ptr):
            self._bind(batch, {"logits": logits_ptr, "uniforms": self._uniforms.device_ptr,
                               "settings": self._settings.device_ptr, "next_token": out_ptr})
            self._bound = (batch, logits_ptr, out_ptr)
        if not self.ctx.execute_async_v3(int(stream)):
            raise TrtSeerError(f"TensorRT failed to run {self._loaded.path.name}: {self._loaded.last_error()}")

    def _bind(self, batch: int, addresses: dict) -> None:
        shapes = {"logits": (batch, 1, self.vocab), "uniforms": (batch, DRAWS), "settings": (batch, 2)}
        for name, shape in shapes.items():
            if not self.ctx.set_input_shape(name, shape):
                raise TrtSeerError(f"TensorRT rejected shape {list(shape)} for {name} of {self._loaded.path.name}")
        for name, at in addresses.items():
            self.ctx.set_tensor_address(name, at)

    def close(self) -> None:
        self.ctx = None
        self._loaded.jit_cache.save()
        for buf in (self._uniforms, self._settings):
            buf.close()
        self._host = self._settings_host = self.engine = self._loaded = None
