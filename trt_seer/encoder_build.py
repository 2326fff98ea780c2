"""The encoder build (feature-extraction, text-classification): FP32 ONNX -> fused CPU form ->
FP16 / INT8 ONNX -> engines, every artifact kept (they are small, and the CPU backend runs them).
Called by build.build(); each stage is a function of pipeline.py or quantize/."""
from __future__ import annotations

import logging

from trt_seer import pipeline, resources
from trt_seer.records import Artifacts

log = logging.getLogger(__name__)


def plan_encoder(sizes: resources.WeightSizes, chosen: list[str]) -> resources.Plan:
    """Every graph and engine of an encoder build is kept: the plan adds them up."""
    params = sizes.gemm + sizes.embed + sizes.head + sizes.other
    plan = resources.Plan()
    plan.add("fp32.onnx", 4 * params)
    plan.add("fp32.cpu.onnx (fused CPU form)", 4 * params)
    sizes_by = {"fp32": 4 * params, "fp16": 2 * params, "int8": sizes.gemm + 2 * (params - sizes.gemm)}
    for p in chosen:
        if p != "fp32":
            plan.add(f"{p}.onnx", sizes_by[p])
        if p == "int8":
            plan.add("int8.cpu.onnx (dynamic INT8 CPU form)", sizes.gemm + 4 * (params - sizes.gemm))
        plan.add(f"{p}.engine", int(sizes_by[p] * resources.ENGINE_MARGIN))
    plan.ram_bytes = 3 * 4 * params + (1 << 30)
    return plan


def build_encoder(info, request, chosen: list[str]) -> tuple[dict, list]:
    """({precision: engine manifest}, the stages' figures)."""
    art, force = Artifacts(request.out, info.name), request.force
    quant = request.quant_spec()
    stages = resources.Stages(request.out)
    fp32 = stages.run("fp32 onnx", pipeline.fp32_onnx, info, art, force)
    stages.run("fp32 cpu onnx", pipeline.fp32_cpu_onnx, info, art, fp32, force)
    manifests = {}
    fp16 = None
    for p in chosen:
        if p == "fp32":
            record = fp32
        elif p == "fp16" or fp16 is None:
            fp16 = stages.run("fp16 onnx", pipeline.fp16_onnx, info, art, fp32, quant.force)
            record = fp16
        if p == "int8":
            from trt_seer.quantize import int8

            record = stages.run("int8 onnx", int8.int8_onnx, info, art, fp32, fp16, quant)
        manifests[p], rebuilt = stages.run(f"{p} engine", pipeline.engine, record, art, request.engine_spec(p), force)
        report(art, p, manifests[p], rebuilt)
        if p == "fp16" and request.packed:
            manifests[p] = _packed(info, request, stages, art, (fp32, fp16)) or manifests[p]
    if "int8" in chosen:
        _int8_benefit(art)
    return manifests, stages.records


def _packed(info, request, stages, art: Artifacts, records: tuple) -> dict | None:
    """The packed-token FP16 graph and engine beside the padded one; the padded engine's manifest
    (naming its packed sibling), or None where the model has no packed form."""
    packed = stages.run("fp16 packed onnx", pipeline.fp16_packed_onnx, info, art, *records, request.force)
    if packed is None:
        return pipeline.name_packed_sibling(art, "fp16", None)
    from trt_seer.errors import BuildError

    try:
        built, rebuilt = stages.run("fp16 packed engine", pipeline.engine, packed, art, request.engine_spec("fp16"),
                                    request.force)
    except BuildError as e:  # TensorRT has no packed attention kernel for this target or machine
        log.warning("warning: no packed-token engine (%s runs on ONNX Runtime): %s", art.path("fp16.packed.onnx").name, e)
        return pipeline.name_packed_sibling(art, "fp16", None)
    report(art, "fp16.packed", built, rebuilt)
    return pipeline.name_packed_sibling(art, "fp16", built)


def report(art: Artifacts, precision: str, data: dict, rebuilt: bool) -> None:
    engine = art.path(f"{precision}.engine")
    size = data["engine"]["size_bytes"] / 2**20
    if rebuilt:
        log.info("built %s (%.1f MiB, %.1f s) + %s", engine, size, data["build"]["seconds"],
                 engine.name.removesuffix(".engine") + ".manifest.json")
    else:
        log.info("%s engine up to date: %s (%.1f MiB)", precision, engine, size)


def _int8_benefit(art: Artifacts) -> None:
    """Says plainly when INT8 does not pay off against FP16 (sizes, and latency once `bench` ran)."""
    from trt_seer.bench.verdict import int8_benefit_warning
    from trt_seer.engine import manifest

    int8 = manifest.read_engine_manifest(manifest.engine_manifest_path(art.path("int8.engine")))
    fp16_path = manifest.engine_manifest_path(art.path("fp16.engine"))
    if int8.get("tensorrt", {}).get("flavor") == "tensorrt_rtx":
        log.warning("warning: TensorRT-RTX runs INT8 only as weight-only GEMMs, which were slower than FP16 "
                    "for encoders in our measurements (docs/BENCHMARKS.md). Use INT8 for size, FP16 for speed; "
                    "`trt-seer bench` measures both here.")
    if fp16_path.is_file():
        warning = int8_benefit_warning(int8, manifest.read_engine_manifest(fp16_path))
        if warning:
            log.warning("warning: %s", warning)
