"""The HCCL rank table of one multi-host instance: built from the NPU network plan, and checked when read back (pure).

Every node of an instance gets the same JSON file (multi-node.md, "Rank table"; CANN HCCL user guide "Rank Table
Configuration (Atlas A2 training product/Atlas A2 inference product)"; the MindIE installation guide, "Multi-Node
Inference", ranktable sample)::

    {"version": "1.0", "status": "completed", "server_count": "2",
     "server_list": [{"server_id": "<host ip>", "container_ip": "<ip>",
                      "device": [{"device_id": "0", "device_ip": "<NPU RoCE ip>", "rank_id": "0"}, ...]}, ...]}

Every value is a string.  ``server_id`` is the host's IP (MindIE reads it as the node address; the HCCL guide only
asks for a unique string), ``container_ip`` the address a container on it is reached at (the host's own with
host networking: MindIE guide, MIES_CONTAINER_IP), ``device_ip`` the NPU's RoCE address from /etc/hccn.conf.
Rank ids start at 0 and are globally unique, in host order then device order: the HCCL guide asks that ranks of
different servers not interleave and that rank 0 be the first server's (MindIE's master is the node of rank 0).
The optional ``device_port`` of the HCCL sample is left out: one process per NPU needs no port of its own.

`build_rank_table` makes the document; `check_rank_table` reads one back (deploy's tests, ``dsctl check``) and
refuses it with one line per problem (exit 3): duplicate or missing rank ids, interleaved servers, a device_ip
that is not the plan's, a value that is not a string.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsctl.core.network.hccn_plan import NetworkPlan
from dsctl.errors import DsctlError, ExitStatus

VERSION = "1.0"
STATUS_COMPLETED = "completed"
# The MindIE guide chmods its config files 640 (multi-node.md); the rank table is read by the serving user's group.
FILE_MODE = 0o640
FILE_NAME = "ranktable.json"
_FIX = "regenerate it with dsctl deploy"


class RankTableError(DsctlError):
    exit_status = ExitStatus.VALIDATION_FAILED


@dataclass(frozen=True)
class RankMember:
    """One node of an instance as the rank table lists it: its host, the address it is known by, its NPUs."""

    host: str                       # inventory name (looks its NPU addresses up in the network plan)
    server_id: str                  # the host's IP
    npus: tuple[int, ...]           # device ids, in rank order
    container_ip: str | None = None  # default: server_id (host networking)


@dataclass(frozen=True)
class RankDevice:
    device_id: int
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class RankServer:
    server_id: str
    container_ip: str | None
    devices: tuple[RankDevice, ...]


def build_rank_table(members: Sequence[RankMember], network: NetworkPlan) -> dict[str, Any]:
    """The rank table of an instance whose nodes are ``members`` (head first).

    Raises `RankTableError` when a member has no NPU network plan or no planned address for one of its NPUs."""
    servers, rank = [], 0
    for member in members:
        try:
            addresses = network.host(member.host).addresses
        except KeyError as missing:
            raise RankTableError(f"rank table: {missing.args[0]}; plan the NPU network of every node") from None
        devices = []
        for npu in member.npus:
            if npu not in addresses:
                raise RankTableError(f"rank table: host {member.host} NPU {npu} has no address in the NPU network "
                                     "plan; plan an address for every NPU the instance uses")
            devices.append({"device_id": str(npu), "device_ip": addresses[npu], "rank_id": str(rank)})
            rank += 1
        servers.append({"server_id": member.server_id, "container_ip": member.container_ip or member.server_id,
                        "device": devices})
    return {"version": VERSION, "status": STATUS_COMPLETED, "server_count": str(len(servers)),
            "server_list": servers}


def expected_device_ips(members: Sequence[RankMember], network: NetworkPlan) -> dict[str, dict[int, str]]:
    """server_id -> device_id -> the plan's RoCE address, for `check_rank_table`'s ``plan``."""
    return {member.server_id: {npu: network.host(member.host).addresses[npu] for npu in member.npus}
            for member in members if member.host in network}


# --------------------------------------------------------------------------- reading one back


def _string(value: Any, where: str, problems: list[str]) -> str | None:
    if not isinstance(value, str):
        shown = "missing" if value is None else f"{type(value).__name__} {value!r}"
        problems.append(f"rank table: {where}: expected a string (every value of a rank table is one), got {shown}; "
                        f"{_FIX}")
        return None
    return value


def _integer(value: Any, where: str, problems: list[str]) -> int | None:
    text = _string(value, where, problems)
    if text is None:
        return None
    if not text.isdigit():
        problems.append(f"rank table: {where}: expected a decimal number as a string, got {text!r}; {_FIX}")
        return None
    return int(text)


def _device(raw: Any, where: str, problems: list[str]) -> RankDevice | None:
    if not isinstance(raw, Mapping):
        problems.append(f"rank table: {where}: expected an object with device_id, device_ip, rank_id; {_FIX}")
        return None
    device_id = _integer(raw.get("device_id"), f"{where}.device_id", problems)
    device_ip = _string(raw.get("device_ip"), f"{where}.device_ip", problems)
    rank_id = _integer(raw.get("rank_id"), f"{where}.rank_id", problems)
    if device_ip is not None:
        try:
            ipaddress.ip_address(device_ip)
        except ValueError:
            problems.append(f"rank table: {where}.device_ip: {device_ip!r} is not an IP address; {_FIX}")
            return None
    if None in (device_id, device_ip, rank_id):
        return None
    return RankDevice(device_id, device_ip, rank_id)


def _servers(document: Any, problems: list[str]) -> list[RankServer]:
    if not isinstance(document, Mapping):
        problems.append(f"rank table: expected a JSON object, got {type(document).__name__}; {_FIX}")
        return []
    for key, wanted in (("version", VERSION), ("status", STATUS_COMPLETED)):
        value = _string(document.get(key), key, problems)
        if value is not None and value != wanted:
            problems.append(f"rank table: {key}: expected {wanted!r} (CANN HCCL guide), got {value!r}; {_FIX}")
    listed = document.get("server_list")
    if not isinstance(listed, list) or not listed:
        problems.append(f"rank table: server_list: expected a non-empty list of servers; {_FIX}")
        return []
    count = _integer(document.get("server_count"), "server_count", problems)
    if count is not None and count != len(listed):
        problems.append(f"rank table: server_count: {count}, but server_list has {len(listed)} server(s); {_FIX}")
    servers = []
    for index, raw in enumerate(listed):
        where = f"server_list[{index}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("device"), list) or not raw["device"]:
            problems.append(f"rank table: {where}: expected an object with server_id and a non-empty device list; "
                            f"{_FIX}")
            continue
        server_id = _string(raw.get("server_id"), f"{where}.server_id", problems)
        container_ip = raw.get("container_ip")
        if container_ip is not None:
            container_ip = _string(container_ip, f"{where}.container_ip", problems)
        devices = [_device(device, f"{where}.device[{d}]", problems) for d, device in enumerate(raw["device"])]
        if server_id is not None:
            servers.append(RankServer(server_id, container_ip, tuple(device for device in devices if device)))
    return servers


def _ranks(servers: Sequence[RankServer], problems: list[str]) -> None:
    """Rank ids unique, from 0 without gaps, in server order then device order (no interleaving)."""
    placed = [(f"server_list[{s}].device[{d}]", device.rank_id)
              for s, server in enumerate(servers) for d, device in enumerate(server.devices)]
    seen: dict[int, str] = {}
    for where, rank in placed:
        if rank in seen:
            problems.append(f"rank table: {where}.rank_id: {rank} is also the rank of {seen[rank]}; rank ids are "
                            f"globally unique (CANN HCCL guide); {_FIX}")
        seen.setdefault(rank, where)
    missing = sorted(set(range(len(placed))) - set(seen))
    if missing:
        problems.append(f"rank table: rank ids 0..{len(placed) - 1} expected for {len(placed)} devices, missing "
                        f"{', '.join(map(str, missing))}; {_FIX}")
    if len(seen) != len(placed) or missing:
        return
    for expected, (where, rank) in enumerate(placed):
        if rank != expected:
            problems.append(f"rank table: {where}.rank_id: {rank}, expected {expected}: ranks count from 0 in server "
                            f"order then device order, servers not interleaved (CANN HCCL guide); {_FIX}")
            return


def _uniqueness(servers: Sequence[RankServer], problems: list[str]) -> None:
    server_ids: dict[str, int] = {}
    device_ips: dict[str, str] = {}
    for s, server in enumerate(servers):
        if server.server_id in server_ids:
            problems.append(f"rank table: server_list[{s}].server_id: {server.server_id} is also "
                            f"server_list[{server_ids[server.server_id]}]; one entry per node; {_FIX}")
        server_ids.setdefault(server.server_id, s)
        device_ids: set[int] = set()
        for d, device in enumerate(server.devices):
            where = f"server_list[{s}].device[{d}]"
            if device.device_id in device_ids:
                problems.append(f"rank table: {where}.device_id: NPU {device.device_id} is listed twice on server "
                                f"{server.server_id}; {_FIX}")
            device_ids.add(device.device_id)
            if device.device_ip in device_ips:
                problems.append(f"rank table: {where}.device_ip: {device.device_ip} is also the address of "
                                f"{device_ips[device.device_ip]}; every NPU has its own RoCE address; {_FIX}")
            device_ips.setdefault(device.device_ip, where)


def _against_plan(servers: Sequence[RankServer], plan: Mapping[str, Mapping[int, str]], problems: list[str]) -> None:
    listed = {server.server_id for server in servers}
    for server_id in plan:
        if server_id not in listed:
            problems.append(f"rank table: server {server_id} of the instance is missing from server_list; {_FIX}")
    for s, server in enumerate(servers):
        wanted = plan.get(server.server_id)
        if wanted is None:
            problems.append(f"rank table: server_list[{s}].server_id: {server.server_id} is not a node of the "
                            f"instance; {_FIX}")
            continue
        for d, device in enumerate(server.devices):
            planned = wanted.get(device.device_id)
            where = f"server_list[{s}].device[{d}]"
            if planned is None:
                problems.append(f"rank table: {where}.device_id: server {server.server_id} NPU {device.device_id} is "
                                f"not one of the instance's NPUs; {_FIX}")
            elif planned != device.device_ip:
                problems.append(f"rank table: {where}.device_ip: server {server.server_id} NPU {device.device_id} "
                                f"is listed at {device.device_ip}, but the NPU network plan gives it {planned}; "
                                f"{_FIX}")
        missing = sorted(set(wanted) - {device.device_id for device in server.devices})
        if missing:
            problems.append(f"rank table: server_list[{s}]: server {server.server_id} lacks NPU(s) "
                            f"{', '.join(map(str, missing))} of the instance; {_FIX}")


def check_rank_table(document: Any, *, plan: Mapping[str, Mapping[int, str]] | None = None) -> tuple[RankServer, ...]:
    """``document`` (a parsed rank table) checked: its servers if it holds, else `RankTableError` naming the first
    problem and how many more there are.

    ``plan`` (server_id -> device_id -> RoCE address, `expected_device_ips`) also checks the servers and devices
    against the instance and the NPU network plan."""
    problems: list[str] = []
    servers = _servers(document, problems)
    _uniqueness(servers, problems)
    _ranks(servers, problems)
    if plan is not None:
        _against_plan(servers, plan, problems)
    if problems:
        more = len(problems) - 1
        tail = f" ({more} more problem{'s' if more > 1 else ''} in the rank table)" if more else ""
        raise RankTableError(problems[0] + tail)
    return tuple(servers)
