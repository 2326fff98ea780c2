"""Per-call time of the C ABI against Python's `Model.infer`, both asking for the same outputs, and
what the first `trt_seer_open` costs.

    PYTHONPATH=. python tools/bench_capi.py ARTIFACT [--output sentence_embedding] [--backend auto]
        [--batch 2] [--seq 8] [--calls 2000] [--rounds 5] [--append docs/BENCHMARKS.md]

Builds libtrt_seer.so and trt_seer_example (python -m trt_seer.capi.build) into a temp dir, then
alternates rounds of: the example's `--repeat` loop asking only `--output` (trt_seer_run and
trt_seer_prepared_run, from C), `Model.infer(feeds, outputs=[--output])` and
`Model.prepare(shapes, outputs=[--output]).run(feeds)` from Python, and, on ONNX Runtime, a bare
session computing the same output (the floor). Same artifact, backend, options ({"threads": 1}) and
inputs (the example's) everywhere; prints the median (min) of the rounds per path, C's overhead over
Python's infer, and the first open's wall time and resident-memory growth as the example measures them.
The example's loop repeats one key, so its trt_seer_run rows time the run cache (a prepared call the
model keeps for a repeated key; docs/RUNTIME.md, "Run cache"), the service case it is made for.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OPTIONS = '{"threads": 1}'


def example_feeds(model, batch: int, seq: int) -> dict:
    b, s = np.meshgrid(np.arange(batch), np.arange(seq), indexing="ij")
    values = {"input_ids": (b * 31 + s * 7) % 97 + 3, "attention_mask": ~((b % 2 == 1) & (s == seq - 1))}
    return {i.name: values.get(i.name, np.zeros_like(b)).astype(i.dtype) for i in model.inputs}


def per_call_us(fn, calls: int) -> float:
    import time

    fn()  # warm-up, as the example's loops follow one call each way
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - start) / calls


def c_round(example: Path, args) -> dict:
    """{path: us per call} and the first open's cost, from one run of the example."""
    r = subprocess.run([str(example), str(args.artifact), "--backend", args.backend, "--batch", str(args.batch),
                        "--seq", str(args.seq), "--options", OPTIONS, "--repeat", str(args.calls),
                        "--output", args.output], capture_output=True, text=True, check=True)
    found = {f"C {name}": float(re.search(rf"^per {kind}call: ([\d.]+) us", r.stdout, re.M)[1])
             for name, kind in (("trt_seer_run", ""), ("trt_seer_prepared_run", "prepared "))}
    opened = re.search(r"^first open: (\d+) ms, resident memory \+(-?\d+) MB", r.stdout, re.M)
    found["first open ms"], found["first open MB"] = float(opened[1]), float(opened[2])
    cache = re.search(r"^run cache: (\d+) of (\d+) calls", r.stdout, re.M)
    found["run cache share"] = int(cache[1]) / int(cache[2])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path, help="an engine or .onnx artifact")
    parser.add_argument("--output", default="sentence_embedding", help="the one output every path asks for")
    parser.add_argument("--backend", default="auto", choices=("auto", "tensorrt", "onnxruntime"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--append", type=Path, help="append the result as a section of this BENCHMARKS.md")
    args = parser.parse_args()

    from trt_seer.capi.build import build
    from trt_seer.runtime import load
    from trt_seer.runtime.ort import OrtOptions, create_session

    built = build(Path(tempfile.mkdtemp(prefix="trt_seer_capi_")), example=True)
    model = load(args.artifact, backend=args.backend, threads=1)
    feeds = example_feeds(model, args.batch, args.seq)
    wanted = [args.output]
    session = create_session(model.path, OrtOptions(threads=1)) if model.backend == "onnxruntime" else None
    prepared = model.prepare({name: value.shape for name, value in feeds.items()}, outputs=wanted)
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for path, value in c_round(built.example, args).items():
            times.setdefault(path, []).append(value)
        times.setdefault("Python infer(outputs=[output])", []).append(
            per_call_us(lambda: model.infer(feeds, outputs=wanted), args.calls))
        times.setdefault("Python prepared(outputs=[output]).run(feeds)", []).append(
            per_call_us(lambda: prepared.run(feeds), args.calls))
        if session is not None:
            times.setdefault("ONNX Runtime session.run([output])", []).append(
                per_call_us(lambda: session.run(wanted, feeds), args.calls))
    print(report(args, model.backend, times))
    if args.append:
        from trt_seer.bench.host import machine_text
        from trt_seer.bench.report import append_benchmark

        title = f"C ABI vs Python infer, {args.artifact.name} on {model.backend}, only {args.output}"
        command = "PYTHONPATH=. python tools/bench_capi.py " + " ".join(sys.argv[1:])
        append_benchmark(args.append, title, command, machine_text(), report(args, model.backend, times))


def share_text(shares: list[float]) -> str:
    low, high = 100 * min(shares), 100 * max(shares)
    return f"{low:.0f}% in every round" if low == high else f"{low:.0f}-{high:.0f}% by round"


def report(args, backend: str, times: dict) -> str:
    med = {path: statistics.median(values) for path, values in times.items()}
    lines = [(f"{args.artifact.name} on {backend}, batch {args.batch}, seq {args.seq}, only `{args.output}` asked "
              f"for on every path, {args.calls} calls x {args.rounds} rounds (median of rounds, min in brackets):"),
             "", "| path | per call |", "|---|---:|"]
    for path, values in times.items():
        if not path.startswith(("first open", "run cache")):
            lines.append(f"| {path} | {med[path]:.1f} us ({min(values):.1f}) |")
    python = med["Python infer(outputs=[output])"]
    lines += ["", (f"C over Python infer: trt_seer_run {med['C trt_seer_run'] - python:+.1f} us, "
                   f"trt_seer_prepared_run {med['C trt_seer_prepared_run'] - python:+.1f} us (budget: +30 us)."),
              (f"First trt_seer_open (embedded Python start, imports, the model): {med['first open ms']:.0f} ms, "
               f"resident memory +{med['first open MB']:.0f} MB (median of {args.rounds} processes)."),
              f"trt_seer_run's timed calls that its run cache served: {share_text(times['run cache share'])}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
