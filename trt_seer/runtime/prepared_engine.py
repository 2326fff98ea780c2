"""The TensorRT backend's prepared call (prepared.py): a slot of its own, outside the pool.

`add_slot` makes the slot inside the model's pool gate (so the model's close() waits for it) and adds
it to the pool's slots, which the model's close() frees; `drop_slot` frees it earlier, when the call
is closed or collected, unless the model is closed already.
"""
from __future__ import annotations

import weakref

from trt_seer.errors import InputError
from trt_seer.runtime.prepared import PreparedCall
from trt_seer.runtime.slot import Slot, SlotOwner


def add_slot(model: SlotOwner, setup) -> Slot:
    """A new slot outside `model`'s pool, in its slots so that its close() frees it; `setup(slot)` runs
    before it is added (a slot whose setup fails is freed). InputError once the model is closed."""
    pool = model.pool
    pool.enter()  # close() waits until the slot is made and set up, or refuses first
    try:
        slot = Slot(model)
        try:
            setup(slot)
        except BaseException:
            close_slot(slot)
            raise
        pool.add(slot)
        return slot
    finally:
        pool.leave()


def drop_slot(model: SlotOwner, slot: Slot) -> None:
    """Frees a slot made by `add_slot` unless the model is closed (its close() frees it)."""
    pool = model.pool
    if not pool.try_enter():
        return
    try:
        pool.remove(slot)
        close_slot(slot)
    finally:
        pool.leave()


def close_slot(slot: Slot) -> None:
    """Waits for the slot's stream, then frees it (and the runtime config of its context)."""
    try:
        slot.stream.synchronize()
    finally:
        slot.close()


class EnginePreparedCall(PreparedCall):
    """A prepared call with an execution context of its own, in the model's slots but not in its
    pool. `run()` takes the pool's lock once on entry and once on exit (it counts as a call inside
    the model, so the model's close() waits for it), copies the staged inputs in, runs the engine,
    copies the outputs back and waits, all from addresses worked out at prepare(). A call dropped
    without close() frees its context when it is collected."""

    def _places(self) -> dict:
        model = self.model
        self._pool, self._running = model.pool, False
        self.slot = add_slot(model, self._set_up)
        self._release = weakref.finalize(self, drop_slot, model, self.slot)
        return dict(zip(model.input_names, self._plan.views)), dict(self._plan.returns)

    def _set_up(self, slot: Slot) -> None:
        self._plan = slot.plan(self.shapes, self.selected)  # sets the shapes; nothing else uses this slot

    def run(self, feeds=None) -> dict:
        pool = self._pool
        with pool.lock:
            if self._running or self._closed or pool.closed:
                raise InputError(self._refusal())
            self._running = True
            pool.inside += 1
        try:
            try:
                if feeds is not None:
                    self._stage(feeds)
                self.slot.launch(self._plan, self.model)
            except BaseException:
                self.slot.stream.synchronize()
                raise
        finally:
            with pool.lock:
                self._running = False
                pool.inside -= 1
                pool.notify()
        return dict(self._plan.returns)

    def _refusal(self) -> str:
        if self._closed:
            return "this prepared call is closed"
        if self._pool.closed:
            return f"{self._pool.name} is closed"
        return "this prepared call is running in another thread; prepare one call per thread"

    def close(self) -> None:
        """Waits for a run in flight, then frees this call's context and device buffers (unless the
        model's close() does). Idempotent. Arrays it handed out stay readable."""
        with self._pool.lock:
            self._pool.wait_for(lambda: not self._running)
            if self._closed:
                return
            self._closed = True
        self._release()
