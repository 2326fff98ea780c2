"""Fake INT8 on attention batched matmuls (`finetune --qat int8 --int8-attention`), at the tensors
where `build --int8-attention` puts Q/DQ in the exported graph: the dynamo export decomposes
scaled-dot-product attention into MatMul(q * sqrt(scale), k^T * sqrt(scale)) and
MatMul(softmax, v). A registered Hugging Face attention function ("trt_seer_qat") computes exactly
that, with fake quantization on those four inputs; ranges live on the attention module as
`qat_bmm_q`, `qat_bmm_k`, `qat_bmm_p`, `qat_bmm_v`.
"""
from __future__ import annotations

import contextlib
import math

from trt_seer.finetune.fakequant import fake_quant_input

NAME = "trt_seer_qat"
INPUTS = ("q", "k", "p", "v")  # QK MatMul inputs 0, 1; PV MatMul inputs 0, 1
_recording: list | None = None


def register() -> None:
    """Makes NAME an attention implementation (and its mask, an additive float mask, like eager)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """Eager attention on (batch, heads, seq, dim) tensors with fake INT8 BMM inputs."""
    import torch

    if _recording is not None:
        _recording.append(module)
    root = math.sqrt(query.shape[-1] ** -0.5 if scaling is None else scaling)
    q, k = query * root, key.transpose(2, 3) * root  # (b, h, s, d), (b, h, d, s)
    if hasattr(module, "qat_bmm_q"):
        q, k = fake_quant_input(q, module.qat_bmm_q), fake_quant_input(k, module.qat_bmm_k)
    scores = torch.matmul(q, k)  # (b, h, s, s)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    if hasattr(module, "qat_bmm_p"):
        probs, value = fake_quant_input(probs, module.qat_bmm_p), fake_quant_input(value, module.qat_bmm_v)
    kept = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(kept, value).transpose(1, 2).contiguous(), probs


@contextlib.contextmanager
def _record():
    global _recording
    _recording = []
    try:
        yield _recording
    finally:
        _recording = None


def attention_modules(model) -> tuple[str, list[str]]:
    """Switches `model` to NAME; returns (its previous implementation, the names of the modules that
    call attention, in call order: one per QK/PV MatMul pair of the exported graph)."""
    import torch

    register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    names = {id(m): n for n, m in model.named_modules()}
    ids = torch.ones((1, 4), dtype=torch.long)
    with _record() as calls, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return previous, [names[id(m)] for m in calls]
