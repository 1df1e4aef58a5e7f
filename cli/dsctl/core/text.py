"""Strings are single-line by type: the one rule every name, path, user, group, version and env name passes (pure).

Inventory strings end up in unit files, env files, nginx's configuration, shell scripts and command lines, where a
line break ends one directive and starts another, and a blank around a value is either stripped by one reader and
kept by the next or makes a second word.  So `Text`, the string type of every dsctl schema (inventory, services,
multi-host services, gateway, NPU network plan), refuses control characters and surrounding blanks before any
other rule looks at the value, and the error names the field: ``dsctl_run_user: expected one line without control
characters or surrounding blanks, got 'root\\n' (a line break); fix it in group_vars or host_vars``.

Python's ``re`` ``$`` also matches before a final line break (https://docs.python.org/3/library/re.html, "$"),
so a pattern written ``^...$`` and used with ``.match`` accepts "root\\n": dsctl's patterns are used with
``fullmatch`` instead, and this type refuses the line break before any pattern runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field

# C0 controls and DEL, the C1 controls (U+0085 NEL among them) and the Unicode line and paragraph separators:
# every character str.splitlines() breaks at (https://docs.python.org/3/library/stdtypes.html#str.splitlines)
# and every one a terminal or a config parser may act on.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMES = {"\n": "a line break", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
ONE_LINE_WORDS = "one line without control characters or surrounding blanks"


class StatedProblem(ValueError):
    """A type's refusal that says itself what is wrong ("expected ..., got ..." or "... is refused: why"): the
    schemas' error lines put the field before it and their fix after it, instead of the field's description."""


class NotOneLine(StatedProblem):
    """A string with a control character or a surrounding blank."""


def control_character(value: str) -> bool:
    """Whether ``value`` holds a control character (a line break, a tab, an escape, NUL, ...)."""
    return _CONTROL_RE.search(value) is not None


def one_line(value: str) -> str:
    """``value`` if it is one line without control characters and without leading or trailing blanks."""
    found = _CONTROL_RE.search(value)
    if found:
        what = _NAMES.get(found.group(), f"the control character {found.group()!r}")
        raise NotOneLine(f"expected {ONE_LINE_WORDS}, got {value!r} ({what})")
    if value != value.strip():
        raise NotOneLine(f"expected {ONE_LINE_WORDS}, got {value!r} (blanks around it)")
    return value


def stated_problem(error: Mapping[str, Any]) -> str | None:
    """The `StatedProblem` message of a pydantic error (None for any other error): the schemas' error lines use it
    instead of the field's description, which would not say what is wrong with the value."""
    cause = (error.get("ctx") or {}).get("error")
    return str(cause) if isinstance(cause, StatedProblem) else None


# strict: YAML's 24.1 stays a float and is refused, never turned into the string "24.1".
Text = Annotated[str, Field(strict=True), AfterValidator(one_line)]
