"""The KV cache's side of a `TensorRTDecoder` step (runtime/decoder_trt.py): the cache inputs' and
outputs' shapes and addresses, and the 2-D copies that keep the cache after the engine ran.

Two cache layouts (`cache=`):
- "window" (default): a decode step reads a window of fixed size and address, so the runtime replays
  a CUDA graph of it (TensorRT-RTX captures one per shape) instead of enqueueing every kernel from
  the host. Windows come in a ladder of sizes (runtime/kv_window.py: 256, 512, ... max_total - 1),
  each with its own execution context, shapes and addresses, hence its own graph; a sequence steps in
  the smallest window that holds it and moves up when it outgrows it, so a step attends over about
  the positions in use. The sequence sits at the window's start and the mask hides the empty slots;
  after a step one 2-D copy puts the new token's keys and values (one position per layer, row and
  head) into its slot. That needs full attention: a sliding-window mask reads distances from slot
  indices. So the layout is left-aligned only when the manifest's `decoder.sliding_window` is null
  (or longer than the largest window); otherwise, and for manifests that do not say, the sequence stays
  right-aligned and every step slides the whole window (`align=` overrides).
- "grow": the cache is as long as the sequence so far; two buffers swap roles every step (the
  engine reads one, and the grown cache goes into the other). Every step is a new shape, so nothing
  can be replayed: each kernel is launched from the host.

Engines built by this version give the step's own keys and values (`new_key_values`,
engine/kv_outputs.py) rather than `present`: the window layout then holds the cache once (one
window buffer, the engine's `present` buffer gone: at 7B with one 4,096-token sequence, 2 GiB) and
moves within it go through the shared scratch block between steps (kv_window.keep_new). Engines
with `present` outputs (built before) run as they did.
"""
from __future__ import annotations

import trt_seer.runtime.cuda as cuda
from trt_seer.errors import InputError
from trt_seer.runtime.kv_window import append_copy, grow_copies, keep_new, land_copy, pick_window, slide_copy


class CacheSteps:
    """Bindings and copies over the decoder's cache buffers (`_kv`, `_new`, `_stage`), its layout
    (`cache`, `windows`, `align`, `window`) and the sequence so far (`batch`, `past`); a base of
    `TensorRTDecoder`, which owns them."""

    def _bind_cache(self, ctx, seq: int, decode: bool) -> None:
        """Shapes and addresses of the cache inputs and outputs for this step."""
        if self.new_kv:
            return self._bind_new(ctx, seq, decode)
        if self.cache == "grow":
            kv_shape = (self.batch, self.kv_heads, self.past, self.head_dim)
            for i, (past, present) in enumerate(zip(self.past_names, self.present_names)):
                self._bind(ctx, past, kv_shape, self._kv[self._cur][i].device_ptr)
                ctx.set_tensor_address(present, self._kv[1 - self._cur][i].device_ptr)
            return
        past_len = self.window if decode else 0
        present_len = past_len + seq
        per_head = self.batch * self.kv_heads
        for i, (past, present) in enumerate(zip(self.past_names, self.present_names)):
            self._bind(ctx, past, (self.batch, self.kv_heads, past_len, self.head_dim),
                       self._kv[0].device_ptr + i * per_head * past_len * self._row)
            ctx.set_tensor_address(present, self._kv[1].device_ptr + i * per_head * present_len * self._row)
        if decode:
            self._bound[self.window] = self.batch

    def _bind_new(self, ctx, seq: int, decode: bool) -> None:
        """`new_key_values` engines: the past from the cache buffer (none for a prompt's first step),
        the step's keys and values into `_new` (on a cache) or packed at the start of the buffer the
        cache goes to (on an empty one)."""
        per_head, grow = self.batch * self.kv_heads, self.cache == "grow"
        past_len = self.past if grow else (self.window if self.past else 0)
        past_buf, out_buf = (self._kv[self._cur], self._kv[1 - self._cur]) if grow else (self._kv[0], self._kv[0])
        for i, (past, new) in enumerate(zip(self.past_names, self.present_names)):
            # an empty past is read from nowhere; its address only has to differ from the outputs'
            at = past_buf.device_ptr + i * per_head * past_len * self._row if past_len else self._new.device_ptr
            self._bind(ctx, past, (self.batch, self.kv_heads, past_len, self.head_dim), at)
            ctx.set_tensor_address(new, (self._new if self.past else out_buf).device_ptr + i * per_head * seq * self._row)
        if decode and not grow:
            self._bound[self.window] = self.batch

    def _keep(self, seq: int, decode: bool) -> None:
        """Window layout: the step's new keys and values into the window, or the whole `present` into
        the next window when the sequence outgrows this one (module docstring, runtime/kv_window.py)."""
        if self.new_kv:
            return self._keep_new(seq)
        rows, used = len(self.past_names) * self.batch * self.kv_heads, self.past + seq
        if decode and used <= self.window:
            c = (append_copy(rows, self.window, self._row, self.past) if self.align == "left"
                 else slide_copy(rows, self.window, self._row))
            return self._copy(c)
        target = pick_window(self.windows, used)
        if target is not None:  # None: the cache is full, no further step is taken
            # empty slots are masked, but must hold numbers, not NaN
            cuda.memset_async(self._kv[0].device_ptr, 0, rows * target * self._row, self.stream)
            self._copy(land_copy(rows, target, self._row, self.window + 1 if decode else seq, self.align))
        self.window = target

    def _keep_new(self, seq: int) -> None:
        """`new_key_values` engines: the step's keys and values into the cache (kv_window.keep_new;
        "grow": the cache into the other buffer, `seq` positions longer, then the new ones)."""
        rows = len(self.past_names) * self.batch * self.kv_heads
        if self.cache == "grow":
            if self.past:
                to, old = self._kv[1 - self._cur], self._kv[self._cur]
                grown, new = grow_copies(rows, self._row, self.past, seq)
                self._copy(grown, to, old)
                self._copy(new, to, self._new)
            return
        plan = keep_new(rows, self._row, self.windows, self.window if self.past else None, self.past, seq,
                        self.align, self._stage.nbytes)
        kv = self._kv[0]
        for move in plan.moves:
            self._copy(move.out, self._stage, kv)
            self._copy(move.back, kv, self._stage)
        if plan.new is not None:
            self._copy(plan.new, kv, self._new)
        self.window = plan.window

    def _copy(self, c, dst=None, src=None) -> None:
        """One 2-D copy from `src` into `dst` (default: the window layout's `present` into the window)."""
        dst, src = self._kv[0] if dst is None else dst, self._kv[1] if src is None else src
        cuda.copy2d_async(dst.device_ptr + c.dst_offset, c.dst_pitch, src.device_ptr + c.src_offset,
                          c.src_pitch, c.width, c.height, "DeviceToDevice", self.stream)

    def _bind(self, ctx, name: str, shape, address: int) -> None:
        if not ctx.set_input_shape(name, tuple(int(d) for d in shape)):
            raise InputError(f"TensorRT rejected shape {list(shape)} for {name} of {self.path.name}")
        ctx.set_tensor_address(name, address)
