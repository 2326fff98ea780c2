"""`trt-seer build`: checkpoint -> verified ONNX -> FP16 / INT8 ONNX -> TensorRT engines + manifests."""
from __future__ import annotations

import logging

log = logging.getLogger("trt_seer")


def add_parser(subparsers, common):
    p = subparsers.add_parser("build", help="export, convert and build TensorRT engines",
                              description=__doc__)
    common.add_model_args(p)
    g = p.add_argument_group("precision (default: --fp16; several may be given; --int8 also builds FP16)")
    g.add_argument("--fp32", action="store_true", help="FP32/TF32 engine")
    g.add_argument("--fp16", action="store_true", help="FP16 engine from an FP16-typed graph")
    g.add_argument("--int8", action="store_true", help="INT8 engine from a calibrated Q/DQ graph")
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
                   help="INT8 weights and activations (w8a8) or weights only; auto: weight-only under "
                        "TensorRT-RTX (its only INT8 GEMM), w8a8 under full TensorRT")
    a.add_argument("--int8-attention", action="store_true",
                   help="also quantize attention batched matmuls (faster, less accurate)")
    a.add_argument("--smooth-alpha", type=float, default=0.5,
                   help="SmoothQuant migration strength before INT8, 0 disables (default 0.5)")
    a.add_argument("--calib-cache", metavar="PATH", default=None,
                   help="where to write TensorRT's calibration.cache (default calib/<name>/calibration.cache)")
    a.add_argument("--from-cache", metavar="PATH", default=None,
                   help="take activation ranges from an existing TensorRT calibration cache")
    common.add_output_args(p)
    p.add_argument("--force", action="store_true", help="rebuild every stage even when up to date")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def precisions(args) -> list[str]:
    """--fp16 when none is given; --int8 brings its FP16 engine along, the baseline INT8 is judged by."""
    chosen = {p for p in ("fp32", "fp16", "int8") if getattr(args, p)} or {"fp16"}
    if "int8" in chosen:
        chosen.add("fp16")
    return [p for p in ("fp32", "fp16", "int8") if p in chosen]


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
    if "int8" in precisions(args):
        from trt_seer.quantize import int8

        int8.check_args(args)
    out = ensure_out_dir(args.out)
    flavor = trt.load()
    for spec in specs:
        trt.target_description(flavor, spec.hardware_compat, spec.compute_caps)
    art = pipeline.Artifacts(out, info.name)
    fp32 = pipeline.fp32_onnx(info, art, args.force)
    pipeline.fp32_cpu_onnx(info, art, fp32, args.force)
    for spec in specs:
        onnx_record = _onnx_for(spec.precision, info, art, fp32, args)
        manifest_data, rebuilt = pipeline.engine(onnx_record, art, spec, args.force)
        _report(art, spec.precision, manifest_data, rebuilt)
    if "int8" in precisions(args):
        _int8_benefit(art)
    return 0


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


def _onnx_for(precision: str, info, art, fp32: dict, args) -> dict:
    from trt_seer import pipeline

    if precision == "fp32":
        return fp32
    if precision == "fp16":
        return pipeline.fp16_onnx(info, art, fp32, args.force)
    from trt_seer.quantize import int8

    return int8.int8_onnx(info, art, fp32, args)


def _report(art, precision: str, data: dict, rebuilt: bool) -> None:
    engine = art.path(f"{precision}.engine")
    size = data["engine"]["size_bytes"] / 2**20
    if rebuilt:
        log.info("built %s (%.1f MiB, %.1f s) + %s", engine, size, data["build"]["seconds"],
                 engine.name.removesuffix(".engine") + ".manifest.json")
    else:
        log.info("%s engine up to date: %s (%.1f MiB)", precision, engine, size)
