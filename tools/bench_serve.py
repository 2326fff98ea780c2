"""Load on `trt-seer serve`: N concurrent streaming clients against the server (continuous batching),
and the same requests as static batches through the generate path; output tokens/s, time to first
token and inter-token latency (p50 / p99) per way; appends the table to docs/BENCHMARKS.md.

    PYTHONPATH=. python tools/bench_serve.py engines/my-llama.fp16.engine --clients 1,8,32 --static 8,32 \\
        --append docs/BENCHMARKS.md
    PYTHONPATH=. python tools/bench_serve.py out/llama.fp32.onnx --clients 4 --requests 8 --max-out 32 --threads 1   # CPU

Workload: `--requests` requests (default 4 per client of the largest --clients), prompts drawn from
the held-out corpus (calib/heldout.txt: 1 to 4 consecutive lines each), output lengths log-uniform
in [--min-out, --max-out] (capped where the prompt leaves less room), greedy; all requests are there
at the start. Served: each client sends its share one after another, streaming. Static: the requests
in order, in batches of B run by `Generator` to the batch's longest output (a static batch waits for
its longest member, and stops where its longest prompt leaves no room); each request's tokens count
up to its own length, its first token is when its batch's first token comes. The server runs in a child process (`trt-seer serve --port 0`) and is
stopped before the static runs, so the two never share the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def workload(gen, count: int, min_out: int, max_out: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request."""
    rng = np.random.default_rng(seed)
    lines = [x for x in (ROOT / "calib" / "heldout.txt").read_text().splitlines() if x.strip()]
    out = []
    for _ in range(count):
        start = int(rng.integers(len(lines)))
        text = " ".join(lines[start:start + int(rng.integers(1, 5))])
        ids = gen.tokenizer.encode(text).ids[: max(1, gen.max_prompt - min_out)]
        length = int(math.exp(rng.uniform(math.log(min_out), math.log(max_out))))
        out.append((ids, max(1, min(length, gen.step.max_total - len(ids) + 1))))
    return out


def summary(way: str, wall: float, tokens: int, ttft: list[float], itl: list[float], requests: int) -> dict:
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3 if xs else float("nan")  # noqa: E731
    return {"way": way, "requests": requests, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99)}


def start_server(artifact: str, args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "trt_seer", "serve", artifact, "--port", "0", "--queue", "4096",
           "--threads", str(args.threads), *(["--slots", str(args.slots)] if args.slots else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    found = re.search(r"on (http://\S+)", proc.stdout.readline())
    if not found:
        proc.wait()
        raise SystemExit(f"bench_serve: the server did not start (exit {proc.returncode})")
    import httpx

    url, deadline = found.group(1), time.monotonic() + 600
    while httpx.get(url + "/health").status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit("bench_serve: the server did not become ready in 10 minutes")
        time.sleep(0.1)
    return proc, url


async def _client(http, url: str, share: list, ttft: list, itl: list) -> int:
    tokens = 0
    for ids, length in share:
        body = {"prompt": ids, "max_tokens": length, "temperature": 0, "stream": True}
        sent = last = time.perf_counter()
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"bench_serve: HTTP {r.status_code}: {await r.aread()}")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                doc, now = json.loads(line[6:]), time.perf_counter()
                if doc.get("usage"):
                    tokens += doc["usage"]["completion_tokens"]
                elif doc["choices"][0]["text"]:
                    (itl if last != sent else ttft).append(now - last)
                    last = now
    return tokens


def served(url: str, requests: list, clients: int) -> dict:
    import httpx

    async def run():
        ttft, itl = [], []
        async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=clients)) as http:
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(_client(http, url, requests[c::clients], ttft, itl) for c in range(clients)))
            return summary(f"served, {clients} clients", time.perf_counter() - t0, sum(counts), ttft, itl, len(requests))

    return asyncio.run(run())


def static(gen, requests: list, batch: int) -> dict:
    """The requests in order as static batches through the generate path."""
    from trt_seer.runtime.generate import Sampling, generate_ids

    ttft, itl, tokens, t0 = [], [], 0, time.perf_counter()
    for start in range(0, len(requests), batch):
        chunk = requests[start:start + batch]
        sampling = Sampling(max_new_tokens=max(n for _, n in chunk))
        seen, last = [0] * len(chunk), None
        for row, _ in generate_ids(gen.step, [ids for ids, _ in chunk], sampling, gen.eos_ids, gen.pad_id):
            now = time.perf_counter()
            if seen[row] < chunk[row][1]:
                (itl if seen[row] else ttft).append(now - (last[row] if seen[row] else t0))
                tokens += 1
            seen[row] += 1
            last = last or [now] * len(chunk)
            last[row] = now
    return summary(f"static batches of {batch}", time.perf_counter() - t0, tokens, ttft, itl, len(requests))


def table(rows: list[dict]) -> str:
    lines = ["| way | requests | output tokens | wall s | output tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['way']} | {r['requests']} | {r['tokens']} | {r['wall_s']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} / {r['itl_p99_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", help="<name>.<precision>.engine or .onnx (causal-lm)")
    p.add_argument("--clients", default="1,8,32", help="concurrent clients per served run, comma-separated (1..64)")
    p.add_argument("--static", default="8", help="static batch sizes to compare, comma-separated")
    p.add_argument("--requests", type=int, default=None, help="requests in the workload (default 4 x the most clients)")
    p.add_argument("--min-out", type=int, default=16)
    p.add_argument("--max-out", type=int, default=512)
    p.add_argument("--slots", type=int, default=None, help="the server's --slots (default its own)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (CPU artifacts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--append", type=Path, default=None, help="append the table to this BENCHMARKS.md")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    if not all(1 <= c <= 64 for c in clients) or not 1 <= args.min_out <= args.max_out:
        p.error("clients must be in 1..64 and 1 <= --min-out <= --max-out")
    from trt_seer.runtime.generate import load_generator

    gen = load_generator(args.artifact, threads=args.threads)
    requests = workload(gen, args.requests or 4 * max(clients), args.min_out, args.max_out, args.seed)
    proc, url = start_server(args.artifact, args)
    try:
        rows = [served(url, requests, c) for c in clients]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    rows += [static(gen, requests, int(b)) for b in args.static.split(",")]
    text = table(rows)
    print(text)
    if args.append:
        from trt_seer.bench.host import engine_gpu_text, machine_text
        from trt_seer.bench.report import append_benchmark

        gpu = engine_gpu_text() if str(args.artifact).endswith(".engine") else None
        append_benchmark(args.append, "Serving: continuous batching against static batches",
                         "python " + " ".join(sys.argv), machine_text(gpu), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
