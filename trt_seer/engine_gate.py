"""The weight-only gate on a GPU: candidates and the FP16 reference teacher-forced through their
TensorRT engines (the deployed decode path), for models too large for ONNX Runtime on the CPU.

    gate = EngineGate(art, request)
    ref = gate.logits(art.path("fp16.engine"), rows)          # (rows, length - 1, vocab)
    evaluate = gate.evaluator(fp16_record, bits=4)           # candidate ONNX -> its engine's logits

A candidate's engine is built where the final engine goes, from the candidate graph: when the gate
passes, `pipeline.engine` finds it up to date (same graph hash, same settings) and only completes
its manifest, so a passing candidate is never built twice.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trt_seer import pipeline
from trt_seer.export import onnxio
from trt_seer.records import Artifacts, inherit

log = logging.getLogger(__name__)
GATE_BATCH = 16


class EngineGate:
    def __init__(self, art: Artifacts, request):
        self.art, self.request = art, request
        self.gpu_name = None

    def logits(self, engine: Path, rows: np.ndarray) -> np.ndarray:
        from trt_seer.eval import teacher
        from trt_seer.runtime.decoder_trt import TensorRTDecoder

        with TensorRTDecoder(engine, cache="grow") as dec:
            self.gpu_name = dec.gpu.name
            return teacher.stepped_logits(dec, rows, min(GATE_BATCH, dec.max_batch), f"teacher-force {Path(engine).name}")

    def evaluator(self, fp16: dict, bits: int):
        spec = self.request.engine_spec(f"int{bits}")

        def evaluate(candidate: Path, rows: np.ndarray) -> np.ndarray:
            provisional = {**inherit(fp16), "precision": f"int{bits}", "sha256": onnxio.sha256(candidate)}
            log.info("building the INT%d candidate's engine to gate it on the GPU ...", bits)
            built, _ = pipeline.engine(provisional, self.art, spec, False)
            return self.logits(self.art.path(f"int{bits}.engine"), rows)

        return evaluate

    def measured_on(self) -> str:
        from trt_seer.engine import trt

        flavor = trt.load()
        return (f"TensorRT ({flavor.name} {flavor.version}) on {self.gpu_name or 'the GPU'}, teacher-forced through "
                "the KV cache of each engine, against the FP16 engine")
