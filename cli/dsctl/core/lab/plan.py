"""What a lab looks like before it exists: host names, addresses and boards.

Pure: takes the chip catalogue (data/chips.yaml, already loaded) and the user's
options, returns plain data or raises a UsageError naming the bad option.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from dsctl.errors import UsageError

MAX_HOSTS = 200
MAX_NPUS = 16
MAX_DISK_GB = 1_048_576  # a pebibyte: more than an Atlas server's disks; the size is the lab host's disk quota
DEFAULT_NAME = "lab"
DEFAULT_SUBNET = "10.78.0.0/24"
# Named labs other than the default get the first free 10.78.K.0/24 (K = 1..255) unless --subnet says otherwise.
NAMED_SUBNET_POOL = "10.78.0.0/16"
FIRST_HOST_OFFSET = 11
# A lab's name goes into its bridge (dsctl-<name>0), namespaces (dsctl-<name>-NN) and cables (d<name>N): Linux
# interface names hold 15 characters, and a name that ends in a letter keeps "d<name><index>" unambiguous.
NAME_RULE = re.compile(r"[a-z](?:[a-z0-9]{0,6}[a-z])?")


def check_name(name: str) -> str:
    if not NAME_RULE.fullmatch(name):
        raise UsageError(
            f"--name {name!r} is not a lab name: 1 to 8 lower-case letters and digits, starting and ending with a "
            "letter (e.g. lab, ci, gwtest)"
        )
    return name


def bridge_name(name: str = DEFAULT_NAME) -> str:
    return f"dsctl-{name}0"


def netns_prefix(name: str = DEFAULT_NAME) -> str:
    return f"dsctl-{name}-"


def cable_prefix(name: str = DEFAULT_NAME) -> str:
    return f"d{name}"


# Today's names of the default lab, kept for the code and tests that name them.
BRIDGE = bridge_name()
NETNS_PREFIX = netns_prefix()
CABLE_PREFIX = cable_prefix()


# --- the NPU parameter plane -------------------------------------------------------------------------------
#
# A second network per lab, apart from the management network SSH uses: the NPUs' RoCE ports (the "parameter
# plane" of Ascend's networking guides) cabled to a ToR switch.  The switch is a network namespace of its own,
# dsctl-<name>-npu, holding a bridge (NPU_PLANE_BRIDGE) with one port per lab host, named after the host, and the
# switch's routed interfaces (the gateway .1 of every NPU subnet below).  Each host has one cable into it, seen on
# the host as NPU_PLANE_INTERFACE; an NPU's address, once hccn_tool sets it, is an alias there in a routing table
# of its own (dsctl.emu.npu_net), so only what the NPU itself sends (hccn_tool's ping) uses it.  Nothing of the
# plane is in this machine's own network namespace: two labs' planes never meet, whatever addresses they use.
NPU_PLANE_BRIDGE = "npu-plane"
NPU_PLANE_INTERFACE = "npu-plane"
# The lab's suggested addressing, NIC i of every server in a subnet of its own (ascend-deployer's rule for
# Atlas 800 training servers: NIC i of all servers in one subnet, the NICs of one server in different subnets):
# NPU i of lab-NN is 10.(80+i).0.(10+NN)/24, the switch answers at 10.(80+i).0.1 (detection peer and gateway).
NPU_PLANE_NETWORK = "10.80.0.0/12"  # 10.80.0.0 - 10.95.255.255: NPU indices 0..15, one /24 each
NPU_PLANE_PREFIX_LEN = 24
NPU_SWITCH_PORT_SPEED = "200GE"  # an Atlas A2 NPU's RoCE port (Atlas 800T A2 datasheet: 8 x 200GE)


def npu_plane_netns(name: str = DEFAULT_NAME) -> str:
    """The namespace of lab ``name``'s NPU plane switch (named under the lab's prefix, so teardown finds it)."""
    return f"{netns_prefix(name)}npu"


def npu_subnet(npu: int) -> str:
    return str(ipaddress.ip_network(NPU_PLANE_NETWORK).network_address + (npu << 16)) + f"/{NPU_PLANE_PREFIX_LEN}"


def npu_gateway(npu: int) -> str:
    """The switch's address in NPU ``npu``'s subnet: the detection peer and gateway a site's switch gives."""
    return str(next(ipaddress.ip_network(npu_subnet(npu)).hosts()))


def npu_address(host_index: int, npu: int) -> str:
    """The lab's suggested address of NPU ``npu`` of lab host ``host_index`` (its last octet is the host's)."""
    return str(ipaddress.ip_network(npu_subnet(npu)).network_address + FIRST_HOST_OFFSET + host_index - 1)


def npu_netmask() -> str:
    return str(ipaddress.ip_network(f"0.0.0.0/{NPU_PLANE_PREFIX_LEN}").netmask)


def npu_network_settings(npus: int) -> dict[str, Any]:
    """The lab's NPU plane as an inventory's ``dsctl_npu_network`` (dsctl.core.network.hccn_plan's derived plan, the
    variables a site sets for its own network): NPU i of every host in subnet i, the switch's .1 as gateway and
    detection peer, host parts from FIRST_HOST_OFFSET in inventory order, so the plan gives NPU i of lab-NN exactly
    `npu_address` (NN, i)."""
    return {"subnets": [npu_subnet(npu) for npu in range(npus)],
            "gateways": [npu_gateway(npu) for npu in range(npus)],
            "detect": "gateway", "start": FIRST_HOST_OFFSET}


@dataclass(frozen=True)
class LabHost:
    name: str
    index: int
    address: str
    netns: str
    veth: str


@dataclass(frozen=True)
class LabSpec:
    hosts: int
    npus: int
    chip: str
    subnet: str = DEFAULT_SUBNET
    driver: str | None = None
    firmware: str | None = None
    cann: str | None = None
    disk_gb: int = 64
    members: list[LabHost] = field(default_factory=list)
    name: str = DEFAULT_NAME

    @property
    def bridge(self) -> str:
        return bridge_name(self.name)

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabSpec:
        members = [LabHost(**member) for member in data.pop("members", [])]
        return cls(**data, members=members)

    def same_shape(self, other: LabSpec) -> bool:
        return self.to_dict() == other.to_dict()


def host_name(index: int) -> str:
    return f"lab-{index:02d}"


def plan_lab(
    *,
    hosts: int,
    npus: int,
    chip: str,
    chips: dict[str, Any],
    subnet: str = DEFAULT_SUBNET,
    driver: str | None = None,
    firmware: str | None = None,
    cann: str | None = None,
    disk_gb: int = 64,
    name: str = DEFAULT_NAME,
) -> LabSpec:
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    if not 1 <= npus <= MAX_NPUS:
        raise UsageError(f"--npus must be between 1 and {MAX_NPUS}, got {npus}")
    if chip not in chips:
        raise UsageError(f"--chip {chip!r} is not an emulated board; choose one of: {', '.join(sorted(chips))}")
    if firmware and not driver:
        raise UsageError("--firmware needs --driver: firmware installs only on a host with a driver")
    if not 1 <= disk_gb <= MAX_DISK_GB:
        raise UsageError(f"--disk-gb must be between 1 and {MAX_DISK_GB}, got {disk_gb}")
    try:
        network = ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise UsageError(f"--subnet {subnet!r} is not an IPv4 network such as {DEFAULT_SUBNET}") from exc
    if network.version != 4 or network.num_addresses < FIRST_HOST_OFFSET + hosts + 1:
        raise UsageError(f"--subnet {subnet} has no room for {hosts} hosts; use a larger IPv4 network")
    if network.overlaps(ipaddress.ip_network(NPU_PLANE_NETWORK)):
        raise UsageError(f"--subnet {subnet} overlaps the lab's NPU plane {NPU_PLANE_NETWORK}; choose another network")
    members = [
        LabHost(
            name=host_name(index),
            index=index,
            address=str(network.network_address + FIRST_HOST_OFFSET + index - 1),
            netns=f"{netns_prefix(name)}{index:02d}",
            veth=f"{cable_prefix(name)}{index}",
        )
        for index in range(1, hosts + 1)
    ]
    return LabSpec(
        hosts=hosts, npus=npus, chip=chip, subnet=str(network), driver=driver, firmware=firmware,
        cann=cann, disk_gb=disk_gb, members=members, name=name,
    )


def free_subnet(used: list[str], pool: str = NAMED_SUBNET_POOL) -> str:
    """The first /24 of the pool (after the default lab's) that overlaps none of the networks in ``used``."""
    taken = [ipaddress.ip_network(network, strict=False) for network in used]
    for candidate in list(ipaddress.ip_network(pool).subnets(new_prefix=24))[1:]:
        if not any(candidate.overlaps(network) for network in taken):
            return str(candidate)
    raise UsageError(f"no free /24 left in {pool} for another lab; pass --subnet or take a lab down")


def npu_plane_cabling(name: str, host: LabHost, npus: int) -> dict[str, Any]:
    """Where a host's NPU ports are cabled (dsctl.emu.hwstate's npu_plane.json): the host's plane interface, the
    switch's identity as its LLDP says it, and the switch port of each NPU (one 200GE port per NPU, numbered
    across the lab's hosts)."""
    digest = hashlib.sha256(f"{name}/npu-switch".encode()).hexdigest()
    return {
        "interface": NPU_PLANE_INTERFACE,
        "switch": {
            "name": f"{name}-npu-sw",
            # A locally administered unicast MAC, stable per lab.
            "chassis_mac": ":".join(["02"] + [digest[i:i + 2] for i in range(0, 10, 2)]),
            "description": "Routing switch of the dsctl lab NPU plane (a Linux bridge, emulated; not a Huawei switch)",
            "management_address": npu_gateway(0),
        },
        "ports": [f"{NPU_SWITCH_PORT_SPEED}1/0/{(host.index - 1) * npus + npu + 1}" for npu in range(npus)],
    }


def bus_id(npu: int, known: list[str]) -> str:
    if npu < len(known):
        return known[npu]
    return f"0000:{0x90 + npu:02X}:00.0"


def serial_number(host: str, npu: int) -> str:
    """Stable per host and NPU, shaped like the sample's 1025C9048791."""
    digest = hashlib.sha256(f"{host}/{npu}".encode()).hexdigest().upper()
    return f"1025{digest[:8]}"


def board_state(host: str, npus: int, chip: str, chips: dict[str, Any], bus_ids: list[str]) -> dict[str, Any]:
    """The emulated boards of one host in dsctl.emu.hwstate's board.json shape."""
    model = chips[chip]
    return {
        "chip": chip,
        "family": model["family"],
        "npu_smi_name": model["npu_smi_name"],
        "hbm_total_mb": model["hbm_total_mb"],
        "memory_total_mb": model["memory_total_mb"],
        "pci_device_id": model["pci_device_id"],
        "subsystem_vendor_id": model["subsystem_vendor_id"],
        "subsystem_device_id": model["subsystem_device_id"],
        "product_name": model["product_name"],
        "board_id": model["board_id"],
        "npus": [
            {
                "id": npu,
                "chip_id": 0,
                "logic_id": npu,
                "bus_id": bus_id(npu, bus_ids),
                "serial": serial_number(host, npu),
                "health": "OK",
                "hbm_used_mb": model["hbm_idle_used_mb"],
                "memory_used_mb": model.get("memory_idle_used_mb", 0),
                # Small per-NPU spread, as real boards never read identical.
                "power_w": round(model["power_idle_w"] + (npu * 7 % 9) - 4, 1),
                "temp_c": model["temp_idle_c"] + (npu * 5 % 7) - 3,
                "aicore_pct": 0,
            }
            for npu in range(npus)
        ],
    }
