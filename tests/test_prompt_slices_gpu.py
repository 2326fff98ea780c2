"""Prompts in slices on TensorRT (`build --prompt-slice`, runtime/decoder_trt.py): a tiny causal LM's
chunked-attention FP16 engine takes prompts 4 tokens at a time, each slice on the cache of those
before it, and gives the logits of ONNX Runtime running the same graph on the whole prompt, in
every cache layout, through the device feedback of greedy tokens, and in `trt-seer generate`
against Hugging Face. Needs a GPU that the installed TensorRT runs."""
from __future__ import annotations

import numpy as np
import pytest
from test_generate_gpu import (TOLERANCE, _steps, assert_close, assert_fed_back_is_stepwise,
                               assert_generate_agrees_with_hugging_face, tiny_engines)

from trt_seer import runtime

pytestmark = pytest.mark.gpu
SLICE = 4


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    reason = runtime.tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no TensorRT that runs on this GPU: {reason}")
    return tiny_engines(tmp_path_factory.mktemp("slices-gpu"), "--attention", "chunked", "--prompt-slice", str(SLICE))


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
            assert_close(got, want, TOLERANCE["fp16"])


def test_greedy_tokens_after_a_sliced_prompt_equal_step_by_step_greedy(sliced):
    """After a prompt in slices (19 tokens, row 0 left-padded by 6), the tokens fed back on the device
    equal those of waiting for each step; the slices themselves are checked against ONNX Runtime above."""
    _, out = sliced
    ids = np.random.default_rng(1).integers(3, 120, (3, 19)).astype(np.int64)
    assert_fed_back_is_stepwise(out / "llama.fp16.engine", ids, pad=6)


def test_generate_on_the_sliced_engine_agrees_with_hugging_face(sliced, capsys):
    ckpt, out = sliced
    results = assert_generate_agrees_with_hugging_face(ckpt, out / "llama.fp16.engine", capsys)
    assert max(len(r["prompt_ids"]) for r in results) > SLICE  # some prompt runs in slices
