"""Ordering, equality and range checks of Ascend version strings, for controller code (pure).

The implementation is `dsctl.core.hostfacts.versionorder`, hand-written in the standard library because the
emulated npu-smi on lab hosts judges driver/firmware compatibility with the same code (see its docstring for
the order and for why ``packaging.version`` cannot be used: Ascend versions are not PEP 440).  This module is
the name controller code imports (matrix, compat, the service schema; hostfacts.hoststate uses the
implementation directly), so they all order and compare versions alike.
Python-side versions (the serving venv's interpreter and wheels) are PEP 440 and go through ``packaging``.
"""

from __future__ import annotations

import re

from dsctl.core.hostfacts.versionorder import (
    PRERELEASE_WORDS,
    compare_versions,
    in_ranges,
    in_release_line,
    is_prerelease,
    parse_version,
    same_release,
    same_version,
    sort_versions,
    version_key,
)

# A firmware's compatible_version_drv ranges (["24.1", "24.1."]) are prefix ranges; the cut-and-compare of
# in_ranges is exactly prefix matching for them, so both range kinds share one implementation.
matches_prefix_ranges = in_ranges

# What an inventory may write as a version (the dsctl_*_version settings, dsctl_min_kernel_version): an optional
# "v", a number, then dot-separated parts of letters and digits, later parts also after "-" or "_", and an
# optional "+local" suffix: "24.1.rc3", "8.0.RC3", "8.5.0.lab1", "v0.13.0rc1", "9.0.0-beta.2",
# "5.10.0-136.12.0.86.oe2203sp1.aarch64".  The first separator is a dot, so a YAML date (2024-01-01, which
# the reader hands on as that text) is no version; no blank, quote or ";" either, so nothing a shell or a
# template could read.  64 characters: a kernel release string's own bound (__NEW_UTS_LEN, linux/utsname.h).
MAX_VERSION_LENGTH = 64
VERSION_TEXT = re.compile(r"v?[0-9]+[A-Za-z0-9]*(?:\.[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*)?(?:\+[A-Za-z0-9.]+)?")
VERSION_WORDS = 'a quoted version such as "8.0.RC3" (digits and dots, parts such as RC3 or lab1)'


def version_text(value: str) -> str:
    """``value`` when it is a version an inventory may write (`VERSION_TEXT`); ValueError otherwise."""
    if len(value) > MAX_VERSION_LENGTH or not VERSION_TEXT.fullmatch(value):
        raise ValueError(f"not a version: expected {VERSION_WORDS}")
    return value

__all__ = [
    "MAX_VERSION_LENGTH",
    "PRERELEASE_WORDS",
    "VERSION_TEXT",
    "VERSION_WORDS",
    "compare_versions",
    "in_ranges",
    "in_release_line",
    "is_prerelease",
    "matches_prefix_ranges",
    "parse_version",
    "same_release",
    "same_version",
    "sort_versions",
    "version_key",
    "version_text",
]
