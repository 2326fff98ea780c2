"""ZeRO-1 against plain DDP: optimizer-state memory per rank, peak memory, samples/s and whether the
loss curves agree, for `torchrun --nproc-per-node N -m trt_seer finetune [--zero1]`.

    python tools/bench_zero1.py                 # GPUs (NCCL): BERT-base-sized model, 2 processes
    python tools/bench_zero1.py --quick         # CPU (gloo): tiny model, 2 processes, a few steps

Both runs use the same data, seed, micro-batch per process and steps; only the optimizer differs
(AdamW, fused on CUDA, vs ZeroRedundancyOptimizer over the same AdamW). Optimizer state is what each
rank's optimizer holds (exp_avg, exp_avg_sq, step); peak memory is rank 0's
torch.cuda.max_memory_allocated (peak RSS on CPU). Appends the table to docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import bench_finetune  # noqa: E402  (sibling tool: models, data, steady rate, machine line)

MODES = {"ddp": [], "zero1": ["--zero1"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="CPU: tiny random BERT, gloo, 6 steps")
    p.add_argument("--nproc", type=int, default=2, help="processes (GPUs) per run (default: 2)")
    p.add_argument("--model", default=None, help="default, bert-base or tiny (default: bert-base; --quick: tiny)")
    p.add_argument("--batch", type=int, default=None, help="micro-batch per process (default: 64; --quick: 4)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 40; --quick: 6)")
    p.add_argument("--warmup-steps", type=int, default=None, help="steps left out of samples/s (default: 10; --quick: 2)")
    p.add_argument("--amp", default=None, help="fp16, bf16 or off (default: fp16 on CUDA, off on CPU)")
    p.add_argument("--max-seq", type=int, default=128, help="token limit (default: 128)")
    p.add_argument("--default-model", metavar="DIR", default=None,
                   help="checkpoint for 'default' and tokenizer for the random models "
                        "(default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--append", action=argparse.BooleanOptionalAction, default=None,
                   help="append the table to docs/BENCHMARKS.md (default: yes, except with --quick)")
    args = p.parse_args(argv)
    q = args.quick
    args.model = args.model or ("tiny" if q else "bert-base")
    args.batch = args.batch or (4 if q else 64)
    args.steps = args.steps or (6 if q else 40)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (2 if q else 10)
    args.append = (not q) if args.append is None else args.append
    return args


def device_and_amp(args) -> tuple[str, str]:
    import torch

    cuda = not args.quick and torch.cuda.is_available()
    if cuda and torch.cuda.device_count() < args.nproc:
        sys.exit(f"bench_zero1: --nproc {args.nproc} but only {torch.cuda.device_count()} GPU(s)")
    return ("cuda" if cuda else "cpu"), (args.amp or ("fp16" if cuda else "off"))


def launch(mode: str, model: Path, data: tuple[Path, Path], out: Path, device: str, amp: str, args) -> None:
    """One torchrun of `trt-seer finetune`; its own output goes to out/../<mode>.log."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "trt_seer", "finetune", "--model", str(model), "--train", str(data[0]), "--eval", str(data[1]),
           "--batch", str(args.batch), "--epochs", "1", "--max-steps", str(args.steps), "--amp", amp,
           "--max-seq", str(args.max_seq), "--lr", "1e-4", "--device", device, "--out", str(out), *MODES[mode]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TQDM_DISABLE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log = out.parent / f"{mode}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        done = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    if done.returncode:
        tail = log.read_text().strip().splitlines()[-5:]
        sys.exit(f"bench_zero1: {mode} run failed (exit {done.returncode}):\n" + "\n".join(tail))


def result(mode: str, out: Path, args) -> dict:
    from trt_seer.finetune.monitor import read_metrics

    record = json.loads((out / "training.json").read_text())
    steps = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "step"]
    state = record["metrics"]["optimizer_state_bytes_per_rank"]
    return {"mode": mode, "processes": record["settings"]["processes"], "optimizer": record["settings"]["optimizer"],
            "state_bytes_per_rank": state, "losses": [r["loss"] for r in steps],
            **bench_finetune.steady_rate(steps, args.warmup_steps), **bench_finetune.summary(record)}


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| run | optimizer | processes | optimizer state per rank (MiB) | vs DDP | peak memory rank 0 (GiB) | "
             "samples/s (all ranks) | max loss diff vs DDP |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        per_rank = ", ".join(f"{b / 2**20:.1f}" for b in r["state_bytes_per_rank"])
        ratio = max(r["state_bytes_per_rank"]) / max(base["state_bytes_per_rank"])
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        lines.append(f"| {r['mode']} | {r['optimizer']} | {r['processes']} | {per_rank} | {ratio:.2f}x | "
                     f"{r['peak_memory_gib']:.2f} | {r['samples_per_s']:.0f} | {diff:.2e} |")
    return "\n".join(lines)


def intro(args, amp: str) -> str:
    return (f"`torchrun --nproc-per-node {args.nproc} -m trt_seer finetune` on the "
            f"'{args.model}' model, micro-batch {args.batch} per process, {args.steps} optimizer steps, --amp {amp}; "
            f"the same data, seed and order in both runs. Optimizer state is what each rank's optimizer holds; "
            f"peak memory is rank 0's torch.cuda.max_memory_allocated (peak RSS on CPU); samples/s over the "
            f"steps after the first {args.warmup_steps}.")


def main(argv=None) -> int:
    args = parse_args(argv)
    device, amp = device_and_amp(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-zero1-") as tmp:
        work = Path(tmp)
        model = bench_finetune.model_dirs([args.model], work, args.default_model)[args.model].path
        data = bench_finetune.write_data(work, (args.steps + 1) * args.batch * args.nproc)
        for mode in MODES:
            out = work / "runs" / mode
            launch(mode, model, data, out, device, amp, args)
            rows.append(result(mode, out, args))
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("hardware", "losses")}), flush=True)
    text = table(rows)
    print(f"\n{bench_finetune.machine(rows)}\n{text}")
    if args.append:
        path = bench_finetune.append_report("ZeRO-1 vs DDP", intro(args, amp), text, rows, tool="bench_zero1.py")
        print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
