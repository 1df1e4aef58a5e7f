"""Read and validate a fleet before any play runs: the inventory's hosts, their settings and desired stacks."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters import inventory as inventory_adapter
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.inventory import host_plan
from dsctl.core.inventory import schema as inventory_schema
from dsctl.core.inventory.schema import HostSettings
from dsctl.core.load import limits
from dsctl.core.network.hccn_plan import NetworkPlan
from dsctl.core.serving import gateway
from dsctl.errors import UsageError


@dataclass(frozen=True)
class Fleet:
    """The hosts' merged variables (as Ansible sees them) and their validated settings, read once."""

    hostvars: dict[str, dict[str, Any]]
    settings: dict[str, HostSettings]
    # Every host of the fleet and of the gateway group, --limit or not: what the gateways front and where they run.
    fleet_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gateway_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    limit: str | None = None  # the --limit it was read with (None: every host of the fleet)

    @property
    def network(self) -> NetworkPlan:
        """The NPU network plan of the whole fleet (made once by validate_fleet; hosts outside --limit included)."""
        plan = next((settings.network_plan for settings in self.settings.values()), None)
        return plan if plan is not None else NetworkPlan()

    def address(self, host: str) -> str:
        return str(self.hostvars.get(host, {}).get("ansible_host", host))

    def only(self, limit: str | None) -> Fleet:
        """This fleet's hosts named in ``limit`` (host names separated by commas, as dsctl upgrade hands provision,
        deploy and check batch after batch, tune trial after trial), read no second time; the limit it was read with:
        itself.  A limit that is not plain names of its hosts (a group, a pattern) is Ansible's to resolve: read the
        fleet with it instead."""
        if limit == self.limit:
            return self
        if not limit:
            raise ValueError(f"every host: this fleet was read with --limit {self.limit}; read it again")
        names = [name.strip() for name in limit.split(",")]
        unknown = [name for name in names if name not in self.settings]
        if unknown:
            raise ValueError(f"--limit {limit}: {', '.join(unknown)} not among this fleet's hosts "
                             f"({', '.join(self.settings)}); read the fleet with that limit instead")
        keep = [host for host in self.hostvars if host in names]  # the inventory's order, as Ansible's subset
        return Fleet(hostvars={host: self.hostvars[host] for host in keep},
                     settings={host: self.settings[host] for host in keep},
                     fleet_vars=self.fleet_vars, gateway_vars=self.gateway_vars, limit=limit)

    def with_vars(self, host_vars: Mapping[str, Mapping[str, Any]]) -> Fleet:
        """This fleet with ``host_vars`` laid over some hosts' variables (an upgrade's target or previous versions),
        validated again (InventoryError on a refused stack)."""
        if not host_vars:
            return self
        merged = {host: {**values, **host_vars.get(host, {})} for host, values in self.hostvars.items()}
        fleet = {host: {**values, **host_vars.get(host, {})} for host, values in self.fleet_vars.items()} or None
        return Fleet(hostvars=merged, settings=inventory_schema.validate_fleet(merged, fleet=fleet),
                     fleet_vars=self.fleet_vars, gateway_vars=self.gateway_vars, limit=self.limit)

    def check_gateways(self) -> None:
        """Every gateway valid, fronting services the fleet runs, able to reach them and on ports of its own (one
        line, exit 2 or 3): planned as the gateway play plans it, over every host of the fleet."""
        fleet_vars = self.fleet_vars or self.hostvars
        settings: Mapping[str, HostSettings] | None = self.settings
        if any(host not in self.settings for host in fleet_vars):  # --limit: the gateway fronts the whole fleet
            declared = self.gateway_vars or any(values.get(gateway.ON_CONTROLLER_VAR) for values in fleet_vars.values())
            settings = inventory_schema.validate_fleet(fleet_vars) if declared else None
        gateway.check_gateways(self.gateway_vars, fleet_vars, settings)

    def check_controller_files(self) -> None:
        """The controller's files provision reads, there before any play (UsageError naming the setting, exit 2):
        a directory dsctl_package_source and its SHA256SUMS, and each serving stack's dsctl_pip_lock.
        ascend_preflight and serving_stack look them up on the controller only after the hosts were reached; an
        http(s) source is fetched by the play (and the hosts), so it is not checked here."""
        for host, settings in sorted(self.settings.items()):
            source = str(settings.dsctl_package_source)
            if not source.startswith(("http://", "https://")):
                if not Path(source).is_dir():
                    raise UsageError(f"dsctl_package_source: {source} (host {host}) is not a directory on the "
                                     "controller; put the .run files and their SHA256SUMS there, or give the "
                                     "http(s) URL of a mirror")
                if not (Path(source) / "SHA256SUMS").is_file():
                    raise UsageError(f"dsctl_package_source: {source}/SHA256SUMS (host {host}) not found on the "
                                     "controller; write it beside the .run files (sha256sum *.run > SHA256SUMS)")
            lock = settings.dsctl_pip_lock
            if lock is not None and settings.stack is not None and not Path(lock).is_file():
                raise UsageError(f"dsctl_pip_lock: {lock} (host {host}) is not a file on the controller; write it "
                                 "with dsctl wheelhouse build, or leave the setting out to use the wheelhouse's lock")

    def plan(self, *, overrides: Mapping[str, Mapping[str, Any]] | None = None,
             only: Collection[str] | None = None, groups: list[Any] | None = None) -> dict[str, Any]:
        """The dsctl_plan extra var of these hosts (host_plan.plan_fleet over the settings validated here);
        ``groups``: the multi-host instances deploy starts (host_plan.plan_groups)."""
        return host_plan.as_extra_var(
            host_plan.plan_fleet(self.hostvars, validated=self.settings, overrides=overrides, only=only,
                                 groups=groups))


def load_fleet(inventory: Path, *, vault: VaultOptions | None = None, limit: str | None = None,
               read: Fleet | None = None) -> Fleet:
    """Schema and matrix check of every host (one-line error, exit 2 or 3); no host is contacted.  ``read``: the
    fleet the command already read (the whole inventory), narrowed to ``limit`` instead of reading it again."""
    if read is not None:
        return read.only(limit)
    hostvars, groups = inventory_adapter.read_groups(inventory, vault=vault, limit=limit,
                                                     also=(gateway.GATEWAY_GROUP, inventory_adapter.NPU_GROUP))
    fleet = groups.get(inventory_adapter.NPU_GROUP, {})
    # The NPU network plan is the whole fleet's (a derived address depends on the host's place in it), --limit or not.
    return Fleet(hostvars=hostvars, settings=inventory_schema.validate_fleet(hostvars, fleet=fleet or None),
                 fleet_vars=fleet,
                 gateway_vars=groups.get(gateway.GATEWAY_GROUP, {}), limit=limit)


def check_playbook_options(*, forks: int | None = None, serial: int | None = None, tags: str | None = None,
                           vault: VaultOptions | None = None) -> None:
    """What Typer checks on the command line, checked again for callers from Python (the tuner)."""
    if forks is not None and forks < 1:
        raise UsageError(f"--forks: {forks} should be at least 1")
    if serial is not None and serial < 1:
        raise UsageError(f"--serial: {serial} should be at least 1")
    for option, hosts in (("--forks", forks), ("--serial", serial)):
        if hosts is not None:
            try:  # the one number rule (the command line's callback applies it too)
                limits.check(option, hosts, limits.MAX_HOSTS, "hosts")
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    if tags is not None and not tags.strip():
        raise UsageError("--tags: empty; name at least one tag or leave the option out")
    if vault is not None and vault.password_file is not None and not Path(vault.password_file).is_file():
        raise UsageError(f"--vault-password-file: {vault.password_file} is not a file")
