"""`trt-seer export`: checkpoint -> ONNX verified against PyTorch (no TensorRT needed)."""
from __future__ import annotations

import logging

log = logging.getLogger("trt_seer")


def add_parser(subparsers, common):
    p = subparsers.add_parser("export", help="export a checkpoint to verified ONNX (FP32, optionally FP16)",
                              description=__doc__)
    common.add_model_args(p)
    p.add_argument("--fp16", action="store_true", help="also write the FP16-typed graph")
    common.add_output_args(p)
    p.add_argument("--force", action="store_true", help="re-export even when up to date")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from trt_seer import pipeline
    from trt_seer.export.families import resolve_model
    from trt_seer.files import ensure_out_dir

    info = resolve_model(args.model, args.task)
    art = pipeline.Artifacts(ensure_out_dir(args.out), info.name)
    fp32 = pipeline.fp32_onnx(info, art, args.force)
    log.info("fp32 ONNX: %s", art.path("fp32.onnx"))
    if pipeline.fp32_cpu_onnx(info, art, fp32, args.force):
        log.info("fp32 ONNX for ONNX Runtime CPU (fused): %s", art.path("fp32.cpu.onnx"))
    if args.fp16:
        pipeline.fp16_onnx(info, art, fp32, args.force)
        log.info("fp16 ONNX: %s", art.path("fp16.onnx"))
    return 0
