"""The C ABI in a long-running service, on a tiny BERT on ONNX Runtime (CPU): bad data refused
before any work with nothing on stderr and no caller buffer written; the embedded Python isolated
from the service's PYTHON* variables; close, shutdown and exit racing calls in other threads, and
fork after open, run clean under AddressSanitizer (tests/capi_service.c); C computes only the
outputs it asks for. The Python side of the same validation is tested here too."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_capi import (
    CTYPES_STRUCTS,
    needs_cc,
    needs_libpython,
    run_example,
)

from trt_seer.errors import InputError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CC = shutil.which(os.environ.get("CC") or "cc")
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=0"}  # the embedded interpreter is never finalized: all "leaks"


def asan_works(tmp: Path) -> bool:
    if CC is None:
        return False
    src = tmp / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    r = subprocess.run([CC, "-fsanitize=address", str(src), "-o", str(tmp / "probe")], capture_output=True)
    return r.returncode == 0 and subprocess.run([str(tmp / "probe")]).returncode == 0


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """tests/capi_service.c linked with libtrt_seer.so, both built with AddressSanitizer."""
    from trt_seer.capi.build import build

    out = tmp_path_factory.mktemp("asan")
    if not asan_works(out):
        pytest.skip(f"{CC} cannot build with -fsanitize=address here")
    lib = build(out / "lib", sanitize="address")
    exe = out / "capi_service"
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsanitize=address", "-fno-omit-frame-pointer",
                    "-g", *lib.cflags.split(), str(HERE / "capi_service.c"), "-o", str(exe), *lib.ldflags.split(),
                    "-lpthread"], check=True, capture_output=True, text=True)
    return exe


def run_service(exe: Path, artifact: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), str(artifact), mode], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ASAN_ENV})


def rows(stdout: str) -> dict:
    found = {}
    for line in stdout.splitlines():
        case, status, message = line.split("\t")
        found[case] = (int(status), message)
    return found


pytestmark = [needs_cc, needs_libpython]


def test_bad_data_and_short_buffers_fail_before_any_work(service, tiny_onnx):
    r = run_service(service, tiny_onnx, "bad")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]  # nothing on the service's stderr
    cases = rows(r.stdout)
    table = "the model's table has 128 ids (0..127)"
    expected = {
        "id_too_large": (1, f"input input_ids holds 50000 at [0, 3]; {table}"),
        "id_negative": (1, "input input_ids holds -1 at [1, 1]; token ids are never negative"),
        "too_long": (1, "input input_ids has shape [2, 200]: 200 positions; the model has 128"),
        "small_second_buffer": (4, "output sentence_embedding is float32[2, 32] = 256 bytes; its buffer holds 16"),
        "prepared_id_too_large": (1, f"input input_ids holds 128 at [1, 7]; {table}"),
        "prepared_id_negative": (1, "input input_ids holds -7 at [0, 0]; token ids are never negative"),
        "prepared_small_second_buffer": (4, ("output sentence_embedding is float32[2, 32] = 256 bytes; its "
                                             "buffer holds 16")),
        "threads_string": (1, 'option threads must be int, got "2"'),
        "null_shape": (1, "input input_ids has ndim 2 and no shape"),
        "input_info": (0, "input_ids max [-1, 128]"),  # the positions bound the seq axis in C too
    }
    for case, (status, words) in expected.items():
        assert cases[case][0] == status and words in cases[case][1], (case, cases[case])
    for case in ("prepare", "prepared_run", "prepared_close", "run", "close"):
        assert cases[case] == (0, ""), (case, cases[case])
    assert cases["untouched"] == (0, "")  # no failed call wrote any byte of any output buffer


def test_python_infer_refuses_the_same_data_before_onnxruntime(tiny_onnx, capfd):
    from trt_seer.runtime import load

    ids = np.full((2, 8), 5, np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    with load(tiny_onnx, threads=1) as m:
        for name, value, words in (("input_ids", 50000, "holds 50000 at [0, 3]"),
                                   ("input_ids", -1, "token ids are never negative"),
                                   ("token_type_ids", 2, "the model's table has 2 ids")):
            bad = feeds[name].copy()
            bad[0, 3] = value
            with pytest.raises(InputError, match=words.replace("[", r"\[").replace("]", r"\]")):
                m.infer({**feeds, name: bad}, outputs=["sentence_embedding"])
        long = np.ones((1, 129), np.int64)
        with pytest.raises(InputError, match="129 positions; the model has 128"):
            m.infer({"input_ids": long, "attention_mask": long, "token_type_ids": 0 * long})
        with m.prepare({k: v.shape for k, v in feeds.items()}) as call, pytest.raises(InputError, match="holds 128 at"):
            call.run({**feeds, "input_ids": ids + 123})
        assert m.infer(feeds)["sentence_embedding"].shape == (2, 32)  # the good feeds still run
    assert capfd.readouterr().err == ""


def test_limits_come_from_the_record_before_the_graph(tiny_onnx, tmp_path):
    from trt_seer.runtime.limits import limits_from_onnx, token_limits

    assert limits_from_onnx(tiny_onnx).ids == {"input_ids": 128, "token_type_ids": 2}
    assert limits_from_onnx(tiny_onnx).max_positions == 128
    record = {"limits": {"vocab_size": 100, "type_vocab_size": 1, "max_positions": 64}}
    limits = token_limits(record, tiny_onnx)
    assert (limits.ids, limits.max_positions) == ({"input_ids": 100, "token_type_ids": 1}, 64)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff" * 64)
    assert token_limits(None, junk).ids == {}  # an unreadable graph: only the sign is checked


def test_open_ignores_the_services_python_variables(built, tiny_onnx, tmp_path):
    clean = run_example(built, tiny_onnx, "--options", '{"threads": 1}')
    assert clean.returncode == 0, clean.stderr
    hostile = {"PYTHONHOME": str(tmp_path / "nowhere"), "PYTHONPATH": str(tmp_path / "elsewhere"),
               "PYTHONWARNINGS": "error", "PYTHONSAFEPATH": "", "PYTHONNOUSERSITE": ""}
    r = run_example(built, tiny_onnx, "--options", '{"threads": 1}', env=hostile)
    assert (r.returncode, r.stdout, r.stderr) == (0, clean.stdout, "")


def test_another_python_than_the_built_one_is_refused_in_one_line(built, tiny_onnx):
    r = run_example(built, tiny_onnx, env={"TRT_SEER_PYTHON": "/usr/bin/python3.9"})
    assert r.returncode == 7 and r.stdout == "" and r.stderr.count("\n") == 1, r
    assert r.stderr.startswith("error 7: TRT_SEER_PYTHON=/usr/bin/python3.9 names another Python than the one "
                               f"this library was built for ({sys.executable})")


def test_close_while_other_threads_run_is_clean_under_asan(service, tiny_onnx):
    r = run_service(service, tiny_onnx, "close")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    cases = rows(r.stdout)
    assert cases["close"] == (0, "") and cases["close_again"] == (0, "")
    assert cases["late_run"] == (1, "the model is closed") and cases["late_num_inputs"] == (1, "the model is closed")
    assert cases["calls"][0] == 0, cases["calls"]  # every call either ran or was refused as closed


@pytest.mark.parametrize(("mode", "attempt"), [("exit", 1), ("exit", 2), ("exit", 3), ("shutdown", 1)])
def test_returning_from_main_with_calls_in_flight_is_clean_under_asan(service, tiny_onnx, mode, attempt):
    r = run_service(service, tiny_onnx, mode)
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr[-3000:])
    cases = rows(r.stdout)
    assert cases["returning"] == (0, "")
    if mode == "shutdown":
        assert cases["shutdown"] == (0, "")
        assert cases["after_shutdown"] == (1, "trt_seer_shutdown was called; the library takes no more calls")


def test_fork_after_open_is_refused_in_the_child(service, tiny_onnx):
    r = run_service(service, tiny_onnx, "fork")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    cases = rows(r.stdout)
    for case in ("child_run", "child_open"):
        assert cases[case][0] == 6 and "this process was forked after trt_seer_open" in cases[case][1], cases[case]
    assert cases["parent_run"] == (0, "") and cases["close"] == (0, "")


def test_c_asks_infer_only_for_the_outputs_it_wants(built, tiny_onnx):
    """Through a Python host, whose interpreter the library joins: the bridge's Handle is the real
    model; a recording wrapper around its infer shows which outputs C asked for."""
    script = f"""
import ctypes as c, json
import numpy as np
from trt_seer.capi import bridge
asked = []
class Recording(bridge.Handle):
    def __init__(self, model):
        super().__init__(model)
        infer = model.infer
        def recorded(feeds, outputs=None, **kw):
            asked.append(outputs)
            return infer(feeds, outputs=outputs, **kw)
        model.infer = recorded
bridge.Handle = Recording
{CTYPES_STRUCTS}lib = c.CDLL({str(built.library)!r})
m = c.c_void_p()
assert lib.trt_seer_open({str(tiny_onnx).encode()!r}, None, None, c.byref(m)) == 0
ids = np.full((2, 8), 7, np.int64)
arrays = [ids, np.ones_like(ids), np.zeros_like(ids)]
shape = (c.c_int64 * 2)(2, 8)
ins = (Input * 3)(*[Input(n, 4, 2, shape, a.ctypes.data) for n, a in
                    zip((b"input_ids", b"attention_mask", b"token_type_ids"), arrays)])
emb = np.zeros((2, 32), np.float32)
out = Output(b"sentence_embedding", emb.ctypes.data, emb.nbytes)
assert lib.trt_seer_run(m, 3, ins, 1, c.byref(out)) == 0
print(json.dumps(asked), float(np.abs(emb).sum()) > 0)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [json.dumps([["sentence_embedding"]]), "True"]


def test_bench_capi_compares_c_and_python_asking_for_the_same_output(tiny_onnx, tmp_path):
    bench = HERE.parent / "tools" / "bench_capi.py"
    md = tmp_path / "BENCHMARKS.md"
    r = subprocess.run([sys.executable, str(bench), str(tiny_onnx), "--calls", "20", "--rounds", "1",
                        "--append", str(md)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for path in ("C trt_seer_run", "C trt_seer_prepared_run", "Python infer(outputs=[output])",
                 "Python prepared(outputs=[output]).run(feeds)", "ONNX Runtime session.run([output])"):
        assert f"| {path} | " in r.stdout, path
    assert "only `sentence_embedding` asked for on every path" in r.stdout
    assert "C over Python infer: trt_seer_run " in r.stdout and "(budget: +30 us)" in r.stdout
    assert re.search(r"First trt_seer_open .*: \d+ ms, resident memory \+\d+ MB", r.stdout)
    section = md.read_text()
    assert "## C ABI vs Python infer, tiny.fp32.onnx on onnxruntime, only sentence_embedding" in section
    assert "- Command: `PYTHONPATH=. python tools/bench_capi.py " in section


@needs_cc
@needs_libpython
def test_a_sitecustomize_on_the_builds_path_runs_in_the_embedded_python(tiny_onnx, tmp_path):
    """A start-up hook that the building interpreter ran from PYTHONPATH (as a site's GPU or
    proxy setup does) runs in the isolated embedded interpreter too, ahead of any other."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, pathlib\n"
        "if os.environ.get('HOOK_MARK'):\n"
        "    pathlib.Path(os.environ['HOOK_MARK']).write_text('ran')\n")
    out = tmp_path / "lib"
    r = subprocess.run([sys.executable, "-m", "trt_seer.capi.build", "--out", str(out), "--example"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)])})
    assert r.returncode == 0, r.stderr
    mark = tmp_path / "mark"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(out / "trt_seer_example"), str(tiny_onnx), "--options", '{"threads": 1}'],
                         capture_output=True, text=True, timeout=300, env={**env, "HOOK_MARK": str(mark)})
    assert run.returncode == 0, run.stderr
    assert mark.read_text() == "ran"


RUN_CACHE_SCRIPT = """
import ctypes as c, json
import numpy as np
from trt_seer.capi import bridge
from trt_seer.runtime import load
from trt_seer.runtime.prepared import PreparedCall
seen = {{"plain": 0, "made": 0, "closed": 0}}
plain, prepare_for_run, close = bridge.run, bridge.prepare_for_run, PreparedCall.close
def counted_plain(*args):
    seen["plain"] += 1
    return plain(*args)
def counted_prepare(*args):
    made = prepare_for_run(*args)
    seen["made"] += made is not None
    return made
def counted_close(self):
    seen["closed"] += 1
    close(self)
bridge.run, bridge.prepare_for_run, PreparedCall.close = counted_plain, counted_prepare, counted_close
{structs}lib = c.CDLL({library!r})
lib.trt_seer_last_error.restype = c.c_char_p
m = c.c_void_p()
assert lib.trt_seer_open({artifact!r}, b"onnxruntime", b'{{"threads": 1}}', c.byref(m)) == 0
python = load({artifact!r}.decode(), threads=1)
NAMES = ("input_ids", "attention_mask", "token_type_ids")
def feeds(ids):
    return dict(zip(NAMES, (ids, np.ones_like(ids), np.zeros_like(ids))))
def run(ids, wanted=("sentence_embedding",), capacity=None):
    arrays = list(feeds(ids).values())
    shape = (c.c_int64 * 2)(*ids.shape)
    ins = (Input * 3)(*[Input(n.encode(), 4, 2, shape, a.ctypes.data) for n, a in zip(NAMES, arrays)])
    bufs = [np.full(4 * ids.size * 32, 0xAB, np.uint8) for _ in wanted]  # holds either output
    outs = (Output * len(wanted))(*[Output(n and n.encode(), b.ctypes.data, capacity or b.nbytes)
                                    for n, b in zip(wanted, bufs)])
    before = seen["plain"]
    status = lib.trt_seer_run(m, 3, ins, len(wanted), outs)
    got = [b[:4 * int(np.prod(o.shape[:o.ndim]))].view(np.float32).reshape(o.shape[:o.ndim]) for b, o in zip(bufs, outs)]
    return dict(status=status, error=lib.trt_seer_last_error().decode(), plain=seen["plain"] > before,
                untouched=all(bool((b == 0xAB).all()) for b in bufs), got=got)
def same(r, ids, names=("sentence_embedding",)):
    want = python.infer(feeds(ids), outputs=list(names))
    return r["status"] == 0 and all(np.array_equal(g, want[n]) and g.dtype == want[n].dtype for g, n in zip(r["got"], names))
a = np.arange(16, dtype=np.int64).reshape(2, 8) % 50 + 5
b = a[:1, :5].copy()
report = {{}}
first = [run(a) for _ in range(3)]
report["first_three"] = [[r["plain"], same(r, a)] for r in first]
report["made"] = seen["made"]
for name, bad in (("id_too_large", 50000), ("id_negative", -1)):
    ids = a.copy()
    ids[1, 2] = bad
    r = run(ids)
    report[name] = [r["status"], r["error"], r["untouched"], r["plain"]]
r = run(a, capacity=16)
report["small_buffer"] = [r["status"], r["error"], r["untouched"], r["plain"]]
report["other_shape"] = [[r["plain"], same(r, b)] for r in (run(b), run(b))]
report["back"] = [[r["plain"], same(r, a)] for r in (run(a), run(a))]
for _ in range(100):  # the cached call has served its keep: another key may replace it
    assert same(run(a), a)
both = ("last_hidden_state", "sentence_embedding")
r = [run(b, wanted=(None, None)) for _ in range(3)]  # by index: both outputs
report["by_index"] = [[x["plain"], same(x, b, both)] for x in r]
report["replaced"] = [seen["made"], seen["closed"]]
r = run(a)
report["old_key_after"] = [r["plain"], same(r, a)]
report["close"] = [lib.trt_seer_close(m), lib.trt_seer_last_error().decode(), seen["closed"]]
r = run(a)
report["late_run"] = [r["status"], r["error"], r["untouched"]]
print(json.dumps(report))
"""


def test_run_reuses_a_prepared_call_for_a_repeated_key_with_the_same_checks(built, tiny_onnx):
    """trt_seer_run's cache (trt_seer.c, "the run cache"), seen from a Python host through a count of
    the bridge's plain runs: the third identical call runs through the cached prepared call and
    returns the bits Python's infer returns; bad token ids and a short buffer of that key still fail
    before any work with the plain path's words; other shapes and outputs take the plain path until
    the cache has served enough to make another call; close releases it."""
    script = RUN_CACHE_SCRIPT.format(structs=CTYPES_STRUCTS, library=str(built.library),
                                     artifact=str(tiny_onnx).encode())
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    got = json.loads(r.stdout)
    table = "the model's table has 128 ids (0..127)"
    assert got["first_three"] == [[True, True], [True, True], [False, True]]  # made after the 2nd
    assert got["made"] == 1
    assert got["id_too_large"] == [1, f"input input_ids holds 50000 at [1, 2]; {table}: tokenize with the "
                                   "model's own tokenizer", True, True]
    assert got["id_negative"] == [1, "input input_ids holds -1 at [1, 2]; token ids are never negative", True, True]
    assert got["small_buffer"] == [4, "output sentence_embedding is float32[2, 32] = 256 bytes; its buffer holds 16",
                                   True, True]
    assert got["other_shape"] == [[True, True], [True, True]]  # too soon to replace the cached call
    assert got["back"] == [[False, True], [False, True]]  # still cached
    assert got["by_index"] == [[True, True], [True, True], [False, True]]  # replaced it
    assert got["replaced"] == [2, 1]
    assert got["old_key_after"] == [True, True]
    assert got["close"] == [0, "", 2]  # the cached call is closed with the model
    assert got["late_run"] == [1, "the model is closed", True]


def test_the_run_cache_under_threads_is_clean_under_asan(service, tiny_onnx):
    """4 threads run two shapes in turns, with bad token ids among them: the cached call is taken by
    one thread at a time (the others run the plain path), made again for the other shape as the rules
    allow, and every output equals the first, uncached run's bit for bit; close releases the cached
    call. capi_service.c's `cache` mode."""
    r = run_service(service, tiny_onnx, "cache")
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    cases = rows(r.stdout)
    assert cases["first_a"] == (0, "") and cases["first_b"] == (0, "")
    assert cases["threads"] == (0, "wrong 0 refused 36 failed 0")  # 4 threads x 9 bad ids, all refused
    assert cases["close"] == (0, "") and cases["late_run"] == (1, "the model is closed")


ENGINE_CACHE_SCRIPT = """
import ctypes as c, json, sys, time
import numpy as np
import pytest
sys.path.insert(0, {tests!r})
import test_runtime_engine_sim as sim
from trt_seer.capi import bridge
models, seen = [], {{"plain": 0}}
def load(path, backend="auto", **options):  # the simulated engine, its later contexts as slow as a GPU's
    m = sim.simulated_encoder(pytest.MonkeyPatch())
    make = m.new_context
    def slow_context():
        time.sleep(0.03)
        return make()
    m.new_context = slow_context
    models.append(m)
    return m
plain = bridge.run
def counted_plain(*args):
    seen["plain"] += 1
    return plain(*args)
bridge.load, bridge.run = load, counted_plain
{structs}lib = c.CDLL({library!r})
lib.trt_seer_last_error.restype = c.c_char_p
m = c.c_void_p()
assert lib.trt_seer_open(b"sim.engine", b"tensorrt", b'{{"threads": 1}}', c.byref(m)) == 0
model = models[0]
NAMES = sim.ENCODER_INPUTS
def inputs(ids, mask=None, types=None):  # as example.c makes them: ids, a mask that pads, zeros
    arrays = [ids, np.ones_like(ids) if mask is None else mask, np.zeros_like(ids) if types is None else types]
    shape = (c.c_int64 * 2)(*ids.shape)
    return (Input * 3)(*[Input(n.encode(), 4, 2, shape, a.ctypes.data) for n, a in zip(NAMES, arrays)]), arrays
def stats():
    counts = [c.c_uint64() for _ in range(3)]
    assert lib.trt_seer_run_cache_stats(m, *[c.byref(x) for x in counts]) == 0
    return [x.value for x in counts]
def run(ids, **kw):
    ins, arrays = inputs(ids, **kw)
    emb = np.full((ids.shape[0], sim.HIDDEN), -7, np.float32)
    out = Output(b"sentence_embedding", emb.ctypes.data, emb.nbytes)
    before = seen["plain"]
    status = lib.trt_seer_run(m, 3, ins, 1, c.byref(out))
    want = sim.encoder_expected(dict(zip(NAMES, arrays)))["sentence_embedding"]
    return dict(status=status, error=lib.trt_seer_last_error().decode(), plain=seen["plain"] > before,
                right=status == 0 and np.array_equal(emb, want), untouched=bool((emb == -7).all()))
a = np.arange(16, dtype=np.int64).reshape(2, 8) % 50 + 5
pad = np.ones_like(a)
pad[1, -1] = 0
report = {{}}
# example.c's order: the output's shape, one run, an explicit prepared call run twice, then trt_seer_run
ins, _ = inputs(a, mask=pad)
emb = np.zeros((2, sim.HIDDEN), np.float32)
out = Output(b"sentence_embedding", 0, 0)
report["shapes"] = [lib.trt_seer_output_shapes(m, 3, ins, 1, c.byref(out)), list(out.shape[:out.ndim])]
first = run(a, mask=pad)
p = c.c_void_p()
out = Output(b"sentence_embedding", emb.ctypes.data, emb.nbytes)
assert lib.trt_seer_prepare(m, 3, ins, 1, c.byref(out), c.byref(p)) == 0, lib.trt_seer_last_error()
report["prepared"] = [lib.trt_seer_prepared_run(p, 3, ins, 1, c.byref(out)) for _ in range(2)]
loop = [run(a, mask=pad) for _ in range(5)]
report["runs"] = [[r["plain"], r["right"]] for r in [first] + loop]
report["stats"] = stats()
report["contexts"] = len(model.pool.slots)  # the pool's, the explicit call's, the cached call's
bad = np.zeros_like(a)
bad[0, 3] = 2
r = run(a, mask=pad, types=bad)
report["bad_type_id"] = [r["status"], r["error"], r["untouched"], r["plain"]]
r = run(a, mask=np.full_like(a, 3))  # the mask has no table: any value is the model's business
report["mask_values"] = [r["plain"], r["right"]]
for _ in range(150):
    assert run(a, mask=pad)["right"]
b = a[:1].copy()  # the profile takes seq 8..256
report["other_key"] = [[r["plain"], r["right"]] for r in (run(b), run(b), run(b))]
report["stats_after"] = stats()
r = run(a, mask=pad)
report["still_cached"] = [r["plain"], r["right"]]
cached = [s for s in model.pool.slots[1:] if s.context is not None]
report["close"] = [lib.trt_seer_prepared_close(p), lib.trt_seer_close(m), lib.trt_seer_last_error().decode()]
report["freed"] = [len(model.pool.slots), [s.context is None for s in cached]]
report["stats_closed"] = stats()
print(json.dumps(report))
"""


def test_run_cache_on_a_simulated_tensorrt_encoder_as_the_example_runs_it(built):
    """trt_seer_run's cache on the TensorRT backend (engine.py's prepared call on contexts of its own,
    CUDA and TensorRT simulated on CPU as in test_runtime_engine_sim.py): an encoder with three int64
    inputs (token tables for input_ids and token_type_ids, none for the mask), run in example.c's order
    with an explicit prepared call alive. From the second run of the key after it on, runs go through
    the cached call (trt_seer_run_cache_stats counts them) on a third context with the right outputs; a
    bad token_type_ids id is refused in the plain path's words; another key does not replace the cached
    call while its runs have not paid back the time its context took (REPAY_NS); close frees it."""
    script = ENGINE_CACHE_SCRIPT.format(tests=str(HERE), structs=CTYPES_STRUCTS, library=str(built.library))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["shapes"] == [0, [2, 3]]
    assert got["prepared"] == [0, 0]
    assert got["runs"] == [[True, True], [True, True]] + [[False, True]] * 4  # made by the second run
    assert got["stats"] == [4, 1, 1]
    assert got["contexts"] == 3
    assert got["bad_type_id"][0] == 1 and got["bad_type_id"][2:] == [True, True], got["bad_type_id"]
    assert got["bad_type_id"][1].startswith("input token_type_ids holds 2 at [0, 3]"), got["bad_type_id"]
    assert got["mask_values"] == [False, True]
    assert got["other_key"] == [[True, True]] * 3  # 155 cached runs have not paid for a 30 ms context
    assert got["stats_after"] == [155, 1, 1]
    assert got["still_cached"] == [False, True]
    assert got["close"] == [0, 0, ""]
    assert got["freed"] == [0, [True, True]]
    assert got["stats_closed"] == [156, 1, 1]
