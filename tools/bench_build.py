"""Wall time and peak RSS of each build stage for the default model, as whole processes.

    python tools/bench_build.py [--append docs/BENCHMARKS.md]

Runs, in a fresh temporary output directory: `export` (FP32 ONNX + verification), `export --fp16`
(FP16 conversion + its accuracy check, export cached), `build --fp16` (engine only, ONNX cached),
`build --fp16` again (cache hit), and a fresh end-to-end `build --fp16` in a second directory.
Targets: end to end <= 40 s on 2 cores; cache hit <= 2 s.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

STEPS = (
    ("export (FP32 ONNX, verified)", ["export"], "a"),
    ("FP16 conversion + accuracy check", ["export", "--fp16"], "a"),
    ("engine build (FP16)", ["build", "--fp16"], "a"),
    ("cache hit (`build --fp16` again)", ["build", "--fp16"], "a"),
    ("end to end `build --fp16`", ["build", "--fp16"], "b"),
)


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB of the child, exit code)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.stderr.write(proc.stderr.read().decode()[-2000:])
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def stage_table(rows: list[tuple[str, float, float]]) -> list[str]:
    """Markdown rows of (step, wall seconds, peak RSS MiB)."""
    return ["| step | wall s | peak RSS MiB |", "|---|---:|---:|",
            *(f"| {label} | {wall:.1f} | {rss:.0f} |" for label, wall, rss in rows)]


def emit(title: str, tool: str, argv: list[str], text: str, append: str | None) -> None:
    """Prints `text` and, when `append` names a Markdown file, appends it there as a dated section
    with the machine and the command (trt_seer.bench.report.append_benchmark)."""
    from trt_seer.bench.host import machine_text
    from trt_seer.bench.report import append_benchmark

    print(text)
    if append:
        command = shlex.join(["python", f"tools/{tool}", *argv])
        append_benchmark(append, title, command, machine_text(), text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--append", default=None, help="append the table to this Markdown file")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, sub, out in STEPS:
            wall, rss, rc = timed([sys.executable, "-m", "trt_seer", *sub, "--out", f"{tmp}/{out}"])
            if rc != 0:
                print(f"{label}: exit code {rc}", file=sys.stderr)
                return rc
            rows.append((label, wall, rss))
            print(f"{label:40s} {wall:7.1f} s {rss:8.0f} MiB", flush=True)
    table = "\n".join(["Whole processes (`python -m trt_seer ...`), default model, TensorRT-RTX builder on CPU.", "",
                       *stage_table(rows)])
    emit("Build stages", "bench_build.py", argv, table, args.append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
