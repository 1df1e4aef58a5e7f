"""A local Hugging Face tokenizer for `dsctl probe --tokenizer PATH` (the `tokenizers` library; never the hub).

PATH is a tokenizer directory (the ``tokenizer.json`` a model repository ships) or that file itself. Counting is
without special tokens (no BOS/EOS): what a prompt's text and a completion's text contribute, as vLLM's random
and ShareGPT datasets count them.
"""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


class LocalTokenizer:
    """Counts the tokens of a text with one local tokenizer; loading reads only ``PATH`` (no network)."""

    def __init__(self, path: Path):
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{path}: no {TOKENIZER_FILE} there (give a Hugging Face tokenizer directory)")
        try:
            from tokenizers import Tokenizer
        except ImportError:  # a dependency of dsctl; missing only in a broken install
            raise ValueError("the tokenizers package is not installed (pip install tokenizers)") from None
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises plain Exception subclasses for a bad file
            raise ValueError(f"{file}: not a tokenizer file ({str(exc).splitlines()[0][:120] if str(exc) else exc})"
                             ) from None
        self.path = file

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def __call__(self, text: str) -> int:
        return self.count(text)
