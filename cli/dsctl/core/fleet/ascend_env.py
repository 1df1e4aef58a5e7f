"""The environment of NPU processes: checked overrides, the profile.d script and its inverse (pure).

The variables dsctl knows, their kinds, defaults and sources are data (``dsctl/data/ascend_env.yaml``);
this module only applies them.  `resolve_env` merges an inventory's ``dsctl_ascend_env`` over the
defaults, `render_env_file` writes the sh script the hosts source, `parse_env_file` reads it back for
drift checks.  A value is refused before it reaches a host: a wrong one fails only when a model loads,
and the runtime's own message rarely names the variable.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Mapping
from typing import Any

from dsctl import data
from dsctl.errors import DsctlError, ExitStatus

INVENTORY_VAR = "dsctl_ascend_env"
HEADER = (
    "# managed by dsctl, do not edit: rewritten from the inventory's dsctl_ascend_env on every provision\n"
    "# NPU process environment; variables and sources: dsctl/data/ascend_env.yaml\n"
)
_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT])(?:I?B)?$", re.IGNORECASE)
_SIZE_FACTORS = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}  # in KB
_AFFINITY_RANGE_RE = re.compile(r"^npu(\d+):(\d+)-(\d+)$")


class EnvError(DsctlError):
    exit_status = ExitStatus.USAGE


class _Invalid(ValueError):
    """A value that does not fit its kind: what was expected and how to write it instead."""

    def __init__(self, expected: str, fix: str):
        super().__init__(expected)
        self.expected = expected
        self.fix = fix


def catalogue() -> dict[str, dict[str, Any]]:
    """Name -> spec of every variable dsctl may set (``ascend_env.yaml``)."""
    return data.load("ascend_env")["variables"]


def default_env(variables: Mapping[str, Mapping] | None = None) -> dict[str, str]:
    variables = catalogue() if variables is None else variables
    return {name: str(spec["default"]) for name, spec in sorted(variables.items()) if spec.get("default") is not None}


# --------------------------------------------------------------------------- resolve


def resolve_env(overrides: Mapping[str, Any] | None, *,
                variables: Mapping[str, Mapping] | None = None) -> dict[str, str]:
    """Defaults merged with ``overrides`` (an override of None removes a default), every value checked.

    Returns NAME -> value string, sorted by name.  Raises `EnvError` with one line naming the variable.
    """
    variables = catalogue() if variables is None else variables
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise EnvError(f"{INVENTORY_VAR}: expected a mapping of NAME: value, got {_shown(overrides)}; "
                       "write one variable per line under it")
    env = default_env(variables)
    for key, value in overrides.items():
        name = str(key)
        spec = _known(name, variables)
        if value is None:
            env.pop(name, None)
            continue
        try:
            env[name] = _checked(spec, value)
        except _Invalid as invalid:
            raise EnvError(f"{INVENTORY_VAR}.{name}: expected {invalid.expected}, got {_shown(value)}; "
                           f"{invalid.fix}") from None
    return dict(sorted(env.items()))


def _known(name: str, variables: Mapping[str, Mapping]) -> Mapping:
    if name in variables:
        return variables[name]
    misnamed = next((known for known, spec in variables.items() if name in spec.get("misnomers", ())), None)
    if misnamed:
        raise EnvError(f"{INVENTORY_VAR}.{name}: no such variable in the CANN documentation; did you mean {misnamed}?")
    close = difflib.get_close_matches(name, list(variables), n=1)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(variables))}"
    raise EnvError(f"{INVENTORY_VAR}.{name}: not a variable dsctl sets; {hint}")


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _checked(spec: Mapping, value: Any) -> str:
    kind = spec["kind"]
    if kind == "int":
        return _int_value(spec, value)
    if kind == "float":
        return _float_value(spec, value)
    if kind == "enum":
        return _enum_value(spec, value)
    if kind == "path":
        return _path_value(spec, value)
    if kind == "string":
        return _string_value(value)
    if kind == "options":
        return _options_value(spec, value)
    if kind == "cpu_affinity":
        return _cpu_affinity_value(spec, value)
    raise ValueError(f"ascend_env.yaml: unknown kind {kind!r}")  # a data bug, not a user error


# --------------------------------------------------------------------------- kinds


def _int_words(spec: Mapping) -> str:
    unit = spec.get("unit")
    return f"an integer number of {unit}" if unit and unit != "%" else ("a percentage" if unit else "an integer")


def _int_range(spec: Mapping) -> str:
    low, high = spec.get("min"), spec.get("max")
    bounds = f" from {low} to {high}" if low is not None and high is not None else (
        f" >= {low}" if low is not None else (f" <= {high}" if high is not None else ""))
    special = "".join(f" or {value} ({meaning})" for value, meaning in spec.get("special", {}).items())
    return f"{_int_words(spec)}{bounds}{special}"


def _in_unit(text: str, unit: str | None) -> int | None:
    """A size written with a suffix in the variable's unit ("1G" in MB -> 1024), for the fix text."""
    match = _SIZE_RE.match(text.strip())
    if not match or unit not in ("KB", "MB", "GB"):
        return None
    size_kb = float(match[1]) * _SIZE_FACTORS[match[2].upper()]
    value = size_kb / _SIZE_FACTORS[unit[0]]
    return int(value) if value == int(value) else None


def _example(spec: Mapping) -> str:
    if spec.get("default") is not None:
        return str(spec["default"])
    return str(spec.get("min", 1)) if spec["kind"] == "int" else ""


def _int_value(spec: Mapping, value: Any) -> str:
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if text is None or not re.fullmatch(r"-?\d+", text):
        converted = _in_unit(str(value), spec.get("unit")) if isinstance(value, str) else None
        fix = f"write {converted}" if converted is not None else f"write a plain number such as {_example(spec)}"
        raise _Invalid(_int_words(spec), fix)
    number = int(text)
    if str(number) in spec.get("special", {}):
        return str(number)
    low, high = spec.get("min"), spec.get("max")
    if (low is not None and number < low) or (high is not None and number > high):
        raise _Invalid(_int_range(spec), f"write a value in range, e.g. {_example(spec)}")
    return str(number)


def _float_value(spec: Mapping, value: Any) -> str:
    above, below = spec.get("above"), spec.get("below")
    expected = f"a number between {above} and {below} (exclusive)"
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (above is not None and number <= above) or (below is not None and number >= below):
        raise _Invalid(expected, "write e.g. 0.8")
    return str(value).strip()


def _enum_value(spec: Mapping, value: Any) -> str:
    allowed = [str(v) for v in spec["values"]]
    expected = f"one of {', '.join(allowed)}"
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if text in allowed:
        return text
    same_letters = [v for v in allowed if text is not None and v.lower() == text.lower()]
    raise _Invalid(expected, f"write {same_letters[0]}" if same_letters else "pick one of them")


def _path_value(spec: Mapping, value: Any) -> str:
    expected = "an absolute path"
    if spec.get("pattern"):
        expected += " of letters, digits, '_', '-' and '.'"
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\n\r\0"):
        raise _Invalid(expected, "write a path that starts with /")
    if spec.get("pattern") and not re.match(spec["pattern"], value):
        raise _Invalid(expected, "rename the directory without other characters")
    return value


def _string_value(value: Any) -> str:
    if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
        raise _Invalid("a one-line string", "quote the value")
    return value


def _options_value(spec: Mapping, value: Any) -> str:
    """key:value pairs separated by commas, e.g. "max_split_size_mb:250,garbage_collection_threshold:0.8"."""
    options = spec["options"]
    expected = f"comma-separated key:value pairs with keys {', '.join(options)}"
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(expected, f"write e.g. {spec.get('default') or next(iter(options)) + ':...'}")
    pairs: dict[str, str] = {}
    for item in value.split(","):
        key, colon, raw = (part.strip() for part in item.partition(":"))
        if not colon or not raw:
            raise _Invalid(expected, f"write each item as key:value, not {item.strip()!r}")
        if key not in options:
            close = difflib.get_close_matches(key, list(options), n=1)
            raise _Invalid(expected, f"{key!r} is not a key" + (f"; did you mean {close[0]}?" if close else ""))
        if key in pairs:
            raise _Invalid(expected, f"give {key} once")
        try:
            pairs[key] = _checked(options[key], raw)
        except _Invalid as invalid:
            raise _Invalid(f"{key} as {invalid.expected}", invalid.fix) from None
    for rule in spec.get("exclusive", []):
        if all(pairs.get(k) == str(v) for k, v in rule["when"].items()):
            clash = [key for key in rule["forbids"] if key in pairs]
            if clash:
                when = ",".join(f"{k}:{v}" for k, v in rule["when"].items())
                raise _Invalid(f"{when} without {', '.join(rule['forbids'])}",
                               f"drop {', '.join(clash)} or change {when}")
    return ",".join(f"{key}:{raw}" for key, raw in pairs.items())


def _cpu_affinity_value(spec: Mapping, value: Any) -> str:
    """A mode, optionally with per-NPU core ranges: "1" or "1,npu0:0-1,npu1:2-5"."""
    modes = [str(m) for m in spec["modes"]]
    expected = f"a mode ({', '.join(modes)}) optionally followed by ,npu<id>:<first core>-<last core> ranges"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Invalid(expected, "write e.g. 1 or 1,npu0:0-23")
    mode, *ranges = (part.strip() for part in str(value).split(","))
    if mode not in modes:
        raise _Invalid(expected, "start with the mode, e.g. 1")
    for item in ranges:
        match = _AFFINITY_RANGE_RE.match(item)
        if not match or int(match[2]) > int(match[3]):
            raise _Invalid(expected, f"write ranges as npu0:0-23, not {item!r}")
    if ranges and mode == "0":
        raise _Invalid(expected, "core ranges need mode 1 or 2")
    return ",".join([mode, *ranges])


# --------------------------------------------------------------------------- the env file


def render_env_file(env: Mapping[str, str], *, toolkit_set_env: str, nnal_set_env: str) -> str:
    """The POSIX sh script (``dsctl_env_file``): CANN's own set_env.sh files when present, then the exports.

    The set_env.sh lines are guarded so the script also works before CANN is installed; values are
    single-quoted (shlex's quoting) so nothing in them is expanded.
    """
    lines = [HEADER.rstrip("\n")]
    for script in (toolkit_set_env, nnal_set_env):
        quoted = shlex.quote(script)
        lines.append(f"[ -f {quoted} ] && . {quoted}")
    for name, value in sorted(env.items()):
        if not _NAME_RE.match(name):
            raise EnvError(f"{INVENTORY_VAR}.{name}: not a valid environment variable name; use A-Z, 0-9 and _")
        lines.append(f"export {name}={_single_quoted(str(value))}")
    return "\n".join(lines) + "\n"


def _single_quoted(value: str) -> str:
    # shlex.quote leaves "safe" values bare; always quoting keeps every export line the same shape.
    return "'" + value.replace("'", "'\"'\"'") + "'"


def parse_env_file(text: str) -> dict[str, str]:
    """NAME -> value of every ``export NAME=value`` (or bare ``NAME=value``) line: the inverse of
    `render_env_file` for drift checks.  Comments and the set_env.sh lines are skipped."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "[", ".", "source ")):
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError:
            continue  # an unbalanced quote: not a line dsctl wrote
        if words and words[0] == "export":
            words = words[1:]
        for word in words:
            name, equals, value = word.partition("=")
            if equals and _NAME_RE.match(name):
                env[name] = value
    return env
