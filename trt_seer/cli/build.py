"""`trt-seer build`: checkpoint -> verified ONNX -> FP16 / INT8 ONNX -> TensorRT engines + manifests."""
from __future__ import annotations

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
    t.add_argument("--workspace-mb", type=common.positive_int, default=4096, help="workspace limit (default 4096)")
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
    common.add_output_args(p)
    p.add_argument("--force", action="store_true", help="rebuild every stage even when up to date")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


ORDER = ("fp32", "fp16", "int8", "int4")


def precisions(args) -> list[str]:
    """--fp16 when none is given; --int8/--int4 bring their FP16 engine along, the baseline they
    are judged by."""
    chosen = {p for p in ORDER if getattr(args, p, False)} or {"fp16"}
    if chosen & {"int8", "int4"}:
        chosen.add("fp16")
    return [p for p in ORDER if p in chosen]


def build_spec(args, precision: str):
    from trt_seer.engine.build import BuildSpec
    from trt_seer.export.families import ShapeProfile

    caps = tuple(c for c in args.compute_capability.split(",") if c)
    return BuildSpec(precision=precision, profile=ShapeProfile(tuple(args.batch), tuple(args.seq)),
                     workspace_mb=args.workspace_mb, opt_level=args.opt_level,
                     hardware_compat=args.hardware_compat, compute_caps=caps, verbose=args.verbose,
                     max_total=getattr(args, "max_total", None))


def run(args) -> int:
    from trt_seer import pipeline
    from trt_seer.engine import trt
    from trt_seer.export.families import resolve_model
    from trt_seer.files import ensure_out_dir

    info = resolve_model(args.model, args.task)
    specs = [build_spec(args, p) for p in precisions(args)]  # validates targets before slow work
    from trt_seer.export.families import check_profile

    check_profile(info, specs[0].profile)
    from trt_seer.quantize.spec import QuantStageSpec

    quant = QuantStageSpec.from_args(args)  # all the quantization stages see of the command line
    _check_quantization(info, args, quant)
    out = ensure_out_dir(args.out)
    flavor = trt.load()
    for spec in specs:
        trt.target_description(flavor, spec.hardware_compat, spec.compute_caps)
    art = pipeline.Artifacts(out, info.name)
    fp32 = pipeline.fp32_onnx(info, art, args.force)
    pipeline.fp32_cpu_onnx(info, art, fp32, args.force)
    for spec in specs:
        onnx_record = _onnx_for(spec.precision, info, art, fp32, quant)
        manifest_data, rebuilt = pipeline.engine(onnx_record, art, spec, args.force)
        _report(art, spec.precision, manifest_data, rebuilt)
    if "int8" in precisions(args) and info.task != "causal-lm":
        _int8_benefit(art)
    if info.task == "causal-lm" and {"int8", "int4"} & set(precisions(args)):
        _weight_only_benefit(art, [p for p in precisions(args) if p in ("int8", "int4")], flavor.name)
    return 0


def _weight_only_benefit(art, chosen: list[str], flavor: str) -> None:
    """Says what weight-only decoder engines buy: their size against the FP16 engine's, and on
    TensorRT-RTX that they were measured no faster."""
    from trt_seer.engine import manifest

    def size(precision: str) -> int:
        path = manifest.engine_manifest_path(art.path(f"{precision}.engine"))
        return manifest.read_engine_manifest(path)["engine"]["size_bytes"]

    sizes = ", ".join(f"{p.upper()} {size(p) / size('fp16'):.2f}x" for p in chosen)
    log.info("engine size vs FP16: %s", sizes)
    if flavor == "tensorrt_rtx":
        log.warning("warning: on TensorRT-RTX, weight-only INT8 / INT4 decoder engines decoded no faster than the "
                    "FP16 engine (0.90x / 1.02x at batch 1, 1.1B Llama on an H200; docs/BENCHMARKS.md): "
                    "use them to save GPU memory, the FP16 engine for speed.")


def _check_quantization(info, args, quant) -> None:
    """Fails fast, before any export, on options that cannot apply to this model."""
    from trt_seer.errors import UnsupportedError

    chosen = precisions(args)
    if "int4" in chosen and info.task != "causal-lm":
        raise UnsupportedError(f"--int4 is weight-only quantization for decoding; {info.name} is {info.task}, "
                               "use --int8")
    if "int8" in chosen and info.task == "causal-lm" and args.int8_mode == "w8a8":
        raise UnsupportedError("causal LMs get weight-only INT8 (what pays when decoding); drop --int8-mode w8a8")
    if chosen[-1] in ("int8", "int4"):
        from trt_seer.quantize import int8

        int8.check_spec(quant)
    if "int4" in chosen:
        from trt_seer.quantize.decoder_stage import int4_qat

        int4_qat(info, quant, 4)  # a finetune --qat int4 checkpoint: same block size, same LM head


def _int8_benefit(art) -> None:
    """Says plainly when INT8 does not pay off against FP16 (sizes, and latency once `bench` ran)."""
    from trt_seer.engine import manifest
    from trt_seer.bench.verdict import int8_benefit_warning

    int8 = manifest.read_engine_manifest(manifest.engine_manifest_path(art.path("int8.engine")))
    fp16_path = manifest.engine_manifest_path(art.path("fp16.engine"))
    if int8.get("tensorrt", {}).get("flavor") == "tensorrt_rtx":
        log.warning("warning: TensorRT-RTX runs INT8 only as weight-only GEMMs; measured on an H200 the "
                    "INT8 engine was slower than FP16 (docs/BENCHMARKS.md). Use INT8 for size, FP16 for speed.")
    if fp16_path.is_file():
        warning = int8_benefit_warning(int8, manifest.read_engine_manifest(fp16_path))
        if warning:
            log.warning("warning: %s", warning)


def _onnx_for(precision: str, info, art, fp32: dict, quant) -> dict:
    from trt_seer import pipeline

    if precision == "fp32":
        return fp32
    if precision == "fp16":
        return pipeline.fp16_onnx(info, art, fp32, quant.force)
    if info.task == "causal-lm":
        from trt_seer.quantize import decoder_stage

        return decoder_stage.weight_only_onnx(info, art, fp32, quant, int(precision[3:]))
    from trt_seer.quantize import int8

    return int8.int8_onnx(info, art, fp32, quant)


def _report(art, precision: str, data: dict, rebuilt: bool) -> None:
    engine = art.path(f"{precision}.engine")
    size = data["engine"]["size_bytes"] / 2**20
    if rebuilt:
        log.info("built %s (%.1f MiB, %.1f s) + %s", engine, size, data["build"]["seconds"],
                 engine.name.removesuffix(".engine") + ".manifest.json")
    else:
        log.info("%s engine up to date: %s (%.1f MiB)", precision, engine, size)
