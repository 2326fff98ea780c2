"""Chunked attention for the decoder export: the same result as Hugging Face's eager attention,
written so that TensorRT spreads a long cache over the GPU.

    from trt_seer.export.attention import NAME, register
    register(); AutoModelForCausalLM.from_pretrained(path, attn_implementation=NAME)   # build --attention chunked

The eager form's decode step is one query row per head against the whole cache: TensorRT-RTX runs
its softmax and its two GEMMs as one block per head, so a step's attention grows with the cache
(docs/BENCHMARKS.md, decode at long contexts). Here the key positions are cut into `CHUNKS` equal
chunks (padded with masked positions to a multiple), as split-K decoding ("flash decoding") does:
each chunk's scores, softmax statistics (maximum, sum) and weighted values are its own, computed for
all chunks at once by two batched GEMMs, and the chunks are then combined, each scaled by
exp(its maximum - the overall maximum). The scores are keys x queries^T, so the cache is read in its
own layout (no transposed copy of the keys per step). Query heads that share a key/value head are
stacked as rows of one GEMM instead of copying the keys per head (repeat_kv). The mask is eager's
(an additive float mask); masked positions weigh exp(-large) = 0 as in eager's softmax, and a chunk
with no unmasked position weighs 0 in the combination (its maximum is the mask's -large).
"""
from __future__ import annotations

from trt_seer.export.families import attention_heads

NAME = "trt_seer_chunked"
CHUNKS = 64


def register() -> None:
    """Makes NAME an attention implementation with eager's additive float mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)


def export_cases(trace: tuple, verify: tuple) -> tuple[tuple, tuple]:
    """The decoder export's (trace case, verification cases), each (batch, seq, past), for this form:
    `trace` over a past longer by 2 x CHUNKS, so that a chunk holds several positions (a chunk size
    of 1 at trace time would be taken as the graph's), and `verify` with a decode and a prefill over
    caches that fill the chunks with several positions, padded and not."""
    batch, seq, past = trace
    return (batch, seq, past + 2 * CHUNKS), (*verify, (2, 1, 3 * CHUNKS + 4), (1, 2, 2 * CHUNKS - 2))


def prompt_scratch_bytes(config: dict, batch: int, seq: int, past: int = 0) -> int:
    """A bound on the GPU memory a prompt step of `batch` x `seq` tokens on a cache of `past`
    positions takes for this form's scores: every query head's row against every position of the
    padded cache, as the FP16 GEMM's output, float32 scores and exponentials, FP16 weights, and the
    float32 mask shared by the key/value heads. TensorRT keeps them in its workspace (eager
    attention's prompt runs as one fused kernel that does not); the engine build's workspace limit
    must leave room for them."""
    heads, kv_heads = attention_heads(config)
    padded = (past + seq + CHUNKS - 1) // CHUNKS * CHUNKS
    scores = batch * heads * seq * padded
    return scores * (2 + 4 + 4 + 2) + scores * 4 // kv_heads


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """query (b, heads, s, d), key / value (b, kv_heads, t, d), mask (b, 1, s, t) additive or None
    -> ((b, s, heads, d), None), as eager_attention_forward (without its probabilities)."""
    import torch
    import torch.nn.functional as F

    b, heads, s, d = query.shape
    kv_heads, t = key.shape[1], key.shape[2]
    group = heads // kv_heads
    rows = group * s  # a key/value head's query heads and positions, as rows
    size = (t + CHUNKS - 1) // CHUNKS  # positions per chunk
    pad = size * CHUNKS - t
    scaling = d ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, 1, rows, d).transpose(-1, -2)  # (b, kv_heads, 1, d, rows)
    k = F.pad(key, (0, 0, 0, pad)).reshape(b, kv_heads, CHUNKS, size, d)
    v = F.pad(value, (0, 0, 0, pad)).reshape(b, kv_heads, CHUNKS, size, d)
    scores = torch.matmul(k, q).float() * scaling + _chunked_mask(attention_mask, query, group, t, pad, size)
    top = scores.amax(dim=-2, keepdim=True)  # (b, kv_heads, chunks, 1, rows): per chunk
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-2, keepdim=True)
    part = torch.matmul(weights.to(value.dtype).transpose(-1, -2), v).float()  # (b, kv_heads, chunks, rows, d)
    top, total = top.transpose(-1, -2), total.transpose(-1, -2)
    scale = torch.exp(top - top.amax(dim=2, keepdim=True))  # chunk against all chunks
    out = (part * scale).sum(dim=2, keepdim=True) / (total * scale).sum(dim=2, keepdim=True)
    out = out.to(query.dtype).reshape(b, heads, s, d)
    return out.transpose(1, 2).contiguous(), None


def _chunked_mask(attention_mask, query, group: int, t: int, pad: int, size: int):
    """The additive mask (b, 1, s, t) or None as (b, 1, chunks, size, group x s) float32 to add to
    the scores of `group` query heads per key/value head, the padding masked."""
    import torch
    import torch.nn.functional as F

    b, _, s, _ = query.shape
    mask = torch.zeros((b, 1, s, t), dtype=torch.float32, device=query.device) if attention_mask is None \
        else attention_mask[..., :t].float().expand(b, 1, s, t)
    mask = F.pad(mask, (0, pad), value=torch.finfo(torch.float32).min).reshape(b, 1, s, CHUNKS, size)
    mask = mask.permute(0, 1, 3, 4, 2).unsqueeze(4)  # (b, 1, chunks, size, 1, s)
    return mask.expand(b, 1, CHUNKS, size, group, s).reshape(b, 1, CHUNKS, size, group * s)
