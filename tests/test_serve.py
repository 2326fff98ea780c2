"""`trt-seer serve` on CPU: a tiny random Llama behind the OpenAI API, called with the official
`openai` client and plain HTTP; continuous batching against `trt-seer generate`'s tokens, slots
freed on disconnect, 429, bad input, and SIGTERM draining. Servers bind 127.0.0.1 on a free port."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_generate import save_tokenizer
from tiny import make_tiny_checkpoint

from trt_seer import cli, pipeline
from trt_seer.export.families import resolve_model

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [" ".join(f"w{3 + (7 * i + 5 * j) % 120}" for j in range(1 + i % 9)) for i in range(16)]
LENGTHS = [4 + (11 * i) % 37 for i in range(16)]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}w3{% endif %}")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A tiny Llama (1,024 positions) exported to ONNX with a word-level tokenizer and a chat template."""
    root = tmp_path_factory.mktemp("serve")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", root / "llama", initializer_range=0.3,
                                max_position_embeddings=1024)
    save_tokenizer(ckpt)
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                            "chat_template": CHAT_TEMPLATE}))
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(root / "out", info.name)
    art.out.mkdir()
    pipeline.fp32_onnx(info, art)
    return art.path("fp32.onnx")


class Server:
    """`trt-seer serve` in a child process; `url` once it listens, `ready()` once /health says ok."""

    def __init__(self, artifact: Path, *args: str):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "trt_seer", "serve", str(artifact), "--port", "0",
                                      "--threads", "1", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        assert found, line + self.proc.stderr.read()
        self.url = found.group(1)
        deadline = time.monotonic() + 60
        while httpx.get(self.url + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.05)

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=60, max_retries=0)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(artifact, "--slots", "4")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def expected(artifact):
    """`trt-seer generate --json`'s greedy tokens for PROMPTS (the longest length), and the tokenizer."""
    import contextlib
    import io

    from trt_seer.runtime.generate import artifact_decoder, load_tokenizer

    out = io.StringIO()
    argv = ["generate", str(artifact), *[a for p in PROMPTS for a in ("--prompt", p)],
            "--max-new-tokens", str(max(LENGTHS)), "--json", "--threads", "1"]
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    results = json.loads(out.getvalue())["results"]
    return [r["token_ids"] for r in results], load_tokenizer(artifact, artifact_decoder(artifact))


def text_of(expected, i: int, n: int) -> str:
    ids, tokenizer = expected[0][i][:n], expected[1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_completions_streamed_and_not_equal_generate(server, expected):
    client = server.client()
    whole = client.completions.create(model="llama", prompt=PROMPTS[3], max_tokens=LENGTHS[3], temperature=0)
    assert whole.choices[0].text == text_of(expected, 3, LENGTHS[3])
    assert whole.usage.completion_tokens == min(LENGTHS[3], len(expected[0][3]))
    assert whole.usage.prompt_tokens == len(expected[1].encode(PROMPTS[3]).ids)
    pieces = [c.choices[0].text for c in client.completions.create(model="llama", prompt=PROMPTS[5],
                                                                   max_tokens=LENGTHS[5], temperature=0, stream=True)]
    assert "".join(pieces) == text_of(expected, 5, LENGTHS[5]) and len(pieces) > 2
    assert [m.id for m in client.models.list().data] == ["llama"]


def test_chat_completions_use_the_checkpoint_template(server, artifact):
    """The template renders "<s>w5 w9 w3": the same tokens as the plain prompt "w5 w9 w3" (BOS added)."""
    client = server.client()
    plain = client.completions.create(model="llama", prompt="w5 w9 w3", max_tokens=9, temperature=0)
    chat = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "w5 w9"}],
                                          max_tokens=9, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text and chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens == 4
    stream = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "w5 w9"}],
                                            max_tokens=9, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == plain.choices[0].text


def test_sixteen_concurrent_streams_get_generate_tokens(server, expected):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", timeout=60, max_retries=0)

    async def one(i):
        stream = await client.completions.create(model="llama", prompt=PROMPTS[i], max_tokens=LENGTHS[i],
                                                 temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def all_of():
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(16))), 60)

    got = asyncio.run(all_of())
    assert got == [text_of(expected, i, LENGTHS[i]) for i in range(16)]


def test_seeded_sampling_repeats_and_stop_strings_cut_the_text(server):
    client = server.client()
    ask = dict(model="llama", prompt=PROMPTS[1], max_tokens=12, temperature=0.9, top_p=0.9, seed=7)
    assert client.completions.create(**ask).choices[0].text == client.completions.create(**ask).choices[0].text
    full = client.completions.create(model="llama", prompt=PROMPTS[2], max_tokens=12, temperature=0).choices[0].text
    word = full.split()[3]
    cut = client.completions.create(model="llama", prompt=PROMPTS[2], max_tokens=12, temperature=0, stop=[word])
    assert cut.choices[0].text == full[:full.index(word)] and cut.choices[0].finish_reason == "stop"
    lp = client.completions.create(model="llama", prompt=PROMPTS[2], max_tokens=3, temperature=0, logprobs=1)
    assert len(lp.choices[0].logprobs.token_logprobs) == 3 and all(x <= 0 for x in lp.choices[0].logprobs.token_logprobs)


BAD = [
    ("completions", b"{not json"),
    ("completions", {"max_tokens": 4}),  # no prompt
    ("completions", {"prompt": ""}),
    ("completions", {"prompt": 5}),
    ("completions", {"prompt": "w5", "max_tokens": 0}),
    ("completions", {"prompt": "w5", "temperature": -1}),
    ("completions", {"prompt": "w5", "top_p": 1.5}),
    ("completions", {"prompt": "w5", "top_k": -2}),
    ("completions", {"prompt": "w5", "n": 2}),
    ("completions", {"prompt": "w5", "stop": [1, 2]}),
    ("completions", {"prompt": " ".join(["w5"] * 1100)}),  # longer than the model takes
    ("completions", {"prompt": [5, 999]}),  # a token id outside the vocabulary
    ("chat/completions", {"messages": []}),
    ("chat/completions", {"messages": [{"role": "user"}]}),
]


def test_bad_requests_get_400_and_the_server_keeps_serving(server):
    for path, body in BAD:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(f"{server.url}/v1/{path}", content=data, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 400, (body, r.text)
        message = r.json()["error"]["message"]
        assert message and "\n" not in message and "Traceback" not in message
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model="llama", prompt="w5", max_tokens=-3)
    assert server.client().completions.create(model="llama", prompt="w5", max_tokens=2).usage.completion_tokens == 2
    assert server.metric('trt_seer_requests_total{endpoint="completions",outcome="400"}') >= 12


def _stream_lines(url: str, body: dict, lines: list, first: threading.Event, keep: bool = True) -> None:
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                first.set()
                if not keep:
                    return


def test_disconnect_frees_its_slot_and_a_full_queue_gives_429(artifact, tmp_path):
    """One slot, one place in the queue; a tokenizer folder without a chat template."""
    (tmp_path / "tok").mkdir()
    save_tokenizer(tmp_path / "tok")
    s = Server(artifact, "--slots", "1", "--queue", "1", "--tokenizer", str(tmp_path / "tok"))
    try:
        url, long = s.url + "/v1/completions", {"prompt": "w5", "max_tokens": 1000, "temperature": 0, "stream": True}
        lines, first = [], threading.Event()
        reader = threading.Thread(target=_stream_lines, args=(url, long, lines, first))
        reader.start()
        assert first.wait(30)
        waiting = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": {"prompt": "w6", "max_tokens": 2},
                                                                               "timeout": 60})
        waiting.start()
        deadline = time.monotonic() + 30
        while s.metric("trt_seer_queue_depth") < 1:
            assert time.monotonic() < deadline
        full = httpx.post(url, json={"prompt": "w7", "max_tokens": 2}, timeout=10)
        assert full.status_code == 429 and full.headers["Retry-After"] == "1"
        reader.join(60)
        waiting.join(60)
        assert lines[-1] == "data: [DONE]" and s.metric("trt_seer_slots_in_use") == 0
        cut, first = [], threading.Event()
        reader = threading.Thread(target=_stream_lines, args=(url, long, cut, first, False))
        reader.start()
        reader.join(30)  # the client left after its first chunk
        deadline = time.monotonic() + 30
        while s.metric('trt_seer_requests_total{endpoint="completions",outcome="cancelled"}') < 1:
            assert time.monotonic() < deadline, "the cancelled request was not counted"
            time.sleep(0.02)
        assert s.metric("trt_seer_slots_in_use") == 0
        no_template = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "w5"}]})
        assert no_template.status_code == 400 and "chat template" in no_template.json()["error"]["message"]
    finally:
        assert s.stop() == 0


def test_sigterm_during_load_answers_every_accepted_request_then_exits_0(artifact):
    s = Server(artifact, "--slots", "2")
    url = s.url + "/v1/completions"
    results, firsts, threads = [], [], []
    for i in range(5):  # more requests than slots: some wait in the queue when the signal comes
        lines, first = [], threading.Event()
        body = {"prompt": PROMPTS[i], "max_tokens": 900, "temperature": 0, "stream": True}
        t = threading.Thread(target=_stream_lines, args=(url, body, lines, first))
        t.start()
        results.append(lines), firsts.append(first), threads.append(t)
    deadline = time.monotonic() + 30
    while s.metric("trt_seer_slots_in_use") + s.metric("trt_seer_queue_depth") < 5:  # all five accepted
        assert time.monotonic() < deadline, "the requests were not accepted"
    assert s.stop() == 0
    for t in threads:
        t.join(30)
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2][len("data: "):])
        reason, used = last["choices"][0]["finish_reason"], last["usage"]["completion_tokens"]
        assert (reason, used) == ("length", 900) or (reason == "stop" and 0 < used < 900)
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.url + "/health", timeout=5)


def test_load_generator_runs_on_cpu_and_appends_its_table(artifact, tmp_path, capsys):
    """tools/bench_serve.py: served clients and static batches over the same workload, one row each."""
    from test_tools import load_tool

    bench = load_tool("bench_serve")
    md = tmp_path / "BENCHMARKS.md"
    argv = [str(artifact), "--clients", "1,3", "--static", "3", "--requests", "6", "--min-out", "4", "--max-out", "12",
            "--threads", "1", "--slots", "3", "--append", str(md)]
    assert bench.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| served") or line.startswith("| static")]
    assert [r.split(" | ")[0] for r in rows] == ["| served, 1 clients", "| served, 3 clients", "| static batches of 3"]
    assert all(int(r.split(" | ")[2]) > 0 for r in rows)  # output tokens counted on every way
    assert "## Serving: continuous batching against static batches" in md.read_text()
