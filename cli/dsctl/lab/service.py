"""The lab's use cases: up, down, status, fault, packages. They return data; commands/lab.py renders it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl import data
from dsctl.adapters import ssh
from dsctl.core.hostfacts import npufacts
from dsctl.core.lab.plan import LabSpec, plan_lab
from dsctl.errors import DsctlError, UsageError
from dsctl.lab import faults, hosts, preinstall
from dsctl.lab.hosts import LabPaths, Progress
from dsctl.lab.inventory import render_inventory
from dsctl.lab.packages import build_packages


@dataclass
class UpResult:
    spec: LabSpec
    inventory: Path
    created: bool


def lab_up(root: Path, *, hosts_count: int, npus: int, chip: str, subnet: str, disk_gb: int,
           driver: str | None, firmware: str | None, cann: str | None, progress: Progress) -> UpResult:
    hosts.require_linux_root()
    spec = plan_lab(
        hosts=hosts_count, npus=npus, chip=chip, chips=data.load("chips")["chips"], subnet=subnet,
        driver=driver, firmware=firmware, cann=None if cann in (None, "none") else cann, disk_gb=disk_gb,
    )
    steps = preinstall.plan(spec)  # unknown versions fail here, before anything exists
    paths = LabPaths(root)
    existing = hosts.load_spec(paths)
    if existing and hosts.is_running(paths, existing):
        if existing.same_shape(spec):
            return UpResult(existing, paths.inventory, created=False)
        raise UsageError(
            f"a lab of {existing.hosts} x {existing.chip} is already up with other options; "
            "run `dsctl lab down` first"
        )
    hosts.down(paths)  # whatever a crashed or interrupted `lab up` left behind
    try:
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


def lab_down(root: Path) -> dict[str, int]:
    hosts.require_linux_root()
    return hosts.down(LabPaths(root))


def running_spec(root: Path) -> tuple[LabPaths, LabSpec]:
    paths = LabPaths(root)
    spec = hosts.load_spec(paths)
    if spec is None:
        raise DsctlError(f"no lab is up under {root}; start one with `dsctl lab up`")
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


def lab_status(root: Path, timeout: float = 5.0) -> tuple[LabSpec, list[HostStatus]]:
    hosts.require_linux_root()
    paths, spec = running_spec(root)
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


def lab_fault(root: Path, host: str, kind: faults.FaultKind, **options: Any) -> str:
    hosts.require_linux_root()
    paths, spec = running_spec(root)
    return faults.inject(paths, spec, host, kind, **options)
