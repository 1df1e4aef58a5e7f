"""The port table of one host of the fleet: sshd, its instances and the multi-host heads it runs (pure).

`host_table` fills a `dsctl.core.serving.port_table.PortTable` with every port the host will listen on, so
`dsctl.core.inventory.schema.validate_fleet` refuses two users of one port, and the gateway
(`dsctl.core.serving.gateway`) adds its own ports to the same table when it runs on a host of the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsctl.core.serving.port_table import SSH_PORT, PortTable
from dsctl.core.serving.service import SERVICES_VAR, ServiceSpec, plan_host

SSH_VAR = "ansible_port"
FIX = "give each its own port"


def ssh_port(values: Mapping[str, Any]) -> int:
    """The port sshd listens on: the host's ``ansible_port`` (an integer, or its digits from an INI inventory),
    else 22.  A value that is no port is Ansible's to refuse when it connects; it claims nothing here."""
    port = values.get(SSH_VAR)
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    return port if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 else SSH_PORT


def service_fields(services: Any) -> dict[str, str]:
    """Service name -> its entry in the host's raw ``dsctl_services`` (``dsctl_services[2]``), for the messages."""
    fields = {}
    for index, entry in enumerate(services if isinstance(services, list) else []):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            fields.setdefault(entry["name"], f"{SERVICES_VAR}[{index}]")
    return fields


def host_table(host: str, *, services: Sequence[ServiceSpec], npu_count: int,
               heads: Sequence[tuple[str, Any]] = (), ssh: int = SSH_PORT,
               fields: Mapping[str, str] | None = None) -> PortTable:
    """Every port ``host`` listens on: sshd's first (it was there before dsctl), then each single-host instance's
    ports, then for each multi-host instance it heads (instance name, `MultiNodeSpec`) the API ports and
    ``data_parallel_rpc_port`` (only the head binds it: the other nodes connect to --data-parallel-address).
    `PortClash` (exit 3) names the later user's field and the earlier user."""
    fields = fields or {}
    table = PortTable(host)
    table.claim(ssh, SSH_VAR, "sshd", FIX)  # ansible_port, 22 unless set
    for instance in plan_host(services, npu_count):
        field = fields.get(instance.service, f"{SERVICES_VAR} (service {instance.service})")
        for port in instance.ports:
            table.claim(port, f"{field}.port", f"instance {instance.name}", f"{FIX}: move the service's port range")
    for name, spec in heads:
        field = fields.get(spec.name, f"{SERVICES_VAR} (service {spec.name})")
        for port in spec.api_ports:
            table.claim(port, f"{field}.port", f"instance {name} (head)", f"{FIX}: move the service's port")
        table.claim(spec.data_parallel_rpc_port, f"{field}.data_parallel_rpc_port",
                    f"instance {name}'s data-parallel RPC (head)", f"{FIX}: move data_parallel_rpc_port")
    return table
