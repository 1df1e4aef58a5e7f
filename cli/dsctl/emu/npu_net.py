"""The NPUs' RoCE ports of a lab host: what each NPU holds now, /etc/hccn.conf, and their addresses for real.

Standard library plus dsctl.emu.hwstate only: packed into the driver's zipapps next to hccn_tool, and imported by
the lab's PID 1 (dsctl.lab.hostinit) and by the lab's faults, which reach a host's files through its PID 1's root.

Three kinds of state, as on a real server:

* **What the NPU holds now** (address, netmask, detection peer, gateway of each NPU's RoCE port): set by
  ``hccn_tool -s``, lost when the host (and so the device) reboots.  It lives in the host's /run
  (``LAB_RUN_DIR/npu-net.json``), which every boot starts empty.
* **/etc/hccn.conf**, which hccn_tool writes after every successful ``-s`` and which the driver re-applies at each
  device boot: the driver's ``device_boot_init.sh`` runs ``network_cfg_recovery`` -> ``driver/tools/network.sh`` ->
  ``hccn_tool -cfg recovery`` (hicann/driver, scripts/package/driver/common/scripts/device_boot_init.sh).  The
  lab's PID 1 does the same at boot (``hccn_tool -a -cfg recovery``), so a rebooted or snapshot-restored host's
  NPUs answer at what hccn.conf says.  The file's line format and its rewrite rule (the key's old line dropped, the
  new ``key_<dev>=value`` appended at the end) follow the driver's hccn_tool cfg.c (cfg_inner_write_conf); the
  driver installer creates it empty, mode 0644 (run_driver_install.sh changeMode).
* **The wire**: each NPU whose link is up and which holds an address has it as an alias on the host's plane
  interface (labelled ``<interface>:<npu>``, ``noprefixroute``), with a routing table of its own (100 + npu: its
  subnet, and its gateway as default route) selected by a rule ``from <address>``.  So the kernel answers ICMP and
  ARP at the NPU's address for real, the NPU reaches only its own subnet or what its gateway routes (as the NPU's
  own network stack would), and the host's own sockets, which never pick an NPU's address as source, cannot reach
  the plane at all (``Network is unreachable``), as a server's OS cannot reach its NPUs' RoCE network.
  A real NPU's stack is not in the host's kernel: here it is, on the plane interface (visible to ``ip addr``);
  nothing of dsctl reads it there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import time
from contextlib import contextmanager
from pathlib import Path

from dsctl.emu import hwstate

# hccn_tool imports this module at every call, most of them queries that never touch the wire: what only the wire
# needs (ipaddress, random, select, shutil, socket, subprocess) is imported where it is used, and neither
# dataclasses nor typing is imported at run time (together they cost more than the rest of the tool's start-up).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ipaddress
    from collections.abc import Iterator, Mapping
    from typing import Any, Protocol

HCCN_CONF = Path("/etc/hccn.conf")
HCCN_TOOL = Path("/usr/local/Ascend/driver/tools/hccn_tool")
STATE_FILE = "npu-net.json"
TABLE_BASE = 100  # NPU i's routing table and rule preference: 100 + i
MAX_NPUS = 16


# --- /etc/hccn.conf ---------------------------------------------------------------------------------------------

class ConfAccessError(Exception):
    """hccn.conf does not exist or cannot be opened (the real tool's realpath()/fopen() failing)."""


class HccnConf:
    """/etc/hccn.conf read and rewritten the way the driver's hccn_tool does it (cfg.c):

    * read: the first line ``key=...`` whose key is exactly ``key``; lines starting with ``#`` or shorter than
      ``*=*`` are skipped; only the newline is stripped from the value (a trailing blank stays part of it);
    * write: every line starting with ``key=`` is dropped, ``key=value`` is appended at the end, the file is
      rewritten in place (its mode and owner stay).  A last line without its newline gets the new entry glued to
      it, as the real tool's strcat does;
    * delete: every line *containing* ``key=`` is dropped (the real tool matches with strstr).
    """

    def __init__(self, path: Path = HCCN_CONF):
        self.path = path

    def _lines(self) -> list[str]:
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
                return handle.read().splitlines(keepends=True)
        except OSError as exc:
            raise ConfAccessError(str(exc)) from exc

    def read(self, key: str) -> str | None:
        for line in self._lines():
            if line.startswith("#") or len(line) < len("*=*") or "=" not in line:
                continue
            name, _, value = line.partition("=")
            if name == key:
                return value[:-1] if value.endswith("\n") else value
        return None

    def _rewrite(self, lines: list[str]) -> None:
        try:
            with open(self.path, "r+", encoding="utf-8", errors="surrogateescape", newline="") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.seek(0)
                handle.truncate()
                handle.write("".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise ConfAccessError(str(exc)) from exc

    def write(self, key: str, value: str) -> None:
        kept = [line for line in self._lines() if not (line.startswith(key) and line[len(key):len(key) + 1] == "=")]
        self._rewrite([*kept, f"{key}={value}\n"])

    def delete(self, key: str) -> None:
        self._rewrite([line for line in self._lines() if f"{key}=" not in line])


def conf_key(name: str, npu: int) -> str:
    return f"{name}_{npu}"


# --- what each NPU holds now ------------------------------------------------------------------------------------

class PortConfig:
    """What one NPU's port holds: a mutable record compared field by field (``vars()`` gives its fields in this
    order, as npu-net.json stores them)."""

    __hash__ = None  # mutable and compared by value: unhashable, as a @dataclass with eq is

    def __init__(self, address: str | None = None, netmask: str | None = None, netdetect: str | None = None,
                 gateway: str | None = None):
        self.address = address
        self.netmask = netmask
        self.netdetect = netdetect
        self.gateway = gateway

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return ((self.address, self.netmask, self.netdetect, self.gateway)
                == (other.address, other.netmask, other.netdetect, other.gateway))

    def __repr__(self) -> str:
        return (f"{type(self).__qualname__}(address={self.address!r}, netmask={self.netmask!r}, "
                f"netdetect={self.netdetect!r}, gateway={self.gateway!r})")

    @property
    def network(self) -> ipaddress.IPv4Network | None:
        if self.address is None or self.netmask is None:
            return None
        import ipaddress  # lazily: only setting addresses on the wire needs it (the tool's start-up, every call)

        return ipaddress.ip_interface(f"{self.address}/{self.netmask}").network


class DeviceState:
    """The NPUs' port configuration of this boot (LAB_RUN_DIR/npu-net.json), read and written under a lock."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / STATE_FILE
        self.lock_path = run_dir / f".{STATE_FILE}.lock"

    def load(self) -> dict[int, PortConfig]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {int(npu): PortConfig(**entry) for npu, entry in data.items()}

    def save(self, ports: Mapping[int, PortConfig]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({str(npu): vars(cfg) for npu, cfg in sorted(ports.items())}, indent=1) + "\n")
        os.replace(tmp, self.path)

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


# --- the wire ---------------------------------------------------------------------------------------------------

# What an ICMP echo came to: a round trip in milliseconds, or why there was none.
LOST = "lost"          # no reply within the timeout
NO_ROUTE = "no-route"  # the NPU has no route to the destination (its own subnet or its gateway)
TOO_LONG = "too-long"  # the packet cannot be sent at that size
EchoResult = float | str


if TYPE_CHECKING:  # a Protocol for the type checker only: typing is not imported at run time (tool start-up)
    class Plane(Protocol):
        """The wire, as Context uses it (IpPlane; a fake in the tests)."""

        def apply(self, ports: Mapping[int, PortConfig | None]) -> None:
            """Put each NPU's address, routes and rule on the wire (None: take them off)."""

        def flush(self) -> None:
            """Take every NPU off the wire."""

        def echo(self, source: str, destination: str, size: int, seq: int, timeout: float) -> EchoResult:
            """One ICMP echo request from an NPU's address."""


def _ip_command() -> str:
    import shutil  # lazily: only commands that change the wire run ip (the tool's start-up, every call)

    for candidate in (shutil.which("ip"), "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise OSError("iproute2's ip is not installed")


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


class IpPlane:
    """The host's plane interface, driven with iproute2 (``ip -batch``) and ICMP raw sockets (root)."""

    def __init__(self, interface: str, netns: str | None = None, ident: int | None = None):
        self.interface = interface
        self.netns = netns  # the host's network namespace, when driven from outside the host (lab faults)
        self._ident = ident

    @property
    def ident(self) -> int:
        """The identifier of this plane's ICMP echoes: random unless given, drawn when first used."""
        if self._ident is None:
            import random  # lazily: only echoes need it, and hccn_tool makes a plane at every call (start-up)

            self._ident = random.randrange(1, 0xFFFF)
        return self._ident

    def _batch(self, lines: list[str], *, force: bool) -> None:
        if not lines:
            return
        import subprocess  # lazily: only commands that change the wire run ip (the tool's start-up, every call)

        where = ["-n", self.netns] if self.netns else []
        command = [_ip_command(), *where, "-4", *(["-force"] if force else []), "-batch", "-"]
        done = subprocess.run(command, input="".join(f"{line}\n" for line in lines), text=True, capture_output=True)
        if done.returncode != 0 and not force:
            raise OSError(f"ip: {done.stderr.strip() or done.stdout.strip()}")

    def _off(self, npu: int) -> list[str]:
        table = TABLE_BASE + npu
        return [f"address flush dev {self.interface} label {self.interface}:{npu}",
                f"route flush table {table}", f"rule del pref {table}"]

    def apply(self, ports: Mapping[int, PortConfig | None]) -> None:
        import ipaddress  # lazily: only commands that change the wire need it (the tool's start-up, every call)

        self._batch([line for npu in sorted(ports) for line in self._off(npu)], force=True)
        add: list[str] = []
        for npu, cfg in sorted(ports.items()):
            network = cfg.network if cfg is not None else None
            if cfg is None or network is None:
                continue
            table = TABLE_BASE + npu
            add += [
                f"address add {cfg.address}/{network.prefixlen} dev {self.interface} noprefixroute "
                f"label {self.interface}:{npu}",
                f"route add {network} dev {self.interface} src {cfg.address} table {table}",
                f"rule add from {cfg.address} lookup {table} pref {table}",
            ]
            if cfg.gateway is not None and ipaddress.ip_address(cfg.gateway) in network:
                add.append(f"route add default via {cfg.gateway} dev {self.interface} src {cfg.address} table {table}")
        self._batch(add, force=False)

    def flush(self) -> None:
        lines = [f"address flush dev {self.interface}"]  # IPv4 only (the batch runs with -4)
        for npu in range(MAX_NPUS):
            lines += [f"route flush table {TABLE_BASE + npu}", f"rule del pref {TABLE_BASE + npu}"]
        self._batch(lines, force=True)

    def echo(self, source: str, destination: str, size: int, seq: int, timeout: float) -> EchoResult:
        import select  # lazily, as socket: only pings and health probes send echoes (the tool's start-up)
        import socket

        header = struct.pack("!BBHHH", 8, 0, 0, self.ident, seq)
        payload = bytes(i & 0xFF for i in range(size))
        packet = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), self.ident, seq) + payload
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
            sock.bind((source, 0))
            started = time.perf_counter()
            try:
                sock.sendto(packet, (destination, 0))
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:
                    return TOO_LONG
                if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL):  # no route from this source
                    return NO_ROUTE
                raise
            deadline = started + timeout
            while True:
                left = deadline - time.perf_counter()
                if left <= 0 or not select.select([sock], [], [], left)[0]:
                    return LOST
                data, (sender, _port) = sock.recvfrom(65535 + 60)
                ihl = (data[0] & 0x0F) * 4
                if len(data) < ihl + 8:
                    continue
                kind, _code, _sum, ident, got_seq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
                if kind == 0 and ident == self.ident and got_seq == seq and sender == destination:
                    return (time.perf_counter() - started) * 1000.0


# --- the whole host ---------------------------------------------------------------------------------------------

class Context:
    """Where one host's NPU network lives: hccn.conf, this boot's device state, the boards and the cabling, and the
    wire (None when the NPUs are not cabled)."""

    def __init__(self, conf: HccnConf, state: DeviceState, hw_dir: Path, run_file: Path, plane: Plane | None):
        self.conf = conf
        self.state = state
        self.hw_dir = hw_dir
        self.run_file = run_file
        self.plane = plane

    @classmethod
    def default(cls) -> Context:
        cabling = hwstate.npu_plane(hwstate.HW_DIR)
        plane = IpPlane(cabling["interface"]) if cabling else None
        return cls(HccnConf(HCCN_CONF), DeviceState(hwstate.LAB_RUN_DIR), hwstate.HW_DIR, hwstate.RUNNING_FILE, plane)

    @classmethod
    def of_host(cls, root: Path, hw_dir: Path, netns: str) -> Context:
        """A lab host seen from the controller: its files through ``root`` (its PID 1's /proc/PID/root), its
        boards in ``hw_dir``, its wire in network namespace ``netns``."""
        cabling = hwstate.npu_plane(hw_dir)
        run_dir = root / str(hwstate.LAB_RUN_DIR).lstrip("/")
        return cls(HccnConf(root / str(HCCN_CONF).lstrip("/")), DeviceState(run_dir), hw_dir,
                   run_dir / hwstate.RUNNING_FILE.name, IpPlane(cabling["interface"], netns) if cabling else None)

    def cabling(self) -> dict[str, Any] | None:
        return hwstate.npu_plane(self.hw_dir)

    def driver_loaded(self) -> bool:
        return hwstate.running(self.run_file).get("driver") is not None and hwstate.present(self.hw_dir)

    def npu_ids(self) -> list[int]:
        board = hwstate.board(self.hw_dir) if hwstate.present(self.hw_dir) else None
        return [int(npu["id"]) for npu in board["npus"]] if board else []

    def link_up(self, npu: int) -> bool:
        """A port is up when it is cabled and not failed (lab fault link-down)."""
        cabling = self.cabling()
        return bool(cabling) and npu < len(cabling.get("ports", [])) and npu not in hwstate.npu_links_down(self.hw_dir)

    def wanted(self, npu: int, cfg: PortConfig | None) -> PortConfig | None:
        """What of an NPU's configuration is on the wire: all of it while its link is up, nothing otherwise."""
        if cfg is None or cfg.address is None or not self.link_up(npu) or not self.driver_loaded():
            return None
        return cfg

    def put_on_wire(self, npus: list[int], ports: Mapping[int, PortConfig]) -> None:
        if self.plane is not None:
            self.plane.apply({npu: self.wanted(npu, ports.get(npu)) for npu in npus})


def sync(ctx: Context) -> None:
    """The wire made to match what the NPUs hold and their links (after a lab fault changed a link)."""
    with ctx.state.locked():
        ctx.put_on_wire(ctx.npu_ids(), ctx.state.load())


def flush(ctx: Context) -> None:
    """Every NPU off the wire (the host powers off or boots: its devices start with nothing)."""
    if ctx.plane is not None:
        ctx.plane.flush()
