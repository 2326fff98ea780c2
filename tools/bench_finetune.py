"""Fine-tuning speed by precision (FP32 with TF32 off, TF32, AMP fp16, AMP bf16) of classifiers and causal LMs.

Encoder classifiers: the default all-MiniLM-L6-v2 and a BERT-base-sized random-init model; causal
LMs: random-init Llama shapes, trained by `finetune --task causal-lm`.

    python tools/bench_finetune.py                      # GPU: table, appended to docs/BENCHMARKS.md
    python tools/bench_finetune.py --compile --batches 64,256
    python tools/bench_finetune.py --models llama-160m --batches 128 --max-seq 512   # GPU: causal LM
    python tools/bench_finetune.py --quick              # CPU smoke check: tiny model, a few steps
    python tools/bench_finetune.py --quick --models llama-tiny    # CPU smoke check of the causal-LM path
    python tools/bench_finetune.py --accuracy           # GPU: FP32 vs AMP eval accuracy, full runs

Models (--models): text classification (4 labels): default (the embedded all-MiniLM-L6-v2, or
--default-model), bert-base (random init, BERT-base shape), tiny (random init, 2 layers, hidden 64).
Causal LM: llama-tiny (2 layers, hidden 64, 4 heads, 2 KV heads, intermediate 128), llama-160m
(hidden 768, 12 layers, 12 heads, intermediate 2048), llama-1b (TinyLlama-1.1B shape: hidden 2048,
22 layers, 32 heads, 4 KV heads, intermediate 5632); all random init, with the byte-level BPE
tokenizer of tools/quality_generate.py (4096 tokens, trained on calib/default.txt), so their
embeddings and LM head are smaller than with a 32K vocabulary.

Each run is a short `trt_seer.finetune` run (--steps optimizer steps, one epoch). Classifiers train
on texts made of 4 same-topic lines of the embedded corpus (about 100 tokens each), evaluated on
held-out lines. Causal LMs train on documents of same-topic lines of the embedded corpus joined
until they exceed --max-seq tokens, so every sequence is exactly --max-seq tokens (truncated, no
padding) and tokens/s = samples/s x --max-seq; they are evaluated (loss, perplexity) on 256
documents made the same way from held-out lines. samples/s (sequences/s for LMs) is the steady rate
after --warmup-steps (compilation and autotuning excluded; the table counts them under "steps left
out"), next to the median step time, its p10-p90 and maximum, and every outlier step (over 3x the
median: listed, and kept in samples/s); peak memory is
torch.cuda.max_memory_allocated (peak RSS on CPU). AdamW is fused on CUDA. Each task gets its own
table (and section in docs/BENCHMARKS.md).

--accuracy instead runs what `trt-seer finetune` does by default (the default model, the embedded
topics corpus, 3 epochs, batch 32) once per precision and seed, and compares the final eval
accuracy of each AMP mode with FP32 (TF32 off): the target is within 0.5 points.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))  # quality_generate's BPE tokenizer (imported when an LM needs it)
PRECISIONS = {  # name -> (amp mode, TF32 matmuls)
    "fp32": ("off", False), "tf32": ("off", True), "fp16": ("fp16", False), "bf16": ("bf16", False)}
BERT_BASE = {}  # transformers.BertConfig() defaults are BERT-base: 768 hidden, 12 layers, 12 heads
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
LLAMAS = {  # random-init LlamaForCausalLM shapes; the vocabulary is the BPE tokenizer's
    "llama-tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 128},
    "llama-160m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 2048},
    "llama-1b": {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "intermediate_size": 5632}}
CLASSIFIERS = ("default", "bert-base", "tiny")
LM_VOCAB = 4096  # the BPE tokenizer's size (tools/quality_generate.py's)
EVAL_EXAMPLES = 256
TASK_DEFAULTS = {  # --batches, --max-seq when not given
    "text-classification": ("64,256", 128), "causal-lm": ("128", 512)}  # 128 x 512 = 64K tokens per step
QUICK_DEFAULTS = ("4,8", 128)


def task_of(model: str) -> str:
    return "causal-lm" if model in LLAMAS else "text-classification"


@dataclass(frozen=True)
class Model:
    path: Path
    task: str
    params: int | None = None  # parameter count (random-init models)


@dataclass(frozen=True)
class Case:
    model: str
    precision: str
    batch: int


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="CPU smoke check: 6 steps of a tiny random model "
                   "(BERT; --models llama-tiny: Llama)")
    p.add_argument("--models", default=None, help="comma list of default, bert-base, tiny (classifiers), "
                   "llama-tiny, llama-160m, llama-1b (causal LMs) (default: default,bert-base; --quick: tiny)")
    p.add_argument("--precisions", default=None, help="comma list of fp32, tf32, fp16, bf16 "
                   "(default: all the device supports)")
    p.add_argument("--batches", default=None,
                   help="micro-batch sizes (default: 64,256 for classifiers, 128 for causal LMs; --quick: 4,8)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: 80; --quick: 6)")
    p.add_argument("--warmup-steps", type=int, default=None, help="steps left out of samples/s (default: 20; --quick: 2)")
    p.add_argument("--max-seq", type=int, default=None,
                   help="token limit; causal LMs: every sequence's length "
                        "(default: 128 for classifiers, 512 for causal LMs; --quick: 128)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    p.add_argument("--compile", action="store_true", help="torch.compile every run")
    p.add_argument("--warmup-runs", type=int, default=0,
                   help="unmeasured runs of each case before the measured ones (a process's first run "
                        "of a precision pays one-off costs such as loading its kernels) (default: 0)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per case; the table shows the median samples/s and the min-max spread (default: 1)")
    p.add_argument("--default-model", metavar="DIR", default=None,
                   help="checkpoint to use as 'default' (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--append", action=argparse.BooleanOptionalAction, default=None,
                   help="append the table to docs/BENCHMARKS.md (default: yes, except with --quick)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write every run's numbers here")
    p.add_argument("--accuracy", action="store_true",
                   help="full default fine-tunes per precision and seed; eval accuracy vs fp32 "
                        "(the default classifier; --models is ignored)")
    p.add_argument("--seeds", default="0,1,2", help="--accuracy: seeds of the new head and data order (default: 0,1,2)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    q = args.quick
    args.models = (args.models or ("tiny" if q else "default,bert-base")).split(",")
    unknown = [m for m in args.models if m not in CLASSIFIERS and m not in LLAMAS]
    if unknown:
        fail(f"unknown model {unknown[0]!r}; choose from {', '.join((*CLASSIFIERS, *LLAMAS))}")
    args.task_batches, args.task_seq = {}, {}
    for task, (batches, seq) in TASK_DEFAULTS.items():
        batches, seq = QUICK_DEFAULTS if q else (batches, seq)
        args.task_batches[task] = [int(b) for b in (args.batches or batches).split(",")]
        args.task_seq[task] = args.max_seq or seq
    args.steps = args.steps or (6 if q else 80)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (2 if q else 20)
    args.append = (not q) if args.append is None else args.append
    return args


def fail(message: str):
    """Bad input: one line on stderr, exit status 2."""
    print(f"bench_finetune: {message}", file=sys.stderr)
    sys.exit(2)


def supported_precisions(requested: str | None, cuda: bool) -> list[str]:
    names = requested.split(",") if requested else list(PRECISIONS)
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown:
        fail(f"unknown precision {unknown[0]!r}; choose from {', '.join(PRECISIONS)}")
    if cuda:
        return names
    return [n for n in names if n in ("fp32", "bf16")]  # fp16 needs CUDA; TF32 is a GPU mode


def tokenizer_dir() -> Path:
    from trt_seer.export.families import default_checkpoint

    return default_checkpoint()


def random_bert(dest: Path, sizes: dict, tokenizer_from: Path) -> Model:
    """A random-init BertForSequenceClassification (4 labels) with the default model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=4, **sizes))
    model.save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(dest))
    return Model(dest, "text-classification", model.num_parameters())


def random_llama(dest: Path, sizes: dict, tokenizer, max_seq: int) -> Model:
    """A random-init LlamaForCausalLM of `sizes` with `tokenizer` (its vocabulary, BOS/EOS/pad)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=max(2048, max_seq),
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, **sizes)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    return Model(dest, "causal-lm", model.num_parameters())


def lm_tokenizer(work: Path):
    """The BPE tokenizer tools/quality_generate.py trains (LM_VOCAB tokens, calib/default.txt)."""
    from quality_generate import bpe_tokenizer

    return bpe_tokenizer(work / "bpe-tokenizer", LM_VOCAB)


def model_dirs(names: list[str], work: Path, default_model: str | None, max_seq: int = 512) -> dict[str, Model]:
    default = Path(default_model) if default_model else None

    def tokenizer() -> Path:  # the encoders' (the default model's), looked up only if one is asked for
        return default or tokenizer_dir()

    made = {"default": lambda: Model(tokenizer(), "text-classification"),
            "bert-base": lambda: random_bert(work / "bert-base", BERT_BASE, tokenizer()),
            "tiny": lambda: random_bert(work / "tiny", TINY, tokenizer())}
    bpe = lm_tokenizer(work) if any(n in LLAMAS for n in names) else None
    made.update({n: (lambda n=n: random_llama(work / n, LLAMAS[n], bpe, max_seq)) for n in LLAMAS})
    return {n: made[n]() for n in names}


def by_topic(examples) -> dict[str, list[str]]:
    topics = {}
    for e in examples:
        topics.setdefault(e.label, []).append(e.text)
    return topics


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_data(work: Path, examples_needed: int) -> tuple[Path, Path]:
    """Train/eval JSONL of 4 same-topic lines joined: long enough for batched matmuls to matter."""
    from trt_seer.finetune.data import topics_examples

    train, evaluation = topics_examples()
    paths = []
    for name, pool, count in (("train", train, examples_needed), ("eval", evaluation, EVAL_EXAMPLES)):
        rng, topics = random.Random(name), by_topic(pool)
        rows = []
        for _ in range(count):
            topic = rng.choice(sorted(topics))
            rows.append({"text": " ".join(rng.choices(topics[topic], k=4)), "label": topic})
        paths.append(write_jsonl(work / f"{name}.jsonl", rows))
    return paths[0], paths[1]


def write_documents(work: Path, documents_needed: int, tokenizer, max_seq: int) -> tuple[Path, Path]:
    """Train/eval JSONL of causal-LM documents ({"text": ...}, what `finetune --task causal-lm
    --train` reads): same-topic lines of the embedded corpus joined until the document is longer
    than `max_seq` tokens with room to spare, so each is truncated to exactly `max_seq`."""
    from trt_seer.finetune.data import topics_examples

    train, evaluation = topics_examples()
    paths = []
    for name, pool, count in (("train", train, documents_needed), ("eval", evaluation, EVAL_EXAMPLES)):
        rng, topics = random.Random(name), by_topic(pool)
        texts = [e.text for e in pool]
        tokens = dict(zip(texts, map(len, tokenizer(texts, add_special_tokens=False)["input_ids"])))
        rows = [{"text": document(rng, topics[rng.choice(sorted(topics))], tokens, max_seq)} for _ in range(count)]
        paths.append(write_jsonl(work / f"lm-{name}.jsonl", rows))
    return paths[0], paths[1]


def document(rng: random.Random, lines: list[str], tokens: dict[str, int], max_seq: int) -> str:
    """Random lines of one topic, joined until their tokens (counted line by line) pass
    1.1 x max_seq + 8: joining changes a line's first token at most, so the text fills max_seq."""
    picked, total = [], 0
    while total <= 1.1 * max_seq + 8:
        picked.append(rng.choice(lines))
        total += tokens[picked[-1]]
    return " ".join(picked)


def set_tf32(enabled: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def train_once(spec, tf32: bool):
    """Runs one fine-tune; its training.json record, or None when the GPU ran out of memory."""
    import torch

    from trt_seer.finetune import finetune

    set_tf32(tf32)
    try:
        finetune(spec)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        set_tf32(False)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return json.loads((spec.out / "training.json").read_text())


def run_case(case: Case, model: Model, data: tuple[Path, Path], work: Path, args) -> dict:
    """One short fine-tune of `model` for its task (text-classification or causal-lm)."""
    from trt_seer.finetune import AmpSpec, DataSpec, FinetuneSpec
    from trt_seer.finetune.monitor import read_metrics

    amp, tf32 = PRECISIONS[case.precision]
    out = work / "runs" / f"{case.model}-{case.precision}-{case.batch}"
    seq = args.task_seq[model.task]
    spec = FinetuneSpec(out=out, model=model.path, task=model.task, data=DataSpec(*data, max_seq=seq),
                        amp=AmpSpec(amp), batch=case.batch, epochs=1, max_steps=args.steps, lr=args.lr,
                        compile=args.compile, device="auto")
    facts = {**case.__dict__, "task": model.task, "params": model.params, "max_seq": seq}
    record = train_once(spec, tf32)
    if record is None:
        return {**facts, "error": "out of memory"}
    steps = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "step"]
    return {**facts, **steady_rate(steps, args.warmup_steps), **summary(record)}


def accuracy_case(precision: str, seed: int, model: Path, work: Path, args) -> dict:
    """One default fine-tune (embedded corpus, the CLI's defaults); --quick: 1 epoch, --steps steps."""
    from trt_seer.finetune import AmpSpec, DataSpec, FinetuneSpec

    amp, tf32 = PRECISIONS[precision]
    quick = {"epochs": 1, "max_steps": args.steps} if args.quick else {}
    spec = FinetuneSpec(out=work / "accuracy" / f"{precision}-{seed}", model=model,
                        data=DataSpec(max_seq=args.task_seq["text-classification"]), amp=AmpSpec(amp), seed=seed,
                        compile=args.compile, device="auto", **quick)
    record = train_once(spec, tf32)
    if record is None:
        return {"precision": precision, "seed": seed, "error": "out of memory"}
    final = record["metrics"]["final"]
    return {"precision": precision, "seed": seed, "eval_accuracy": final["eval_accuracy"],
            "eval_examples": record["data"]["eval_examples"], "seconds": record["seconds"],
            "samples_per_s": record["metrics"]["epochs"][-1]["samples_per_s"],
            "skipped_steps": record["metrics"]["skipped_steps"], "hardware": record["hardware"]}


OUTLIER = 3.0  # a timed step over this many times the median step is listed as an outlier


def steady_rate(steps: list[dict], warmup: int) -> dict:
    """Throughput over the steps after `warmup` (all from one epoch, so elapsed_s is one clock), and
    the per-step times: median, spread, the steps left out and the outliers (kept in the rate)."""
    warmup = min(warmup, len(steps) - 2)
    first, last = steps[warmup], steps[-1]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    timed = steps[warmup + 1:]
    step_ms = [1000.0 * (b["elapsed_s"] - a["elapsed_s"]) for a, b in zip(steps[warmup:], timed)]
    warmup_ms = [1000.0 * (b["elapsed_s"] - a["elapsed_s"])
                 for a, b in zip([{"elapsed_s": 0.0}] + steps[:warmup], steps[:warmup + 1])]
    return {"samples_per_s": sum(r["examples"] for r in timed) / seconds, "step_ms": step_ms,
            "tokens_per_s": sum(r["tokens"] for r in timed) / seconds,
            "mean_tokens": sum(r["tokens"] for r in timed) / sum(r["examples"] for r in timed),
            **step_stats(step_ms, [r.get("step") for r in timed], warmup_ms)}


def step_stats(step_ms: list[float], step_ids: list, warmup_ms: list[float]) -> dict:
    """Median step, p10-p90 and min-max of the timed steps; the warm-up steps left out, with why and
    their times; every timed step over OUTLIER x the median (reported, never dropped)."""
    import numpy as np

    p10, median, p90 = (float(v) for v in np.percentile(step_ms, [10, 50, 90]))
    outliers = [{"step": i, "ms": ms} for i, ms in zip(step_ids, step_ms) if ms > OUTLIER * median]
    left_out = {"steps": len(warmup_ms), "reason": "warm-up (compilation, autotuning, allocator growth)",
                "ms": warmup_ms}
    return {"step_ms_median": median, "step_ms_p10": p10, "step_ms_p90": p90, "step_ms_min": min(step_ms),
            "step_ms_max": max(step_ms), "left_out": left_out, "outliers": outliers}


def step_text(r: dict) -> str:
    """'145 (p10-p90 141-150, max 1,464)' and, when there are any, the outliers by step."""
    if "step_ms_median" not in r:
        return "-"
    text = (f"{r['step_ms_median']:,.0f} (p10-p90 {r['step_ms_p10']:,.0f}-{r['step_ms_p90']:,.0f}, "
            f"max {r['step_ms_max']:,.0f})")
    outliers = ", ".join(f"step {o['step']} {o['ms']:,.0f} ms" for o in r["outliers"])
    return text + (f"; outliers (> {OUTLIER:g}x median, kept): {outliers}" if outliers else "")


def left_out_text(r: dict) -> str:
    lo = r.get("left_out")
    if not lo or not lo["steps"]:
        return "none"
    return f"{lo['steps']} {lo['reason'].split(' (')[0]} ({max(lo['ms']):,.0f} ms max)"


EVAL_METRICS = ("eval_loss", "eval_accuracy", "eval_perplexity")  # those the task reports


def summary(record: dict) -> dict:
    epoch = record["metrics"]["epochs"][-1]
    return {"peak_memory_gib": epoch["peak_memory_bytes"] / 2**30, "memory_kind": epoch["peak_memory_kind"],
            **{k: epoch[k] for k in EVAL_METRICS if k in epoch}, "train_loss": epoch["train_loss"],
            "skipped_steps": record["metrics"]["skipped_steps"], "hardware": record["hardware"]}


def table(rows: list[dict]) -> str:
    """One task's rows: rates with their spread over repeats, speed-ups vs fp32 and tf32 of the same
    model and batch, peak memory and the task's eval metric (accuracy, or loss and perplexity)."""
    lm = any(r.get("task") == "causal-lm" for r in rows)
    base = {p: {(r["model"], r["batch"]): r["samples_per_s"] for r in rows if r["precision"] == p and "error" not in r}
            for p in ("fp32", "tf32")}
    evals = ("eval loss", "eval ppl") if lm else ("eval acc",)
    lines = ["| model | precision | batch | samples/s | tokens/s | vs fp32 | vs tf32 | step ms median (spread) | "
             "steps left out | peak memory GiB | " + " | ".join(evals) + " | skipped |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | " + " | ".join(["---:"] * len(evals))
             + " | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['error']} |" + " |" * (7 + len(evals)))
            continue
        speedups = []
        for p in ("fp32", "tf32"):
            ref = base[p].get((r["model"], r["batch"]))
            speedups.append(f"{r['samples_per_s'] / ref:.2f}x" if ref else "-")
        rate = f"{r['samples_per_s']:.1f}"
        if len(r.get("runs_samples_per_s", [])) > 1:
            rate += f" ({r['spread'][0]:.0f}-{r['spread'][1]:.0f}, {len(r['runs_samples_per_s'])} runs)"
        metric = (f"{r['eval_loss']:.3f} | {r['eval_perplexity']:.1f}" if lm else f"{r['eval_accuracy']:.3f}")
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {rate} | {r['tokens_per_s']:.0f} | "
                     f"{' | '.join(speedups)} | {step_text(r)} | {left_out_text(r)} | {r['peak_memory_gib']:.2f} | "
                     f"{metric} | {r['skipped_steps']} |")
    return "\n".join(lines)


def machine(rows: list[dict]) -> str:
    hw = next((r["hardware"] for r in rows if "hardware" in r), {})
    gpu = f"{hw['gpu']} (compute capability {hw['compute_capability']}), " if "gpu" in hw else ""
    from trt_seer.bench.host import cpu_name

    cpu = cpu_name()
    return (f"{gpu}{cpu}, {os.cpu_count()} cores; {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {hw.get('torch')}, transformers {hw.get('transformers')}")


ACCURACY_TOLERANCE = 0.5  # points of eval accuracy an AMP mode may lose against fp32


def accuracy_table(rows: list[dict]) -> str:
    by = {}
    for r in rows:
        by.setdefault(r["precision"], []).append(r)
    ok = {p: [r for r in rs if "error" not in r] for p, rs in by.items()}
    mean = {p: sum(r["eval_accuracy"] for r in rs) / len(rs) for p, rs in ok.items() if rs}
    lines = ["| precision | eval accuracy per seed | mean | vs fp32 (points) | within 0.5 | samples/s | skipped steps |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for p, rs in by.items():
        seeds = ", ".join(f"{r['eval_accuracy']:.4f}" if "error" not in r else r["error"] for r in rs)
        if p not in mean:
            lines.append(f"| {p} | {seeds} | | | | | |")
            continue
        delta = 100 * (mean[p] - mean["fp32"]) if "fp32" in mean else None
        verdict = "-" if delta is None or p == "fp32" else ("yes" if delta >= -ACCURACY_TOLERANCE else "NO")
        rate = sum(r["samples_per_s"] for r in ok[p]) / len(ok[p])
        lines.append(f"| {p} | {seeds} | {mean[p]:.4f} | {'-' if delta is None else f'{delta:+.2f}'} | {verdict} | "
                     f"{rate:.0f} | {sum(r['skipped_steps'] for r in ok[p])} |")
    return "\n".join(lines)


def speed_intro(rows: list[dict], args) -> tuple[str, str]:
    """The title and note of one task's throughput table."""
    timed = [r for r in rows if "mean_tokens" in r]
    mean_tokens = sum(r["mean_tokens"] for r in timed) / max(1, len(timed))
    models = ", ".join(dict.fromkeys(r["model"] for r in rows))
    runs = (f"the median of {args.repeats} short runs (min-max in brackets, run round-robin)"
            if args.repeats > 1 else "one short run")
    if args.warmup_runs:
        runs += f", after {args.warmup_runs} unmeasured run(s) of every case"
    common = (f"Each row is {runs}: {args.steps} optimizer steps, samples/s over the last "
              f"{args.steps - args.warmup_steps - 1}; fused AdamW on CUDA; torch.compile "
              f"{'on' if args.compile else 'off'}; 'vs fp32' / 'vs tf32' compare samples/s with the same model "
              f"and batch. Step ms: the median timed step with its p10-p90 and maximum; every timed step over "
              f"{OUTLIER:g}x the median is listed by number and stays in samples/s; the warm-up steps left out "
              f"are counted with their longest time. Peak memory is torch.cuda.max_memory_allocated (peak RSS on CPU).")
    if rows[0]["task"] == "causal-lm":
        seq = args.task_seq["causal-lm"]
        shapes = "; ".join(llama_shape(r["model"], r["params"]) for r in dict((r["model"], r) for r in rows).values())
        return (f"Fine-tuning throughput by precision, causal LM ({models})",
                f"{common} Random-init Llama models (`finetune --task causal-lm`): {shapes}; vocabulary: the "
                f"{LM_VOCAB}-token byte-level BPE tokenizer trained on calib/default.txt (tools/quality_generate.py), "
                f"so embeddings and LM head are smaller than with a 32K vocabulary. samples/s counts sequences: "
                f"each is {seq} tokens of a document of same-topic lines of the embedded corpus (truncated, no "
                f"padding; measured {mean_tokens:.0f} tokens per sequence), so tokens/s = samples/s x {seq}. "
                f"Eval loss and perplexity are on {EVAL_EXAMPLES} held-out documents after those few steps: a random-init "
                f"model starts near perplexity {LM_VOCAB}.")
    return (f"Fine-tuning throughput by precision, text classification ({models})",
            f"{common} About {mean_tokens:.0f} tokens per example (max {args.task_seq['text-classification']}). "
            f"Eval accuracy is after those few steps: random-init models stay near chance (0.25).")


def llama_shape(name: str, params: int | None) -> str:
    s = LLAMAS[name]
    kv = s.get("num_key_value_heads", s["num_attention_heads"])
    return (f"{name} = hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, {s['num_attention_heads']} heads "
            f"({kv} KV), intermediate {s['intermediate_size']}, {params / 1e6:.1f}M parameters")


def accuracy_intro(rows: list[dict], args) -> tuple[str, str]:
    n = next((r["eval_examples"] for r in rows if "eval_examples" in r), "?")
    return ("Fine-tuning accuracy, FP32 vs mixed precision",
            f"Each run is `trt-seer finetune`'s default job (the default model on the embedded topics "
            f"corpus, batch 32, 3 epochs, lr 5e-5) with --amp off (TF32 off) / fp16 / bf16; seeds "
            f"{', '.join(map(str, args.seeds))} set the new head and the data order, the same for every "
            f"precision. Eval accuracy is on the {n} held-out examples after the last epoch (one example = "
            f"{100 / n if isinstance(n, int) else 0:.2f} points); 'within 0.5' compares each mean with fp32's.")


def append_report(title: str, intro: str, text: str, rows: list[dict], tool: str = "bench_finetune.py",
                  path: Path = ROOT / "docs" / "BENCHMARKS.md", argv: list[str] | None = None) -> Path:
    """Appends a dated section (machine, command, intro, table) to docs/BENCHMARKS.md through the
    project's one writer of that file."""
    from trt_seer.bench.report import append_benchmark

    command = shlex.join(["python", f"tools/{tool}", *(sys.argv[1:] if argv is None else argv)])
    return append_benchmark(path, title, command, machine(rows), f"{intro}\n\n{text}")


def speed_rows(args, precisions: list[str], work: Path) -> list[dict]:
    """One row per case; with --repeats the cases run round-robin (repeat 1 of every case, then
    repeat 2, ...) so a drift of the machine spreads over all cases, and each row keeps every run."""
    models = model_dirs(args.models, work, args.default_model, args.task_seq["causal-lm"])
    data = task_data(models, work, args)
    cases = [(Case(name, precision, batch), model) for name, model in models.items()
             for batch in args.task_batches[model.task] for precision in precisions]
    runs = {case: [] for case, _ in cases}
    for _ in range(args.warmup_runs):
        for case, model in cases:
            print(json.dumps({"warmup_run": case.__dict__, "samples_per_s":
                              run_case(case, model, data[model.task], work, args).get("samples_per_s")}), flush=True)
    for _ in range(max(1, args.repeats)):
        for case, model in cases:
            runs[case].append(run_case(case, model, data[model.task], work, args))
            print(json.dumps({k: v for k, v in runs[case][-1].items() if k != "hardware"}), flush=True)
    return [combine(r) for r in runs.values()]


def task_data(models: dict[str, Model], work: Path, args) -> dict[str, tuple[Path, Path]]:
    """Train/eval files for each task among `models`: enough training examples for the largest batch."""
    data = {}
    for task in dict.fromkeys(m.task for m in models.values()):
        needed = (args.steps + 1) * max(args.task_batches[task])
        if task == "causal-lm":
            tokenizer = lm_tokenizer_of(next(m for m in models.values() if m.task == task))
            data[task] = write_documents(work, needed, tokenizer, args.task_seq[task])
        else:
            data[task] = write_data(work, needed)
    return data


def lm_tokenizer_of(model: Model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model.path))


def combine(runs: list[dict]) -> dict:
    """The median run of a case (by samples/s), with every run's samples/s and the spread."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["samples_per_s"])
    if not ok:
        return runs[0]
    rates = [r["samples_per_s"] for r in ok]
    return {**ok[(len(ok) - 1) // 2], "runs_samples_per_s": rates, "spread": (rates[0], rates[-1])}


def accuracy_rows(args, precisions: list[str], work: Path) -> list[dict]:
    model = model_dirs(["tiny" if args.quick else "default"], work, args.default_model)
    rows = []
    for precision in [p for p in precisions if p != "tf32"]:
        for seed in args.seeds:
            rows.append(accuracy_case(precision, seed, next(iter(model.values())), work, args))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "hardware"}), flush=True)
    return rows


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    precisions = supported_precisions(args.precisions, torch.cuda.is_available())
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        rows = (accuracy_rows if args.accuracy else speed_rows)(args, precisions, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    for part in ([rows] if args.accuracy else by_task(rows)):
        text = (accuracy_table if args.accuracy else table)(part)
        title, intro = (accuracy_intro if args.accuracy else speed_intro)(part, args)
        print(f"\n{title}\n{machine(part)}\n{text}")
        if args.append:
            print(f"appended to {append_report(title, intro, text, part)}")
    return 0


def by_task(rows: list[dict]) -> list[list[dict]]:
    """The rows split by task (in the order the tasks first appear): one table each."""
    tasks = {}
    for r in rows:
        tasks.setdefault(r["task"], []).append(r)
    return list(tasks.values())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing
    sys.exit(main())
