"""Ordering and range checks for Ascend version strings (pure).

Huawei spells versions several ways: drivers "24.1.rc3", "24.1.RC3", "24.1.rc2.2", "25.0.rc1.1";
CANN "8.0.RC3", "8.1.RC1.alpha001", "9.0.0-beta.2"; vllm-ascend tags "v0.13.0rc1".  They are
neither PEP 440 nor semver, so `packaging.version` cannot order them: this module does.

Order: numbers compare as numbers; a pre-release word (dev < alpha < beta < rc) sorts before the
final release of the same numbers ("24.1.rc3" < "24.1.0", "8.0.RC3" < "8.0.0"); what follows the
word counts within it ("24.1.rc2" < "24.1.rc2.2" < "24.1.rc3").  Missing trailing parts count as 0,
so "25.5" == "25.5.0".  A "+local" suffix ("2.9.0.post1+git4c901a4") is ignored.

Range membership (the vendor files' compatible_version_fw / compatible_version_drv) is the
component-wise numeric check of `dsctl.core.hostfacts.npusmi.firmware_in_ranges`, reused, not copied:
the emulated npu-smi and dsctl must agree on what "compatible" means.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from dsctl.core.hostfacts.npusmi import firmware_in_ranges
from dsctl.core.hostfacts.versionfiles import format_ranges

# Pre-release words, earliest first.  Anything else that is not a number ("post", "spc", "b060")
# marks something released after the numbers before it.
PRERELEASE_WORDS = ("dev", "alpha", "beta", "rc")

# (rank, number, word): rank 0 = pre-release word, 1 = number, 2 = any other word.
Token = tuple[int, int, str]
_PAD: Token = (1, 0, "")
_TOKEN_RE = re.compile(r"\d+|[a-z]+")


def parse_version(version: str) -> tuple[Token, ...]:
    """Tokens of a version: "8.1.RC1.alpha001" -> 8, 1, rc, 1, alpha, 1.

    Splits at dots, dashes, underscores and at every letter/digit boundary, case-insensitively,
    after dropping a leading "v" and a "+local" suffix.
    """
    text = str(version).strip().lower().split("+", 1)[0]
    if text.startswith("v") and text[1:2].isdigit():
        text = text[1:]
    tokens: list[Token] = []
    for part in _TOKEN_RE.findall(text):
        if part.isdigit():
            tokens.append((1, int(part), ""))
        elif part in PRERELEASE_WORDS:
            tokens.append((0, PRERELEASE_WORDS.index(part), ""))
        else:
            tokens.append((2, 0, part))
    return tuple(tokens)


def compare_versions(left: str, right: str) -> int:
    """-1, 0 or 1 as ``left`` sorts before, with or after ``right``."""
    a, b = parse_version(left), parse_version(right)
    width = max(len(a), len(b))
    a += (_PAD,) * (width - len(a))
    b += (_PAD,) * (width - len(b))
    return (a > b) - (a < b)


version_key = functools.cmp_to_key(compare_versions)
"""Sort key: ``sorted(versions, key=version_key)``."""


def sort_versions(versions: Iterable[str], *, newest_first: bool = False) -> list[str]:
    return sorted(versions, key=version_key, reverse=newest_first)


def same_version(left: str, right: str) -> bool:
    """Equal under the order above: "24.1.RC3" is "24.1.rc3", "v0.13.0" is "0.13.0"."""
    return compare_versions(left, right) == 0


def is_prerelease(version: str) -> bool:
    return any(rank == 0 for rank, _, _ in parse_version(version))


def in_ranges(version: str, ranges: Iterable[Sequence[str]]) -> bool:
    """Whether ``version`` lies in one of ``ranges`` ([["7.0.0", "7.5.99"]], a driver's
    compatible_version_fw), compared component by component, numerically."""
    return firmware_in_ranges(version, format_ranges(ranges))


def matches_prefix_ranges(driver: str, ranges: Iterable[Sequence[str]]) -> bool:
    """Whether ``driver`` matches one of a firmware's compatible_version_drv ranges.

    ``["24.1", "24.1."]`` means 24.1 and every 24.1.* (ascend-interfaces.md section 8): a bound is
    compared with the version cut to the bound's length, so the trailing dot of the upper bound
    only marks it as a prefix.  That is the same cut-and-compare as the firmware ranges, hence one
    implementation: 24.1.rc3 and 24.1.0 match, 24.10.0 and 24.2.0 do not, and 23.0.rc3 does not
    match ["23.0.0", "23.0.0."] (it is a pre-release of 23.0.0, not a 23.0.0.* build).
    """
    return in_ranges(driver, ranges)
