"""Chunked attention for the decoder export: the same result as Hugging Face's eager attention,
written so that TensorRT spreads a long cache over the GPU.

    from trt_seer.export.attention import NAME, register
    register(); AutoModelForCausalLM.from_pretrained(path, attn_implementation=NAME)   # build --attention chunked

The eager form's decode step is one query row per head against the whole cache: TensorRT-RTX runs
its softmax and its two GEMMs as one block per head, so a step's attention grows with the cache
(docs/BENCHMARKS.md, decode at long contexts). Here the key positions are cut into
`CHUNKS` equal chunks (padded with masked positions to a multiple): scores for every chunk in one
batched GEMM, one softmax over all chunks (maximum and sum over chunk and position), one batched
GEMM with the values and a sum over chunks. Query heads that share a key/value head are stacked
as rows of one GEMM instead of copying the keys per head (repeat_kv). The mask is eager's (an
additive float mask); masked positions weigh exp(-large) = 0 as in eager's softmax.
"""
from __future__ import annotations

NAME = "trt_seer_chunked"
CHUNKS = 16


def register() -> None:
    """Makes NAME an attention implementation with eager's additive float mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """query (b, heads, s, d), key / value (b, kv_heads, t, d), mask (b, 1, s, t) additive or None
    -> ((b, s, heads, d), None), as eager_attention_forward (without its probabilities)."""
    import torch
    import torch.nn.functional as F

    b, heads, s, d = query.shape
    kv_heads, t = key.shape[1], key.shape[2]
    group = heads // kv_heads
    size = (t + CHUNKS - 1) // CHUNKS  # positions per chunk
    pad = size * CHUNKS - t
    scaling = d ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, 1, group * s, d)  # a key/value head's query heads stacked as rows
    k = F.pad(key, (0, 0, 0, pad)).reshape(b, kv_heads, CHUNKS, size, d)
    v = F.pad(value, (0, 0, 0, pad)).reshape(b, kv_heads, CHUNKS, size, d)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scaling  # (b, kv_heads, chunks, group * s, size)
    low = torch.finfo(torch.float32).min
    mask = torch.zeros((b, 1, s, t), dtype=torch.float32, device=query.device) if attention_mask is None \
        else attention_mask[..., :t].float().expand(b, 1, s, t)
    mask = F.pad(mask, (0, pad), value=low).reshape(b, 1, s, CHUNKS, size).permute(0, 1, 3, 2, 4)
    scores = scores + mask.unsqueeze(3).expand(b, 1, CHUNKS, group, s, size).reshape(b, 1, CHUNKS, group * s, size)
    top = scores.amax(dim=(2, 4), keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(dim=(2, 4), keepdim=True)  # (b, kv_heads, 1, group * s, 1)
    out = torch.matmul(weights.to(value.dtype), v).float().sum(dim=2, keepdim=True) / total
    out = out.to(query.dtype).reshape(b, heads, s, d)
    return out.transpose(1, 2).contiguous(), None
