"""The one loader of `tokenizer.json` files (runtime, data, fine-tuning): tokenizers only, no torch."""
from __future__ import annotations

from pathlib import Path

from trt_seer.errors import InputError


def tokenizer_from_file(path: Path):
    """A `tokenizers.Tokenizer` from `path`; InputError when the file is not one (the tokenizers
    package raises a bare Exception for every parse error, so nothing narrower can be caught)."""
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(path))
    except Exception as e:
        raise InputError(f"{path} is not a usable tokenizer.json: {str(e).strip() or type(e).__name__}") from e
