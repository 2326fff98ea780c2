"""Rotary embedding of the query and key heads as one operation in the decoder export.

    from trt_seer.export.rotary import stacked_rotary
    with stacked_rotary(model):
        torch.onnx.export(...)

Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin)` rotates q and k apart, and TensorRT-RTX ran
each as its own kernel per layer (docs/BENCHMARKS.md, kernels per decode step). Inside the context,
the modeling module's function rotates the heads of q and k stacked along the head axis, with the
module's own function, and splits them back: the same arithmetic on every element, so the same
values to the bit. Only a function of that plain form is replaced: one that takes (q, k, cos, sin)
and, on random q and k of different head counts, gives the stacked result to the bit
(`plain_form`). Other forms (GPT-J's and CodeGen's `(tensor, sin, cos)` on one tensor, interleaved
variants) and modules without the function (no rotary embedding, e.g. GPT-2) are left as they are;
so are calls with arguments beyond `unsqueeze_dim=1` (older signatures take `position_ids` there)
and calls whose q and k differ in any axis but the heads'.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import sys

log = logging.getLogger(__name__)

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


def plain_form(original) -> bool:
    """Whether `original` takes (q, k, cos, sin) and its stacked form gives its own result to the
    bit on random q and k of different head counts (batch, heads, positions, head_dim)."""
    import torch

    try:
        inspect.signature(original).bind(None, None, None, None)
    except (TypeError, ValueError):  # another signature, or none Python can read
        return False
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 2, 3, 8, generator=gen)
    cos, sin = torch.randn(2, 3, 8, generator=gen), torch.randn(2, 3, 8, generator=gen)
    try:
        want = original(q, k, cos, sin)
        got = stacked(original)(q, k, cos, sin)
    except (TypeError, ValueError, RuntimeError, IndexError):  # a function of another form on these inputs
        return False
    return (isinstance(want, tuple) and len(want) == 2 and all(isinstance(w, torch.Tensor) for w in want)
            and all(torch.equal(g, w) for g, w in zip(got, want)))


@contextlib.contextmanager
def stacked_rotary(model):
    """Within the context, `model`'s modeling module rotates q and k as one tensor when its
    function has the plain form (see the module); else the module is left as it is."""
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, FUNCTION, None)
    if original is None or not callable(original) or hasattr(original, "stacked_from"):
        yield
        return
    if not plain_form(original):
        log.info("%s.%s is not of the form (q, k, cos, sin): q and k are rotated by the model's own calls",
                 module.__name__, FUNCTION)
        yield
        return
    setattr(module, FUNCTION, stacked(original))
    try:
        yield
    finally:
        setattr(module, FUNCTION, original)
