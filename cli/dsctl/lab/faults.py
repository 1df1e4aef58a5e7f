"""Faults injected into lab hosts, observable only through the host's own interfaces.

A sick chip shows in npu-smi's Health column, an armed installer failure makes
the next .run fail midway with a real-looking error, an unplugged cable makes
the host unreachable, a full disk makes writes fail with ENOSPC and shows in df.
``uninstall --component driver|firmware`` runs the package's own uninstall.sh on
the host, leaving the firmware-only or driver-only state a real server can be in
(the firmware's upgrade record goes with its package, the flashed chips keep it).
"""

from __future__ import annotations

import os
from enum import StrEnum

from dsctl.core.lab.plan import LabSpec
from dsctl.emu import hwstate
from dsctl.errors import DsctlError, UsageError
from dsctl.lab import hosts
from dsctl.lab.hosts import LabPaths

# Health values npu-smi can report besides OK (Ascend npu-smi manual: OK, Warning, Alarm, Critical).
UNHEALTHY_VALUES = ("Warning", "Alarm", "Critical")
INSTALL_COMPONENTS = ("any", "driver", "firmware", "toolkit", "kernels", "nnal")
UNINSTALL_COMPONENTS = ("driver", "firmware")
# What is left free on a "full" disk: enough for the shell and sshd, not for a package.
FULL_DISK_HEADROOM_BYTES = 256 * 1024


class FaultKind(StrEnum):
    chip_unhealthy = "chip-unhealthy"
    chip_healthy = "chip-healthy"
    install_fail = "install-fail"
    network_down = "network-down"
    network_up = "network-up"
    disk_full = "disk-full"
    disk_free = "disk-free"
    uninstall = "uninstall"
    clear = "clear"


def _find_host(spec: LabSpec, name: str):
    for host in spec.members:
        if host.name == name:
            return host
    raise UsageError(f"HOST {name!r} is not in the lab; choose one of: {', '.join(h.name for h in spec.members)}")


def _set_health(paths: LabPaths, host: str, npu: int | None, health: str) -> str:
    hw_dir = paths.hw_dir(host)
    with hwstate.locked(hw_dir):
        board = hwstate.board(hw_dir)
        ids = [entry["id"] for entry in board["npus"]]
        if npu is None or npu not in ids:
            raise UsageError(f"--npu must be one of {ids[0]}..{ids[-1]} on {host}")
        board["npus"][ids.index(npu)]["health"] = health
        hwstate.save_board(board, hw_dir)
    return f"{host}: NPU {npu} health {health}"


def _set_disk_limit(paths: LabPaths, host: str, size_bytes: int) -> None:
    hosts._run(["mount", "-o", f"remount,size={size_bytes}", str(paths.disk(host))])


def _disk_used(paths: LabPaths, host: str) -> int:
    stats = os.statvfs(paths.disk(host))
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def _uninstall(paths: LabPaths, host: str, component: str) -> str:
    if component not in UNINSTALL_COMPONENTS:
        raise UsageError(f"--component must be one of {', '.join(UNINSTALL_COMPONENTS)} for uninstall, "
                         f"got {component!r}")
    script = f"/usr/local/Ascend/{component}/script/uninstall.sh"
    result = hosts.run_in_host(paths, host, ["sh", "-c", f"test -x {script} && exec {script} --quiet"])
    if result.returncode != 0:
        tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-1:]) or f"no {script}"
        raise DsctlError(f"{host}: the {component} is not installed, nothing to uninstall ({tail})")
    left = {"driver": "firmware-only", "firmware": "driver-only"}[component]
    return f"{host}: {component} uninstalled by its own uninstall.sh ({left} unless the other was absent too)"


def inject(paths: LabPaths, spec: LabSpec, host_name: str, kind: FaultKind, *, npu: int | None = None,
           health: str = "Critical", component: str = "any") -> str:
    host = _find_host(spec, host_name)
    if kind is FaultKind.chip_unhealthy:
        if health not in UNHEALTHY_VALUES:
            raise UsageError(f"--health must be one of {', '.join(UNHEALTHY_VALUES)}, got {health!r}")
        return _set_health(paths, host.name, npu, health)
    if kind is FaultKind.chip_healthy:
        return _set_health(paths, host.name, npu, "OK")
    if kind is FaultKind.install_fail:
        if component not in INSTALL_COMPONENTS:
            raise UsageError(f"--component must be one of {', '.join(INSTALL_COMPONENTS)}, got {component!r}")
        hw_dir = paths.hw_dir(host.name)
        with hwstate.locked(hw_dir):
            hwstate.save_faults({**hwstate.faults(hw_dir), "install_fail": component}, hw_dir)
        return f"{host.name}: the next {component} installer run fails midway"
    if kind is FaultKind.uninstall:
        return _uninstall(paths, host.name, component)
    if kind in (FaultKind.network_down, FaultKind.network_up):
        hosts.set_link(host, up=kind is FaultKind.network_up)
        return f"{host.name}: network {'up' if kind is FaultKind.network_up else 'down'}"
    if kind is FaultKind.disk_full:
        _set_disk_limit(paths, host.name, _disk_used(paths, host.name) + FULL_DISK_HEADROOM_BYTES)
        return f"{host.name}: disk full"
    if kind is FaultKind.disk_free:
        _set_disk_limit(paths, host.name, spec.disk_gb * 1024**3)
        return f"{host.name}: disk back to {spec.disk_gb} GB"
    # clear: every fault off
    hw_dir = paths.hw_dir(host.name)
    with hwstate.locked(hw_dir):
        board = hwstate.board(hw_dir)
        for entry in board["npus"]:
            entry["health"] = "OK"
        hwstate.save_board(board, hw_dir)
        hwstate.save_faults({}, hw_dir)
    hosts.set_link(host, up=True)
    _set_disk_limit(paths, host.name, spec.disk_gb * 1024**3)
    return f"{host.name}: all faults cleared"
