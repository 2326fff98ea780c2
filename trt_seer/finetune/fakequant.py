"""Fake INT8 for quantization-aware training, with the rounding and clamping of the Q/DQ pairs that
`build` writes (ONNX QuantizeLinear: round half to even, saturate to [-128, 127]; weights symmetric
in [-127, 127]). Straight-through gradients come from torch's fake-quantize ops."""
from __future__ import annotations

import math


def make_range(amax: float, learned: bool, lr: float, tensor: str):
    """A 0-dim parameter holding log(amax), tagged for the optimizer (`range_lr`) and for
    qat_ranges.json (`tensor`, `initial_amax`). Frozen ranges do not require grad."""
    import torch

    p = torch.nn.Parameter(torch.tensor(math.log(amax)), requires_grad=learned)
    p.range_lr, p.tensor, p.initial_amax = lr, tensor, amax
    return p


def fake_quant_input(x, log_amax):
    """Per-tensor symmetric INT8 fake quantization of `x` (any float dtype) with amax exp(log_amax);
    learned ranges get LSQ gradients (the op behind torch.ao's _LearnableFakeQuantize)."""
    import torch

    scale = (log_amax.float().exp() / 127.0).reshape(1)
    if log_amax.requires_grad:
        y = torch._fake_quantize_learnable_per_tensor_affine(x.float(), scale, torch.zeros_like(scale), -128, 127, 1.0)
    else:
        zero = torch.zeros(1, dtype=torch.int32, device=x.device)
        y = torch.fake_quantize_per_tensor_affine(x.float(), scale, zero, -128, 127)
    return y.to(x.dtype)


def fake_quant_weight(w, scale_grad: bool = False):
    """Per-output-channel symmetric INT8 (rows of an nn.Linear weight), scale = max |row| / 127.
    `scale_grad`: the scale is a function of `w` for the gradient too (LSQ's gradient of the
    rounding step), so a learned SmoothQuant s sees that raising one input channel coarsens every
    row whose maximum it sets; otherwise the scale is a constant of the step."""
    import torch

    amax = w.float().abs().amax(dim=1)  # (out,)
    if not scale_grad:
        amax = amax.detach()
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    zero = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
    if scale_grad:
        return torch._fake_quantize_learnable_per_channel_affine(w.float(), scale, zero.float(), 0, -127, 127,
                                                                  1.0).to(w.dtype)
    return torch.fake_quantize_per_channel_affine(w.float(), scale, zero, 0, -127, 127).to(w.dtype)


def fake_quant_int4_blocks(w, block: int):
    """Block-wise symmetric INT4 of an nn.Linear weight (out, in), as `build --int4` writes it
    (quantize/weightonly.quantize_int4 on the FP16 graph's [in, out] weight): the weight rounded to
    FP16, one scale per `block` consecutive input channels of each row, amax / 7 in FP32, values
    rint(w / scale) (half to even) in [-8, 7], dequantized with the scale stored as FP16. The
    gradient is straight-through (identity): with scale = amax / 7 no value is clipped."""
    import torch

    out, k = w.shape
    blocks = w.detach().half().float().reshape(out, k // block, block)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(blocks / scale), -8, 7)
    deq = (q * scale.half().float()).reshape(out, k).to(w.dtype)
    return w + (deq - w).detach()
