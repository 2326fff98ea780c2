"""Rotary embedding of the query and key heads as one operation in the decoder export.

    from trt_seer.export.rotary import stacked_rotary
    with stacked_rotary(model):
        torch.onnx.export(...)

Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin)` rotates q and k apart, and TensorRT-RTX ran
each as its own kernel per layer (docs/BENCHMARKS.md, kernels per decode step). Inside the context,
the modeling module's function rotates the heads of q and k stacked along the head axis, with the
module's own function, and splits them back: the same arithmetic on every element, so the same
values to the bit. Models whose module has no such function (no rotary embedding, e.g. GPT-2) are
left as they are; so are calls with arguments beyond `unsqueeze_dim=1` (older signatures take
`position_ids` there) and calls whose q and k differ in any axis but the heads'.
"""
from __future__ import annotations

import contextlib
import sys

FUNCTION = "apply_rotary_pos_emb"
FORM = "q-k-stacked"  # in the decoder graph's cache key (pipeline.decoder_form)


def stacked(original):
    """`original`(q, k, cos, sin, ...) computed once over q and k's heads stacked."""
    import torch

    def apply(q, k, cos, sin, *args, **kwargs):
        plain = not args and set(kwargs) <= {"unsqueeze_dim"} and kwargs.get("unsqueeze_dim", 1) == 1
        if not plain or q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
            return original(q, k, cos, sin, *args, **kwargs)
        both = torch.cat([q, k], dim=1)
        rotated = original(both, both, cos, sin, **kwargs)[0]  # the unused second result is dropped
        return rotated[:, :q.shape[1]], rotated[:, q.shape[1]:]

    apply.stacked_from = original
    return apply


@contextlib.contextmanager
def stacked_rotary(model):
    """Within the context, `model`'s modeling module rotates q and k as one tensor (see the module)."""
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, FUNCTION, None)
    if original is None or not callable(original) or hasattr(original, "stacked_from"):
        yield
        return
    setattr(module, FUNCTION, stacked(original))
    try:
        yield
    finally:
        setattr(module, FUNCTION, original)
