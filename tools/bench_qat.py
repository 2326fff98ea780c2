"""PTQ vs QAT for W8A8 on a fine-tuned classifier: FP16 layers the gate needs, and task accuracy.

    python -m trt_seer finetune --out clf --epochs 1 --lr 1e-4            # the classifier (topics)
    python tools/bench_qat.py --base clf --work runs/ --qat learned frozen distill --control [--append docs/BENCHMARKS.md]

1. PTQ: `build --int8 --int8-mode w8a8` of --base (entropy calibration, SmoothQuant 0.5).
   Ranges runs (`--qat ranges`, `--qat-train ranges`) start from its calibration cache.
2. QAT: `finetune --model BASE --qat int8 --max-steps N --amp bf16` (learned or frozen ranges on
   the labels, or distilling BASE; `--qat ranges`: weights frozen, ranges distilled on
   calib/default.txt), then the same build, which takes the trained ranges (qat_ranges.json)
   instead of calibrating (and with ranges-smooth the trained SmoothQuant scales). --control: BASE fine-tuned N more
   steps without QAT, then PTQ (does more training alone move the gate?).
3. Accuracy against the labels of the embedded topics corpus's evaluation split (every 10th line,
   never trained on) for each FP32 and Q/DQ graph (ONNX Runtime CPU), next to what each build's
   gate measured (top-1 agreement with its own FP32 on calib/heldout.txt) and the GEMMs it kept in FP16.

Embedding models (--embedding; --base defaults to the embedded all-MiniLM-L6-v2):

    python tools/bench_qat.py --embedding --work runs/emb --ranges-epochs 3 [--int8-attention] [--append docs/BENCHMARKS.md]

PTQ, then `finetune --task feature-extraction --qat int8` (weights frozen, ranges distilled on
calib/default.txt against the FP32 sentence embedding, started from PTQ's cache) and the same build;
each row: the gate's mean / min cosine to FP32 (first 160 lines of calib/heldout.txt) with every
GEMM in INT8 and after the fallback, the GEMMs kept in FP16, and the final Q/DQ graph's cosine to
the FP32 graph on all of calib/heldout.txt (ONNX Runtime CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROFILE = ["--batch", "1,8,32", "--seq", "8,64,128"]


def trt_seer(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trt_seer", *args], check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    return time.perf_counter() - started


def build(model: Path, out: Path, *extra: str) -> dict:
    if not (out / f"{model.name}.int8.onnx.json").is_file():
        trt_seer("build", "--model", str(model), "--int8", "--int8-mode", "w8a8", *PROFILE, "--out", str(out),
                 "--calib-cache", str(out / "calibration.cache"), *extra)
    return json.loads((out / f"{model.name}.int8.onnx.json").read_text())


def accuracy(onnx_path: Path, tokenizer_dir: Path) -> float:
    """Top-1 accuracy on the topics evaluation split."""
    from transformers import AutoConfig, AutoTokenizer

    from trt_seer.eval.evaluate import session
    from trt_seer.finetune.data import topics_examples

    _, examples = topics_examples()
    label2id = AutoConfig.from_pretrained(str(tokenizer_dir)).label2id
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    sess = session(onnx_path)
    names = [i.name for i in sess.get_inputs()]
    correct = 0
    for start in range(0, len(examples), 32):
        part = examples[start:start + 32]
        enc = tok([e.text for e in part], padding=True, truncation=True, max_length=128, return_tensors="np")
        feeds = {k: enc[k].astype(np.int64) if k in enc else np.zeros_like(enc["input_ids"], np.int64) for k in names}
        logits = sess.run(None, feeds)[0]  # (batch, labels)
        correct += int((logits.argmax(-1) == np.array([label2id[e.label] for e in part])).sum())
    return correct / len(examples)


def row(label: str, ckpt: Path, out: Path, rec: dict) -> list[str]:
    gate = rec["accuracy"]["gate"]["table"]
    first, last = gate[0][1], gate[-1][1]
    fp32 = accuracy(out / f"{ckpt.name}.fp32.onnx", ckpt)
    int8 = accuracy(out / f"{ckpt.name}.int8.onnx", ckpt)
    return [label, f"{fp32:.4f}", f"{first['top1_agreement']:.4f} ({'pass' if gate[0][2] else 'FAIL'})",
            f"{first['mean_kl']:.5f}", str(len(rec["quantization"]["int8_gemms"]["fp16_fallback"])), f"{last['top1_agreement']:.4f}",
            f"{last['mean_kl']:.5f}", f"{int8:.4f}"]


def finetuned(base: Path, out: Path, steps: int, *extra: str, epochs: int = 1, amp: str = "bf16") -> tuple[int, float]:
    """`finetune` of `base` into `out` (kept when there); returns (optimizer steps, seconds)."""
    if not (out / "training.json").is_file():
        trt_seer("finetune", "--model", str(base), *extra, "--max-steps", str(steps), "--epochs", str(epochs),
                 "--amp", amp, "--lr", "2e-5", "--out", str(out))
    training = json.loads((out / "training.json").read_text())
    return training["metrics"]["optimizer_steps"], training["seconds"]


def heldout_cosine(ckpt: Path, out: Path) -> dict:
    """Sentence-embedding cosine of the final Q/DQ graph to the FP32 graph on all of calib/heldout.txt."""
    from trt_seer import data
    from trt_seer.eval.evaluate import merge, run_batches, session
    from trt_seer.eval.metrics import embedding_metrics
    from trt_seer.export.families import ShapeProfile, resolve_model

    info = resolve_model(ckpt, "feature-extraction")
    texts = data.load_texts(data.default_corpus("heldout"))
    batches = list(data.token_batches(info, texts, ShapeProfile((1, 8, 32), (8, 64, 128)), 16))
    ref, cand = (merge(info.task, run_batches(session(out / f"{ckpt.name}.{p}.onnx"), batches), batches)
                 for p in ("fp32", "int8"))
    return embedding_metrics(ref["sentence_embedding"], cand["sentence_embedding"])


def embedding_row(label: str, ckpt: Path, out: Path, rec: dict) -> list[str]:
    gate = rec["accuracy"]["gate"]["table"]
    first, last = gate[0][1], gate[-1][1]
    held = heldout_cosine(ckpt, out)
    return [label, f"{first['mean_cosine']:.5f} ({'pass' if gate[0][2] else 'FAIL'})", f"{first['min_cosine']:.5f}",
            str(len(rec["quantization"]["int8_gemms"]["fp16_fallback"])), f"{last['mean_cosine']:.5f}",
            f"{last['min_cosine']:.5f}", f"{held['mean_cosine']:.5f} / {held['min_cosine']:.5f} ({held['samples']})"]


def embedding_rows(base: Path, work: Path, tag: str, attn: list, args) -> tuple[list, list[str]]:
    """PTQ and ranges-only QAT (one per seed) of an embedding model; (rows, header)."""
    ptq = work / f"ptq{tag}"
    rows = [embedding_row("PTQ, SmoothQuant 0.5 (build default)", base, ptq, build(base, ptq, *attn))]
    for seed in args.seeds:
        qat = work / f"qat{tag}-emb{f'-s{seed}' if seed else ''}"
        steps, seconds = finetuned(base, qat, 10**6, "--task", "feature-extraction", "--qat", "int8", *attn, "--seed",
                                   str(seed), "--from-calib", str(ptq / "calibration.cache"),
                                   epochs=args.ranges_epochs, amp="off")
        rows.append(embedding_row(f"QAT, {steps} steps, weights frozen, ranges distilled (1 - cosine), seed {seed} "
                                  f"({seconds / 60:.1f} min)", qat, work / f"{qat.name}-build",
                                  build(qat, work / f"{qat.name}-build", *attn)))
    head = ["model", "gate, all GEMMs INT8 (mean cosine)", "all-INT8 min cosine", "GEMMs kept FP16",
            "gate, final (mean cosine)", "final min cosine", "final vs FP32 on calib/heldout.txt (mean / min)"]
    return rows, head


RUNS = {  # kind: (directory suffix, finetune arguments, label)
    "learned": ("", [], "labels, learned ranges"),
    "frozen": ("-frozen", ["--qat-ranges", "frozen"], "labels, frozen ranges"),
    "distill": ("-kd", ["--qat-loss", "distill"], "distilling the base, learned ranges"),
    "ranges": ("-ranges", ["--qat-train", "ranges"], "weights frozen, ranges distilled on calib/default.txt"),
    "ranges-smooth": ("-ranges-smooth", ["--qat-train", "ranges", "--qat-smoothing", "learned"],
                      "weights frozen, ranges and SmoothQuant scales distilled on calib/default.txt"),
}


def qat_row(base: Path, work: Path, kind: str, seed: int, tag: str, attn: list, args) -> list[str]:
    suffix, extra, label = RUNS[kind]
    qat = work / f"qat{tag}{suffix}{f'-s{seed}' if seed else ''}"
    if kind.startswith("ranges"):  # whole epochs over the calibration corpus, in FP32 (no autocast)
        seed_cache = ["--from-calib", str(work / f"ptq{tag}" / "calibration.cache")]  # start at PTQ's ranges
        steps, seconds = finetuned(base, qat, 10**6, "--qat", "int8", *attn, *extra, "--seed", str(seed), *seed_cache,
                                   epochs=args.ranges_epochs, amp="off")
        label += f", seed {seed}"
    else:
        steps, seconds = finetuned(base, qat, args.steps, "--qat", "int8", *attn, *extra)
    return row(f"QAT, {steps} steps, {label} ({seconds / 60:.0f} min)", qat, work / f"{qat.name}-build",
               build(qat, work / f"{qat.name}-build", *attn))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default=None, help="fine-tuned classifier checkpoint (--embedding: an embedding model, "
                                                "default the embedded all-MiniLM-L6-v2)")
    p.add_argument("--embedding", action="store_true",
                   help="PTQ vs finetune --task feature-extraction --qat int8 (sentence-embedding cosine)")
    p.add_argument("--work", required=True, help="directory for builds and checkpoints (reused when there)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--int8-attention", action="store_true", help="quantize attention BMMs too (builds and QAT)")
    p.add_argument("--qat", nargs="+", default=["learned"], choices=tuple(RUNS),
                   help="QAT runs: learned or frozen ranges on the labels, learned ranges distilling the base; "
                        "ranges: weights frozen, ranges distilled on calib/default.txt (--qat-train ranges, "
                        "--ranges-epochs epochs in FP32); ranges-smooth: the same, SmoothQuant scales learned too")
    p.add_argument("--ranges-epochs", type=int, default=3, help="epochs over calib/default.txt of the ranges runs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the ranges runs (one row each)")
    p.add_argument("--control", action="store_true",
                   help="also PTQ of the base fine-tuned --steps more without QAT (same settings)")
    p.add_argument("--append", default=None)
    args = p.parse_args(argv)
    if args.base is None and not args.embedding:
        p.error("--base is required (a fine-tuned classifier)")
    attn, tag = (["--int8-attention"], "A") if args.int8_attention else ([], "")
    if args.embedding:
        return embedding_main(args, attn, tag)
    base, work = Path(args.base).resolve(), Path(args.work).resolve()
    rows = [row("PTQ, SmoothQuant 0.5 (build default)", base, work / f"ptq{tag}", build(base, work / f"ptq{tag}", *attn))]
    if args.control:
        steps, seconds = finetuned(base, work / "cont", args.steps)
        rows.append(row(f"+{steps} steps FP32 fine-tuning, then PTQ", work / "cont", work / f"cont-ptq{tag}",
                        build(work / "cont", work / f"cont-ptq{tag}", *attn)))
    for kind in args.qat:
        for seed in args.seeds if kind.startswith("ranges") else [0]:
            rows.append(qat_row(base, work, kind, seed, tag, attn, args))
    head = ["model", "FP32 accuracy", "gate, all GEMMs INT8 (top-1 agreement)", "all-INT8 mean KL", "GEMMs kept FP16",
            "gate, final", "final mean KL", "INT8 accuracy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines) + ("\n\nFine-tuning: batch 32, bf16 autocast, lr 2e-5, on 2 shared CPU cores. Ranges runs "
                                f"(--qat-train ranges): weights frozen, FP32, batch 32, {args.ranges_epochs} epochs over "
                                "calib/default.txt (1316 texts, none of them in calib/heldout.txt), KL to the FP32 "
                                "model, default --range-lr, ranges started from the PTQ row's calibration cache "
                                "(--from-calib), so training is the only difference. Accuracy: the topics evaluation split (243 texts); gate: "
                                "top-1 agreement with the build's own FP32 on calib/heldout.txt (160 texts), "
                                "threshold 0.99; mean KL: of the class distributions, same texts.")
    print(text)
    if args.append:
        from trt_seer.bench.report import append_benchmark

        command = (f"python tools/bench_qat.py --base <classifier> --work <dir> --steps {args.steps} --qat "
                   f"{' '.join(args.qat)} --ranges-epochs {args.ranges_epochs} --seeds {' '.join(map(str, args.seeds))}"
                   f"{' --control' if args.control else ''} {' '.join(attn)}").strip()
        append_benchmark(Path(args.append), "W8A8 PTQ vs QAT (finetune --qat int8)", command, "CPU", text)
    return 0


def machine() -> str:
    """CPU model and cores, Python and library versions (what ran finetune and ONNX Runtime)."""
    import platform

    import onnxruntime
    import torch

    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.is_file() else []
    cpu = names[0] if names else platform.processor() or "CPU"
    return (f"{cpu}, {os.cpu_count()} cores (shared); no GPU used; {platform.system()}, Python "
            f"{platform.python_version()}, torch {torch.__version__}, onnxruntime {onnxruntime.__version__}")


def embedding_main(args, attn: list, tag: str) -> int:
    from trt_seer.export.families import default_checkpoint

    base = Path(args.base).resolve() if args.base else Path(default_checkpoint())
    rows, head = embedding_rows(base, Path(args.work).resolve(), tag, attn, args)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    name = base.name if args.base else "all-MiniLM-L6-v2 (the embedded default)"
    text = "\n".join(lines) + (f"\n\nModel {name}{' with --int8-attention' if attn else ''}, build profile "
                                f"{' '.join(PROFILE)}. QAT: `finetune --task feature-extraction --qat int8`, weights "
                                f"frozen, FP32, batch 32, {args.ranges_epochs} epochs over calib/default.txt (1316 "
                                "texts, none in calib/heldout.txt), loss 1 - cosine of the sentence embedding to the "
                                "FP32 model's, default --range-lr, ranges started from the PTQ row's calibration cache "
                                "(--from-calib). Gate: mean cosine >= 0.99 and min >= 0.97 against the build's own "
                                "FP32 on the first 160 lines of calib/heldout.txt; last column: all 398 lines, ONNX "
                                "Runtime CPU, final Q/DQ graph vs FP32 graph. 2 shared CPU cores.")
    print(text)
    if args.append:
        from trt_seer.bench.report import append_benchmark

        command = (f"python tools/bench_qat.py --embedding --work <dir> --ranges-epochs {args.ranges_epochs} "
                   f"--seeds {' '.join(map(str, args.seeds))} {' '.join(attn)}").strip()
        append_benchmark(Path(args.append), "W8A8 PTQ vs QAT for an embedding model (finetune --task "
                         "feature-extraction --qat int8)", command, machine(), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
