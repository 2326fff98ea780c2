"""Host overhead of one engine call: end to end minus the engine's own GPU time, per batch.

    python tools/bench_overhead.py ENGINE [--output sentence_embedding] [--batch 1,32] [--append docs/BENCHMARKS.md] [--json F]

Four ways to make the same call, timed in interleaved rounds (so drift of the machine hits all of
them alike), each round `--calls` calls, the figure being the median over `--rounds` rounds:
- `infer, time_gpu=True`: `model.infer(feeds, outputs=[OUTPUT])` with CUDA events around the engine
  (they fill `last_gpu_ms`);
- `infer, default`: the same call with the default options (no events);
- `prepared call, run(feeds)`: `model.prepare(shapes, outputs=[OUTPUT])` once, then `run(feeds)`
  with the same host arrays (checked against the prepared shapes, copied into its pinned inputs,
  the output returned as the call's own pinned array), default options;
- `raw CUDA sequence`: what the call does underneath, without the runtime's Python: the inputs
  copied into the context's pinned staging buffer, one host-to-device copy, `enqueueV3`, one
  device-to-host copy of OUTPUT, a stream sync (the floor a Python caller can reach).
Engine time: the median `last_gpu_ms` of 50 timed calls made after each round. Host overhead: per
round, the variant's end-to-end median minus that round's engine time (so a GPU that drifts between
rounds moves both sides alike), then the median over rounds. Inputs are token id 1 everywhere,
(batch, --seq) int64 for every input.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", type=Path, help="a .engine with its manifest beside it")
    p.add_argument("--output", default=None, help="the one output copied back (default: the last output)")
    p.add_argument("--batch", default="1,32", help="batch sizes (default: 1,32)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default: 128)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default: 15)")
    p.add_argument("--calls", type=int, default=300, help="calls per variant per round (default: 300)")
    p.add_argument("--append", type=Path, default=None, help="append the table to this BENCHMARKS.md")
    p.add_argument("--json", type=Path, default=None, help="write every row, with its per-round figures, here")
    args = p.parse_args(argv)
    if not args.engine.is_file():
        p.exit(2, f"bench_overhead: engine not found: {args.engine}\n")
    try:
        args.batch = [int(b) for b in args.batch.split(",")]
    except ValueError:
        p.exit(2, f"bench_overhead: --batch takes comma-separated integers, got {args.batch!r}\n")
    return args


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)) / 1e3


def raw_sequence(model, feeds: dict, output: str):
    """The call's CUDA work on the model's first context, issued directly (see the docstring)."""
    from trt_seer.runtime import cuda

    rt, slot = cuda.cudart(), model._slots[0]
    stream, ctx = slot.stream.handle, slot.context
    h2d, d2h = cuda._memcpy_kind("HostToDevice"), cuda._memcpy_kind("DeviceToHost")
    model.infer(feeds, outputs=[output])  # binds the shapes and addresses this sequence relies on
    names = model.input_names
    views = [slot.inputs[n].host_view(feeds[n].shape, feeds[n].dtype) for n in names]
    arrays = [feeds[n] for n in names]
    span = slot.inputs[names[-1]].offset + feeds[names[-1]].nbytes
    out_buf = slot.outputs[output]
    out_bytes = model.infer(feeds, outputs=[output])[output].nbytes
    stream_int = int(stream)

    def run():
        for view, array in zip(views, arrays):
            view[...] = array
        rt.cudaMemcpyAsync(slot.staging.device_ptr, slot.staging.host_ptr, span, h2d, stream)
        ctx.execute_async_v3(stream_int)
        rt.cudaMemcpyAsync(out_buf.host_ptr, out_buf.device_ptr, out_bytes, d2h, stream)
        rt.cudaStreamSynchronize(stream)

    return run


def measure_batch(timed, untimed, batch: int, args, output: str) -> list[dict]:
    feeds = {s.name: np.ones((batch, args.seq), np.dtype(s.dtype)) for s in timed.inputs}
    prepared = untimed.prepare({name: value.shape for name, value in feeds.items()}, outputs=[output])
    variants = {"infer, time_gpu=True": lambda: timed.infer(feeds, outputs=[output]),
                "infer, default (untimed)": lambda: untimed.infer(feeds, outputs=[output]),
                "prepared call, run(feeds) (untimed)": lambda: prepared.run(feeds),
                "raw CUDA sequence (floor)": raw_sequence(untimed, feeds, output)}
    for fn in variants.values():
        median_us(fn, 200)  # warm: captured graphs, specialized kernels
    rounds, device = {k: [] for k in variants}, []
    for _ in range(args.rounds):
        for name, fn in variants.items():
            rounds[name].append(median_us(fn, args.calls))
        engine = []
        for _ in range(50):
            timed.infer(feeds, outputs=[output])
            engine.append(timed.last_gpu_ms * 1e3)
        device.append(float(np.median(engine)))
    prepared.close()
    rows = []
    for name, values in rounds.items():
        overheads = [e2e - engine for e2e, engine in zip(values, device)]
        rows.append({"batch": batch, "variant": name, "e2e_us": float(np.median(values)), "low_us": min(values),
                     "high_us": max(values), "engine_us": float(np.median(device)),
                     "overhead_us": float(np.median(overheads)), "rounds_e2e_us": values, "rounds_engine_us": device})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| batch | call | end to end us (round min-max) | engine us | host overhead us | % of engine |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['variant']} | {r['e2e_us']:.1f} ({r['low_us']:.1f}-{r['high_us']:.1f}) | "
                     f"{r['engine_us']:.1f} | {r['overhead_us']:.1f} | {100 * r['overhead_us'] / r['engine_us']:.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from trt_seer import runtime
    from trt_seer.errors import TrtSeerError

    args = parse_args(argv)
    try:
        timed = runtime.load(args.engine, backend="tensorrt", time_gpu=True)
        untimed = runtime.load(args.engine, backend="tensorrt")
    except TrtSeerError as e:
        print(f"bench_overhead: {e}", file=sys.stderr)
        return 2
    output = args.output or timed.output_names[-1]
    rows = []
    with timed, untimed:
        for batch in args.batch:
            rows += measure_batch(timed, untimed, batch, args, output)
            print(table([r for r in rows if r["batch"] == batch]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.append:
        from trt_seer.bench.host import machine_text
        from trt_seer.bench.report import append_benchmark
        from trt_seer.runtime import cuda

        body = (f"{args.engine.name}, seq {args.seq}, only `{output}` copied back; "
                f"{args.rounds} interleaved rounds of {args.calls} calls per variant (tools/bench_overhead.py).\n\n"
                + table(rows))
        append_benchmark(args.append, "Per-call host overhead", "python " + " ".join(sys.argv),
                         machine_text(cuda.device_info(0).name), body)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
