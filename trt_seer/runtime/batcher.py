"""Continuous batching over one `DecoderStep`: the decoder's batch rows are slots that requests take
and leave at step boundaries, each row with its own position, sampling and stop rule.

    from trt_seer.runtime.batcher import Batcher, Request
    batcher = Batcher(load_generator("engines/my-llama.fp16.onnx"), slots=8)
    threading.Thread(target=batcher.run, daemon=True).start()
    batcher.submit(Request(prompt_ids, Sampling(max_new_tokens=40), emit=on_event))   # Token / Finished events

Only the protocol every decoder offers is used (`reset`, `step`, and `next_tokens` where present), so
the same loop runs on ONNX Runtime (CPU) and TensorRT. All rows share the cache's columns (the
"timeline"); a row's mask covers only its own columns, from the one where it joined, and its
position ids count its own tokens. So:
- from an empty cache, the waiting requests' prompts run as one left-padded prompt step (what
  `generate` does), and the rows decode from there;
- a request arriving while others decode takes a free row at the next step and feeds its prompt one
  token per step alongside the others' decode tokens (a decoder engine takes one token per row per
  step after the prompt; runtime/decoder_trt.py); its first token is chosen after its last prompt token;
- a finished or cancelled request frees its row before the next step; a free row feeds a pad token
  that attends only to itself;
- when the timeline reaches the decoder's max_total, the cache restarts: every live row's tokens so
  far run again as one left-padded prompt step (a restart also happens when all rows are free).
Each request fits max_total on its own (its output is capped at max_total - prompt + 1 tokens, as in
`generate`, and so that its tokens so far stay a prompt the decoder takes), so a restart always
leaves room for the next step.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from trt_seer.errors import InputError, TrtSeerError
from trt_seer.runtime.generate import Generator, Sampling, TextStream, left_pad
from trt_seer.runtime.sampling import choose

log = logging.getLogger(__name__)


class QueueFull(TrtSeerError):
    """The waiting queue holds as many requests as it may; try again later."""


class Closing(TrtSeerError):
    """The batcher is draining and takes no new request."""


@dataclass(frozen=True)
class Token:
    token_id: int
    text: str  # the new text this token completes ("" while held back: an incomplete character or stop string)
    logprob: float | None


@dataclass(frozen=True)
class Finished:
    reason: str  # "eos" | "stop" (a stop string) | "length" | "cancelled" | "timeout" | "error"
    text: str  # held-back text released at the end (may be "")
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


class StopText:
    """A row's text pieces, cut at the first stop string; a tail that may begin one is held back."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.stream, self.stop, self.held = TextStream(tokenizer), stop, ""

    def push(self, token_id: int) -> tuple[str, bool]:
        """(text to release, whether a stop string was reached)."""
        self.held += self.stream.push(token_id)
        found = [i for i in (self.held.find(s) for s in self.stop) if i >= 0]
        if found:
            piece, self.held = self.held[:min(found)], ""
            return piece, True
        keep = max((k for s in self.stop for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        piece, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return piece, False

    def flush(self) -> str:
        piece, self.held = self.held, ""
        return piece


class Request:
    """One sequence to generate: its prompt ids, sampling (max_new_tokens included), stop strings,
    whether to report log-probabilities, and `emit(event)`, called from the batcher's thread with a
    `Token` per generated token and one `Finished` at the end. `timeout_s` counts from `submit`."""

    def __init__(self, prompt_ids: list[int], sampling: Sampling, emit: Callable, stop: tuple[str, ...] = (),
                 logprobs: bool = False, timeout_s: float | None = None):
        self.prompt_ids, self.sampling, self.emit = list(prompt_ids), sampling, emit
        self.stop, self.logprobs, self.timeout_s = tuple(stop), logprobs, timeout_s
        self.rng = np.random.default_rng(sampling.seed)
        self.tokens: list[int] = []  # generated so far
        self.fed: list[int] = []  # tokens whose keys and values are in the cache
        self.todo: list[int] = []  # tokens to feed, one per step
        self.budget = sampling.max_new_tokens
        self.deadline = None
        self.cancelled = None  # a reason once cancelled ("cancelled" | "timeout")
        self.text: StopText | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Ends the request at the next step boundary (any thread); its row is freed there."""
        self.cancelled = self.cancelled or reason

    def finish(self, reason: str, error: str | None = None) -> None:
        """Emits the request's last event (the batcher calls it as the request leaves its row)."""
        tail = self.text.flush() if self.text is not None and reason in ("eos", "length") else ""
        self.emit(Finished(reason, tail, len(self.prompt_ids), len(self.tokens), error))


class Batcher:
    """Slots over one decoder (`generator.step`); `run()` is the loop (one thread), `submit` and
    `Request.cancel` may be called from any thread."""

    def __init__(self, generator: Generator, slots: int | None = None, queue_size: int = 64):
        self.gen, self.step = generator, generator.step
        self.slots = max(1, min(int(slots or generator.max_batch), generator.max_batch))
        self.queue_size, self.max_total = int(queue_size), int(self.step.max_total)
        self.rows: list[Request | None] = [None] * self.slots
        self.start = np.zeros(self.slots, np.int64)  # each row's first column in the timeline
        self.past = 0  # columns in the cache; 0: restart at the next step
        self.waiting: collections.deque[Request] = collections.deque()
        self.cond = threading.Condition()
        self.closing = False
        self.steps = self.restarts = 0

    # --- any thread ---------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queues a request: InputError when it cannot fit the decoder, QueueFull, or Closing."""
        n = len(request.prompt_ids)
        if not n:
            raise InputError("the prompt is empty after tokenization")
        if n > self.gen.max_prompt:
            raise InputError(f"the prompt has {n} tokens; this model takes at most {self.gen.max_prompt}")
        # a restart runs a row's tokens so far (at most prompt + budget - 2) as a prompt: keep that a prompt the decoder takes
        request.budget = min(request.sampling.max_new_tokens, self.max_total - n + 1, self.gen.max_prompt - n + 2)
        with self.cond:
            if self.closing:
                raise Closing("the server is shutting down")
            if len(self.waiting) >= self.queue_size:
                raise QueueFull(f"{len(self.waiting)} requests are already waiting")
            if request.timeout_s is not None:
                request.deadline = time.monotonic() + request.timeout_s
            self.waiting.append(request)
            self.cond.notify()

    def queue_depth(self) -> int:
        return len(self.waiting)

    def in_use(self) -> int:
        return sum(r is not None for r in self.rows)

    def close(self) -> None:
        """Takes no new request; `run` returns once the waiting and running ones are answered."""
        with self.cond:
            self.closing = True
            self.cond.notify()

    # --- the loop's thread --------------------------------------------------------------------

    def run(self) -> None:
        """Steps while there is work; returns after `close()` once nothing is left."""
        while True:
            with self.cond:
                while not self.waiting and not self.in_use() and not self.closing:
                    self.cond.wait()
                if self.closing and not self.waiting and not self.in_use():
                    return
            try:
                self.tick()
            except Exception as e:  # a failed step ends its rows' requests, never the loop
                log.exception("decoder step failed")
                self._fail_all(f"{type(e).__name__}: {e}")

    def tick(self) -> None:
        """One step: drop cancelled and timed-out rows, admit waiting requests, run the decoder."""
        self._drop_ended()
        if not self.in_use() or self.past + 1 > self.max_total:
            self._admit(restart=True)
            if self.in_use():
                self._restart()
            return
        self._admit(restart=False)
        self._decode()

    def _drop_ended(self) -> None:
        now = time.monotonic()
        for req in [*self.waiting, *(r for r in self.rows if r is not None)]:
            if req.deadline is not None and now > req.deadline:
                req.cancel("timeout")
        with self.cond:
            gone = [r for r in self.waiting if r.cancelled]
            for r in gone:
                self.waiting.remove(r)
        for r in gone:
            r.finish(r.cancelled)
        for row, r in enumerate(self.rows):
            if r is not None and r.cancelled:
                self._free(row, r.cancelled)

    def _admit(self, restart: bool) -> None:
        """Waiting requests into free rows: to run as a prompt step (`restart`) or fed token by token."""
        with self.cond:
            for row in range(self.slots):
                if self.rows[row] is None and self.waiting:
                    req = self.waiting.popleft()
                    req.text = StopText(self.gen.tokenizer, req.stop)
                    req.todo = [] if restart else list(req.prompt_ids)
                    req.fed = list(req.prompt_ids) if restart else []
                    self.rows[row] = req
                    self.start[row] = self.past

    def _restart(self) -> None:
        """An empty cache, then every row's tokens so far as one left-padded prompt step; a row
        whose next token was not chosen yet gets it from this step's logits."""
        history = []
        for r in self.rows:
            if r is not None and not r.fed:  # joined, nothing fed yet: its first prompt token goes now
                r.fed.append(r.todo.pop(0))
            history.append(r.fed if r is not None else [self.gen.pad_id])
        ids, mask = left_pad(history, self.gen.pad_id)
        self.start[:] = ids.shape[1] - np.array([len(h) for h in history])
        self.step.reset(self.slots)
        self.past, self.restarts = 0, self.restarts + 1
        self._run(ids, mask)

    def _decode(self) -> None:
        """One token per row: a joining row's next prompt token, a decoding row's last token."""
        ids = np.full((self.slots, 1), self.gen.pad_id, np.int64)
        for row, r in enumerate(self.rows):
            if r is None:
                self.start[row] = self.past  # a free row attends to its own pad token alone
            else:
                ids[row, 0] = r.todo.pop(0)
                r.fed.append(int(ids[row, 0]))
        columns = np.arange(self.past + 1)
        mask = (columns[None, :] >= self.start[:, None]).astype(np.int64)
        self._run(ids, mask)

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """The decoder on (ids, mask); rows with nothing left to feed choose their next token."""
        seq = ids.shape[1]
        positions = (self.past + np.arange(seq))[None, :] - self.start[:, None]  # each row counts its own
        positions = np.maximum(positions, 0).astype(np.int64)
        choosing = [row for row, r in enumerate(self.rows) if r is not None and not r.todo]
        quick = getattr(self.step, "next_tokens", None)
        if quick is not None and all(self.rows[i].sampling.temperature == 0 and not self.rows[i].logprobs
                                     for i in choosing):
            logits, greedy = None, quick(ids, mask, positions)
        else:
            logits, greedy = self.step.step(ids, mask, positions), None
        self.past, self.steps = self.past + seq, self.steps + 1
        for row in choosing:
            self._advance(row, logits, greedy)

    def _advance(self, row: int, logits: np.ndarray | None, greedy: np.ndarray | None) -> None:
        """Row `row`'s next token: chosen, emitted, and either fed next or the end of the request."""
        r = self.rows[row]
        if greedy is not None:
            token, logprob = int(greedy[row]), None
        else:
            token = int(choose(logits[row:row + 1], r.sampling, r.rng)[0])
            logprob = float(logits[row, token] - _logsumexp(logits[row])) if r.logprobs else None
        r.tokens.append(token)
        piece, stopped = r.text.push(token)
        r.emit(Token(token, piece, logprob))
        if token in self.gen.eos_ids:
            self._free(row, "eos")
        elif stopped:
            self._free(row, "stop")
        elif len(r.tokens) >= r.budget:
            self._free(row, "length")
        else:
            r.todo.append(token)

    def _free(self, row: int, reason: str, error: str | None = None) -> None:
        r, self.rows[row] = self.rows[row], None
        r.finish(reason, error)

    def _fail_all(self, error: str) -> None:
        for row, r in enumerate(self.rows):
            if r is not None:
                self._free(row, "error", error)
        self.past = 0


def _logsumexp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + float(np.log(np.sum(np.exp(x.astype(np.float64) - top))))
