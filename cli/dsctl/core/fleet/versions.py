"""Ordering, equality and range checks of Ascend version strings, for controller code (pure).

The implementation is `dsctl.core.hostfacts.versionorder`, hand-written in the standard library because the
emulated npu-smi on lab hosts judges driver/firmware compatibility with the same code (see its docstring for
the order and for why ``packaging.version`` cannot be used: Ascend versions are not PEP 440).  This module is
the name controller code imports (matrix, compat, the service schema; hostfacts.hoststate uses the
implementation directly), so they all order and compare versions alike.
Python-side versions (the serving venv's interpreter and wheels) are PEP 440 and go through ``packaging``.
"""

from __future__ import annotations

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

__all__ = [
    "PRERELEASE_WORDS",
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
]
