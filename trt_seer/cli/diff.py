"""`trt-seer diff`: accuracy of an engine or ONNX artifact against FP32 ONNX, FP16 ONNX or PyTorch
on held-out data, through Polygraphy. Exit code 0 when every comparison asked for ran and passed,
1 when one failed, 2 on bad input, 3 when none failed but one could not run here (not verified:
e.g. an engine on a machine without a GPU that runs it)."""
from __future__ import annotations

import logging
from pathlib import Path

from trt_seer.cli import common

log = logging.getLogger("trt_seer")

EPILOG = """tolerances (elementwise, per output; VALUE alone applies to every output):
  fp32: atol 1e-4, rtol 1e-4 (gating)
  fp16: atol 1e-2, rtol 1e-2 (gating) + task metric
  int8: task metric only (mean cosine >= 0.99 and min >= 0.97, or top-1 >= 0.99);
        elementwise errors are reported with atol = rtol = 1e-1 but do not gate
  an --atol/--rtol you give makes the elementwise check gate that output (every output when
  bare), INT8 too
exit codes: 0 passed, 1 failed, 2 bad input, 3 not verified (a comparison asked for could not run here)
example:
  trt-seer diff engines/all-MiniLM-L6-v2.int8.manifest.json --against fp32 \\
      --atol sentence_embedding=1e-3 --report out/"""


def add_parser(subparsers, common):
    import argparse

    from trt_seer.export.families import TASKS

    p = subparsers.add_parser("diff", help="compare an engine or ONNX artifact with FP32, FP16 or PyTorch",
                              description=__doc__, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ARTIFACT",
                   help="engine (<name>.<prec>.engine) or its manifest (<name>.<prec>.manifest.json), ONNX record "
                        "(<name>.<prec>[.cpu].onnx.json) or .onnx file; the other artifacts are found beside it by name")
    p.add_argument("--against", default=None, metavar="{fp32,pytorch,fp16}",
                   help="reference (default: pytorch for an FP32 ONNX, else the FP32 ONNX)")
    g = p.add_argument_group("held-out data")
    g.add_argument("--data", metavar="PATH", default=None,
                   help="held-out text: .txt (one sample per line), .jsonl/.csv (default: calib/heldout.txt)")
    g.add_argument("--text-field", default="text", help="text field of .jsonl/.csv data (default: text)")
    g.add_argument("--samples", type=common.positive_int, default=128, metavar="N",
                   help="held-out samples to compare (default: 128)")
    t = p.add_argument_group("tolerances")
    t.add_argument("--atol", action="append", default=[], metavar="[OUTPUT=]V", help="absolute tolerance (repeatable)")
    t.add_argument("--rtol", action="append", default=[], metavar="[OUTPUT=]V", help="relative tolerance (repeatable)")
    p.add_argument("--layers", action=argparse.BooleanOptionalAction, default=None,
                   help="per-layer (MatMul/Gemm) error profile of the ONNX candidate (default: on for INT8)")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="write report.md, report.json, PNG plots and Polygraphy inputs/outputs here")
    m = p.add_argument_group("model (default: what the manifest records)")
    m.add_argument("--model", metavar="DIR", default=None, help="checkpoint directory for PyTorch and the tokenizer")
    m.add_argument("--task", choices=sorted(TASKS), default=None, help="task override")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def spec_from_args(args):
    from trt_seer.eval import diff

    return diff.DiffSpec(
        against=args.against, samples=args.samples, data=Path(args.data) if args.data else None,
        text_field=args.text_field, atol=tuple(diff.parse_tolerance("--atol", v) for v in args.atol),
        rtol=tuple(diff.parse_tolerance("--rtol", v) for v in args.rtol),
        model=Path(args.model) if args.model else None, task=args.task, layers=args.layers, verbose=args.verbose)


def check_inputs(target, spec, report: str | None) -> None:
    """Bad input fails here, before the slow comparison: a truncated or corrupt ONNX graph among the
    ones compared, an unwritable --report directory."""
    from trt_seer.export import onnxio
    from trt_seer.files import ensure_out_dir

    for precision in {target.precision, spec.against or "fp32"} & {"fp32", "fp16", "int8"}:
        path = target.artifact(f"{precision}.onnx")
        if path.is_file():
            onnxio.check_readable(path)
    if report:
        common.check_report_dir(report, "diff")
        ensure_out_dir(Path(report))


def run(args) -> int:
    from trt_seer.eval import diff

    spec = spec_from_args(args)  # malformed options fail before any slow work
    paths = common.artifact_paths(args.artifact)  # an engine is read through its manifest
    target = diff.resolve_target(paths.record if paths.engine else Path(args.artifact))
    check_inputs(target, spec, args.report)
    result = diff.diff(target, spec)
    print(diff.format_table(result))
    if args.report:
        log.info("report: %s", diff.write_report(result, Path(args.report)))
    record = diff.record_accuracy(result)
    if record:
        log.info("accuracy recorded in %s under diff_vs_%s", record, result.against)
    return result.exit_code
