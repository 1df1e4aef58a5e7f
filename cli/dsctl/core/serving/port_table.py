"""One host's listening ports in one table: a port claimed twice is refused, naming both of its users (pure).

Two processes cannot bind one TCP port on one address (the second gets EADDRINUSE, bind(2)), and which of them
wins depends on start order: an instance that lost its port to the gateway, to sshd or to another instance fails
its health check only after the rollout began.  Every user of a port on a host claims it here, in the order its
owner is most likely right (sshd first: it was there before dsctl), and the later claim is the one refused.

Who claims (dsctl.core.serving.host_ports builds the table): each single-host instance's API port and MindIE's
managementPort and metricsPort, a multi-host head's API port and ``data_parallel_rpc_port``, the gateway's ports
when it runs on the host, and sshd's ``ansible_port`` (22 unless the inventory says otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsctl.errors import DsctlError, ExitStatus

# Ports below 1024 are bound only with CAP_NET_BIND_SERVICE (capabilities(7)), which dsctl's unprivileged service
# users do not have, and they are the system daemons' well-known ports (ssh 22, http 80, IANA's "System Ports",
# RFC 6335 section 6): a service asks for one only with allow_privileged_port: true.
FIRST_UNPRIVILEGED_PORT = 1024
SSH_PORT = 22


class PortClash(DsctlError):
    """Two users of one port on one host (a plan that cannot work: exit VALIDATION_FAILED)."""

    exit_status = ExitStatus.VALIDATION_FAILED


@dataclass(frozen=True)
class PortUser:
    field: str  # the setting that asks for the port: dsctl_services[0].port, dsctl_gateway.services[1].port
    what: str   # who listens there: "instance chat-1", "sshd (ansible_port)"


class PortTable:
    """The ports of one host, each with its first user."""

    def __init__(self, host: str, error: type[DsctlError] = PortClash) -> None:
        self.host = host
        self._error = error  # the caller's exception class (service.ServiceError keeps its exit status)
        self._users: dict[int, PortUser] = {}

    def claim(self, port: int, field: str, what: str, fix: str) -> None:
        """``what`` (set by ``field``) listens on ``port``; `PortClash` naming both users if another already does."""
        first = self._users.get(port)
        if first is not None:
            raise self._error(f"inventory: host {self.host}: {field}: port {port} of {what} is also used by "
                              f"{first.what} ({first.field}); {fix}")
        self._users[port] = PortUser(field, what)

    def user(self, port: int) -> PortUser | None:
        return self._users.get(port)
