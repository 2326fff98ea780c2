"""Starting checkpoints made offline from a model config shipped in the package, for
`trt-seer finetune --task causal-lm --init-from-config small-llama --out my-llama/`: no download.

A random-initialised model of the config (trt_seer/data/configs/<name>.json) with a byte-level BPE
tokenizer of its vocab_size trained on the embedded calibration corpus (calib/default.txt): <unk> 0,
<s> 1 (prepended to every text), </s> 2 (EOS and pad). `finetune` then trains it like any checkpoint.
"""
from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

from trt_seer.errors import InputError

CONFIGS = "configs"


def starter_names() -> list[str]:
    folder = importlib.resources.files("trt_seer") / "data" / CONFIGS
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def starter_config(name: str) -> dict:
    if name not in starter_names():
        raise InputError(f"unknown --init-from-config {name!r}; shipped: {', '.join(starter_names())}")
    return json.loads((importlib.resources.files("trt_seer") / "data" / CONFIGS / f"{name}.json").read_text())


def make_starter(name: str, dest: Path, seed: int = 0) -> Path:
    """Writes the random-initialised checkpoint `name` (model and tokenizer) into `dest`."""
    import torch
    import transformers

    config = starter_config(name)
    bpe_tokenizer(config["vocab_size"]).save_pretrained(str(dest))
    torch.manual_seed(seed)
    model_config = transformers.AutoConfig.for_model(**config)
    transformers.AutoModelForCausalLM.from_config(model_config).save_pretrained(str(dest))
    return Path(dest)


def bpe_tokenizer(vocab_size: int):
    """A transformers fast tokenizer: byte-level BPE of `vocab_size` tokens on calib/default.txt."""
    import transformers
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    from trt_seer import data

    corpus = data.load_texts(data.default_corpus("default"))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="</s>")
