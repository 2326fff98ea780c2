"""The one loader of a model's fast tokenizer (`tokenizer.json`, the `tokenizers` package), for
calibration text, `run` and generation. Imports only `tokenizers`, when called.

    from trt_seer.tokenizer import load_tokenizer
    tok = load_tokenizer(Path("checkpoints/my-model"), truncate=128)
    ids = [e.ids for e in tok.encode_batch(["hello"])]
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from trt_seer.errors import InputError

log = logging.getLogger(__name__)
# The model's own length limit, where its files say one: what sentence-transformers stops at,
# then what transformers' tokenizer truncates to (a huge number there means "none").
MAX_LENGTH_FIELDS = (("sentence_bert_config.json", "max_seq_length", "sentence-transformers max_seq_length"),
                     ("tokenizer_config.json", "model_max_length", "tokenizer model_max_length"))
NO_MAX_LENGTH = 1_000_000


def load_tokenizer(directory: str | Path, truncate: int | None = None, hint: str = "pass a directory with tokenizer.json"):
    """The `tokenizers.Tokenizer` of `directory`/tokenizer.json with no padding and truncation at
    `truncate` tokens (None: off). InputError, ending in `hint`, when there is none or it is unreadable."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"no tokenizer.json in {directory}; {hint}")
    tokenizer = tokenizer_from_file(path)
    tokenizer.no_padding()
    if truncate is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(truncate)
    return tokenizer


def tokenizer_from_file(path: Path):
    """A `tokenizers.Tokenizer` from `path`; InputError when the file is not one (the tokenizers
    package raises a bare Exception for every parse error, so nothing narrower can be caught)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise InputError(f"{path} is not a usable tokenizer.json: {str(e).strip() or type(e).__name__}") from e


def model_max_length(directory: str | Path) -> tuple[int, str] | None:
    """(tokens, which setting) of the checkpoint's own length limit: sentence-transformers'
    `max_seq_length`, else the tokenizer's `model_max_length`; None where neither says one."""
    for name, field, what in MAX_LENGTH_FIELDS:
        path = Path(directory) / name
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get(field) if path.is_file() else None
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:  # not a config we can read
            log.debug("no %s from %s: %s", field, path, e)
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < NO_MAX_LENGTH:
            return int(value), what
    return None
