"""TensorRT decoder engine -> `TensorRTDecoder`, the GPU `DecoderStep` for `runtime.generate`.

    from trt_seer.runtime.decoder_trt import TensorRTDecoder
    with TensorRTDecoder("engines/my-llm.int4.engine") as dec:
        dec.reset(batch=2)
        logits = dec.step(input_ids, attention_mask, position_ids)   # numpy in, [batch, vocab] out

The KV cache never leaves the GPU; only the step's token ids, mask and positions go up, and only
the last position's logits come back. The engine has two optimization profiles (engine/profiles.py):
`decode` (one token per row) and `prefill` (the prompt on an empty cache), one execution context each.
Engines whose manifest gives `decoder.prompt_slice` (built with `--prompt-slice`) take a prompt
longer than that as slices, each on the prefill profile with the cache of the slices before it: a
prompt step's attention scores then grow with the slice, not with the prompt squared.

Two cache layouts (`cache=`), "window" (default) and "grow", and two kinds of engine cache output:
runtime/decoder_cache.py.

Greedy decoding and sampling feed each step's token back on the device (runtime/fed_back.py):
the engine's `next_token`, or the draw of the device sampler the build writes beside the engine
(runtime/sampler_trt.py); without a sampler, sampling brings the logits back to the host.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from trt_seer.decoder_io import NEXT_TOKEN, TOKEN_INPUTS, check_step, is_past, new_of, present_of, prompt_slices
from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, TrtSeerError, UnsupportedError
import trt_seer.runtime.cuda as cuda
from trt_seer.runtime.decoder_cache import CacheSteps
from trt_seer.runtime.decoder_memory import new_kv_buffers, shared_scratch
from trt_seer.runtime.fed_back import Lane, fed_back
from trt_seer.runtime.kv_window import ALIGNS, default_align, resolve_windows, window_mask
from trt_seer.runtime.loader import EngineOptions, load_engine, runtime_config

SMALL_INPUTS = TOKEN_INPUTS
SPECIALIZE = ("none", "lazy", "eager")
CACHES = ("window", "grow")


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class TensorRTDecoder(CacheSteps):
    """One decoder engine with its KV cache on the GPU; not thread-safe (one sequence batch)."""

    backend = "tensorrt"

    def __init__(self, path: str | Path, options: EngineOptions = EngineOptions(), specialize: str | None = None,
                 cache: str = "window", windows: tuple[int, ...] | str | None = None, align: str | None = None,
                 max_batch: int | None = None, prompt_slice: int | None = None):
        """`cache`: "window" or "grow" (module docstring). `specialize`: TensorRT-RTX's
        dynamic-shape kernel specialization for the decode step ("eager", "lazy" or "none"). The
        default is "eager" with the window: its one shape per batch size gets kernels compiled for
        it on the first step (decode throughput against "none": docs/BENCHMARKS.md) and "none"
        when every step is a new shape. Prompts always run
        unspecialized: their lengths vary. CUDA graphs for the decode step are on with the window
        unless `options.use_cuda_graph` is False. `windows`: the window sizes (default "ladder":
        `kv_window.window_sizes(max_total)`, measured on an H200: docs/BENCHMARKS.md; "single": one
        window of max_total - 1, as before the ladder; the largest is always max_total - 1). `align`: "left" or
        "right" (module docstring); default from the manifest's `decoder.sliding_window`: left when it
        says the attention is full (null) or its window is at least the largest, right otherwise,
        including manifests that do not say. `max_batch`: the most sequences this decoder will run at
        once (default the engine's profile maximum); the KV cache is allocated for that many, so one
        sequence on an engine built for batch 8 holds an eighth of the cache. `prompt_slice`: tokens per
        prompt slice, at most the manifest's `decoder.prompt_slice` (default that; 0: prompts whole);
        buffers are sized for it."""
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
        self.last_gpu_ms = None  # the engine's own GPU time in the last step (CUDA events)
        self._names()
        profile_max = int(self.manifest["profiles"][0]["batch"][2])
        if max_batch is not None and not 1 <= int(max_batch) <= profile_max:
            raise InputError(f"max_batch must be in 1..{profile_max} (the engine's batch profile), got {max_batch}")
        self.max_batch = profile_max if max_batch is None else int(max_batch)
        self.max_total = int(self.decoder["max_total"])
        self.max_prompt = int(self.decoder["max_prompt"])
        self.windows = resolve_windows(windows, self.max_total)
        self.align = align or default_align(self.decoder, self.windows[-1])
        if self.align not in ALIGNS:
            raise InputError(f"align must be one of {', '.join(ALIGNS)}, got {align!r}")
        self._slice = self._slice_size(prompt_slice)
        self._user, self._scratch = shared_scratch(self.flavor, self.engine)
        self._prefill = self._context(1 if self.engine.num_optimization_profiles > 1 else 0, decode=False)
        self._decode = {}  # window size (or "grow") -> its decode context, made on first use
        self._alloc()
        self.sampler = self._device_sampler()
        self.batch, self.past = 0, 0
        self.closed = False

    # --- setup -------------------------------------------------------------------------------

    def _names(self) -> None:
        trt = self.flavor.trt
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.past_names = [n for n in names if is_past(n)]
        self.new_kv = bool(self.past_names) and all(new_of(n) in names for n in self.past_names)
        self.present_names = [(new_of if self.new_kv else present_of)(n) for n in self.past_names]
        missing = [n for n in (*SMALL_INPUTS, "logits", *self.present_names) if n not in names]
        if missing or not self.past_names:
            raise InputError(f"{self.path.name} lacks the KV-cache I/O {missing or ['past_key_values.*']}: "
                             "rebuild it from a causal-lm checkpoint exported with its cache")
        self.kv_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(self.past_names[0])))
        self.logits_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype("logits")))
        shape = self.engine.get_tensor_shape(self.past_names[0])
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.vocab = int(self.engine.get_tensor_shape("logits")[-1])
        self.next_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(NEXT_TOKEN))) if NEXT_TOKEN in names else None
        self.pipelines = self.next_dtype == np.int64  # greedy_tokens feeds next_token back as input_ids

    def _slice_size(self, asked: int | None) -> int:
        """Tokens per prompt slice (0: a prompt runs whole): `asked`, else the manifest's
        `decoder.prompt_slice` (the engine's prefill profile takes a cache), where this layout takes
        slices: engines with `new_key_values`, and "grow", or a left-aligned window that a
        sliding-window mask reads no slot of as out of reach (a slice's query sits up to the largest
        window + the slice - 1 slots after slot 0)."""
        built = int(self.decoder.get("prompt_slice") or 0)
        size = built if asked is None else int(asked)
        if not 0 <= size <= built:
            raise InputError(f"prompt_slice must be in 0..{built} (the engine's decoder.prompt_slice), got {asked}")
        sliding = int(self.decoder.get("sliding_window") or 0)
        fits = self.cache == "grow" or (self.align == "left" and not 0 < sliding < self.windows[-1] + size)
        return size if self.new_kv and fits else 0

    @property
    def prompt_slice(self) -> int:
        """Tokens per prompt slice this decoder runs (0: prompts run whole)."""
        return self._slice

    def _device_sampler(self):
        """The sampler engine beside this one (runtime/sampler_trt.py), when it can feed its tokens back."""
        from trt_seer.runtime.sampler_trt import DeviceSampler

        if not self.pipelines:
            return None
        return DeviceSampler.beside(self.path, self.manifest, self.vocab, self.logits_dtype.name, self.options,
                                    self.max_batch, self.stream)

    @property
    def samples(self) -> bool:
        """`sampled_tokens` runs here: a device sampler for temperature and top-p."""
        return self.sampler is not None

    def _context(self, profile: int, decode: bool):
        graphs = self.options.use_cuda_graph if self.options.use_cuda_graph is not None else self.cache == "window"
        # graphs for the decode step only: a prompt's shape is new almost every time
        config = runtime_config(self.engine, self.flavor, self._jit_cache, graphs and decode)
        strategy = getattr(self.flavor.trt, "DynamicShapesKernelSpecializationStrategy", None)
        if config is not None and strategy is not None:
            chosen = self.specialize if decode else "none"
            config.dynamic_shapes_kernel_specialization_strategy = getattr(strategy, chosen.upper())
        user = self._user
        if config is not None and user is not None:
            config.set_execution_context_allocation_strategy(user)
        ctx = (self.engine.create_execution_context(config) if config is not None
               else self.engine.create_execution_context(user) if user is not None
               else self.engine.create_execution_context())
        if ctx is None:
            raise TrtSeerError(f"TensorRT could not create an execution context for {self.path.name}")
        if user is not None:
            ctx.set_device_memory(self._scratch.device_ptr, self._scratch.nbytes)
        if profile and not ctx.set_optimization_profile_async(profile, int(self.stream.handle)):
            raise TrtSeerError(f"TensorRT could not select optimization profile {profile} of {self.path.name}")
        return ctx

    def _alloc(self) -> None:
        b, t, layers = self.max_batch, self.max_total, len(self.past_names)
        self.window = None  # the window the next decode step reads ("window" layout)
        self._row = self.head_dim * self.kv_dtype.itemsize  # bytes of one position of one head
        self._new = self._stage = None
        if self.new_kv:
            self._kv, self._new, self._stage = new_kv_buffers(layers * b * self.kv_heads, t, self._row, self.cache,
                                                              self._scratch, self.stream, max(1, self._slice))
        elif self.cache == "window":  # [layer][batch][head][window][dim], read by the step; its output
            self._kv = [cuda.DeviceBuffer(layers * b * self.kv_heads * n * self._row) for n in (t - 1, t)]
        else:  # two [batch][head][total][dim] buffers per layer, swapping roles every step
            kv_bytes = _nbytes((b, self.kv_heads, t, self.head_dim), self.kv_dtype)
            self._kv = [[cuda.DeviceBuffer(kv_bytes) for _ in self.past_names] for _ in range(2)]
        # a prompt slice's mask spans the largest window and the slice
        widest = {"attention_mask": t + max(0, self._slice - 1)}
        self._small = {n: cuda.DeviceBuffer(_nbytes((b, widest.get(n, t)), np.int64)) for n in SMALL_INPUTS}
        self._lane = Lane(self._small, b)
        self.lanes = (self._lane, Lane(self._small, b))  # runtime/fed_back.py: two steps in flight
        self._logits = cuda.HostDeviceBuffer(_nbytes((b, 1, self.vocab), self.logits_dtype))
        self._next = None if self.next_dtype is None else cuda.HostDeviceBuffer(_nbytes((b, 1), self.next_dtype))
        self._cur = 0
        self._bound = {}  # window -> the batch whose decode shapes and addresses its context has
        self.kv_cache_bytes = sum(buf.nbytes for buf in self._buffers())

    def _buffers(self) -> list:
        if self.new_kv:
            return [*self._kv, self._new]
        return list(self._kv) if self.cache == "window" else [*self._kv[0], *self._kv[1]]

    # --- running -----------------------------------------------------------------------------

    def reset(self, batch: int) -> None:
        """Starts a new batch of sequences on an empty cache."""
        if not 1 <= batch <= self.max_batch:
            raise InputError(f"batch {batch} is outside 1..{self.max_batch} (the engine's profile, or the "
                             "decoder's max_batch)")
        self.batch, self.past, self._cur, self.window = int(batch), 0, 0, None

    def warm_up(self, batch: int) -> None:
        """Runs one decode step in every window at this batch size (on a zeroed cache), so that each
        window's context, specialized kernels and CUDA graph exist before the first real sequence
        reaches it; then starts afresh (`reset`)."""
        if self.cache != "window":
            return
        rows = len(self.past_names) * batch * self.kv_heads
        for w in self.windows:
            self.reset(batch)
            cuda.memset_async(self._kv[0].device_ptr, 0, rows * w * self._row, self.stream)
            self.window, self.past = w, 1
            ones = np.ones((batch, 2), np.int64)
            self.step(np.zeros((batch, 1), np.int64), ones, ones[:, :1])
        self.reset(batch)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Runs the new tokens on the cache; returns the last position's logits [batch, vocab] (float32)."""
        self._run(input_ids, attention_mask, position_ids, self._logits,
                  _nbytes((self.batch, 1, self.vocab), self.logits_dtype))
        logits = self._logits.host_view((self.batch, self.vocab), self.logits_dtype)
        return logits.astype(np.float32, copy=True)

    def next_tokens(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """As `step`, but returns the greedy next token per row (batch,) int64. With a `next_token`
        output in the engine (ArgMax over the logits) only the ids come back to the host; without
        one, the logits do and the argmax runs here."""
        if self._next is None:
            return self.step(input_ids, attention_mask, position_ids).argmax(axis=-1).astype(np.int64)
        self._run(input_ids, attention_mask, position_ids, self._next, self.batch * self.next_dtype.itemsize)
        return self._next.host_view((self.batch,), self.next_dtype).astype(np.int64)

    def _run(self, input_ids, attention_mask, position_ids, out, out_bytes: int) -> None:
        """One step on the GPU; copies `out_bytes` of `out` (an output's host-device buffer) back."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        self._enqueue(feeds, self._lane, out.device_ptr, out.host_ptr, out_bytes)
        self.stream.synchronize()
        self.last_gpu_ms = self._lane.end.elapsed_ms(self._lane.start)

    def _enqueue(self, feeds: dict, lane: Lane, out_ptr: int, host_ptr: int, out_bytes: int,
                 ids_on_device: bool = False, then=None) -> None:
        """Enqueues one step: the feeds up from `lane`'s host memory (`input_ids` instead copied on the
        device from the last `next_token` where `ids_on_device`), the engine, the cache kept, then
        `out_bytes` from `out_ptr` down to `host_ptr`; `lane.end` recorded after it. No wait, but for a
        prompt longer than `prompt_slice`: it runs as slices, each on the cache of those before it,
        and the host waits for each slice to finish before it writes the next one's feeds into the
        lane's host buffers (the copies up read them); a failed slice leaves an empty cache.
        `then()`, where given, enqueues more work on the step's output before the copy down (the sampler)."""
        self._check(feeds)
        parts = prompt_slices(feeds, self._slice) if self.past == 0 else [feeds]
        try:
            for i, part in enumerate(parts):
                if i:
                    self.stream.synchronize()
                self._launch(part, lane, ids_on_device, first=i == 0)
        except Exception:
            if len(parts) > 1:  # part of a prompt in the cache is nothing to go on from
                self.reset(self.batch)
            raise
        if then is not None:
            then()
        cuda.copy_async(host_ptr, out_ptr, out_bytes, "DeviceToHost", self.stream.handle)
        lane.end.record(self.stream.handle)

    def _launch(self, feeds: dict, lane: Lane, ids_on_device: bool, first: bool) -> None:
        """The feeds up, the engine on them, the cache kept (`lane.start` recorded before the engine
        where `first`)."""
        seq = feeds["input_ids"].shape[1]
        decode = seq == 1 and self.past > 0
        window = self.cache == "window"
        ctx = self._decode_context(self.window if window else "grow") if decode else self._prefill
        stream = self.stream.handle
        if window and self.past:
            feeds = {**feeds, "attention_mask": window_mask(feeds["attention_mask"], self.window, self.align, seq)}
        rebind = not (window and decode and self._bound.get(self.window) == self.batch)
        for name, value in feeds.items():
            buf = self._small[name]
            if name == "input_ids" and ids_on_device:
                cuda.copy_async(buf.device_ptr, self._next.device_ptr, value.nbytes, "DeviceToDevice", stream)
            else:
                host = lane.host(name)
                np.copyto(host[:value.size].reshape(value.shape), value, casting="same_kind")
                cuda.copy_async(buf.device_ptr, host.ctypes.data, value.nbytes, "HostToDevice", stream)
            if rebind:
                self._bind(ctx, name, value.shape, buf.device_ptr)
        if rebind:
            self._bind_cache(ctx, seq, decode)
            ctx.set_tensor_address("logits", self._logits.device_ptr)
            if self._next is not None:
                ctx.set_tensor_address(NEXT_TOKEN, self._next.device_ptr)
        if first:
            lane.start.record(stream)
        if not ctx.execute_async_v3(int(stream)):
            why = self._logger.errors[-1].splitlines()[0] if self._logger.errors else "see the TensorRT log"
            hint = (f" (a step of {self.batch} x {seq} tokens needs more GPU memory than it could get: fewer or "
                    "shorter prompts at once, or an engine built with a smaller --prompt-slice or a larger --workspace-mb)"
                    if "OutOfMemory" in why else "")
            raise TrtSeerError(f"TensorRT failed to run {self.path.name}: {why}{hint}")
        if window or self.new_kv:
            self._keep(seq, decode)
        self._cur, self.past = 1 - self._cur, self.past + seq

    def greedy_tokens(self, input_ids: np.ndarray, attention_mask: np.ndarray, count: int) -> Iterator[np.ndarray]:
        """Greedy decoding with each step's `next_token` fed back on the device: yields `count` token
        arrays (batch,) int64, the prompt's first, each while the following step already runs
        (runtime/fed_back.py). Needs an int64 `next_token` output (`pipelines`); on a new batch (`reset`)."""
        if not self.pipelines:
            raise UnsupportedError(f"{self.path.name} has no int64 next_token output to feed back")
        return fed_back(self, input_ids, attention_mask, count)

    def sampled_tokens(self, input_ids: np.ndarray, attention_mask: np.ndarray, count: int, sampling,
                       rng: np.random.Generator) -> Iterator[np.ndarray]:
        """As `greedy_tokens`, each token drawn by the device sampler (`samples`) with `sampling`'s
        temperature (> 0) and top_p (no top-k: that is the host's), from runtime/sampling.DRAWS
        uniform numbers per row per step out of `rng`: the draws, and so the tokens, of host sampling."""
        if self.sampler is None:
            raise UnsupportedError(f"{self.path.name} has no device sampler beside it: sampling runs on the host")
        if not sampling.temperature > 0 or sampling.top_k:
            raise UnsupportedError("the device sampler takes a temperature > 0 and top-p, not top-k")
        then = self.sampler.draws_after(self._logits.device_ptr, self._next.device_ptr, self.batch, sampling, rng)
        return fed_back(self, input_ids, attention_mask, count, then)

    def enqueue_token_step(self, feeds: dict, lane: Lane, ids_on_device: bool = False, then=None) -> None:
        """Enqueues one step whose token (`next_token`, or the sampler's draw written over it) comes
        back into `lane.token`; no wait (`_enqueue`, runtime/fed_back.py)."""
        self._enqueue(feeds, lane, self._next.device_ptr, lane.token.ctypes.data, self.batch * 8, ids_on_device, then)

    def _decode_context(self, key):
        if key not in self._decode:
            self._decode[key] = self._context(0, decode=True)
        return self._decode[key]

    def _check(self, feeds: dict) -> int:
        seq = check_step(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"], self.batch, self.past,
                         self.max_total, self.path.name)
        if self.past == 0 and seq > self.max_prompt:
            raise InputError(f"prompt of {seq} tokens exceeds the engine's longest prompt ({self.max_prompt}); "
                             "rebuild with a larger --seq max")
        if self.cache == "window" and self.past == 0 and seq > self.windows[-1]:
            raise InputError(f"prompt of {seq} tokens leaves no room to generate in the engine's max total "
                             f"({self.max_total}); rebuild with a larger --max-total")
        if self.past > 0 and seq != 1 and self.engine.num_optimization_profiles > 1:
            raise UnsupportedError("after the prompt, a decoder engine takes one token per row per step")
        return seq

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.stream.synchronize()
        self.closed = True
        self._jit_cache.save()
        self._prefill, self._decode = None, {}  # the contexts go before the memory they use
        if self.sampler is not None:
            self.sampler.close()
        stage = None if self._stage is self._scratch else self._stage  # the scratch may be the staging too
        for buf in (*self._buffers(), *self._small.values(), self._logits, self._next, self._scratch, stage):
            if buf is not None:
                buf.close()
        self.engine, self._runtime = None, None
        for owned in (*self.lanes, self.stream):
            owned.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
