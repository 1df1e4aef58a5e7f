"""What one host's NPU parameter plane holds now, read back with hccn_tool, and what makes it the plan's (pure).

The collector (playbooks/library/npu_network_facts.py) runs on the host and returns raw text only: per NPU the
output of the ``hccn_tool -i N <query> -g`` commands it was asked for, ``/etc/hccn.conf``, and the output of each
``hccn_tool -i N -ping -g address A`` (multi-node.md, "The NPU network": the checks the vllm-ascend multi-node
tutorials require on every node before serving).  Parsing happens here, on the controller, so the npu_network role
(what to set) and `dsctl check` (what is wrong) read the same facts the same way.

Output formats, as the driver's hccn_tool prints them (its source, hicann/driver src/custom/network/hccn, and the
field transcripts cited in dsctl.emu.hccn_tool, which emulates them):

* ``-ip -g``: ``ipaddr:10.80.0.11`` and ``netmask:255.255.255.0``; with no address, exit 13 and ``Get ipconf
  failed, because no ip was preset there!`` on stderr;
* ``-gateway -g``: ``default gateway:10.80.0.1, Iface:eth0``; none set: ``Get gateway failed, because no gateway
  was preset there!``;
* ``-netdetect -g``: ``netdetect address: 10.80.0.1`` (the field's drivers; the open-source driver of 2026 prints
  ``netdetect addr:``), ``0.0.0.0`` when none is set;
* ``-link -g``: ``link status: UP`` or ``DOWN``;
* ``-net_health -g``: ``net health status: Success`` (or Socket fail, Receive timeout, Unreachable, Time exceeded,
  Fault, Init, ...): the result of probing the detection address;
* ``-ping -g address A``: ``device N PING A``, one ``recv seq=K,time=T ms`` or ``recv time out seq=K`` line per packet
  (three), then ``3 packets transmitted, R received, L% packet loss``; a lost packet makes the tool fail.
* ``Get invalid device id.`` for any ``-i N`` command when the driver does not know device N (no such NPU, or a
  driver installed but not loaded yet: the host waits for its reboot).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.network.hccn_plan import HostNetwork, NpuAddress, parse_hccn_conf
from dsctl.errors import DsctlError, ExitStatus

COLLECTOR_VERSION = 1
# What the npu_network role reads before it sets anything, and what `dsctl check` reads (the gateway is compared in
# /etc/hccn.conf only: one process less per NPU on every check).
PROVISION_QUERIES = ("ip", "gateway", "netdetect")
CHECK_QUERIES = ("link", "net_health", "netdetect", "ip")
HEALTH_OK = "Success"
# hccn_tool's answers that are a state, not a failure of the query.
NO_ADDRESS = "no ip was preset"
NO_GATEWAY = "no gateway was preset"
INVALID_DEVICE = "Get invalid device id."
UNSET_DETECT = "0.0.0.0"

_IPADDR_RE = re.compile(r"^\s*ipaddr\s*:\s*(\S+)\s*$", re.M)
_NETMASK_RE = re.compile(r"^\s*netmask\s*:\s*(\S+)\s*$", re.M)
_GATEWAY_RE = re.compile(r"^\s*default gateway\s*:\s*([0-9.]+)", re.M)
_NETDETECT_RE = re.compile(r"^\s*netdetect addr(?:ess)?\s*:\s*(\S+)\s*$", re.M)
_LINK_RE = re.compile(r"^\s*link status\s*:\s*(\S+)\s*$", re.M)
_HEALTH_RE = re.compile(r"^\s*net health status\s*:\s*(.+?)\s*$", re.M)
_PING_SUMMARY_RE = re.compile(r"(\d+) packets transmitted, (\d+) received, ([0-9.]+)% packet loss")


class NetworkStateError(DsctlError):
    """The NPUs cannot be brought to the plan from their current state (one line: host, NPUs, the fix)."""

    exit_status = ExitStatus.VALIDATION_FAILED


@dataclass(frozen=True)
class NpuState:
    """One NPU's RoCE port as hccn_tool reports it; None where the query was not asked or not answered."""

    npu: int
    address: str | None = None
    netmask: str | None = None
    gateway: str | None = None
    netdetect: str | None = None
    link: str | None = None          # "UP" | "DOWN"
    health: str | None = None        # "Success", "Fault", "Receive timeout", ...
    read: tuple[str, ...] = ()       # the queries answered
    error: str | None = None         # the first query that failed, with hccn_tool's words

    def to_dict(self) -> dict[str, Any]:
        return {"npu": self.npu, "address": self.address, "netmask": self.netmask, "gateway": self.gateway,
                "netdetect": self.netdetect, "link": self.link, "health": self.health, "error": self.error}


@dataclass(frozen=True)
class PingResult:
    """``hccn_tool -i npu -ping -g address <address>``: what came back."""

    npu: int
    address: str
    reachable: bool
    transmitted: int = 0
    received: int = 0
    loss: float = 100.0
    reason: str = ""                 # hccn_tool's own words when it failed without a summary (a link down)


@dataclass(frozen=True)
class HostNetworkState:
    """The NPU plane of one host now: per NPU, /etc/hccn.conf, the pings."""

    tool: str | None                 # hccn_tool's path; None: not on the host (no driver)
    npus: Mapping[int, NpuState] = field(default_factory=dict)
    conf: str | None = None          # /etc/hccn.conf's text; None: the file is missing or unreadable
    pings: tuple[PingResult, ...] = ()

    @property
    def unreadable(self) -> str | None:
        """Why the NPUs could not be read at all (no hccn_tool, the driver not knowing the devices), else None."""
        if self.tool is None:
            return "hccn_tool is not on the host (it ships with the NPU driver)"
        failing = [state for state in self.npus.values() if state.error and INVALID_DEVICE in state.error]
        if self.npus and len(failing) == len(self.npus):
            return ("hccn_tool answers \"Get invalid device id.\" for every NPU: the driver does not know them (it "
                    "is loaded at the next boot after an install)")
        return None

    @property
    def conf_values(self) -> dict[int, dict[str, str]]:
        return parse_hccn_conf(self.conf or "")


def _text(result: Mapping[str, Any] | None, key: str) -> str:
    value = (result or {}).get(key)
    return value if isinstance(value, str) else ""


def _failure(query: str, npu: int, result: Mapping[str, Any]) -> str:
    words = (_text(result, "stderr").strip() or _text(result, "stdout").strip()).splitlines()
    said = words[0] if words else "no output"
    return f"hccn_tool -i {npu} -{query} -g exited {result.get('rc')}: {said}"


def _npu_state(npu: int, results: Mapping[str, Any]) -> NpuState:
    values: dict[str, Any] = {}
    read: list[str] = []
    error = None
    for query, result in results.items():
        if not isinstance(result, Mapping):
            continue
        rc, out, err = result.get("rc"), _text(result, "stdout"), _text(result, "stderr")
        if query == "ip":
            if rc == 0 and _IPADDR_RE.search(out):
                values["address"] = _IPADDR_RE.search(out).group(1)
                found = _NETMASK_RE.search(out)
                values["netmask"] = found.group(1) if found else None
            elif rc != 0 and NO_ADDRESS in err:
                pass  # no address: a state
            else:
                error = error or _failure(query, npu, result)
                continue
        elif query == "gateway":
            if rc == 0 and _GATEWAY_RE.search(out):
                values["gateway"] = _GATEWAY_RE.search(out).group(1)
            elif not (rc != 0 and NO_GATEWAY in err):
                error = error or _failure(query, npu, result)
                continue
        elif query == "netdetect":
            found = _NETDETECT_RE.search(out) if rc == 0 else None
            if found is None:
                error = error or _failure(query, npu, result)
                continue
            values["netdetect"] = None if found.group(1) == UNSET_DETECT else found.group(1)
        elif query == "link":
            found = _LINK_RE.search(out) if rc == 0 else None
            if found is None:
                error = error or _failure(query, npu, result)
                continue
            values["link"] = found.group(1).upper()
        elif query == "net_health":
            found = _HEALTH_RE.search(out) if rc == 0 else None
            if found is None:
                error = error or _failure(query, npu, result)
                continue
            values["health"] = found.group(1)
        else:
            continue
        read.append(query)
    return NpuState(npu=npu, read=tuple(read), error=error, **values)


def parse_ping(npu: int, address: str, result: Mapping[str, Any]) -> PingResult:
    out, err = _text(result, "stdout"), _text(result, "stderr")
    summary = _PING_SUMMARY_RE.search(out)
    if summary is None:
        words = (err.strip() or out.strip()).splitlines()
        return PingResult(npu, address, False, reason=words[0] if words else f"exit {result.get('rc')}")
    sent, received, loss = int(summary.group(1)), int(summary.group(2)), float(summary.group(3))
    # The tool itself judges: a "recv time out seq" line makes it fail (ds_net_ext.c dsmi_ping_fun).
    return PingResult(npu, address, result.get("rc") == 0 and received == sent and sent > 0, sent, received, loss)


def parse_network(raw: Mapping[str, Any]) -> HostNetworkState:
    """The collector's raw output -> `HostNetworkState` (unknown or malformed parts are left out)."""
    npus = {}
    for key, results in (raw.get("npus") or {}).items():
        if str(key).isdigit() and isinstance(results, Mapping):
            npus[int(key)] = _npu_state(int(key), results)
    pings = []
    for item in raw.get("pings") or []:
        if isinstance(item, Mapping) and isinstance(item.get("npu"), int) and isinstance(item.get("address"), str):
            pings.append(parse_ping(item["npu"], item["address"], item))
    conf = raw.get("conf")
    tool = raw.get("tool")
    return HostNetworkState(tool=tool if isinstance(tool, str) and tool else None, npus=dict(sorted(npus.items())),
                            conf=conf if isinstance(conf, str) else None, pings=tuple(pings))


# --------------------------------------------------------------------------- what the role sets


@dataclass(frozen=True)
class Change:
    """One hccn_tool command that moves one setting of one NPU to the plan, and the one that would put it back."""

    npu: int
    setting: str                       # "address" (address and netmask), "gateway", "netdetect"
    argv: tuple[str, ...]
    undo: tuple[str, ...] | None       # None: the NPU had no value there (hccn_tool cannot unset one)
    label: str                         # "NPU 3 address 10.83.0.12/255.255.255.0 (was none)"

    def to_dict(self) -> dict[str, Any]:
        return {"npu": self.npu, "setting": self.setting, "argv": list(self.argv),
                "undo": list(self.undo) if self.undo is not None else None, "label": self.label}


def _ip_argv(tool: str, npu: int, address: str, netmask: str) -> tuple[str, ...]:
    # MindCluster toolbox guide, "Using hccn_tool to Configure the IP Address and Subnet Mask of the RoCE NIC".
    return (tool, "-i", str(npu), "-ip", "-s", "address", address, "netmask", netmask)


def _gateway_argv(tool: str, npu: int, gateway: str) -> tuple[str, ...]:
    return (tool, "-i", str(npu), "-gateway", "-s", "gateway", gateway)


def _netdetect_argv(tool: str, npu: int, address: str) -> tuple[str, ...]:
    return (tool, "-i", str(npu), "-netdetect", "-s", "address", address)


def _was(value: str | None) -> str:
    return value if value else "none"


def _address_order(host: str, moves: Mapping[int, tuple[NpuAddress, NpuState]]) -> list[int]:
    """The NPUs whose address changes, in an order hccn_tool accepts: it refuses an address another NPU of the host
    holds (tool_ops.c is_ipaddr_conflict), so an NPU taking another's current address goes after that one.  A cycle
    (NPUs swapping addresses) has no such order: refused before anything is set."""
    holder = {state.address: npu for npu, (_, state) in moves.items() if state.address}
    order: list[int] = []
    visiting: list[int] = []

    def visit(npu: int) -> None:
        if npu in order:
            return
        if npu in visiting:
            cycle = visiting[visiting.index(npu):]
            names = ", ".join(f"NPU {n} ({moves[n][1].address} -> {moves[n][0].address})" for n in cycle)
            raise NetworkStateError(
                f"host {host}: {names} would swap addresses, which hccn_tool refuses (an address another NPU holds is "
                f"a conflict); give NPU {cycle[0]} a free address by hand first (hccn_tool -i {cycle[0]} -ip -s "
                f"address <free> netmask {moves[cycle[0]][0].netmask}), then run dsctl provision again")
        visiting.append(npu)
        blocker = holder.get(moves[npu][0].address)
        if blocker is not None and blocker != npu:
            visit(blocker)
        visiting.pop()
        order.append(npu)

    for npu in sorted(moves):
        visit(npu)
    return order


def plan_changes(host: HostNetwork, state: HostNetworkState, tool: str) -> list[Change]:
    """The hccn_tool commands that bring ``host``'s NPUs to the plan: a setting is set again when the NPU or
    /etc/hccn.conf differs from it (hccn_tool writes the file after setting the NPU, so one command mends both).
    Addresses first (the tool drops a gateway outside a new subnet, and sets a gateway only inside the NPU's),
    then gateways, then detection peers.  A plan without a gateway or peer leaves the NPU's as it is: hccn_tool
    cannot unset them.  Raises `NetworkStateError` when the addresses cannot be moved in any order."""
    conf = state.conf_values
    moves: dict[int, tuple[NpuAddress, NpuState]] = {}
    gateways: list[Change] = []
    detects: list[Change] = []
    for planned in host.npus:
        now = state.npus.get(planned.npu) or NpuState(planned.npu)
        filed = conf.get(planned.npu, {})
        if ((now.address, now.netmask) != (planned.address, planned.netmask)
                or (filed.get("address"), filed.get("netmask")) != (planned.address, planned.netmask)):
            moves[planned.npu] = (planned, now)
        if planned.gateway is not None and (now.gateway != planned.gateway or filed.get("gateway") != planned.gateway):
            gateways.append(Change(
                planned.npu, "gateway", _gateway_argv(tool, planned.npu, planned.gateway),
                _gateway_argv(tool, planned.npu, now.gateway) if now.gateway else None,
                f"NPU {planned.npu} gateway {planned.gateway} (was {_was(now.gateway)})"))
        if planned.netdetect is not None and (
                now.netdetect != planned.netdetect or filed.get("netdetect") != planned.netdetect):
            detects.append(Change(
                planned.npu, "netdetect", _netdetect_argv(tool, planned.npu, planned.netdetect),
                _netdetect_argv(tool, planned.npu, now.netdetect) if now.netdetect else None,
                f"NPU {planned.npu} detection peer {planned.netdetect} (was {_was(now.netdetect)})"))
    addresses = []
    for npu in _address_order(host.host, moves):
        planned, now = moves[npu]
        was = f"{now.address}/{now.netmask}" if now.address else "none"
        undo = _ip_argv(tool, npu, now.address, now.netmask) if now.address and now.netmask else None
        addresses.append(Change(npu, "address", _ip_argv(tool, npu, planned.address, planned.netmask), undo,
                                f"NPU {npu} address {planned.address}/{planned.netmask} (was {was})"))
    return [*addresses, *gateways, *detects]


def role_decision(host: HostNetwork, state: HostNetworkState, tool: str) -> dict[str, Any]:
    """What the npu_network role does on a host: ``ready`` (the NPUs can be read and set), the ``reason`` when not,
    and the ``changes`` (`Change.to_dict`), in order."""
    reason = state.unreadable
    if reason is None:
        unread = [npu for npu in host.npus if npu.npu not in state.npus or state.npus[npu.npu].error]
        if unread:
            first = state.npus.get(unread[0].npu)
            reason = first.error if first is not None and first.error else f"NPU {unread[0].npu} was not read"
    if reason is not None:
        return {"ready": False, "reason": f"host {host.host}: the NPU network cannot be set: {reason}",
                "changes": []}
    return {"ready": True, "reason": "", "changes": [change.to_dict() for change in plan_changes(host, state, tool)]}
