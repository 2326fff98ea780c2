"""Prompts in slices on TensorRT (`build --prompt-slice`, runtime/decoder_trt.py): a tiny causal LM's
chunked-attention FP16 engine takes prompts 4 tokens at a time, each slice on the cache of those
before it, and gives the logits of ONNX Runtime running the same graph on the whole prompt, in
every cache layout, through the device feedback of greedy tokens, and in `trt-seer generate`
against Hugging Face. Needs a GPU that the installed TensorRT runs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_generate import NEW_TOKENS, PROMPTS, hf_greedy, save_tokenizer
from test_generate_gpu import BUILD, TOLERANCE, _steps
from tiny import make_tiny_checkpoint

from trt_seer import runtime

pytestmark = pytest.mark.gpu
SLICE = 4


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    reason = runtime.tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no TensorRT that runs on this GPU: {reason}")
    root = tmp_path_factory.mktemp("slices-gpu")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", root / "llama", initializer_range=0.3)
    save_tokenizer(ckpt)
    out = root / "out"
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp16", "--attention",
                        "chunked", "--prompt-slice", str(SLICE), "--keep-intermediates", *BUILD, "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return ckpt, out


def _close(got: list, want: list) -> None:
    agree = []
    for i, (g, w) in enumerate(zip(got, want)):
        rel = np.sqrt(np.mean((g - w) ** 2) / np.mean((w - w.mean(-1, keepdims=True)) ** 2))
        assert rel <= TOLERANCE["fp16"], f"step {i}: relative RMS difference {rel:.3f}"
        agree += list(g.argmax(-1) == w.argmax(-1))
    assert np.mean(agree) >= 0.8, f"top-1 agreement {np.mean(agree):.2f} over {len(agree)} positions"


@pytest.mark.parametrize("cache", ["window", "grow", "ladder"])
def test_sliced_prompts_match_onnx_runtime_on_the_whole_prompt(sliced, cache):
    """9 tokens (row 0 left-padded by 4: its first slice is all padding) as 4 + 4 + 1, and 22 as six
    slices, each followed by decode steps; "ladder": small windows, so slices promote the window."""
    from trt_seer.runtime.decoder_ort import OrtDecoderStep
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    _, out = sliced
    rng = np.random.default_rng(0)
    cases = [(rng.integers(3, 120, (3, 9)).astype(np.int64), 4), (rng.integers(3, 120, (2, 22)).astype(np.int64), 0)]
    windows = (2, 4, 8, 12, 16) if cache == "ladder" else None
    with TensorRTDecoder(out / "llama.fp16.engine", cache="grow" if cache == "grow" else "window",
                         windows=windows) as dec:
        assert dec.prompt_slice == SLICE
        for ids, pad in cases:
            want, tokens = _steps(OrtDecoderStep(out / "llama.fp16.onnx"), ids, 8, pad=pad)
            got, _ = _steps(dec, ids, 8, pad=pad, tokens=tokens)
            _close(got, want)


def test_greedy_tokens_after_a_sliced_prompt_equal_step_by_step_greedy(sliced):
    """The prompt's slices are enqueued with the host waiting between them (its feeds go up from
    the same host buffers); the tokens fed back on the device equal those of waiting for each step."""
    from trt_seer.decoder_io import position_ids
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    _, out = sliced
    ids = np.random.default_rng(1).integers(3, 120, (3, 19)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[0, :6] = 0
    with TensorRTDecoder(out / "llama.fp16.engine", windows=(2, 4, 8, 12, 16)) as dec:
        dec.reset(3)
        fed_back = np.stack(list(dec.greedy_tokens(ids, mask, 12)))
        dec.reset(3)
        stepwise = [dec.next_tokens(ids, mask, position_ids(mask))]
        for _ in range(11):
            mask = np.concatenate([mask, np.ones((3, 1), np.int64)], 1)
            stepwise.append(dec.next_tokens(stepwise[-1][:, None], mask, position_ids(mask, 1)))
    np.testing.assert_array_equal(fed_back, np.stack(stepwise))


def test_generate_on_the_sliced_engine_agrees_with_hugging_face(sliced, capsys):
    from trt_seer import cli

    ckpt, out = sliced
    argv = ["generate", str(out / "llama.fp16.engine"), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(NEW_TOKENS), "--json"]
    assert cli.main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert max(len(r["prompt_ids"]) for r in results) > SLICE  # some prompt runs in slices
    want = hf_greedy(ckpt, [r["prompt_ids"] for r in results], NEW_TOKENS)
    pairs = [(a, b) for r, w in zip(results, want) for a, b in zip(r["token_ids"], w)]
    assert len(pairs) >= len(PROMPTS) * 2
    assert sum(a == b for a, b in pairs) / len(pairs) >= 0.95
