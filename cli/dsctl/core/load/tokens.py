"""The lab engine's token rule (pure, standard library only: the engine imports it on every lab host).

A prompt's token count is the number of words and punctuation marks, a word longer than ``CHARS_PER_TOKEN``
characters counting one token per started ``CHARS_PER_TOKEN`` characters (close to BPE on English).  A prompt given
as token ids counts one token per id.  The emulated engine (dsctl.engine) counts by it, and the probe
(dsctl.core.load.workload, dataset) and the offline evaluator (dsctl.core.perf.evaluate) plan by it, so their
lengths are the engine's.  `block_hashes` keys a token sequence's blocks as vLLM V1's prefix cache does.
"""

from __future__ import annotations

import hashlib
import re

CHARS_PER_TOKEN = 8
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    count = 0
    for piece in _TOKEN_RE.findall(text):
        count += -(-len(piece) // CHARS_PER_TOKEN)
    return count


def token_units(text: str) -> list[str]:
    """The prompt's tokens as ``count_tokens`` counts them (a long word gives one unit per started 8 characters)."""
    units: list[str] = []
    for piece in _TOKEN_RE.findall(text):
        units.extend(piece[i:i + CHARS_PER_TOKEN] for i in range(0, len(piece), CHARS_PER_TOKEN))
    return units


def block_hashes(units: list[str], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a token sequence, as vLLM V1's prefix cache keys blocks (each block's
    hash covers its tokens and the hash of the block before it)."""
    hashes: list[int] = []
    parent = b""
    for start in range(0, len(units) - block_size + 1, block_size):
        digest = hashlib.blake2b("\x1f".join(units[start:start + block_size]).encode("utf-8", "surrogatepass"),
                                 digest_size=8, key=parent[:64]).digest()
        hashes.append(int.from_bytes(digest, "little"))
        parent = digest
    return tuple(hashes)
