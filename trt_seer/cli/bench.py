"""`trt-seer bench`: latency (p50/p90/p99), throughput, memory, size, cost per 1M inferences and
accuracy vs FP32 of every inference path this machine can run: PyTorch (FP32 eager, TF32, AMP
FP16/BF16, .half(), dynamic INT8, torch.compile: default on the CPU, reduce-overhead and
max-autotune in FP16 on the GPU), ONNX Runtime (FP32/FP16/Q-DQ INT8 graphs) and TensorRT engines
(FP16 also with CUDA graphs). Paths that cannot run here are listed as skipped, with the reason.
Latency is end to end (host inputs to host outputs); GPU rows add the device time (CUDA events);
engine runs add the host<->device copy bandwidth. Each engine and ONNX Runtime point is judged
against the fastest PyTorch path of the same run, device and batch.

Writes report.md, report.json and PNG plots to --report, and each artifact's results under
`bench` in its manifest (which `build --int8` reads to judge whether INT8 pays).
"""
from __future__ import annotations

import argparse
import logging
import shlex

log = logging.getLogger("trt_seer")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_parser(subparsers, common):
    from trt_seer.bench.model import RANDOM_CONFIGS
    from trt_seer.bench.paths import PATH_BY_KEY

    p = subparsers.add_parser("bench", help="speed, memory, size, cost and accuracy per precision and runtime",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_args(p)
    p.add_argument("--model-config", choices=sorted(RANDOM_CONFIGS), default=None,
                   help="instead of --model: a random-initialised model of this size, built in code "
                        "(speed only; accuracy compares it with itself in FP32)")
    p.add_argument("--engines", metavar="DIR", default="engines",
                   help="where <name>.{fp32,fp16,int8}.onnx and .engine are (default: engines/)")
    g = p.add_argument_group("grid")
    g.add_argument("--batch", type=common.int_list, default=None, metavar="B[,B...]",
                   help="batch sizes (default: 1,8,32; --quick: 1,2)")
    g.add_argument("--seq", type=common.positive_int, default=None, metavar="N",
                   help="sequence length, every input padded/truncated to it (default: 128; --quick: 16)")
    g.add_argument("--paths", nargs="+", metavar="PATH", default=None,
                   help="paths to run, names or globs (default: all): " + ", ".join(PATH_BY_KEY))
    g.add_argument("--threads", type=common.positive_int, default=None, metavar="N",
                   help="intra-op threads of the CPU paths (default: the libraries' own)")
    g.add_argument("--quick", action="store_true", help="CI mode: tiny grid, few timed runs, seconds per path")
    o = p.add_argument_group("report")
    o.add_argument("--price-per-hour", type=positive_float, default=2.5, metavar="USD",
                   help="machine price for the cost column (default: 2.5)")
    o.add_argument("--report", metavar="DIR", default="out/bench",
                   help="report.md/.json and plots go here (default: out/bench/; a directory holding "
                        "another command's report is refused)")
    o.add_argument("--append", metavar="FILE", default=None,
                   help="also append the table, date, machine and command to FILE, e.g. docs/BENCHMARKS.md")
    o.add_argument("--no-manifest", action="store_true", help="do not record results in the artifacts' manifests")
    g.add_argument("--no-main-output", action="store_true",
                   help="time engine paths only with every output copied back (default: also with only the "
                        "task's main output, e.g. sentence_embedding)")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def command_line(args) -> str:
    """The command that reproduces this run, flags in canonical form."""
    parts = ["python", "-m", "trt_seer", "bench"]
    for flag, value in (("--model", args.model), ("--model-config", args.model_config), ("--task", args.task),
                        ("--engines", args.engines), ("--seq", args.seq), ("--threads", args.threads),
                        ("--price-per-hour", args.price_per_hour)):
        if value is not None:
            parts += [flag, str(value)]
    if args.batch:
        parts += ["--batch", ",".join(map(str, args.batch))]
    if args.paths:
        parts += ["--paths", *args.paths]
    parts += ["--quick"] if args.quick else []
    parts += ["--no-main-output"] if args.no_main_output else []
    return shlex.join(parts)


def spec_from_args(args):
    from dataclasses import replace
    from pathlib import Path

    from trt_seer.bench.paths import select_paths
    from trt_seer.bench.plan import BenchSpec, quick
    from trt_seer.errors import InputError

    if args.model and args.model_config:
        raise InputError("give --model or --model-config, not both")
    spec = BenchSpec(model=args.model, model_config=args.model_config, task=args.task, engines=Path(args.engines),
                     price_per_hour=args.price_per_hour, paths=select_paths(args.paths), threads=args.threads,
                     write_manifests=not args.no_manifest, main_output=not args.no_main_output,
                     command=command_line(args))
    if args.quick:
        return quick(spec, args.batch, args.seq)
    return replace(spec, batches=args.batch or spec.batches, seq=args.seq or spec.seq)


def check_seq(args, seq: int) -> None:
    """--seq longer than the checkpoint's position embeddings is bad input, not a grid of failed paths."""
    from trt_seer.errors import InputError
    from trt_seer.export.families import max_positions, resolve_model

    if args.model_config:
        return
    info = resolve_model(args.model, args.task)
    limit = max_positions(info)
    if limit is not None and seq > limit:
        raise InputError(f"--seq {seq} exceeds the {limit} positions of {info.name}; pass --seq {limit} or less")


def run(args) -> int:
    from trt_seer.bench import report as benchreport
    from trt_seer.bench.run import bench
    from trt_seer.cli import common
    from trt_seer.files import ensure_out_dir

    spec = spec_from_args(args)
    check_seq(args, spec.seq)
    common.check_report_dir(args.report, "bench")
    out = ensure_out_dir(args.report)
    report = bench(spec)
    print(benchreport.table(report))
    for line in benchreport.pytorch_lines(report):
        print(line)
    for line in benchreport.int8_lines(report):
        print(line)
    written = benchreport.write(report, out)
    log.info("report: %s", ", ".join(str(p) for p in written))
    if args.append:
        log.info("appended to %s", benchreport.append(report, args.append))
    for path in report.get("manifests_updated", []):
        log.debug("recorded bench results in %s", path)
    return 0
