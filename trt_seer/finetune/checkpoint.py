"""Checkpoint in, checkpoint out: load the base model (with a fresh classification head, or as a
causal LM) and its tokenizer; save a standard Hugging Face checkpoint directory (weights, config
with id2label / label2id or the LM's pad token, tokenizer) plus training.json, staged beside --out
and renamed into place at the end.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from trt_seer import __version__
from trt_seer.errors import InputError, UnsupportedError
from trt_seer.export.families import ModelInfo, max_positions, resolve_model
from trt_seer.files import atomic_write_json, follow_umask
from trt_seer.logs import quieted

TRAINING_FILE = "training.json"


def default_out(info: ModelInfo) -> Path:
    return Path("out") / f"{info.name}-{info.task}"


def resolve(model: Path | None, task: str) -> ModelInfo:
    """The checkpoint, to be fine-tuned for `task`; UnsupportedError if its family cannot do it."""
    info = resolve_model(model, "feature-extraction")  # every family has it: checks all but the task
    if task not in info.family.tasks:
        kind = "decoder (a causal LM)" if task == "causal-lm" else "model that transformers builds for it"
        raise UnsupportedError(f"--task {task} needs a {kind}, but {info.path} is a {info.model_type} "
                               f"{info.family.kind}; pass --model DIR")
    return dataclasses.replace(info, task=task)


class NotPublishedError(InputError):
    """The finished checkpoint could not be renamed to --out; it is kept at `kept`. Exit code 2."""

    def __init__(self, message: str, kept: Path):
        super().__init__(message)
        self.kept = kept


def check_out(out: Path) -> None:
    """Before any training: an existing --out is only replaced when it is empty or an earlier
    finetune output and can be renamed (a mount point cannot); a new one needs a directory it can be
    created in. Either way the checkpoint is staged beside --out, so its parent must be writable."""
    if not out.exists():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create --out {out}: {e.strerror}") from e
        _check_parent(out)
        return
    if not out.is_dir() or (any(out.iterdir()) and not (out / TRAINING_FILE).is_file()):
        raise InputError(f"--out {out} exists and is not a finetune output; choose a new directory")
    if os.path.ismount(out):
        raise InputError(f"--out {out} is a mount point, which the checkpoint cannot replace (it appears "
                         f"by one rename); pass a directory inside it, e.g. --out {out / 'ckpt'}")
    _check_parent(out)


def _check_parent(out: Path) -> None:
    parent = out.absolute().parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write beside --out {out}: {parent} is not writable (the checkpoint "
                         "is staged there, then renamed to --out)")


def stage(out: Path) -> Path:
    """A fresh temp directory beside `out` (same file system, so the final rename is atomic)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as e:
        raise InputError(f"cannot write beside --out {out}: {e.strerror}") from e
    umask = os.umask(0o022)
    os.umask(umask)
    staged.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the published checkpoint private
    return staged


def publish(staged: Path, out: Path) -> Path:
    """Renames the finished `staged` directory to `out`, replacing an earlier output. When a rename
    fails, the earlier output is put back and `staged` is kept: NotPublishedError names it."""
    old = None
    try:
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(staged, out)
    except OSError as e:
        if old is not None and old.exists() and not out.exists():
            os.replace(old, out)
        raise NotPublishedError(f"cannot rename the finished checkpoint to --out {out} ({e.strerror}); "
                                f"it is kept in {staged}: move it where you want it", staged) from e
    if old is not None:
        shutil.rmtree(old)
    return out


def load_tokenizer(info: ModelInfo):
    """The checkpoint's tokenizer; decoders without a pad token pad with their EOS token."""
    from transformers import AutoTokenizer

    from trt_seer.tokenizer import tokenizer_from_file

    if (Path(info.path) / "tokenizer.json").is_file():  # transformers fails on a bad one with any error
        tokenizer_from_file(Path(info.path) / "tokenizer.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(info.path))
    except (OSError, ValueError) as e:
        raise InputError(f"no usable tokenizer in {info.path} ({str(e).splitlines()[0]}); "
                         f"save the tokenizer files with the checkpoint") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise InputError(f"the tokenizer in {info.path} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def max_tokens(info: ModelInfo, tokenizer, wanted: int) -> int:
    """`wanted`, capped by what the tokenizer and the position embeddings allow."""
    limits = [wanted, max_positions(info) or wanted, tokenizer.model_max_length]
    return int(min(v for v in limits if isinstance(v, int) and v > 0))


def load_model(info: ModelInfo, labels: tuple[str, ...], pad_id: int, seed: int):
    """FP32 *ForSequenceClassification for `labels`; the head is new unless its size matches."""
    import torch
    import transformers

    from trt_seer.export.checkpoint import from_pretrained

    torch.manual_seed(seed)  # the new head's initial weights
    with quieted("transformers"):  # "newly initialized weights": expected, we train them
        model = from_pretrained(
            transformers.AutoModelForSequenceClassification, info.path, dtype=torch.float32, num_labels=len(labels), ignore_mismatched_sizes=True,
            id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_id
    return model


def load_causal_lm(info: ModelInfo, pad_id: int, seed: int):
    """FP32 *ForCausalLM; a checkpoint without a pad token gets the tokenizer's (its EOS)."""
    import torch
    import transformers

    torch.manual_seed(seed)  # an LM head the checkpoint lacks (a bare base model) starts random
    model = transformers.AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32)
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = pad_id
    return model


def save(module, tokenizer, dest: Path) -> None:
    """A standard Hugging Face checkpoint: model.safetensors, config.json, tokenizer files."""
    module.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    follow_umask(dest)  # model.safetensors comes out 0600


def hardware(ctx) -> dict:
    """Where the run happened: device, processor, library versions, float32 matmul precision."""
    import torch
    import transformers

    facts = {"device": ctx.device.type, "processes": ctx.world, "machine": platform.machine(),
             "cpu_count": os.cpu_count(), "platform": platform.platform(),
             "python": sys.version.split()[0], "torch": torch.__version__,
             "transformers": transformers.__version__,
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        facts.update({"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}",
                      "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda})
    return facts


def write_training_json(dest: Path, record: dict) -> Path:
    record = {"schema": 1, "trt_seer_version": __version__, **record,
              "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return atomic_write_json(dest / TRAINING_FILE, record)
