"""Ctrl-C at random moments of `build --int8` (a tiny BERT): no artifact is ever left without its
record, no temp file is left behind, and the next build completes."""
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from test_int8 import TINY_PROFILE, npz_batches
from tiny import make_tiny_checkpoint
from trt_seer.engine import trt

MOMENTS = 20
OK_CODES = (0, 130, -signal.SIGINT)  # done; interrupted; interrupted before the CLI took over SIGINT


def command(ckpt, calib, out):
    return [sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--int8", "--calib", str(calib),
            *TINY_PROFILE, "--out", str(out)]


def run(cmd, log, interrupt_at=None) -> tuple[int, bool]:
    """(exit code, whether SIGINT was sent): the build runs until done or `interrupt_at` seconds."""
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "TQDM_DISABLE": "1"})
        try:
            return p.wait(timeout=interrupt_at), False
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            return p.wait(timeout=300), True


def unpaired(out) -> list[str]:
    """Artifacts in `out` without their record, and temp files left behind."""
    if not out.exists():
        return []
    bad = [p.name for p in out.iterdir() if p.name.startswith(".")]
    for p in out.iterdir():
        record = (p.with_name(p.name.removesuffix(".engine") + ".manifest.json") if p.suffix == ".engine"
                  else p.with_name(p.name + ".json") if p.suffix == ".onnx" else None)
        if record is not None and not record.is_file():
            bad.append(p.name)
    return bad


@pytest.mark.slow
@pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
def test_ctrl_c_never_leaves_an_artifact_without_its_record(tmp_path):
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "ckpt")
    calib = npz_batches(tmp_path / "calib")
    start = time.monotonic()
    code, _ = run(command(ckpt, calib, tmp_path / "whole"), tmp_path / "whole.log")
    duration = time.monotonic() - start
    assert code == 0, (tmp_path / "whole.log").read_text()[-3000:]
    shutil.rmtree(tmp_path / "whole")
    rng, out = random.Random(44), tmp_path / "out"
    for k in range(MOMENTS):
        at = rng.uniform(0.5, duration)
        code, sent = run(command(ckpt, calib, out), tmp_path / f"{k}.log", at)
        said = (tmp_path / f"{k}.log").read_text()
        assert code in OK_CODES, f"at {at:.1f} s: {said[-3000:]}"
        assert unpaired(out) == [], f"Ctrl-C at {at:.1f} s of {duration:.1f} s left {unpaired(out)}"
        if not sent:  # it finished first: the next moment hits a fresh build again
            shutil.rmtree(out)
    code, _ = run(command(ckpt, calib, out), tmp_path / "final.log")
    assert code == 0, (tmp_path / "final.log").read_text()[-3000:]
    assert unpaired(out) == [] and (out / "ckpt.int8.engine").is_file() and (out / "ckpt.int8.cpu.onnx").is_file()
