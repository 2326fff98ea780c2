"""A decoder's TensorRT network: GEMMs that read the same activation (a Llama layer's q, k and v
projections; gate and up) made one GEMM over their weights side by side, its output sliced back,
when the stacked weight is small.

TensorRT-RTX already runs such GEMMs as one kernel, but on a 1.1B Llama it picks a split-K kernel
and a memset for q/k/v (10 MiB stacked); given the stacked weight itself it picks one kernel without
either: 603 -> 668 decode tokens/s at batch 1, 279 -> 257 launches per step, batch 8 unchanged
(docs/BENCHMARKS.md). Larger stacks lost or gained nothing: gate/up of that model (44 MiB) ran
632 tokens/s with both fused, q/k/v of a 7B layer (96 MiB) 1,331 against 1,345 unfused. Hence
MAX_STACKED_BYTES.

Runs after engine/weight_layout.py, on the GEMMs it stored [N, K]: the stacked weight replaces the
first GEMM's, the others read it too (their outputs no longer read, the builder drops them) and
their own constants are emptied, so the weights stay in RAM once. The ONNX graph is not changed.
"""
from __future__ import annotations

import numpy as np

from trt_seer.engine.kv_outputs import readers as readers_of
from trt_seer.engine.weight_layout import Gemm, set_weight

MAX_STACKED_BYTES = 16 << 20  # larger stacks stay apart (module docstring)
GEMM_FUSION = f"shared-input<={MAX_STACKED_BYTES}"  # recorded in decoder engines' cache key


def _groups(gemms: list[Gemm]) -> list[list[Gemm]]:
    """The GEMMs sharing input 0 (and how they read it) and K, two or more, in network order, whose
    weights together hold at most MAX_STACKED_BYTES; none whose output is a network output or whose
    broadcast differs."""
    by_input = {}
    for g in gemms:
        key = (g.mm.get_input(0).name, str(g.mm.op0), g.weights.shape[1],
               None if g.shuffle is None else tuple(g.shuffle.reshape_dims)[:-2])
        by_input.setdefault(key, []).append(g)
    return [group for group in by_input.values()
            if len(group) > 1 and sum(g.weights.nbytes for g in group) <= MAX_STACKED_BYTES
            and not any(g.mm.get_output(0).is_network_output for g in group)]


def _last_axis_slices(flavor, network, t, sizes: list[int], kept: list) -> list:
    """Tensors: `t` sliced along its last axis into `sizes` (its other dimensions may be dynamic)."""
    trt = flavor.trt
    rank = len(t.shape)

    def const(values):
        a = np.array(values, np.int64)
        kept.append(a)
        return network.add_constant((rank,), a).get_output(0)

    shape = network.add_shape(t).get_output(0)
    lead = network.add_elementwise(shape, const([1] * (rank - 1) + [0]), trt.ElementWiseOperation.PROD).get_output(0)
    out, offset = [], 0
    for n in sizes:
        size = network.add_elementwise(lead, const([0] * (rank - 1) + [n]), trt.ElementWiseOperation.SUM).get_output(0)
        s = network.add_slice(t, (0,) * (rank - 1) + (offset,), (1,) * rank, (1,) * rank)
        s.set_input(2, size)
        out.append(s.get_output(0))
        offset += n
    return out


def fuse_shared_input_gemms(flavor, network, gemms: list[Gemm]) -> tuple[list[np.ndarray], int]:
    """Fuses `gemms` (from weight_layout.transposed_gemms) per the module docstring. Returns the arrays
    the build must keep alive (the stacked weights, the unfused GEMMs' weights, slice constants) and
    how many GEMMs were folded into another."""
    readers = readers_of(network)
    groups = _groups(gemms)
    grouped = {id(g.mm) for group in groups for g in group}
    kept = [g.weights for g in gemms if id(g.mm) not in grouped]
    for group in groups:
        _stack(flavor, network, group, readers, kept)
    return kept, sum(len(group) - 1 for group in groups)


def _stack(flavor, network, group: list[Gemm], readers: dict, kept: list) -> None:
    """One group: the first GEMM over the stacked weight, its readers' inputs rewired to slices of its
    output, the others reading the stacked weight (unread from then on) with their constants emptied."""
    first = group[0]
    stacked = np.concatenate([g.weights for g in group])
    kept.append(stacked)
    uses = [readers.get(g.mm.get_output(0).name, []) for g in group]
    set_weight(first.const, first.shuffle, stacked)
    parts = _last_axis_slices(flavor, network, first.mm.get_output(0), [len(g.weights) for g in group], kept)
    for part, reading in zip(parts, uses):
        for layer, j in reading:
            layer.set_input(j, part)
    for g in group[1:]:
        g.mm.set_input(1, first.mm.get_input(1))
        empty = np.zeros((1, 1), np.float16)
        kept.append(empty)
        set_weight(g.const, g.shuffle, empty)
