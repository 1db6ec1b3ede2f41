"""Whether two tokenizer paths hold the same tokenizer (the critic's and the reward model's must be the policy's)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TOKENIZER_FILES", "same_tokenizer"]

# the files a HF tokenizer is loaded from; two directories with equal copies hold the same tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def same_tokenizer(a: str, b: str) -> bool:
    """The same path, or two local directories whose tokenizer files are byte-for-byte equal."""
    if _real(a) == _real(b):
        return True
    da, db = Path(_real(a)), Path(_real(b))
    if not (da.is_dir() and db.is_dir()):
        return False
    names = [n for n in TOKENIZER_FILES if (da / n).is_file() or (db / n).is_file()]
    return bool(names) and all((da / n).is_file() and (db / n).is_file()
                               and (da / n).read_bytes() == (db / n).read_bytes() for n in names)
