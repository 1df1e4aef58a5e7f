"""The serving services a host runs (``dsctl_services``): their schema, engine parameters and NPU plan (pure).

One entry of the inventory list ``dsctl_services`` is a `ServiceSpec`: an engine (``vllm-ascend``, ``mindie`` or
``lab-engine``, dsctl's emulated engine), a model, a parallel layout, how many instances of it run on each host
and how many NPUs each one takes, the engine parameters, and the service manager that runs it.  `validate_services`
checks one host's list before anything on the host changes; every problem is one line that names the host, the
entry and the field, with a fix (wrapped here)::

    inventory: host lab-01: dsctl_services[0].params.max_num_seqz: unknown vllm-ascend parameter;
    did you mean max_num_seqs?

Engine parameters are data (``dsctl/data/engine_params.yaml``): their type and range, how they render, and the
vllm-ascend releases that read them.  A parameter the registry does not list is refused, and so is one the host's
vllm-ascend release removed (``torchair_graph_config``) or does not have yet, instead of the engine ignoring it.

`plan_host` lays the instances out on the host's NPUs, in order across the services: 8 NPUs and one service with
``instances: 2, npus_per_instance: 4`` give ``chat-0`` on NPUs 0-3 (port 8000) and ``chat-1`` on NPUs 4-7
(port 8001), each pinned with ``ASCEND_RT_VISIBLE_DEVICES``.  The files each instance needs are rendered by
`dsctl.core.serving.service_render`.

The API key is a pydantic `SecretStr`: it never appears in a repr, a dump for display, or an error message.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dsctl import data
from dsctl.core.fleet import ascend_env
from dsctl.core.fleet.root_paths import RootPathRefused, root_dir
from dsctl.core.fleet.versions import compare_versions
from dsctl.core.perf import perfmodel
from dsctl.core.serving.port_table import FIRST_UNPRIVILEGED_PORT, PortTable
from dsctl.core.text import StatedProblem, Text, control_character, stated_problem
from dsctl.errors import DsctlError, ExitStatus

SERVICES_VAR = "dsctl_services"
# Service fields an override (deploy --param, tune's candidates) may set besides engine parameters.
PARALLEL_FIELDS = ("tensor_parallel_size", "data_parallel_size")
MANAGER_VAR = "dsctl_service_manager"
VLLM_ASCEND_VAR = "dsctl_vllm_ascend_version"
ENGINES = ("vllm-ascend", "mindie", "lab-engine")
MANAGERS = ("systemd", "supervisor", "container")
RUNTIMES = ("docker", "podman")
DEFAULT_MANAGER = "systemd"
DEFAULT_VENV = "/opt/dsctl/serving-venv"
DEFAULT_PORT = {"vllm-ascend": 8000, "lab-engine": 8000, "mindie": 1025}
# Ports one instance listens on, from its base port: MindIE also opens managementPort and metricsPort.
PORTS_PER_INSTANCE = {"vllm-ascend": 1, "lab-engine": 1, "mindie": 3}
# How deploy (and tune) know an instance is ready (serving-and-tuning.md section 11).
READINESS = {
    "vllm-ascend": {"kind": "http", "paths": ["/health", "/v1/models"]},
    "lab-engine": {"kind": "http", "paths": ["/health", "/v1/models"]},
    "mindie": {"kind": "log", "line": "Daemon start success!"},
}
# Set by dsctl for each instance; an inventory's env may not set them.
MANAGED_ENV = {
    "ASCEND_RT_VISIBLE_DEVICES": "each instance is pinned to its own NPUs",
    "VLLM_API_KEY": "set the service's api_key instead",
    "MIES_CONFIG_JSON_PATH": "each MindIE instance reads its own config.json",
}
FIX = "fix it in group_vars or host_vars"

_SLUG_RE = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_SERVED_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")
_ACCOUNT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Printable ASCII without blanks, quotes or backslashes: the env file holds it unquoted (systemd, docker --env-file).
_API_KEY_RE = re.compile(r"^[!#-&(-\[\]-~]{8,512}$")
# Paths reach shell scripts, unit files and supervisor programs run as root: however carefully those quote,
# a path setting only holds characters no syntax gives a meaning to.
_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/+-]*$")
SAFE_PATH_WORDS = "an absolute path of letters, digits and . _ / + - without '..'"
# Membership in these groups is root in all but name, or reads what only root may: never the group of dsctl's run
# account or of a network service, not even allow-listed (dsctl_allowed_accounts).  Sources: Debian's SystemGroups
# (https://wiki.debian.org/SystemGroups), sudoers(5), https://docs.docker.com/engine/security/#docker-daemon-attack-surface,
# https://documentation.ubuntu.com/lxd/en/latest/security/, https://libvirt.org/acl.html, systemd-journald.service(8).
PRIVILEGED_GROUPS = {
    "root": "gid 0 owns the system's files",
    "wheel": "sudoers(5) and su's pam_wheel give it root",
    "sudo": "Debian's sudoers gives it root",
    "admin": "Ubuntu's sudoers gives it root",
    "docker": "the Docker socket is root",
    "lxd": "the LXD socket is root",
    "lxc": "it manages containers that can mount the host",
    "libvirt": "it manages VMs that can be given the host's disks",
    "disk": "raw access to every block device",
    "kmem": "reads /dev/mem and /dev/port, the kernel's memory",
    "shadow": "reads /etc/shadow, every password hash",
    "adm": "reads the system logs in /var/log",
    "systemd-journal": "reads every unit's journal",
    "staff": "writes /usr/local, whose programs root runs",
    "tty": "writes to every terminal",
    "input": "reads every keyboard and mouse (/dev/input)",
}
# Accounts other software shares (Debian's base-passwd, Fedora's setup package, distribution daemons): a file dsctl
# gives one of them is another service's, and "nobody" must own nothing (https://wiki.ubuntu.com/nobody).
SHARED_ACCOUNTS = frozenset({
    "nobody", "nogroup", "nfsnobody", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
    "proxy", "www-data", "backup", "list", "irc", "gnats", "operator", "halt", "shutdown", "ftp", "sshd", "apache",
    "nginx", "messagebus", "dbus", "polkitd", "syslog", "_apt", "systemd-network", "systemd-resolve",
    "systemd-timesync", "systemd-coredump", "chrony", "ntp", "postfix", "rpc", "rpcuser", "tss", "users",
})
# The accounts dsctl makes: the driver's run account (npu_driver, Huawei's default name), the service user
# (inference_service) and the gateway's workers (gateway); any dsctl-* name is one a dsctl role creates.
DSCTL_ACCOUNTS = ("HwHiAiUser", "dsctl-serve", "dsctl-gateway")
ACCOUNTS_VAR = "dsctl_allowed_accounts"
_UNKNOWN = object()  # no host context: version gates cannot be applied


class ServiceError(DsctlError):
    exit_status = ExitStatus.USAGE


class _Problem(ServiceError):
    """One problem at a path inside a service entry (``params.max_num_seqz``).

    Not a ValueError on purpose: pydantic lets it through a validator unchanged, path and all, so a
    `ServiceSpec` built directly (tune's candidates) raises it as a `ServiceError`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --------------------------------------------------------------------------- the parameter registry


@cache
def registry() -> dict[str, dict[str, Any]]:
    """Engine -> {"params": name -> entry, "reserved": name -> field, "flattened": name -> hint, "rules": [...]},
    lab-engine's
    ``params_from`` resolved (``engine_params.yaml``)."""
    engines = data.load("engine_params")["engines"]
    resolved: dict[str, dict[str, Any]] = {}
    for engine, spec in engines.items():
        params: dict[str, Any] = {}
        for other, names in (spec.get("params_from") or {}).items():
            params.update({name: engines[other]["params"][name] for name in names})
        params.update(spec.get("params") or {})
        resolved[engine] = {"params": params, "reserved": dict(spec.get("reserved") or {}),
                            "flattened": dict(spec.get("flattened") or {}), "rules": list(spec.get("rules") or []),
                            "misplaced": dict(spec.get("misplaced") or {})}
    return resolved


def engine_params(engine: str) -> dict[str, dict[str, Any]]:
    """Name -> registry entry of every parameter ``engine`` accepts (on some version)."""
    return registry()[engine]["params"]


def tuning_params(engine: str, *, vllm_ascend: str | None = None) -> dict[str, dict[str, Any]]:
    """The ``tune: true`` parameters of ``engine`` that the given vllm-ascend release reads."""
    return {name: entry for name, entry in engine_params(engine).items()
            if entry.get("tune") and _gate_problem(engine, entry, vllm_ascend) is None}


def effective_params(engine: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The values the engine gets: registry defaults (MindIE's config.json has no "unset") under ``params``."""
    defaults = {name: entry["default"] for name, entry in engine_params(engine).items() if "default" in entry}
    return {**defaults, **params}


def _normalised(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _closest(name: str, names: Sequence[str]) -> str | None:
    by_form = {_normalised(known): known for known in names}
    if _normalised(name) in by_form:
        return by_form[_normalised(name)]
    close = difflib.get_close_matches(_normalised(name), list(by_form), n=1, cutoff=0.6)
    return by_form[close[0]] if close else None


def _gate_problem(engine: str, entry: Mapping[str, Any], version: Any) -> str | None:
    """Why the host's vllm-ascend release does not read this parameter, or None."""
    if engine != "vllm-ascend" or version is _UNKNOWN or version is None:
        return None
    removed_in, since = entry.get("removed_in"), entry.get("since")
    if removed_in and compare_versions(version, removed_in) >= 0:
        return f"removed in vllm-ascend {removed_in} ({entry['removed_by']}); use {entry['replacement']}"
    if since and compare_versions(version, since) < 0:
        return f"needs vllm-ascend {since} or later and this host runs {version}; {entry['before']}"
    return None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _int_words(entry: Mapping[str, Any]) -> str:
    if "choices" in entry:
        return "one of " + ", ".join(str(choice) for choice in entry["choices"])
    low, high = entry.get("min"), entry.get("max")
    words = "an integer"
    if low is not None and high is not None:
        words += f" from {low} to {high}"
    elif low is not None:
        words += f" >= {low}"
    elif high is not None:
        words += f" <= {high}"
    return words + (" that is a power of 2" if entry.get("power_of_two") else "")


def _float_words(entry: Mapping[str, Any]) -> str:
    bounds = [f"{op} {entry[key]}" for key, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if key in entry]
    return "a number" + (" " + " and ".join(bounds) if bounds else "")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_value(entry: Mapping[str, Any], value: Any) -> int | None:
    if not _is_int(value):
        return None
    if "choices" in entry:
        return value if value in entry["choices"] else None
    if ("min" in entry and value < entry["min"]) or ("max" in entry and value > entry["max"]):
        return None
    if entry.get("power_of_two") and (value < 1 or value & (value - 1)):
        return None
    return value


def _float_value(entry: Mapping[str, Any], value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number):  # YAML's .nan and .inf pass every comparison below one way or the other
        return None
    if ("gt" in entry and number <= entry["gt"]) or ("ge" in entry and number < entry["ge"]) \
            or ("lt" in entry and number >= entry["lt"]) or ("le" in entry and number > entry["le"]):
        return None
    return number


def _json_value(name: str, entry: Mapping[str, Any], value: Any, path: str) -> Any:
    shape = entry.get("shape", "dict")
    if not isinstance(value, dict if shape == "dict" else list):
        raise _Problem(path, f"expected a {'mapping' if shape == 'dict' else 'list'}, got {_shown(value)}; {FIX}")
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        raise _Problem(path, f"expected JSON values (strings, numbers, true/false, lists, mappings); {FIX}") from None
    if shape == "dict":
        if any(not isinstance(key, str) for key in value):
            raise _Problem(path, f"expected string keys; quote them; {FIX}")
        keys = entry.get("keys")
        for key in value if keys else ():
            if key not in keys:
                close = _closest(key, keys)
                hint = f"did you mean {close}?" if close else f"known: {', '.join(keys)}"
                raise _Problem(f"{path}.{key}", f"unknown key of {name}; {hint}")
    if shape == "list" and entry.get("items") == "int" and not all(_is_int(item) for item in value):
        raise _Problem(path, f"expected a list of integers, got {_shown(value)}; {FIX}")
    return json.loads(text)


def _param_value(name: str, entry: Mapping[str, Any], value: Any, path: str) -> Any:
    kind = entry["type"]
    if kind == "json":
        return _json_value(name, entry, value, path)
    if kind == "int":
        checked, expected = _int_value(entry, value), _int_words(entry)
    elif kind == "float":
        checked, expected = _float_value(entry, value), _float_words(entry)
    elif kind == "bool":
        checked, expected = (value if isinstance(value, bool) else None), "true or false (unquoted)"
    elif kind == "enum":
        choices = entry["choices"]
        checked = value if (not isinstance(value, bool) and value in choices) else None
        expected = "one of " + ", ".join(str(choice) for choice in choices)
    elif kind == "str":
        ok = isinstance(value, str) and re.fullmatch(entry.get("pattern", r"^[^\n\r\0]+$"), value)
        checked, expected = (value if ok else None), "a one-line name of letters, digits, '.', '_' and '-'"
    else:
        raise ValueError(f"engine_params.yaml: {name}: unknown type {kind!r}")  # a data bug, not a user error
    if checked is None:
        raise _Problem(path, f"expected {expected}, got {_shown(value)}; {FIX}")
    return checked


def check_params(engine: str, params: Mapping[str, Any] | None, *, vllm_ascend: Any = _UNKNOWN) -> dict[str, Any]:
    """``params`` checked against the registry for ``engine`` and the host's vllm-ascend release.

    Returns the values, normalised (JSON values as plain dicts and lists).  Raises `_Problem` naming
    ``params.<name>``; `validate_services` turns it into a `ServiceError` line.
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise _Problem("params", f"expected a mapping of parameter: value, got {_shown(params)}; {FIX}")
    spec = registry()[engine]
    known, reserved, flattened = spec["params"], spec["reserved"], spec["flattened"]
    checked: dict[str, Any] = {}
    for key, value in params.items():
        name, path = str(key), f"params.{key}"
        if name in flattened:
            raise _Problem(path, f"not a parameter: {flattened[name]}")
        if name in spec["misplaced"]:
            raise _Problem(path, f"not a {engine} parameter: {spec['misplaced'][name]}")
        if name in reserved:
            raise _Problem(path, f"set by the service field {reserved[name]}, not under params; move it there")
        entry = known.get(name)
        if entry is None:
            close = _closest(name, list(known))
            hint = (f"did you mean {close}?" if close
                    else "remove it, or add it with a source to dsctl/data/engine_params.yaml")
            raise _Problem(path, f"unknown {engine} parameter; {hint}")
        gate = _gate_problem(engine, entry, vllm_ascend)
        if gate:
            raise _Problem(path, gate)
        checked[name] = _param_value(name, entry, value, path)
    _check_rules(engine, checked)
    return checked


def _check_rules(engine: str, params: Mapping[str, Any]) -> None:
    values = effective_params(engine, params)
    for rule in registry()[engine]["rules"]:
        low, high = rule["param"], rule["le"]
        if low not in values or high not in values or values[low] <= values[high]:
            continue
        if low in params:
            whose = "" if high in params else ", dsctl's default"
            raise _Problem(f"params.{low}", f"{values[low]} is more than {high} ({values[high]}{whose}); "
                                            f"{rule['why']}")
        raise _Problem(f"params.{high}", f"{values[high]} is less than {low} ({values[low]}, dsctl's default); "
                                         f"{rule['why']}: raise it or set {low} too")


# --------------------------------------------------------------------------- value types


def _slug(value: str) -> str:
    if not _SLUG_RE.fullmatch(value):
        raise ValueError("not a slug")
    return value


def safe_path(value: str) -> str:
    """``value`` if it is an absolute path of the safe character set without a ``..`` part, else ValueError."""
    if not _SAFE_PATH_RE.fullmatch(value) or ".." in value.split("/"):
        raise ValueError("not a safe absolute path")
    return value


def _model_ref(value: str) -> str:
    if value.startswith("/"):
        if value.rstrip("/") == "":
            raise ValueError("not a model path")
        return safe_path(value)
    if not _MODEL_NAME_RE.fullmatch(value):
        raise ValueError("not a model name")
    return value


def _served(value: str) -> str:
    if not _SERVED_RE.fullmatch(value):
        raise ValueError("not a served name")
    return value


def _bind(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("not an IP address") from None
    return value


class AccountRefused(StatedProblem):
    """An account name no dsctl setting may take (a shared system account, a privileged group)."""


def refused_account(name: str) -> str | None:
    """Why ``name`` is never dsctl's run user or group nor a service's (None if it may be, allow-listed or
    dsctl's own): a privileged group or a shared system account.  root has its own, more specific refusals."""
    if name in PRIVILEGED_GROUPS and name != "root":
        return f"{name!r} is a privileged group ({PRIVILEGED_GROUPS[name]})"
    if name in SHARED_ACCOUNTS:
        return f"{name!r} is a shared system account (other software owns files as it)"
    return None


def account_problem(name: str, allowed: Sequence[str], *, group: bool = False) -> str | None:
    """Why ``name`` may not be a run or service account given the inventory's ``dsctl_allowed_accounts``, or None:
    it must be dsctl's own (`DSCTL_ACCOUNTS`, a dsctl-* name) or allow-listed, and never `refused_account` (nor the
    group root; the user root has its own refusals, a container's excepted)."""
    refused = f"'root' is a privileged group ({PRIVILEGED_GROUPS['root']})" if group and name == "root" \
        else refused_account(name)
    if refused:
        return f"{refused}, refused even in {ACCOUNTS_VAR}; use an account dsctl creates such as HwHiAiUser"
    if name in DSCTL_ACCOUNTS or name.startswith("dsctl-") or name in allowed or name == "root":
        return None
    return (f"{name!r} is not an account dsctl creates ({', '.join(DSCTL_ACCOUNTS)} or a dsctl-* name); use one "
            f"of those, or list {name} in {ACCOUNTS_VAR} if this site's own account is meant")


def _account(value: str) -> str:
    if not _ACCOUNT_RE.fullmatch(value):
        raise ValueError("not a user or group name")
    refused = refused_account(value)
    if refused:
        raise AccountRefused(f"{refused}; use one dsctl creates (HwHiAiUser, dsctl-serve, a dsctl-* name)")
    return value


def _group(value: str) -> str:
    if value == "root":
        raise AccountRefused("'root' is a privileged group (gid 0 owns the system's files); use HwHiAiUser, the "
                             "group of the NPU devices")
    return _account(value)


def _image(value: str) -> str:
    if not _IMAGE_RE.fullmatch(value):
        raise ValueError("not an image reference")
    return value


_cache_root_dir = root_dir("mount it read-write into the container", "/var/cache/dsctl/<service>")


def _cache_dir(value: str | None) -> str | None:
    return None if value is None else _cache_root_dir(value)


Slug = Annotated[Text, AfterValidator(_slug)]
ModelRef = Annotated[Text, AfterValidator(_model_ref)]
ServedName = Annotated[Text, AfterValidator(_served)]
BindAddress = Annotated[Text, AfterValidator(_bind)]
AccountName = Annotated[Text, AfterValidator(_account)]
SafePath = Annotated[Text, AfterValidator(safe_path)]
ServiceGroup = Annotated[Text, AfterValidator(_group)]
ImageRef = Annotated[Text, AfterValidator(_image)]
Count = Annotated[int, Field(strict=True, ge=1, le=16)]

_API_KEY_WORDS = "a key of 8 to 512 printable ASCII characters without blanks, quotes or backslashes"


class ServiceSpec(BaseModel):
    """One entry of ``dsctl_services``; each field's description is what an error says it expects."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: Annotated[Slug, Field(description="a slug: lower-case letters, digits and '-', starting with a letter, "
                                            "at most 32 characters")]
    engine: Annotated[Literal["vllm-ascend", "mindie", "lab-engine"],
                      Field(description="one of vllm-ascend, mindie, lab-engine")]
    manager: Annotated[Literal["systemd", "supervisor", "container"],
                       Field(description="one of systemd, supervisor, container")] = DEFAULT_MANAGER
    model: Annotated[ModelRef, Field(description="an absolute path to the weights (letters, digits and "
                                                 "._/+- without '..') or a model name such as "
                                                 "deepseek-ai/DeepSeek-R1")]
    served_model_name: Annotated[ServedName | None, Field(description="a name of letters, digits and ._/:- "
                                                                      "(default: the model's last path part)")] = None
    npus_per_instance: Annotated[Count, Field(description="an integer 1..16")]
    instances: Annotated[Count, Field(description="an integer 1..16")] = 1
    tensor_parallel_size: Annotated[Count | None, Field(description="an integer 1..16")] = None
    data_parallel_size: Annotated[Count, Field(description="an integer 1..16")] = 1
    port: Annotated[int | None, Field(strict=True, ge=1, le=65535, description="a port 1..65535")] = None
    # A port below 1024 needs CAP_NET_BIND_SERVICE and is a system daemon's (ssh 22, http 80): asked for, not slipped.
    allow_privileged_port: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = False
    bind: Annotated[BindAddress, Field(description="an IP address such as 0.0.0.0 or 127.0.0.1")] = "0.0.0.0"
    api_key: Annotated[SecretStr | None, Field(description=_API_KEY_WORDS)] = None
    # Serving without a key beyond loopback is a decision the inventory states, never a default.
    allow_unauthenticated: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = False
    params: Annotated[dict[str, Any], Field(description="a mapping of engine parameter: value")] = \
        Field(default_factory=dict)
    env: Annotated[dict[str, Any], Field(description="a mapping of VARIABLE: value")] = Field(default_factory=dict)
    user: Annotated[AccountName, Field(description="a user name (not root)")] = "dsctl-serve"
    group: Annotated[ServiceGroup, Field(description="a group name other than a privileged group "
                                                     "(such as HwHiAiUser)")] = "HwHiAiUser"
    health_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                           description="a number of seconds 1..86400")] = 900
    image: Annotated[ImageRef | None, Field(description="a container image reference")] = None
    container_runtime: Annotated[Literal["docker", "podman"], Field(description="docker or podman")] = "docker"
    # A host directory mounted read-write at the container's /root/.cache (compile and download caches); without
    # it the container keeps its caches to itself and nothing of the host is writable from inside.
    # The same rule as every path dsctl gives root (dsctl.core.fleet.root_paths): a container that can write /, /etc
    # or /var/run/docker.sock owns the host.
    container_cache: Annotated[SafePath | None, AfterValidator(_cache_dir), Field(description=SAFE_PATH_WORDS)] = None
    venv: Annotated[SafePath | None, Field(description=SAFE_PATH_WORDS)] = None
    time_scale: Annotated[float | None, Field(strict=True, gt=0, description="a number > 0")] = None

    # The host context the entry was checked in (vllm-ascend release), kept so with_params can re-check.
    _context: dict[str, Any] = PrivateAttr(default_factory=dict)

    # ------------------------------------------------------------------ validation

    @model_validator(mode="before")
    @classmethod
    def _host_defaults(cls, values: Any, info: ValidationInfo) -> Any:
        if not isinstance(values, dict):
            return values
        context = info.context or {}
        values = dict(values)
        for key, default in (("manager", context.get("manager_default", DEFAULT_MANAGER)),
                             ("venv", context.get("serving_venv", DEFAULT_VENV))):
            if values.get(key) is None:
                values[key] = default
        for key in ("params", "env"):
            if key in values and values[key] is None:  # "params:" with nothing under it
                values[key] = {}
        return values

    @field_validator("api_key")
    @classmethod
    def _api_key_chars(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not _API_KEY_RE.fullmatch(key.get_secret_value()):
            raise ValueError("not a usable key")
        return key

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, Any]) -> dict[str, str]:
        return check_env(env)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ServiceSpec:
        context = dict(info.context or {})
        version = context.get("vllm_ascend", _UNKNOWN)
        explicit = self.model_fields_set
        self._check_engine_fields(explicit)
        tp = self.tensor_parallel_size if self.tensor_parallel_size is not None else \
            self.npus_per_instance // self.data_parallel_size
        if tp * self.data_parallel_size != self.npus_per_instance:
            if self.tensor_parallel_size is None:
                raise _Problem("data_parallel_size",
                               f"npus_per_instance {self.npus_per_instance} is not a multiple of data_parallel_size "
                               f"{self.data_parallel_size}; make tensor_parallel_size x data_parallel_size equal "
                               "npus_per_instance")
            field = "tensor_parallel_size" if "data_parallel_size" not in explicit else "data_parallel_size"
            raise _Problem(field, f"tensor_parallel_size {tp} x data_parallel_size {self.data_parallel_size} = "
                                  f"{tp * self.data_parallel_size}, but npus_per_instance is {self.npus_per_instance}; "
                                  "make tensor_parallel_size x data_parallel_size equal npus_per_instance")
        params = check_params(self.engine, self.params, vllm_ascend=version)
        self._check_model_layout(tp, params, explicit)
        port = self.port if self.port is not None else DEFAULT_PORT[self.engine]
        check_unprivileged_port(port, self.allow_privileged_port)
        last = port + self.instances * PORTS_PER_INSTANCE[self.engine] - 1
        if last > 65535:
            raise _Problem("port", f"{self.instances} instance(s) from port {port} need ports up to {last}; "
                                   "pick a lower port")
        served = self.served_model_name or posixpath.basename(self.model.rstrip("/"))
        # Derived values in place (the model is frozen; an after-validator must return self): the fields set
        # by the inventory stay apart in model_fields_set, so with_params derives them again.
        self.__dict__.update({"params": params, "port": port, "tensor_parallel_size": tp,
                              "served_model_name": served_default(served)})
        self._context = context
        return self

    def _check_engine_fields(self, explicit: set[str]) -> None:
        container = self.manager == "container"
        if container and self.image is None:
            raise _Problem("image", "required with manager container (the image that has the engine); "
                                    "add it to the service")
        if not container:
            for field in ("image", "container_runtime", "container_cache"):
                if field in explicit:
                    raise _Problem(field, f"only for manager container (this service uses {self.manager}); "
                                          "remove it or set manager: container")
        if self.time_scale is not None and self.engine != "lab-engine":
            raise _Problem("time_scale", "only for engine lab-engine (the emulated engine); remove it")
        if self.engine == "lab-engine" and self.data_parallel_size > 1:
            raise _Problem("data_parallel_size", "lab-engine has no data parallelism; run more instances instead")
        if self.engine == "mindie":
            if self.api_key is not None:
                raise _Problem("api_key", "MindIE's config.json has no API key; remove it and put an "
                                          "authenticating proxy in front of the service")
            if not self.model.startswith("/"):
                raise _Problem("model", "MindIE loads weights from a directory: give its absolute path "
                                        "(modelWeightPath)")
        self._check_authentication()
        if self.user == "root" and not container:
            raise _Problem("user", "root is refused: NPU services run as an unprivileged user in the HwHiAiUser "
                                   "group (default dsctl-serve)")

    def _check_model_layout(self, tp: int, params: Mapping[str, Any], explicit: set[str]) -> None:
        """Where dsctl knows the model (profiles.yaml), the layout the engine would refuse at start-up, refused now:
        expert parallel on a dense model, a tensor-parallel size that does not split its attention (KV) heads."""
        profile = known_model(self.model)
        if profile is None:
            return
        expert_parallel = bool(params.get("enable_expert_parallel"))
        dense = expert_parallel_problem(profile) if expert_parallel else None
        if dense:
            raise _Problem("params.enable_expert_parallel", dense)
        refused = perfmodel.parallel_problem(profile, tp, self.data_parallel_size, expert_parallel)
        if refused:
            field = "tensor_parallel_size" if "tensor_parallel_size" in explicit else "npus_per_instance"
            sizes = ", ".join(str(size) for size in tensor_parallel_sizes(profile))
            raise _Problem(field, f"tensor_parallel_size {tp} cannot split {profile.name} (vLLM: "
                                  f"{refused.rstrip('.')}); use a tensor_parallel_size of {sizes} (npus_per_instance "
                                  "= tensor_parallel_size x data_parallel_size)")

    def _check_authentication(self) -> None:
        loopback = ipaddress.ip_address(self.bind).is_loopback  # 127.0.0.0/8, ::1
        if self.api_key is not None or loopback or self.allow_unauthenticated:
            return
        where = f"listens on {self.bind}{' (every address)' if self.bind in ('0.0.0.0', '::') else ''}"
        if self.engine == "mindie":
            raise _Problem("bind", f"MindIE has no API key and the service {where}, beyond this host; bind "
                                   "127.0.0.1 behind an authenticating proxy, or set allow_unauthenticated: true")
        raise _Problem("api_key", f"the service {where}, beyond this host, without an api_key; set api_key (from "
                              "ansible-vault: api_key: \"{{ vault_chat_api_key }}\"), bind 127.0.0.1, or set "
                              "allow_unauthenticated: true to serve anyone who can reach the port")

    # ------------------------------------------------------------------ use

    @property
    def port_base(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT[self.engine]

    @property
    def tp(self) -> int:
        return self.tensor_parallel_size if self.tensor_parallel_size is not None else \
            self.npus_per_instance // self.data_parallel_size

    @property
    def npus(self) -> int:
        """NPUs this service takes on one host."""
        return self.instances * self.npus_per_instance

    @property
    def effective_params(self) -> dict[str, Any]:
        return effective_params(self.engine, self.params)

    @property
    def readiness(self) -> dict[str, Any]:
        return READINESS[self.engine]

    @property
    def vllm_ascend(self) -> str | None:
        """The host's vllm-ascend release this service was checked against (version gates), or None."""
        return self._context.get("vllm_ascend")

    def with_params(self, params: Mapping[str, Any], fields: Mapping[str, Any] | None = None) -> ServiceSpec:
        """This service with other engine parameters (and parallel layout, `PARALLEL_FIELDS`), checked as the
        inventory's were (tune's candidates).

        Raises `ServiceError` naming the parameter."""
        values = {name: getattr(self, name) for name in self.model_fields_set | {"manager", "venv"}}
        values["params"] = dict(params)
        values.update(fields or {})
        try:
            return ServiceSpec.model_validate(values, context=self._context)
        except _Problem as problem:
            raise ServiceError(f"service {self.name}: {problem}") from None


def known_model(model: str, profile: str | None = None) -> perfmodel.Model | None:
    """dsctl's profile of a service's model (``profile``, else the model name or its path's last part, by name or
    alias in dsctl/data/profiles.yaml), or None when dsctl does not know the model."""
    for name in (profile, model, posixpath.basename(model.rstrip("/"))):
        if name:
            try:
                return perfmodel.model_by_name(name)
            except DsctlError:
                continue
    return None


def expert_parallel_problem(profile: perfmodel.Model) -> str | None:
    """Why ``enable_expert_parallel`` cannot apply to this model (a dense one), or None: single- and multi-host."""
    if profile.is_moe:
        return None
    return (f"{profile.name} is a dense model (no routed experts in dsctl/data/profiles.yaml): there are no experts "
            "to shard; remove enable_expert_parallel")


def tensor_parallel_sizes(profile: perfmodel.Model, largest: int = 16) -> list[int]:
    """The tensor-parallel sizes up to ``largest`` (16 NPUs per host) that split the model's heads and KV heads."""
    return [size for size in range(1, largest + 1) if perfmodel.parallel_problem(profile, size) is None]


def check_unprivileged_port(port: int, allowed: bool, field: str = "port") -> None:
    """A service's port is 1024 or above unless the service says ``allow_privileged_port: true`` (`_Problem`):
    below 1024 the engine, an unprivileged user, cannot bind it without CAP_NET_BIND_SERVICE (capabilities(7)),
    and it is a system daemon's (IANA System Ports, RFC 6335 section 6: ssh 22, http 80)."""
    if port < FIRST_UNPRIVILEGED_PORT and not allowed:
        raise _Problem(field, f"{port} is a privileged port (below {FIRST_UNPRIVILEGED_PORT}: only root or "
                              "CAP_NET_BIND_SERVICE binds it, and system daemons such as sshd on 22 use them); pick "
                              f"a port from {FIRST_UNPRIVILEGED_PORT} to 65535, or set allow_privileged_port: true "
                              "when the service is given that capability")


def served_default(name: str) -> str:
    """A served model name made of a model path's last part (characters vLLM's name rule refuses become '-')."""
    return name if _SERVED_RE.fullmatch(name) else re.sub(r"[^A-Za-z0-9._/:-]", "-", name).lstrip("._/:-") or "model"


def check_env(env: Mapping[str, Any] | None, *, field: str = "env") -> dict[str, str]:
    """A service's extra environment: names checked, values as strings, each variable by the same rule as the host
    env (`ascend_env.check_variable`: the catalogue's kinds and bounds, typos and misnomers).  Raises `_Problem`."""
    if env is None:
        return {}
    checked: dict[str, str] = {}
    for key, value in env.items():
        name, path = str(key), ascend_env.variable_path(field, key)
        if not _ENV_NAME_RE.fullmatch(name):
            raise _Problem(path, "not an environment variable name; use letters, digits and _")
        if name in MANAGED_ENV:
            raise _Problem(path, f"set by dsctl: {MANAGED_ENV[name]}; remove it")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _Problem(path, f"expected a string or a number, got {_shown(value)}; quote it")
        text = str(value)
        if text != text.strip() or text[:1] in ("'", '"') or "\\" in text or control_character(text):
            raise _Problem(path, "expected a one-line value without surrounding blanks, leading quotes or "
                                 f"backslashes (the env file holds it unquoted); {FIX}")
        try:
            text = ascend_env.check_variable(name, value, field=field)
        except DsctlError as invalid:
            raise _Problem(path, str(invalid).removeprefix(f"{path}: ")) from None
        checked[name] = text
    return checked


# --------------------------------------------------------------------------- the NPU plan


@dataclass(frozen=True)
class Instance:
    """One process of a service on one host: its NPUs and ports."""

    service: str
    index: int
    npus: tuple[int, ...]
    port: int
    extra_ports: tuple[int, ...] = ()  # MindIE's managementPort and metricsPort

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    @property
    def unit(self) -> str:
        """The service-manager name: systemd unit, supervisor program, container."""
        return f"dsctl-{self.name}"

    @property
    def visible_devices(self) -> str:
        """``ASCEND_RT_VISIBLE_DEVICES`` on the host: the instance's NPUs, "4,5,6,7"."""
        return ",".join(str(npu) for npu in self.npus)

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, *self.extra_ports)


def plan_instances(spec: ServiceSpec, npu_ids: Sequence[int]) -> list[Instance]:
    """The service's instances on ``npu_ids`` (exactly instances x npus_per_instance of them, in order)."""
    if len(npu_ids) != spec.npus:
        raise ServiceError(f"service {spec.name}: {spec.instances} x {spec.npus_per_instance} NPUs planned on "
                           f"{len(npu_ids)} NPU id(s)")
    stride = PORTS_PER_INSTANCE[spec.engine]
    instances = []
    for index in range(spec.instances):
        port = spec.port_base + index * stride
        npus = tuple(int(npu) for npu in npu_ids[index * spec.npus_per_instance:(index + 1) * spec.npus_per_instance])
        instances.append(Instance(service=spec.name, index=index, npus=npus, port=port,
                                  extra_ports=tuple(port + k for k in range(1, stride))))
    return instances


def plan_host(services: Sequence[ServiceSpec], npu_count: int) -> list[Instance]:
    """Every instance of every service on a host of ``npu_count`` NPUs, NPUs handed out in order."""
    needed = sum(spec.npus for spec in services)
    if needed > npu_count:
        raise ServiceError(f"the services need {needed} NPUs but the host has {npu_count}")
    instances: list[Instance] = []
    cursor = 0
    for spec in services:
        instances += plan_instances(spec, list(range(cursor, cursor + spec.npus)))
        cursor += spec.npus
    return instances


# --------------------------------------------------------------------------- one host


def _error_field(error: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ())) or "service"


def _pydantic_problem(error: Mapping[str, Any]) -> str:
    field = _error_field(error)
    top = str(error["loc"][0]) if error.get("loc") else ""
    info = ServiceSpec.model_fields.get(top)
    expected = info.description if info is not None and info.description else "a valid value"
    if error["type"] == "extra_forbidden":
        known = [name for name in ServiceSpec.model_fields if not name.startswith("_")]
        close = _closest(field, known)
        hint = f"did you mean {close}?" if close else f"known: {', '.join(known)}"
        return f"{field}: unknown service setting; {hint}"
    if error["type"] == "missing":
        return f"{field}: required but not set ({expected}); add it to the service"
    if isinstance((error.get("ctx") or {}).get("error"), RootPathRefused):
        return f"{field}: {error['ctx']['error']}"
    if top == "api_key":  # never echo a secret, not even a malformed one
        return f"{field}: expected {expected} (the value is not shown); {FIX}"
    if stated_problem(error):
        return f"{field}: {stated_problem(error)}; {FIX}"
    return f"{field}: expected {expected}, got {_shown(error.get('input'))}; {FIX}"


def _context(npu_count: int, vllm_ascend: str | None, serving_venv: str, manager_default: str) -> dict[str, Any]:
    return {"npu_count": npu_count, "vllm_ascend": vllm_ascend, "serving_venv": serving_venv,
            "manager_default": manager_default}


def validate_service(host: str, index: int, entry: Any, *, npu_count: int, vllm_ascend: str | None,
                     serving_venv: str = DEFAULT_VENV, manager_default: str = DEFAULT_MANAGER) -> ServiceSpec:
    """One entry of the host's list; `ServiceError` (one line: host, entry, field) if wrong."""
    prefix = f"inventory: host {host}: {SERVICES_VAR}[{index}]"
    if not isinstance(entry, Mapping):
        raise ServiceError(f"{prefix}: expected a mapping (name, engine, model, npus_per_instance, ...), "
                           f"got {_shown(entry)}; {FIX}")
    context = _context(npu_count, vllm_ascend, serving_venv, manager_default)
    try:
        spec = ServiceSpec.model_validate(dict(entry), context=context)
    except ValidationError as invalid:
        errors = invalid.errors()
        more = len(errors) - 1
        tail = f" ({more} more problem{'s' if more > 1 else ''} in this service)" if more else ""
        raise ServiceError(f"{prefix}.{_pydantic_problem(errors[0])}{tail}") from None
    except _Problem as problem:
        raise ServiceError(f"{prefix}.{problem.field}: {problem.message}") from None
    if spec.engine == "vllm-ascend" and vllm_ascend is None:
        raise ServiceError(f"{prefix}.engine: vllm-ascend needs the serving stack, but {VLLM_ASCEND_VAR} is none "
                           f"on this host; set {VLLM_ASCEND_VAR} (e.g. \"v0.13.0\") or use another engine")
    return spec


def validate_services(host: str, services: Any, *, npu_count: int, vllm_ascend: str | None,
                      serving_venv: str = DEFAULT_VENV, manager_default: str = DEFAULT_MANAGER) -> list[ServiceSpec]:
    """The host's ``dsctl_services`` -> its `ServiceSpec` list, checked as a whole.

    ``vllm_ascend`` is the host's vllm-ascend release (the resolved stack's, None without a serving stack),
    ``serving_venv`` its ``dsctl_serving_venv``, ``manager_default`` its ``dsctl_service_manager``.
    Raises `ServiceError` (exit USAGE) on the first problem: a bad field, an unknown or version-gated engine
    parameter, more NPUs than the host has, two services on one port, tp x dp not the NPUs per instance.
    """
    if manager_default not in MANAGERS:
        raise ServiceError(f"inventory: host {host}: {MANAGER_VAR}: expected one of {', '.join(MANAGERS)}, "
                           f"got {_shown(manager_default)}; {FIX}")
    if services is None:
        return []
    if not isinstance(services, list):
        raise ServiceError(f"inventory: host {host}: {SERVICES_VAR}: expected a list of services (name, engine, "
                           f"model, npus_per_instance, ...), got {_shown(services)}; {FIX}")
    # An entry that says ``nodes`` spans hosts: dsctl.core.serving.multinode plans it (its own schema), not this one.
    specs = [validate_service(host, index, entry, npu_count=npu_count, vllm_ascend=vllm_ascend,
                              serving_venv=serving_venv, manager_default=manager_default)
             for index, entry in enumerate(services) if not (isinstance(entry, Mapping) and "nodes" in entry)]
    _check_names(host, specs)
    _check_npus(host, specs, npu_count)
    _check_ports(host, specs)
    return specs


def _check_names(host: str, specs: Sequence[ServiceSpec]) -> None:
    first: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.name in first:
            raise ServiceError(f"inventory: host {host}: {SERVICES_VAR}[{index}].name: {spec.name!r} is also the name "
                               f"of {SERVICES_VAR}[{first[spec.name]}]; give each service on a host its own name")
        first[spec.name] = index


def _check_npus(host: str, specs: Sequence[ServiceSpec], npu_count: int) -> None:
    total = 0
    for index, spec in enumerate(specs):
        total += spec.npus
        if total > npu_count:
            needed = sum(s.npus for s in specs)
            layout = ", ".join(f"{s.name} {s.instances} x {s.npus_per_instance}" for s in specs)
            raise ServiceError(f"inventory: host {host}: {SERVICES_VAR}[{index}].instances: the services need "
                               f"{needed} NPUs ({layout}) but the host has {npu_count} (dsctl_npu_count); "
                               "lower instances or npus_per_instance")


def _check_ports(host: str, specs: Sequence[ServiceSpec]) -> None:
    # The services' part of the host's port table (dsctl.core.serving.host_ports adds sshd, multi-host heads and
    # the gateway to it in validate_fleet).
    table = PortTable(host, error=ServiceError)
    for index, spec in enumerate(specs):
        width = spec.instances * PORTS_PER_INSTANCE[spec.engine]
        for instance in plan_instances(spec, [0] * spec.npus):
            for port in instance.ports:
                table.claim(port, f"{SERVICES_VAR}[{index}].port", instance.name,
                            f"give each service its own port range ({spec.name} needs {width} from its port)")
