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
    if disk_gb < 1:
        raise UsageError(f"--disk-gb must be at least 1, got {disk_gb}")
    try:
        network = ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise UsageError(f"--subnet {subnet!r} is not an IPv4 network such as {DEFAULT_SUBNET}") from exc
    if network.version != 4 or network.num_addresses < FIRST_HOST_OFFSET + hosts + 1:
        raise UsageError(f"--subnet {subnet} has no room for {hosts} hosts; use a larger IPv4 network")
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
