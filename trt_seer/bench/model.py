"""The model `bench` measures: a checkpoint, or a random-initialised one of a known size built
from a config in code (no download), for speed-only runs."""
from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from pathlib import Path

from trt_seer.errors import InputError

log = logging.getLogger(__name__)

RANDOM_CONFIGS = {
    "bert-base": {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
                  "type_vocab_size": 2},
}


def random_checkpoint(config_name: str, dest: Path) -> Path:
    """Saves a random-initialised model of a RANDOM_CONFIGS size into `dest` (no download); copies
    the default model's tokenizer when the vocabularies match, so inputs are real text."""
    import torch
    import transformers

    if config_name not in RANDOM_CONFIGS:
        raise InputError(f"unknown --model-config {config_name!r}; choose one of {', '.join(RANDOM_CONFIGS)}")
    kwargs = dict(RANDOM_CONFIGS[config_name])
    config = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config, dtype=torch.float32).eval().save_pretrained(dest)
    _copy_tokenizer(Path(dest), config.vocab_size)
    return Path(dest)


def _copy_tokenizer(dest: Path, vocab_size: int) -> None:
    import shutil

    from trt_seer.export.families import default_checkpoint

    try:
        src = default_checkpoint()
    except InputError as e:
        log.info("random-init model gets random token ids: %s", e)
        return
    if json.loads((src / "config.json").read_text()).get("vocab_size") != vocab_size:
        log.info("random-init model gets random token ids: the default tokenizer's vocabulary differs")
        return
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dest / name)


@contextlib.contextmanager
def model_info(model: str | None, model_config: str | None, task: str | None):
    """The ModelInfo to benchmark: a checkpoint, or a random-init model saved to a temp dir."""
    from trt_seer.export.families import resolve_model

    if model_config is None:
        yield resolve_model(model, task)
        return
    with tempfile.TemporaryDirectory(prefix="trt-seer-bench-") as tmp:
        dest = random_checkpoint(model_config, Path(tmp) / f"{model_config}-random-init")
        yield resolve_model(dest, task)
