"""Lifecycle of lab hosts on this machine: namespaces, disks, PID 1, sshd.

Each host is a network namespace on a bridge the controller is part of, with
its own mount/UTS/PID namespaces created by ``unshare`` and run by
``dsctl.lab.hostinit``.  A second cable per host (its ``npu-plane`` interface)
goes to the lab's NPU plane switch, a namespace of its own with a bridge
(dsctl.core.lab.plan, "the NPU parameter plane").
Everything a host owns is named from the lab's state
directory and the ``dsctl-lab-`` prefix, so teardown can find it again after
a crash even without the state file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dsctl import data
from dsctl.core.lab.plan import (
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    NPU_PLANE_BRIDGE,
    NPU_PLANE_INTERFACE,
    NPU_PLANE_PREFIX_LEN,
    LabHost,
    LabSpec,
    board_state,
    bridge_name,
    cable_prefix,
    free_subnet,
    netns_prefix,
    npu_gateway,
    npu_plane_cabling,
    npu_plane_netns,
)
from dsctl.emu import hwstate
from dsctl.errors import DsctlError, EnvironmentUnsupported
from dsctl.lab import keys, seed

STATE_BASE = Path("/run/dsctl")
# Held while a lab chooses its subnet and creates its bridge, so labs started side by side never pick the same one.
NETWORK_LOCK = STATE_BASE / ".lab-network.lock"
BOOT_TIMEOUT_S = 60.0
REQUIRED_TOOLS = {
    "ip": "iproute2",
    "bridge": "iproute2",  # the NPU plane switch's ports (lab fault npu-plane-partition)
    "sysctl": "procps",    # the NPU plane switch routes
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "/usr/sbin/sshd": "openssh-server",
}

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def default_root(name: str = DEFAULT_NAME) -> Path:
    """Where lab ``name`` keeps its state: $DSCTL_LAB_ROOT when set, else /run/dsctl/<name>."""
    override = os.environ.get("DSCTL_LAB_ROOT")
    return Path(override) if override else STATE_BASE / name


@dataclass(frozen=True)
class LabPaths:
    root: Path
    name: str = DEFAULT_NAME

    @property
    def spec(self) -> Path:
        return self.root / "lab.json"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def packages(self) -> Path:
        return self.root / "packages"

    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    def hw_dir(self, name: str) -> Path:
        return self.host_dir(name) / "hw"

    def disk(self, name: str) -> Path:
        return self.host_dir(name) / "disk"


def require_linux_root() -> None:
    if platform.system() != "Linux":
        raise EnvironmentUnsupported(
            f"the lab needs Linux network namespaces; this is {platform.system()}: run dsctl lab on a Linux machine"
        )
    if os.geteuid() != 0:
        raise EnvironmentUnsupported("the lab creates namespaces and mounts: run dsctl lab as root (e.g. with sudo)")
    missing = [f"{tool} (apt-get install {package})" for tool, package in REQUIRED_TOOLS.items()
               if not (shutil.which(tool) or Path(tool).exists())]
    if missing:
        raise EnvironmentUnsupported(f"the lab needs {', '.join(missing)}")


def _run(cmd: list[str], *, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, input=input_text, text=True, capture_output=True)
    if check and result.returncode != 0:
        raise DsctlError(f"lab: `{' '.join(cmd[:4])}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def load_spec(paths: LabPaths) -> LabSpec | None:
    try:
        return LabSpec.from_dict(json.loads(paths.spec.read_text()))
    except FileNotFoundError:
        return None


# --- network -----------------------------------------------------------------------------------------

def _switch_batch(spec: LabSpec) -> str:
    """The bridge, the namespaces and the cables, in one `ip -batch` run."""
    lines = [
        f"link add {spec.bridge} type bridge",
        f"address add {spec.gateway}/{spec.prefix_len} dev {spec.bridge}",
        f"link set {spec.bridge} up",
        f"netns add {npu_plane_netns(spec.name)}",
    ]
    for host in spec.members:
        lines += [
            f"netns add {host.netns}",
            f"link add {host.veth} type veth peer name eth0 netns {host.netns}",
            f"link set {host.veth} master {spec.bridge} up",
        ]
    return "\n".join(lines) + "\n"


def _npu_plane_batch(spec: LabSpec) -> str:
    """The NPU plane's switch, run inside its namespace: a bridge with one port per host (named after the host,
    its other end the host's plane interface) and the switch's routed interface in every NPU subnet."""
    lines = [f"link add {NPU_PLANE_BRIDGE} type bridge"]
    lines += [f"address add {npu_gateway(npu)}/{NPU_PLANE_PREFIX_LEN} dev {NPU_PLANE_BRIDGE}"
              for npu in range(spec.npus)]
    lines += [f"link set {NPU_PLANE_BRIDGE} up", "link set lo up"]
    for host in spec.members:
        lines += [
            f"link add {host.name} type veth peer name {NPU_PLANE_INTERFACE} netns {host.netns}",
            f"link set {host.name} master {NPU_PLANE_BRIDGE} up",
        ]
    return "\n".join(lines) + "\n"


# The switch routes between the NPU subnets (the gateway of each) and, as an L3 switch with one interface per VLAN
# would, never tells a host to go around it (no ICMP redirects on its single bridged interface).
NPU_SWITCH_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                      f"net.ipv4.conf.{NPU_PLANE_BRIDGE}.send_redirects=0")


def _host_network_batch(spec: LabSpec, host: LabHost) -> str:
    return (f"address add {host.address}/{spec.prefix_len} dev eth0\nlink set eth0 up\nlink set lo up\n"
            f"link set {NPU_PLANE_INTERFACE} up\n")


def _lab_namespaces(name: str = DEFAULT_NAME) -> list[str]:
    listing = _run(["ip", "netns", "list"], check=False).stdout
    pattern = re.compile(rf"{re.escape(netns_prefix(name))}\d+")
    return [line.split()[0] for line in listing.splitlines() if line.split() and pattern.fullmatch(line.split()[0])]


def _lab_cables(name: str = DEFAULT_NAME) -> list[str]:
    listing = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = (line.split(":")[1].strip().split("@")[0] for line in listing.splitlines() if line.count(":") >= 2)
    return [cable for cable in names if re.fullmatch(rf"{re.escape(cable_prefix(name))}\d+", cable)]


def _remove_cables(name: str = DEFAULT_NAME) -> None:
    """Deleting a namespace frees its veth peers asynchronously; a quick `lab up` would then hit
    "File exists", so the lab's own cable ends are removed and waited for here."""
    for cable in _lab_cables(name):
        _run(["ip", "link", "del", cable], check=False)
    deadline = time.monotonic() + 10
    while _lab_cables(name) and time.monotonic() < deadline:
        time.sleep(0.05)


def used_subnets() -> list[str]:
    """Every IPv4 network this machine has an address in (the other labs' bridges among them)."""
    listing = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    return [fields[3] for fields in (line.split() for line in listing.splitlines())
            if len(fields) > 3 and fields[2] == "inet"]


@contextlib.contextmanager
def network_lock():
    NETWORK_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NETWORK_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def choose_subnet(name: str, subnet: str | None) -> str:
    """The subnet a new lab gets: the one asked for, the default lab's own, or the first /24 no other network
    on this machine uses (call with network_lock() held)."""
    if subnet is not None:
        return subnet
    if name == DEFAULT_NAME:
        return DEFAULT_SUBNET
    return free_subnet(used_subnets())


def npu_plane_exists(name: str) -> bool:
    listing = _run(["ip", "netns", "list"], check=False).stdout
    return npu_plane_netns(name) in (line.split()[0] for line in listing.splitlines() if line.split())


def npu_switch_port(spec: LabSpec, host: LabHost, forwarding: bool) -> None:
    """Let the NPU plane's switch forward a host's port, or stop it (lab fault npu-plane-partition): no learning,
    no flooding, the port's learnt addresses forgotten, so no frame reaches the host's NPUs and none of theirs gets
    anywhere, while the link itself stays up on both ends."""
    netns, state = npu_plane_netns(spec.name), "on" if forwarding else "off"
    _run(["ip", "netns", "exec", netns, "bridge", "link", "set", "dev", host.name, "learning", state,
          "flood", state, "mcast_flood", state, "bcast_flood", state])
    if forwarding:
        return
    learnt = _run(["ip", "netns", "exec", netns, "bridge", "fdb", "show", "dev", host.name], check=False).stdout
    for line in learnt.splitlines():
        fields = line.split()
        if fields and "permanent" not in fields and "self" not in fields:
            _run(["ip", "netns", "exec", netns, "bridge", "fdb", "del", fields[0], "dev", host.name, "master"],
                 check=False)


def set_link(host: LabHost, up: bool) -> None:
    """Plug or unplug a host's cable at the lab switch."""
    _run(["ip", "link", "set", host.veth, "up" if up else "down"])


def link_is_up(host: LabHost) -> bool:
    result = _run(["ip", "-o", "link", "show", host.veth], check=False)
    return result.returncode == 0 and "state DOWN" not in result.stdout and ",UP" in result.stdout


# --- disks and processes -----------------------------------------------------------------------------

def _mount_disk(paths: LabPaths, host: LabHost, size_gb: int) -> None:
    disk = paths.disk(host.name)
    disk.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", f"size={size_gb}g,mode=0755", f"dsctl-lab-{host.name}", str(disk)])


def _prepare_host(paths: LabPaths, spec: LabSpec, host: LabHost, authorized_key: str) -> str:
    chips = data.load("chips")
    hw_dir = paths.hw_dir(host.name)
    hw_dir.mkdir(parents=True, exist_ok=True)
    hwstate.save_board(board_state(host.name, spec.npus, spec.chip, chips["chips"], chips["bus_ids"]), hw_dir)
    hwstate.save_npu_plane(npu_plane_cabling(spec.name, host, spec.npus), hw_dir)
    hwstate.flash_firmware(None, hw_dir)
    hwstate.save_faults({}, hw_dir)
    _mount_disk(paths, host, spec.disk_gb)
    return seed.seed_host_disk(
        paths.disk(host.name) / "upper", hostname=host.name, address=host.address, authorized_key=authorized_key
    )


def start_init(paths: LabPaths, host: LabHost) -> None:
    host_dir = paths.host_dir(host.name)
    console = open(host_dir / "console.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        ["ip", "netns", "exec", host.netns,
         "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation", "private",
         "--kill-child",
         sys.executable, "-m", "dsctl.lab.hostinit", "--host-dir", str(host_dir), "--hostname", host.name,
         "--boots-before", str((host_state(paths, host.name) or {}).get("boots", 0))],
        stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    console.close()
    (host_dir / "unshare.pid").write_text(f"{process.pid}\n")


def host_state(paths: LabPaths, name: str) -> dict | None:
    try:
        return json.loads((paths.host_dir(name) / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def init_pid(paths: LabPaths, name: str) -> int | None:
    """PID (in our namespace) of the host's PID 1: the only child of its unshare process."""
    try:
        unshare_pid = int((paths.host_dir(name) / "unshare.pid").read_text())
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return int(children[0]) if children else None


def _port_open(address: str, port: int = 22, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_until_booted(paths: LabPaths, hosts: Iterable[LabHost], previous_boot: dict[str, str | None],
                      timeout: float = BOOT_TIMEOUT_S) -> None:
    pending = {host.name: host for host in hosts}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for name, host in list(pending.items()):
            state = host_state(paths, name)
            if state and state["boot_id"] != previous_boot.get(name) and _port_open(host.address):
                del pending[name]
        if pending:
            time.sleep(0.05)
    if pending:
        name = sorted(pending)[0]
        console = (paths.host_dir(name) / "console.log")
        tail = console.read_text(errors="replace").strip().splitlines()[-3:] if console.exists() else []
        raise DsctlError(
            f"lab host {name} did not boot within {timeout:.0f} s (console: {' | '.join(tail) or 'empty'}); "
            "run `dsctl lab down` and retry"
        )


def reboot(paths: LabPaths, hosts: Iterable[LabHost]) -> None:
    """Reboot hosts from outside (as a BMC power cycle would) and wait for them."""
    hosts = list(hosts)
    before = {host.name: (host_state(paths, host.name) or {}).get("boot_id") for host in hosts}
    for host in hosts:
        pid = init_pid(paths, host.name)
        if pid is None:
            raise DsctlError(f"lab host {host.name} is not running; run `dsctl lab up` again")
        os.kill(pid, signal.SIGUSR1)
    wait_until_booted(paths, hosts, before)


def run_in_host(paths: LabPaths, name: str, command: list[str]) -> subprocess.CompletedProcess:
    """Run a command inside a host, like its console would: same namespaces, same filesystem view."""
    pid = init_pid(paths, name)
    if pid is None:
        raise DsctlError(f"lab host {name} is not running; run `dsctl lab up` again")
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-u", "-n", "-p", "-r", "-w", "--", *command],
        text=True, capture_output=True,
    )


def copy_into_host(paths: LabPaths, name: str, source: Path, target: str) -> None:
    """Copy a controller file into a host's view (through its PID 1's root)."""
    pid = init_pid(paths, name)
    if pid is None:
        raise DsctlError(f"lab host {name} is not running; run `dsctl lab up` again")
    shutil.copyfile(source, f"/proc/{pid}/root{target}")


# --- up / down ---------------------------------------------------------------------------------------

def up(spec: LabSpec, paths: LabPaths, progress: Progress = _quiet) -> None:
    """Create the lab's hosts and boot them (a bare OS each)."""
    paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    authorized = keys.write_ed25519_keypair(paths.client_key, "dsctl-lab-controller")
    progress(f"network: bridge {spec.bridge} {spec.gateway}/{spec.prefix_len}, {len(spec.members)} namespaces, "
             f"NPU plane switch {npu_plane_netns(spec.name)}")
    _run(["ip", "-batch", "-"], input_text=_switch_batch(spec))
    _run(["ip", "-n", npu_plane_netns(spec.name), "-batch", "-"], input_text=_npu_plane_batch(spec))
    _run(["ip", "netns", "exec", npu_plane_netns(spec.name), "sysctl", "-q", "-w", *NPU_SWITCH_SYSCTLS])
    for host in spec.members:
        _run(["ip", "-n", host.netns, "-batch", "-"], input_text=_host_network_batch(spec, host))
    with ThreadPoolExecutor(max_workers=4) as pool:
        host_keys = list(pool.map(lambda host: _prepare_host(paths, spec, host, authorized), spec.members))
    known = [keys.known_hosts_line(host.address, key) for host, key in zip(spec.members, host_keys, strict=True)]
    paths.known_hosts.write_text("\n".join(known) + "\n")
    progress("booting hosts")
    for host in spec.members:
        start_init(paths, host)
    wait_until_booted(paths, spec.members, {})
    paths.spec.write_text(json.dumps(spec.to_dict(), indent=1) + "\n")


def is_running(paths: LabPaths, spec: LabSpec) -> bool:
    return all(init_pid(paths, host.name) is not None for host in spec.members) and set(
        _lab_namespaces(spec.name)
    ) >= {host.netns for host in spec.members} and npu_plane_exists(spec.name)


def _lab_mounts(root: Path) -> list[str]:
    mounts = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == str(root) or mount_point.startswith(f"{root}/"):
                mounts.append(mount_point)
    return sorted(set(mounts), key=len, reverse=True)


def _processes_in(namespaces: list[str]) -> list[int]:
    pids: list[int] = []
    for netns in namespaces:
        pids += [int(pid) for pid in _run(["ip", "netns", "pids", netns], check=False).stdout.split()]
    return pids


def down(paths: LabPaths) -> dict[str, int]:
    """Remove every trace of the lab, whether it came up fully, half or not at all (other labs are left alone:
    everything removed is named after this lab's name or lives under its state directory)."""
    namespaces = _lab_namespaces(paths.name)
    pids = _processes_in(namespaces)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    mounts = _lab_mounts(paths.root)
    for mount_point in mounts:
        _run(["umount", "-l", mount_point], check=False)
    plane = npu_plane_exists(paths.name)
    doomed = namespaces + ([npu_plane_netns(paths.name)] if plane else [])
    if doomed:
        _run(["ip", "-force", "-batch", "-"], input_text="".join(f"netns del {ns}\n" for ns in doomed),
             check=False)
    _remove_cables(paths.name)
    bridge_existed = _run(["ip", "link", "del", bridge_name(paths.name)], check=False).returncode == 0
    if paths.root.exists():
        shutil.rmtree(paths.root)
    return {"namespaces": len(namespaces), "processes": len(pids), "mounts": len(mounts),
            "bridge": int(bridge_existed), "npu_plane": int(plane)}
