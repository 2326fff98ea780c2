"""The one loader of a model's fast tokenizer (`tokenizer.json`, the `tokenizers` package), for
calibration text, `run` and generation. Imports only `tokenizers`, when called.

    from trt_seer.tokenizer import load_tokenizer
    tok = load_tokenizer(Path("checkpoints/my-model"), truncate=128)
    ids = [e.ids for e in tok.encode_batch(["hello"])]
"""
from __future__ import annotations

from pathlib import Path

from trt_seer.errors import InputError


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
