"""`TensorRTDecoder` stepping (runtime/decoder_trt.py) on CPU, both cache layouts: prefill on an
empty cache, then one token per step, through the decoder's own buffers, bindings, window masks,
2-D cache copies and window promotions. CUDA memory is ordinary memory (copies are memmoves, 2-D copies row by row) and
the "engine" is a toy decoder that computes its logits from the whole cache it is bound to, so a
step reads a wrong, stale or misaligned cache entry only by giving other logits than the same
sequence run at once. Every test runs on both kinds of engine: with `present` outputs (the window +
the new token) and with `new_key_values` (only the step's own keys and values, engine/kv_outputs.py).
Real kernels: tests/test_generate_gpu.py."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import trt_seer.runtime.cuda as cuda
from trt_seer.decoder_io import decoder_io, is_past, new_of, position_ids, step_feeds
from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, TrtSeerError, UnsupportedError
from trt_seer.runtime import decoder_trt
from trt_seer.runtime.loader import EngineOptions, LoadedEngine

LAYERS, HEADS, DIM, VOCAB = 2, 1, 2, 13
MAX_TOTAL, MAX_PROMPT, MAX_BATCH = 12, 8, 3


class MemoryRuntime:
    """cudart over host memory: allocations are ctypes buffers, copies happen at once."""

    def __init__(self):
        self.blocks, self.copies2d, self.copied = {}, 0, []

    def _alloc(self, size):
        block = ctypes.create_string_buffer(size)
        self.blocks[ctypes.addressof(block)] = block
        return (0, ctypes.addressof(block))

    cudaMalloc = cudaMallocHost = _alloc

    def cudaFree(self, ptr):
        return (0,)

    cudaFreeHost = cudaFree

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        self.copied.append((kind, int(nbytes)))
        ctypes.memmove(int(dst), int(src), int(nbytes))
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dst_pitch, src, src_pitch, width, height, kind, stream):
        self.copies2d += 1
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)
        return (0,)

    def cudaMemsetAsync(self, ptr, value, nbytes, stream):
        ctypes.memset(ptr, value, nbytes)
        return (0,)


class Handle:
    """A stream or event: the work is done when enqueued."""

    def __init__(self, *args, **kwargs):
        self.handle = self.ptr = 7

    def synchronize(self):
        pass

    def record(self, stream):
        pass

    def elapsed_ms(self, start):
        return 0.5

    def close(self):
        pass


def array_at(address, shape, dtype):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_uint8 * n).from_address(address), dtype=dtype).reshape(shape)


def new_kv(ids, positions, layer):
    """The key and value a layer stores for tokens `ids` at `positions`: (batch, heads, seq, dim)."""
    key = np.stack([ids, positions + 100 * layer], -1)[:, None].astype(np.float32)
    return key, key * np.float32(2) + np.float32(1)


def logits_from(keys, values, mask):
    """Each visible cache entry votes for its token, weighted by what its key and value hold."""
    out = np.zeros((mask.shape[0], VOCAB), np.float32)
    for key, value in zip(keys, values):
        weight = (1 + key[:, 0, :, 1] + value[:, 0, :, 1]) * mask  # (batch, positions)
        for v in range(VOCAB):
            out[:, v] += (weight * (key[:, 0, :, 0] == v)).sum(1)
    return out


def reference(ids, mask):
    """The last position's logits of the whole sequence run at once, no cache."""
    pos = position_ids(mask)
    kv = [new_kv(ids, pos, layer) for layer in range(LAYERS)]
    return logits_from([k for k, _ in kv], [v for _, v in kv], mask)


class Context:
    """The toy decoder: present = past + this step's keys/values; logits over every present entry
    the attention mask shows. Reads and writes the memory it is bound to, as TensorRT does."""

    def __init__(self, engine, strategy=None):
        self.engine, self.shapes, self.addresses, self.profile, self.runs = engine, {}, {}, 0, 0
        self.strategy, self.memory = strategy, None

    def set_device_memory(self, address, nbytes):
        assert self.strategy == "USER_MANAGED", "device memory is set only on a user-managed context"
        self.memory = (int(address), int(nbytes))

    def set_optimization_profile_async(self, profile, stream):
        self.profile = profile
        return True

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, address):
        self.addresses[name] = int(address)
        return True

    def execute_async_v3(self, stream):
        ids = array_at(self.addresses["input_ids"], self.shapes["input_ids"], np.int64)
        pos = array_at(self.addresses["position_ids"], self.shapes["position_ids"], np.int64)
        mask = array_at(self.addresses["attention_mask"], self.shapes["attention_mask"], np.int64)
        presents = {}
        for name in self.engine.past_names:
            past = array_at(self.addresses[name], self.shapes[name], np.float32)
            layer, kind = int(name.split(".")[1]), name.rsplit(".", 1)[1]
            new = new_kv(ids, pos, layer)[kind == "value"]
            presents[name] = np.concatenate([past, new], axis=2)
        assert mask.shape[1] == next(iter(presents.values())).shape[2], "mask and cache lengths differ"
        for name, value in presents.items():
            if self.engine.new_kv:  # only the step's own positions
                value = value[:, :, value.shape[2] - ids.shape[1]:]
                array_at(self.addresses[new_of(name)], value.shape, np.float32)[...] = value
            else:
                array_at(self.addresses[name.replace("past_key_values.", "present.")], value.shape, np.float32)[...] = value
        keys = [presents[n] for n in self.engine.past_names if n.endswith("key")]
        values = [presents[n] for n in self.engine.past_names if n.endswith("value")]
        logits = logits_from(keys, values, mask)
        array_at(self.addresses["logits"], (ids.shape[0], 1, VOCAB), np.float32)[:, 0] = logits
        if "next_token" in self.engine.names:  # ArgMax in the graph
            array_at(self.addresses["next_token"], (ids.shape[0], 1), self.engine.next_dtype)[:, 0] = logits.argmax(-1)
        self.runs += 1
        return True


class Engine:
    """Decoder I/O as export writes it (decoder_io), two optimization profiles (decode, prefill)."""

    num_optimization_profiles = 2

    def __init__(self, next_token=False, new_kv=False):
        """`next_token`: False (no such output), True (int32) or "int64"."""
        self.next_dtype = np.int64 if next_token == "int64" else np.int32
        inputs, outputs = decoder_io(LAYERS)
        if new_kv:
            outputs = ("logits", *(new_of(n) for n in inputs if is_past(n)))
        self.new_kv = new_kv
        self.names = inputs + outputs + (("next_token",) if next_token else ())
        self.num_io_tensors = len(self.names)
        self.past_names = [n for n in inputs if is_past(n)]
        self.contexts = []

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_dtype(self, name):
        if name == "next_token":
            return np.dtype(self.next_dtype).name
        return "float32" if name == "logits" or name.startswith(("past_", "present.", "new_key")) else "int64"

    def get_tensor_shape(self, name):
        if name == "next_token":
            return (-1, 1)
        if name == "logits":
            return (-1, 1, VOCAB)
        return (-1, HEADS, -1, DIM) if name.startswith(("past_", "present.", "new_key")) else (-1, -1)

    device_memory_size_v2 = 96  # the scratch the largest profile needs

    def create_execution_context(self, strategy=None):
        self.contexts.append(Context(self, strategy))
        return self.contexts[-1]


@pytest.fixture(params=["present", "new_key_values"])
def open_decoder(monkeypatch, tmp_path, request):
    """`open_decoder(cache)`: a TensorRTDecoder over the toy engine, on simulated CUDA; each test
    runs with both kinds of cache output."""
    rt = MemoryRuntime()
    monkeypatch.setattr(cuda, "cudart", lambda: rt)
    monkeypatch.setattr(cuda, "memcpy_kind", lambda kind: kind)
    monkeypatch.setattr(cuda, "Stream", Handle)
    monkeypatch.setattr(cuda, "Event", Handle)
    manifest = {"decoder": {"max_total": MAX_TOTAL, "max_prompt": MAX_PROMPT},
                "profiles": [{"batch": [1, MAX_BATCH, MAX_BATCH]}]}
    monkeypatch.setattr(manifest_io, "read_engine_manifest", lambda path: manifest)
    strategies = types.SimpleNamespace(USER_MANAGED="USER_MANAGED")
    flavor = types.SimpleNamespace(trt=types.SimpleNamespace(nptype=np.dtype, ExecutionContextAllocationStrategy=strategies))
    jit = types.SimpleNamespace(attach=lambda config: None, save=lambda: None)

    def load_engine(path, options, manifest):
        return LoadedEngine(path, manifest, flavor, types.SimpleNamespace(index=0), types.SimpleNamespace(errors=[]),
                            object(), Engine(manifest.get("next_token", False), request.param != "present"), jit)

    monkeypatch.setattr(decoder_trt, "load_engine", load_engine)
    path = tmp_path / "toy.fp32.engine"
    path.write_bytes(b"engine")
    opened = []

    def make(cache, windows=None, sliding_window=None, next_token=False, says_sliding=True, max_batch=None,
             prompt_slice=None):
        """`sliding_window`: the manifest's (None: full attention); `says_sliding` False: no such key;
        `prompt_slice`: the manifest's."""
        manifest["decoder"]["sliding_window"], manifest["next_token"] = sliding_window, next_token
        manifest["decoder"]["prompt_slice"] = prompt_slice
        if not says_sliding:
            del manifest["decoder"]["sliding_window"]
        opened.append(decoder_trt.TensorRTDecoder(path, EngineOptions(), cache=cache, windows=windows,
                                                  max_batch=max_batch))
        opened[-1].rt = rt
        return opened[-1]

    yield make
    for dec in opened:
        dec.close()


def prompt_batch():
    """Two rows, the second left-padded: (input_ids, attention_mask), (2, 5)."""
    ids = np.array([[3, 7, 7, 1, 9], [0, 0, 4, 12, 4]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)
    return ids, mask


@pytest.mark.parametrize("cache", ["window", "grow"])
def test_prefill_then_decode_steps_match_the_whole_sequence_at_once(open_decoder, cache):
    """Prefill on the prefill profile, then six one-token steps on the decode profile: every step's
    logits equal those of the whole sequence so far run without a cache."""
    dec = open_decoder(cache)
    ids, mask = prompt_batch()
    dec.reset(batch=2)
    feeds = step_feeds(ids, mask)
    logits = dec.step(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"])
    np.testing.assert_array_equal(logits, reference(ids, mask))
    for i in range(6):
        token = (logits.argmax(1) + i) % VOCAB  # tokens that depend on what came before
        ids = np.concatenate([ids, token[:, None]], 1)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        feeds = step_feeds(ids[:, -1:], mask, seq=1)
        logits = dec.step(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"])
        np.testing.assert_array_equal(logits, reference(ids, mask), err_msg=f"{cache} step {i}")
    prefill, decode = dec.engine.contexts
    assert (decode.profile, prefill.profile) == (0, 1) and (decode.runs, prefill.runs) == (6, 1)
    assert dec.past == 11 and dec.last_gpu_ms == 0.5
    # present: the prompt lands, then each new position (grow: the engine writes the grown cache);
    # new_key_values: the prompt moves through the 96-byte scratch (8 rows of 5 positions, 2 a
    # chunk: 4 chunks out and back), then each new position (grow: the cache, then the new position)
    want = {("present", "window"): 1 + 6, ("present", "grow"): 0, ("new", "window"): 8 + 6, ("new", "grow"): 2 * 6}
    assert dec.rt.copies2d == want["new" if dec.new_kv else "present", cache]


def decode_along(dec, ids, mask, steps):
    """Prefill, then `steps` one-token steps, each checked against the whole sequence at once;
    returns the window each step read."""
    dec.reset(batch=len(ids))
    logits = dec.step(ids, mask, position_ids(mask))
    np.testing.assert_array_equal(logits, reference(ids, mask))
    read = []
    for i in range(steps):
        token = (logits.argmax(1) + i) % VOCAB
        ids = np.concatenate([ids, token[:, None]], 1)
        mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], 1)
        read.append(dec.window)
        logits = dec.step(ids[:, -1:], mask, position_ids(mask, 1))
        np.testing.assert_array_equal(logits, reference(ids, mask), err_msg=f"step {i} in window {read[-1]}")
    return read


@pytest.mark.parametrize("sliding_window,says,align", [(None, True, "left"), (12, True, "left"), (11, True, "right"),
                                                      (4, True, "right"), (None, False, "right")])
def test_sequences_move_up_the_window_ladder_with_the_same_logits(open_decoder, sliding_window, says, align):
    """Windows 2, 4, 8 and 11: a 2-token prompt steps in the smallest window that holds it and is
    promoted when it fills it; each window has its own decode context, bound once per batch size.
    Left-aligned only when the manifest says the attention sees slot 0 from the largest window's step
    (11 slots after it: a sliding window of 12 does, one of 11 does not)."""
    dec = open_decoder("window", windows=(2, 4, 8), sliding_window=sliding_window, says_sliding=says)
    assert dec.windows == (2, 4, 8, 11) and dec.align == align
    ids, mask = np.array([[3, 7], [0, 4]], np.int64), np.array([[1, 1], [0, 1]], np.int64)
    read = decode_along(dec, ids, mask, steps=MAX_TOTAL - 2)
    assert read == [2, 4, 4, 8, 8, 8, 8, 11, 11, 11]
    prefill, *decode = dec.engine.contexts
    assert [c.runs for c in decode] == [1, 2, 4, 3] and prefill.runs == 1
    assert all(c.shapes["attention_mask"] == (2, w + 1) for c, w in zip(decode, dec.windows))
    decode_along(dec, ids[:1, -1:], mask[:1, -1:], steps=4)  # another batch size: bound again, same answers
    assert len(dec.engine.contexts) == 5


@pytest.mark.parametrize("cache,windows", [("window", (2, 4, 8)), ("window", None), ("grow", None)])
@pytest.mark.parametrize("size", [2, 3, 7])
def test_a_prompt_longer_than_the_slice_runs_in_slices_with_the_same_logits(open_decoder, cache, windows, size):
    """An engine whose manifest gives `prompt_slice` takes 8-token prompts (row 1 left-padded by 3)
    `size` tokens at a time, each slice on the prefill profile over the cache so far (the window it
    sits in, or the grown cache), a last single token (7 + 1) on the decode profile; the logits after the
    prompt and at every step after equal the whole sequence's at once. `present` engines (built
    before slices) take the prompt whole."""
    dec = open_decoder(cache, windows=windows, prompt_slice=size)
    ids = np.array([[3, 7, 7, 1, 9, 2, 5, 11], [0, 0, 0, 4, 12, 4, 6, 1], [1, 2, 3, 4, 5, 6, 7, 8]], np.int64)
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    decode_along(dec, ids, mask, steps=MAX_TOTAL - 8)  # the engine's largest batch: the buffers' widest masks
    prefill = dec.engine.contexts[0]
    slices = [min(size, 8 - a) for a in range(0, 8, size)] if dec.new_kv else [8]
    assert dec.prompt_slice == (size if dec.new_kv else 0)
    assert prefill.runs == sum(1 for n in slices if n > 1 or len(slices) == 1)
    if dec.new_kv:  # the last slice of several tokens read the cache so far: its window, or the grown cache
        last = max(a for a in range(0, 8, size) if 8 - a > 1)
        held = last if cache == "grow" or not last else next(w for w in dec.windows if w >= last)
        assert prefill.shapes["past_key_values.0.key"][2] == held
        assert prefill.shapes["attention_mask"] == (3, held + min(size, 8 - last))


def test_a_slice_no_larger_than_the_engines_may_be_asked_for(open_decoder):
    """`prompt_slice=0` runs prompts whole on an engine built for slices; a larger slice than the
    engine's (its buffers and profile are sized for that) is refused in one line."""
    dec = open_decoder("window", windows=(2, 4, 8), prompt_slice=3)
    whole = decoder_trt.TensorRTDecoder(dec.path, EngineOptions(), windows=(2, 4, 8), prompt_slice=0)
    assert (dec.prompt_slice, whole.prompt_slice) == ((3, 0) if dec.new_kv else (0, 0))
    ids = np.array([[5, 6, 7, 8, 9, 10, 11]], np.int64)
    decode_along(whole, ids, np.ones_like(ids), steps=2)
    assert whole.engine.contexts[0].runs == 1
    whole.close()
    with pytest.raises(InputError, match=r"prompt_slice must be in 0\.\.3"):
        decoder_trt.TensorRTDecoder(dec.path, EngineOptions(), prompt_slice=4)


@pytest.mark.parametrize("sliding_window,slices", [(14, True), (13, False), (None, True)])
def test_a_sliding_window_model_takes_slices_only_where_its_mask_reaches_every_slot(open_decoder,
                                                                                  sliding_window, slices):
    """Left-aligned windows put a slice's last query the largest window + the slice - 1 slots after
    slot 0 (11 + 2): a sliding window that reaches no further than that takes the prompt whole."""
    dec = open_decoder("window", windows=(2, 4, 8), sliding_window=sliding_window, prompt_slice=3)
    assert dec.align == "left" and dec.prompt_slice == (3 if slices and dec.new_kv else 0)


def test_a_failed_slice_leaves_an_empty_cache_for_the_next_prompt(open_decoder, monkeypatch):
    dec = open_decoder("window", windows=(2, 4, 8), prompt_slice=2)
    if not dec.new_kv:
        pytest.skip("engines with present outputs take prompts whole")
    ids = np.array([[5, 6, 7, 8, 9]], np.int64)
    dec.reset(1)
    real, runs = dec._prefill.execute_async_v3, []

    def second_fails(stream):
        runs.append(stream)
        return len(runs) != 2 and real(stream)

    monkeypatch.setattr(dec._prefill, "execute_async_v3", second_fails)
    with pytest.raises(TrtSeerError, match="TensorRT failed to run"):
        dec.step(ids, np.ones_like(ids), position_ids(np.ones_like(ids)))
    assert (dec.past, dec.window) == (0, None)
    got = dec.step(ids, np.ones_like(ids), position_ids(np.ones_like(ids)))
    np.testing.assert_array_equal(got, reference(ids, np.ones_like(ids)))


def test_a_right_aligned_window_takes_the_prompt_whole(open_decoder):
    """A sliding-window model's window is right-aligned, which a slice's keys and values are not
    laid out for: the prompt runs at once, with the same logits."""
    dec = open_decoder("window", windows=(2, 4, 8), sliding_window=4, prompt_slice=2)
    assert dec.align == "right" and dec.prompt_slice == 0
    ids = np.array([[5, 6, 7, 8, 9]], np.int64)
    decode_along(dec, ids, np.ones_like(ids), steps=3)
    assert dec.engine.contexts[0].runs == 1


def test_greedy_tokens_after_a_sliced_prompt_equal_those_after_the_whole(open_decoder):
    from trt_seer.runtime.generate import Sampling, generate_ids

    prompts = [[3, 7, 7, 1, 9, 2, 5], [4, 12, 4]]
    want = list(generate_ids(open_decoder("window", windows=(2, 4, 8), next_token="int64"), prompts,
                             Sampling(max_new_tokens=4), set(), 0))
    dec = open_decoder("window", windows=(2, 4, 8), next_token="int64", prompt_slice=3)
    assert list(generate_ids(dec, prompts, Sampling(max_new_tokens=4), set(), 0)) == want
    assert dec.engine.contexts[0].runs == (2 if dec.new_kv else 1)  # 3 + 3 (+ 1 on the decode profile)


def test_a_long_prompt_starts_in_a_larger_window(open_decoder):
    dec = open_decoder("window", windows=(2, 4, 8))
    ids = np.array([[5, 6, 7, 8, 9]], np.int64)
    assert decode_along(dec, ids, np.ones_like(ids), steps=4) == [8, 8, 8, 8]


@pytest.mark.parametrize("cache", ["window", "grow"])
def test_reset_starts_a_new_batch_on_an_empty_cache(open_decoder, cache):
    """A second sequence batch (another size) after a first gives the same logits as on a fresh decoder."""
    dec = open_decoder(cache)
    ids, mask = prompt_batch()
    dec.reset(2)
    dec.step(ids, mask, position_ids(mask))
    dec.step(np.array([[5], [6]]), np.ones((2, 6), np.int64), np.array([[5], [3]]))
    one_ids, one_mask = np.array([[2, 11, 2]]), np.ones((1, 3), np.int64)
    dec.reset(1)
    got = dec.step(one_ids, one_mask, position_ids(one_mask))
    np.testing.assert_array_equal(got, reference(one_ids, one_mask))
    more_ids, more_mask = np.concatenate([one_ids, [[8]]], 1), np.ones((1, 4), np.int64)
    got = dec.step(more_ids[:, -1:], more_mask, position_ids(more_mask, 1))
    np.testing.assert_array_equal(got, reference(more_ids, more_mask))


def test_steps_outside_the_engine_are_refused_before_running(open_decoder):
    dec = open_decoder("window")
    with pytest.raises(InputError, match=r"call reset\(batch\) before step"):
        dec.step(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), np.zeros((1, 2), np.int64))
    dec.reset(1)
    with pytest.raises(InputError, match="attention_mask must be"):
        dec.step(np.ones((1, 2), np.int64), np.ones((1, 3), np.int64), np.zeros((1, 2), np.int64))
    with pytest.raises(InputError, match="exceeds the engine's longest prompt"):
        long = np.ones((1, MAX_PROMPT + 1), np.int64)
        dec.step(long, long, position_ids(long))
    assert [c.runs for c in dec.engine.contexts] == [0]  # the prefill context; decode ones come on first use


def test_a_step_tensorrt_has_no_memory_for_says_what_to_change(open_decoder, monkeypatch):
    """TensorRT's OutOfMemory on a step comes back as one error naming the step's size and what to
    change; other failures keep TensorRT's message alone."""
    dec = open_decoder("window")
    dec.reset(2)
    ids, mask = prompt_batch()

    def fails(why):
        def execute(stream):
            dec._logger.errors.append(why)
            return False
        monkeypatch.setattr(dec._prefill, "execute_async_v3", execute)

    fails("[localCheckMacros.cpp::getErrorStr::132] Error Code 2: OutOfMemory (Requested size was 7549747200 bytes.)")
    with pytest.raises(TrtSeerError, match=r"OutOfMemory .*\(a step of 2 x 5 tokens needs more GPU memory .*"
                                           r"--workspace-mb\)$"):
        dec.step(ids, mask, position_ids(mask))
    fails("Error Code 1: Cuda Runtime (an illegal memory access)")
    with pytest.raises(TrtSeerError, match=r"an illegal memory access\)$"):
        dec.step(ids, mask, position_ids(mask))


def test_warm_up_runs_every_window_once_and_leaves_a_fresh_start(open_decoder):
    dec = open_decoder("window", windows=(2, 4, 8))
    dec.warm_up(2)
    prefill, *decode = dec.engine.contexts
    assert prefill.runs == 0 and [c.runs for c in decode] == [1, 1, 1, 1]
    assert [c.shapes["past_key_values.0.key"][2] for c in decode] == [2, 4, 8, 11]
    assert dec.past == 0 and dec.window is None
    ids, mask = np.array([[3, 7], [0, 4]], np.int64), np.array([[1, 1], [0, 1]], np.int64)
    decode_along(dec, ids, mask, steps=6)  # the warmed-up contexts give the right answers
    assert len(dec.engine.contexts) == 5


@pytest.mark.parametrize("next_token", [True, False])
def test_greedy_generation_brings_back_only_ids_when_the_engine_has_next_token(open_decoder, next_token):
    """generate_ids uses `next_tokens` when greedy: with an ArgMax output only the ids come back
    (no logits copy at all), and the tokens equal the host argmax of the logits path."""
    from trt_seer.runtime.generate import Sampling, generate_ids

    prompts = [[3, 7, 7, 1, 9], [4, 12, 4]]
    want = list(generate_ids(open_decoder("window", windows=(2, 4, 8)), prompts, Sampling(max_new_tokens=6),
                             set(), 0))
    dec = open_decoder("window", windows=(2, 4, 8), next_token=next_token)
    assert (dec.next_dtype is not None) == next_token
    dec.rt.copied.clear()
    assert list(generate_ids(dec, prompts, Sampling(max_new_tokens=6), set(), 0)) == want
    back = [n for kind, n in dec.rt.copied if kind == "DeviceToHost"]
    assert back == ([2 * 4] if next_token else [2 * VOCAB * 4]) * 6


def test_generation_stats_carry_the_decoders_device_time(open_decoder):
    """`generate --stats` (runtime/gen_stats.py) over the TensorRT decoder: device ms per decode step
    from its CUDA events, one decode step per token after the first, both batches counted."""
    from trt_seer.runtime.gen_stats import TimedStep, stats_text
    from trt_seer.runtime.generate import Sampling, generate_ids

    timed = TimedStep(open_decoder("window", windows=(2, 4, 8), next_token=True))
    assert callable(timed.next_tokens)
    for prompts in ([[3, 7, 7, 1, 9], [4, 12, 4]], [[5]]):
        assert len(list(generate_ids(timed, prompts, Sampling(max_new_tokens=5), set(), 0))) == 5 * len(prompts)
    stats = timed.stats()
    assert stats["device_ms_per_step"] == 0.5 and stats["decode_steps"] == 8 and stats["batches"] == 2
    assert stats["ttft_ms"] > 0 and stats["decode_tokens_per_s"] > 0
    assert "device 0.500 ms/step" in stats_text(stats)


def test_copies_per_step_follow_the_alignment(open_decoder, monkeypatch):
    """Left: one position per row goes into the window each step; right: the whole window slides
    (with `new_key_values`, out to the staging buffer and back, then the new position)."""
    moved = {}
    for align in ("left", "right"):
        dec = open_decoder("window", windows=(8,))
        dec.align, seen, real = align, [], type(dec.rt).cudaMemcpy2DAsync
        monkeypatch.setattr(dec.rt, "cudaMemcpy2DAsync", lambda *a, rt=dec.rt: seen.append(a[4] * a[5]) or real(rt, *a))
        ids = np.array([[3, 7, 1]], np.int64)
        dec.reset(1)
        dec.step(ids, np.ones_like(ids), position_ids(np.ones_like(ids)))
        per_step = []
        for i in range(3):
            seen.clear()
            mask = np.ones((1, 4 + i), np.int64)
            dec.step(np.array([[i]]), mask, position_ids(mask, 1))
            per_step.append(sum(seen))
        moved[align] = per_step
    rows, row = 2 * LAYERS, DIM * 4  # keys and values per layer, one float32 position
    window = (2 * 7 + 1) * rows * row if dec.new_kv else 8 * rows * row
    assert moved == {"left": [rows * row] * 3, "right": [window] * 3}


@pytest.mark.parametrize("cache", ["window", "grow"])
def test_a_decoder_for_fewer_sequences_holds_a_smaller_cache_and_the_same_logits(open_decoder, cache):
    """max_batch below the engine's profile: the KV cache is allocated for that many sequences (one
    sequence of a batch-8 engine holds an eighth), the logits are the full decoder's, and a larger
    batch or a max_batch outside the profile is refused in one line."""
    full = open_decoder(cache, windows=(2, 4, 8) if cache == "window" else None)
    one = open_decoder(cache, windows=(2, 4, 8) if cache == "window" else None, max_batch=1)
    assert one.kv_cache_bytes * MAX_BATCH == full.kv_cache_bytes
    ids = np.array([[5, 6, 7]], np.int64)
    assert decode_along(one, ids, np.ones_like(ids), steps=6) == decode_along(full, ids, np.ones_like(ids), steps=6)
    with pytest.raises(InputError, match=r"batch 2 is outside 1\.\.1"):
        one.reset(2)
    with pytest.raises(InputError, match=rf"max_batch must be in 1\.\.{MAX_BATCH}"):
        open_decoder(cache, max_batch=MAX_BATCH + 1)


def test_every_context_shares_one_scratch_block(open_decoder):
    """The prefill context and every window's decode context are user-managed and run on one block
    of the engine's largest scratch size, allocated once (not one block per context)."""
    dec = open_decoder("window", windows=(2, 4, 8))
    ids, mask = prompt_batch()
    dec.reset(batch=2)
    feeds = step_feeds(ids, mask)
    logits = dec.step(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"])
    for _ in range(6):  # past 8 positions: the prefill context and the 8-slot window's, at least
        ids = np.concatenate([ids, logits.argmax(1)[:, None]], 1)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        feeds = step_feeds(ids[:, -1:], mask, seq=1)
        logits = dec.step(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"])
    np.testing.assert_array_equal(logits, reference(ids, mask))
    contexts = dec.engine.contexts
    assert len(contexts) >= 3 and {c.strategy for c in contexts} == {"USER_MANAGED"}
    assert {c.memory for c in contexts} == {(dec._scratch.device_ptr, 96)}
    others = [b for at, b in dec.rt.blocks.items() if dec._new is None or at != dec._new.device_ptr]
    assert sum(1 for b in others if len(b) == 96) == 1  # (`_new`, 12 rows of 8 bytes, is no scratch)


@pytest.mark.parametrize("cache", ["window", "grow"])
def test_an_engine_with_new_key_values_holds_the_window_cache_once(open_decoder, cache):
    """`present` engines hold the window and the engine's window + 1 output; `new_key_values` ones
    the window and one position per row (grow: two buffers either way)."""
    dec = open_decoder(cache)
    rows, row = 2 * LAYERS * MAX_BATCH * HEADS, DIM * 4
    if cache == "grow":
        want = 2 * MAX_TOTAL * rows * row + (rows * row if dec.new_kv else 0)
    else:
        want = (MAX_TOTAL - 1 + 1) * rows * row if dec.new_kv else (MAX_TOTAL - 1 + MAX_TOTAL) * rows * row
    assert dec.kv_cache_bytes == want


def test_greedy_tokens_feed_next_token_back_on_the_device(open_decoder):
    """An int64 `next_token` goes back in as the next step's input_ids by a device copy (no token
    comes up from the host after the prompt): the tokens equal step-by-step greedy decoding across
    window promotions, and a caller that stops early leaves the decoder ready for a new batch."""
    from trt_seer.runtime.generate import Sampling, generate_ids

    prompts = [[3, 7, 7, 1, 9], [4, 12, 4]]
    want = list(generate_ids(open_decoder("window", windows=(2, 4, 8)), prompts, Sampling(max_new_tokens=6),
                             set(), 0))
    dec = open_decoder("window", windows=(2, 4, 8), next_token="int64")
    assert dec.pipelines
    dec.rt.copied.clear()
    assert list(generate_ids(dec, prompts, Sampling(max_new_tokens=6), set(), 0)) == want
    up = [n for kind, n in dec.rt.copied if kind == "HostToDevice"]
    fed_back = [n for kind, n in dec.rt.copied if kind == "DeviceToDevice" and n == 2 * 8]
    assert len(fed_back) == 5 and len(up) == 3 + 2 * 5  # the prompt's three inputs, then mask and positions
    ids = np.array([[5, 6]], np.int64)
    dec.reset(1)
    first = next(dec.greedy_tokens(ids, np.ones_like(ids), 4))  # stopped after the first token
    dec.reset(1)
    assert [int(t[0]) for t in dec.greedy_tokens(ids, np.ones_like(ids), 4)][0] == int(first[0])
    plain = open_decoder("window", next_token=True)
    with pytest.raises(UnsupportedError, match="no int64 next_token"):
        next(plain.greedy_tokens(ids, np.ones_like(ids), 2))


def test_the_generation_bench_times_greedy_steps_the_way_generation_runs_them(open_decoder):
    """bench/generate.decode_rate on a decoder that feeds its tokens back: whole generations of
    new_tokens + 1 and 1-token generations (each shape once untimed, then every timed run), and one
    untimed generation for the device time: exactly those prompt and decode steps run, each one's
    device time counted."""
    from trt_seer.bench.generate import MIN_RUNS, GenBenchSpec, decode_rate

    dec = open_decoder("window", windows=(2, 4, 8), next_token="int64")
    spec = GenBenchSpec(prompt=3, new_tokens=5)
    got = decode_rate(dec, 2, spec, VOCAB)
    runs = max(MIN_RUNS, spec.repeats)
    prefill, *decode = dec.engine.contexts
    assert prefill.runs == 2 + 2 * runs + 1  # warm-ups, each run's two calls, the device-time pass
    assert sum(c.runs for c in decode) == 5 * (1 + runs + 1) and dec.past == 3 + 5
    assert got["device_ms_per_step"] == 0.5 and got["tokens_per_s"] > 0 and got["batch"] == 2 and got["runs"] == runs


class SamplerEngine:
    """The device sampler: export/sampler.py's graph for the toy vocabulary, run by ONNX Runtime on
    the memory its context is bound to."""

    def __init__(self):
        import onnxruntime as ort

        from trt_seer.export.sampler import sampler_model

        self.session = ort.InferenceSession(sampler_model(VOCAB, "float32").SerializeToString(),
                                            providers=["CPUExecutionProvider"])
        self.runs = 0

    def get_tensor_shape(self, name):
        return (-1, 1, VOCAB)

    def create_execution_context(self):
        engine = self

        class SamplerContext(Context):
            def execute_async_v3(self, stream):
                feeds = {name: array_at(self.addresses[name], self.shapes[name], np.float32).copy()
                         for name in ("logits", "uniforms", "settings")}
                token = engine.session.run(None, feeds)[0]
                array_at(self.addresses["next_token"], token.shape, np.int64)[...] = token
                engine.runs += 1
                return True

        return SamplerContext(self)


@pytest.mark.parametrize("top_p", [0.6, 1.0])
def test_sampled_tokens_are_drawn_on_the_device_and_fed_back(open_decoder, monkeypatch, tmp_path, top_p):
    """With a device sampler beside the engine, sampling generates the host sampler's tokens for the
    same seed (the same draws), across window promotions, with only the ids coming back after
    each step and the uniform numbers going up; top-k stays on the host."""
    from trt_seer.runtime import sampler_trt
    from trt_seer.runtime.generate import Sampling, generate_ids

    prompts = [[3, 7, 7, 1, 9], [4, 12, 4]]
    sampling = Sampling(max_new_tokens=7, temperature=2000.0, top_p=top_p, seed=11)  # toy logits: votes in the hundreds
    host = open_decoder("window", windows=(2, 4, 8), next_token="int64")
    assert not host.samples
    want = list(generate_ids(host, prompts, sampling, set(), 0))
    engine = SamplerEngine()
    loaded = LoadedEngine(tmp_path / "toy.sampler.float32.engine", {}, None, None, types.SimpleNamespace(errors=[]),
                          object(), engine, types.SimpleNamespace(save=lambda: None))
    monkeypatch.setattr(sampler_trt.DeviceSampler, "beside",
                        classmethod(lambda cls, path, m, vocab, dtype, options, batch, stream:
                                    cls(loaded, batch, stream) if (vocab, dtype) == (VOCAB, "float32") else None))
    dec = open_decoder("window", windows=(2, 4, 8), next_token="int64")
    assert dec.samples
    dec.rt.copied.clear()
    assert list(generate_ids(dec, prompts, sampling, set(), 0)) == want
    assert engine.runs == 7 and len({t for _, t in want}) > 2  # really sampled
    back = [n for kind, n in dec.rt.copied if kind == "DeviceToHost"]
    assert back == [2 * 8] * 7  # the ids only, never the logits
    ids = np.array([[5, 6]], np.int64)
    dec.reset(1)
    with pytest.raises(UnsupportedError, match="not top-k"):
        next(dec.sampled_tokens(ids, np.ones_like(ids), 3, Sampling(temperature=1.0, top_k=5), None))
