"""The environment of NPU processes: checked overrides, the profile.d script and its inverse (pure).

The variables dsctl knows, their kinds, defaults, sources and named profiles are data
(``dsctl/data/ascend_env.yaml``); this module only applies them.  `resolve_env` lays a profile
(``dsctl_ascend_env_profile``) and then an inventory's ``dsctl_ascend_env`` over the defaults,
`annotated_env` says where each value comes from and how sure that source is, `render_env_file` writes the
sh script the hosts source, `parse_env_file` reads it back for drift checks.

`check_variable` is the one rule for a variable, host env and a service's ``env:`` alike
(dsctl.core.serving.service): a value is refused before it reaches a host (a wrong one fails only when a model
loads, and the runtime's own message rarely names the variable); a name only field guides use
(field-practice.md, "Memory env") is accepted with a warning naming the documented setting for the same
failure; a name dsctl does not know is written with a warning, unless it is a typo of one it knows.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Mapping
from typing import Any

from dsctl import data
from dsctl.core.text import control_character
from dsctl.errors import DsctlError, ExitStatus

INVENTORY_VAR = "dsctl_ascend_env"
PROFILE_VAR = "dsctl_ascend_env_profile"
# A name this close to a known one is a typo (refused); further away it is some other variable (a warning).
_TYPO_CUTOFF = 0.85
CONFIDENCE_WORDS = {
    "official": "documented",
    "observed": "observed in public deploy recipes",
    "inferred": "inferred, verify on hardware",
    "field": "field practice, effect unknown",
    "emulation": "dsctl's emulated engine only (the lab)",
}
HEADER = (
    "# managed by dsctl, do not edit: rewritten from the inventory's dsctl_ascend_env_profile and dsctl_ascend_env\n"
    "# on every provision\n"
    "# NPU process environment; variables and sources: dsctl/data/ascend_env.yaml\n"
)
_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# The environment variables that decide which code a process loads or runs, or how a shell reads its input, rather
# than how the NPU stack behaves.  dsctl_env_file is a profile.d script: every login shell on the host sources it,
# root's too, and every program those shells start inherits it, so one of these there changes every process on the
# host.  Refused in dsctl_ascend_env whatever the value; a service that needs one sets it in its own env.
LOADER_PREFIXES = {
    # ld.so(8), ENVIRONMENT: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, LD_BIND_NOW, ... all belong to the dynamic loader.
    "LD_": "the dynamic loader reads it (ld.so(8)): it chooses the libraries every program loads",
    # bash(1), FUNCTIONS: exported functions travel as BASH_FUNC_<name>%% and replace commands in every bash.
    "BASH_FUNC_": "bash imports it as a function (bash(1), FUNCTIONS) that replaces a command in every bash",
}
LOADER_VARIABLES = {
    "PATH": "every shell and execvp(3) look commands up in it",
    # glibc: iconv(3) loads gconv modules from GCONV_PATH; GLIBC_TUNABLES was CVE-2023-4911; LOCPATH, NLSPATH
    # choose the locale and message files every program reads (locale(7), catopen(3)).
    "GCONV_PATH": "glibc loads character-set modules from it (iconv(3))",
    "GLIBC_TUNABLES": "it changes glibc's allocator and loader in every program (tunables(7), CVE-2023-4911)",
    "LOCPATH": "glibc reads every program's locale data from it (locale(7))",
    "NLSPATH": "glibc reads every program's message catalogues from it (catopen(3))",
    # https://docs.python.org/3/using/cmdline.html#environment-variables
    "PYTHONPATH": "every Python process imports modules from it first",
    "PYTHONHOME": "every Python process takes its standard library from it",
    "PYTHONSTARTUP": "interactive Python runs the file it names",
    "PYTHONUSERBASE": "every Python process imports from the site-packages under it",
    "PYTHONPLATLIBDIR": "every Python process takes its platform library directory from it",
    "PYTHONBREAKPOINT": "Python imports and calls what it names on breakpoint()",
    # bash(1), INVOCATION and Shell Variables; dash(1) for ENV.
    "BASH_ENV": "every non-interactive bash runs the file it names (bash(1), INVOCATION)",
    "ENV": "every interactive sh runs the file it names (dash(1), bash(1) INVOCATION)",
    "IFS": "every shell splits words at its characters (bash(1), Word Splitting)",
    "CDPATH": "cd in every shell searches it (bash(1), Shell Variables)",
    "PS4": "bash expands it, command substitutions included, before each traced command (bash(1))",
    "PROMPT_COMMAND": "every interactive bash runs it before each prompt (bash(1))",
    "SHELLOPTS": "every bash starts with the options it lists (bash(1))",
    "BASHOPTS": "every bash starts with the options it lists (bash(1))",
    "GLOBIGNORE": "every bash drops the file names it matches from globs (bash(1))",
    # perlrun(1), ruby(1), node(1): the interpreters' own search paths and startup options.
    "PERL5LIB": "every perl imports modules from it first (perlrun(1))",
    "PERLLIB": "every perl imports modules from it first (perlrun(1))",
    "PERL5OPT": "every perl takes command-line options from it, -M modules included (perlrun(1))",
    "RUBYLIB": "every ruby loads libraries from it first (ruby(1))",
    "RUBYOPT": "every ruby takes options from it, -r libraries included (ruby(1))",
    "NODE_OPTIONS": "every node takes options from it, --require included (node(1))",
    "NODE_PATH": "every node loads modules from it (node(1))",
}
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


def profiles() -> dict[str, dict[str, Any]]:
    """Name -> profile (purpose, variables: NAME -> {value, source}) of every named env profile."""
    return data.load("ascend_env").get("profiles", {})


def default_env(variables: Mapping[str, Mapping] | None = None) -> dict[str, str]:
    variables = catalogue() if variables is None else variables
    return {name: str(spec["default"]) for name, spec in sorted(variables.items()) if spec.get("default") is not None}


# --------------------------------------------------------------------------- one variable: the one rule


def check_variable(name: str, value: Any, *, field: str = INVENTORY_VAR,
                   variables: Mapping[str, Mapping] | None = None) -> str:
    """``value`` of variable ``name`` as the environment holds it, checked by the catalogue's rule for it.

    The one check of a variable's name and value, for the host env and a service's env.  Raises `EnvError`,
    one line ``<field>.<name>: ...`` naming the fix.  A name the catalogue does not know passes unchecked
    (`warning` says so), unless it is a typo of one it knows or a misnomer."""
    variables = catalogue() if variables is None else variables
    spec = variables.get(name)
    if spec is None:
        misnamed = next((known for known, spec in variables.items() if name in spec.get("misnomers", ())), None)
        if misnamed:
            raise EnvError(f"{field}.{name}: no such variable in the CANN documentation; did you mean {misnamed}?")
        close = difflib.get_close_matches(name, list(variables), n=1, cutoff=_TYPO_CUTOFF)
        if close:
            raise EnvError(f"{field}.{name}: not a variable dsctl knows; did you mean {close[0]}?")
        return _string_or_number(name, value, field)
    try:
        return _checked(spec, value)
    except _Invalid as invalid:
        raise EnvError(f"{field}.{name}: expected {invalid.expected}, got {_shown(value)}; {invalid.fix}") from None


def variable_path(field: str, name: Any) -> str:
    """``field.NAME`` for a name that is one, ``field['na me\\n']`` (its repr) otherwise, so an error line stays one
    line whatever the key holds."""
    text = str(name)
    return f"{field}.{text}" if re.fullmatch(r"[A-Za-z0-9_.-]+", text) else f"{field}[{text!r}]"


def check_name(name: Any, variables: Mapping[str, Mapping] | None = None, *, field: str = INVENTORY_VAR) -> str:
    """A variable name of the NPU env (``dsctl_ascend_env``): one the catalogue lists, or upper case, digits and _
    (every CANN and engine variable is; POSIX.1-2017 XBD 8.1 reserves that form for the environment), and not one
    that changes which code every process loads (`LOADER_VARIABLES`).  Raises `EnvError` naming it."""
    variables = catalogue() if variables is None else variables
    text = str(name)
    path = variable_path(field, name)
    if text not in variables and not _NAME_RE.fullmatch(text):
        upper = text.upper()
        hint = f"write {upper}" if _NAME_RE.fullmatch(upper) else "use A-Z, 0-9 and _, not starting with a digit"
        raise EnvError(f"{path}: not an NPU environment variable name (CANN's and the engines' are upper-case "
                       f"letters, digits and _); {hint}")
    why = LOADER_VARIABLES.get(text) or next((why for prefix, why in LOADER_PREFIXES.items()
                                              if text.startswith(prefix)), None)
    if why:
        raise EnvError(f"{path}: refused in the NPU env: {why}, and dsctl_env_file sets it for every login shell "
                       "and program on the host; remove it (a service that needs it sets it in its "
                       "dsctl_services[].env)")
    return text


def _string_or_number(name: str, value: Any, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or control_character(str(value)):
        raise EnvError(f"{field}.{name}: expected a one-line string or a number, got {_shown(value)}; quote it")
    return str(value)


def warning(name: str, *, variables: Mapping[str, Mapping] | None = None) -> str | None:
    """One line for a variable CANN's reference does not list (None for a documented one): what it is believed to
    do and which documented setting covers the same failure."""
    variables = catalogue() if variables is None else variables
    spec = variables.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(variables), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return (f"{name} is not in CANN's environment variable reference nor in dsctl's catalogue "
                f"(dsctl/data/ascend_env.yaml){hint}; written as given, its value unchecked")
    if spec.get("confidence") != "field":
        return None
    return (f"{name} is not in CANN's environment variable reference (field practice, effect unknown): believed to "
            f"{_lower_first(spec['believed'])}; documented settings for the same failure: {spec['covered_by']}")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text else text


# --------------------------------------------------------------------------- resolve


def check_profile(profile: Any) -> str | None:
    """The profile name, or None; `EnvError` naming the known profiles otherwise."""
    if profile is None:
        return None
    known = profiles()
    if not isinstance(profile, str) or profile not in known:
        close = difflib.get_close_matches(str(profile), list(known), n=1)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}, or leave it out"
        raise EnvError(f"{PROFILE_VAR}: no profile {_shown(profile)}; {hint}")
    return profile


def _layers(overrides: Mapping[str, Any] | None, profile: str | None,
            variables: Mapping[str, Mapping]) -> dict[str, tuple[str, str]]:
    """NAME -> (value, origin): defaults, then the profile's values, then the overrides (None removes a value)."""
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise EnvError(f"{INVENTORY_VAR}: expected a mapping of NAME: value, got {_shown(overrides)}; "
                       "write one variable per line under it")
    env = {name: (value, "default") for name, value in default_env(variables).items()}
    if check_profile(profile) is not None:
        for name, entry in profiles()[profile]["variables"].items():
            env[name] = (check_variable(name, entry["value"], field=f"{PROFILE_VAR} {profile}", variables=variables),
                         f"profile {profile}")
    for key, value in overrides.items():
        name = check_name(key, variables)
        if value is None:
            if name not in variables:
                check_variable(name, "", variables=variables)  # a typo or a misnomer is refused here too
            env.pop(name, None)
            continue
        env[name] = (check_variable(name, value, variables=variables), "inventory")
    return dict(sorted(env.items()))


def resolve_env(overrides: Mapping[str, Any] | None, *, profile: str | None = None,
                variables: Mapping[str, Mapping] | None = None) -> dict[str, str]:
    """Defaults, then ``profile``'s values, then ``overrides`` (an override of None removes a value), every value
    checked.

    Returns NAME -> value string, sorted by name.  Raises `EnvError` with one line naming the variable.
    """
    variables = catalogue() if variables is None else variables
    return {name: value for name, (value, _) in _layers(overrides, profile, variables).items()}


def annotated_env(overrides: Mapping[str, Any] | None, *, profile: str | None = None) -> list[dict[str, Any]]:
    """Every variable of the resolved env with where its value comes from and how sure that source is.

    Each entry: name, value, origin (default, profile <name>, inventory), source (the profile's source for a
    profile value, else the catalogue's reference), confidence (CONFIDENCE_WORDS), warning (or None)."""
    variables = catalogue()
    profile_values = profiles()[profile]["variables"] if check_profile(profile) else {}
    entries = []
    for name, (value, origin) in _layers(overrides, profile, variables).items():
        spec = variables.get(name, {})
        source = (profile_values[name]["source"] if origin.startswith("profile ")
                  else spec.get("reference", "inventory"))
        entries.append({"name": name, "value": value, "origin": origin, "source": source,
                        "confidence": CONFIDENCE_WORDS.get(spec.get("confidence", ""), "unknown to dsctl"),
                        "warning": warning(name, variables=variables)})
    return entries


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


_UNIT_WORDS = {"s": "seconds"}


def _int_words(spec: Mapping) -> str:
    unit = spec.get("unit")
    if unit == "%":
        return "a percentage"
    return f"an integer number of {_UNIT_WORDS.get(unit, unit)}" if unit else "an integer"


def _int_range(spec: Mapping) -> str:
    low, high = spec.get("min"), spec.get("max")
    bounds = f" from {low} to {high}" if low is not None and high is not None else (
        f" >= {low}" if low is not None else (f" <= {high}" if high is not None else ""))
    special = "".join(f" or {value} ({meaning})" for value, meaning in spec.get("special", {}).items())
    return f"{_int_words(spec)}{bounds}{special}"


def _in_unit(text: str, unit: str | None) -> int | None:
    """A size written with a suffix in the variable's unit ("1G" in MB -> 1024), for the fix text."""
    match = _SIZE_RE.fullmatch(text.strip())
    if not match or unit not in ("bytes", "KB", "MB", "GB"):
        return None
    size_kb = float(match[1]) * _SIZE_FACTORS[match[2].upper()]
    value = size_kb * 1024 if unit == "bytes" else size_kb / _SIZE_FACTORS[unit[0]]
    return int(value) if value == int(value) else None


def _example(spec: Mapping) -> str:
    if spec.get("example") is not None:
        return str(spec["example"])
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
    """A number with exclusive bounds (above / below) or an inclusive upper one (max)."""
    above, below, high = spec.get("above"), spec.get("below"), spec.get("max")
    expected = (f"a number above {above} and at most {high}" if high is not None
                else f"a number between {above} and {below} (exclusive)")
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number != number or (above is not None and number <= above) or (
            below is not None and number >= below) or (high is not None and number > high):
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
    if not isinstance(value, str) or not value.startswith("/") or control_character(value):
        raise _Invalid(expected, "write a path that starts with /")
    if spec.get("pattern") and not re.fullmatch(spec["pattern"], value):
        raise _Invalid(expected, "rename the directory without other characters")
    return value


def _string_value(value: Any) -> str:
    if not isinstance(value, str) or control_character(value):
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
        match = _AFFINITY_RANGE_RE.fullmatch(item)
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
        if not _NAME_RE.fullmatch(name):
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
            if equals and _NAME_RE.fullmatch(name):
                env[name] = value
    return env
