"""`trt-seer build`: checkpoint -> verified ONNX -> FP16 / INT8 ONNX -> TensorRT engines + manifests."""
from __future__ import annotations

import argparse
import logging

log = logging.getLogger("trt_seer")


def add_parser(subparsers, common):
    from trt_seer.quantize.weightonly import BLOCK_SIZES  # numpy only

    p = subparsers.add_parser("build", help="export, convert and build TensorRT engines",
                              description=__doc__)
    common.add_model_args(p)
    g = p.add_argument_group("precision (default: --fp16; several may be given; --int8/--int4 also build FP16)")
    g.add_argument("--fp32", action="store_true", help="FP32/TF32 engine")
    g.add_argument("--fp16", action="store_true", help="FP16 engine from an FP16-typed graph")
    g.add_argument("--int8", action="store_true", help="INT8 engine from a calibrated Q/DQ graph (causal LMs: "
                   "weight-only, per output channel)")
    g.add_argument("--int4", action="store_true", help="causal LMs: weight-only INT4 engine (block-wise scales, "
                   "AWQ), for fast decoding")
    common.add_profile_args(p)
    t = p.add_argument_group("TensorRT")
    t.add_argument("--workspace-mb", type=common.positive_int, default=4096,
                   help="TensorRT's workspace limit in MiB (default 4096; --attention chunked raises it to what "
                        "its prompt step's scores can take)")
    t.add_argument("--opt-level", type=int, choices=range(0, 6), default=3, metavar="0-5",
                   help="builder optimization level (default 3)")
    t.add_argument("--hardware-compat", choices=("ampere+", "same-cc"), default=None,
                   help="full TensorRT: engines portable across GPUs (default: the local GPU only)")
    t.add_argument("--compute-capability", default="", metavar="CC[,CC]",
                   help="TensorRT-RTX: build for these compute capabilities, e.g. 7.5 (default: "
                        "portable Ampere+)")
    common.add_calib_args(p)
    a = p.add_argument_group("INT8 accuracy gate")
    a.add_argument("--min-cosine", type=float, default=0.99, help="min mean embedding cosine (default 0.99)")
    a.add_argument("--min-cosine-each", type=float, default=0.97,
                   help="min embedding cosine of the worst held-out sample (default 0.97)")
    a.add_argument("--min-top1", type=float, default=0.99, help="min top-1 agreement (default 0.99)")
    a.add_argument("--int8-mode", choices=("auto", "w8a8", "weight-only"), default="auto",
                   help="INT8 weights only, or weights and activations (w8a8: unverified on a GPU); "
                        "auto: weight-only")
    a.add_argument("--allow-no-int8", action="store_true",
                   help="accept an INT8 build whose gate fallback put every GEMM back in FP16 (warns)")
    a.add_argument("--int8-attention", action="store_true",
                   help="also quantize attention batched matmuls (faster, less accurate)")
    a.add_argument("--smooth-alpha", type=float, default=0.5,
                   help="SmoothQuant migration strength before INT8, 0 disables (default 0.5)")
    a.add_argument("--calib-cache", metavar="PATH", default=None,
                   help="where to write TensorRT's calibration.cache (default <out>/calib/<name>/calibration.cache)")
    a.add_argument("--from-cache", metavar="PATH", default=None,
                   help="take activation ranges from an existing TensorRT calibration cache")
    d = p.add_argument_group("weight-only quantization of causal LMs (--int8, --int4)")
    d.add_argument("--max-ppl-increase", type=float, default=None, metavar="F",
                   help="largest held-out perplexity increase vs FP16, as a fraction (default 0.01 INT8, 0.05 INT4)")
    d.add_argument("--min-agreement", type=float, default=None, metavar="F",
                   help="least greedy next-token agreement with FP16 (default 0.90 INT8, 0.80 INT4)")
    d.add_argument("--int4-block", type=int, choices=BLOCK_SIZES, default=128,
                   help="input channels per INT4 scale (default 128)")
    d.add_argument("--no-awq", action="store_true", help="INT4 by plain round-to-nearest, without AWQ scales")
    d.add_argument("--quantize-lm-head", action="store_true", help="quantize the LM head too (default: FP16)")
    p.add_argument("--attention", choices=("eager", "chunked", "decomposed"), default="eager",
                   help="causal LMs: export attention as it is (eager, default) or cut the cache into chunks "
                        "(chunked: faster decode at long contexts; slower prompts, 11x at 3,840 tokens on a 1.1B "
                        "model, taken --prompt-slice tokens at a time; docs/DESIGN.md). Encoders: each attention "
                        "is one fused ONNX Attention in the FP16/INT8 engines by default; decomposed keeps the "
                        "exporter's op-by-op form")
    p.add_argument("--prompt-slice", type=common.non_negative_int, default=None, metavar="N",
                   help="causal LMs: run prompts longer than N tokens N at a time, each slice on the cache of "
                        "those before it, so that a prompt step's memory follows N, not the prompt squared "
                        "(default 512 with --attention chunked; 0, and eager's default: the whole prompt at once)")
    p.add_argument("--packed", action="store_true",
                   help="feature-extraction encoders: also build the packed-token FP16 form (<name>.fp16.packed.*: "
                        "every sentence's tokens one after another, no padding; load it to run padded batches packed)")
    common.add_output_args(p)
    p.add_argument("--force", action="store_true", help="rebuild every stage even when up to date")
    p.add_argument("--dry-run", action="store_true",
                   help="print what the build would write and remove, and the disk and memory it needs; build nothing")
    p.add_argument("--keep-intermediates", action=argparse.BooleanOptionalAction, default=None,
                   help="decoders: keep every ONNX graph (default: on where no engine runs on this machine, "
                        "so that ONNX Runtime runs the graphs instead; elsewhere each is removed once its engine "
                        "is built)")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def precisions(args) -> list[str]:
    """The precisions named on the command line, in build order, with FP16 brought along."""
    return request_from_args(args).chosen()


def build_spec(args, precision: str):
    from trt_seer.engine.build import BuildSpec
    from trt_seer.export.families import ShapeProfile

    caps = tuple(c for c in args.compute_capability.split(",") if c)
    return BuildSpec(precision=precision, profile=ShapeProfile(tuple(args.batch), tuple(args.seq)),
                     workspace_mb=args.workspace_mb, opt_level=args.opt_level,
                     hardware_compat=args.hardware_compat, compute_caps=caps, verbose=args.verbose,
                     max_total=getattr(args, "max_total", None))


def request_from_args(args):
    from pathlib import Path

    from trt_seer.build import ORDER, BuildRequest
    from trt_seer.quantize.spec import QuantStageSpec

    return BuildRequest(model=args.model, task=args.task, out=Path(args.out),
                        precisions=tuple(p for p in ORDER if getattr(args, p, False)),
                        spec=build_spec(args, "fp16"), quant=QuantStageSpec.from_args(args), force=args.force,
                        keep_intermediates=args.keep_intermediates, dry_run=args.dry_run, attention=args.attention,
                        prompt_slice=args.prompt_slice, packed=args.packed)


def run(args) -> int:
    from trt_seer.build import build

    result = build(request_from_args(args))
    if args.dry_run:
        print(result.heading)
        print(result.plan.describe())
    return 0
