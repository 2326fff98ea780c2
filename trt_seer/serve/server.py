"""`trt-seer serve`'s library entry: one causal-LM artifact behind an OpenAI-compatible HTTP server.

    from trt_seer.serve.server import ServeSpec, serve
    serve(ServeSpec("engines/my-llama.fp16.engine", host="127.0.0.1", port=8000))   # blocks until SIGTERM

The artifact, its tokenizer and chat template are opened before the server listens (bad input is
an InputError, nothing started); the warm-up (a decode step in every cache window on TensorRT, one
short request through the batcher) runs once it listens, and /health says "ok" only after it.
SIGTERM (or SIGINT) stops the listener, lets every accepted request finish, then `serve` returns.
One process serves one artifact on one device; it keeps nothing between requests.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from trt_seer.errors import DependencyError, InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSpec:
    """What to serve and how. `slots`: decoder rows (default: the artifact's max_batch, at most 32);
    `queue`: requests that may wait for a slot before 429; `timeout_s`: per request (None: none);
    `name`: the model id clients pass (default: the artifact's name); `threads`: ONNX Runtime's."""

    artifact: str | Path
    host: str = "127.0.0.1"
    port: int = 8000
    slots: int | None = None
    queue: int = 64
    timeout_s: float | None = 600.0
    name: str | None = None
    tokenizer_dir: str | Path | None = None
    backend: str = "auto"
    threads: int = 0
    log_level: str = "warning"

    def __post_init__(self):
        if not 0 <= int(self.port) <= 65535:
            raise InputError(f"port must be in 0..65535, got {self.port}")
        if self.slots is not None and self.slots < 1:
            raise InputError(f"slots must be >= 1, got {self.slots}")
        if self.queue < 1:
            raise InputError(f"queue must be >= 1, got {self.queue}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InputError(f"timeout must be > 0 seconds, got {self.timeout_s}")


def require_server_packages() -> None:
    """DependencyError naming the extra when the HTTP stack is not installed."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client", "jinja2") if importlib.util.find_spec(m) is None]
    if missing:
        raise DependencyError(f"{', '.join(missing)} not installed: pip install 'trt-seer[server]'")


def model_name(artifact: Path) -> str:
    """`<name>.<precision>.engine|onnx` -> `<name>`."""
    return artifact.name.split(".")[0]


def open_service(spec: ServeSpec):
    """The `Service` of an artifact (http.py), loaded and not yet warm; nothing runs yet."""
    from trt_seer.runtime.batcher import Batcher
    from trt_seer.runtime.generate import load_generator, tokenizer_folder
    from trt_seer.serve.chat import ChatTemplate
    from trt_seer.serve.http import Service
    from trt_seer.serve.metrics import ServeMetrics

    artifact = Path(spec.artifact)
    generator = load_generator(artifact, spec.backend, tokenizer_dir=spec.tokenizer_dir, threads=spec.threads)
    template = ChatTemplate.from_directory(tokenizer_folder(artifact, generator.decoder, spec.tokenizer_dir))
    batcher = Batcher(generator, spec.slots or min(generator.max_batch, 32), spec.queue)
    return Service(generator, batcher, template, spec.name or model_name(artifact), ServeMetrics(batcher),
                   spec.timeout_s)


def warm_up(service) -> None:
    """A decode step in every cache window (TensorRT), then one 1-token request through the batcher."""
    from trt_seer.runtime.batcher import Finished, Request
    from trt_seer.runtime.generate import Sampling

    step = service.generator.step
    if hasattr(step, "warm_up"):
        step.warm_up(service.batcher.slots)
    done = threading.Event()
    outcome = []

    def emit(event):
        if isinstance(event, Finished):
            outcome.append(event)
            done.set()

    service.batcher.submit(Request([service.generator.pad_id], Sampling(max_new_tokens=2), emit))
    done.wait()
    if outcome[0].reason == "error":
        log.error("warm-up failed: %s", outcome[0].error)
        return
    service.ready.set()
    log.info("ready: %s on %s, %d slots", service.name, getattr(step, "backend", type(step).__name__),
             service.batcher.slots)


def lifespan_of(service):
    """Starts the batcher's thread and the warm-up with the server; drains and joins it at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop_thread = threading.Thread(target=service.batcher.run, name="trt-seer-batcher", daemon=True)
        loop_thread.start()
        threading.Thread(target=warm_up, args=(service,), name="trt-seer-warm-up", daemon=True).start()
        try:
            yield
        finally:
            service.batcher.close()
            loop_thread.join()
            with contextlib.suppress(Exception):
                service.generator.step.close()

    return lifespan


def serve(spec: ServeSpec, announce=None) -> None:
    """Serves until SIGTERM or SIGINT, then drains; returns when every accepted request is answered.
    `announce(model id, url)`, where given, is called once the socket listens (port 0: a free port is taken)."""
    require_server_packages()
    import uvicorn

    from trt_seer.serve.http import make_app

    sock = listen(spec.host, spec.port)  # a port in use is refused before the engine takes the GPU
    try:
        service = open_service(spec)
    except BaseException:
        sock.close()
        raise
    app = make_app(service, lifespan=lifespan_of(service))
    config = uvicorn.Config(app, log_level=spec.log_level, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    if announce is not None:
        announce(service.name, f"http://{host}:{port}")
    with sock, _signals_end_quietly():
        server.run(sockets=[sock])
    if not server.started:
        raise InputError(f"the server on {host}:{port} did not start (see the log above)")


def listen(host: str, port: int):
    """A listening TCP socket; InputError when the address cannot be bound."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _signals_end_quietly():
    """uvicorn raises the signal that stopped it again once it has drained; where the process's own
    handler is the default one that would kill it with the signal instead of returning normally, so
    SIGTERM gets a no-op handler for the server's lifetime (SIGINT keeps the caller's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
