"""The C ABI: libtrt_seer.so and trt_seer_example compiled with the system `cc`, run on a tiny BERT
exported to ONNX, against Python's `trt_seer.runtime.load(...).infer(...)` on the same inputs;
error paths from C (tests/capi_errors.c); an engine on TensorRT (gpu)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from trt_seer.errors import DependencyError

HERE = Path(__file__).resolve().parent
NO_CC = shutil.which(os.environ.get("CC") or "cc") is None
needs_cc = pytest.mark.skipif(NO_CC, reason="no C compiler (cc or $CC) on PATH")
needs_libpython = pytest.mark.skipif(not sysconfig.get_config_var("Py_ENABLE_SHARED"),
                                     reason="this Python has no shared libpython to embed")
pytestmark = [needs_cc, needs_libpython]
OPTIONS = '{"threads": 1}'  # one intra-op thread on both sides: the same arithmetic, bit for bit


def build_library(out: Path):
    """The library and the example in `out`, built by the command README.md gives."""
    from trt_seer.capi.build import Built

    r = subprocess.run([sys.executable, "-m", "trt_seer.capi.build", "--out", str(out), "--example"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    printed = dict(line.split(":", 1) for line in r.stdout.splitlines())
    built = Built(Path(printed["library"].strip()), out / "trt_seer.h", Path(printed["example"].strip()),
                  printed["CFLAGS"].strip(), printed["LDFLAGS"].strip())
    assert built.library == out.resolve() / "libtrt_seer.so" and built.header.is_file()
    return built


def export_tiny_bert(root: Path) -> Path:
    """A tiny BERT (feature-extraction: last_hidden_state, sentence_embedding) as ONNX in `root`."""
    from tiny import make_tiny_checkpoint
    from trt_seer.export.checkpoint import onnx_from_checkpoint
    from trt_seer.export.families import resolve_model

    ckpt = make_tiny_checkpoint("bert", "feature-extraction", root / "ckpt")
    dest = root / "tiny.fp32.onnx"
    onnx_from_checkpoint(resolve_model(ckpt), dest)
    return dest


CTYPES_STRUCTS = """class Input(c.Structure):
    _fields_ = [("name", c.c_char_p), ("dtype", c.c_int), ("ndim", c.c_int32),
                ("shape", c.POINTER(c.c_int64)), ("data", c.c_void_p)]
class Output(c.Structure):
    _fields_ = [("name", c.c_char_p), ("data", c.c_void_p), ("capacity_bytes", c.c_size_t),
                ("dtype", c.c_int), ("ndim", c.c_int32), ("shape", c.c_int64 * 8)]
"""  # trt_seer.h's input and output structs for ctypes scripts (`import ctypes as c` first)


def example_feeds(model, batch: int, seq: int) -> dict:
    """The inputs example.c makes (its header comment says how)."""
    b, s = np.meshgrid(np.arange(batch), np.arange(seq), indexing="ij")
    values = {"input_ids": (b * 31 + s * 7) % 97 + 3, "attention_mask": ~((b % 2 == 1) & (s == seq - 1))}
    return {i.name: values.get(i.name, np.zeros_like(b)).astype(i.dtype) for i in model.inputs}


def run_example(built, *args, env=None):
    return subprocess.run([str(built.example), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def parse_outputs(stdout: str) -> dict:
    """{name: (dtype, shape, first values)} from the example's `name dtype [dims]: v v v` lines."""
    found = {}
    for m in re.finditer(r"^(\S+) (\S+) \[([\d, ]*)\]: (.*)$", stdout, re.M):
        found[m[1]] = (m[2], [int(d) for d in m[3].split(",")], [float(v) for v in m[4].split()])
    return found


def test_example_prints_the_io_and_returns_what_python_returns(built, tiny_onnx, tmp_path):
    from trt_seer.runtime import load

    batch, seq = 3, 7
    r = run_example(built, tiny_onnx, "--batch", batch, "--seq", seq, "--options", OPTIONS, "--dump", tmp_path)
    assert r.returncode == 0, r.stderr
    with load(tiny_onnx, threads=1) as m:
        want = m.infer(example_feeds(m, batch, seq))
        lines = [f"{kind} {s.name} {s.dtype} {list(s.shape)}" for kind, specs in
                 (("input", m.inputs), ("output", m.outputs)) for s in specs]
    assert "backend onnxruntime" in r.stdout and "prepared call: the same outputs" in r.stdout
    for line in lines:
        assert line in r.stdout
    printed = parse_outputs(r.stdout)
    assert sorted(printed) == sorted(want) == ["last_hidden_state", "sentence_embedding"]
    for name, value in want.items():
        dtype, shape, first = printed[name]
        assert (dtype, shape) == (value.dtype.name, list(value.shape))
        assert np.array_equal(np.float32(first), value.ravel()[:6])  # %.9g round-trips a float32
        got = np.fromfile(tmp_path / f"{name}.bin", dtype=value.dtype).reshape(value.shape)
        np.testing.assert_array_equal(got, value)


def test_the_c_client_in_docs_runtime_md_runs_as_written(built, tiny_onnx, tmp_path):
    from trt_seer.runtime import load

    doc = (HERE.parent / "docs" / "RUNTIME.md").read_text()
    (src,) = re.findall(r"^```c\n(.*?)^```", doc, flags=re.S | re.M)
    (tmp_path / "client.c").write_text(src)
    cmd = [shutil.which(os.environ.get("CC") or "cc"), "-std=c11", "-Wall", "-Werror", *built.cflags.split(),
           str(tmp_path / "client.c"), "-o", str(tmp_path / "client"), *built.ldflags.split()]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    r = subprocess.run([str(tmp_path / "client"), str(tiny_onnx)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids = 101 + np.arange(16, dtype=np.int64).reshape(2, 8)
    with load(tiny_onnx) as m:
        want = m.infer({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["last_hidden_state float32 [2, 8, 32]",
                                                  "sentence_embedding float32 [2, 32]"]
    for line, value in zip(lines, want.values()):  # default threads: equal to float32 rounding
        np.testing.assert_allclose(np.float32(line.split(": ")[1]), value.ravel()[0], rtol=1e-5, atol=1e-6)


def test_open_and_run_import_no_torch(built, tiny_onnx):
    """What the library imports to open and run a model, seen from a Python host (the embedded
    interpreter ignores PYTHONPROFILEIMPORTTIME like every PYTHON* variable)."""
    script = f"""
import ctypes, sys
lib = ctypes.CDLL({str(built.library)!r})
model = ctypes.c_void_p()
assert lib.trt_seer_open({str(tiny_onnx).encode()!r}, None, None, ctypes.byref(model)) == 0
print(" ".join(sorted(sys.modules)))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    imported = set(r.stdout.split())
    assert "onnxruntime" in imported and "trt_seer.capi.bridge" in imported  # the listing is real
    heavy = sorted(n for n in imported if n.split(".")[0] in ("torch", "transformers", "onnx"))
    assert heavy == []


def test_example_times_repeated_calls(built, tiny_onnx):
    r = run_example(built, tiny_onnx, "--options", OPTIONS, "--repeat", 20)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^per call: \d+\.\d us \(mean of 20\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^per prepared call: \d+\.\d us \(mean of 20\)$", r.stdout, re.M), r.stdout
    opened = re.search(r"^first open: (\d+) ms, resident memory \+(\d+) MB$", r.stdout, re.M)
    assert opened and int(opened[1]) > 0 and int(opened[2]) > 10, r.stdout  # an interpreter and ONNX Runtime


def test_example_asks_for_one_output(built, tiny_onnx):
    r = run_example(built, tiny_onnx, "--options", OPTIONS, "--output", "sentence_embedding", "--repeat", 5)
    assert r.returncode == 0, r.stderr
    assert sorted(parse_outputs(r.stdout)) == ["sentence_embedding"] and "prepared call: the same outputs" in r.stdout
    r = run_example(built, tiny_onnx, "--output", "pooler_output")
    assert r.returncode == 2 and r.stderr == "the model has no output pooler_output\n"


def test_missing_artifact_exits_with_the_status_and_one_line(built, tmp_path):
    r = run_example(built, tmp_path / "absent.fp32.onnx")
    assert r.returncode == 1  # TRT_SEER_E_INPUT
    assert r.stderr == f"error 1: ONNX file not found: {tmp_path / 'absent.fp32.onnx'}\n"
    assert r.stdout == ""


@pytest.fixture(scope="module")
def errors_program(built, tmp_path_factory):
    exe = tmp_path_factory.mktemp("errors") / "capi_errors"
    cmd = [shutil.which(os.environ.get("CC") or "cc"), "-std=c11", "-Wall", "-Werror", *built.cflags.split(),
           str(HERE / "capi_errors.c"), "-o", str(exe), *built.ldflags.split(), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def test_error_paths_return_a_status_and_one_line_message(errors_program, tiny_onnx):
    r = subprocess.run([str(errors_program), str(tiny_onnx)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert all(len(row) == 3 for row in rows), r.stdout  # a newline inside a message would break a row
    cases = {name: (int(status), message) for name, status, message in rows}
    expected = {  # case: (status, words the message must hold)
        "missing_file": (1, "ONNX file not found: /nonexistent/model.fp32.onnx"),
        "bad_backend": (1, "unknown backend 'cuda'"),
        "bad_options": (1, "options are not JSON"),
        "unknown_option": (1, "unknown load option(s) threadz"),
        "null_model": (1, "model is NULL"),
        "info_range": (1, "input index 99 is out of range: the model has 3"),
        "wrong_name": (1, "missing input(s) input_ids"),
        "wrong_rank": (1, "input input_ids has rank 1 (shape [8])"),
        "batch_mismatch": (1, "disagree on the batch axis: 2 vs 1"),
        "wrong_dtype": (1, "input input_ids has dtype int32; the model takes int64"),
        "null_data": (1, "input input_ids has no data"),
        "missing_input": (1, "missing input(s) token_type_ids"),
        "small_buffer": (4, "output sentence_embedding is float32[2, 32] = 256 bytes; its buffer holds 4"),
        "unknown_output": (1, "unknown output pooler_output"),
        "prepare_dtype": (1, "input input_ids has dtype int32; the model takes int64"),
        "prepare_batch_mismatch": (1, "disagree on the batch axis: 2 vs 1"),
        "prepared_other_shape": (1, "input input_ids has shape [1, 4]; this call was prepared for [2, 4]"),
        "prepared_other_dtype": (1, "input input_ids has dtype int32; this call takes int64"),
        "prepared_other_order": (1, "input entry 0 is attention_mask; this call was prepared with input_ids there"),
        "prepared_small_buffer": (4, "output sentence_embedding is float32[2, 32] = 256 bytes; its buffer holds 4"),
        "prepared_missing_output": (1, "this call was prepared to return 1 outputs; got 0 entries"),
    }
    for case, (status, words) in expected.items():
        assert cases[case][0] == status, (case, cases[case])
        assert words in cases[case][1], (case, cases[case])
    for case in ("open", "run", "run_again", "prepare", "prepared_run", "prepared_close", "close"):  # successes clear the thread's message
        assert cases[case] == (0, ""), (case, cases[case])
    assert cases["thread_sees"] == (0, "")  # another thread's last error is its own
    assert cases["threads_agree"] == (0, "")  # 4 threads x 20 calls on one model, same answer
    assert cases["prepare_shape"] == (2, "float32 [2, 32]")  # prepare() sets the output entry's shape


def test_library_joins_the_interpreter_of_a_python_host(built, tiny_onnx):
    """Loaded into a Python process (ctypes here; an extension module alike), the library uses the
    host's interpreter instead of starting its own."""
    script = f"""
import ctypes
lib = ctypes.CDLL({str(built.library)!r})
lib.trt_seer_last_error.restype = ctypes.c_char_p
model, n = ctypes.c_void_p(), ctypes.c_int32()
print(lib.trt_seer_open(b"/nonexistent.onnx", None, None, ctypes.byref(model)), lib.trt_seer_last_error().decode())
print(lib.trt_seer_open({str(tiny_onnx).encode()!r}, None, None, ctypes.byref(model)), lib.trt_seer_last_error().decode())
lib.trt_seer_num_outputs(model, ctypes.byref(n))
print(n.value, lib.trt_seer_close(model))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1 ONNX file not found: /nonexistent.onnx", "0 ", "2 0"]


def flatten_graph(path: Path) -> Path:
    """input_ids [batch, seq] -> flat = float(input_ids).reshape(-1): an output axis (batch * seq)
    that no input axis names."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Reshape", ["input_ids", "minus_one"], ["r"]),
             helper.make_node("Cast", ["r"], ["flat"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "flatten", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                               ["batch", "seq"])],
                              [helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_output_shape_the_inputs_do_not_give_is_read_after_the_run(built, tmp_path):
    """Through ctypes (what a Rust or Go binding does by hand): the query names the axis it cannot
    size; a run into a generous buffer returns the real shape."""
    graph = flatten_graph(tmp_path / "flatten.onnx")
    script = f"""
import ctypes as c
import numpy as np
{CTYPES_STRUCTS}lib = c.CDLL({str(built.library)!r})
lib.trt_seer_last_error.restype = c.c_char_p
m = c.c_void_p()
assert lib.trt_seer_open({str(graph).encode()!r}, None, None, c.byref(m)) == 0
ids = np.arange(6, dtype=np.int64).reshape(2, 3)
shape = (c.c_int64 * 2)(2, 3)
inp = Input(b"input_ids", 4, 2, shape, ids.ctypes.data)
buf = np.zeros(64, np.float32)
out = Output(b"flat", buf.ctypes.data, buf.nbytes)
print(lib.trt_seer_output_shapes(m, 1, c.byref(inp), 1, c.byref(out)), lib.trt_seer_last_error().decode())
print(lib.trt_seer_run(m, 1, c.byref(inp), 1, c.byref(out)), out.dtype, list(out.shape[:out.ndim]), buf[:7].tolist())
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    query, run = r.stdout.splitlines()
    assert query.startswith("1 output flat axis 0 does not follow from the input shapes")
    assert run == "0 0 [6] [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0]"


def test_engine_without_a_usable_tensorrt_falls_back_to_its_onnx_like_python(built, tiny_onnx, tmp_path):
    from trt_seer.runtime import tensorrt_unavailable_reason

    if tensorrt_unavailable_reason() is None:
        pytest.skip("TensorRT runs engines here, so an engine does not fall back")
    engine = tmp_path / "tiny.fp32.engine"
    engine.write_bytes(b"not an engine: TensorRT is not usable here, so it is never read")
    shutil.copy(tiny_onnx, tmp_path / "tiny.fp32.onnx")
    r = run_example(built, engine, "--options", OPTIONS)
    assert r.returncode == 0, r.stderr
    assert "backend onnxruntime" in r.stdout
    assert "running tiny.fp32.onnx on ONNX Runtime (CPU) instead of tiny.fp32.engine" in r.stderr
    r = run_example(built, engine, "--backend", "tensorrt")
    assert r.returncode == 3 and r.stderr.startswith("error 3: cannot run tiny.fp32.engine on TensorRT")


def test_header_compiles_as_cplusplus_and_links(built, tmp_path):
    cxx = shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (c++) on PATH")
    src = tmp_path / "use.cpp"
    src.write_text('#include "trt_seer.h"\n#include <cstdio>\nint main() {\n'
                   '  trt_seer_model *m = nullptr;\n'
                   '  trt_seer_status s = trt_seer_open("/nonexistent.onnx", nullptr, nullptr, &m);\n'
                   '  std::printf("%d %s\\n", int(s), trt_seer_last_error());\n  return m != nullptr;\n}\n')
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", *built.cflags.split(), str(src), "-o",
                    str(tmp_path / "use"), *built.ldflags.split()], check=True, capture_output=True)
    r = subprocess.run([str(tmp_path / "use")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "1 ONNX file not found: /nonexistent.onnx\n", r


def test_build_names_a_missing_compiler(tmp_path):
    from trt_seer.capi.build import build

    with pytest.raises(DependencyError, match="no C compiler 'no-such-cc'"):
        build(tmp_path, cc="no-such-cc")
    r = subprocess.run([sys.executable, "-m", "trt_seer.capi.build", "--out", str(tmp_path), "--cc", "no-such-cc"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no C compiler" in r.stderr
    assert not (tmp_path / "libtrt_seer.so").exists()


# --- an engine on TensorRT -----------------------------------------------------------------------

@pytest.mark.gpu
def test_example_runs_an_engine_on_tensorrt_like_python(built, tmp_path):
    from tiny import make_tiny_checkpoint
    from trt_seer.runtime import load, tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no TensorRT that runs engines here: {reason}")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "ckpt")
    out = tmp_path / "engines"
    cmd = [sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp32", "--batch", "1,2,4",
           "--seq", "4,8,16", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    engine = next(out.glob("*.fp32.engine"))
    dump = tmp_path / "dump"
    dump.mkdir()
    r = run_example(built, engine, "--backend", "tensorrt", "--batch", 3, "--seq", 7, "--dump", dump)
    assert r.returncode == 0, r.stderr
    assert "backend tensorrt" in r.stdout and "prepared call: the same outputs" in r.stdout
    with load(engine, backend="tensorrt") as m:
        want = m.infer(example_feeds(m, 3, 7))
    for name, value in want.items():
        got = np.fromfile(dump / f"{name}.bin", dtype=value.dtype).reshape(value.shape)
        # Two processes may pick different kernels (TensorRT-RTX compiles them at run time).
        np.testing.assert_allclose(got, value, rtol=1e-4, atol=1e-5)
