"""What deploy changes on each host, computed once before any play: the instances chosen, with overrides (pure).

The same two functions serve the deploy verb and the `dsctl_service_instances` filter, so a plain
``ansible-playbook -e @vars.json playbooks/deploy.yml`` with ``dsctl_service_overrides`` / ``dsctl_deploy_only``
deploys exactly what ``dsctl deploy --param ... --instance ...`` plans.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dsctl.core.inventory.schema import HostSettings
from dsctl.core.serving import service
from dsctl.core.serving.multinode import MultiNodeInstance, MultiNodeSpec
from dsctl.core.serving.service import Instance, ServiceSpec
from dsctl.errors import UsageError

OVERRIDES_VAR = "dsctl_service_overrides"  # {service: {engine parameter or parallel field: value}}
ONLY_VAR = "dsctl_deploy_only"  # [instance name, ...]; unset: every instance
FORCE_RESTART_VAR = "dsctl_deploy_force_restart"
SERIAL_VAR = "dsctl_deploy_serial"


def apply_overrides(settings: HostSettings, overrides: Mapping[str, Mapping[str, Any]]) -> HostSettings:
    """The host's settings with each named service's engine parameters overridden, checked by the service
    schema for this host's vllm-ascend release. Services the host does not run are ignored here. Raises
    ServiceError ("service chat: params.max_num_seqz: unknown vllm-ascend parameter; did you mean ...")."""
    services = []
    for spec in settings.services:
        given = overrides.get(spec.name)
        if not given:
            services.append(spec)
            continue
        fields = {key: value for key, value in given.items() if key in service.PARALLEL_FIELDS}
        params = {key: value for key, value in given.items() if key not in service.PARALLEL_FIELDS}
        services.append(spec.with_params({**spec.params, **params}, fields))
    return settings.model_copy(update={"services": tuple(services)})


def chosen(instances: list[Instance], only: Collection[str] | None) -> list[Instance]:
    return [planned for planned in instances if only is None or planned.name in only]


@dataclass(frozen=True)
class PlannedInstance:
    host: str
    address: str
    instance: Instance
    spec: ServiceSpec | MultiNodeSpec  # a multi-host instance's head (services/upgrade.py drains and gates it)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.instance.port}/v1"


@dataclass(frozen=True)
class DeployPlan:
    settings: dict[str, HostSettings]  # with the overrides applied
    instances: tuple[PlannedInstance, ...]  # the chosen ones, in host then NPU order
    only: tuple[str, ...] | None  # instance names handed to the play, None: all
    # The dsctl_plan extra var (core/inventory/host_plan.py) when the verb computed one for the play.
    host_plans: Mapping[str, Any] | None = None
    # The multi-host instances deployed with them, each with its service (host_plan.plan_groups).
    groups: tuple[tuple[MultiNodeSpec, MultiNodeInstance], ...] = ()

    def of_host(self, host: str) -> list[PlannedInstance]:
        return [planned for planned in self.instances if planned.host == host]


def _known(settings: Mapping[str, HostSettings]) -> tuple[set[str], set[str]]:
    services = {spec.name for host in settings.values() for spec in host.services}
    instances = {planned.name for host in settings.values()
                 for planned in service.plan_host(host.services, host.dsctl_npu_count)}
    return services, instances


def _listed(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def plan_deploy(settings: Mapping[str, HostSettings], addresses: Mapping[str, str], *,
                overrides: Mapping[str, Mapping[str, Any]] | None = None,
                instances: Collection[str] | None = None,
                groups: Collection[MultiNodeInstance] = ()) -> DeployPlan:
    """Check ``overrides`` and ``instances`` (names of instances, "chat-1", or of services, "chat") against
    the fleet and lay the chosen instances out. UsageError (one line naming the option) before any play."""
    overrides = overrides or {}
    services, instance_names = _known(settings)
    services |= {group.service for group in groups}  # the multi-host ones (--instance names them too)
    group_names = {group.name for group in groups}
    for name in overrides:
        if name not in services:
            raise UsageError(f"--param {name}: no service {name!r} in dsctl_services (known: {_listed(services)})")
    only: tuple[str, ...] | None = None
    if instances is not None:
        picked: list[str] = []
        for name in instances:
            if name not in services and name not in instance_names | group_names:
                raise UsageError(f"--instance {name}: no such instance or service (instances: "
                                 f"{_listed(instance_names)}; services: {_listed(services)})")
            picked += [name] if name in instance_names | group_names else sorted(
                planned for planned in instance_names if planned.rsplit("-", 1)[0] == name)
        only = tuple(dict.fromkeys(picked))
    applied: dict[str, HostSettings] = {}
    for host, host_settings in settings.items():
        try:
            applied[host] = apply_overrides(host_settings, overrides)
        except service.ServiceError as problem:
            raise UsageError(f"--param (host {host}): {problem}") from None
    planned = tuple(
        PlannedInstance(host=host, address=addresses.get(host, host), instance=instance,
                        spec=next(spec for spec in host_settings.services if spec.name == instance.service))
        for host, host_settings in applied.items()
        for instance in chosen(service.plan_host(host_settings.services, host_settings.dsctl_npu_count), only))
    return DeployPlan(settings=applied, instances=planned, only=only)
