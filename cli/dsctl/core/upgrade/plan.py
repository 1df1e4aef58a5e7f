"""What an upgrade will do, decided before any host changes (pure): each host's stack from -> to, the batches.

The target of a host is the inventory's desired versions with the command line's ``--cann/--driver/--firmware/
--vllm-ascend`` over them, resolved and checked by `dsctl.core.fleet.matrix.resolve_stack` (the serving row that
pairs with the CANN included).  Its current stack ("from") is what the host reports (``dsctl check``'s versions),
which is also what a rollback returns to.

Refusals, one line per problem, before anything is touched:

* a target the matrix refuses (``resolve_stack``'s own message, naming the variable);
* a package of the target missing from the package source (its SHA256SUMS), or on a host of unknown arch;
* a driver or firmware change whose *previous* packages are absent from the source: there is no vendor rollback
  for the HDK, going back means installing the older package (ascend-interfaces.md s.6.5), so without it a
  failed upgrade could not be undone.

Batches (``--batch 1|N|P%``, ``--canary N``): the first batch is the canary (``--canary`` hosts, default the batch
size), then batches of ``--batch`` hosts in inventory order; GPU Operator's ``maxParallelUpgrades`` and
kubespray's ``serial`` are the models (ascend-interfaces.md s.13, s.15 item 8).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from dsctl.core.fleet import matrix
from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.fleet.versions import same_release
from dsctl.errors import DsctlError, ExitStatus, UsageError

COMPONENTS = ("driver", "firmware", "cann", "vllm_ascend")
VARIABLES = {"driver": matrix.DRIVER_VAR, "firmware": matrix.FIRMWARE_VAR, "cann": matrix.CANN_VAR,
             "vllm_ascend": matrix.VLLM_ASCEND_VAR}
# Room for one more toolkit + kernels/ops + NNAL next to the installed ones (the real 8.x packages unpack to a few
# GB; an estimate, not a vendor figure).
DISK_NEEDED_MB = 4096
_BATCH = re.compile(r"^(?:(\d+)|(\d+(?:\.\d+)?)%)$")


@dataclass(frozen=True)
class Versions:
    """The four inventory versions of a stack (None: not set / not known)."""

    driver: str | None = None
    firmware: str | None = None
    cann: str | None = None
    vllm_ascend: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Versions:
        return cls(**{key: data.get(key) for key in COMPONENTS})

    def over(self, base: Versions) -> Versions:
        """These versions where set, ``base``'s elsewhere."""
        return Versions(**{key: getattr(self, key) if getattr(self, key) is not None else getattr(base, key)
                           for key in COMPONENTS})

    def as_host_vars(self) -> dict[str, str]:
        """The dsctl_*_version inventory variables that ask for this stack."""
        return {VARIABLES[key]: value for key, value in self.to_dict().items() if value is not None}

    def changed_label(self, other: Versions) -> str:
        """The label of the pieces that differ from ``other`` (the CANN when none does)."""
        keys = [key for key in COMPONENTS if not _same(getattr(self, key), getattr(other, key))] or ["cann"]
        return Versions(**{key: getattr(self, key) for key in keys}).label()

    def label(self) -> str:
        """"CANN 8.3.RC2, vllm-ascend v0.11.0, driver 25.3.rc1, firmware 7.8.0.2.212" (set pieces only)."""
        names = {"cann": "CANN", "vllm_ascend": "vllm-ascend", "driver": "driver", "firmware": "firmware"}
        return ", ".join(f"{names[key]} {getattr(self, key)}" for key in ("cann", "vllm_ascend", "driver", "firmware")
                         if getattr(self, key) is not None)


@dataclass(frozen=True)
class BatchSize:
    """``--batch``: a number of hosts or a share of the fleet."""

    hosts: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str, option: str = "--batch") -> BatchSize:
        match = _BATCH.fullmatch(str(text).strip())
        if not match:
            raise UsageError(f"{option} {text!r}: expected a host count (1, 2) or a share of the fleet (25%)")
        if match.group(1) is not None:
            hosts = int(match.group(1))
            if hosts < 1:
                raise UsageError(f"{option} {text!r}: must be at least 1 host")
            return cls(hosts=hosts)
        percent = float(match.group(2))
        if not 0 < percent <= 100:
            raise UsageError(f"{option} {text!r}: a share must be above 0% and at most 100%")
        return cls(percent=percent)

    def of(self, fleet_size: int) -> int:
        """Hosts per batch for a fleet of ``fleet_size`` (a share rounds up, never below one host)."""
        if self.hosts is not None:
            return max(1, min(self.hosts, fleet_size))
        return max(1, min(fleet_size, math.ceil(fleet_size * (self.percent or 0) / 100)))


def make_batches(hosts: Sequence[str], batch: BatchSize, canary: int | None = None, *,
                 together: Sequence[Sequence[str]] = ()) -> list[list[str]]:
    """Hosts in upgrade order, cut into batches; the first is the canary (``canary`` hosts, default a batch).

    ``together``: the hosts of each multi-host instance (issue 22: its ranks run one stack, so its hosts are
    drained, upgraded and rolled back as one).  Hosts that share an instance, directly or through another, are one
    unit: a unit is never split, so a batch holds whole units up to its size, and a unit larger than the size is
    a batch of its own.  Units keep the order of their first host in ``hosts``; a group's hosts outside ``hosts``
    (already on their target) are not added."""
    if canary is not None and canary < 0:
        raise UsageError(f"--canary {canary}: must not be negative")
    hosts = list(hosts)
    if not hosts:
        return []
    size = batch.of(len(hosts))
    first = size if canary is None else min(canary, len(hosts))
    units = _units(hosts, together)
    batches: list[list[str]] = []
    if first:
        batches.append(_fill(units, first))
    while units:
        batches.append(_fill(units, size))
    return batches


def _units(hosts: list[str], together: Sequence[Sequence[str]]) -> list[list[str]]:
    """``hosts`` joined into the units ``together`` makes (connected groups, also through hosts outside
    ``hosts``), in the order of their first host."""
    parent: dict[str, str] = {}

    def root(host: str) -> str:
        while parent.setdefault(host, host) != host:
            host = parent[host]
        return host

    for group in together:
        for other in group[1:]:
            parent[root(other)] = root(group[0])
    units: dict[str, list[str]] = {}
    for host in hosts:
        units.setdefault(root(host), []).append(host)
    return list(units.values())


def _fill(units: list[list[str]], size: int) -> list[str]:
    """Take whole units from the front of ``units`` while they fit in ``size`` hosts (always at least one)."""
    taken = units.pop(0)
    while units and len(taken) + len(units[0]) <= size:
        taken = taken + units.pop(0)
    return taken


@dataclass(frozen=True)
class HostUpgrade:
    host: str
    source: Versions  # what the host runs now (the rollback target)
    target: Versions
    stack: DesiredStack  # the resolved target
    previous: DesiredStack | None  # the resolved current stack (None: the data cannot build it)

    @property
    def changes(self) -> tuple[str, ...]:
        return tuple(key for key in COMPONENTS
                     if not _same(getattr(self.source, key), getattr(self.target, key)))

    @property
    def hdk_changes(self) -> bool:
        return bool({"driver", "firmware"} & set(self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "from": self.source.to_dict(), "to": self.target.to_dict(),
                "changes": list(self.changes)}


@dataclass(frozen=True)
class UpgradePlan:
    hosts: tuple[HostUpgrade, ...]
    batches: tuple[tuple[str, ...], ...]  # only hosts with changes
    unchanged: tuple[str, ...]  # hosts already on their target
    problems: tuple[str, ...] = field(default=())

    def host(self, name: str) -> HostUpgrade:
        return next(item for item in self.hosts if item.host == name)

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [item.to_dict() for item in self.hosts], "batches": [list(b) for b in self.batches],
                "unchanged": list(self.unchanged), "problems": list(self.problems)}


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    return same_release(a, b) or a.lstrip("v") == b.lstrip("v")


def pip_version(tag: str) -> str:
    try:
        return str(Version(str(tag)))
    except InvalidVersion:
        return str(tag).strip()


def tag_for(releases: Mapping, cann: str | None, installed: str | None) -> str | None:
    """The vllm-ascend tag of the matrix row built for ``cann`` whose pip version is ``installed`` ("0.11.0" ->
    "v0.11.0"); the installed text itself when no row matches (the refusal then names it)."""
    if installed is None:
        return None
    rows = [row for row in releases.get("vllm_ascend_matrix", [])
            if pip_version(row["vllm_ascend"]) == pip_version(installed)]
    for row in rows:
        if cann is not None and same_release(str(row["cann"]), cann):
            return str(row["vllm_ascend"])
    return str(rows[0]["vllm_ascend"]) if rows else installed


def current_versions(releases: Mapping, report: Mapping[str, Any]) -> Versions:
    """The versions a host runs, from its ``dsctl check`` report (installed driver/firmware, active CANN)."""
    versions = report.get("versions") or {}
    cann = (versions.get("cann") or {}).get("active")
    return Versions(driver=(versions.get("driver") or {}).get("installed"),
                    firmware=(versions.get("firmware") or {}).get("installed"),
                    cann=cann, vllm_ascend=tag_for(releases, cann, versions.get("vllm_ascend")))


def _resolve(releases: Mapping, versions: Versions) -> DesiredStack:
    return matrix.resolve_stack(releases, driver=versions.driver, firmware=versions.firmware, cann=versions.cann,
                                vllm_ascend=versions.vllm_ascend)


def _runs(stack: DesiredStack, arch: str, parts: Sequence[str]) -> list[str]:
    return [getattr(stack, f"{part}_run").replace("{arch}", arch) for part in parts]


_FLAGS = {"dsctl_driver_version": ("--driver", "driver"), "dsctl_firmware_version": ("--firmware", "firmware"),
          "dsctl_cann_version": ("--cann", "cann"), "dsctl_vllm_ascend_version": ("--vllm-ascend", "vllm_ascend")}


def check_targets(releases: Mapping, desired: Mapping[str, Versions], overrides: Versions,
                  allow_lab: Mapping[str, bool] | None = None) -> None:
    """Refuse, before any host is contacted, a target the data cannot build: the command line over each host's
    inventory versions (a host's current versions only fill what both leave unset, so a host without inventory
    versions is left to `plan_upgrade`).  `StackError`, one line: exit USAGE for a version the data does not
    carry (named by its option when the command line gave it) or a lab-only release on a host whose inventory
    does not allow them (``allow_lab``: host -> its dsctl_allow_lab_releases; a host left out is not checked),
    VALIDATION_FAILED for an incompatible stack."""
    for host, wanted in desired.items():
        target = overrides.over(wanted)
        if None in (target.driver, target.firmware, target.cann, target.vllm_ascend):
            continue
        try:
            stack = _resolve(releases, target)
            if allow_lab is not None and host in allow_lab:
                matrix.check_lab_releases(releases, stack, allowed=allow_lab[host])
        except matrix.StackError as exc:
            field, _, reason = str(exc).partition(": ")
            flag, attribute = _FLAGS.get(field, (None, None))
            if (exc.exit_status == ExitStatus.USAGE and flag is not None
                    and getattr(overrides, attribute) is not None):
                raise matrix.StackError(f"{flag} {getattr(overrides, attribute)}: {reason}",
                                        exc.exit_status) from None
            raise matrix.StackError(f"{host}: target {target.label()}: {exc}", exc.exit_status) from None


def plan_upgrade(releases: Mapping, hosts: Sequence[str], *, current: Mapping[str, Versions],
                 desired: Mapping[str, Versions], overrides: Versions, arch: Mapping[str, str],
                 package_sums: Mapping[str, str], batch: BatchSize, canary: int | None = None,
                 disk_free_mb: Mapping[str, int | None] | None = None,
                 disk_needed_mb: int = DISK_NEEDED_MB, together: Sequence[Sequence[str]] = ()) -> UpgradePlan:
    """The plan for ``hosts`` (inventory order). ``desired``: each host's inventory versions; ``overrides``: the
    command line's; ``package_sums``: the package source's SHA256SUMS (file name -> digest); ``disk_free_mb``:
    free space under each host's install path (None: unknown, not judged); ``together``: the hosts of each
    multi-host instance (one batch each, `make_batches`)."""
    problems: list[str] = []
    planned: list[HostUpgrade] = []
    for host in hosts:
        source = current[host]
        target = overrides.over(desired.get(host, Versions())).over(source)
        try:
            stack = _resolve(releases, target)
        except DsctlError as exc:
            problems.append(f"{host}: target {target.label()}: {exc}")
            continue
        target = Versions(driver=stack.driver, firmware=stack.firmware, cann=stack.cann,
                          vllm_ascend=stack.vllm_ascend or target.vllm_ascend)
        try:
            previous: DesiredStack | None = _resolve(releases, source)
        except DsctlError:
            previous = None
        item = HostUpgrade(host=host, source=source, target=target, stack=stack, previous=previous)
        problems += _package_problems(item, arch.get(host), package_sums)
        free = (disk_free_mb or {}).get(host)
        if "cann" in item.changes and free is not None and free < disk_needed_mb:
            problems.append(f"{host}: {free} MB free under the install path, a side-by-side CANN {target.cann} "
                            f"needs {disk_needed_mb} MB (the old CANN stays installed for the rollback); free space "
                            "or remove a CANN version no host rolls back to")
        planned.append(item)
    changing = [item.host for item in planned if item.changes]
    unchanged = tuple(item.host for item in planned if not item.changes)
    for group in together:  # an instance whose hosts would end on two stacks: its ranks could not run together
        targets = {planned_host.host: planned_host.target for planned_host in planned if planned_host.host in group}
        if len({target.label() for target in targets.values()}) > 1:
            problems.append(f"{', '.join(group)} serve one instance but their targets differ ("
                            + "; ".join(f"{host}: {target.label()}" for host, target in targets.items())
                            + "); give them the same dsctl_*_version variables")
    batches = tuple(tuple(b) for b in make_batches(changing, batch, canary, together=together))
    return UpgradePlan(hosts=tuple(planned), batches=batches, unchanged=unchanged, problems=tuple(problems))


def _package_problems(item: HostUpgrade, arch: str | None, sums: Mapping[str, str]) -> list[str]:
    if not item.changes:
        return []
    if not arch:
        return [f"{item.host}: its architecture is unknown (uname -m), so its packages cannot be named; "
                "check that the host answers dsctl check"]
    problems = []
    parts = [part for part, key in (("driver", "driver"), ("firmware", "firmware"))
             if key in item.changes]
    if "cann" in item.changes:
        parts += ["toolkit", "kernels", "nnal"]
    for name in _runs(item.stack, arch, parts):
        if not sums.get(name):
            problems.append(f"{item.host}: {name} (for {item.target.label()}) is missing from the package source "
                            "(the file or its SHA256SUMS line); add both to dsctl_package_source")
    if item.hdk_changes:
        if item.previous is None:
            problems.append(f"{item.host}: the HDK change from driver {item.source.driver} / firmware "
                            f"{item.source.firmware} is refused: the releases data cannot name the previous "
                            "packages, so a failed upgrade could not reinstall them")
        else:
            hdk = [part for part in ("driver", "firmware") if part in item.changes]
            for name in _runs(item.previous, arch, hdk):
                if not sums.get(name):
                    problems.append(
                        f"{item.host}: the {'/'.join(hdk)} change {_hdk_text(item)} is refused: the previous "
                        f"package {name} is not in the package source, and only reinstalling it can roll the "
                        "host back (no vendor rollback for the HDK); add it to dsctl_package_source")
    return problems


def _hdk_text(item: HostUpgrade) -> str:
    parts = [f"{key} {getattr(item.source, key)} -> {getattr(item.target, key)}"
             for key in ("driver", "firmware") if key in item.changes]
    return ", ".join(parts)
