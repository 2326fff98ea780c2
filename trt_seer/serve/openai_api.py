"""The OpenAI API's request bodies and response documents, without any HTTP: bodies of
`/v1/completions` and `/v1/chat/completions` -> `Params` (BadRequest, one sentence, for anything
this server cannot honour), and generated text -> response, stream-chunk and error documents.

    params = completion_params(body, max_total=4096)          # BadRequest -> HTTP 400
    doc = completion_doc(params, "req-1", "llama", text, "stop", usage)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from trt_seer.errors import InputError

MAX_STOP = 4  # stop strings per request, as OpenAI takes
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "length", "cancelled": "stop", "error": "stop"}


class BadRequest(InputError):
    """A request this server cannot honour: HTTP 400 with the message."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Params:
    """What one request asks for: a prompt (text, token ids, or chat messages) and how to sample."""

    chat: bool
    model: str | None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    logprobs: bool = False
    include_usage: bool = True


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise BadRequest(f"`{name}` must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not (low <= value <= high) or math.isnan(value):
        raise BadRequest(f"`{name}` must be between {low:g} and {high:g}, got {value!r}", name)
    return int(value) if integer else float(value)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise BadRequest(f"`stop` must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return tuple(stop)


def _common(body, chat: bool, max_total: int) -> dict:
    """The sampling parameters both endpoints take."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if _number(body, "n", 1, 1, 1, integer=True) != 1:
        raise BadRequest("`n` must be 1", "n")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("`best_of` must be 1", "best_of")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("`stream` must be true or false", "stream")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("`model` must be a string", "model")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("`stream_options` must be an object", "stream_options")
    tokens_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    return dict(
        chat=chat, model=model, stream=bool(body.get("stream", False)), stop=_stop(body),
        max_tokens=_number(body, tokens_key, 16, 1, max_total, integer=True),
        temperature=_number(body, "temperature", 1.0, 0, 2), top_p=_number(body, "top_p", 1.0, 0, 1),
        top_k=_number(body, "top_k", 0, 0, 1 << 30, integer=True), seed=_number(body, "seed", None, 0, 2 ** 63 - 1, integer=True),
        include_usage=bool(options.get("include_usage", True)))


def completion_params(body, max_total: int) -> Params:
    """`/v1/completions`: `prompt` is a string, a list of one string, or a list of token ids."""
    common = _common(body, False, max_total)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("`prompt` is empty", "prompt")
        text, ids = prompt, None
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        text, ids = None, tuple(prompt)
    else:
        raise BadRequest("`prompt` must be a non-empty string or a list of token ids (one prompt per request)", "prompt")
    logprobs = _number(body, "logprobs", None, 0, 1, integer=True)
    if body.get("echo"):
        raise BadRequest("`echo` is not served", "echo")
    if body.get("suffix"):
        raise BadRequest("`suffix` is not served", "suffix")
    return _params(common, prompt=text, prompt_ids=ids, logprobs=logprobs is not None)


def chat_params(body, max_total: int) -> Params:
    """`/v1/chat/completions`: `messages`, each with a `role` and string `content`."""
    common = _common(body, True, max_total)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"message {i} must be an object with a string `role`", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise BadRequest(f"message {i} has content parts other than text", "messages")
        elif not isinstance(content, str):
            raise BadRequest(f"message {i} must have a string `content`", "messages")
    if body.get("top_logprobs"):
        raise BadRequest("`top_logprobs` is not served; `logprobs: true` gives each token's own", "top_logprobs")
    if not isinstance(body.get("logprobs", False), bool):
        raise BadRequest("`logprobs` must be true or false", "logprobs")
    return _params(common, messages=tuple(_plain(m) for m in messages), logprobs=bool(body.get("logprobs")))


def _plain(message: dict) -> dict:
    content = message["content"]
    if isinstance(content, list):
        content = "".join(p["text"] for p in content)
    return {**message, "content": content}


def _params(common: dict, **fields) -> Params:
    return Params(**common, **fields)


def sampling_of(params: Params, max_new_tokens: int):
    from trt_seer.runtime.generate import Sampling

    top_p = params.top_p if params.top_p > 0 else 1e-9  # OpenAI's 0: the likeliest token only
    return Sampling(max_new_tokens, params.temperature, params.top_k, top_p, params.seed)


# --- documents -----------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _logprobs_doc(chat: bool, pieces: list[tuple[str, float]]):
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in pieces]}
    return {"tokens": [t for t, _ in pieces], "token_logprobs": [lp for _, lp in pieces], "top_logprobs": None,
            "text_offset": None}


def response_doc(params: Params, rid: str, model: str, text: str, reason: str, used: dict,
                 pieces: list[tuple[str, float]] | None) -> dict:
    """The whole (not streamed) response."""
    lp = _logprobs_doc(params.chat, pieces) if params.logprobs else None
    if params.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                  "finish_reason": FINISH[reason]}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": FINISH[reason]}
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": [choice], "usage": used}


def chunk_doc(params: Params, rid: str, model: str, text: str | None, reason: str | None = None,
              used: dict | None = None, pieces: list[tuple[str, float]] | None = None, first: bool = False) -> dict:
    """One streamed chunk: a piece of text, or the end (`reason`, with `usage`)."""
    lp = _logprobs_doc(params.chat, pieces) if params.logprobs and pieces else None
    finish = FINISH[reason] if reason else None
    if params.chat:
        delta = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice, kind = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}, "chat.completion.chunk"
    else:
        choice, kind = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}, "text_completion"
    doc = {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}
    if used is not None and params.include_usage:
        doc["usage"] = used
    return doc


def error_doc(message: str, kind: str = "invalid_request_error", param: str | None = None, code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
