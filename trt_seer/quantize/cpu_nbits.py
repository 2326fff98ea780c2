"""The CPU form of a weight-only decoder: ONNX Runtime's block-wise `MatMulNBits` (INT4 or INT8
weights, FP32 activations) on the FP32 KV-cache graph, `<name>.int{bits}.cpu.onnx`.

The TensorRT-style graph (`<name>.int{bits}.onnx`: DequantizeLinear before each MatMul on the FP16
graph) is what engines are built from; ONNX Runtime's CPU kernels would dequantize every weight on
every step. `MatMulNBits` reads the packed weights directly. ONNX Runtime's own quantizer writes it
(`onnxruntime.quantization.matmul_nbits_quantizer`); the LM head stays FP32 like the engine's stays
FP16. Gated like the engine's graph (teacher-forced perplexity and agreement through the cache),
against the FP32 graph the CPU backend would otherwise run; a form that misses the gate is not
written and `generate` falls back to the Q/DQ graph.
"""
from __future__ import annotations

import logging

from trt_seer import __version__, records
from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.export.families import ModelInfo
from trt_seer.files import sha256_json

log = logging.getLogger(__name__)
BLOCK = 32  # MatMulNBits' block along K; ONNX Runtime's CPU kernels are tuned for 32
# MatMulNBits' accuracy_level 4: activations quantized to INT8 inside the kernel (VNNI), measured
# faster than the FP32-compute default when decoding on the CPU (docs/BENCHMARKS.md, "CPU form of
# weight-only decoders"); the gate checks the accuracy it costs.
ACCURACY_LEVEL = 4


def nbits_model(fp32_path, bits: int, keep: frozenset = frozenset()):
    """The FP32 graph with every GEMM but the LM head and `keep` (the GEMMs the engine graph's gate
    put back in FP16) as MatMulNBits (symmetric, blocks of BLOCK)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from trt_seer.quantize.weightonly import lm_head

    model = onnxio.load(fp32_path)
    head = lm_head(model)
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level, quiet.level = quiet.level, logging.WARNING  # it logs every node at INFO
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=BLOCK, is_symmetric=True,
                                         accuracy_level=ACCURACY_LEVEL,
                                         nodes_to_exclude=sorted(keep | ({head} if head else set())))
        quantizer.process()
    finally:
        quiet.level = level
    return quantizer.model.model, head


def nbits_cpu_onnx(info: ModelInfo, art: records.Artifacts, fp32: dict, bits: int, gate, rows,
                   keep: frozenset = frozenset()) -> dict | None:
    """Writes (or reuses) `<name>.int{bits}.cpu.onnx`, `keep` left in FP32, when it passes `gate`
    on the teacher-forced `rows`; returns its record, or None (logged) when it does not."""
    from trt_seer.eval import teacher

    src, dest = art.path("fp32.onnx"), art.path(f"int{bits}.cpu.onnx")
    key = sha256_json({"fp32": fp32["sha256"], "bits": bits, "block": BLOCK, "accuracy_level": ACCURACY_LEVEL,
                       "gate": gate.__dict__, "keep": sorted(keep),
                       "rows": rows.tolist(), "trt_seer": __version__})
    record = records.up_to_date(dest, manifest.record_path(dest), key)
    if record:
        return record
    log.info("writing the INT%d CPU form (MatMulNBits) ...", bits)
    model, head = nbits_model(src, bits, keep)
    onnxio.save(model, dest)
    metrics = teacher.lm_metrics(teacher.teacher_forced_logits(src, rows),
                                 teacher.teacher_forced_logits(dest, rows), rows)
    fails = gate.check(info.task, metrics)
    if fails:
        dest.unlink(missing_ok=True)
        log.warning("warning: no %s: %s against the FP32 graph; the CPU backend runs %s instead",
                    dest.name, "; ".join(fails), art.path(f"int{bits}.onnx").name)
        return None
    log.info("INT%d CPU form vs FP32: perplexity %+.2f%%, next-token agreement %.4f", bits,
             100 * metrics["ppl_increase"], metrics["agreement"])
    gemms = sum(n.op_type == "MatMulNBits" for n in model.graph.node)
    return records.write_record(dest, {
        **records.inherit(fp32), "precision": f"int{bits}", "form": "onnxruntime CPU (MatMulNBits)", "key": key,
        "fp32_sha256": fp32["sha256"],
        "quantization": {"mode": "weight-only", "bits": bits, "block_size": BLOCK, "matmulnbits": gemms,
                         "accuracy_level": ACCURACY_LEVEL,
                         "lm_head_fp32": head, "fp32_gemms": sorted(keep)},
        "accuracy": {"onnx_vs_fp32": {**metrics, "measured_on": {"artifact": dest.name, "backend": "onnxruntime CPU"},
                                      "reference_measured_on": {"artifact": src.name, "backend": "onnxruntime CPU"}},
                     "gate": {"passed": True, "thresholds": gate.__dict__}}})
