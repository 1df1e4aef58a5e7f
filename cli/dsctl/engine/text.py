"""Synthetic tokens: deterministic text with no weights.

* Tokenising is dsctl.core.load.tokens' rule (the probe plans prompt lengths by it too).  Generated tokens are
  short words with a leading space, so re-tokenising an output gives back its token count.
* Output: token ``i`` of a request is a function of (engine seed, prompt,
  request seed, i) only: the same prompt gives the same text on every run.
* KV sparsity: with divergence probability ``p`` (from the threshold, see
  ``dsctl.core.perf.perfmodel.divergence_probability``) token ``i`` is replaced by another word when
  ``u_i < p``, where ``u_i`` is a uniform number fixed per (prompt, i).
  ``u_i`` does not depend on the threshold, so the positions that differ from
  the threshold-0 output at a threshold t1 are a subset of those at any
  t2 > t1: divergence is monotone in the threshold for every prompt, and its
  expected share is ``p``.  (A real model's divergence would also cascade
  through later tokens; this model keeps each position independent so the
  share of differing tokens is a direct, smooth measure.)
"""
from __future__ import annotations

import hashlib

_ONSETS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
SYLLABLES = [c + v for c in _ONSETS for v in _VOWELS]  # 70


def _word(value: int) -> str:
    syllables = 1 + value % 3
    value //= 3
    parts = []
    for _ in range(syllables):
        parts.append(SYLLABLES[value % len(SYLLABLES)])
        value //= len(SYLLABLES)
    return " " + "".join(parts)


class SyntheticText:
    """Token generator for one request."""

    def __init__(self, prompt_key: bytes, *, seed: int = 0, divergence: float = 0.0):
        self._key = hashlib.blake2b(prompt_key, digest_size=16, key=str(seed).encode()[:64]).digest()
        self._threshold = int(min(max(divergence, 0.0), 1.0) * 2**32)

    def token(self, position: int) -> str:
        digest = hashlib.blake2b(position.to_bytes(8, "little"), digest_size=16, key=self._key).digest()
        base = int.from_bytes(digest[0:6], "little")
        u = int.from_bytes(digest[6:10], "little")
        if u < self._threshold:
            alt = int.from_bytes(digest[10:16], "little")
            word = _word(alt)
            if word == _word(base):
                word = _word(alt + 3)
            return word
        return _word(base)

    def text(self, start: int, count: int) -> str:
        return "".join(self.token(i) for i in range(start, start + count))


def prompt_key(prompt: str | list[int], request_seed: int | None = None) -> bytes:
    if isinstance(prompt, str):
        data = prompt.encode("utf-8", "surrogatepass")
    else:
        data = b"ids:" + ",".join(str(t) for t in prompt).encode()
    if request_seed is not None:
        data += f"|seed={request_seed}".encode()
    return data
