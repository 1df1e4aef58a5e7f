"""The dsctl_* host variables of an inventory: their schema, and the check of a whole fleet (pure).

One host's merged Ansible variables are many (ansible_*, site keys, other tools' keys), so unknown keys are
ignored, except ``dsctl_*`` ones: a misspelt dsctl setting would otherwise be ignored in silence and the
default used instead, so it is refused with a "did you mean".  Every problem is one line that names the
host and the variable: ``inventory: host lab-01: dsctl_npu_count: expected an integer 1..16, got 'eight';
fix it in group_vars or host_vars``.

`validate_fleet` also resolves each host's `DesiredStack` (dsctl.core.fleet.matrix) so an incompatible version
choice stops a run before any host is touched, and makes the fleet's NPU network plan once, over every host
(dsctl.core.network.hccn_plan: a derived address depends on the host's place in the fleet), so an inconsistent plan
(duplicate addresses, NPU i of two hosts in two subnets, an address outside its subnet) is refused the same way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dsctl import data
from dsctl.core.fleet import ascend_env, host_names
from dsctl.core.fleet.matrix import NO_SERVING, check_lab_releases, resolve_stack
from dsctl.core.fleet.root_paths import RootPathRefused, check_clashes, root_dir, root_env_file
from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.fleet.versions import version_text
from dsctl.core.http_url import parse_http_url
from dsctl.core.network import hccn_plan
from dsctl.core.network.hccn_plan import HostNetwork, NetworkPlan, NetworkPlanError
from dsctl.core.serving import host_ports, multinode
from dsctl.core.serving.gateway import GatewaySpec, check_gateway
from dsctl.core.serving.multinode import HostGroup, MultiNodeError, MultiNodeSpec

# Text (strict str) and AccountName are shared with the service schema.
from dsctl.core.serving.service import (
    SAFE_PATH_WORDS,
    AccountName,
    ServiceError,
    ServiceSpec,
    Text,
    account_problem,
    plan_host,
    safe_path,
    validate_services,
)
from dsctl.core.text import stated_problem
from dsctl.errors import DsctlError, ExitStatus

SETTINGS_PREFIX = "dsctl_"
FIX = "fix it in group_vars or host_vars"
_MAX_NAMED_HOSTS = 3


class InventoryError(DsctlError):
    exit_status = ExitStatus.USAGE


# --------------------------------------------------------------------------- value types




def _http_url(value: str) -> str:
    parse_http_url(value)  # the one URL parser (dsctl.core.http_url): port 0 refused, never read as the default
    return value


def _path_or_url(value: str) -> str:
    return safe_path(value) if value.startswith("/") else _http_url(value)


# strict=True: YAML turns 24.1 into a float and "yes" stays a string; neither may slip through as a version
# or a boolean (the roles would compare a float, or treat the string "false" as true).
# Every path setting: absolute, of a character set no shell, unit file or supervisor program gives a meaning to.
SafePath = Annotated[Text, AfterValidator(safe_path)]


# A path a role writes, deletes or chmods as root: the safe character set, then dsctl.core.fleet.root_paths's
# rule (normalised, not / or a system directory or file); `action` is what the error says dsctl would do there.
def _root_dir(action: str, example: str) -> Any:
    return Annotated[Text, AfterValidator(safe_path), AfterValidator(root_dir(action, example)),
                     Field(description=SAFE_PATH_WORDS)]


PathOrUrl = Annotated[Text, AfterValidator(_path_or_url)]
HttpUrl = Annotated[Text, AfterValidator(_http_url)]
# Text is already one line without surrounding blanks (dsctl.core.text); these may not be empty either.
OneLine = Annotated[Text, Field(min_length=1)]
# One version grammar for every version setting (dsctl.core.fleet.versions.VERSION_TEXT); the vllm-ascend one
# may also say "none" (no serving stack, dsctl.core.fleet.matrix.NO_SERVING).
Version = Annotated[Text, Field(min_length=1), AfterValidator(version_text)]


def _serving_version(value: str) -> str:
    return value if value.lower() == NO_SERVING else version_text(value)


ServingVersion = Annotated[Text, Field(min_length=1), AfterValidator(_serving_version)]
Flag = Annotated[bool, Field(strict=True)]

_VERSION = "a quoted version string"
_KERNEL_VERSION = 'a quoted kernel version such as "5.10"'
_PATH_OR_URL = f"{SAFE_PATH_WORDS} or an http(s):// URL"
_FLAG = "true or false (unquoted)"


# Package trust (issue 12): a manifest's digest pinned in the inventory.
def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise ValueError("not a sha256 digest")
    return value.lower()


class PinMissing(ValueError):
    """A source over plain http:// without its manifest's digest (one line: the field and the fix)."""

    def __init__(self, source: str, pin: str):
        super().__init__(f"{source}: plain http:// can be tampered with on the way; set {pin} to the digest of its "
                         "SHA256SUMS (`sha256sum SHA256SUMS` where the files are), or serve it over https:// or from "
                         "a directory")


Sha256 = Annotated[Text, AfterValidator(_sha256)]
_SHA256 = "a sha256 digest (64 hex digits: sha256sum SHA256SUMS)"


# The host paths a role removes, replaces, chmods or writes as root (root_paths.CLASHES pairs them).
_ROOT_PATHS = ("dsctl_install_path", "dsctl_serving_venv", "dsctl_staging_dir", "dsctl_env_file",
               "dsctl_service_config_dir", "dsctl_service_log_dir")


class HostSettings(BaseModel):
    """The dsctl settings of one host; each field's description is what an error says it expects."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    dsctl_npu_count: Annotated[int, Field(strict=True, ge=1, le=16, description="an integer 1..16")]
    dsctl_package_source: Annotated[PathOrUrl, Field(description=_PATH_OR_URL)]
    dsctl_reboot_command: Annotated[OneLine, Field(description="a one-line command")] = "shutdown -r now"
    dsctl_allow_reboot: Annotated[Flag, Field(description=_FLAG)] = True
    # A server with eight 910B chips can take ten minutes to come back (BIOS, BMC, NPU init).
    dsctl_reboot_timeout: Annotated[
        int, Field(strict=True, ge=30, le=7200, description="an integer number of seconds, 30..7200")
    ] = 900
    dsctl_driver_version: Annotated[Version | None, Field(description=_VERSION)] = None
    dsctl_firmware_version: Annotated[Version | None, Field(description=_VERSION)] = None
    dsctl_cann_version: Annotated[Version | None, Field(description=_VERSION)] = None
    dsctl_vllm_ascend_version: Annotated[ServingVersion | None, Field(description=f"{_VERSION} or none")] = None
    # Releases.yaml's lab_only releases (dsctl lab's rebuilds) are accepted only where the inventory says so.
    dsctl_allow_lab_releases: Annotated[Flag, Field(description=_FLAG)] = False
    dsctl_install_path: _root_dir("install CANN into it and remove old versions there", "/usr/local/Ascend") = \
        "/usr/local/Ascend"
    dsctl_run_user: Annotated[AccountName, Field(description="a user name")] = "HwHiAiUser"
    dsctl_run_group: Annotated[AccountName, Field(description="a group name")] = "HwHiAiUser"
    # Accounts of the site's own that dsctl may run as (run user and group, services' user and group) besides those
    # it creates (service.DSCTL_ACCOUNTS); privileged groups and shared system accounts stay refused.
    dsctl_allowed_accounts: Annotated[list[AccountName], Field(strict=True, description="a list of user or group "
                                                                                        "names")] = \
        Field(default_factory=list)
    dsctl_force_unhealthy: Annotated[Flag, Field(description=_FLAG)] = False
    # The deployment guides' prerequisites (field-practice.md): >= 200 GB free disk, >= 64 GB RAM, kernel 5.10.
    dsctl_min_free_disk_gb: Annotated[int, Field(strict=True, ge=1, description="an integer number of GB >= 1")] = 200
    # --- interpreters and OS (dsctl.core.hostfacts.platform; checked in preflight and by check --ready)
    dsctl_min_memory_gb: Annotated[int, Field(strict=True, ge=1, description="an integer number of GB >= 1")] = 64
    dsctl_min_kernel_version: Annotated[Version, Field(description=_KERNEL_VERSION)] = "5.10"
    # The interpreter the serving venv is made from; its version must be in the vllm-ascend row's range.
    dsctl_serving_python: Annotated[SafePath, Field(description=SAFE_PATH_WORDS)] = "/usr/bin/python3"
    # OS families no Ascend table lists that this site accepts anyway (the lab: debian).
    dsctl_extra_supported_os: Annotated[
        list[Annotated[str, Field(strict=True, pattern=r"^[a-z0-9._-]{1,32}$")]],
        Field(strict=True, description="a list of os-release IDs such as [debian]"),
    ] = Field(default_factory=list)
    # --- end interpreters and OS
    dsctl_ascend_env: Annotated[
        dict[str, Any], Field(strict=True, description="a mapping of VARIABLE: value")
    ] = Field(default_factory=dict)
    # A named set of NPU env values (ascend_env.yaml's profiles, e.g. long-context); dsctl_ascend_env overrides it.
    dsctl_ascend_env_profile: Annotated[
        str | None, Field(strict=True, description="a profile name from dsctl/data/ascend_env.yaml, or none")
    ] = None
    dsctl_serving_venv: _root_dir("replace it", "/opt/dsctl/serving-venv") = "/opt/dsctl/serving-venv"
    # Defaults to <dsctl_package_source>/wheels (see _default_wheelhouse).
    dsctl_wheelhouse: Annotated[PathOrUrl | None, Field(description=_PATH_OR_URL)] = None
    dsctl_pip_index_url: Annotated[HttpUrl | None, Field(description="an http(s):// URL")] = None
    # A hash lock on the controller (dsctl wheelhouse build); default: the wheelhouse's lock for the host.
    dsctl_pip_lock: Annotated[SafePath | None, Field(description=SAFE_PATH_WORDS)] = None
    dsctl_staging_dir: _root_dir("make it root's alone (mode 0700)", "/var/cache/dsctl/packages") = \
        "/var/cache/dsctl/packages"
    dsctl_env_file: Annotated[
        Text, AfterValidator(safe_path),
        AfterValidator(root_env_file("overwrite it", "/etc/profile.d/dsctl-ascend.sh")),
        Field(description=SAFE_PATH_WORDS),
    ] = "/etc/profile.d/dsctl-ascend.sh"
    # Inference services (dsctl deploy); each entry is checked by dsctl.core.serving.service in validate_fleet.
    dsctl_services: Annotated[
        list[Any], Field(strict=True, description="a list of services (see inventories/sample)")
    ] = Field(default_factory=list)
    dsctl_service_manager: Annotated[
        Literal["systemd", "supervisor", "container"], Field(description="systemd, supervisor or container")
    ] = "systemd"
    dsctl_service_config_dir: _root_dir("move the directories it does not declare out of it", "/etc/dsctl/services") = \
        "/etc/dsctl/services"
    dsctl_service_log_dir: _root_dir("make it root's (mode 0755)", "/var/log/dsctl") = "/var/log/dsctl"
    # The gateway in front of the instances (dsctl.core.serving.gateway's own schema, one line per problem):
    # typed here so a malformed gateway is refused with the inventory, not after every instance rolled out.
    dsctl_gateway: Annotated[GatewaySpec | None, Field(description="a mapping (see dsctl.core.serving.gateway)")] = \
        None
    dsctl_gateway_on_controller: Annotated[Flag, Field(description=_FLAG)] = False
    dsctl_gateway_drain: Annotated[Any, Field(description="a list of host/instance")] = None
    dsctl_gateway_undrain: Annotated[Any, Field(description="a list of host/instance")] = None
    # Package trust (issue 12): the sha256 of the SHA256SUMS file itself (`sha256sum SHA256SUMS`), checked by
    # ascend_preflight before anything runs as root; a source over plain http:// must be pinned (_pinned_http).
    dsctl_package_manifest_sha256: Annotated[Sha256 | None, Field(description=_SHA256)] = None
    dsctl_wheelhouse_manifest_sha256: Annotated[Sha256 | None, Field(description=_SHA256)] = None
    # The NPU parameter plane (RoCE): the group's addressing (subnets, gateways, detect, start; or netmask with
    # explicit lists), each host's explicit addresses and its slot.  Checked by dsctl.core.network.hccn_plan, whose
    # one-line errors name the field (validate_host_vars, then the whole fleet's plan in validate_fleet).
    dsctl_npu_network: Annotated[Any, Field(description="a mapping (subnets or netmask, gateways, detect, start)")] = \
        None
    dsctl_npu_ips: Annotated[Any, Field(description="a list of IPv4 addresses, one per NPU from NPU 0")] = None
    dsctl_npu_detect_ips: Annotated[Any, Field(description="a list of IPv4 addresses, one per NPU from NPU 0")] = None
    dsctl_npu_host_index: Annotated[Any, Field(description="an integer 0..4095")] = None

    @model_validator(mode="after")
    def _pinned_http(self) -> HostSettings:
        # Over plain http the manifest and the installers come from the same unauthenticated source: anyone on the
        # path can swap both. Pinned, the manifest is checked against the inventory, and each installer against it.
        for source, pin in (("dsctl_package_source", "dsctl_package_manifest_sha256"),
                            ("dsctl_wheelhouse", "dsctl_wheelhouse_manifest_sha256")):
            if str(getattr(self, source) or "").lower().startswith("http://") and getattr(self, pin) is None:
                raise PinMissing(source, pin)
        return self

    @model_validator(mode="after")
    def _apart(self) -> HostSettings:
        # Each path is a place of dsctl's own on its own; root_paths.CLASHES says which may not nest or coincide
        # (a PathClash, exit 3, naming both settings).
        check_clashes({field: getattr(self, field) for field in _ROOT_PATHS})
        return self

    # Not an inventory variable: validate_fleet attaches the resolved stack here.  validate_host_vars only
    # passes dsctl_* keys in, so an inventory cannot set it.
    stack: DesiredStack | None = None
    services: tuple[ServiceSpec, ...] = ()
    # Attached by validate_fleet too: this host's NPUs in the fleet's NPU network plan (None: the host has no plan),
    # and that plan of the whole fleet (the same object on every host; peers outside --limit included).
    npu_addresses: HostNetwork | None = None
    network_plan: NetworkPlan | None = None
    # The dsctl_services entries that span hosts (they say nodes: dsctl.core.serving.multinode), and the fleet's host
    # groups of all of them (every instance's hosts, head first; the same tuple on every host).
    multi_host_services: tuple[MultiNodeSpec, ...] = ()
    host_groups: tuple[HostGroup, ...] = ()

    @field_validator("dsctl_services", mode="before")
    @classmethod
    def _no_services(cls, services: Any) -> Any:
        return [] if services is None else services

    @model_validator(mode="before")
    @classmethod
    def _default_wheelhouse(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("dsctl_wheelhouse") is None:
            source = values.get("dsctl_package_source")
            if isinstance(source, str) and source.startswith(("/", "http://", "https://")):  # else its own error
                values = {**values, "dsctl_wheelhouse": source.rstrip("/") + "/wheels"}
        return values

    @field_validator("dsctl_gateway", mode="before")
    @classmethod
    def _gateway(cls, value: Any) -> Any:
        return None if value is None else check_gateway(value)  # GatewayError: validate_host_vars names the host

    @field_validator("dsctl_run_user")
    @classmethod
    def _not_root(cls, user: str) -> str:
        # The npu_driver role makes this account with the run group as primary group and /bin/bash as shell:
        # on root that silently rewrites the superuser. Only the name is knowable here; "root" is uid 0.
        if user == "root":
            raise InventoryError("dsctl_run_user: root is refused: the npu_driver role would change that account's "
                                 "group and shell; name an unprivileged account such as HwHiAiUser; " + FIX)
        return user

    @model_validator(mode="after")
    def _own_accounts(self) -> HostSettings:
        # The npu_driver role makes the run user a login account (/bin/bash) in the run group: on a person's or
        # another service's account that rewrites it, so only dsctl's own or an allow-listed one is taken.
        for field in ("dsctl_run_user", "dsctl_run_group"):
            problem = account_problem(getattr(self, field), self.dsctl_allowed_accounts,
                                      group=field == "dsctl_run_group")
            if problem:
                raise InventoryError(f"{field}: {problem}")
        return self

    @field_validator("dsctl_ascend_env", mode="before")
    @classmethod
    def _empty_env(cls, overrides: Any) -> Any:
        return {} if overrides is None else overrides  # "dsctl_ascend_env:" with nothing under it

    @field_validator("dsctl_ascend_env")
    @classmethod
    def _known_env(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        ascend_env.resolve_env(overrides)  # raises EnvError, one line naming the variable
        return overrides

    @field_validator("dsctl_ascend_env_profile")
    @classmethod
    def _known_profile(cls, profile: str | None) -> str | None:
        return ascend_env.check_profile(profile)  # raises EnvError naming the known profiles

    @property
    def environment(self) -> dict[str, str]:
        """The NPU process environment: ascend_env defaults, then the profile, then dsctl_ascend_env."""
        return ascend_env.resolve_env(self.dsctl_ascend_env, profile=self.dsctl_ascend_env_profile)

    @property
    def environment_sources(self) -> list[dict[str, Any]]:
        """`environment` with each value's origin, source, confidence and warning (ascend_env.annotated_env)."""
        return ascend_env.annotated_env(self.dsctl_ascend_env, profile=self.dsctl_ascend_env_profile)

    @classmethod
    def setting_names(cls) -> list[str]:
        return [name for name in cls.model_fields if name.startswith(SETTINGS_PREFIX)]


# --------------------------------------------------------------------------- one host


def _count(number: int, template: str) -> str:
    return template.format(number, "" if number == 1 else "s") if number else ""


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _unknown_setting(key: str) -> str:
    # Compare what follows the shared prefix, or every name would look close to every other.
    names = {name.removeprefix(SETTINGS_PREFIX): name for name in HostSettings.setting_names()}
    close = difflib.get_close_matches(key.removeprefix(SETTINGS_PREFIX), list(names), n=1, cutoff=0.6)
    if close:
        return f"{key}: unknown dsctl variable; did you mean {names[close[0]]}? rename it in group_vars or host_vars"
    return f"{key}: unknown dsctl variable (see inventories/sample for dsctl's); remove it from group_vars or host_vars"


def _problem(error: Mapping[str, Any]) -> str:
    if isinstance((error.get("ctx") or {}).get("error"), PinMissing):
        return str(error["ctx"]["error"])
    field = str(error["loc"][0]) if error.get("loc") else "inventory"
    if isinstance((error.get("ctx") or {}).get("error"), RootPathRefused):
        return f"{field}: {error['ctx']['error']}"
    info = HostSettings.model_fields.get(field)
    expected = info.description if info is not None and info.description else "a valid value"
    if error["type"] == "missing":
        return f"{field}: required but not set ({expected}); add it to group_vars or host_vars"
    if stated_problem(error):
        return f"{field}: {stated_problem(error)}; {FIX}"
    value = error.get("input")
    if expected.startswith((_VERSION, _KERNEL_VERSION)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML read 24.1 as a number: quote it, or "8.10" becomes 8.1.
            return f'{field}: expected {expected}, got the number {value}; quote it: {field}: "{value}"'
    return f"{field}: expected {expected}, got {_shown(value)}; {FIX}"


def validate_host_vars(host: str, hostvars: Mapping[str, Any]) -> HostSettings:
    """One host's merged variables -> its settings; `InventoryError` (one line, host and variable) if wrong."""
    settings = {str(k): v for k, v in hostvars.items() if str(k).startswith(SETTINGS_PREFIX)}
    known = set(HostSettings.setting_names())
    unknown = sorted(key for key in settings if key not in known)
    if unknown:
        raise InventoryError(f"inventory: host {host}: {_unknown_setting(unknown[0])}")
    try:
        validated = HostSettings.model_validate(settings)
    except ValidationError as invalid:
        errors = invalid.errors()
        more = _count(len(errors) - 1, " ({} more problem{} on this host)")
        raise InventoryError(f"inventory: host {host}: {_problem(errors[0])}{more}") from None
    except DsctlError as invalid:  # EnvError from dsctl_ascend_env
        raise InventoryError(f"inventory: host {host}: {invalid}", invalid.exit_status) from None
    try:
        hccn_plan.validate_host_network(host, settings)  # this host's NPU network settings on their own
    except NetworkPlanError as invalid:
        raise InventoryError(str(invalid), invalid.exit_status) from None
    return validated


# --------------------------------------------------------------------------- the fleet


def _host_problem(host: str, hostvars: Mapping[str, Any], releases: Mapping,
                  stacks: dict[tuple, DesiredStack]) -> tuple[HostSettings | None, DsctlError | None]:
    try:
        settings = validate_host_vars(host, hostvars)
    except InventoryError as problem:
        return None, problem
    versions = (settings.dsctl_driver_version, settings.dsctl_firmware_version, settings.dsctl_cann_version,
                settings.dsctl_vllm_ascend_version)
    if versions not in stacks:
        try:
            stacks[versions] = resolve_stack(releases, driver=versions[0], firmware=versions[1], cann=versions[2],
                                             vllm_ascend=versions[3])
        except DsctlError as problem:
            return None, problem
    stack = stacks[versions]
    try:
        check_lab_releases(releases, stack, allowed=settings.dsctl_allow_lab_releases)
    except DsctlError as problem:
        return None, problem
    try:
        services = validate_services(host, settings.dsctl_services, npu_count=settings.dsctl_npu_count,
                                     vllm_ascend=stack.vllm_ascend, serving_venv=settings.dsctl_serving_venv,
                                     manager_default=settings.dsctl_service_manager)
    except DsctlError as problem:
        return None, problem
    try:
        multi = multi_host_specs(host, settings.dsctl_services)
    except InventoryError as problem:
        return None, problem
    problem = _service_accounts(host, settings.dsctl_services, settings.dsctl_allowed_accounts)
    if problem is not None:
        return None, problem
    names = {spec.name for spec in services}
    clash = next((spec.name for spec in multi if spec.name in names), None)
    if clash is not None:
        return None, InventoryError(f"inventory: host {host}: dsctl_services: two services are named {clash} (one on "
                                    "this host, one across hosts); give each its own name")
    return settings.model_copy(update={"stack": stack, "services": tuple(services),
                                       "multi_host_services": tuple(multi)}), None


def _service_accounts(host: str, services: list[Any], allowed: list[str]) -> InventoryError | None:
    """The first service (single- or multi-host, already validated) whose user or group is neither dsctl's own nor
    in dsctl_allowed_accounts."""
    for index, entry in enumerate(services):
        for field, default in (("user", "dsctl-serve"), ("group", "HwHiAiUser")):
            problem = account_problem(str(entry.get(field) or default), allowed, group=field == "group")
            if problem:
                return InventoryError(f"inventory: host {host}: dsctl_services[{index}].{field}: {problem}")
    return None


def multi_host_specs(host: str, services: Any) -> list[MultiNodeSpec]:
    """The host's dsctl_services entries that span hosts, validated (`InventoryError`, one line naming the entry)."""
    specs = []
    for index, entry in enumerate(services if isinstance(services, list) else []):
        if not multinode.is_multinode(entry):
            continue
        try:
            specs.append(multinode.validate_multinode(entry))
        except MultiNodeError as invalid:
            raise InventoryError(f"inventory: host {host}: dsctl_services[{index}]: {invalid}",
                                 invalid.exit_status) from None
    return specs


def _host_groups(fleet: Mapping[str, Mapping[str, Any]], settled: Mapping[str, HostSettings],
                 network: NetworkPlan) -> tuple[HostGroup, ...]:
    """The host groups of the fleet's multi-host services (every host of ``fleet``: the hosts outside --limit
    declare their part too); the NPUs of ``settled``'s single-host instances are taken."""
    declared: dict[str, list[MultiNodeSpec]] = {}
    counts: dict[str, int] = {}
    taken: dict[str, dict[int, str]] = {}
    for host, values in fleet.items():
        host = str(host)
        if host in settled:
            declared[host] = list(settled[host].multi_host_services)
            counts[host] = settled[host].dsctl_npu_count
            try:
                planned = plan_host(settled[host].services, settled[host].dsctl_npu_count)
            except ServiceError:
                planned = []
            taken[host] = {npu: instance.name for instance in planned for npu in instance.npus}
        else:
            declared[host] = multi_host_specs(host, values.get("dsctl_services"))
            count = values.get("dsctl_npu_count")
            counts[host] = count if isinstance(count, int) and not isinstance(count, bool) else 0
    if not any(declared.values()):
        return ()
    try:
        return multinode.plan_host_groups(declared, network=network, npu_counts=counts, taken=taken)
    except MultiNodeError as problem:
        raise InventoryError(f"inventory: dsctl_services: {problem}", problem.exit_status) from None


def _check_host_ports(host: str, hostvars: Mapping[str, Any], settings: HostSettings,
                      groups: tuple[HostGroup, ...]) -> None:
    """Every port the host listens on (sshd, its instances, the multi-host instances it heads) used once."""
    specs = {spec.name: spec for spec in settings.multi_host_services}
    heads = [(group.name, specs[group.service]) for group in groups
             if group.hosts[0] == host and group.service in specs]
    try:
        host_ports.host_table(host, services=settings.services, npu_count=settings.dsctl_npu_count, heads=heads,
                              ssh=host_ports.ssh_port(hostvars),
                              fields=host_ports.service_fields(hostvars.get("dsctl_services")))
    except DsctlError as clash:
        raise InventoryError(str(clash), clash.exit_status) from None


def _without_host(problem: DsctlError, host: str) -> str:
    return str(problem).removeprefix(f"inventory: host {host}: ")


def _hosts_label(hosts: list[str]) -> str:
    if len(hosts) == 1:
        return f"host {hosts[0]}"
    named = ", ".join(hosts[:_MAX_NAMED_HOSTS]) + (", ..." if len(hosts) > _MAX_NAMED_HOSTS else "")
    return f"{len(hosts)} hosts ({named})"


def fleet_network(hosts: Mapping[str, Mapping[str, Any]]) -> NetworkPlan:
    """The NPU network plan of these hosts (every host of the fleet, in inventory order); `InventoryError` with
    hccn_plan's one line (exit 2 for a malformed value, 3 for a plan that cannot work)."""
    try:
        return hccn_plan.plan_network({str(host): {str(k): v for k, v in values.items()}
                                       for host, values in hosts.items()})
    except NetworkPlanError as invalid:
        raise InventoryError(str(invalid), invalid.exit_status) from None


def validate_fleet(hosts: Mapping[str, Mapping[str, Any]], *, releases: Mapping | None = None,
                   fleet: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, HostSettings]:
    """Every host's settings, each with its resolved `DesiredStack` attached as ``.stack``, its NPUs in the NPU
    network plan as ``.npu_addresses`` and the whole plan as ``.network_plan``.

    ``fleet``: every host of the fleet (``hosts`` may be a --limit of it), in inventory order, for the NPU network
    plan, made once here; default ``hosts``.  Raises `InventoryError` on the first problem (hosts in the order
    given), saying how many hosts share it: exit USAGE for a bad variable or unknown version, VALIDATION_FAILED
    for an incompatible stack or an NPU network plan that cannot work.
    """
    releases = data.load("releases") if releases is None else releases
    # The roles call this too (plain ansible-playbook): a host name dsctl would misuse is refused there as well.
    bad_name = host_names.first_bad_host_name([str(host) for host in (*hosts, *(fleet or {}))])
    if bad_name is not None:
        raise InventoryError(f"inventory: {bad_name}")
    stacks: dict[tuple, DesiredStack] = {}
    settled: dict[str, HostSettings] = {}
    problems: dict[str, DsctlError] = {}
    for host, hostvars in hosts.items():
        settings, problem = _host_problem(str(host), hostvars, releases, stacks)
        if problem is not None:
            problems[str(host)] = problem
        else:
            settled[str(host)] = settings
    if not problems:
        everyone = fleet if fleet is not None else hosts
        network = fleet_network(everyone)
        groups = _host_groups(everyone, settled, network)
        raw = {str(host): values for host, values in hosts.items()}
        for host, settings in settled.items():
            _check_host_ports(host, raw[host], settings, groups)
        return {host: settings.model_copy(update={"npu_addresses": network.host(host) if host in network else None,
                                                  "network_plan": network, "host_groups": groups})
                for host, settings in settled.items()}
    first_host, first = next(iter(problems.items()))
    message = _without_host(first, first_host)
    sharing = [host for host, problem in problems.items() if _without_host(problem, host) == message]
    others = len(problems) - len(sharing)
    tail = _count(others, " (other problems on {} more host{})")
    raise InventoryError(f"inventory: {_hosts_label(sharing)}: {message}{tail}", first.exit_status) from first
