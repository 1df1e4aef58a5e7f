"""Hugging Face tokenizers built offline in a test (the `tokenizers` trainers on a few sentences), saved as a
tokenizer directory the probe's --tokenizer reads. No hub, no downloaded vocabulary."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a stream of tokens without usage in the response",
    "hello there world of small servers and long prompts",
    "every request carries an id and every answer ends with done",
]


def word_level(directory: Path, extra_words: list[str] = ()) -> Path:
    """One token per whitespace-separated word (unknown words: one [UNK] token each)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tokenizer.train_from_iterator([*SENTENCES, " ".join(extra_words)], trainer)
    return _save(tokenizer, directory)


def byte_bpe(directory: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE with a small vocabulary: most words are several tokens, and merges cross letters, so a
    word count is far from the token count."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES, trainer)
    return _save(tokenizer, directory)


def _save(tokenizer: Tokenizer, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory
