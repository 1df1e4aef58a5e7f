"""The lab verbs (`dsctl lab`): up, down, status, fault, packages, snapshot. They drive dsctl.lab and return data;
commands/lab.py renders it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl import data
from dsctl.adapters import output_paths, ssh
from dsctl.core.hostfacts import npufacts
from dsctl.core.lab.plan import (
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    MAX_DISK_GB,
    MAX_HOSTS,
    MAX_NPUS,
    LabSpec,
    check_name,
    plan_lab,
)
from dsctl.errors import DsctlError, UsageError
from dsctl.lab import faults, hosts, preinstall, snapshot
from dsctl.lab.faults import FaultKind
from dsctl.lab.hosts import LabPaths, Progress
from dsctl.lab.inventory import render_inventory
from dsctl.lab.packages import build_packages
from dsctl.services.inputs import Bound

# The bounds of the lab's numbers (dsctl.core.lab.plan says why each is what it is).
LAB_HOSTS = Bound(1, MAX_HOSTS, "lab hosts")
NPUS = Bound(1, MAX_NPUS, "NPUs")
DISK_GB = Bound(1, MAX_DISK_GB, "GB")
NPU_ID = Bound(0, MAX_NPUS - 1, "", " (the highest NPU id of a lab host)")


@dataclass
class UpResult:
    spec: LabSpec
    inventory: Path
    created: bool


def lab_up(root: Path | None, *, hosts_count: int, npus: int, chip: str, subnet: str | None, disk_gb: int,
           driver: str | None, firmware: str | None, cann: str | None, progress: Progress,
           name: str | None = None) -> UpResult:
    """Bring up the lab ``name`` (default: lab), or find it up with these options already."""
    name = name or DEFAULT_NAME
    hosts.require_linux_root()
    check_name(name)
    root = root if root is not None else hosts.default_root(name)

    def planned(network: str) -> LabSpec:
        return plan_lab(
            hosts=hosts_count, npus=npus, chip=chip, chips=data.load("chips")["chips"], subnet=network,
            driver=driver, firmware=firmware, cann=None if cann in (None, "none") else cann, disk_gb=disk_gb,
            name=name,
        )

    paths = LabPaths(root, name)
    existing = hosts.load_spec(paths)
    # Unknown versions and bad options fail here, before anything exists.
    steps = preinstall.plan(planned(subnet or (existing.subnet if existing else DEFAULT_SUBNET)))
    if existing and hosts.is_running(paths, existing):
        if existing.same_shape(planned(subnet or existing.subnet)):
            return UpResult(existing, paths.inventory, created=False)
        raise UsageError(
            f"a lab {name!r} of {existing.hosts} x {existing.chip} is already up with other options; "
            f"run `dsctl lab down{'' if name == DEFAULT_NAME else ' --name ' + name}` first"
        )
    hosts.down(paths)  # whatever a crashed or interrupted `lab up` left behind
    try:
        with hosts.network_lock():  # labs started side by side never choose the same subnet
            spec = planned(hosts.choose_subnet(name, subnet))
            hosts.up(spec, paths, progress)
        # The inventory names this directory as the package source, so it exists on every lab.
        progress(f"writing installer packages to {paths.packages}")
        build_packages(paths.packages)
        if steps:
            preinstall.run(spec, paths, steps, progress)
        paths.inventory.write_text(render_inventory(spec, paths))
    except BaseException:
        progress("lab up failed: removing what it created")
        hosts.down(paths)
        raise
    return UpResult(spec, paths.inventory, created=True)


def lab_paths(root: Path | None, name: str | None) -> LabPaths:
    """The lab a command means: --name (default "lab") and --root (default $DSCTL_LAB_ROOT or /run/dsctl/<name>);
    a root given without a name is the lab whose state is there, whatever its name."""
    if name is not None:
        check_name(name)
    where = root if root is not None else hosts.default_root(name or DEFAULT_NAME)
    if name is None:
        spec = hosts.load_spec(LabPaths(where))
        name = spec.name if spec is not None else DEFAULT_NAME
    return LabPaths(where, name)


def lab_down(root: Path | None, name: str | None = None) -> dict[str, int]:
    hosts.require_linux_root()
    return hosts.down(lab_paths(root, name))


def running_spec(root: Path | None, name: str | None = None) -> tuple[LabPaths, LabSpec]:
    paths = lab_paths(root, name)
    spec = hosts.load_spec(paths)
    if spec is None:
        option = "" if paths.name == DEFAULT_NAME else f" --name {paths.name}"
        raise DsctlError(f"no lab is up under {paths.root}; start one with `dsctl lab up{option}`")
    if spec.name != paths.name:
        raise UsageError(f"--name {paths.name}: the lab under {paths.root} is named {spec.name!r}; "
                         f"pass --name {spec.name}")
    return paths, spec


def ssh_targets(paths: LabPaths, spec: LabSpec) -> list[ssh.SshTarget]:
    return [
        ssh.SshTarget(host.name, host.address, "root", paths.client_key, paths.known_hosts)
        for host in spec.members
    ]


@dataclass
class HostStatus:
    name: str
    address: str
    power: str
    network: str
    boots: int | None
    npu: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def lab_status(root: Path | None, timeout: float = 5.0, name: str | None = None) -> tuple[LabSpec, list[HostStatus]]:
    hosts.require_linux_root()
    paths, spec = running_spec(root, name)
    results = {result.name: result for result in ssh.run_many(ssh_targets(paths, spec), npufacts.NPU_QUERY, timeout)}
    statuses = []
    for host in spec.members:
        state = hosts.host_state(paths, host.name) or {}
        result = results[host.name]
        status = HostStatus(
            name=host.name,
            address=host.address,
            power="on" if hosts.init_pid(paths, host.name) else "off",
            network="up" if hosts.link_is_up(host) else "down",
            boots=state.get("boots"),
        )
        if not result.reached:
            status.error = f"unreachable: {result.error}"
        else:
            status.npu = npufacts.summarize(result.exit_code, result.stdout, result.stderr)
        statuses.append(status)
    return spec, statuses


def lab_fault(root: Path | None, host: str, kind: FaultKind, name: str | None = None, **options: Any) -> str:
    hosts.require_linux_root()
    paths, spec = running_spec(root, name)
    return faults.inject(paths, spec, host, kind, **options)


def lab_snapshot(root: Path | None, name: str | None, action: str, snapshot_name: str | None = None, *,
                 replace: bool = False, progress: Progress | None = None):
    """save / restore / delete one snapshot (returns its SnapshotInfo, None for delete), or list them all."""
    hosts.require_linux_root()
    paths, spec = running_spec(root, name)
    say = progress or (lambda _message: None)
    if action == "list":
        return snapshot.list_snapshots(paths)
    assert snapshot_name is not None
    if action == "save":
        return snapshot.save(paths, spec, snapshot_name, say, replace=replace)
    if action == "restore":
        return snapshot.restore(paths, spec, snapshot_name, say)
    snapshot.delete(paths, snapshot_name)
    return None


def lab_packages(out: Path) -> list[Path]:
    """Write the lab's emulated installer packages (.run) and their SHA256SUMS to ``out``; the files written."""
    output_paths.check_dir("--out", out)  # before the packages are built
    try:
        return build_packages(out)
    except OSError as exc:
        raise DsctlError(f"--out {out}: {exc.strerror}; choose a writable directory") from exc
