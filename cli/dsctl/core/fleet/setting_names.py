"""Variables whose name is a mistyped dsctl setting (pure, standard library only: the inventory reader's child
process runs it on every variable of every host without importing the schema).

dsctl reads only ``dsctl_*`` variables, and refuses an unknown one with a "did you mean" (core/inventory/schema).  A
mistyped prefix (``dsctl-serving_venv``, ``dsct_serving_venv``, ``DSCTL_npu_count``) would not even be read: the
default would be used in silence.  A variable is taken for a mistyped setting when its name, lower-cased and with
``-`` as ``_``, is a setting's, or is at most two edits from one (the prefix included), or is a setting's name
with a prefix at most two edits from ``dsctl``; its first characters must be close to ``dsctl_`` either way, so
other tools' variables (``ansible_*``, a site's own) are never taken for one.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "dsctl_"
MAX_EDITS = 2


def edits(left: str, right: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of neighbours.

    Written here because the standard library has none: difflib (the schema's "did you mean" among dsctl_* names)
    gives a similarity ratio, which cannot say "at most two keystrokes off the prefix" for names of any length, and
    the inventory reader's child must not import a third-party package for twelve lines."""
    previous2: list[int] = []
    previous = list(range(len(right) + 1))
    for i, a in enumerate(left, 1):
        current = [i] + [0] * len(right)
        for j, b in enumerate(right, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b))
            if i > 1 and j > 1 and a == right[j - 2] and left[i - 2] == b:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def misspelt_setting(key: str, settings: Iterable[str]) -> str | None:
    """The dsctl setting ``key`` is a mistyped name of, or None (a ``dsctl_*`` key itself is the schema's)."""
    if key.startswith(PREFIX):
        return None
    normalised = key.lower().replace("-", "_")
    if edits(normalised[:len(PREFIX)], PREFIX) > MAX_EDITS:
        return None
    names = list(settings)
    if normalised in names:
        return normalised
    distance, closest = min(((edits(normalised, name), name) for name in names), default=(MAX_EDITS + 1, ""))
    if distance <= MAX_EDITS:
        return closest
    head, _, tail = normalised.partition("_")
    if tail and PREFIX + tail in names and edits(head, PREFIX.rstrip("_")) <= MAX_EDITS:
        return PREFIX + tail
    return None


def misspelt_message(key: str, setting: str) -> str:
    """The refusal's text after ``inventory: host H:``."""
    return (f"{key}: not read by dsctl (its settings are spelt dsctl_, lower case); did you mean {setting}? "
            "rename it in group_vars or host_vars")
