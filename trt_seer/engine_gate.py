"""The weight-only gate on a GPU: candidates and the FP16 reference teacher-forced through their
TensorRT engines (the deployed decode path), for models too large for ONNX Runtime on the CPU.

    gate = EngineGate(art, request, rows)
    ref = gate.logits(art.path("fp16.engine"))                # (rows, length - lead, vocab)
    evaluate = gate.evaluator(fp16_record, bits=4)           # candidate ONNX -> its engine's logits
    lm_metrics(ref, evaluate(candidate, gate.metric_rows), gate.metric_rows)

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
    """Teacher-forces token rows through decoder engines. An engine's prompt profile starts at
    `--seq` min tokens, so the first `lead` tokens of each row go in as one prompt and the logits
    cover the positions after it; `metric_rows` are the rows the metrics then compare over."""

    def __init__(self, art: Artifacts, request, rows: np.ndarray):
        self.art, self.request, self.rows = art, request, rows
        self.lead = max(1, int(request.spec.profile.seq[0]))
        self.gpu_name = None

    @property
    def metric_rows(self) -> np.ndarray:
        return self.rows[:, self.lead - 1:]

    def logits(self, engine: Path) -> np.ndarray:
        """(rows, length - lead, vocab): the logits predicting rows[:, lead:] from each prefix."""
        from tqdm import tqdm

        from trt_seer.runtime.decoder_trt import TensorRTDecoder

        with TensorRTDecoder(engine, cache="grow") as dec:
            self.gpu_name = dec.gpu.name
            batch = min(GATE_BATCH, dec.max_batch)
            starts = tqdm(range(0, len(self.rows), batch), desc=f"teacher-force {Path(engine).name}", leave=False)
            return np.concatenate([self.teacher_force(dec, self.rows[s:s + batch]) for s in starts])

    def teacher_force(self, dec, ids: np.ndarray) -> np.ndarray:
        """One batch of rows through any DecoderStep: a `lead`-token prompt, then a token a step."""
        b, t = ids.shape
        dec.reset(b)
        mask = np.ones((b, t), dtype=np.int64)
        pos = np.broadcast_to(np.arange(t, dtype=np.int64), (b, t))
        out = [dec.step(ids[:, :self.lead], mask[:, :self.lead], pos[:, :self.lead].copy())]
        for i in range(self.lead, t - 1):
            out.append(dec.step(ids[:, i:i + 1], mask[:, :i + 1], pos[:, i:i + 1].copy()))
        return np.stack(out, axis=1).astype(np.float32)

    def evaluator(self, fp16: dict, bits: int):
        spec = self.request.engine_spec(f"int{bits}")

        def evaluate(candidate: Path, _metric_rows: np.ndarray) -> np.ndarray:
            provisional = {**inherit(fp16), "precision": f"int{bits}", "sha256": onnxio.sha256(candidate)}
            log.info("building the INT%d candidate's engine to gate it on the GPU ...", bits)
            pipeline.engine(provisional, self.art, spec, False)
            return self.logits(self.art.path(f"int{bits}.engine"))

        return evaluate

    def measured_on(self) -> str:
        from trt_seer.engine import trt

        flavor = trt.load()
        return (f"TensorRT ({flavor.name} {flavor.version}) on {self.gpu_name or 'the GPU'}, teacher-forced through "
                "the KV cache of each engine, against the FP16 engine")
