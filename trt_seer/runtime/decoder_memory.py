"""A decoder engine's device memory beside its execution contexts (runtime/decoder_trt.py): the
scratch block they share, and the KV cache of engines that give `new_key_values`."""
from __future__ import annotations

import trt_seer.runtime.cuda as cuda


def shared_scratch(flavor, engine):
    """(the user-managed allocation strategy, one scratch block of the engine's largest size)
    that every context of a decoder shares; (None, None) where TensorRT has no such strategy.
    Contexts run one at a time on one stream, so one block serves the prefill and every window,
    where each context's own would hold that size again (a ladder of five windows at 7B: about 4 GiB)."""
    kinds = getattr(flavor.trt, "ExecutionContextAllocationStrategy", None)
    if kinds is None or not hasattr(engine, "device_memory_size_v2"):
        return None, None
    return kinds.USER_MANAGED, cuda.DeviceBuffer(max(1, int(engine.device_memory_size_v2)))


def new_kv_buffers(rows: int, total: int, row_bytes: int, cache: str, scratch, stream, new_positions: int = 1):
    """Engines with `new_key_values`: (the cache once, [layer][batch][head][window][dim] of
    `total` - 1 positions ("grow": two of `total`, swapping), the step's `new_positions` per row (a
    decode step's one, or a prompt slice's), a staging buffer for moves within the cache: `scratch`
    (free between steps) where it holds a row)."""
    kv = [cuda.DeviceBuffer(rows * n * row_bytes) for n in ((total - 1,) if cache == "window" else (total, total))]
    for buf in kv:  # slots are masked until used, but must hold numbers (NaN * 0 is NaN)
        cuda.memset_async(buf.device_ptr, 0, buf.nbytes, stream)
    new = cuda.DeviceBuffer(rows * new_positions * row_bytes)
    widest = (total - 1) * row_bytes
    stage = scratch if scratch is not None and scratch.nbytes >= widest else cuda.DeviceBuffer(widest * min(rows, 64))
    return kv, new, stage
