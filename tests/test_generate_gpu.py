"""Generation on TensorRT: a tiny causal LM's FP16 / INT8 / INT4 decoder engines (decode and prefill
profiles, KV cache on the GPU) step for step against ONNX Runtime on the same graphs, and
`trt-seer generate` on the engine against Hugging Face `generate`. Needs a GPU that the installed
TensorRT runs; the engines themselves are built here by TensorRT's builder."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_generate import NEW_TOKENS, PROMPTS, hf_greedy, save_tokenizer
from tiny import make_tiny_checkpoint

from trt_seer import runtime

pytestmark = pytest.mark.gpu
BUILD = ("--batch", "1,2,4", "--seq", "1,16,32", "--max-total", "64")
# relative RMS of engine vs ONNX Runtime logits on the same graph and tokens; the INT4 graph's
# coarse weights amplify FP16 accumulation differences (0.119 at worst on the H200, INT8 <= 0.1)
TOLERANCE = {"fp16": 0.1, "int8": 0.1, "int4": 0.15}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    reason = runtime.tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no TensorRT that runs on this GPU: {reason}")
    return tiny_engines(tmp_path_factory.mktemp("gen-gpu"), "--int8", "--int4", "--int4-block", "32",
                        "--max-ppl-increase", "1.0", "--min-agreement", "0.0")


def tiny_engines(root, *options):
    """A tiny Llama (with a tokenizer) built into root/out with BUILD, FP16 and `options`, its graphs
    kept: (checkpoint, out)."""
    ckpt = make_tiny_checkpoint("llama", "causal-lm", root / "llama", initializer_range=0.3)
    save_tokenizer(ckpt)
    out = root / "out"
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp16", *options,
                        "--keep-intermediates", *BUILD, "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return ckpt, out


def assert_close(got: list, want: list, tolerance: float) -> None:
    """Step logits of two backends on the same graph and tokens. TensorRT accumulates in FP16 where
    ONNX Runtime's CPU kernels use FP32, so logits differ by a few percent of their spread; a random
    tiny model has near ties, so one flipped top-1 in a step of 2 rows is no failure."""
    agree = []
    for i, (g, w) in enumerate(zip(got, want)):
        rel = np.sqrt(np.mean((g - w) ** 2) / np.mean((w - w.mean(-1, keepdims=True)) ** 2))
        assert rel <= tolerance, f"step {i}: relative RMS difference {rel:.3f}"
        agree += list(g.argmax(-1) == w.argmax(-1))
    assert np.mean(agree) >= 0.8, f"top-1 agreement {np.mean(agree):.2f} over {len(agree)} positions"


def _steps(step, ids: np.ndarray, n: int, pad: int = 0, tokens: list | None = None) -> tuple[list, list]:
    """Prefill `ids` (row 0 left-padded by `pad` positions) then `n` decode steps; returns the
    logits of every step and the tokens fed. The tokens are the step's own greedy choice, or
    `tokens` (another backend's choice) so that two backends see the same sequence: once a near
    tie flips one greedy token the sequences differ and their logits are not comparable."""
    b, s = ids.shape
    mask = np.ones((b, s), np.int64)
    mask[0, :pad] = 0
    positions = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    step.reset(b)
    logits, fed = [step.step(ids, mask, positions)], []
    for t in range(n):
        token = logits[-1].argmax(-1)[:, None].astype(np.int64) if tokens is None else tokens[t]
        fed.append(token)
        mask = np.concatenate([mask, np.ones((b, 1), np.int64)], 1)
        positions = positions[:, -1:] + 1
        logits.append(step.step(token, mask, positions))
    return logits, fed


@pytest.mark.parametrize("cache", ["window", "grow", "ladder"])
@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_engine_steps_match_onnx_runtime(engines, precision, cache):
    """"ladder": small windows, so that both batches cross promotions (the cache moved within its
    buffer through the scratch block) and the prompts land in windows larger than themselves."""
    from trt_seer.runtime.decoder_ort import OrtDecoderStep
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    _, out = engines
    ids = np.random.default_rng(0).integers(3, 120, (3, 9)).astype(np.int64)
    want, tokens = _steps(OrtDecoderStep(out / f"llama.{precision}.onnx"), ids, 10, pad=4)
    want_again, tokens_again = _steps(OrtDecoderStep(out / f"llama.{precision}.onnx"), ids[:2, :5], 3)
    windows = (2, 4, 8, 12, 16) if cache == "ladder" else None
    with TensorRTDecoder(out / f"llama.{precision}.engine", cache="grow" if cache == "grow" else "window",
                         windows=windows) as dec:
        assert dec.new_kv  # the engine gives new_key_values (engine/kv_outputs.py)
        got, _ = _steps(dec, ids, 10, pad=4, tokens=tokens)
        assert dec.kv_cache_bytes > 0
        again, _ = _steps(dec, ids[:2, :5], 3, tokens=tokens_again)  # a second batch on the same decoder
    assert_close(got + again, want + want_again, TOLERANCE[precision])  # the same graph on two backends


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_tokens_fed_back_on_the_device_equal_step_by_step_greedy(engines, precision):
    """greedy_tokens (next_token copied into input_ids on the device, the next step enqueued before
    the host reads a token, host buffers in turns) gives the tokens of waiting for each step, across
    window promotions and with a left-padded row."""
    _, out = engines
    ids = np.random.default_rng(1).integers(3, 120, (3, 9)).astype(np.int64)
    assert_fed_back_is_stepwise(out / f"llama.{precision}.engine", ids, pad=4)


def assert_fed_back_is_stepwise(engine, ids: np.ndarray, pad: int, steps: int = 12) -> None:
    """12 greedy tokens fed back on the device equal those of waiting for each step (row 0
    left-padded by `pad`), in small windows so that the sequences cross promotions."""
    from trt_seer.decoder_io import position_ids
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    mask = np.ones_like(ids)
    mask[0, :pad] = 0
    with TensorRTDecoder(engine, windows=(2, 4, 8, 12, 16)) as dec:
        assert dec.pipelines
        dec.reset(len(ids))
        fed_back = np.stack(list(dec.greedy_tokens(ids, mask, steps)))
        dec.reset(len(ids))
        stepwise = [dec.next_tokens(ids, mask, position_ids(mask))]
        for _ in range(steps - 1):
            mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], 1)
            stepwise.append(dec.next_tokens(stepwise[-1][:, None], mask, position_ids(mask, 1)))
    np.testing.assert_array_equal(fed_back, np.stack(stepwise))


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_the_device_sampler_draws_the_hosts_tokens_and_feeds_them_back(engines, precision):
    """The sampler engine the build wrote, on real kernels: on each step's logits (in place on the
    GPU) it draws the host sampler's token for the same uniform numbers; sampled_tokens then feeds
    its tokens back step after step, reproducibly for a seed."""
    from trt_seer.decoder_io import position_ids
    from trt_seer.runtime import cuda
    from trt_seer.runtime.decoder_trt import TensorRTDecoder
    from trt_seer.runtime.generate import Sampling
    from trt_seer.runtime.sampling import draws, nucleus_draw

    _, out = engines
    rng = np.random.default_rng(2)
    ids = rng.integers(3, 120, (4, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    agree = []
    with TensorRTDecoder(out / f"llama.{precision}.engine", windows=(2, 4, 8, 12, 16)) as dec:
        assert dec.samples
        dec.reset(4)
        logits = dec.step(ids, mask, position_ids(mask))
        for t in range(12):
            for temperature, top_p in ((0.7, 0.9), (2.0, 0.5), (1.0, 1.0)):
                u = draws(rng, 4)
                dec.sampler.set(4, temperature, top_p)
                dec.sampler.enqueue(t % 2, dec._logits.device_ptr, dec._next.device_ptr, u)
                cuda.copy_async(dec._next.host_ptr, dec._next.device_ptr, 4 * 8, "DeviceToHost", dec.stream)
                dec.stream.synchronize()
                got = dec._next.host_view((4,), np.int64).copy()
                agree.append(got == nucleus_draw(logits, np.float32(1 / temperature), top_p, u))
            mask = np.concatenate([mask, np.ones((4, 1), np.int64)], 1)
            logits = dec.step(got[:, None], mask, position_ids(mask, 1))
        sampling = Sampling(temperature=0.9, top_p=0.8)
        runs = []
        for seed in (5, 5, 6):
            dec.reset(4)
            runs.append(np.stack(list(dec.sampled_tokens(ids, np.ones_like(ids), 10, sampling,
                                                         np.random.default_rng(seed)))))
    assert np.mean(agree) >= 0.97, f"{np.mean(agree):.3f} of device draws are the host's"
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2]) and runs[0].min() >= 0 and runs[0].max() < dec.vocab


def test_generate_on_the_engine_agrees_with_hugging_face(engines, capsys):
    ckpt, out = engines
    assert_generate_agrees_with_hugging_face(ckpt, out / "llama.fp16.engine", capsys)


def assert_generate_agrees_with_hugging_face(ckpt, engine, capsys) -> list[dict]:
    """`trt-seer generate --json` on PROMPTS gives Hugging Face's greedy tokens (95%); its results."""
    from trt_seer import cli

    argv = ["generate", str(engine), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(NEW_TOKENS), "--json"]
    assert cli.main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    want = hf_greedy(ckpt, [r["prompt_ids"] for r in results], NEW_TOKENS)
    pairs = [(a, b) for r, w in zip(results, want) for a, b in zip(r["token_ids"], w)]
    assert len(pairs) >= len(PROMPTS) * 2
    assert sum(a == b for a, b in pairs) / len(pairs) >= 0.95
    return results


def test_prompt_longer_than_the_engine_takes_is_bad_input(engines):
    _, out = engines
    r = subprocess.run([sys.executable, "-m", "trt_seer", "generate", str(out / "llama.fp16.engine"),
                        "--prompt", " ".join(["w5"] * 40), "--max-new-tokens", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len([x for x in r.stderr.splitlines() if x.startswith("trt-seer: error:")]) == 1


def test_decoder_runtime_cache_is_written_beside_the_engine_and_reused(engines, tmp_path):
    """The decode step's JIT kernels (eager specialization per batch size) go to
    `<engine stem>.runtime.cache` at close, and the next decoder on that engine loads them."""
    import shutil

    from trt_seer.engine import trt
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    if not trt.load().has_runtime_cache:
        pytest.skip(f"{trt.load().name} has no runtime cache")
    _, out = engines
    for name in ("llama.fp16.engine", "llama.fp16.manifest.json"):
        shutil.copy(out / name, tmp_path / name)
    ids = np.random.default_rng(1).integers(3, 120, (2, 5)).astype(np.int64)
    with TensorRTDecoder(tmp_path / "llama.fp16.engine") as dec:
        first, _ = _steps(dec, ids, 3)
    cache = tmp_path / "llama.fp16.runtime.cache"
    assert cache.is_file() and cache.stat().st_size > 0
    with TensorRTDecoder(tmp_path / "llama.fp16.engine") as dec:
        assert dec._jit_cache._blob == cache.read_bytes()  # deserialized and accepted
        again, _ = _steps(dec, ids, 3)
    for a, b in zip(first, again):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
