"""Triton's own model-configuration schema: the `ModelConfig` protobuf shipped in `tritonclient`.

`tritonclient.grpc.model_config_pb2` sits in a package whose `__init__` needs grpcio; the
generated module itself needs only protobuf, so it is loaded from its file, and the base
`pip install tritonclient` (the `serve` extra) is enough.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

from trt_seer.errors import TrtSeerError


@lru_cache(maxsize=1)
def model_config_module():
    """The generated `model_config_pb2` module, or None when tritonclient is not installed."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("trt_seer_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def available() -> bool:
    return model_config_module() is not None


def parse(text: str):
    """`text` parsed into Triton's `inference.ModelConfig`; TrtSeerError when it does not parse."""
    from google.protobuf import text_format

    module = model_config_module()
    if module is None:
        raise TrtSeerError("tritonclient is not installed: pip install 'trt-seer[serve]'")
    try:
        return text_format.Parse(text, module.ModelConfig())
    except text_format.ParseError as e:
        raise TrtSeerError(f"config.pbtxt does not parse with Triton's ModelConfig schema: {e}") from e
