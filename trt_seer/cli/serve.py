"""`trt-seer serve`: an OpenAI-compatible HTTP server over a causal-LM artifact, with continuous
batching (requests join and leave the decoder's batch at step boundaries).

    trt-seer serve engines/my-llama.fp16.engine --host 0.0.0.0 --port 8000
    curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "my-llama", "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}'

Endpoints: POST /v1/completions, POST /v1/chat/completions (the checkpoint's chat template),
GET /v1/models, GET /health (200 once loaded and warm), GET /metrics (Prometheus).
SIGTERM drains: the listener closes, accepted requests finish, then the process exits 0.
Needs the `server` extra: pip install 'trt-seer[server]'.
"""
from __future__ import annotations

import argparse


def add_parser(subparsers, common):
    p = subparsers.add_parser("serve", help="serve a causal-LM artifact over the OpenAI HTTP API",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ENGINE_OR_ONNX", help="<name>.<precision>.engine or .onnx (causal-lm)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    p.add_argument("--port", type=common.non_negative_int, default=8000, help="port (default 8000)")
    p.add_argument("--name", default=None, help="model id clients pass (default: the artifact's name)")
    p.add_argument("--slots", type=common.positive_int, default=None, metavar="N",
                   help="sequences decoded at once (default: the artifact's max batch, at most 32)")
    p.add_argument("--queue", type=common.positive_int, default=64, metavar="N",
                   help="requests that may wait for a slot; beyond that 429 (default 64)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="per-request limit in seconds (default 600)")
    common.add_decoder_runtime_args(p)
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from trt_seer.serve.server import ServeSpec, serve

    spec = ServeSpec(args.artifact, host=args.host, port=args.port, slots=args.slots, queue=args.queue,
                     timeout_s=args.timeout, name=args.name, tokenizer_dir=args.tokenizer, threads=args.threads,
                     log_level="info" if args.verbose else "warning")
    serve(spec, announce=lambda name, url: print(f"serving {name} on {url}", flush=True))
    return 0
