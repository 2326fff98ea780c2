"""Tiny random-initialised Hugging Face checkpoints, built in code (never downloaded).

    from tiny import make_tiny_checkpoint          # tests/ is on sys.path under pytest
    ckpt = make_tiny_checkpoint("llama", "causal-lm", tmp_path / "llama")
    info = trt_seer.export.families.resolve_model(ckpt)   # task inferred from `architectures`

Stable API (build, export and finetune tests rely on it):
    make_tiny_checkpoint(model_type, task, dest, *, seed=0, **overrides) -> Path
    MODEL_TYPES   every model_type with a tiny config here
    HIDDEN, VOCAB, NUM_LABELS, ...   the sizes used, for asserting output shapes
    tiny_config_kwargs(model_type) -> dict   the config keywords used, before overrides

Each checkpoint is FP32 safetensors plus config.json, 32 hidden units, 2 layers, 4 heads,
intermediate 37, vocab 128 and 128 positions: about 100 KB, saved in well under a second.
`architectures` is the saved model's class, so `families.infer_task` recovers `task`. No tokenizer
is written: tests feed token ids directly. Decoders use ids 0, 1, 2 as pad, bos, eos; RoBERTa,
XLM-R and MPNet pad with id 1 (their positions count from it), the others with 0.
"""
from __future__ import annotations

from pathlib import Path

from trt_seer.export.families import TASKS

HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB, POSITIONS = 32, 2, 4, 37, 128, 128
NUM_LABELS = 3  # text-classification heads, unless overridden
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

_COMMON = {
    "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "intermediate_size": INTERMEDIATE, "vocab_size": VOCAB, "max_position_embeddings": POSITIONS,
}
# Per family: names that differ from _COMMON, and settings that make the tiny model take the
# same code paths as the released checkpoints (relative attention, GQA, embedding projection).
_FAMILY_KWARGS = {
    "bert": {"type_vocab_size": 2},
    "electra": {"type_vocab_size": 2, "embedding_size": 16},  # projected embeddings, as in ELECTRA
    "distilbert": {"hidden_dim": INTERMEDIATE, "sinusoidal_pos_embds": False},
    "roberta": {"type_vocab_size": 1, "pad_token_id": 1},  # positions start after pad id 1
    "xlm-roberta": {"type_vocab_size": 1, "pad_token_id": 1},
    "mpnet": {"relative_attention_num_buckets": 32, "pad_token_id": 1},
    "deberta-v2": {  # DeBERTa-v3 layout: disentangled relative attention, bucketed positions
        "type_vocab_size": 0, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
        "position_buckets": 16, "max_relative_positions": -1, "position_biased_input": False,
        "norm_rel_ebd": "layer_norm", "share_att_key": True,
    },
    "albert": {"type_vocab_size": 2, "embedding_size": 16},  # factorised embeddings, shared layers
    "camembert": {"type_vocab_size": 1, "pad_token_id": 1},
    "convbert": {"type_vocab_size": 2, "embedding_size": HIDDEN, "conv_kernel_size": 3},
    "mobilebert": {"type_vocab_size": 2, "embedding_size": 16, "intra_bottleneck_size": 16,
                   "num_feedforward_networks": 2},
    "ernie": {"type_vocab_size": 2},
    "roformer": {"type_vocab_size": 2},
    "xlm": {"pad_token_id": 2},
    "deberta": {"type_vocab_size": 0, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                "max_relative_positions": -1},
    "modernbert": {"local_attention": 16, "global_attn_every_n_layers": 2, "cls_token_id": 1,
                   "sep_token_id": 2, **SPECIAL_IDS},  # sliding-window and global layers
    "gpt2": {"n_inner": INTERMEDIATE, **SPECIAL_IDS},
    "llama": {"num_key_value_heads": 2, **SPECIAL_IDS},  # grouped-query attention
    "qwen2": {"num_key_value_heads": 2, **SPECIAL_IDS},
    "mistral": {"num_key_value_heads": 2, "sliding_window": 32, **SPECIAL_IDS},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 8, **SPECIAL_IDS},
    "gemma": {"num_key_value_heads": 1, "head_dim": 16, **SPECIAL_IDS},  # head_dim * heads != hidden
    "phi": {"partial_rotary_factor": 0.5, **SPECIAL_IDS},
    "phi3": {"num_key_value_heads": 2, **SPECIAL_IDS},
    "gpt_neox": {"rotary_pct": 0.5, **SPECIAL_IDS},
    "gptj": {"rotary_dim": 4, "n_inner": INTERMEDIATE, **SPECIAL_IDS},  # interleaved, on half of each head
    "codegen": {"rotary_dim": 4, "n_inner": INTERMEDIATE, **SPECIAL_IDS},  # GPT-J's rotation, fused qkv
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, **SPECIAL_IDS},
    "opt": {"ffn_dim": INTERMEDIATE, "word_embed_proj_dim": HIDDEN, **SPECIAL_IDS},
    "bloom": SPECIAL_IDS,
    "stablelm": {"num_key_value_heads": 2, "partial_rotary_factor": 0.25, **SPECIAL_IDS},
    "starcoder2": {"num_key_value_heads": 2, **SPECIAL_IDS},
    # decoders the export cannot take: a mixture of experts, and a config with its own head count name
    "mixtral": {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, **SPECIAL_IDS},
    "mpt": {"d_model": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "max_seq_len": POSITIONS, **SPECIAL_IDS},
}
MODEL_TYPES = tuple(_FAMILY_KWARGS)
_UNUSED = {"distilbert": ("intermediate_size",), "gpt2": ("intermediate_size",), "opt": ("intermediate_size",),
           "gptj": ("intermediate_size",), "codegen": ("intermediate_size",), "mpt": tuple(set(_COMMON) - {"vocab_size"})}


def tiny_config_kwargs(model_type: str) -> dict:
    """Keyword arguments for `AutoConfig.for_model(model_type, ...)` of the tiny model."""
    if model_type not in _FAMILY_KWARGS:
        raise KeyError(f"no tiny config for {model_type!r}; known: {', '.join(_FAMILY_KWARGS)}")
    kwargs = {k: v for k, v in _COMMON.items() if k not in _UNUSED.get(model_type, ())}
    return {**kwargs, **_FAMILY_KWARGS[model_type]}


def make_tiny_checkpoint(model_type: str, task: str, dest: Path, *, seed: int = 0, **overrides) -> Path:
    """Saves a random-initialised checkpoint of `model_type` for `task` into `dest`; returns `dest`.

    Args:
        model_type: one of MODEL_TYPES ("bert", "llama", ...).
        task: a key of `trt_seer.export.families.TASKS`; picks the auto class (and so `architectures`).
        dest: directory to create (parents too); existing files in it are overwritten.
        seed: torch seed for the weights; different seeds give different weights, same config.
        overrides: config keywords applied last, e.g. `num_labels=5` or `num_hidden_layers=1`.
    """
    import torch
    import transformers

    labels = {"num_labels": NUM_LABELS} if task == "text-classification" else {}
    kwargs = {**tiny_config_kwargs(model_type), **labels, **overrides}
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    auto = getattr(transformers, TASKS[task].auto_class)
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
        torch.manual_seed(seed)
        model = auto.from_config(config, dtype=torch.float32).eval()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    return dest


def parsed_network(path: Path):
    """(flavor, builder, network, parser): the ONNX file at `path` parsed into a strongly typed
    network by the TensorRT flavor here (the builder and parser own the network: keep them)."""
    from trt_seer.engine import trt

    flavor = trt.load()
    builder = flavor.trt.Builder(trt.logger(flavor))
    network = trt.strongly_typed_network(flavor, builder)
    parser = flavor.trt.OnnxParser(network, builder.logger)
    assert parser.parse_from_file(str(path))
    return flavor, builder, network, parser
