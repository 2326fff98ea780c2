"""FP32 checkpoint -> the packed-token graph of a feature-extraction encoder, verified against the
padded FP32 graph.

    from trt_seer.export.packed import packed_onnx_from_checkpoint
    report = packed_onnx_from_checkpoint(info, Path("m.fp32.onnx"), Path("m.fp32.packed.onnx"))

The graph takes every sequence's real tokens one after another (runtime/packed.py packs a padded
batch): input_ids, token_type_ids (where the family takes them), position_ids and sequence_ids as
[1, tokens], and cu_seqlens [batch + 1] (int32). Attention stays inside a sequence through a
boolean [1, 1, tokens, tokens] mask made in the graph from sequence_ids; each attention is one ONNX
`Attention` reading it (export/engine_form.py), which TensorRT's packed attention replaces
(engine/attention.py). Outputs: last_hidden_state [1, tokens, hidden] and sentence_embedding
[batch, hidden], the mean over each sequence's tokens, L2-normalised, as export/checkpoint.mean_pool.

Which position ids reproduce the padded model is the family's: BERT numbers a padded row's columns
(left padding included), RoBERTa-likes count real tokens from pad_token_id + 1. The rule is found
by verification ("column" first, then "rank") and recorded; a family where neither agrees gets no
packed form (UnsupportedError).
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np

from trt_seer.errors import ExportMismatchError, UnsupportedError
from trt_seer.export import onnxio
from trt_seer.export.failures import failure_line
from trt_seer.export.checkpoint import (OPSET, VERIFY_SHAPES, load_model, sample_inputs,
                                        TRACE_SHAPE)
from trt_seer.export.families import ModelInfo
from trt_seer.export.tolerance import Tolerance
from trt_seer.logs import quieted
from trt_seer.runtime.packed import PACKED_INPUTS, pack, unpack

log = logging.getLogger(__name__)
FORM = "packed-tokens-1"  # in the packed graph's record and cache key
OUTPUTS = ("last_hidden_state", "sentence_embedding")


def packed_inputs(info: ModelInfo) -> list[str]:
    """The packed graph's input names, in its order."""
    return [n for n in PACKED_INPUTS if n != "token_type_ids" or "token_type_ids" in info.inputs]


def rules(info: ModelInfo) -> list[dict]:
    """The position rules tried, in order."""
    return [{"positions": "column"}, {"positions": "rank", "offset": int(info.config.get("pad_token_id") or 0) + 1}]


def wrap_packed(model, names: list[str]):
    """A module over the checkpoint's model taking the packed inputs `names` positionally."""
    import torch

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            feeds = dict(zip(names, args))
            seq, cu = feeds.pop("sequence_ids"), feeds.pop("cu_seqlens")
            mask = (seq[:, :, None] == seq[:, None, :])[:, None]  # (1, 1, tokens, tokens)
            hidden = self.model(**feeds, attention_mask=mask).last_hidden_state  # (1, tokens, hidden)
            batch = torch.arange(cu.shape[0] - 1, device=seq.device)
            member = (seq[0][None, :] == batch[:, None]).to(hidden.dtype)  # (batch, tokens)
            counts = (cu[1:] - cu[:-1]).to(hidden.dtype).clamp(min=1e-9)[:, None]  # (batch, 1)
            pooled = member @ hidden[0] / counts
            return hidden, torch.nn.functional.normalize(pooled, p=2, dim=1)

    return Packed().eval()


def _trace_feeds(info: ModelInfo) -> dict[str, np.ndarray]:
    feeds, _ = pack(sample_inputs(info, *TRACE_SHAPE, seed=1), rules(info)[0])
    return feeds


def _export(wrapped, info: ModelInfo, dest: Path) -> None:
    import torch
    from torch.export import Dim

    names = packed_inputs(info)
    feeds = _trace_feeds(info)
    tokens, bounds = Dim("tokens", min=2, max=1 << 20), Dim("batch_bounds", min=2, max=4097)
    shapes = (tuple({0: bounds} if n == "cu_seqlens" else {1: tokens} for n in names),)
    with warnings.catch_warnings(), quieted("torch.onnx"):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                wrapped, tuple(torch.from_numpy(feeds[n]) for n in names), input_names=names,
                output_names=list(OUTPUTS), dynamic_shapes=shapes, dynamo=True, opset_version=OPSET, verbose=False)
        except Exception as e:  # torch.export / ONNX translation: any op it cannot handle
            raise UnsupportedError(failure_line(info, "packed ONNX export", e)) from e
    large = sum(p.numel() * p.element_size() for p in wrapped.parameters()) > onnxio.EXTERNAL_DATA_THRESHOLD
    with onnxio.staged(dest) as tmp:
        program.save(str(tmp), external_data=large)


def compare_packed(padded, packed, feeds: dict, rule: dict) -> dict[str, tuple[float, float]]:
    """{output: (max |Δ|, max |reference|)} of the packed session against the padded one on padded
    `feeds`: the embedding per sequence, the hidden states at real tokens."""
    ref = dict(zip(OUTPUTS, padded.run(list(OUTPUTS), feeds)))
    packed_feeds, layout = pack(feeds, rule)
    names = [i.name for i in packed.get_inputs()]
    got = unpack(dict(zip(OUTPUTS, packed.run(list(OUTPUTS), {n: packed_feeds[n] for n in names}))), layout)
    pairs = {"sentence_embedding": (got["sentence_embedding"], ref["sentence_embedding"]),
             "last_hidden_state": (got["last_hidden_state"][layout.mask], ref["last_hidden_state"][layout.mask])}
    return {k: (float(np.max(np.abs(g.astype(np.float64) - r))), float(np.max(np.abs(r)))) for k, (g, r) in pairs.items()}


def verify_packed(info: ModelInfo, padded_path: Path, packed_path: Path, rule: dict,
                  tol: Tolerance = Tolerance()) -> dict:
    """The packed graph against the padded one (ONNX Runtime CPU) at VERIFY_SHAPES, rows padded
    on either side; ExportMismatchError above `tol`. Returns {"rule", "shapes", "outputs"}."""
    from trt_seer.eval.evaluate import session

    padded, packed = session(padded_path), session(packed_path)
    report = {"rule": rule, "shapes": [list(s) for s in VERIFY_SHAPES], "outputs": {}}
    for i, (batch, seq) in enumerate(VERIFY_SHAPES):
        feeds = sample_inputs(info, batch, seq, seed=30 + i)
        for name, (delta, scale) in compare_packed(padded, packed, feeds, rule).items():
            allowed = tol.atol + tol.rtol * scale
            if not delta <= allowed:  # also catches NaN
                raise ExportMismatchError(f"the packed graph of {info.name} disagrees with {padded_path.name} on "
                                          f"{name} with {rule['positions']} positions: max |Δ| {delta:.3g} "
                                          f"at batch={batch} seq={seq}")
            prev = report["outputs"].get(name, {"max_abs_diff": 0.0})
            report["outputs"][name] = {"max_abs_diff": max(prev["max_abs_diff"], delta), "allowed": allowed}
    return report


def packed_onnx_from_checkpoint(info: ModelInfo, padded_path: Path, dest: Path) -> dict:
    """Writes the packed graph of `info` (each attention one ONNX Attention) to `dest`, verified
    against the padded FP32 graph `padded_path`. Returns {"form", "rule", "inputs", "attention",
    "verification"}; UnsupportedError for a family that has no packed form."""
    from trt_seer.export.engine_form import own_mask_form

    if info.task != "feature-extraction" or info.family.kind == "decoder":
        raise UnsupportedError(f"packed-token engines are for feature-extraction encoders, not {info.task}")
    plain = dest.with_name(dest.name.removesuffix(".onnx") + ".plain.onnx")
    _export(wrap_packed(load_model(info), packed_inputs(info)), info, plain)
    try:
        count = own_mask_form(info, plain, dest)
    finally:
        plain.unlink(missing_ok=True)
        onnxio.data_path(plain).unlink(missing_ok=True)
    misses = []
    for rule in rules(info):
        try:
            report = verify_packed(info, padded_path, dest, rule)
        except ExportMismatchError as e:
            misses.append(str(e))
            continue
        return {"form": FORM, "rule": rule, "inputs": packed_inputs(info), "attention": count, "verification": report}
    dest.unlink(missing_ok=True)
    onnxio.data_path(dest).unlink(missing_ok=True)
    raise UnsupportedError(f"no position rule makes the packed graph of {info.name} ({info.model_type}) agree "
                           f"with the padded one: {'; '.join(misses)}")
