"""Faults injected into lab hosts, observable only through the host's own interfaces.

A sick chip shows in npu-smi's Health column, an armed installer failure makes
the next .run fail midway with a real-looking error, an unplugged cable makes
the host unreachable, a full disk makes writes fail with ENOSPC and shows in df.
``uninstall --component driver|firmware`` runs the package's own uninstall.sh on
the host, leaving the firmware-only or driver-only state a real server can be in
(the firmware's upgrade record goes with its package, the flashed chips keep it).
``os-openeuler`` makes the host report openEuler 22.03 with its Python 3.9 (/etc/os-release,
and /usr/bin/python3 a stand-in), as the Atlas servers of the issue-12 dry run did; ``os-native`` (and
``clear``) undo it.

The NPU plane (the NPUs' RoCE network, dsctl.emu.npu_net): ``link-down --npu N`` takes NPU N's port down (hccn_tool
says ``link status: DOWN`` and ``net health status: Fault``, its address stops answering), ``link-up`` brings it
back; ``npu-plane-partition`` makes the switch stop forwarding the host's port, links up on both ends, so the host's
NPUs and the others' cannot reach each other (real loss; its own detection peer, the switch, is lost too);
``npu-plane-heal`` undoes it; ``hccn-conf-wrong [--npu N]`` mistypes an address in the host's /etc/hccn.conf as a
manual edit would (two digits swapped), which the NPU takes at the next boot, when the driver re-applies the file.
``clear`` undoes all three.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path

from dsctl.core.lab.plan import LabSpec
from dsctl.emu import hwstate, npu_net
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
    os_openeuler = "os-openeuler"
    os_native = "os-native"
    link_down = "link-down"
    link_up = "link-up"
    npu_plane_partition = "npu-plane-partition"
    npu_plane_heal = "npu-plane-heal"
    hccn_conf_wrong = "hccn-conf-wrong"
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


# openEuler 22.03 LTS as it ships (tests/fixtures/os_release/openeuler-22.03) and its python3, 3.9.9.
OPENEULER_OS_RELEASE = (
    'NAME="openEuler"\nVERSION="22.03 LTS"\nID="openEuler"\nVERSION_ID="22.03"\n'
    'PRETTY_NAME="openEuler 22.03 LTS"\nANSI_COLOR="0;31"\n'
)
# Answers --version as openEuler's python3 does and refuses everything else loudly: it must never let a step
# pass that a real 3.9 would fail (a venv for a Python >= 3.10 stack), so it runs nothing at all.
PYTHON39_STAND_IN = """#!/bin/sh
case "$*" in
  --version|-V) echo "Python 3.9.9"; exit 0 ;;
esac
echo "dsctl lab: /usr/bin/python3 is a Python 3.9.9 stand-in (lab fault os-openeuler); it runs nothing: $*" >&2
exit 1
"""
# Inside the host: a small tmpfs holding the upper layer that replaces /usr/bin/python3 (the /usr/bin link of the
# base system) and leaves every other /usr/bin file, python3.11 included, as it is.
OS_LAYER = "/var/lib/dsctl-lab-os"
_OS_ON = f"""set -e
rm -f /etc/os-release
printf '%s' "$1" > /etc/os-release
mkdir -p {OS_LAYER}
mountpoint -q {OS_LAYER} || mount -t tmpfs -o size=1m,mode=0755 dsctl-lab-os {OS_LAYER}
mkdir -p {OS_LAYER}/upper {OS_LAYER}/work
printf '%s' "$2" > {OS_LAYER}/upper/python3
chmod 0755 {OS_LAYER}/upper/python3
layers=lowerdir=/usr/bin,upperdir={OS_LAYER}/upper,workdir={OS_LAYER}/work
mountpoint -q /usr/bin || mount -t overlay overlay -o "$layers" /usr/bin
"""
_OS_OFF = f"""set -e
# lazily: this very shell runs from the overlaid /usr/bin
if mountpoint -q /usr/bin; then umount -l /usr/bin; fi
if mountpoint -q {OS_LAYER}; then umount -l {OS_LAYER}; fi
rm -f /etc/os-release
if [ -n "$1" ]; then ln -s "$1" /etc/os-release; else printf '%s' "$2" > /etc/os-release; fi
"""


def _set_os(paths: LabPaths, host: str, openeuler: bool) -> None:
    if openeuler:
        done = hosts.run_in_host(paths, host, ["sh", "-c", _OS_ON, "sh", OPENEULER_OS_RELEASE, PYTHON39_STAND_IN])
    else:
        # Back to the base system's file (Debian's /etc/os-release is a link into /usr/lib).
        native = "/etc/os-release"
        link = os.readlink(native) if os.path.islink(native) else ""
        text = "" if link else open(native).read()  # noqa: SIM115 - a short read
        done = hosts.run_in_host(paths, host, ["sh", "-c", _OS_OFF, "sh", link, text])
    if done.returncode != 0:
        raise UsageError(f"{host}: could not {'set' if openeuler else 'undo'} the OS: {done.stderr.strip()[-300:]}")


def _npu_id(paths: LabPaths, host: str, npu: int | None) -> int:
    ids = [entry["id"] for entry in hwstate.board(paths.hw_dir(host))["npus"]]
    if npu is None or npu not in ids:
        raise UsageError(f"--npu must be one of {ids[0]}..{ids[-1]} on {host}")
    return npu


def _sync_npu_network(paths: LabPaths, spec: LabSpec, host: str) -> None:
    """Make the host's wire match its NPUs' links now (a powered-off host gets it at boot)."""
    pid = hosts.init_pid(paths, host)
    if pid is None:
        return
    netns = next(member.netns for member in spec.members if member.name == host)
    try:
        npu_net.sync(npu_net.Context.of_host(Path(f"/proc/{pid}/root"), paths.hw_dir(host), netns))
    except OSError as problem:
        raise DsctlError(f"{host}: the NPU plane could not follow: {problem}") from None


def _set_npu_link(paths: LabPaths, spec: LabSpec, host: str, npu: int | None, up: bool) -> str:
    npu = _npu_id(paths, host, npu)
    hw_dir = paths.hw_dir(host)
    with hwstate.locked(hw_dir):
        current = hwstate.faults(hw_dir)
        down = hwstate.npu_links_down(hw_dir) - {npu} if up else hwstate.npu_links_down(hw_dir) | {npu}
        current["npu_link_down"] = sorted(down)
        if not down:
            current.pop("npu_link_down")
        hwstate.save_faults(current, hw_dir)
    _sync_npu_network(paths, spec, host)
    return f"{host}: NPU {npu} link {'up' if up else 'down'}"


def _host_file(paths: LabPaths, host: str, path: str) -> Path:
    pid = hosts.init_pid(paths, host)
    if pid is None:
        raise DsctlError(f"lab host {host} is powered off; run `dsctl lab up` (same options) first")
    return Path(f"/proc/{pid}/root{path}")


def _mistype(address: str) -> str:
    """The address as a hand edit gets it wrong: two adjacent different digits of an octet swapped (10.83.0.12 ->
    10.38.0.12), else a digit doubled; always a valid address, so the driver applies it without complaint."""
    octets = address.split(".")
    for index in (1, 2, 3, 0):
        text = octets[index]
        for pos in range(len(text) - 1):
            swapped = text[:pos] + text[pos + 1] + text[pos] + text[pos + 2:]
            if swapped != text and not swapped.startswith("0") and int(swapped) <= 255:
                return ".".join([*octets[:index], swapped, *octets[index + 1:]])
    last = octets[3]
    doubled = last + last[-1]
    return ".".join([*octets[:3], doubled if int(doubled) <= 255 else last[:-1] or "1"])


HCCN_CONF_PATH = "/etc/hccn.conf"


def _make_hccn_conf_wrong(paths: LabPaths, host: str, npu: int | None) -> str:
    conf = _host_file(paths, host, HCCN_CONF_PATH)
    try:
        text = conf.read_text()
    except OSError:
        raise UsageError(f"{host} has no {HCCN_CONF_PATH}: install the NPU driver there first") from None
    wanted = re.compile(rf"address_{npu}=(.*)" if npu is not None else r"address_(\d+)=(.*)")
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        found = wanted.fullmatch(line.rstrip("\n"))
        if found is None:
            continue
        key, right = line.split("=", 1)[0], found.groups()[-1]
        if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", right):
            raise UsageError(f"{host}: {key}={right} in {HCCN_CONF_PATH} is already not an address")
        wrong = _mistype(right)
        lines[index] = f"{key}={wrong}" + ("\n" if line.endswith("\n") else "")
        with open(conf, "r+") as handle:  # in place: the file keeps its mode and owner
            handle.seek(0)
            handle.truncate()
            handle.write("".join(lines))
        hw_dir = paths.hw_dir(host)
        with hwstate.locked(hw_dir):
            hwstate.save_faults({**hwstate.faults(hw_dir), "hccn_conf_wrong": {"key": key, "right": right,
                                                                               "wrong": wrong}}, hw_dir)
        return (f"{host}: {HCCN_CONF_PATH} now says {key}={wrong} (was {right}); the NPU keeps {right} until the "
                "driver re-applies the file (the next boot)")
    which = f"address_{npu}" if npu is not None else "address_N"
    raise UsageError(f"{host}: {HCCN_CONF_PATH} has no {which}= entry to make wrong; set NPU addresses with "
                     "hccn_tool first")


def _undo_hccn_conf_wrong(paths: LabPaths, host: str, record: dict | None) -> None:
    if not record or hosts.init_pid(paths, host) is None:
        return
    conf = _host_file(paths, host, HCCN_CONF_PATH)
    try:
        text = conf.read_text()
    except OSError:
        return
    wrong_line = f"{record['key']}={record['wrong']}"
    lines = text.splitlines(keepends=True)
    fixed = [f"{record['key']}={record['right']}" + line[len(wrong_line):] if line.rstrip("\n") == wrong_line else line
             for line in lines]
    if fixed != lines:
        with open(conf, "r+") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write("".join(fixed))


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
    if kind in (FaultKind.os_openeuler, FaultKind.os_native):
        _set_os(paths, host.name, kind is FaultKind.os_openeuler)
        return (f"{host.name}: reports openEuler 22.03 LTS, /usr/bin/python3 is Python 3.9.9"
                if kind is FaultKind.os_openeuler else f"{host.name}: back to the lab's own OS")
    if kind in (FaultKind.link_down, FaultKind.link_up):
        return _set_npu_link(paths, spec, host.name, npu, up=kind is FaultKind.link_up)
    if kind in (FaultKind.npu_plane_partition, FaultKind.npu_plane_heal):
        healed = kind is FaultKind.npu_plane_heal
        hosts.npu_switch_port(spec, host, forwarding=healed)
        return (f"{host.name}: back on the NPU plane" if healed else
                f"{host.name}: cut off the NPU plane (its switch port forwards nothing; links stay up)")
    if kind is FaultKind.hccn_conf_wrong:
        return _make_hccn_conf_wrong(paths, host.name, npu)
    # clear: every fault off
    hw_dir = paths.hw_dir(host.name)
    with hwstate.locked(hw_dir):
        board = hwstate.board(hw_dir)
        for entry in board["npus"]:
            entry["health"] = "OK"
        hwstate.save_board(board, hw_dir)
        wrong_conf = hwstate.faults(hw_dir).get("hccn_conf_wrong")
        hwstate.save_faults({}, hw_dir)
    hosts.set_link(host, up=True)
    if hosts.npu_plane_exists(spec.name):
        hosts.npu_switch_port(spec, host, forwarding=True)
    _set_disk_limit(paths, host.name, spec.disk_gb * 1024**3)
    if hosts.init_pid(paths, host.name) is not None:  # a powered-off host keeps its files until it runs again
        _set_os(paths, host.name, openeuler=False)
        _undo_hccn_conf_wrong(paths, host.name, wrong_conf)
        _sync_npu_network(paths, spec, host.name)
    return f"{host.name}: all faults cleared"
