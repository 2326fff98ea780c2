"""Shared fixtures. Tiny checkpoints are built by tests/tiny.py (`from tiny import ...` works in
any test module: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from tiny import make_tiny_checkpoint


@pytest.fixture
def tiny_checkpoint(tmp_path):
    """Factory fixture: `tiny_checkpoint(model_type, task, *, seed=0, **overrides) -> Path`.

    Each call saves a fresh random-initialised checkpoint in its own directory under `tmp_path`;
    see `tiny.make_tiny_checkpoint` for the arguments.
    """
    counter = itertools.count()

    def make(model_type: str, task: str, *, seed: int = 0, **overrides) -> Path:
        dest = tmp_path / f"ckpt{next(counter)}-{model_type}-{task}"
        return make_tiny_checkpoint(model_type, task, dest, seed=seed, **overrides)

    return make


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run several times faster on one thread than on two busy cores; a module that
    trains them asks for this with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _trt_seer_logging_restored():
    """A test that runs the CLI in-process (`main([...])`) configures the `trt_seer` logger as the
    application does (a stderr handler, no propagation); later tests get it back as a library
    leaves it."""
    import logging

    log = logging.getLogger("trt_seer")
    saved = (list(log.handlers), log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The C library and its example program, built once per module (tests/test_capi.py)."""
    from test_capi import build_library

    return build_library(tmp_path_factory.mktemp("capi"))


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """A tiny BERT exported to ONNX, once per module, for the C ABI tests."""
    from test_capi import export_tiny_bert

    return export_tiny_bert(tmp_path_factory.mktemp("tinybert"))
