"""The one ordering of Ascend version strings, and the vendor files' range checks (pure, standard library only).

Huawei spells versions several ways: drivers "24.1.rc3", "24.1.RC3", "24.1.rc2.2", "25.0.rc1.1", "25.5.0";
CANN "8.0.RC3", "8.1.RC1.alpha001", "8.3.RC2", "9.0.0-beta.2"; firmware "7.5.0.1.129"; vllm-ascend tags
"v0.13.0rc1".  They are neither PEP 440 ("8.1.RC1.alpha001" does not parse) nor semver, so
``packaging.version`` cannot order them.  The order is hand-written, and written here, in the standard
library only, because the emulated ``npu-smi`` (a zipapp run by a bare host's /usr/bin/python3, see
dsctl.lab.packages.DRIVER_TOOLS) judges driver/firmware compatibility with it: the emulator, the roles'
facts and ``dsctl check`` must agree on what is newer and what is "compatible".  Controller code reaches it
through dsctl.core.fleet.versions.

Order: numbers compare as numbers ("7.10" > "7.9"); a pre-release word (dev < alpha < beta < rc) sorts
before the final release of the same numbers ("24.1.rc3" < "24.1.0", "8.0.RC3" < "8.0.0"); what follows
the word counts within it ("24.1.rc2" < "24.1.rc2.2" < "24.1.rc3" < "24.1.rc10").  Any other word ("post",
"spc", "b060") marks something released after the numbers before it.  Letters compare case-insensitively,
so "24.1.RC3" and "24.1.rc3" are one version.  Missing trailing parts count as 0 ("25.5" == "25.5.0").
A leading "v" before a digit and a "+local" suffix ("2.9.0.post1+git4c901a4") are ignored.

Two notions of "the same" are kept apart on purpose:

* `same_version`: equal in this order ("25.5" == "25.5.0"), for "is it at least / at most" questions.
* `same_release`: the same release name, spelled with any case ("24.1.RC3" is the 24.1.rc3 package, but
  "25.5" is a release line, not the 25.5.0 package), for looking a version up in the releases data or
  comparing what a host runs with what it should run.  Two names that are the same release are always
  the same version (the tests check it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

# Pre-release words, earliest first.
PRERELEASE_WORDS = ("dev", "alpha", "beta", "rc")

# (rank, number, word): rank 0 = pre-release word (number = its place in PRERELEASE_WORDS),
# 1 = number, 2 = any other word.  Tuples of tokens compare in release order.
Token = tuple[int, int, str]
_ZERO: Token = (1, 0, "")
_TOKEN_RE = re.compile(r"\d+|[a-z]+")


def _normalized_text(version: str) -> str:
    text = str(version).strip().lower().split("+", 1)[0]
    if text.startswith("v") and text[1:2].isdigit():
        text = text[1:]
    return text


def parse_version(version: str) -> tuple[Token, ...]:
    """Tokens of a version: "8.1.RC1.alpha001" -> 8, 1, rc, 1, alpha, 1.

    Splits at dots, dashes, underscores and at every letter/digit boundary, case-insensitively,
    after dropping a leading "v" and a "+local" suffix.  Empty parts ("24.1." upper bounds) carry nothing.
    """
    tokens: list[Token] = []
    for part in _TOKEN_RE.findall(_normalized_text(version)):
        if part.isdigit():
            tokens.append((1, int(part), ""))
        elif part in PRERELEASE_WORDS:
            tokens.append((0, PRERELEASE_WORDS.index(part), ""))
        else:
            tokens.append((2, 0, part))
    return tuple(tokens)


def _padded(tokens: tuple[Token, ...], width: int) -> tuple[Token, ...]:
    return tokens + (_ZERO,) * (width - len(tokens))


def compare_versions(left: str, right: str) -> int:
    """-1, 0 or 1 as ``left`` sorts before, with or after ``right``."""
    a, b = parse_version(left), parse_version(right)
    width = max(len(a), len(b))
    a, b = _padded(a, width), _padded(b, width)
    return (a > b) - (a < b)


version_key = functools.cmp_to_key(compare_versions)
"""Sort key: ``sorted(versions, key=version_key)``."""


def sort_versions(versions: Iterable[str], *, newest_first: bool = False) -> list[str]:
    return sorted(versions, key=version_key, reverse=newest_first)


def same_version(left: str, right: str) -> bool:
    """Equal in the order above: "24.1.RC3" is "24.1.rc3", "v0.13.0" is "0.13.0", "25.5" is "25.5.0"."""
    return compare_versions(left, right) == 0


def same_release(left: str | None, right: str | None) -> bool:
    """The same release name, whatever the case: "24.1.RC3" is 24.1.rc3, "v0.13.0" is 0.13.0; "25.5" is not 25.5.0.

    None (unknown) is the same release as nothing, not even another None.
    """
    if left is None or right is None:
        return False
    return _normalized_text(left) == _normalized_text(right)


def in_release_line(version: str, line: str | None) -> bool:
    """Whether ``version`` belongs to the release line ``line``: "25.5" covers 25.5.0 and 25.5.1, "24.1.rc2"
    covers 24.1.rc2.2, "24.1" does not cover 24.10.0 (recommendations name lines, not packages)."""
    if not line:
        return False
    bound = parse_version(line)
    return bool(bound) and _cut(parse_version(version), len(bound)) == bound


def is_prerelease(version: str) -> bool:
    return any(rank == 0 for rank, _, _ in parse_version(version))


def _cut(tokens: tuple[Token, ...], width: int) -> tuple[Token, ...]:
    return _padded(tokens[:width], width)


def in_ranges(version: str, ranges: Iterable[Sequence[str]]) -> bool:
    """Whether ``version`` lies in one of ``ranges``: [("7.0.0", "7.5.99")] (a driver's compatible_version_fw)
    or [("24.1", "24.1.")] (a firmware's compatible_version_drv).

    A bound is compared with the version cut to the bound's length (ascend-interfaces.md section 8 rule 2),
    so bounds act as prefixes: 7.5.0.1.129 and 7.5.99.9.999 lie in [7.0.0, 7.5.99]; ["24.1", "24.1."] means
    24.1 and every 24.1.* (the trailing dot only marks the prefix), so 24.1.rc3 and 24.1.0 match and 24.10.0
    and 24.2.0 do not; 23.0.rc3 is not in ["23.0.0", "23.0.0."] (a pre-release of 23.0.0, not a 23.0.0.*
    build).  The driver's own DCMI check (dcmi_judge_compatibility) cuts and compares strings with strcmp,
    which agrees for the published ranges but would misorder 7.10 vs 7.9; numeric order is the intended one.
    """
    tokens = parse_version(version)
    if not tokens:
        return False
    for low, high in ranges:
        low_tokens, high_tokens = parse_version(low), parse_version(high)
        if not low_tokens or not high_tokens:
            continue
        if _cut(tokens, len(low_tokens)) >= low_tokens and _cut(tokens, len(high_tokens)) <= high_tokens:
            return True
    return False
