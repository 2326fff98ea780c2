"""Fine-tuning data: .jsonl / .csv files or the embedded topics corpus -> labelled examples ->
token features -> length-bucketed, dynamically padded batches.

    dataset = load_dataset(DataSpec(train=Path("train.jsonl"), eval=Path("eval.jsonl")))
    train = encode(dataset.train, tokenizer, max_seq=128)
    for indices in plan_batches(train.lengths, 32, seed=0):
        batch = collate(train, indices, pad_id=tokenizer.pad_token_id)  # dict of (batch, seq) tensors

Labels may be strings (mapped to ids in sorted order) or integers (used as ids).

Causal-LM data (`load_corpus`, `encode_documents`) is plain text, one document per line of a .txt
file (or one per row of .jsonl / .csv); default calib/default.txt, evaluated on calib/heldout.txt.
Documents are padded, not packed: each is one sequence, truncated to max_seq, with the EOS token
appended when it fits, so the model learns where a document ends. collate labels the padding
-100, which the loss ignores.
"""
from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from trt_seer.errors import InputError
from trt_seer.finetune.spec import DataSpec

EVAL_EVERY = 10  # without an eval file, every 10th example is held out
TOPICS_SOURCE = "embedded:topics"
BUCKET_POOL = 50  # batches whose examples are sorted by length together
PAD_MULTIPLE = 8  # pad sequence length to a multiple of 8 (tensor-core friendly, fewer shapes)
COMPILED_PAD_MULTIPLE = 32  # under torch.compile: few enough shapes that each compiles once
IGNORE_INDEX = -100  # label of padding positions: cross_entropy's default ignore_index
_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Example:
    text: str
    label: str | int | None = None  # None: a causal-LM document


@dataclass(frozen=True)
class Dataset:
    """Examples split for training and evaluation, with the label names in id order."""

    train: list[Example]
    eval: list[Example]
    labels: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Encoded:
    """Tokenised examples: per example a dict of unpadded int lists (no attention mask: collate
    makes it), and its label id. `labels` None: causal-LM documents, whose labels are their own
    tokens."""

    features: list[dict[str, list[int]]]
    labels: list[int] | None

    def __len__(self) -> int:
        return len(self.features)

    @property
    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]


def load_dataset(spec: DataSpec) -> Dataset:
    """Reads and checks the data the spec names; InputError on anything malformed."""
    if spec.train is None:
        train, evaluation, source = *topics_examples(), TOPICS_SOURCE
    else:
        train = read_examples(Path(spec.train), spec.text_field, spec.label_field)
        if spec.eval is None:
            train, evaluation = split(train)
        else:
            evaluation = read_examples(Path(spec.eval), spec.text_field, spec.label_field)
        source = str(spec.train)
    train, evaluation, labels = assign_labels(train, evaluation, spec.num_labels)
    return Dataset(train, evaluation, labels, source)


def load_corpus(spec: DataSpec) -> Dataset:
    """Causal-LM documents: --train / --eval (.txt, .jsonl, .csv), or calib/default.txt and
    calib/heldout.txt. Without --eval, every 10th training document is held out."""
    if spec.train is None:
        train, evaluation = (read_examples(_default_corpus(part), spec.text_field, None)
                             for part in ("default", "heldout"))
        return Dataset(train, evaluation, (), "calib/default.txt")
    train = read_examples(Path(spec.train), spec.text_field, None)
    if spec.eval is None:
        train, evaluation = split(train)
    else:
        evaluation = read_examples(Path(spec.eval), spec.text_field, None)
    return Dataset(train, evaluation, (), str(spec.train))


def _default_corpus(split_name: str) -> Path:
    from trt_seer.data import default_corpus

    try:
        return default_corpus(split_name)
    except InputError as e:  # its message names build's --calib
        raise InputError(f"the default text corpus calib/{split_name}.txt is missing; pass --train FILE") from e


def topics_examples() -> tuple[list[Example], list[Example]]:
    """The embedded corpus: one text per line in data/topics/<label>.txt; every 10th line to eval."""
    folder = resources.files("trt_seer").joinpath("data", "topics")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".txt")), key=lambda f: f.name)
    if not files:
        raise InputError("the embedded topics corpus is missing; reinstall trt_seer or pass --train")
    train, evaluation = [], []
    for f in files:
        lines = [line.strip() for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
        examples = [Example(line, f.name.removesuffix(".txt")) for line in lines]
        part_train, part_eval = split(examples)
        train += part_train
        evaluation += part_eval
    return train, evaluation


def split(examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """Deterministic hold-out: examples 9, 19, 29, ... go to eval."""
    held = [e for i, e in enumerate(examples) if i % EVAL_EVERY == EVAL_EVERY - 1]
    kept = [e for i, e in enumerate(examples) if i % EVAL_EVERY != EVAL_EVERY - 1]
    return kept, held


def read_examples(path: Path, text_field: str, label_field: str | None) -> list[Example]:
    """Examples from a .jsonl or .csv file with named text and label fields. Without a label
    field (causal-LM documents) a .txt file with one document per line is read too."""
    if not path.is_file():
        raise InputError(f"data file not found: {path}")
    readers = {".jsonl": _jsonl_rows, ".csv": _csv_rows}
    if label_field is None:
        readers[".txt"] = _txt_rows
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise InputError(f"unsupported data file {path}: use {' or '.join(readers)}")
    fields = (text_field,) if label_field is None else (text_field, label_field)
    examples = [_example(row, where, text_field, label_field) for where, row in reader(path, fields)]
    if not examples:
        raise InputError(f"data file {path} has no examples")
    return examples


def _jsonl_rows(path: Path, fields):
    from trt_seer.data import jsonl_rows

    return jsonl_rows(path)


def _txt_rows(path: Path, fields):
    """One row per non-blank line, its text under the text field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    for n, line in enumerate(lines, 1):
        if line.strip():
            yield f"{path}:{n}", {fields[0]: line}


def _csv_rows(path: Path, fields):
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [name for name in fields if name not in (reader.fieldnames or [])]
        if reader.fieldnames and missing:
            raise InputError(f"{path}: no column {missing[0]!r} in header {reader.fieldnames}; "
                             f"name the columns with --text-field / --label-field")
        for n, row in enumerate(reader, 2):
            yield f"{path}:{n}", row


def _example(row: dict, where: str, text_field: str, label_field: str | None) -> Example:
    fields = ((text_field, "--text-field"),) + (() if label_field is None else ((label_field, "--label-field"),))
    for name, flag in fields:
        if row.get(name) is None:
            raise InputError(f"{where}: no field {name!r} (fields: {', '.join(map(str, row))}); "
                             f"name it with {flag}")
    text = row[text_field]
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: field {text_field!r} must be a non-empty string")
    if label_field is None:
        return Example(text)
    label = row[label_field]
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise InputError(f"{where}: label {label!r} must be a string or an integer")
    if isinstance(label, str) and _INT.fullmatch(label.strip()):
        label = int(label)  # CSV cells are strings
    return Example(text, label.strip() if isinstance(label, str) else label)


def assign_labels(train: list[Example], evaluation: list[Example], num_labels: int | None):
    """Maps labels to ids. Returns (train, eval, names) with integer labels."""
    raw = [e.label for e in train]
    as_int = all(isinstance(label, int) for label in raw)
    if as_int:
        names = tuple(f"LABEL_{i}" for i in range(num_labels or max(raw) + 1))
    else:
        names = tuple(sorted({str(label) for label in raw}))
        if num_labels is not None and len(names) != num_labels:
            raise InputError(f"found {len(names)} labels {list(names)[:8]} in the training data "
                             f"but --num-labels is {num_labels}; fix the data or drop --num-labels")
    if len(names) < 2:
        raise InputError(f"text classification needs at least 2 labels; the training data has {names}")
    ids = {(i if as_int else name): i for i, name in enumerate(names)}
    return _relabel(train, ids, as_int, "training"), _relabel(evaluation, ids, as_int, "eval"), names


def _relabel(examples: list[Example], ids: dict, as_int: bool, part: str) -> list[Example]:
    out = []
    for e in examples:
        key = e.label if as_int else str(e.label)
        if key not in ids:
            raise InputError(f"{part} label {e.label!r} is not one of the {len(ids)} labels "
                             f"({'ids 0..' + str(len(ids) - 1) if as_int else 'names seen in training'}); "
                             f"check the data and --num-labels")
        out.append(Example(e.text, ids[key]))
    return out


def encode(examples: list[Example], tokenizer, max_seq: int) -> Encoded:
    """Tokenises without padding; truncates to `max_seq` tokens."""
    if not examples:
        return Encoded([], [])
    tokens = tokenizer([e.text for e in examples], truncation=True, max_length=max_seq)
    keys = [k for k in tokenizer.model_input_names if k in tokens and k != "attention_mask"]
    features = [{k: list(tokens[k][i]) for k in keys} for i in range(len(examples))]
    return Encoded(features, [int(e.label) for e in examples])


def encode_documents(examples: list[Example], tokenizer, max_seq: int) -> Encoded:
    """Tokenises causal-LM documents, truncated to `max_seq` tokens; appends the EOS token to
    each document that was not cut short and does not already end with it."""
    if not examples:
        return Encoded([], None)
    eos = tokenizer.eos_token_id
    rows = tokenizer([e.text for e in examples], truncation=True, max_length=max_seq)["input_ids"]
    ids = [list(r) + ([eos] if eos is not None and len(r) < max_seq and (not r or r[-1] != eos) else [])
           for r in rows]
    return Encoded([{"input_ids": r} for r in ids], None)


def plan_batches(lengths: list[int], size: int, seed: int | None = None) -> list[list[int]]:
    """Index batches of `size` with similar lengths. With a seed: shuffled, sorted by length
    within pools of BUCKET_POOL batches, and batch order shuffled (fresh seed each epoch).
    Without: sorted by length (evaluation)."""
    order = list(range(len(lengths)))
    if seed is None:
        order.sort(key=lambda i: lengths[i])
        return [order[i:i + size] for i in range(0, len(order), size)]
    rng = random.Random(seed)
    rng.shuffle(order)
    pool = size * BUCKET_POOL
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start:start + pool], key=lambda i: lengths[i])
        batches += [chunk[i:i + size] for i in range(0, len(chunk), size)]
    rng.shuffle(batches)
    return batches


def collate(data: Encoded, indices: list[int], pad_id: int, multiple: int = PAD_MULTIPLE) -> dict:
    """Right-pads the chosen examples to the longest (rounded up to `multiple`).
    Returns int64 tensors, each (batch, seq), plus `labels`: (batch,) class ids, or for causal-LM
    documents (batch, seq) token ids with -100 on padding (the loss ignores those)."""
    import numpy as np
    import torch

    lengths = [len(data.features[i]["input_ids"]) for i in indices]
    seq = -(-max(lengths) // multiple) * multiple
    batch = {"attention_mask": np.arange(seq)[None, :] < np.array(lengths)[:, None]}
    for key in data.features[indices[0]]:
        rows = np.full((len(indices), seq), pad_id if key == "input_ids" else 0, dtype=np.int64)
        for r, i in enumerate(indices):
            rows[r, :lengths[r]] = data.features[i][key]
        batch[key] = rows
    if data.labels is None:
        batch["labels"] = np.where(batch["attention_mask"], batch["input_ids"], IGNORE_INDEX)
    else:
        batch["labels"] = np.array([data.labels[i] for i in indices], dtype=np.int64)
    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}
