"""TensorRT decoder engine -> `TensorRTDecoder`, the GPU `DecoderStep` for `runtime.generate`.

    from trt_seer.runtime.decoder_trt import TensorRTDecoder
    with TensorRTDecoder("engines/my-llm.int4.engine") as dec:
        dec.reset(batch=2)
        logits = dec.step(input_ids, attention_mask, position_ids)   # numpy in, [batch, vocab] out

The KV cache never leaves the GPU; only the step's token ids, mask and positions go up, and only
the last position's logits come back. The engine has two optimization profiles (engine/profiles.py):
`decode` (one token per row) and `prefill` (the prompt on an empty cache), one execution context each.

Two cache layouts (`cache=`):
- "window" (default): every decode step has the same shapes and addresses. The cache is a window of
  `max_total - 1` positions per layer; the prompt's keys and values land at its end and the
  attention mask marks the empty slots. The engine appends the new token (a window + 1 present);
  one 2-D device copy for all layers drops the oldest slot, so the next step reads the window at the
  same address again. With fixed shapes and addresses the runtime replays a CUDA graph of the step
  (TensorRT-RTX captures it once per batch size) instead of enqueueing every kernel from the host.
  Each step attends over the whole window: `--max-total` sets that cost.
- "grow": the cache is as long as the sequence so far; two buffers per layer swap roles every step
  (the engine reads one and writes the grown cache into the other). Every step is a new shape, so
  nothing can be replayed: each kernel is launched from the host.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from trt_seer.decoder_io import TOKEN_INPUTS, is_past, present_of
from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, TrtSeerError, UnsupportedError
import trt_seer.runtime.cuda as cuda
from trt_seer.runtime.loader import EngineOptions, load_engine

SMALL_INPUTS = TOKEN_INPUTS
SPECIALIZE = ("none", "lazy", "eager")
CACHES = ("window", "grow")


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class Copy2D(NamedTuple):
    """One cudaMemcpy2D: `height` rows of `width` bytes; offsets from the buffers' starts."""

    dst_offset: int
    dst_pitch: int
    src_offset: int
    src_pitch: int
    width: int
    height: int


def slide_copy(decode: bool, rows: int, window: int, row_bytes: int, seq: int) -> Copy2D:
    """The copy from the step's `present` output back into the window: `rows` = layers x batch x
    heads, each `window` positions of `row_bytes` in the window. After a decode step `present` has
    window + 1 positions per row and the oldest is dropped; after a prompt it has `seq` positions,
    which go to the end of the (zeroed) window."""
    w = window * row_bytes
    if decode:
        return Copy2D(0, w, row_bytes, w + row_bytes, w, rows)
    width = seq * row_bytes
    return Copy2D(w - width, w, 0, width, width, rows)


def window_mask(mask: np.ndarray, window: int) -> np.ndarray:
    """A decode step's [batch, past + 1] mask right-aligned in [batch, window + 1], 0 elsewhere."""
    out = np.zeros((mask.shape[0], window + 1), np.int64)
    out[:, window + 1 - mask.shape[1]:] = mask
    return out


class TensorRTDecoder:
    """One decoder engine with its KV cache on the GPU; not thread-safe (one sequence batch)."""

    backend = "tensorrt"

    def __init__(self, path: str | Path, options: EngineOptions = EngineOptions(), specialize: str | None = None,
                 cache: str = "window"):
        """`cache`: "window" or "grow" (module docstring). `specialize`: TensorRT-RTX's
        dynamic-shape kernel specialization for the decode step ("eager", "lazy" or "none"). The
        default is "eager" with the window: its one shape per batch size gets kernels compiled for
        it on the first step (decode throughput against "none": docs/BENCHMARKS.md) and "none"
        when every step is a new shape. Prompts always run
        unspecialized: their lengths vary. CUDA graphs for the decode step are on with the window
        unless `options.use_cuda_graph` is False."""
        specialize = specialize or ("eager" if cache == "window" else "none")
        if specialize not in SPECIALIZE:
            raise InputError(f"specialize must be one of {', '.join(SPECIALIZE)}, got {specialize!r}")
        if cache not in CACHES:
            raise InputError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        self.path, self.options, self.specialize, self.cache = Path(path), options, specialize, cache
        if not self.path.is_file():
            raise InputError(f"engine not found: {self.path}")
        self.manifest = manifest_io.read_engine_manifest(manifest_io.engine_manifest_path(self.path))
        self.decoder = self.manifest.get("decoder")
        if not self.decoder:
            raise InputError(f"{self.path.name} is not a decoder engine with a KV cache (no `decoder` "
                             "section in its manifest); build it from a causal-lm checkpoint")
        loaded = load_engine(self.path, options, self.manifest)
        self.flavor, self.gpu, self.engine = loaded.flavor, loaded.gpu, loaded.engine
        self._logger, self._runtime, self._jit_cache = loaded.logger, loaded.runtime, loaded.jit_cache
        self.stream = cuda.Stream()
        self._start, self._end = cuda.Event(), cuda.Event()
        self.last_gpu_ms = None  # the engine's own GPU time in the last step (CUDA events)
        self._names()
        self.max_batch = int(self.manifest["profiles"][0]["batch"][2])
        self.max_total = int(self.decoder["max_total"])
        self.max_prompt = int(self.decoder["max_prompt"])
        self._contexts = [self._context(i) for i in range(self.engine.num_optimization_profiles)]
        self._alloc()
        self.batch, self.past = 0, 0
        self.closed = False

    # --- setup -------------------------------------------------------------------------------

    def _names(self) -> None:
        trt = self.flavor.trt
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.past_names = [n for n in names if is_past(n)]
        self.present_names = [present_of(n) for n in self.past_names]
        missing = [n for n in (*SMALL_INPUTS, "logits", *self.present_names) if n not in names]
        if missing or not self.past_names:
            raise InputError(f"{self.path.name} lacks the KV-cache I/O {missing or ['past_key_values.*']}: "
                             "rebuild it from a causal-lm checkpoint exported with its cache")
        self.kv_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(self.past_names[0])))
        self.logits_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype("logits")))
        shape = self.engine.get_tensor_shape(self.past_names[0])
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.vocab = int(self.engine.get_tensor_shape("logits")[-1])

    def _context(self, profile: int):
        config = self.engine.create_runtime_config() if hasattr(self.engine, "create_runtime_config") else None
        if config is not None:  # the JIT kernels of every context, from and to one file
            self._jit_cache.attach(config)
        graphs = self.options.use_cuda_graph if self.options.use_cuda_graph is not None else self.cache == "window"
        if config is not None and graphs and profile == 0 and hasattr(config, "cuda_graph_strategy"):
            # the decode step only: a prompt's shape is new almost every time
            config.cuda_graph_strategy = self.flavor.trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        strategy = getattr(self.flavor.trt, "DynamicShapesKernelSpecializationStrategy", None)
        if config is not None and strategy is not None:
            chosen = self.specialize if profile == 0 else "none"
            config.dynamic_shapes_kernel_specialization_strategy = getattr(strategy, chosen.upper())
        ctx = (self.engine.create_execution_context(config) if config is not None
               else self.engine.create_execution_context())
        if ctx is None:
            raise TrtSeerError(f"TensorRT could not create an execution context for {self.path.name}")
        if profile and not ctx.set_optimization_profile_async(profile, int(self.stream.handle)):
            raise TrtSeerError(f"TensorRT could not select optimization profile {profile} of {self.path.name}")
        return ctx

    def _alloc(self) -> None:
        b, t, layers = self.max_batch, self.max_total, len(self.past_names)
        self.window = t - 1  # cache positions a decode step reads in the "window" layout
        self._row = self.head_dim * self.kv_dtype.itemsize  # bytes of one position of one head
        if self.cache == "window":  # [layer][batch][head][window][dim], read by the step; its output
            self._kv = [cuda.DeviceBuffer(layers * b * self.kv_heads * n * self._row) for n in (t - 1, t)]
        else:  # two [batch][head][total][dim] buffers per layer, swapping roles every step
            kv_bytes = _nbytes((b, self.kv_heads, t, self.head_dim), self.kv_dtype)
            self._kv = [[cuda.DeviceBuffer(kv_bytes) for _ in self.past_names] for _ in range(2)]
        self._small = {n: cuda.HostDeviceBuffer(_nbytes((b, t), np.int64)) for n in SMALL_INPUTS}
        self._logits = cuda.HostDeviceBuffer(_nbytes((b, 1, self.vocab), self.logits_dtype))
        self._cur = 0
        self._bound = None  # (context, batch) whose decode shapes and addresses are set
        self.kv_cache_bytes = sum(buf.nbytes for buf in self._buffers())

    def _buffers(self) -> list:
        return list(self._kv) if self.cache == "window" else [*self._kv[0], *self._kv[1]]

    # --- running -----------------------------------------------------------------------------

    def reset(self, batch: int) -> None:
        """Starts a new batch of sequences on an empty cache."""
        if not 1 <= batch <= self.max_batch:
            raise InputError(f"batch {batch} is outside the engine's profile (1..{self.max_batch})")
        self.batch, self.past, self._cur = int(batch), 0, 0
        if self.cache == "window":  # empty slots are masked, but must hold numbers, not NaN
            rows = len(self.past_names) * self.batch * self.kv_heads
            cuda.memset_async(self._kv[0].device_ptr, 0, rows * self.window * self._row, self.stream)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Runs the new tokens on the cache; returns the last position's logits [batch, vocab] (float32)."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        seq = self._check(feeds)
        decode = seq == 1 and self.past > 0
        ctx = self._contexts[0 if decode or len(self._contexts) == 1 else 1]
        stream = self.stream.handle
        if self.cache == "window" and decode:
            feeds["attention_mask"] = window_mask(attention_mask, self.window)
        rebind = not (self.cache == "window" and decode and self._bound == (id(ctx), self.batch))
        for name, value in feeds.items():
            buf = self._small[name]
            np.copyto(buf.host_view(value.shape, np.int64), value, casting="same_kind")
            buf.h2d_async(stream, value.nbytes)
            if rebind:
                self._bind(ctx, name, value.shape, buf.device_ptr)
        if rebind:
            self._bind_cache(ctx, seq, decode)
            ctx.set_tensor_address("logits", self._logits.device_ptr)
        self._start.record(stream)
        if not ctx.execute_async_v3(int(stream)):
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "see the TensorRT log"
            raise TrtSeerError(f"TensorRT failed to run {self.path.name}: {why}")
        if self.cache == "window":
            self._slide(seq, decode)
        self._end.record(stream)
        self._logits.d2h_async(stream, _nbytes((self.batch, 1, self.vocab), self.logits_dtype))
        self.stream.synchronize()
        self.last_gpu_ms = self._end.elapsed_ms(self._start)
        self._cur, self.past = 1 - self._cur, self.past + seq
        logits = self._logits.host_view((self.batch, self.vocab), self.logits_dtype)
        return logits.astype(np.float32, copy=True)

    def _bind_cache(self, ctx, seq: int, decode: bool) -> None:
        """Shapes and addresses of the cache inputs and outputs for this step."""
        if self.cache == "grow":
            kv_shape = (self.batch, self.kv_heads, self.past, self.head_dim)
            for i, (past, present) in enumerate(zip(self.past_names, self.present_names)):
                self._bind(ctx, past, kv_shape, self._kv[self._cur][i].device_ptr)
                ctx.set_tensor_address(present, self._kv[1 - self._cur][i].device_ptr)
            return
        past_len = self.window if decode else 0
        present_len = past_len + seq
        per_head = self.batch * self.kv_heads
        for i, (past, present) in enumerate(zip(self.past_names, self.present_names)):
            self._bind(ctx, past, (self.batch, self.kv_heads, past_len, self.head_dim),
                       self._kv[0].device_ptr + i * per_head * past_len * self._row)
            ctx.set_tensor_address(present, self._kv[1].device_ptr + i * per_head * present_len * self._row)
        self._bound = (id(ctx), self.batch) if decode else None

    def _slide(self, seq: int, decode: bool) -> None:
        """Window layout: the step's output back into the window (module docstring)."""
        c = slide_copy(decode, len(self.past_names) * self.batch * self.kv_heads, self.window, self._row, seq)
        cuda.copy2d_async(self._kv[0].device_ptr + c.dst_offset, c.dst_pitch, self._kv[1].device_ptr + c.src_offset,
                          c.src_pitch, c.width, c.height, "DeviceToDevice", self.stream)

    def _bind(self, ctx, name: str, shape, address: int) -> None:
        if not ctx.set_input_shape(name, tuple(int(d) for d in shape)):
            raise InputError(f"TensorRT rejected shape {list(shape)} for {name} of {self.path.name}")
        ctx.set_tensor_address(name, address)

    def _check(self, feeds: dict) -> int:
        if not self.batch:
            raise InputError("call reset(batch) before step()")
        batch, seq = feeds["input_ids"].shape
        if batch != self.batch or feeds["position_ids"].shape != (batch, seq):
            raise InputError(f"step got input_ids {list(feeds['input_ids'].shape)} and position_ids "
                             f"{list(feeds['position_ids'].shape)} for a batch of {self.batch}")
        if feeds["attention_mask"].shape != (batch, self.past + seq):
            raise InputError(f"attention_mask must be [{batch}, {self.past + seq}] (cache {self.past} + "
                             f"{seq} new), got {list(feeds['attention_mask'].shape)}")
        if self.past == 0 and seq > self.max_prompt:
            raise InputError(f"prompt of {seq} tokens exceeds the engine's longest prompt ({self.max_prompt}); "
                             "rebuild with a larger --seq max")
        if self.past + seq > self.max_total:
            raise InputError(f"sequence of {self.past + seq} tokens exceeds the engine's max total "
                             f"({self.max_total}); rebuild with a larger --max-total")
        if self.cache == "window" and self.past == 0 and seq > self.window:
            raise InputError(f"prompt of {seq} tokens leaves no room to generate in the engine's max total "
                             f"({self.max_total}); rebuild with a larger --max-total")
        if self.past > 0 and seq != 1 and len(self._contexts) > 1:
            raise UnsupportedError("after the prompt, a decoder engine takes one token per row per step")
        return seq

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.stream.synchronize()
        self.closed = True
        self._jit_cache.save()
        for buf in (*self._buffers(), *self._small.values(), self._logits):
            buf.close()
        self._contexts, self.engine, self._runtime = [], None, None
        for owned in (self._start, self._end, self.stream):
            owned.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
