"""A causal-LM ONNX artifact (with a KV cache) as a `DecoderStep` on ONNX Runtime's CPU provider.

    from trt_seer.runtime.decoder_ort import OrtDecoderStep
    step = OrtDecoderStep("engines/my-llama.fp16.onnx")
    step.reset(batch=2)
    logits = step.step(input_ids, attention_mask, position_ids)   # (batch, vocab) float32

The cache stays in ONNX Runtime's own buffers: each step's `present.*` OrtValues are bound as the
next step's `past_key_values.*` through io_binding, never copied through numpy.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_seer.decoder_io import PAST_PREFIX, PRESENT_PREFIX, TOKEN_INPUTS, check_step
from trt_seer.engine import manifest as manifest_io
from trt_seer.errors import InputError, UnsupportedError
from trt_seer.runtime.ort import OrtOptions, create_session



def decoder_record(path: Path, record: dict | None, meta: Path | None = None) -> dict:
    """The `decoder` section of the artifact's record (or engine manifest, `meta`); UnsupportedError
    when the artifact is not a KV-cache decoder."""
    record = record or {}
    task = record.get("task")
    if task and task != "causal-lm":
        raise UnsupportedError(f"{path.name} is a {task} artifact; generation needs a causal-lm one")
    io_names = [v["name"] for v in (record.get("io") or {}).get("inputs", [])]
    if io_names and not any(n.startswith(PAST_PREFIX) for n in io_names):
        raise UnsupportedError(f"{path.name} has no KV-cache inputs (past_key_values.*); "
                               "re-export the checkpoint with this version of trt-seer")
    if "decoder" not in record:
        meta = meta or manifest_io.record_path(path)
        raise UnsupportedError(f"{path.name} has no record with a `decoder` section beside it "
                               f"({meta.name}); re-export the checkpoint")
    return record["decoder"]


class OrtDecoderStep:
    """One forward step at a time, appending to its own cache (the DecoderStep protocol)."""

    backend = "onnxruntime"

    def __init__(self, path: str | Path, options: OrtOptions = OrtOptions(), decoder: dict | None = None):
        """`decoder`: the cache layout (num_kv_heads, head_dim, kv_dtype, max_total) when the graph
        has no record beside it (a candidate graph inside a quantization gate); else the record's."""
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"ONNX file not found: {self.path}")
        self.manifest = manifest_io.read_if_exists(manifest_io.record_path(self.path))
        self.decoder = decoder if decoder is not None else decoder_record(self.path, self.manifest)
        self.session = create_session(self.path, options)
        names = [a.name for a in self.session.get_inputs()]
        self.past_names = [n for n in names if n.startswith(PAST_PREFIX)]
        if not self.past_names or any(n not in names for n in TOKEN_INPUTS):
            raise UnsupportedError(f"{self.path.name} takes {names}; a decoder step needs "
                                   f"{', '.join(TOKEN_INPUTS)} and past_key_values.*")
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.max_total = int(self.decoder["max_total"])
        self.kv_dtype = np.dtype(self.decoder.get("kv_dtype", "float32"))
        self.past: list = []
        self.past_len = self.batch = 0

    def reset(self, batch: int) -> None:
        """An empty cache (past_seq = 0) for `batch` rows."""
        from onnxruntime import OrtValue

        d = self.decoder
        empty = np.zeros((batch, d["num_kv_heads"], 0, d["head_dim"]), dtype=self.kv_dtype)
        self.past = [OrtValue.ortvalue_from_numpy(empty) for _ in self.past_names]
        self.past_len, self.batch = 0, int(batch)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Logits [batch, vocab] float32 of the last position; the new keys/values join the cache."""
        total = self.past_len + check_step(input_ids, attention_mask, position_ids, self.batch, self.past_len,
                                           self.max_total, self.path.name)
        binding = self.session.io_binding()
        for name, value in zip(TOKEN_INPUTS, (input_ids, attention_mask, position_ids)):
            binding.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        for name, value in zip(self.past_names, self.past):
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        outputs = dict(zip(self.output_names, binding.get_outputs()))
        self.past = [outputs[PRESENT_PREFIX + n.removeprefix(PAST_PREFIX)] for n in self.past_names]
        self.past_len = total
        return outputs["logits"].numpy()[:, -1].astype(np.float32, copy=False)  # (batch, vocab)

    def close(self) -> None:
        self.session, self.past, self.batch = None, [], 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
