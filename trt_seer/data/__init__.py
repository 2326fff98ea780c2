"""Calibration / held-out text -> token batches within a shape profile.

Tokenises with the checkpoint's own `tokenizer.json` through the `tokenizers` package (no
transformers import), length-bucketed so short samples are not all padded to the profile's max.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError
from trt_seer.export.families import ModelInfo, ShapeProfile
from trt_seer.tokenizer import load_tokenizer

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout, when running from one


def default_corpus(split: str = "default") -> Path:
    """The shipped corpus: calib/default.txt (calibration) or calib/heldout.txt (accuracy gates).

    The top-level calib/ folder of a checkout (editable installs, PYTHONPATH) is the source of
    truth; an installed wheel carries the same files as package data in trt_seer/calib/.
    Never looked up relative to the current directory."""
    import importlib.resources

    candidates = [importlib.resources.files("trt_seer") / "calib" / f"{split}.txt"]
    if (SOURCE_ROOT / "pyproject.toml").is_file():
        candidates.insert(0, SOURCE_ROOT / "calib" / f"{split}.txt")
    for path in candidates:
        if path.is_file():
            return Path(str(path))
    raise InputError(f"default corpus calib/{split}.txt is not installed with trt_seer; pass --calib PATH")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"calibration data {path} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    except OSError as e:
        raise InputError(f"cannot read calibration data {path}: {e.strerror}") from e


def jsonl_rows(path: Path):
    """Yields ("file:line", object) for each non-blank line; InputError on anything else."""
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{i}: not valid JSON ({e.msg})") from e
        if not isinstance(row, dict):
            raise InputError(f"{path}:{i}: expected a JSON object per line")
        yield f"{path}:{i}", row


def _jsonl_texts(path: Path, field: str) -> list[str]:
    texts = []
    for where, row in jsonl_rows(path):
        if field not in row:
            raise InputError(f"{where}: no field {field!r} (use --text-field)")
        texts.append(str(row[field]))
    return texts


def _csv_texts(path: Path, field: str) -> list[str]:
    rows = list(csv.DictReader(_read_text(path).splitlines()))
    if rows and field not in rows[0]:
        raise InputError(f"{path}: no column {field!r}; columns are {', '.join(rows[0])} (use --text-field)")
    return [r[field] for r in rows if r.get(field)]


def load_texts(path: Path, field: str = "text") -> list[str]:
    """Texts from .txt (one per line), .jsonl or .csv (named field). InputError if none."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"calibration data not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        texts = _jsonl_texts(path, field)
    elif suffix == ".csv":
        texts = _csv_texts(path, field)
    else:
        texts = [line for line in _read_text(path).splitlines() if line.strip()]
    if not texts:
        raise InputError(f"calibration data {path} is empty")
    return texts


@dataclass(frozen=True)
class Tokenizer:
    """A `tokenizers.Tokenizer` loaded from a checkpoint directory."""

    path: Path

    def encode(self, texts: list[str], max_len: int) -> list[list[int]]:
        tok = load_tokenizer(self.path, max_len, "text data needs the model's fast tokenizer")
        return [e.ids for e in tok.encode_batch(texts)]


def pad_batch(ids: list[list[int]], inputs: tuple[str, ...], seq: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Right-padded int64 feeds for the model's inputs, shape (len(ids), seq): the runtime's own padding."""
    from trt_seer.runtime.texts import pad_rows

    return pad_rows(ids, inputs, seq, pad_id)


def bucket_seq(length: int, profile: ShapeProfile) -> int:
    """Smallest multiple of 8 that holds `length`, clamped to the profile's seq range."""
    lo, _, hi = profile.seq
    return int(min(hi, max(lo, -(-length // 8) * 8)))


def token_batches(info: ModelInfo, texts: list[str], profile: ShapeProfile, batch: int):
    """Yields feeds dicts: samples sorted by length, each batch padded to its own bucket."""
    batch = max(profile.batch[0], min(batch, profile.batch[2]))
    ids = Tokenizer(info.path).encode(texts, profile.seq[2])
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch):
        rows = [ids[i] for i in order[start:start + batch]]
        if len(rows) < profile.batch[0]:
            break
        yield pad_batch(rows, info.inputs, bucket_seq(max(map(len, rows)), profile))


def has_tokenizer(info: ModelInfo) -> bool:
    return (Path(info.path) / "tokenizer.json").is_file()
