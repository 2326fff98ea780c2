"""The streaming decoder build (decoder_build.py), the build plan and its refusals (resources.py),
and the weight map that lets a build drop the FP16 graph's weights (export/weights.py)."""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tiny import make_tiny_checkpoint
from trt_seer.engine import manifest, trt
from trt_seer.resources import StageMeter, weight_sizes

ROOT = Path(__file__).resolve().parents[1]
needs_trt = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
LOOSE_GATE = ("--min-agreement", "0", "--max-ppl-increase", "10")  # random weights: nothing to protect
PROFILE = ("--batch", "1,4,16", "--seq", "8,64,256")
STREAM = "--no-keep-intermediates"  # the streaming order even where no engine runs (the default keeps the graphs)
ENV = {**os.environ, "TQDM_DISABLE": "1"}


def random_checkpoint(shape: str, dest: Path) -> Path:
    spec = importlib.util.spec_from_file_location("random_checkpoint", ROOT / "tools" / "random_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_checkpoint(shape, dest)


def build_polled(*args, out: Path) -> tuple[subprocess.CompletedProcess, int]:
    """`trt-seer build ARGS`, with the disk under `out` sampled every 20 ms from outside: (result, peak)."""
    cmd = [sys.executable, "-m", "trt_seer", "build", *map(str, args), "--out", str(out)]
    with StageMeter("build", out, interval=0.02) as meter:
        r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1500)
    return r, meter.peak_disk


@pytest.fixture(scope="module")
def llama80m(tmp_path_factory) -> Path:
    return random_checkpoint("llama-80m", tmp_path_factory.mktemp("ckpt") / "llama80m")


@pytest.fixture(scope="module")
def streamed(llama80m, tmp_path_factory):
    if not trt.available():
        pytest.skip("no TensorRT / TensorRT-RTX importable")
    out = tmp_path_factory.mktemp("streamed") / "out"
    r, peak = build_polled("--model", llama80m, "--fp16", "--int4", STREAM, *PROFILE, *LOOSE_GATE, out=out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r, peak


@needs_trt
@pytest.mark.slow
def test_80m_decoder_fp16_int4_peaks_under_2_5x_its_fp16_weights(llama80m, streamed):
    out, r, peak = streamed
    fp16_bytes = weight_sizes(llama80m, json.loads((llama80m / "config.json").read_text())).fp16_bytes
    assert 150e6 < fp16_bytes < 170e6  # ~80M parameters
    assert peak <= 2.5 * fp16_bytes, f"peak {peak / fp16_bytes:.2f}x the FP16 weights"
    plan = manifest.read_engine_manifest(out / "llama80m.int4.manifest.json")["build_plan"]
    assert plan["peak_disk_bytes"] >= peak  # the plan that checked the room was not an underestimate
    names = {p.name for p in out.iterdir()}
    assert {"llama80m.fp16.engine", "llama80m.int4.engine", "llama80m.fp16.skeleton.onnx"} <= names
    assert not [n for n in names if "fp32" in n], "a decoder build wrote an FP32 copy"
    assert not [n for n in names if n.endswith((".onnx", ".onnx.data")) and "skeleton" not in n]
    for precision in ("fp16", "int4"):  # records outlive their graphs, marked removed
        assert json.loads((out / f"llama80m.{precision}.onnx.json").read_text())["removed"] is True
    sampler = manifest.read_engine_manifest(out / "llama80m.sampler.float16.manifest.json")  # the device sampler
    vocab = json.loads((llama80m / "config.json").read_text())["vocab_size"]
    assert sampler["sampler"]["vocab"] == vocab and (out / "llama80m.sampler.float16.engine").is_file()


@needs_trt
@pytest.mark.slow
def test_stage_figures_reach_the_log_and_the_manifests(streamed):
    out, r, _ = streamed
    m = manifest.read_engine_manifest(out / "llama80m.int4.manifest.json")
    stages = {s["stage"]: s for s in m["build_stages"]}
    assert {"fp16 onnx", "fp16 engine", "fp16 reference", "int4 onnx", "int4 engine"} <= set(stages)
    for s in stages.values():
        assert s["seconds"] >= 0 and s["peak_rss_bytes"] > 0 and s["written_bytes"] >= 0 and s["peak_disk_bytes"] >= 0
    assert stages["fp16 onnx"]["written_bytes"] > 100e6 and stages["fp16 engine"]["peak_disk_bytes"] > 300e6
    assert r.stderr.count("stage int4 engine:") == 1 and "peak RSS" in r.stderr
    assert "later stages read them from the checkpoint" in r.stderr
    q = json.loads((out / "llama80m.int4.onnx.json").read_text())["quantization"]
    assert q["quantized_gemms"] == 7 * 14 and q["fp16_gemms"] == []  # every block GEMM INT4, head FP16


@needs_trt
@pytest.mark.slow
def test_a_second_build_is_a_cache_hit_without_torch(llama80m, streamed):
    out = streamed[0]
    code = ("import sys, time; from trt_seer.cli import main; t = time.perf_counter(); "
            f"rc = main(['build', '--model', {str(llama80m)!r}, '--fp16', '--int4', {STREAM!r}, "
            f"*{list(PROFILE + LOOSE_GATE)!r}, "
            f"'--out', {str(out)!r}]); print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.stdout.split() == ["0", "False", "False"], r.stderr[-2000:]
    assert "int4 engine up to date" in r.stderr


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_writes_nothing(llama80m, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(llama80m), "--fp16", "--int8", STREAM,
                        "--int4", "--dry-run", *PROFILE, "--out", str(out)], capture_output=True, text=True, env=ENV,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for line in ("fp16.onnx weights removed", "int8.engine", "int4.onnx removed", "peak disk under --out",
                 "peak memory (estimate)"):
        assert line in r.stdout
    assert not out.exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs (needs root, as CI runs); skipped where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.slow
def test_a_build_without_room_is_refused_before_any_work(llama80m, small_disk):
    out = small_disk / "engines"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(llama80m), "--fp16", "--int4", STREAM,
                        *PROFILE, "--out", str(out)], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trt-seer: error:") and "GiB free but this build needs" in lines[0]
    assert list(small_disk.iterdir()) == [] and time.perf_counter() - t < 120  # nothing written, no export ran


def test_weights_map_back_to_the_checkpoint_exactly(tmp_path):
    """The FP16 graph's weights, dropped and read back from the checkpoint through the weight map,
    are bit for bit the exported ones (transposed GEMM weights included)."""
    import onnx
    from onnx import numpy_helper

    from trt_seer import pipeline
    from trt_seer.export import weights
    from trt_seer.export.families import resolve_model

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama", hidden_size=128, intermediate_size=256)
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(tmp_path, info.name)
    record = pipeline.fp16_decoder_onnx(info, art)
    wmap = record["weights_from_checkpoint"]
    assert {m["transposed"] for m in wmap.values()} == {True, False} and len(wmap) >= 7 * 2
    skeleton = weights.weightless(art.path("fp16.onnx"), wmap)
    assert all(not t.raw_data for t in skeleton.graph.initializer if t.name in wmap)
    back = weights.materialize(skeleton, wmap, weights.CheckpointTensors(ckpt))
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(art.path("fp16.onnx"))).graph.initializer}
    restored = {t.name: numpy_helper.to_array(t) for t in back.graph.initializer}
    assert original.keys() == restored.keys()
    for name, a in original.items():
        assert a.dtype == restored[name].dtype and np.array_equal(a, restored[name]), name


@needs_trt
def test_gate_fallback_ranks_by_weight_error_once_the_fp16_weights_are_gone(tmp_path):
    """An INT4 gate that the all-INT4 graph misses (99% agreement on a random tiny model) falls back
    GEMM by GEMM even though the FP16 graph's weights were removed: ranked by the error of their
    quantized weights, FP16 weights for the kept GEMMs read from the checkpoint."""
    from test_weightonly import npz_batches

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama", hidden_size=128, intermediate_size=256)
    calib = npz_batches(tmp_path / "calib")
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--int4", STREAM, "--calib", str(calib),
                        "--batch", "1,2,4", "--seq", "8,16,32", "--min-agreement", "0.99", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ranking GEMMs by the relative error of their quantized weights" in r.stderr
    rec = json.loads((tmp_path / "out" / "llama.int4.onnx.json").read_text())
    table = rec["accuracy"]["gate"]["table"]
    assert table[0][2] is False and table[-1][2] is True and rec["quantization"]["fp16_gemms"]
    assert rec["accuracy"]["onnx_vs_fp16"]["agreement"] >= 0.99 and rec["removed"] is True


def test_engine_gate_feeds_the_profiles_shortest_prompt_then_one_token_a_step(tmp_path):
    """The GPU gate's teacher forcing (a prompt of `--seq` min tokens, since an engine takes no
    shorter one, then a token a step) gives the token-by-token logits of the positions after it;
    run here through ONNX Runtime's DecoderStep, the same interface the engine's decoder has."""
    from types import SimpleNamespace

    from trt_seer import pipeline
    from trt_seer.engine.build import BuildSpec
    from trt_seer.engine_gate import EngineGate
    from trt_seer.eval import teacher
    from trt_seer.export.families import ShapeProfile, resolve_model
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama")
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(tmp_path, info.name)
    record = pipeline.fp16_decoder_onnx(info, art)
    rows = np.random.default_rng(0).integers(3, 120, (3, 12)).astype(np.int64)
    request = SimpleNamespace(spec=BuildSpec(profile=ShapeProfile((1, 2, 4), (5, 8, 16))))
    gate = EngineGate(art, request, rows)
    step = OrtDecoderStep(art.path("fp16.onnx"), decoder=record["decoder"])
    got = gate.teacher_force(step, rows)
    want = teacher.stepped_logits(step, rows)[:, gate.lead - 1:]
    assert gate.lead == 5 and got.shape == want.shape == (3, 12 - 5, 128)
    assert gate.metric_rows.shape == (3, 12 - 4) and np.array_equal(gate.metric_rows[:, 1:], rows[:, 5:])
    np.testing.assert_allclose(got, want, atol=2e-2)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_a_stage_gives_its_freed_memory_back_before_the_next(tmp_path):
    """Memory a stage freed goes back to the system when it ends (glibc would keep it resident under
    the next stage: a 7B export's tens of GiB), and the stage's record says the RSS left after it."""
    from trt_seer import resources

    def stage():
        blocks = [bytearray(64 * 1024) for _ in range(4096)]  # 256 MiB on the C heap
        pin = bytearray(64 * 1024)  # allocated last: the heap's top stays in use when the blocks go
        del blocks
        return pin

    stages = resources.Stages(tmp_path)
    pin = stages.run("alloc", stage)
    rec = stages.records[0]
    assert len(pin) == 64 * 1024
    assert rec["peak_rss_bytes"] - rec["rss_after_bytes"] > 128 * 2**20, rec


def test_fp16_export_in_a_worker_process_leaves_no_weights_behind(tmp_path, monkeypatch):
    """`isolate=True` runs the PyTorch side of the FP16 export (load, export, reference outputs) in a
    fresh process: this process never loads the model (its loader is broken here), yet the graph,
    its verification and its weight map are those of the in-process export."""
    import onnx

    from trt_seer.export import decoder
    from trt_seer.export.families import resolve_model

    info = resolve_model(make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    here = decoder.fp16_onnx_from_decoder(info, tmp_path / "a" / "m.fp16.onnx", isolate=False)
    monkeypatch.setattr(decoder, "load_decoder", lambda *a, **k: pytest.fail("loaded in this process"))
    there = decoder.fp16_onnx_from_decoder(info, tmp_path / "b" / "m.fp16.onnx", isolate=True)
    assert there == here  # the same report and weight map
    names = [[v.name for v in onnx.load(str(p), load_external_data=False).graph.output]
             for p in (tmp_path / "a" / "m.fp16.onnx", tmp_path / "b" / "m.fp16.onnx")]
    assert names[0] == names[1] and names[0][-1] == "next_token"


def test_a_worker_process_hands_back_its_exception():
    """in_worker raises the worker's own exception (type and one-line message), not a generic one."""
    from trt_seer.errors import InputError
    from trt_seer.export.decoder import in_worker
    from trt_seer.export.families import resolve_model

    with pytest.raises(InputError, match="no-such-checkpoint") as e:
        in_worker(resolve_model, Path("/no-such-checkpoint"), "causal-lm")
    assert "\n" not in str(e.value)


def test_stage_meter_counts_worker_processes_memory(tmp_path):
    """A stage's peak RSS includes the worker processes it starts (here one holding 400 MB)."""
    from trt_seer.resources import rss_bytes

    hold = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"
    with StageMeter("worker", tmp_path, interval=0.05) as meter:
        subprocess.run([sys.executable, "-c", hold], check=True)
    assert meter.peak_rss >= rss_bytes() + (400 << 20)


def test_a_worker_process_that_dies_is_a_one_line_build_error():
    """A worker killed by a signal (here its own abort) is a BuildError naming the signal, not a
    hang or a traceback (SIGKILL, the kernel's out-of-memory killer's, also suggests memory)."""
    import os

    from trt_seer.errors import BuildError
    from trt_seer.export.decoder import in_worker

    with pytest.raises(BuildError, match=r"exit code -6 \(killed by signal 6\)$") as e:
        in_worker(os.abort)
    assert "\n" not in str(e.value)


def test_a_worker_exception_pickle_cannot_carry_comes_back_as_its_message():
    """An exception that cannot be pickled (here one holding a lock) still reaches the caller, as a
    one-line BuildError with the original's type and message."""
    from trt_seer.errors import BuildError
    from trt_seer.export.decoder import in_worker

    with pytest.raises(BuildError, match=r"^UnpicklableError: holds a lock$"):
        in_worker(_raise_unpicklable)


class UnpicklableError(Exception):
    def __init__(self, message):
        import threading

        super().__init__(message)
        self.lock = threading.Lock()


def _raise_unpicklable():
    raise UnpicklableError("holds a lock")


def test_ctrl_c_that_a_library_swallows_stops_the_build_after_its_stage(tmp_path):
    """A stage whose library catches KeyboardInterrupt (a bare except) still ends the build:
    Stages.run raises KeyboardInterrupt once the stage returns and no later stage runs; the SIGINT
    handler is restored on exit, and a new latch starts clear."""
    import signal

    from trt_seer import resources

    swallowed = []

    def swallowing_stage():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here and raises
        except BaseException as e:  # noqa: BLE001 - what the library does
            swallowed.append(type(e))
        return "done"

    ran = []
    stages = resources.Stages(tmp_path)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), resources.latch_interrupts():
        stages.run("swallows", swallowing_stage)
        ran.append("next")
    assert swallowed == [KeyboardInterrupt] and ran == [] and stages.records == []
    assert signal.getsignal(signal.SIGINT) is before
    with resources.latch_interrupts():
        assert stages.run("after", lambda: "ok") == "ok"  # a new latch starts clear
