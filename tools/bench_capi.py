"""Per-call time of the C ABI against Python's `Model.infer` and ONNX Runtime's own `run`.

    python tools/bench_capi.py engines/tiny.fp32.onnx [--batch 2] [--seq 8] [--calls 2000] [--rounds 5]

Builds libtrt_seer.so and trt_seer_example (python -m trt_seer.capi.build) into a temp dir, then
alternates rounds of: the example's `--repeat` loop (trt_seer_run from C), `Model.infer` from
Python, and a bare ONNX Runtime session with the same options (the floor both sit on). All run on
one intra-op thread with the example's inputs; prints the median of the rounds per path.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def example_feeds(model, batch: int, seq: int) -> dict:
    b, s = np.meshgrid(np.arange(batch), np.arange(seq), indexing="ij")
    values = {"input_ids": (b * 31 + s * 7) % 97 + 3, "attention_mask": ~((b % 2 == 1) & (s == seq - 1))}
    return {i.name: values.get(i.name, np.zeros_like(b)).astype(i.dtype) for i in model.inputs}


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - start) / calls


def c_round(example: Path, args) -> tuple[float, float]:
    """(trt_seer_run, trt_seer_prepared_run) microseconds per call, from one run of the example."""
    r = subprocess.run([str(example), str(args.artifact), "--batch", str(args.batch), "--seq", str(args.seq),
                        "--options", '{"threads": 1}', "--repeat", str(args.calls)],
                       capture_output=True, text=True, check=True)
    return tuple(float(re.search(rf"^per {kind}call: ([\d.]+) us", r.stdout, re.M)[1]) for kind in ("", "prepared "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path, help="an .onnx artifact (or an engine: runs where load() puts it)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from trt_seer.capi.build import build
    from trt_seer.runtime import load
    from trt_seer.runtime.ort import OrtOptions, create_session

    built = build(Path(tempfile.mkdtemp(prefix="trt_seer_capi_")), example=True)
    model = load(args.artifact, threads=1)
    feeds = example_feeds(model, args.batch, args.seq)
    names = list(model.output_names)
    session = create_session(model.path, OrtOptions(threads=1)) if model.backend == "onnxruntime" else None
    prepared = model.prepare({name: value.shape for name, value in feeds.items()})
    times = {"C trt_seer_run": [], "C trt_seer_prepared_run": [], "Python Model.infer": [],
             "Python prepared.run(feeds)": [], "ONNX Runtime session.run": []}
    for _ in range(args.rounds):
        c_run, c_prepared = c_round(built.example, args)
        times["C trt_seer_run"].append(c_run)
        times["C trt_seer_prepared_run"].append(c_prepared)
        times["Python Model.infer"].append(per_call_us(lambda: model.infer(feeds), args.calls))
        times["Python prepared.run(feeds)"].append(per_call_us(lambda: prepared.run(feeds), args.calls))
        if session is not None:
            times["ONNX Runtime session.run"].append(per_call_us(lambda: session.run(names, feeds), args.calls))
    print(f"{args.artifact.name} on {model.backend}, batch {args.batch}, seq {args.seq}, "
          f"{args.calls} calls x {args.rounds} rounds (median of rounds, min in brackets)")
    for path, values in times.items():
        if values:
            print(f"| {path} | {statistics.median(values):.1f} us | ({min(values):.1f}) |")


if __name__ == "__main__":
    main()
