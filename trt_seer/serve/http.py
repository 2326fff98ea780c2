"""The OpenAI-compatible HTTP layer (FastAPI on uvicorn) over a `Service`: a generator, its slot
batcher (runtime/batcher.py), the chat template and the metrics.

    app = make_app(service)          # POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics

Streams are server-sent events as OpenAI clients read them (`data: {...}` per chunk, then
`data: [DONE]`). A request's tokens reach its handler through an asyncio queue fed from the
batcher's thread. A client that goes away cancels its request, which frees its slot at the next
step; a full queue is 429 with Retry-After, bad input 400 with one sentence.
"""

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from trt_seer.errors import InputError
from trt_seer.runtime.batcher import Closing, Finished, QueueFull, Request, Token
from trt_seer.serve import openai_api as api

log = logging.getLogger(__name__)
POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there


@dataclass
class Service:
    """What the endpoints serve: `generator` (runtime.generate.Generator), `batcher`, `template`
    (serve/chat.ChatTemplate or None), the model's `name`, `metrics`, a per-request `timeout_s`."""

    generator: object
    batcher: object
    template: object | None
    name: str
    metrics: object
    timeout_s: float | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def prompt_ids(self, params: api.Params) -> list[int]:
        """The prompt's token ids: given, encoded, or the chat template's text encoded as it is."""
        if params.prompt_ids is not None:
            vocab = int(self.generator.decoder.get("vocab_size") or 0)
            if vocab and not all(0 <= t < vocab for t in params.prompt_ids):
                raise api.BadRequest(f"token ids must be in 0..{vocab - 1}", "prompt")
            return list(params.prompt_ids)
        if not params.chat:
            return self.generator.tokenizer.encode(params.prompt).ids
        if self.template is None:
            raise api.BadRequest("this model has no chat template in its tokenizer files; use /v1/completions", "messages")
        text = self.template.render(list(params.messages))
        return self.generator.tokenizer.encode(text, add_special_tokens=False).ids


def _sse(doc) -> str:
    return f"data: {json.dumps(doc) if not isinstance(doc, str) else doc}\n\n"


class Call:
    """One accepted request: its batcher Request, the queue its events arrive on, and timing."""

    def __init__(self, service: Service, params: api.Params, endpoint: str):
        self.service, self.params, self.endpoint = service, params, endpoint
        self.rid = f"{'chatcmpl' if params.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.last, self.seen = time.perf_counter(), 0  # the arrival, then each token's time
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def emit(event):  # the batcher's thread; counted here, as a gone client reads no more events
            if isinstance(event, Finished):
                service.metrics.finished(endpoint, event.reason)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(self.queue.put_nowait, event)

        ids = service.prompt_ids(params)
        self.request = Request(ids, api.sampling_of(params, params.max_tokens), emit, params.stop,
                               params.logprobs, service.timeout_s)
        service.batcher.submit(self.request)
        service.metrics.prompt_tokens.inc(len(ids))

    async def next(self):
        event = await self.queue.get()
        if isinstance(event, Token):
            now = time.perf_counter()
            m = self.service.metrics
            (m.itl if self.seen else m.ttft).observe(now - self.last)
            self.last, self.seen = now, self.seen + 1
            m.completion_tokens.inc()
        return event


def _failure(event: Finished):
    """(status, error document) for a request that ended without its answer; None when it has one."""
    if event.reason == "timeout":
        return 504, api.error_doc("the request ran past the server's per-request timeout", "timeout", code=504)
    if event.reason == "error":
        return 500, api.error_doc(f"generation failed: {event.error}", "server_error", code=500)
    return None


async def _whole(call: Call, http_request):
    """A non-streamed answer: every event collected, the client's presence checked meanwhile."""
    from fastapi.responses import JSONResponse

    text, pieces = [], []
    while True:
        try:
            event = await asyncio.wait_for(call.next(), POLL_S)
        except asyncio.TimeoutError:
            if await http_request.is_disconnected():
                call.request.cancel()
                return JSONResponse(api.error_doc("client went away"), status_code=499)
            continue
        if isinstance(event, Token):
            text.append(event.text)
            pieces.append((event.text, event.logprob))
            continue
        failed = _failure(event)
        if failed:
            return JSONResponse(failed[1], status_code=failed[0])
        text.append(event.text)
        used = api.usage(event.prompt_tokens, event.completion_tokens)
        return JSONResponse(api.response_doc(call.params, call.rid, call.service.name, "".join(text), event.reason,
                                             used, pieces))


async def _stream(call: Call):
    """Server-sent events; the request is cancelled when the client goes (the generator is closed)."""
    p, name, first, done = call.params, call.service.name, True, False
    try:
        while True:
            event = await call.next()
            if isinstance(event, Token):
                if event.text or p.logprobs:
                    yield _sse(api.chunk_doc(p, call.rid, name, event.text, pieces=[(event.text, event.logprob)], first=first))
                    first = False
                continue
            done = True
            failed = _failure(event)
            if failed:
                yield _sse(failed[1])
            else:
                used = api.usage(event.prompt_tokens, event.completion_tokens)
                yield _sse(api.chunk_doc(p, call.rid, name, event.text, event.reason, used, first=first))
            yield _sse("[DONE]")
            return
    finally:
        if not done:
            call.request.cancel()


def _refuse(service: Service, endpoint: str, status: int, doc: dict, headers=None):
    from fastapi.responses import JSONResponse

    service.metrics.finished(endpoint, str(status))
    return JSONResponse(doc, status_code=status, headers=headers)


async def _answer(service: Service, http_request, endpoint: str, parse):
    """A completions request: parsed, accepted (or refused with 400 / 404 / 429 / 503), answered."""
    from fastapi.responses import StreamingResponse

    try:
        body = json.loads(await http_request.body())
    except ValueError:
        return _refuse(service, endpoint, 400, api.error_doc("the request body is not valid JSON"))
    try:
        params = parse(body, service.batcher.max_total)
        if params.model not in (None, service.name):
            return _refuse(service, endpoint, 404, api.error_doc(
                f"model {params.model!r} is not served here; GET /v1/models lists the one that is",
                "not_found_error", "model", 404))
        if not service.ready.is_set():
            return _refuse(service, endpoint, 503, api.error_doc("the model is still loading", "unavailable", code=503))
        call = Call(service, params, endpoint)
    except api.BadRequest as e:
        return _refuse(service, endpoint, 400, api.error_doc(str(e), param=e.param))
    except QueueFull as e:
        return _refuse(service, endpoint, 429, api.error_doc(f"the server is busy: {e}", "rate_limit_error", code=429),
                       {"Retry-After": "1"})
    except Closing as e:
        return _refuse(service, endpoint, 503, api.error_doc(str(e), "unavailable", code=503))
    except InputError as e:
        return _refuse(service, endpoint, 400, api.error_doc(str(e)))
    if params.stream:
        return StreamingResponse(_stream(call), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _whole(call, http_request)


def make_app(service: Service, lifespan=None):
    """The FastAPI application over `service`."""
    from fastapi import FastAPI, Request as HttpRequest
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="trt-seer", lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(http_request: HttpRequest):
        return await _answer(service, http_request, "completions", api.completion_params)

    @app.post("/v1/chat/completions")
    async def chat_completions(http_request: HttpRequest):
        return await _answer(service, http_request, "chat", api.chat_params)

    @app.get("/v1/models")
    async def models():
        model = {"id": service.name, "object": "model", "created": 0, "owned_by": "trt-seer",
                 "max_model_len": service.batcher.max_total}
        return {"object": "list", "data": [model]}

    @app.get("/health")
    async def health():
        if service.batcher.closing:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not service.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok", "slots": service.batcher.slots, "slots_in_use": service.batcher.in_use(),
                "queue_depth": service.batcher.queue_depth()}

    @app.get("/metrics")
    async def metrics():
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    return app
