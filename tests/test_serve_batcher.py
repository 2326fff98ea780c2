"""The slot batcher (runtime/batcher.py) on the ONNX Runtime decoder of a tiny Llama: requests that
join a running batch, restarts of a full cache, per-row sampling, cancellation and timeouts, each
against `Generator.generate` on its own."""
from __future__ import annotations

import threading
import time

import pytest
from test_generate import save_tokenizer
from tiny import make_tiny_checkpoint

from trt_seer import pipeline
from trt_seer.errors import InputError
from trt_seer.export.families import resolve_model
from trt_seer.runtime.batcher import Batcher, QueueFull, Request, Token
from trt_seer.runtime.decoder_ort import OrtDecoderStep
from trt_seer.runtime.generate import Generator, Sampling, load_generator
from trt_seer.runtime.ort import OrtOptions

PROMPTS = [" ".join(f"w{3 + (13 * i + 3 * j) % 120}" for j in range(1 + (5 * i) % 11)) for i in range(10)]


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    root = tmp_path_factory.mktemp("batcher")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", root / "llama", initializer_range=0.3)
    save_tokenizer(ckpt)
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(root / "out", info.name)
    art.out.mkdir()
    pipeline.fp32_onnx(info, art)
    return load_generator(art.path("fp32.onnx"), threads=1)


def short_cache(gen: Generator, max_total: int) -> Generator:
    """The same ONNX graph on a decoder that takes only `max_total` tokens (so the timeline fills)."""
    step = OrtDecoderStep(gen.step.path, OrtOptions(threads=1), decoder={**gen.decoder, "max_total": max_total})
    return Generator(step, {**gen.decoder, "max_total": max_total, "max_prompt": max_total - 1}, gen.tokenizer)


class Collect:
    def __init__(self):
        self.tokens, self.end, self.done = [], None, threading.Event()

    def __call__(self, event):
        if isinstance(event, Token):
            self.tokens.append(event.token_id)
        else:
            self.end = event
            self.done.set()


def run_all(batcher: Batcher, asks: list[tuple[str, Sampling]], gap_s: float = 0.002) -> list[Collect]:
    """Submits the requests `gap_s` apart while the batcher runs; waits for all."""
    thread = threading.Thread(target=batcher.run, daemon=True)
    thread.start()
    out = []
    for text, sampling in asks:
        out.append(Collect())
        batcher.submit(Request(batcher.gen.encode([text])[0], sampling, out[-1]))
        time.sleep(gap_s)
    for c in out:
        assert c.done.wait(60)
    batcher.close()
    thread.join(10)
    assert not thread.is_alive()
    return out


def test_joining_rows_and_cache_restarts_give_each_request_its_own_generate_tokens(generator):
    gen = short_cache(generator, 48)
    asks = [(p, Sampling(max_new_tokens=10 + 3 * i)) for i, p in enumerate(PROMPTS)]
    want = [gen.generate([p], s)[0].token_ids for p, s in asks]
    batcher = Batcher(gen, slots=3)
    got = run_all(batcher, asks)
    assert [c.tokens for c in got] == want
    assert batcher.restarts > 1  # more than the first prompt step: the 48-token timeline filled up
    assert all(c.end.reason in ("eos", "length") and c.end.completion_tokens == len(c.tokens) for c in got)


def test_each_row_samples_with_its_own_settings_and_seed(generator):
    asks = [(PROMPTS[i], Sampling(max_new_tokens=8, temperature=0.5 + 0.2 * i, top_k=i % 3 * 5, top_p=0.9, seed=i))
            for i in range(6)]
    want = [generator.generate([p], s)[0].token_ids for p, s in asks]
    got = run_all(Batcher(generator, slots=4), asks)
    assert [c.tokens for c in got] == want


def test_cancel_and_timeout_free_their_rows(generator):
    batcher = Batcher(generator, slots=1, queue_size=2)
    long, waiting = Collect(), Collect()
    request = Request([1, 5], Sampling(max_new_tokens=120), lambda e: (long(e), len(long.tokens) == 3 and request.cancel()))
    batcher.submit(request)
    batcher.submit(Request([1, 6], Sampling(max_new_tokens=3), waiting, timeout_s=0.0))  # past its deadline at once
    with pytest.raises(QueueFull):
        batcher.submit(Request([1, 7], Sampling(max_new_tokens=3), Collect()))
    with pytest.raises(InputError, match="at most 127"):
        batcher.submit(Request(list(range(3, 131)), Sampling(), Collect()))
    thread = threading.Thread(target=batcher.run, daemon=True)
    thread.start()
    assert waiting.done.wait(10) and waiting.end.reason == "timeout" and not waiting.tokens
    assert long.done.wait(10) and long.end.reason == "cancelled" and len(long.tokens) == 3
    assert batcher.in_use() == 0 and batcher.queue_depth() == 0
    after = Collect()
    batcher.submit(Request([1, 5], Sampling(max_new_tokens=3), after))  # the freed slot serves the next one
    assert after.done.wait(10) and after.tokens == long.tokens
    batcher.close()
    thread.join(10)
    assert not thread.is_alive()
