"""Benchmarks every inference path on the default model and on a random-initialised BERT-base,
prints both tables and appends them (date, machine, command) to docs/BENCHMARKS.md.

    python tools/bench_paths.py                      # engines/ for the default model's artifacts
    python tools/bench_paths.py --engines engines/ --batch 1,8,32 --seq 128 --price-per-hour 2.5

Any other flag is passed to every `trt-seer bench` run. Reports go to out/bench/<model>/.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {"default": [], "bert-base-random": ["--model-config", "bert-base"]}


def main(argv: list[str]) -> int:
    for name, model_args in RUNS.items():
        cmd = [sys.executable, "-m", "trt_seer", "bench", *model_args, "--report", f"out/bench/{name}",
               "--append", "docs/BENCHMARKS.md", *argv]
        print("$", " ".join(cmd[1:]), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
