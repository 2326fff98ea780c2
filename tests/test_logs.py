"""`trt_seer.logs.quieted`: other libraries' chatter is dropped inside the block only, loggers made
inside the block included, while every logger's level and everyone else's records stay as they were."""
from __future__ import annotations

import logging

import pytest

from trt_seer.logs import quieted


class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        self.seen.append((record.name, record.levelname, record.getMessage()))


@pytest.fixture
def kept():
    root, handler = logging.getLogger(), Keep()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler.seen
    root.removeHandler(handler)
    root.setLevel(level)


def test_quieted_drops_only_the_named_librarys_records_below_the_level(kept):
    lib = logging.getLogger("quietlib")
    with quieted("quietlib"):
        logging.getLogger("quietlib.made_inside").warning("expected fallback")  # a lazily made child
        lib.info("chatter")
        lib.error("real problem")
        logging.getLogger("quietlibrary").warning("another library")  # same prefix, other name
        logging.getLogger("trt_seer.test").info("ours")
    logging.getLogger("quietlib.made_inside").warning("after the block")
    assert kept == [("quietlib", "ERROR", "real problem"), ("quietlibrary", "WARNING", "another library"),
                    ("trt_seer.test", "INFO", "ours"), ("quietlib.made_inside", "WARNING", "after the block")]
    assert lib.level == logging.NOTSET and logging.getLogger("quietlib.made_inside").level == logging.NOTSET
    assert not lib.filters and not logging.getLogger().handlers[-1].filters


def test_quieted_root_drops_direct_root_calls_only(kept):
    with quieted(None):
        logging.warning("pre-process your model")
        logging.getLogger("trt_seer.test").warning("ours")
    assert kept == [("trt_seer.test", "WARNING", "ours")]
    assert logging.getLogger().level == logging.DEBUG


def test_quieted_can_say_dropped_records_at_debug_instead(kept):
    ours = logging.getLogger("trt_seer.test_debug")
    with quieted("chattylib", debug_to=ours):
        logging.getLogger("chattylib").warning("symbolic shape inference disabled or failed.")
        logging.getLogger("chattylib").error("a real error")
    assert kept == [("trt_seer.test_debug", "DEBUG", "chattylib: symbolic shape inference disabled or failed."),
                    ("chattylib", "ERROR", "a real error")]


def test_tensorrt_int64_binding_reminders_go_to_debug(kept):
    from trt_seer.engine import trt

    if not trt.available():
        pytest.skip("no TensorRT flavor importable")
    flavor = trt.load()
    severity = flavor.trt.ILogger.Severity
    adapter = trt.logger(flavor)
    adapter.log(severity.WARNING, "ModelImporter.cpp:1071: Make sure input input_ids has Int64 binding.")
    adapter.log(severity.WARNING, "some other warning")
    assert kept == [("trt_seer.tensorrt", "DEBUG",
                     "[TensorRT] WARNING: ModelImporter.cpp:1071: Make sure input input_ids has Int64 binding."),
                    ("trt_seer.tensorrt", "WARNING", "[TensorRT] WARNING: some other warning")]
