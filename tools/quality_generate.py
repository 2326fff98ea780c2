"""The whole causal-LM flow on a small model, and how much each precision costs in quality:
`trt-seer finetune --task causal-lm` -> `trt-seer build --fp16 --int8 --int4` -> perplexity of every
graph (ONNX Runtime) and engine (TensorRT) on held-out text, and greedy agreement of the FP16 engine
with Hugging Face FP16 `generate`. Appends the table to docs/BENCHMARKS.md.

    python tools/quality_generate.py --work out/small-lm [--append docs/BENCHMARKS.md]

The starting point is a small Llama-shape model (4 layers, hidden 256, 2 KV heads) with a BPE
tokenizer trained on the project's calibration corpus, randomly initialised and then fine-tuned on
that corpus by `trt-seer finetune` (so its predictions are peaked, as a trained model's are).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
             tie_word_embeddings=False)


def initial_checkpoint(dest: Path) -> Path:
    """Random-init small Llama + a byte-level BPE tokenizer trained on calib/default.txt."""
    import torch
    import transformers

    if (dest / "config.json").is_file():
        return dest
    bpe_tokenizer(dest, SMALL["vocab_size"])
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).save_pretrained(str(dest))
    return dest


def bpe_tokenizer(dest: Path, vocab_size: int = 4096):
    """A byte-level BPE tokenizer of `vocab_size` tokens trained on calib/default.txt, saved in `dest`
    as a Hugging Face fast tokenizer: <unk> 0, <s> 1 (prepended to every text), </s> 2 (EOS and pad).
    Returns it (a transformers.PreTrainedTokenizerFast)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus = [t for t in (ROOT / "calib" / "default.txt").read_text().splitlines() if t.strip()]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size,
                                                        special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="</s>")
    fast.save_pretrained(str(dest))
    return fast


def cli(*argv: str) -> None:
    cmd = [sys.executable, "-m", "trt_seer", *argv]
    print("$ trt-seer", " ".join(argv), flush=True)
    subprocess.run(cmd, check=True)


def heldout_rows(ckpt: Path, length: int, max_rows: int) -> np.ndarray:
    """Held-out token rows (calib/heldout.txt, never trained on), cut from one token stream."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    lines = [t for t in (ROOT / "calib" / "heldout.txt").read_text().splitlines() if t.strip()]
    stream = np.concatenate([np.array(e.ids + [2], np.int64) for e in tok.encode_batch(lines)])
    n = min(max_rows, len(stream) // length)
    return stream[:n * length].reshape(n, length)


def perplexity(logits: np.ndarray, rows: np.ndarray) -> float:
    from trt_seer.eval.teacher import _nll

    return float(np.exp(_nll(logits, rows[:, 1:]).mean()))


def quality_rows(out: Path, name: str, rows: np.ndarray) -> dict[str, dict]:
    from trt_seer import runtime
    from trt_seer.eval.teacher import stepped_logits, teacher_forced_logits

    table, ref = {}, None
    for p in ("fp32", "fp16", "int8", "int4"):
        logits = teacher_forced_logits(out / f"{name}.{p}.onnx", rows)
        ref = logits if ref is None else ref
        table[f"{p.upper()} graph, ONNX Runtime CPU"] = _metrics(logits, ref, rows)
    reason = runtime.tensorrt_unavailable_reason()
    if reason is not None:
        print(f"engines not measured: {reason}", flush=True)
        return table
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    for p in ("fp16", "int8", "int4"):
        with TensorRTDecoder(out / f"{name}.{p}.engine") as dec:
            logits = stepped_logits(dec, rows, dec.max_batch, f"teacher-force {p} engine")
        table[f"{p.upper()} engine, TensorRT"] = _metrics(logits, ref, rows)
    return table


def _metrics(logits: np.ndarray, ref: np.ndarray, rows: np.ndarray) -> dict:
    return {"perplexity": perplexity(logits, rows), "agreement_vs_fp32": float((logits.argmax(-1) == ref.argmax(-1)).mean())}


def greedy_agreement(ckpt: Path, engine: Path, rows: np.ndarray, prompt: int, new: int) -> dict:
    """Position-wise agreement of the FP16 engine's greedy tokens with HF FP16 generate's."""
    import torch
    import transformers

    from trt_seer.runtime.generate import Sampling, generate_ids, load_step

    prompts = rows[:, :prompt]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float16).cuda().eval()
    model.generation_config.eos_token_id = None  # neither side stops or suppresses EOS: same rule
    ids = torch.from_numpy(prompts).cuda()
    with torch.inference_mode():
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                            pad_token_id=2).cpu().numpy()[:, prompt:]
    step = load_step(engine)
    ours = [[] for _ in prompts]
    for start in range(0, len(prompts), step.max_batch):
        chunk = [list(r) for r in prompts[start:start + step.max_batch]]
        for row, token in generate_ids(step, chunk, Sampling(max_new_tokens=new), set(), 2):
            ours[start + row].append(token)
    ours = np.array(ours, dtype=np.int64)
    return {"agreement": float((ours == hf).mean()), "positions": int(hf.size), "prompts": len(prompts)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "small-lm")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    init = initial_checkpoint(args.work / "init")
    ckpt, out = args.work / "small-lm", args.work / "engines"
    if not (ckpt / "config.json").is_file():
        cli("finetune", "--task", "causal-lm", "--model", str(init), "--out", str(ckpt), "--epochs", str(args.epochs),
            "--lr", "1e-3", "--batch", "16", "--max-seq", "256", "--amp", "bf16")
    cli("build", "--model", str(ckpt), "--fp16", "--int8", "--int4", "--batch", "1,8,16", "--seq", "1,64,256",
        "--max-total", "512", "--out", str(out))
    rows = heldout_rows(ckpt, 128, 64)
    table = quality_rows(out, ckpt.name, rows)
    agree = greedy_agreement(ckpt, out / f"{ckpt.name}.fp16.engine", rows[:32], 16, 48)
    lines = ["| Artifact | Perplexity | Next-token agreement with FP32 |", "|---|---|---|"]
    lines += [f"| {k} | {v['perplexity']:.3f} | {v['agreement_vs_fp32']:.4f} |" for k, v in table.items()]
    text = "\n".join(lines) + (f"\n\nGreedy generation, FP16 engine vs Hugging Face FP16 `generate`: "
                               f"{agree['agreement']:.4f} of {agree['positions']} positions agree "
                               f"({agree['prompts']} held-out prompts of 16 tokens, 48 new tokens each).")
    print(text)
    (args.work / "quality.json").write_text(json.dumps({"table": table, "greedy": agree}, indent=1))
    if args.append:
        from trt_seer.bench.report import append_benchmark
        from trt_seer.bench.host import machine_text

        body = (f"Model: small Llama shape (4 layers, hidden 256, 2 KV heads, 5.1M parameters), fine-tuned with "
                f"`trt-seer finetune --task causal-lm` for {args.epochs} epochs on calib/default.txt. Perplexity: "
                f"teacher-forced through the KV cache, {rows.shape[0]} held-out rows of {rows.shape[1]} tokens "
                f"(calib/heldout.txt).\n\n{text}\n")
        append_benchmark(args.append, "Causal LM quality per precision (finetune -> build -> generate)",
                         "python " + " ".join(sys.argv), machine_text(_gpu()), body)
    return 0


def _gpu() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


if __name__ == "__main__":
    sys.exit(main())
