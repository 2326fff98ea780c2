"""Bad inputs to every command: each must fail with one line on stderr, the right exit code, no
traceback and nothing half-written.

Each case runs the CLI in a subprocess (in its own temp directory, so stray writes show) on
artifacts of one tiny model built once for the module: a 2-layer BERT, its FP32/FP16 ONNX and,
when TensorRT is importable, an FP16 engine. Cases prefer inputs that fail before any slow work.

stderr rule: lines a failing run may print before its error are dropped — tqdm progress bars,
progress log lines (ending in "..." or saying a stage is "up to date") and warnings ("warning:
...", "[TensorRT] WARNING ...", Python's "...Warning: ..." with its source line). Exactly one line
must be left: `trt-seer: error: ...` (`trt-seer COMMAND: error: ...` for usage errors,
`trt-seer: interrupted` after Ctrl-C).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from trt_seer.engine import trt

TINY_PROFILE = ["--batch", "1,2,4", "--seq", "8,16,32"]
HAS_TRT = trt.available()


# --- the tiny model and its artifacts, built once ----------------------------------------------

def _tokenizer(dest: Path) -> None:
    """A word-level tokenizer.json over the tiny vocabulary (words w2 .. w127)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dest / "tokenizer.json"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """`ckpt/` (tiny BERT + tokenizer) and `art/` with its FP32/FP16 ONNX (+ FP16 engine)."""
    from tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("fuzz")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", root / "ckpt")
    _tokenizer(ckpt)
    args = ["build", "--fp16", *TINY_PROFILE] if HAS_TRT else ["export", "--fp16"]
    r = cli(*args, "--model", ckpt, "--out", root / "art")
    assert r.returncode == 0, r.stderr
    llama = make_tiny_checkpoint("llama", "causal-lm", root / "llama")  # for `generate`
    _tokenizer(llama)
    r = cli("export", "--model", llama, "--out", root / "dec")
    assert r.returncode == 0, r.stderr
    return root


@dataclass
class Env:
    """One case's view: `tmp` is its own directory (the output directory of the case lives here),
    `art` a private copy of the artifacts it may corrupt, `ckpt` the tiny checkpoint."""

    tmp: Path
    art: Path
    ckpt: Path

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def blocker(self) -> Path:
        """A path under a regular file: no one can create it, root included."""
        return self.file("blocker", "x") / "sub"

    def put(self, name: str, content: bytes | str) -> Path:
        """Overwrites an artifact of the case's copy."""
        path = self.art / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def edit(self, name: str, change: Callable[[dict], None]) -> Path:
        path = self.art / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return path

    def truncate(self, name: str, size: int = 1000) -> Path:
        path = self.art / name
        with open(path, "r+b") as f:
            f.truncate(size)
        return path

    def model(self, config: bytes | str, weights: bytes | None = None) -> Path:
        """A checkpoint directory with this config.json (and model.safetensors)."""
        d = self.tmp / "model"
        self.file("model/config.json", config)
        if weights is not None:
            self.file("model/model.safetensors", weights)
        return d


def cli(*args, cwd=None, **kw):
    return subprocess.run([sys.executable, "-m", "trt_seer", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=cwd, **kw)


NOISE = re.compile(r"(\d+%\||it/s\]|step/s|batch/s|point/s|\.\.\.$| up to date|^warning: |^\[TensorRT\] WARNING|"
                   r"^\S.*Warning: |^\s+warnings\.warn\(|"
                   r"^plan for |^[+-] *\d+\.\d+ GiB |^peak disk under --out|^peak memory \(estimate\)|^note: |^stage .+: [\d.]+ s, )")


def failure_lines(stderr: str) -> list[str]:
    """stderr without the progress and warning lines (never without a `trt-seer...` line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return [line for line in lines if line.startswith("trt-seer") or not NOISE.search(line)]


def leftovers(root: Path) -> list[str]:
    """Temp files and directories (atomic writes' `.name.XXXX.tmp`, `.int8-XXXX`) under `root`."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


# --- the cases ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Env], list]  # builds the bad input, returns the command line
    needle: str  # what the error line must say
    prepare: Callable[[Env], object] | None = None  # corrupts the case's copy of the artifacts
    code: int = 2
    needs_engine: bool = False


ENGINE = "ckpt.fp16.engine"
MANIFEST = "ckpt.fp16.manifest.json"
NOT_UTF8 = b"\xff\xfe\x80 not utf-8 \x81\n"
BERT = json.dumps({"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37,
                   "vocab_size": 128, "max_position_embeddings": 128})

def RUN_FP16(e: Env) -> list:
    return ["run", e.art / "ckpt.fp16.onnx", "--text", "w2"]


def DIFF_ENGINE(e: Env) -> list:
    return ["diff", e.art / MANIFEST]


def DIFF_FP16(e: Env) -> list:
    return ["diff", e.art / "ckpt.fp16.onnx.json"]


BUILD = [
    Case("build-config-not-utf8", lambda e: ["build", "--model", e.model(NOT_UTF8)], "unreadable config.json"),
    Case("build-config-a-list", lambda e: ["build", "--model", e.model("[1, 2]")], "is not a JSON object"),
    Case("build-config-truncated", lambda e: ["build", "--model", e.model(BERT[:40])], "unreadable config.json"),
    Case("build-model-type-wrong-type", lambda e: ["build", "--model", e.model('{"model_type": ["bert"]}')],
         "model_type should be a JSON str"),
    Case("build-positions-wrong-type", lambda e: ["build", "--model", e.model(
        '{"model_type": "bert", "max_position_embeddings": "512"}')], "max_position_embeddings should be"),
    Case("build-seq-beyond-positions", lambda e: ["build", "--model", e.ckpt, "--seq", "8,64,4096",
                                                  "--out", e.tmp / "out"], "exceeds the 128 positions"),
    Case("build-batch-not-a-triple", lambda e: ["build", "--batch", "8,1", "--out", e.tmp / "out"], "--batch"),
    Case("build-bad-compute-capability", lambda e: ["build", "--model", e.ckpt, *TINY_PROFILE,
                                                    "--compute-capability", "x.y", "--out", e.tmp / "out"],
         "compute capability"),
    Case("build-out-under-a-file", lambda e: ["build", "--model", e.ckpt, *TINY_PROFILE, "--out", e.blocker()],
         "cannot create output directory"),
    Case("build-calib-not-utf8", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                            "--calib", e.file("c.txt", NOT_UTF8), "--out", e.tmp / "out"],
         "not UTF-8"),
    Case("build-calib-empty", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                         "--calib", e.file("c.txt", ""), "--out", e.tmp / "out"], "is empty"),
    Case("build-calib-jsonl-not-objects", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                                     "--calib", e.file("c.jsonl", '{"text": "a"}\n[1]\n'),
                                                     "--out", e.tmp / "out"], "expected a JSON object"),
    Case("build-calib-corrupt-npz", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                               "--calib", e.file("npz/0.npz", b"PK\x03\x04 torn").parent,
                                               "--out", e.tmp / "out"], "unreadable calibration batch"),
    Case("build-seed-cache-garbage", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                                "--from-cache", e.file("c.cache", NOT_UTF8), "--out", e.tmp / "out"],
         "c.cache"),
    Case("build-calib-cache-under-a-file", lambda e: ["build", "--int8", "--model", e.ckpt, *TINY_PROFILE,
                                                      "--calib-cache", e.blocker() / "c.cache",
                                                      "--out", e.tmp / "out"], "cannot create output directory"),
]

EXPORT = [
    Case("export-weights-corrupt", lambda e: ["export", "--model", e.model(BERT, b"\x00" * 8 + b"garbage"),
                                              "--out", e.tmp / "out"], "not a readable safetensors file"),
    Case("export-weights-truncated", lambda e: ["export", "--model", e.model(
        BERT, (e.ckpt / "model.safetensors").read_bytes()[:4000]), "--out", e.tmp / "out"],
        "not a readable safetensors file"),
    Case("export-weights-missing", lambda e: ["export", "--model", e.model(BERT), "--out", e.tmp / "out"],
         "no model weights"),
    Case("export-model-not-a-dir", lambda e: ["export", "--model", e.file("m.txt", "x"), "--out", e.tmp / "out"],
         "model directory not found"),
    Case("export-out-under-a-file", lambda e: ["export", "--model", e.ckpt, "--out", e.blocker()],
         "cannot create output directory"),
]

RUN = [
    Case("run-onnx-truncated", lambda e: ["run", e.truncate("ckpt.fp16.onnx"), "--text", "w2"], "cannot run"),
    Case("run-onnx-random-bytes", lambda e: ["run", e.file("x.fp16.onnx", os.urandom(512)), "--text", "w2"],
         "cannot run"),
    Case("run-record-io-wrong-type", RUN_FP16, "io should be an object",
         prepare=lambda e: e.edit("ckpt.fp16.onnx.json", lambda d: d.update(io="x"))),
    Case("run-record-shape-wrong-type", RUN_FP16, "io.inputs[0].shape should be a list",
         prepare=lambda e: e.edit("ckpt.fp16.onnx.json", lambda d: d["io"]["inputs"][0].update(shape="dynamic"))),
    Case("run-record-not-utf8", RUN_FP16, "not UTF-8", prepare=lambda e: e.put("ckpt.fp16.onnx.json", NOT_UTF8)),
    Case("run-record-truncated", RUN_FP16, "not valid JSON", prepare=lambda e: e.truncate("ckpt.fp16.onnx.json", 100)),
    Case("run-file-not-utf8", lambda e: ["run", e.art / "ckpt.fp16.onnx", "--file", e.file("t.txt", NOT_UTF8)],
         "cannot read --file"),
    Case("run-file-empty", lambda e: ["run", e.art / "ckpt.fp16.onnx", "--file", e.file("t.txt", "\n\n")],
         "nothing to run"),
    Case("run-tokenizer-corrupt", lambda e: ["run", e.art / "ckpt.fp16.onnx", "--text", "w2",
                                             "--tokenizer", e.file("tok/tokenizer.json", '{"model": ').parent],
         "tokenizer.json"),
    Case("run-not-an-artifact", lambda e: ["run", e.file("x.txt", "hi"), "--text", "w2"], "expected an engine"),
    Case("run-missing-onnx", lambda e: ["run", e.tmp / "nope.onnx", "--text", "w2"], "not found"),
    Case("run-engine-other-flavor", lambda e: ["run", e.art / ENGINE, "--backend", "tensorrt", "--text", "w2"],
         "", prepare=lambda e: e.edit(MANIFEST, lambda d: d["tensorrt"].update(flavor="tensorrt", version="8.6.1")),
         needs_engine=True),
    Case("run-engine-truncated", lambda e: ["run", e.truncate(ENGINE), "--backend", "tensorrt", "--text", "w2"],
         "", needs_engine=True),
]

DIFF = [
    Case("diff-onnx-truncated", DIFF_FP16, "not a readable ONNX graph", prepare=lambda e: e.truncate("ckpt.fp16.onnx")),
    Case("diff-reference-onnx-truncated", DIFF_FP16, "ckpt.fp32.onnx is not a readable ONNX graph",
         prepare=lambda e: e.truncate("ckpt.fp32.onnx", 5000)),
    Case("diff-schema-wrong-type", lambda e: ["diff", e.edit("ckpt.fp16.onnx.json", lambda d: d.update(schema="1"))],
         "schema should be an integer"),
    Case("diff-schema-from-the-future", lambda e: ["diff", e.edit("ckpt.fp16.onnx.json",
                                                                  lambda d: d.update(schema=99))], "schema 99"),
    Case("diff-manifest-profile-wrong-type", lambda e: ["diff", e.edit(
        MANIFEST, lambda d: d["profiles"][0].update(batch="1,2,4"))], "profiles[0].batch should be a list",
        needs_engine=True),
    Case("diff-engine-size-wrong-type", DIFF_ENGINE, "engine.size_bytes should be an integer",
         prepare=lambda e: e.edit(MANIFEST, lambda d: d["engine"].update(size_bytes="3 MB")), needs_engine=True),
    Case("diff-engine-manifest-missing-key", DIFF_ENGINE, "lacks tensorrt",
         prepare=lambda e: e.edit(MANIFEST, lambda d: d.pop("tensorrt")), needs_engine=True),
    Case("diff-engine-version-wrong-type", DIFF_ENGINE, "tensorrt.version should be a string",
         prepare=lambda e: e.edit(MANIFEST, lambda d: d["tensorrt"].update(version=10.13)), needs_engine=True),
    Case("diff-manifest-not-an-object", lambda e: ["diff", e.file("x.fp16.manifest.json", "[]")],
         "not a JSON object"),
    Case("diff-data-not-utf8", lambda e: ["diff", e.art / "ckpt.fp16.onnx.json", "--data",
                                          e.file("d.txt", NOT_UTF8)], "not UTF-8"),
    Case("diff-data-empty", lambda e: ["diff", e.art / "ckpt.fp16.onnx.json", "--data", e.file("d.txt", "")],
         "is empty"),
    Case("diff-report-under-a-file", lambda e: ["diff", e.art / "ckpt.fp16.onnx.json", "--report", e.blocker()],
         "cannot create output directory"),
    Case("diff-missing-record", lambda e: ["diff", e.tmp / "nope.fp16.onnx.json"], "not found"),
]

BENCH = [
    Case("bench-report-under-a-file", lambda e: ["bench", "--model", e.ckpt, "--engines", e.art, "--quick",
                                                 "--report", e.blocker()], "cannot create output directory"),
    Case("bench-model-and-model-config", lambda e: ["bench", "--model", e.ckpt, "--model-config", "bert-base",
                                                    "--report", e.tmp / "out"], "not both"),
    Case("bench-config-not-utf8", lambda e: ["bench", "--model", e.model(NOT_UTF8), "--quick",
                                             "--report", e.tmp / "out"], "unreadable config.json"),
    Case("bench-seq-beyond-positions", lambda e: ["bench", "--model", e.ckpt, "--engines", e.art, "--quick",
                                                  "--seq", "4096", "--report", e.tmp / "out"],
         "--seq 4096 exceeds the 128 positions"),
    Case("bench-batch-zero", lambda e: ["bench", "--batch", "0", "--report", e.tmp / "out"], "--batch"),
]

FINETUNE = [
    Case("finetune-train-not-utf8", lambda e: ["finetune", "--train", e.file("t.jsonl", NOT_UTF8),
                                               "--out", e.tmp / "out"], "UTF-8"),
    Case("finetune-train-empty", lambda e: ["finetune", "--train", e.file("t.jsonl", ""), "--out", e.tmp / "out"],
         "no examples"),
    Case("finetune-text-wrong-type", lambda e: ["finetune", "--train", e.file("t.jsonl", '{"text": 5, "label": 1}\n'),
                                                "--out", e.tmp / "out"], "must be a non-empty string"),
    Case("finetune-csv-missing-column", lambda e: ["finetune", "--train", e.file("t.csv", "sentence,label\na,1\n"),
                                                   "--out", e.tmp / "out"], "no column 'text'"),
    Case("finetune-out-under-a-file", lambda e: ["finetune", "--out", e.blocker(), "--max-steps", "1"],
         "cannot create --out"),
    Case("finetune-config-a-list", lambda e: ["finetune", "--model", e.model("[]"), "--out", e.tmp / "out"],
         "is not a JSON object"),
]

def DECODER(e: Env) -> Path:
    """The tiny causal LM's FP32 graph (read only: generate writes nothing)."""
    return e.ckpt.parent / "dec" / "llama.fp32.onnx"


GENERATE = [
    Case("generate-encoder-artifact", lambda e: ["generate", e.art / "ckpt.fp16.onnx", "--prompt", "w2"],
         "generation needs a causal-lm one"),
    Case("generate-encoder-engine", lambda e: ["generate", e.art / ENGINE, "--prompt", "w2"],
         "generation needs a causal-lm one", needs_engine=True),
    Case("generate-missing-artifact", lambda e: ["generate", e.tmp / "nope.fp16.onnx", "--prompt", "w2"], "not found"),
    Case("generate-prompt-too-long", lambda e: ["generate", DECODER(e), "--prompt", " ".join(["w5"] * 600)],
         "the artifact takes at most"),
    Case("generate-file-not-utf8", lambda e: ["generate", DECODER(e), "--file", e.file("p.txt", NOT_UTF8)],
         "cannot read --file"),
    Case("generate-no-new-tokens", lambda e: ["generate", DECODER(e), "--prompt", "w2", "--max-new-tokens", "0"],
         "--max-new-tokens"),
    Case("generate-top-p-out-of-range", lambda e: ["generate", DECODER(e), "--prompt", "w2", "--top-p", "2"],
         "top_p must be in (0, 1]"),
    Case("generate-tokenizer-dir-without-one", lambda e: ["generate", DECODER(e), "--prompt", "w2",
                                                          "--tokenizer", e.tmp], "no tokenizer.json"),
]

CASES = BUILD + EXPORT + RUN + DIFF + BENCH + FINETUNE + GENERATE


def test_enough_cases():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_cleanly(case: Case, built: Path, tmp_path: Path):
    if case.needs_engine and not (built / "art" / ENGINE).is_file():
        pytest.skip("no TensorRT here to build the tiny engine")
    env = Env(tmp_path, tmp_path / "art", built / "ckpt")
    shutil.copytree(built / "art", env.art)
    if case.prepare:
        case.prepare(env)
    argv = case.argv(env)
    before = files_under(tmp_path)
    r = cli(*argv, cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    lines = failure_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert r.returncode == case.code, (r.returncode, lines[0])
    assert re.match(r"trt-seer( \w+)?: error: ", lines[0]) and case.needle in lines[0], lines[0]
    assert leftovers(tmp_path) == []
    assert files_under(tmp_path) == before, "a failed run wrote or changed files"


def test_an_unexpected_exception_is_one_line_with_exit_4(monkeypatch, capsys):
    """The safety net for bugs: a non-project exception (here planted in `export`'s handler) is one
    line naming its type, exit 4; --debug adds the traceback."""
    import trt_seer.cli.export
    from trt_seer.cli import main
    from trt_seer.errors import EXIT_INTERNAL

    def planted(args):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(trt_seer.cli.export, "run", planted)
    assert main(["export"]) == EXIT_INTERNAL
    assert capsys.readouterr().err == ("trt-seer: internal error: RuntimeError: first line; second line "
                                       "(rerun with --debug for the traceback)\n")
    assert main(["export", "--debug"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "in planted" in err and err.endswith("--debug for the traceback)\n")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_flag_before_or_after_the_command(built, tmp_path, where):
    argv = ["export", "--model", tmp_path / "missing"]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    r = cli(*argv)
    assert r.returncode == 2
    assert "Traceback" in r.stderr and r.stderr.rstrip().splitlines()[-1].startswith("trt-seer: error: model directory")


def test_interrupted_build_leaves_no_partial_file(built, tmp_path):
    """SIGINT as soon as the build starts writing into --out: exit 130, one line, and whatever is
    left in --out is whole (every ONNX graph parses, every JSON loads), no temp file."""
    from trt_seer.export import onnxio

    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "trt_seer", "build", "--model", built / "ckpt", *TINY_PROFILE,
                          "--out", out, "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None and not (out.is_dir() and any(out.iterdir())):
        time.sleep(0.005)
    assert p.poll() is None, "the build ended before it wrote anything"
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=300)
    assert "Traceback" not in stderr, stderr
    assert p.returncode == 130, stderr
    assert failure_lines(stderr) == ["trt-seer: interrupted"], stderr
    assert leftovers(out) == []
    for path in out.iterdir():
        if path.suffix == ".onnx":
            onnxio.check_readable(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())


@pytest.mark.skipif(not HAS_TRT, reason="no TensorRT / TensorRT-RTX importable")
def test_interrupted_engine_build_is_cancelled(built, tmp_path):
    """SIGINT while TensorRT builds (Python would raise KeyboardInterrupt inside a TensorRT
    callback, which TensorRT swallows): the build is cancelled, exit 130, no engine, no temp file."""
    out = tmp_path / "out"
    shutil.copytree(built / "art", out)  # ONNX up to date: the FP32 engine build starts at once
    p = subprocess.Popen([sys.executable, "-m", "trt_seer", "build", "--model", built / "ckpt", "--fp32",
                          *TINY_PROFILE, "--opt-level", "5", "--out", out],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(iter(p.stderr.readline, "")))
    reader.start()
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and not any("building the fp32" in s for s in seen):
        time.sleep(0.005)
    time.sleep(0.2)  # into TensorRT's build
    p.send_signal(signal.SIGINT)
    p.wait(timeout=300)
    reader.join()
    stderr = "".join(seen)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and failure_lines(stderr) == ["trt-seer: interrupted"], stderr
    assert not (out / "ckpt.fp32.engine").exists() and not (out / "ckpt.fp32.manifest.json").exists()
    assert leftovers(out) == []
