"""Fine-tuning speed by precision: FP32 (TF32 off), FP32 with TF32, AMP fp16, AMP bf16; two batch
sizes; the default model (all-MiniLM-L6-v2) and a BERT-base-sized random-init model.

    python tools/bench_finetune.py                      # GPU: table, appended to docs/BENCHMARKS.md
    python tools/bench_finetune.py --compile --batches 64,256
    python tools/bench_finetune.py --quick              # CPU smoke check: tiny model, a few steps
    python tools/bench_finetune.py --accuracy           # GPU: FP32 vs AMP eval accuracy, full runs

Each run is a short `trt_seer.finetune` run (--steps optimizer steps, one epoch) on texts made of
4 same-topic lines of the embedded corpus (about 100 tokens each), evaluated on held-out lines.
samples/s is the steady rate after --warmup-steps (compilation and autotuning excluded); peak
memory is torch.cuda.max_memory_allocated (peak RSS on CPU). AdamW is fused on CUDA.

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
PRECISIONS = {  # name -> (amp mode, TF32 matmuls)
    "fp32": ("off", False), "tf32": ("off", True), "fp16": ("fp16", False), "bf16": ("bf16", False)}
BERT_BASE = {}  # transformers.BertConfig() defaults are BERT-base: 768 hidden, 12 layers, 12 heads
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


@dataclass(frozen=True)
class Case:
    model: str
    precision: str
    batch: int


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="CPU smoke check: tiny random BERT, 6 steps")
    p.add_argument("--models", default=None, help="comma list of default, bert-base, tiny "
                   "(default: default,bert-base; --quick: tiny)")
    p.add_argument("--precisions", default=None, help="comma list of fp32, tf32, fp16, bf16 "
                   "(default: all the device supports)")
    p.add_argument("--batches", default=None, help="micro-batch sizes (default: 64,256; --quick: 4,8)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: 80; --quick: 6)")
    p.add_argument("--warmup-steps", type=int, default=None, help="steps left out of samples/s (default: 20; --quick: 2)")
    p.add_argument("--max-seq", type=int, default=128, help="token limit (default: 128)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    p.add_argument("--compile", action="store_true", help="torch.compile every run")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per case; the table shows the median samples/s and the min-max spread (default: 1)")
    p.add_argument("--default-model", metavar="DIR", default=None,
                   help="checkpoint to use as 'default' (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--append", action=argparse.BooleanOptionalAction, default=None,
                   help="append the table to docs/BENCHMARKS.md (default: yes, except with --quick)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write every run's numbers here")
    p.add_argument("--accuracy", action="store_true",
                   help="full default fine-tunes per precision and seed; eval accuracy vs fp32")
    p.add_argument("--seeds", default="0,1,2", help="--accuracy: seeds of the new head and data order (default: 0,1,2)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    q = args.quick
    args.models = (args.models or ("tiny" if q else "default,bert-base")).split(",")
    args.batches = [int(b) for b in (args.batches or ("4,8" if q else "64,256")).split(",")]
    args.steps = args.steps or (6 if q else 80)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (2 if q else 20)
    args.append = (not q) if args.append is None else args.append
    return args


def supported_precisions(requested: str | None, cuda: bool) -> list[str]:
    names = requested.split(",") if requested else list(PRECISIONS)
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown:
        sys.exit(f"bench_finetune: unknown precision {unknown[0]!r}; choose from {', '.join(PRECISIONS)}")
    if cuda:
        return names
    return [n for n in names if n in ("fp32", "bf16")]  # fp16 needs CUDA; TF32 is a GPU mode


def tokenizer_dir() -> Path:
    from trt_seer.export.families import default_checkpoint

    return default_checkpoint()


def random_bert(dest: Path, sizes: dict, tokenizer_from: Path) -> Path:
    """A random-init BertForSequenceClassification (4 labels) with the default model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(num_labels=4, **sizes)).save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(dest))
    return dest


def model_dirs(names: list[str], work: Path, default_model: str | None) -> dict[str, Path]:
    default = Path(default_model) if default_model else None
    tokenizer = default or tokenizer_dir()
    made = {"default": lambda: default or tokenizer_dir(),
            "bert-base": lambda: random_bert(work / "bert-base", BERT_BASE, tokenizer),
            "tiny": lambda: random_bert(work / "tiny", TINY, tokenizer)}
    unknown = [n for n in names if n not in made]
    if unknown:
        sys.exit(f"bench_finetune: unknown model {unknown[0]!r}; choose from {', '.join(made)}")
    return {n: made[n]() for n in names}


def write_data(work: Path, examples_needed: int) -> tuple[Path, Path]:
    """Train/eval JSONL of 4 same-topic lines joined: long enough for batched matmuls to matter."""
    from trt_seer.finetune.data import topics_examples

    train, evaluation = topics_examples()
    paths = []
    for name, pool, count in (("train", train, examples_needed), ("eval", evaluation, 256)):
        rng, by_topic = random.Random(name), {}
        for e in pool:
            by_topic.setdefault(e.label, []).append(e.text)
        topics = sorted(by_topic)
        rows = []
        for _ in range(count):
            topic = rng.choice(topics)
            rows.append({"text": " ".join(rng.choices(by_topic[topic], k=4)), "label": topic})
        path = work / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
    return paths[0], paths[1]


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


def run_case(case: Case, model: Path, data: tuple[Path, Path], work: Path, args) -> dict:
    from trt_seer.finetune import AmpSpec, DataSpec, FinetuneSpec
    from trt_seer.finetune.monitor import read_metrics

    amp, tf32 = PRECISIONS[case.precision]
    out = work / "runs" / f"{case.model}-{case.precision}-{case.batch}"
    spec = FinetuneSpec(out=out, model=model, data=DataSpec(*data, max_seq=args.max_seq),
                        amp=AmpSpec(amp), batch=case.batch, epochs=1, max_steps=args.steps, lr=args.lr,
                        compile=args.compile, device="auto")
    record = train_once(spec, tf32)
    if record is None:
        return {**case.__dict__, "error": "out of memory"}
    steps = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "step"]
    return {**case.__dict__, **steady_rate(steps, args.warmup_steps), **summary(record)}


def accuracy_case(precision: str, seed: int, model: Path, work: Path, args) -> dict:
    """One default fine-tune (embedded corpus, the CLI's defaults); --quick: 1 epoch, --steps steps."""
    from trt_seer.finetune import AmpSpec, DataSpec, FinetuneSpec

    amp, tf32 = PRECISIONS[precision]
    quick = {"epochs": 1, "max_steps": args.steps} if args.quick else {}
    spec = FinetuneSpec(out=work / "accuracy" / f"{precision}-{seed}", model=model,
                        data=DataSpec(max_seq=args.max_seq), amp=AmpSpec(amp), seed=seed,
                        compile=args.compile, device="auto", **quick)
    record = train_once(spec, tf32)
    if record is None:
        return {"precision": precision, "seed": seed, "error": "out of memory"}
    final = record["metrics"]["final"]
    return {"precision": precision, "seed": seed, "eval_accuracy": final["eval_accuracy"],
            "eval_examples": record["data"]["eval_examples"], "seconds": record["seconds"],
            "samples_per_s": record["metrics"]["epochs"][-1]["samples_per_s"],
            "skipped_steps": record["metrics"]["skipped_steps"], "hardware": record["hardware"]}


def steady_rate(steps: list[dict], warmup: int) -> dict:
    """Throughput over the steps after `warmup` (all from one epoch, so elapsed_s is one clock)."""
    warmup = min(warmup, len(steps) - 2)
    first, last = steps[warmup], steps[-1]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    timed = steps[warmup + 1:]
    return {"samples_per_s": sum(r["examples"] for r in timed) / seconds,
            "tokens_per_s": sum(r["tokens"] for r in timed) / seconds,
            "mean_tokens": sum(r["tokens"] for r in timed) / sum(r["examples"] for r in timed)}


def summary(record: dict) -> dict:
    epoch = record["metrics"]["epochs"][-1]
    return {"peak_memory_gib": epoch["peak_memory_bytes"] / 2**30, "memory_kind": epoch["peak_memory_kind"],
            "eval_accuracy": epoch["eval_accuracy"], "train_loss": epoch["train_loss"],
            "skipped_steps": record["metrics"]["skipped_steps"], "hardware": record["hardware"]}


def table(rows: list[dict]) -> str:
    base = {(r["model"], r["batch"]): r["samples_per_s"] for r in rows
            if r["precision"] == "fp32" and "error" not in r}
    lines = ["| model | precision | batch | samples/s | tokens/s | vs fp32 | peak memory GiB | eval acc | skipped |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['error']} | | | | | |")
            continue
        ref = base.get((r["model"], r["batch"]))
        speedup = f"{r['samples_per_s'] / ref:.2f}x" if ref else "-"
        rate = f"{r['samples_per_s']:.1f}"
        if len(r.get("runs_samples_per_s", [])) > 1:
            rate += f" ({r['spread'][0]:.0f}-{r['spread'][1]:.0f}, {len(r['runs_samples_per_s'])} runs)"
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {rate} | "
                     f"{r['tokens_per_s']:.0f} | {speedup} | {r['peak_memory_gib']:.2f} | "
                     f"{r['eval_accuracy']:.3f} | {r['skipped_steps']} |")
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
    timed = [r for r in rows if "mean_tokens" in r]
    mean_tokens = sum(r["mean_tokens"] for r in timed) / max(1, len(timed))
    return ("Fine-tuning throughput by precision",
            f"Each row is {'the median of ' + str(args.repeats) + ' short runs (min-max in brackets, run round-robin)' if args.repeats > 1 else 'one short run'}: {args.steps} optimizer steps, samples/s "
            f"over the last {args.steps - args.warmup_steps - 1}; about {mean_tokens:.0f} tokens per example "
            f"(max {args.max_seq}); fused AdamW on CUDA; torch.compile {'on' if args.compile else 'off'}. "
            f"Peak memory is torch.cuda.max_memory_allocated (peak RSS on CPU). Eval accuracy is after "
            f"those few steps: random-init models stay near chance (0.25).")


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
    models = model_dirs(args.models, work, args.default_model)
    data = write_data(work, args.steps * max(args.batches) + max(args.batches))
    cases = [(Case(name, precision, batch), path) for name, path in models.items()
             for batch in args.batches for precision in precisions]
    runs = {case: [] for case, _ in cases}
    for _ in range(max(1, args.repeats)):
        for case, path in cases:
            runs[case].append(run_case(case, path, data, work, args))
            print(json.dumps({k: v for k, v in runs[case][-1].items() if k != "hardware"}), flush=True)
    return [combine(r) for r in runs.values()]


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
    text = (accuracy_table if args.accuracy else table)(rows)
    print(f"\n{machine(rows)}\n{text}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.append:
        title, intro = (accuracy_intro if args.accuracy else speed_intro)(rows, args)
        print(f"appended to {append_report(title, intro, text, rows)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing
    sys.exit(main())
