"""The NPU parameter-plane addressing plan: every NPU's RoCE address, netmask, detection peer and gateway (pure).

Each NPU of an Atlas A2 server has its own RoCE NIC with its own IPv4 address, set with ``hccn_tool`` and persisted
by it in ``/etc/hccn.conf`` (multi-node.md, "The NPU network"; Ascend MindCluster toolbox guide "Using hccn_tool to
Configure the IP Address and Subnet Mask of the RoCE NIC").  This module turns inventory settings into that plan,
checks the whole fleet's plan before any host is touched, and renders what the tools do with it: the
``/etc/hccn.conf`` lines and the ``hccn_tool`` argv lists a role runs.

Two ways to give the plan, as ascend-deployer's hccn playbook does (``deviceip``/``detectip`` per host,
``netmask``/``gateways`` for the group):

* derived: ``dsctl_npu_network: {subnets: [CIDR, ...], gateways: [...], detect: gateway, start: 2}``.  NPU ``i`` of
  every server goes in ``subnets[i % len(subnets)]``, the vendor's rule in its two published forms
  (ascend-deployer / MindCluster Ascend Deployer user guide, "Configuring the Parameter Plane Network"):
  one subnet for all 8 NPUs on an Atlas 800T A2 ("the IP addresses of the eight NPU network ports on each training
  node must be in the same network segment, for example, 10.20.0.x"), four for the Atlas 800 training server
  (model 9000/9010): NPU0 and NPU4 share one segment, NPU1 and NPU5 the next, so NICs 0-3 of a server are in
  different subnets and NIC ``i`` of every server is in the subnet of NIC ``i`` of the others (multi-node.md).
  Host ``k`` (its ``dsctl_npu_host_index``, default its position in the inventory) takes the ``k``-th block of
  addresses in each subnet from host part ``start``: with one /24, ``start`` 2 and 8 NPUs, host 0 gets .2-.9 (the
  guide's example ``10.20.0.2,...,10.20.0.9``) and host 1 gets .10-.17.
* explicit: ``dsctl_npu_ips: [8 addresses]`` (and optionally ``dsctl_npu_detect_ips``) in host_vars, with
  ``dsctl_npu_network: {netmask: 255.255.255.0, gateways: [...]}`` or ``{subnets: [...]}`` for the group.

`plan_network` refuses an inconsistent plan with one line naming the host, the NPU, the field and the fix
(`NetworkPlanError`): exit 2 for a malformed value, exit 3 for a plan that cannot work (duplicate addresses
within or across hosts, NPU ``i`` of two hosts in different subnets, an address, gateway or detection peer outside
its subnet, a derived plan that runs out of addresses).  IPv4 only: the A2 guides configure IPv4 RoCE addresses.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dsctl.core.text import Text
from dsctl.errors import DsctlError, ExitStatus

NETWORK_VAR = "dsctl_npu_network"
IPS_VAR = "dsctl_npu_ips"
DETECT_VAR = "dsctl_npu_detect_ips"
INDEX_VAR = "dsctl_npu_host_index"
COUNT_VAR = "dsctl_npu_count"
HOST_VARS = (NETWORK_VAR, IPS_VAR, DETECT_VAR, INDEX_VAR)
HCCN_CONF = "/etc/hccn.conf"
HCCN_TOOL = "hccn_tool"
# The host part of the first derived address in each subnet: .1 stays free for the gateway, and the guide's
# example plan starts at 10.20.0.2 (ascend-deployer user guide, deviceip).
DEFAULT_START = 2
# The keys of /etc/hccn.conf dsctl manages, in the order the file holds them (address_0, netmask_0, netdetect_0,
# gateway_0, ...: MindCluster toolbox guide; CANN HCCL user guide, rank table "device_ip": "cat /etc/hccn.conf").
# hccn_tool writes more keys of its own (send_arp_status_N, tls_enable_N); dsctl leaves them alone.
CONF_KEYS = ("address", "netmask", "netdetect", "gateway")
FIX = "fix it in group_vars or host_vars"

# The driver's hccn_tool refuses a RoCE address here: the host's virtual NIC to its NPUs uses it (hicann/driver
# src/custom/network/hccn, tool_ops.c is_ipaddr_conflict; dsctl.emu.hccn_tool emulates the refusal).
VNIC_HOST_NETWORK = ipaddress.IPv4Network("192.168.1.0/24")
_CONF_LINE_RE = re.compile(r"^\s*([a-z_]+?)_(\d+)\s*=\s*(\S*)\s*$")


class NetworkPlanError(DsctlError):
    exit_status = ExitStatus.USAGE


class _Problem(DsctlError):
    """One problem at a field of the settings (``dsctl_npu_network.gateways[1]``).

    Not a ValueError on purpose: pydantic lets it through a validator unchanged, field and exit status included
    (the same device as dsctl.core.serving.service)."""

    def __init__(self, field: str, message: str, status: ExitStatus = ExitStatus.USAGE):
        super().__init__(f"{field}: {message}", status)
        self.field = field
        self.message = message


# --------------------------------------------------------------------------- value types


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


class _Invalid(ValueError):
    """What a value should have been, and the fix when there is a better one than "fix it"."""

    def __init__(self, expected: str, fix: str = FIX):
        super().__init__(expected)
        self.expected = expected
        self.fix = fix


# Addresses that never reach another host's NPU (RFC 6890's special-purpose registry, as ipaddress names them):
# an NPU's RoCE address, gateway or detection peer, and every address of an NPU subnet, is none of them.
_SPECIAL = (("loopback", "is_loopback"), ("multicast", "is_multicast"), ("unspecified", "is_unspecified"),
            ("link-local", "is_link_local"), ("reserved", "is_reserved"))
# 0.0.0.0/8 is "this network" (RFC 1122 section 3.2.1.3): a source address only, never a host's.
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
# A subnet or netmask shorter than /8 spans more than the largest private block (10.0.0.0/8, RFC 1918).
_SHORTEST_PREFIX = 8


def _special(address: ipaddress.IPv4Address) -> str | None:
    if address in _THIS_NETWORK:
        return "unspecified (0.0.0.0/8, \"this network\")"
    return next((words for words, attribute in _SPECIAL if getattr(address, attribute)), None)


def _ipv4(value: str) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise _Invalid("expected an IPv4 address such as 10.20.0.2") from None
    kind = _special(address)
    if kind:
        raise _Invalid(f"expected a unicast address other hosts reach ({address} is {kind})",
                       "use an address of the NPU network's private subnet (such as 10.20.0.2)")
    return str(address)


def _subnet(value: str) -> str:
    cidr = "expected a CIDR subnet such as 10.20.0.0/24"
    try:
        network = ipaddress.IPv4Network(value)
    except ipaddress.NetmaskValueError:
        raise _Invalid(cidr) from None
    except ValueError:
        try:
            loose = ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            raise _Invalid(cidr) from None
        raise _Invalid("expected a network address (no host bits)", f"did you mean {loose}?") from None
    if "/" not in value:
        raise _Invalid(cidr, f"add the prefix length: {value}/24 for a /24")
    if network.prefixlen > 30:
        raise _Invalid("expected a subnet of /30 or larger (a /31 or /32 leaves no address for NPUs and a peer)")
    _check_routable(network)
    return str(network)


def _check_routable(network: ipaddress.IPv4Network) -> None:
    """A subnet whose first or last address is special overlaps a special block (the blocks are aligned, and the
    subnet is not shorter than /8): loopback, multicast, unspecified, link-local or reserved."""
    if network.prefixlen < _SHORTEST_PREFIX:
        raise _Invalid(f"expected a subnet of /{_SHORTEST_PREFIX} or longer (a shorter one spans more than the "
                       "largest private block, 10.0.0.0/8, RFC 1918)")
    for address in (network.network_address, network.broadcast_address):
        kind = _special(address)
        if kind:
            raise _Invalid(f"expected a subnet of unicast addresses other hosts reach ({address} is {kind})",
                           "use a private subnet (RFC 1918) such as 10.20.0.0/24")


def _netmask(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
        network = ipaddress.IPv4Network(f"0.0.0.0/{value}")
    except ValueError:
        raise _Invalid("expected a contiguous IPv4 netmask such as 255.255.255.0") from None
    # As for a subnet: /8 (255.0.0.0) to /30 (255.255.255.252); 0.0.0.0 would put every IPv4 address on the link.
    if not _SHORTEST_PREFIX <= network.prefixlen <= 30:
        raise _Invalid(f"expected a netmask from 255.0.0.0 (/{_SHORTEST_PREFIX}) to 255.255.255.252 (/30): a shorter "
                       "one puts addresses beyond the NPU network on its link, a longer one leaves none for a peer")
    return str(network.netmask)


IPv4 = Annotated[Text, AfterValidator(_ipv4)]
Subnet = Annotated[Text, AfterValidator(_subnet)]
Netmask = Annotated[Text, AfterValidator(_netmask)]
_ADDRESSES = "a list of IPv4 addresses, one per NPU from NPU 0"


class NpuNetworkSettings(BaseModel):
    """``dsctl_npu_network``: the group's addressing; each field's description is what an error says it expects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subnets: Annotated[list[Subnet] | None, Field(strict=True, min_length=1, max_length=16,
                                                  description="a list of 1 to 16 CIDR subnets such as "
                                                              "[10.20.0.0/24]")] = None
    netmask: Annotated[Netmask | None, Field(description="an IPv4 netmask such as 255.255.255.0")] = None
    gateways: Annotated[list[IPv4] | None, Field(strict=True, min_length=1,
                                                 description="a list of IPv4 gateways, one per subnet")] = None
    detect: Annotated[Any, Field(description="gateway, none, or a list of IPv4 detection peers, one per subnet")] = \
        "gateway"
    start: Annotated[int, Field(strict=True, ge=1, le=65534,
                                description="an integer host part >= 1 (default 2: .1 stays the gateway's)")] = \
        DEFAULT_START

    @field_validator("detect")
    @classmethod
    def _detect(cls, detect: Any) -> Any:
        # hccn_tool's detection peer "can be set to the gateway address in the segment" (MindCluster toolbox guide)
        if detect in ("gateway", "none"):
            return detect
        if isinstance(detect, list) and detect and all(isinstance(peer, str) for peer in detect):
            try:
                return [_ipv4(peer) for peer in detect]
            except ValueError:
                pass
        raise _Problem(f"{NETWORK_VAR}.detect", f"expected gateway, none or a list of IPv4 addresses (one per "
                                                f"subnet), got {_shown(detect)}; {FIX}")

    @model_validator(mode="after")
    def _consistent(self) -> NpuNetworkSettings:
        if self.subnets is None and self.netmask is None:
            raise _Problem(NETWORK_VAR, "set subnets (dsctl derives every NPU's address) or netmask (with "
                                        f"{IPS_VAR} on every host); {FIX}")
        if self.subnets is not None and self.netmask is not None:
            raise _Problem(f"{NETWORK_VAR}.netmask", "the subnets carry their netmask; remove netmask")
        if self.subnets is None:
            return self
        for field, peers in (("gateways", self.gateways),
                             ("detect", self.detect if isinstance(self.detect, list) else None)):
            if peers is None:
                continue
            if len(peers) != len(self.subnets):
                raise _Problem(f"{NETWORK_VAR}.{field}", f"{len(peers)} address(es) for {len(self.subnets)} "
                                                         "subnet(s); give one per subnet, in the subnets' order")
            for index, (peer, subnet) in enumerate(zip(peers, self.subnets, strict=True)):
                if not _usable(ipaddress.IPv4Address(peer), ipaddress.IPv4Network(subnet)):
                    raise _Problem(f"{NETWORK_VAR}.{field}[{index}]",
                                   f"{peer} is outside subnets[{index}] {subnet}; give an address inside it",
                                   ExitStatus.VALIDATION_FAILED)
        return self

    def subnet_of(self, npu: int) -> tuple[int, ipaddress.IPv4Network] | None:
        """(index in ``subnets``, subnet) NPU ``npu`` belongs in by the vendor's rule, or None without subnets."""
        if self.subnets is None:
            return None
        group = npu % len(self.subnets)
        return group, ipaddress.IPv4Network(self.subnets[group])


class HostNetworkVars(BaseModel):
    """One host's NPU network settings among its merged variables (others are ignored here)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    dsctl_npu_count: Annotated[int, Field(strict=True, ge=1, le=16, description="an integer 1..16")]
    dsctl_npu_network: Annotated[NpuNetworkSettings | None,
                                 Field(description="a mapping (subnets or netmask, gateways, detect, start)")] = None
    dsctl_npu_ips: Annotated[list[IPv4] | None, Field(strict=True, description=_ADDRESSES)] = None
    dsctl_npu_detect_ips: Annotated[list[IPv4] | None, Field(strict=True, description=_ADDRESSES)] = None
    dsctl_npu_host_index: Annotated[int | None, Field(strict=True, ge=0, le=4095,
                                                      description="an integer 0..4095")] = None

    @model_validator(mode="after")
    def _complete(self) -> HostNetworkVars:
        for var, addresses in ((IPS_VAR, self.dsctl_npu_ips), (DETECT_VAR, self.dsctl_npu_detect_ips)):
            if addresses is not None and len(addresses) != self.dsctl_npu_count:
                raise _Problem(var, f"{len(addresses)} address(es) for {self.dsctl_npu_count} NPUs "
                                    f"({COUNT_VAR}); give one per NPU, NPU 0 first")
        if self.dsctl_npu_network is None:
            raise _Problem(NETWORK_VAR, "required with the host's NPU addresses: the netmask (and gateways) "
                                        f"hccn_tool sets with them; set {NETWORK_VAR}.netmask or .subnets in "
                                        "group_vars")
        if self.dsctl_npu_ips is None and self.dsctl_npu_network.subnets is None:
            raise _Problem(NETWORK_VAR, f"a netmask alone derives no addresses; list subnets, or give this host "
                                        f"{IPS_VAR}")
        return self


def _usable(address: ipaddress.IPv4Address, subnet: ipaddress.IPv4Network) -> bool:
    """``address`` is a host address of ``subnet`` (neither its network nor its broadcast address)."""
    return address in subnet and address not in (subnet.network_address, subnet.broadcast_address)


def _loc_text(loc: Sequence[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _description(loc: Sequence[Any]) -> str:
    model: type[BaseModel] | None = HostNetworkVars
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            break
        info = model.model_fields[part]
        model = NpuNetworkSettings if part == NETWORK_VAR else None
    return info.description if info is not None and info.description else "a valid value"


def _pydantic_line(error: Mapping[str, Any]) -> str:
    field = _loc_text(error.get("loc", ())) or NETWORK_VAR
    if error["type"] == "missing":
        return f"{field}: required but not set ({_description(error['loc'])}); add it to group_vars or host_vars"
    if error["type"] == "extra_forbidden":
        known = ", ".join(NpuNetworkSettings.model_fields)
        return f"{field}: unknown setting (known: {known}); remove it"
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _Invalid):
        return f"{field}: {cause.expected}, got {_shown(error.get('input'))}; {cause.fix}"
    return f"{field}: expected {_description(error['loc'])}, got {_shown(error.get('input'))}; {FIX}"


def validate_host_network(host: str, hostvars: Mapping[str, Any]) -> HostNetworkVars | None:
    """One host's network settings, or None when the host sets none (it stays off the NPU network plan).

    Raises `NetworkPlanError`, one line ``inventory: host H: <field>: ...`` (exit 2, or 3 for a peer outside its
    subnet)."""
    settings = {var: hostvars[var] for var in HOST_VARS if var in hostvars and hostvars[var] is not None}
    if not settings:
        return None
    settings[COUNT_VAR] = hostvars.get(COUNT_VAR)
    prefix = f"inventory: host {host}: "
    try:
        return HostNetworkVars.model_validate(settings)
    except ValidationError as invalid:
        errors = invalid.errors()
        more = len(errors) - 1
        tail = f" ({more} more problem{'s' if more > 1 else ''} on this host)" if more else ""
        raise NetworkPlanError(prefix + _pydantic_line(errors[0]) + tail) from None
    except _Problem as problem:
        raise NetworkPlanError(prefix + str(problem), problem.exit_status) from None


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class NpuAddress:
    """One NPU's RoCE NIC settings, as hccn_tool sets them and /etc/hccn.conf keeps them."""

    npu: int
    address: str
    netmask: str
    netdetect: str | None = None
    gateway: str | None = None

    @property
    def subnet(self) -> str:
        return str(ipaddress.IPv4Network(f"{self.address}/{self.netmask}", strict=False))


@dataclass(frozen=True)
class HostNetwork:
    """One host's NPU addresses, NPU 0 first."""

    host: str
    npus: tuple[NpuAddress, ...]

    def npu(self, index: int) -> NpuAddress:
        for npu in self.npus:
            if npu.npu == index:
                return npu
        raise KeyError(f"host {self.host} has no NPU {index} in the NPU network plan")

    @property
    def addresses(self) -> dict[int, str]:
        """NPU id -> its RoCE address (the rank table's device_ip)."""
        return {npu.npu: npu.address for npu in self.npus}


@dataclass(frozen=True)
class NetworkPlan:
    """The fleet's NPU network plan, hosts in inventory order (hosts without NPU network settings left out)."""

    hosts: tuple[HostNetwork, ...] = ()

    def __contains__(self, host: object) -> bool:
        return any(planned.host == host for planned in self.hosts)

    def host(self, name: str) -> HostNetwork:
        for planned in self.hosts:
            if planned.host == name:
                return planned
        raise KeyError(f"host {name} has no NPU network plan ({NETWORK_VAR} or {IPS_VAR})")

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """Host -> its NPUs as plain data (handed to the play in ``dsctl_plan``)."""
        return {planned.host: [{"npu": npu.npu, "address": npu.address, "netmask": npu.netmask,
                                "netdetect": npu.netdetect, "gateway": npu.gateway} for npu in planned.npus]
                for planned in self.hosts}


@dataclass(frozen=True)
class _Placed:
    """An NPU's planned address and where the inventory sets it (for the error lines)."""

    host: str
    npu: NpuAddress
    field: str
    derived_slot: int | None  # the host's slot when the address is derived


def _problem(host: str, field: str, message: str, status: ExitStatus) -> tuple[ExitStatus, str]:
    return status, f"inventory: host {host}: {field}: {message}"


def _raise_first(problems: Sequence[tuple[ExitStatus, str]]) -> None:
    if not problems:
        return
    status, line = problems[0]
    more = len(problems) - 1
    tail = f" ({more} more problem{'s' if more > 1 else ''} in the NPU network plan)" if more else ""
    raise NetworkPlanError(line + tail, status)


def _stride(validated: Mapping[str, HostNetworkVars]) -> int:
    """Addresses each host takes in each subnet: the largest host's NPUs per subnet, the same for every host so
    that a host's block does not move when another host changes."""
    counts = [math.ceil(v.dsctl_npu_count / len(v.dsctl_npu_network.subnets)) for v in validated.values()
              if v.dsctl_npu_ips is None]
    return max(counts, default=1)


def _peer_in(peers: Sequence[str] | None, group: int | None, subnet: ipaddress.IPv4Network) -> str | None:
    """The peer of ``peers`` for this NPU: by position with subnets, else the one inside its subnet."""
    if peers is None:
        return None
    if group is not None:
        return peers[group]
    return next((peer for peer in peers if _usable(ipaddress.IPv4Address(peer), subnet)), None)


def _place(host: str, index: int, v: HostNetworkVars, slot: int, stride: int,
           problems: list[tuple[ExitStatus, str]]) -> _Placed | None:
    settings = v.dsctl_npu_network
    rule = settings.subnet_of(index)
    group = rule[0] if rule else None
    if v.dsctl_npu_ips is not None:
        field = f"{IPS_VAR}[{index}]"
        address = ipaddress.IPv4Address(v.dsctl_npu_ips[index])
        if rule is not None:
            subnet = rule[1]
            if not _usable(address, subnet):
                problems.append(_problem(host, field, (
                    f"NPU {index}'s address {address} is outside its subnet {subnet} ({NETWORK_VAR}.subnets[{group}]"
                    f", NPU i in subnets[i % {len(settings.subnets)}]); give NPU {index} an address inside it"),
                    ExitStatus.VALIDATION_FAILED))
                return None
        else:
            subnet = ipaddress.IPv4Network(f"{address}/{settings.netmask}", strict=False)
            if not _usable(address, subnet):
                problems.append(_problem(host, field, (
                    f"NPU {index}'s address {address} is the network or broadcast address of {subnet}; give it a "
                    "host address"), ExitStatus.VALIDATION_FAILED))
                return None
        derived_slot = None
    else:
        subnet = rule[1]
        offset = settings.start + slot * stride + index // len(settings.subnets)
        if offset > subnet.num_addresses - 2:
            problems.append(_problem(host, f"{NETWORK_VAR}.subnets[{group}]", (
                f"{subnet} runs out of addresses at NPU {index} of this host (host slot {slot}, {stride} addresses "
                f"per host from host part {settings.start}: it needs host part {offset}, the last usable address is "
                f"{subnet.broadcast_address - 1}); use a larger subnet, a lower start, or a lower {INDEX_VAR}"),
                ExitStatus.VALIDATION_FAILED))
            return None
        address = subnet.network_address + offset
        field = f"{NETWORK_VAR}.subnets[{group}] (derived, slot {slot})"
        derived_slot = slot

    if address in VNIC_HOST_NETWORK:
        problems.append(_problem(host, field, (
            f"NPU {index}'s address {address} is in {VNIC_HOST_NETWORK}, which hccn_tool refuses for a RoCE port (the "
            "driver keeps it for the host's virtual NIC to the NPUs: tool_ops.c is_ipaddr_conflict); use another "
            "subnet"), ExitStatus.VALIDATION_FAILED))
        return None
    gateway = _peer_in(settings.gateways, group, subnet)
    if settings.gateways is not None and gateway is None:
        problems.append(_problem(host, f"{NETWORK_VAR}.gateways", (
            f"none is inside NPU {index}'s subnet {subnet}; add its gateway, or remove gateways"),
            ExitStatus.VALIDATION_FAILED))
        return None
    if v.dsctl_npu_detect_ips is not None:
        detect_field, netdetect = f"{DETECT_VAR}[{index}]", v.dsctl_npu_detect_ips[index]
    elif isinstance(settings.detect, list):
        detect_field, netdetect = f"{NETWORK_VAR}.detect", _peer_in(settings.detect, group, subnet)
    else:
        detect_field, netdetect = f"{NETWORK_VAR}.detect", gateway if settings.detect == "gateway" else None
    for peer_field, peer, what in ((f"{NETWORK_VAR}.gateways", gateway, "gateway"),
                                   (detect_field, netdetect, "detection peer")):
        if peer is None:
            continue
        if not _usable(ipaddress.IPv4Address(peer), subnet):
            problems.append(_problem(host, peer_field, (
                f"NPU {index}'s {what} {peer} is outside its subnet {subnet}; give a {what} inside it"),
                ExitStatus.VALIDATION_FAILED))
            return None
        if peer == str(address):
            problems.append(_problem(host, peer_field, (
                f"NPU {index}'s {what} {peer} is the NPU's own address; name another host of {subnet}"),
                ExitStatus.VALIDATION_FAILED))
            return None
    npu = NpuAddress(npu=index, address=str(address), netmask=str(subnet.netmask), netdetect=netdetect,
                     gateway=gateway)
    return _Placed(host, npu, field, derived_slot)


def _cross_host(placed: Sequence[_Placed], problems: list[tuple[ExitStatus, str]]) -> None:
    """Duplicate addresses (within and across hosts, gateways included) and NPU i of two hosts in two subnets."""
    owners: dict[str, _Placed] = {}
    gateways: dict[str, _Placed] = {}
    subnet_of_npu: dict[int, _Placed] = {}
    for item in placed:
        if item.npu.gateway is not None:
            gateways.setdefault(item.npu.gateway, item)
    for item in placed:
        address, index = item.npu.address, item.npu.npu
        other = owners.get(address)
        if other is not None:
            whose = "this host" if other.host == item.host else other.host
            hint = ""
            if other.derived_slot is not None and other.derived_slot == item.derived_slot:
                hint = f" ({other.host} and {item.host} share slot {item.derived_slot}: give each its own {INDEX_VAR})"
            problems.append(_problem(item.host, item.field, (
                f"NPU {index}'s address {address} is also NPU {other.npu.npu} of {whose}; give every NPU its own "
                f"address{hint}"), ExitStatus.VALIDATION_FAILED))
            continue
        owners[address] = item
        if address in gateways:
            user = gateways[address]
            problems.append(_problem(item.host, item.field, (
                f"NPU {index}'s address {address} is the gateway of NPU {user.npu.npu} of {user.host}; keep the "
                "gateways' addresses out of the NPUs' range (start)"), ExitStatus.VALIDATION_FAILED))
            continue
        first = subnet_of_npu.setdefault(index, item)
        if first.npu.subnet != item.npu.subnet:
            problems.append(_problem(item.host, item.field, (
                f"NPU {index} is in {item.npu.subnet}, but NPU {index} of {first.host} is in {first.npu.subnet}; "
                f"NPU {index} of every server goes in the same subnet (ascend-deployer's addressing rule)"),
                ExitStatus.VALIDATION_FAILED))


def plan_network(hosts: Mapping[str, Mapping[str, Any]]) -> NetworkPlan:
    """The fleet's NPU network plan from each host's merged variables (host -> vars, in inventory order).

    Hosts that set none of ``dsctl_npu_network``, ``dsctl_npu_ips``, ``dsctl_npu_detect_ips`` or
    ``dsctl_npu_host_index`` stay off the plan.  Raises `NetworkPlanError` on the first problem, saying how many
    more there are: nothing may be configured from a plan that does not hold as a whole."""
    problems: list[tuple[ExitStatus, str]] = []
    validated: dict[str, HostNetworkVars] = {}
    positions: dict[str, int] = {}
    for position, (host, hostvars) in enumerate(hosts.items()):
        try:
            settings = validate_host_network(str(host), hostvars)
        except NetworkPlanError as invalid:
            problems.append((invalid.exit_status, str(invalid)))
            continue
        if settings is not None:
            validated[str(host)] = settings
            positions[str(host)] = position
    _raise_first(problems)

    stride = _stride(validated)
    placed: list[_Placed] = []
    planned: list[HostNetwork] = []
    for host, v in validated.items():
        slot = v.dsctl_npu_host_index if v.dsctl_npu_host_index is not None else positions[host]
        npus = [_place(host, index, v, slot, stride, problems) for index in range(v.dsctl_npu_count)]
        placed += [item for item in npus if item is not None]
        planned.append(HostNetwork(host, tuple(item.npu for item in npus if item is not None)))
    _cross_host(placed, problems)
    _raise_first(problems)
    return NetworkPlan(tuple(planned))


# --------------------------------------------------------------------------- what the tools do with it


def _conf_values(npu: NpuAddress) -> dict[str, str | None]:
    return {"address": npu.address, "netmask": npu.netmask, "netdetect": npu.netdetect, "gateway": npu.gateway}


def hccn_conf(host: HostNetwork) -> str:
    """The ``/etc/hccn.conf`` lines dsctl manages for ``host``, as hccn_tool persists them: ``address_0=...``,
    ``netmask_0=...``, ``netdetect_0=...``, ``gateway_0=...``, NPU by NPU (an unset peer has no line)."""
    lines = [f"{key}_{npu.npu}={value}" for npu in host.npus for key, value in _conf_values(npu).items()
             if value is not None]
    return "".join(line + "\n" for line in lines)


def hccn_commands(host: HostNetwork, *, tool: str = HCCN_TOOL) -> list[list[str]]:
    """The ``hccn_tool`` argv lists that set ``host``'s plan, NPU by NPU: address and netmask, gateway, detection
    peer (MindCluster toolbox guide: ``-ip -s address %s netmask %s``, ``-netdetect -s address %s``; the gateway is
    ``-gateway -s gateway %s`` in the public deploy scripts that set it)."""
    commands: list[list[str]] = []
    for npu in host.npus:
        device = [tool, "-i", str(npu.npu)]
        commands.append([*device, "-ip", "-s", "address", npu.address, "netmask", npu.netmask])
        if npu.gateway is not None:
            commands.append([*device, "-gateway", "-s", "gateway", npu.gateway])
        if npu.netdetect is not None:
            commands.append([*device, "-netdetect", "-s", "address", npu.netdetect])
    return commands


def parse_hccn_conf(text: str) -> dict[int, dict[str, str]]:
    """``/etc/hccn.conf`` as NPU -> key -> value (``address_3=10.20.0.5`` -> {3: {"address": "10.20.0.5"}});
    lines of another shape are skipped."""
    parsed: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        match = _CONF_LINE_RE.match(line)
        if match:
            key, npu, value = match.groups()
            parsed.setdefault(int(npu), {})[key] = value
    return parsed


def conf_differences(host: HostNetwork, text: str) -> list[str]:
    """Where ``/etc/hccn.conf`` (its text) differs from ``host``'s plan: one line per key, empty when it matches.

    A key the plan does not set but the file holds is reported too: hccn_tool cannot unset a gateway, so a stale
    one stays until someone sets another."""
    found = parse_hccn_conf(text)
    differences = []
    for npu in host.npus:
        held = found.get(npu.npu, {})
        for key, wanted in _conf_values(npu).items():
            have = held.get(key)
            if have == wanted or (wanted is None and have in (None, "")):
                continue
            name = f"{key}_{npu.npu}"
            if have is None:
                differences.append(f"NPU {npu.npu} {name}: missing from {HCCN_CONF}, the plan sets {wanted}")
            elif wanted is None:
                differences.append(f"NPU {npu.npu} {name}: {HCCN_CONF} has {have}, the plan sets none")
            else:
                differences.append(f"NPU {npu.npu} {name}: {HCCN_CONF} has {have}, the plan sets {wanted}")
    return differences
