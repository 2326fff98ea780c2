"""Generation from KV-cache decoder artifacts: `trt-seer generate` on ONNX Runtime against
Hugging Face `generate`, FP16 agreement, seeded sampling, and bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tiny import VOCAB, make_tiny_checkpoint

from trt_seer import cli, pipeline
from trt_seer.errors import InputError
from trt_seer.export.families import TESTED_DECODERS, resolve_model
from trt_seer.runtime.generate import Generator, Sampling, load_generator, load_step, load_tokenizer

FAMILIES = ("gpt2", "llama", "qwen2", "mistral")  # also exported in FP16 and compared with FP32
# Every rotary and attention variant among the decoder families (families.TESTED_DECODERS, listed
# in the README): learned positions (GPT-2, OPT); rotate-half rotary on whole heads with grouped
# (Llama, Qwen2, Phi-3), multi-query (Gemma) and sliding-window (Mistral) attention and query/key
# norms (Qwen3); partial rotary (GPT-NeoX rotary_pct, StableLM); GPT-J's interleaved rotary on part
# of each head, called on q and k apart (GPT-J, CodeGen); ALiBi (BLOOM); Falcon's parallel
# attention with its own name for the key/value heads.
DECODER_FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "qwen3", "gemma", "phi3", "gpt_neox", "opt",
                    "stablelm", "gptj", "codegen", "bloom", "falcon")
PROMPTS = ["w5 w9 w17 w33", "w40", "w3 w4 w5 w6 w7 w8 w9 w10 w11", "w64 w65"]
NEW_TOKENS = 12


def save_tokenizer(dest) -> None:
    """A word-level tokenizer over the tiny vocabulary: <pad> <s> </s> then w3 .. w127; BOS first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(dest / "tokenizer.json"))


class Exports(dict):
    """family -> (checkpoint dir, fp32 onnx, fp16 onnx or None), exported on first use: FP16 too
    for FAMILIES, FP32 alone for the rest of DECODER_FAMILIES."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, family):
        # a wide initializer makes the random logits peaked, so argmax is not decided by float noise
        ckpt = make_tiny_checkpoint(family, "causal-lm", self.root / family, initializer_range=0.3)
        save_tokenizer(ckpt)
        info = resolve_model(ckpt)
        art = pipeline.Artifacts(self.root / f"{family}-out", info.name)
        art.out.mkdir()
        fp32 = pipeline.fp32_onnx(info, art)
        if family in FAMILIES:
            pipeline.fp16_onnx(info, art, fp32)
        self[family] = (ckpt, art.path("fp32.onnx"), art.path("fp16.onnx") if family in FAMILIES else None)
        return self[family]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Per family: (checkpoint dir, fp32 onnx, fp16 onnx), exported once for the module."""
    return Exports(tmp_path_factory.mktemp("gen"))


def hf_greedy(ckpt, prompts: list[list[int]], new_tokens: int, eos: int = 2) -> list[list[int]]:
    """Hugging Face generate's greedy continuation of left-padded prompts, cut after each row's EOS."""
    import torch
    import transformers

    from trt_seer.runtime.generate import left_pad

    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    ids, mask = left_pad(prompts, 0)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=eos)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def generate_json(capsys, artifact, *extra) -> list[dict]:
    argv = ["generate", str(artifact), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(NEW_TOKENS), "--json", *extra]
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)["results"]


def test_decoder_matrix_is_the_listed_families():
    assert DECODER_FAMILIES == TESTED_DECODERS and set(FAMILIES) <= set(DECODER_FAMILIES)


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in FAMILIES else (pytest.mark.slow,))
                                    for f in DECODER_FAMILIES])
def test_greedy_matches_hugging_face(artifacts, capsys, family):
    ckpt, fp32, _ = artifacts[family]
    results = generate_json(capsys, fp32)
    prompts = [r["prompt_ids"] for r in results]
    assert len({len(p) for p in prompts}) == len(PROMPTS)  # different lengths: left padding in play
    assert [r["token_ids"] for r in results] == hf_greedy(ckpt, prompts, NEW_TOKENS)
    for r in results:
        assert len(r["token_ids"]) == NEW_TOKENS or r["finish_reason"] == "eos"
        assert r["text"] == " ".join(f"w{t}" for t in r["token_ids"] if t > 2)


@pytest.mark.parametrize("family,says", [
    ("mpt", r"'mpt': its config.json names its head count neither num_attention_heads nor n_head"),
    ("mixtral", r"ONNX export of mixtral \(mixtral\) failed in transformers\.models\.mixtral\.modeling_mixtral "
                r"at torch\.ops\.\S+: \w+Error: "),
], ids=["head-count-name", "mixture-of-experts"])
def test_a_family_the_export_cannot_take_fails_in_one_line(tmp_path, capsys, family, says):
    """Bad input (exit 2), one line naming what failed and where, nothing written: a config whose
    head count the export cannot read fails before anything is exported, a mixture of experts in
    the exporter (an operator it has no ONNX function for)."""
    import re

    ckpt = make_tiny_checkpoint(family, "causal-lm", tmp_path / family)
    out = tmp_path / "out"
    assert cli.main(["build", "--model", str(ckpt), "--fp32", "--seq", "1,16,128", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = lines[-1]
    assert err.startswith("trt-seer: error: ") and re.search(says, err), err
    assert not [line for line in lines[:-1] if "rror" in line or "Next steps" in line]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("family", FAMILIES)
def test_fp16_agrees_with_fp32(artifacts, capsys, family):
    _, fp32, fp16 = artifacts[family]
    ref = [r["token_ids"] for r in generate_json(capsys, fp32)]
    got = [r["token_ids"] for r in generate_json(capsys, fp16)]
    pairs = [(a, b) for r, g in zip(ref, got) for a, b in zip(r, g)]
    assert len(pairs) >= 0.9 * sum(map(len, ref))
    assert np.mean([a == b for a, b in pairs]) >= 0.95
    record = json.loads((fp16.parent / (fp16.name + ".json")).read_text())
    assert record["decoder"]["kv_dtype"] == "float16"
    assert record["accuracy"]["onnx_vs_fp32"]["top1_agreement"] >= 0.95


def test_eos_stops_each_row_on_its_own(artifacts):
    ckpt, fp32, _ = artifacts["llama"]
    gen = load_generator(fp32)
    prompts = gen.encode(PROMPTS)
    free = gen.generate(PROMPTS, Sampling(max_new_tokens=NEW_TOKENS))
    eos = free[0].token_ids[2]  # row 0's third token becomes the end of sequence
    stopped = Generator(gen.step, {**gen.decoder, "eos_token_id": eos}, gen.tokenizer)
    results = stopped.generate(PROMPTS, Sampling(max_new_tokens=NEW_TOKENS))
    first = free[0].token_ids.index(eos)
    assert results[0].token_ids == free[0].token_ids[:first + 1] and results[0].finish_reason == "eos"
    assert [r.token_ids for r in results] == hf_greedy(ckpt, prompts, NEW_TOKENS, eos=eos)
    assert any(r.finish_reason == "length" for r in results)


def test_sampling_is_seeded_and_top_k_1_is_greedy(artifacts, capsys):
    _, fp32, _ = artifacts["qwen2"]
    greedy = [r["token_ids"] for r in generate_json(capsys, fp32)]
    hot = ("--temperature", "5.0", "--top-p", "0.95")
    a = [r["token_ids"] for r in generate_json(capsys, fp32, *hot, "--seed", "7")]
    b = [r["token_ids"] for r in generate_json(capsys, fp32, *hot, "--seed", "7")]
    c = [r["token_ids"] for r in generate_json(capsys, fp32, *hot, "--seed", "8")]
    assert a == b and a != c and a != greedy
    assert [r["token_ids"] for r in generate_json(capsys, fp32, *hot, "--top-k", "1", "--seed", "3")] == greedy


def test_top_k_keeps_sampling_among_the_k_likeliest():
    from trt_seer.runtime.generate import choose

    logits = np.random.default_rng(0).standard_normal((64, VOCAB)).astype(np.float32)
    rng = np.random.default_rng(1)
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    for _ in range(20):
        picked = choose(logits, Sampling(temperature=10.0, top_k=3), rng)
        assert all(p in row for p, row in zip(picked, top3))
    nucleus = choose(logits, Sampling(temperature=1.0, top_p=1e-6), rng)
    assert (nucleus == logits.argmax(-1)).all()  # top-p that small keeps only the likeliest


def test_stream_yields_each_token_with_its_text(artifacts, capsys):
    _, fp32, _ = artifacts["gpt2"]
    full = generate_json(capsys, fp32)
    argv = ["generate", str(fp32), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(NEW_TOKENS), "--json", "--stream"]
    assert cli.main(argv) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row, r in enumerate(full):
        mine = [e for e in events if e["row"] == row]
        assert [e["token_id"] for e in mine] == r["token_ids"]
        assert "".join(e["text"] for e in mine).strip() == r["text"]


def test_step_rejects_more_than_max_total(artifacts):
    from trt_seer.errors import InputError

    step = load_step(artifacts["llama"][1])
    step.reset(1)
    ids = np.full((1, step.max_total + 1), 5, dtype=np.int64)
    with pytest.raises(InputError, match="exceed"):
        step.step(ids, np.ones_like(ids), np.arange(ids.shape[1])[None])


def _one_line_exit_2(capsys, argv) -> str:
    capsys.readouterr()  # what earlier steps of the test printed
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trt-seer: error: "), err
    return err


def test_prompt_longer_than_the_artifact_takes(artifacts, capsys):
    fp32 = artifacts["llama"][1]
    tok = load_tokenizer(fp32, {"tokenizer": f"{fp32.name.split('.')[0]}.tokenizer"})
    assert tok.encode("w5").ids == [1, 5]
    err = _one_line_exit_2(capsys, ["generate", str(fp32), "--prompt", " ".join(["w7"] * 200)])
    assert "prompt 1 has 201 tokens" in err and "at most 127" in err


def test_non_causal_lm_artifact(tmp_path, capsys):
    info = resolve_model(make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "bert"))
    art = pipeline.Artifacts(tmp_path / "out", info.name)
    art.out.mkdir()
    pipeline.fp32_onnx(info, art)
    err = _one_line_exit_2(capsys, ["generate", str(art.path("fp32.onnx")), "--prompt", "hi"])
    assert "feature-extraction artifact" in err


def test_artifact_without_kv_inputs(artifacts, tmp_path, capsys):
    """A causal-LM graph exported without a KV cache (as trt-seer did before) is refused."""
    fp32 = artifacts["gpt2"][1]
    old = tmp_path / "old.fp32.onnx"
    old.write_bytes(fp32.read_bytes())
    record = json.loads((fp32.parent / (fp32.name + ".json")).read_text())
    record["io"]["inputs"] = [v for v in record["io"]["inputs"] if not v["name"].startswith("past_")]
    record.pop("decoder")
    (tmp_path / "old.fp32.onnx.json").write_text(json.dumps(record))
    err = _one_line_exit_2(capsys, ["generate", str(old), "--prompt", "w5"])
    assert "no KV-cache inputs" in err


def test_engine_without_manifest_and_missing_artifact(tmp_path, capsys):
    assert "artifact not found" in _one_line_exit_2(capsys, ["generate", str(tmp_path / "x.onnx"), "--prompt", "a"])
    (tmp_path / "x.fp16.engine").write_bytes(b"\0")
    assert "no record" in _one_line_exit_2(capsys, ["generate", str(tmp_path / "x.fp16.engine"), "--prompt", "a"])


def test_generation_imports_neither_torch_nor_transformers(artifacts):
    import subprocess
    import sys

    code = ("import sys\nfrom trt_seer.runtime.generate import Sampling, load_generator\n"
            f"gen = load_generator({str(artifacts['llama'][2])!r})\n"
            "print(gen.generate(['w5 w6'], Sampling(max_new_tokens=3))[0].token_ids)\n"
            "assert not {'torch', 'transformers', 'onnx'} & set(sys.modules), sys.modules.keys()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 3


def test_plain_output_and_run_points_to_generate(artifacts, capsys, tmp_path):
    fp32 = artifacts["mistral"][1]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w5 w6\n\nw7\n")
    assert cli.main(["generate", str(fp32), "--file", str(prompts), "--max-new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" -> ")[0] for line in lines] == ["'w5 w6'", "'w7'"]
    args = ["generate", str(fp32), "--prompt", "w5", "--max-new-tokens", "3"]
    assert cli.main(args + ["--json"]) == 0
    text = json.loads(capsys.readouterr().out)["results"][0]["text"]
    assert cli.main(args + ["--stream"]) == 0
    streamed = capsys.readouterr().out
    assert streamed.count("\n") == 1 and streamed.strip() == text and text
    err = _one_line_exit_2(capsys, ["run", str(fp32), "--text", "w5"])
    assert "trt-seer generate" in err


def test_prompts_beyond_max_batch_run_in_several_batches(artifacts):
    gen = load_generator(artifacts["llama"][1])
    one_batch = [r.token_ids for r in gen.generate(PROMPTS, Sampling(max_new_tokens=6))]
    pairs = Generator(gen.step, {**gen.decoder, "max_batch": 2}, gen.tokenizer)
    assert [r.token_ids for r in pairs.generate(PROMPTS, Sampling(max_new_tokens=6))] == one_batch
    assert [r.token_ids for r in pairs.generate(PROMPTS[1:2], Sampling(max_new_tokens=6))] == one_batch[1:2]


def test_mistral_past_its_sliding_window_matches_hugging_face(artifacts):
    """Contexts longer than the tiny Mistral's 32-token window: the exported mask slides as HF's does."""
    ckpt, fp32, _ = artifacts["mistral"]
    gen = load_generator(fp32)
    prompts = gen.encode(PROMPTS[:3])
    results = gen.generate(PROMPTS[:3], Sampling(max_new_tokens=48))
    assert max(len(p) + len(r.token_ids) for p, r in zip(prompts, results)) > 32 + 8
    assert [r.token_ids for r in results] == hf_greedy(ckpt, prompts, 48)


def test_generation_speed_of_an_onnx_runtime_step(artifacts):
    """bench.generate measures any DecoderStep: decode tokens/s per batch, TTFT per prompt length
    (lengths past the step's limit are left out), and the table names every path and column."""
    from trt_seer.bench.generate import GenBenchSpec, measure_step, table
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    _, fp32, _ = artifacts["llama"]
    step = OrtDecoderStep(fp32)
    spec = GenBenchSpec(batches=(1, 2), prompt=8, contexts=(24,), new_tokens=4,
                        ttft_prompts=(8, step.max_total + 1), repeats=1)
    row = measure_step(step, VOCAB, spec)
    assert [(d["batch"], d["context"]) for d in row["decode"]] == [(1, 8), (2, 8), (1, 24), (2, 24)]
    assert all(d["tokens_per_s"] > 0 and d["ms_per_step"] > 0 for d in row["decode"])
    assert list(row["ttft_ms"]) == [8] and row["ttft_ms"][8] > 0
    text = table({"ort fp32": row}, spec, "ort fp32")
    assert "| ort fp32 |" in text and "1.00x" in text and "decode tok/s b2 ctx 24" in text
    assert "vs ort fp32 b1" in text and "vs ort fp32 b2" in text


def test_generate_bench_times_sampling_through_the_host_sampler(artifacts, monkeypatch):
    """With `sampling`, every decode step's logits go through runtime/sampling.choose (seeded), never
    a device-side greedy `next_tokens`; the rows keep measure_step's form."""
    from trt_seer.bench import generate as bench
    from trt_seer.runtime import sampling as sampling_mod
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    from trt_seer.runtime import generate as generate_mod

    chosen = []
    real = sampling_mod.choose
    monkeypatch.setattr(generate_mod, "choose", lambda logits, s, rng: chosen.append(s) or real(logits, s, rng))
    step = OrtDecoderStep(artifacts["llama"][1])
    step.next_tokens = lambda *f: pytest.fail("sampling must not take the greedy path")
    spec = bench.GenBenchSpec(batches=(2,), prompt=8, new_tokens=3, ttft_prompts=(), repeats=1)
    row = bench.measure_step(step, VOCAB, spec, Sampling(temperature=0.8, top_p=0.9, seed=0))
    assert [(d["batch"], d["context"]) for d in row["decode"]] == [(2, 8)] and row["decode"][0]["tokens_per_s"] > 0
    runs, whole = max(bench.MIN_RUNS, spec.repeats), spec.new_tokens + 1  # a token per step of each call
    assert len(chosen) == (whole + 1) * (1 + runs) and {s.top_p for s in chosen} == {0.9}  # warm-ups, then the runs


def test_load_generator_takes_the_backend_and_options_of_load(artifacts, tmp_path):
    """Same backend choice and options as runtime.load: ONNX Runtime options reach the session, unknown
    options and a TensorRT backend for a graph are refused, and an engine no TensorRT runs here falls
    back to its ONNX sibling with a warning."""
    from trt_seer.errors import InputError
    from trt_seer.runtime import tensorrt_unavailable_reason

    fp32 = artifacts["llama"][1]
    sampling = Sampling(max_new_tokens=4)
    tuned = load_generator(fp32, "onnxruntime", threads=1, spinning=False)
    assert tuned.step.session.get_session_options().intra_op_num_threads == 1
    assert tuned.generate(["w5 w6"], sampling)[0].token_ids == load_generator(fp32).generate(["w5 w6"], sampling)[0].token_ids
    with pytest.raises(InputError, match="unknown load option.*contexts_per_gpu"):
        load_generator(fp32, contexts_per_gpu=2)
    with pytest.raises(InputError, match="is an ONNX graph"):
        load_generator(fp32, "tensorrt")
    if tensorrt_unavailable_reason() is not None:
        for suffix in (".onnx", ".onnx.json"):
            (tmp_path / f"m.fp32{suffix}").write_bytes(fp32.with_name(fp32.name.removesuffix(".onnx") + suffix).read_bytes())
        (tmp_path / "m.fp32.engine").write_bytes(b"not an engine")
        with pytest.warns(RuntimeWarning, match="running m.fp32.onnx on ONNX Runtime .CPU. instead of m.fp32.engine"):
            step = load_step(tmp_path / "m.fp32.engine", threads=1)
        assert step.path == tmp_path / "m.fp32.onnx"


def test_corrupt_tokenizer_json_beside_an_artifact_is_bad_input(tmp_path):
    folder = tmp_path / "x.tokenizer"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    with pytest.raises(InputError, match="not a usable tokenizer.json"):
        load_tokenizer(tmp_path / "x.fp32.onnx", {"tokenizer": folder.name})


@pytest.mark.slow
def test_readme_generate_example_runs_offline(tmp_path):
    """The README's `generate` block as written, in a fresh directory and without a network: the
    shipped small-llama config, its fine-tune, the ONNX export and `generate` on it. Changed for
    time only: `--max-steps 2` on the fine-tunes; the engine build is left out (no GPU runs it here)."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("## Generating text: `trt-seer generate`", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    ran = []
    for line in lines:
        words = line.split()
        if words[1] == "build":
            continue
        argv = shlex.split(line)[1:]
        argv += ["--max-steps", "2"] if words[1] == "finetune" else []
        if words[1] == "generate" and words[2].endswith(".engine"):
            continue  # an engine needs the build left out above
        r = subprocess.run([sys.executable, "-m", "trt_seer", *argv], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (line, r.stderr[-3000:])
        ran.append(words[1])
    assert ran == ["finetune", "finetune", "export", "generate"]
    assert r.stdout.strip(), "generate printed nothing"
    assert (tmp_path / "my-llama" / "tokenizer.json").is_file() and (tmp_path / "engines" / "ckpt.fp16.onnx").is_file()


@pytest.mark.parametrize("stream", [False, True])
def test_generate_stats_report_ttft_decode_rate_and_device_time(artifacts, capsys, stream):
    """`--stats` on ONNX Runtime: TTFT and decode tokens/s measured, no device time on the CPU; in the
    JSON document (or the stream's last line) and as one text line; the tokens are unchanged."""
    _, fp32, _ = artifacts["llama"]
    plain = generate_json(capsys, fp32)
    extra = ("--stats", "--stream") if stream else ("--stats",)
    argv = ["generate", str(fp32), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(NEW_TOKENS), "--json", *extra]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    stats = json.loads(lines[-1])["stats"]
    if not stream:
        assert [r["token_ids"] for r in json.loads(lines[-1])["results"]] == [r["token_ids"] for r in plain]
    longest = max(len(r["token_ids"]) for r in plain)
    assert stats["batches"] == 1 and stats["decode_steps"] == longest - 1
    assert stats["ttft_ms"] > 0 and stats["decode_tokens_per_s"] > 0 and stats["device_ms_per_step"] is None
    assert cli.main([a for a in argv if a != "--json"]) == 0
    text = capsys.readouterr().out.splitlines()[-1]
    assert text.startswith("stats: TTFT ") and "tokens/s over" in text and "device time n/a" in text


def test_pytorch_generate_is_timed_by_decode_steps_like_the_engines(artifacts):
    """bench.generate's PyTorch path (here eager on the CPU): decode rows per batch and context from
    per-step stamps, TTFT per prompt, the same row form as measure_step's."""
    import torch
    import transformers

    from trt_seer.bench.generate import GenBenchSpec, hf_generate_rows, table

    ckpt, _, _ = artifacts["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    model.generation_config.pad_token_id = 0
    spec = GenBenchSpec(batches=(1, 2), prompt=8, contexts=(8, 16), new_tokens=5, ttft_prompts=(8,), repeats=1)
    row = hf_generate_rows(model, VOCAB, spec)
    assert [(d["batch"], d["context"]) for d in row["decode"]] == [(1, 8), (2, 8), (1, 16), (2, 16)]
    assert all(d["tokens_per_s"] > 0 and d["ms_per_step"] > 0 for d in row["decode"])
    assert row["ttft_ms"][8] > 0
    assert "| torch |" in table({"torch": row}, spec, "torch")
