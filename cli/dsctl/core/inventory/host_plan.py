"""One plan per host, computed once on the controller (pure): what the plays would otherwise validate and render
again through playbooks/filter_plugins/dsctl_filters.py at every lazy reference of a role default.

The verbs hand the plan to the play as the ``dsctl_plan`` extra var; the filters return its entry for a host it
covers and compute the very same functions below when there is none (plain ``ansible-playbook``, AWX).

Per host the plan holds:
- ``settings``: the validated dsctl_* settings without the prefix (what ``dsctl_host_settings`` returns);
- ``stack``: the desired stack with ``{arch}`` left in the installer names. The arch is a fact of the host
  (``ascend_host.system.arch``), known only once the play has gathered it; substituting it is a string
  replace, so the filter does that and the plan does not guess an arch or carry one stack per arch;
- ``npu_network``: the host's NPUs in the fleet's NPU network plan ({npu, address, netmask, netdetect, gateway}
  each; None without a plan), what the npu_network role sets (dsctl.core.network.hccn_plan, made once for the
  whole fleet by validate_fleet);
- ``instances``: every declared instance rendered with the deploy overrides applied (``dsctl_deploy_only``
  narrows them in the filter, since the role needs both the chosen and the declared ones). ``None`` when a
  service of the host holds an API key: the extra-vars file lands in the run directory, and a vaulted key
  must not be written there in clear, so such a host's instances are rendered by the filter as before.
Install steps are not planned: they compare the desired stack with live host facts (installed versions), so
ascend_preflight computes them on the host (``dsctl_install_steps``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from dsctl.core.inventory import deploy_plan
from dsctl.core.inventory import schema as inventory_schema
from dsctl.core.inventory.schema import HostSettings
from dsctl.core.network.hccn_plan import NetworkPlan
from dsctl.core.serving import multinode, multinode_render, service, service_render
from dsctl.core.serving.multinode import MultiNodeInstance, MultiNodeSpec, NodeFacts
from dsctl.errors import ExitStatus

PLAN_VAR = "dsctl_plan"
ALLOW_DOWNGRADE_VAR = "dsctl_allow_downgrade"  # dsctl provision --allow-downgrade; ascend_preflight reads it
CHECK_INSTANCES_VAR = "dsctl_check_instances"  # dsctl check: {host: [instance]} whose processes ascend_validate reads
CHECK_NETWORK_VAR = "dsctl_check_npu_network"  # dsctl check: {host: {npus, pings}} the NPU plane collector runs
PLAN_VERSION = 1
SETTINGS_PREFIX = "dsctl_"
# Options of one playbook run (dsctl passes them as extra vars, which reach hostvars): not host settings.
RUN_OPTIONS = frozenset({deploy_plan.SERIAL_VAR, deploy_plan.FORCE_RESTART_VAR, deploy_plan.OVERRIDES_VAR,
                         deploy_plan.ONLY_VAR, PLAN_VAR, ALLOW_DOWNGRADE_VAR,
                         CHECK_INSTANCES_VAR, CHECK_NETWORK_VAR})
ARCH_NAMED = ("driver_run", "firmware_run", "toolkit_run", "kernels_run", "nnal_run")

# How each service manager tells whether an instance's process is alive (service_health's process check).
PROCESS_CHECKS = {
    "supervisor": (["supervisorctl", "status", "{unit}"], r"RUNNING|STARTING"),
    "systemd": (["systemctl", "is-active", "{unit}"], r"^(active|activating)"),
    "container": (["{runtime}", "inspect", "-f", "{{{{.State.Running}}}}", "{unit}"], r"true"),
}


def settings_vars(host_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The dsctl_* host settings among a host's variables (run options and the plan itself left out)."""
    return {str(key): host_vars[key] for key in list(host_vars.keys())
            if str(key).startswith(SETTINGS_PREFIX) and str(key) not in RUN_OPTIONS}


def host_settings(host: str, dsctl_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The validated settings with defaults applied, field names without the prefix. Raises InventoryError."""
    settings = inventory_schema.validate_host_vars(host, dsctl_vars)
    return {key.removeprefix(SETTINGS_PREFIX): value for key, value in settings.model_dump(mode="json").items()}


def stack_template(settings: HostSettings) -> dict[str, Any] | None:
    """The desired stack, installer names still holding ``{arch}`` (lists, as the play reads it back from JSON)."""
    if settings.stack is None:
        return None
    return {key: list(value) if isinstance(value, tuple) else value for key, value in settings.stack.to_dict().items()}


def stack_for_arch(stack: Mapping[str, Any] | None, arch: str) -> dict[str, Any] | None:
    if stack is None:
        return None
    resolved = dict(stack)
    for key in ARCH_NAMED:
        resolved[key] = str(resolved[key]).replace("{arch}", str(arch))
    return resolved


def rendered_instances(settings: HostSettings, overrides: Mapping[str, Mapping[str, Any]],
                       only: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Every (or every chosen) instance of the host with its files, fingerprint and readiness check.
    Raises ServiceError for an override the service schema refuses."""
    settings = deploy_plan.apply_overrides(settings, overrides)
    services = {spec.name: spec for spec in settings.services}
    rendered = service_render.render_host(
        settings.services, npu_count=settings.dsctl_npu_count, env=settings.environment,
        config_dir=settings.dsctl_service_config_dir, log_dir=settings.dsctl_service_log_dir,
        install_path=settings.dsctl_install_path)
    instances = []
    for planned in deploy_plan.chosen(service.plan_host(settings.services, settings.dsctl_npu_count), only):
        spec = services[planned.service]
        files = rendered[planned.name]
        command, pattern = PROCESS_CHECKS[spec.manager]
        runtime = getattr(spec, "container_runtime", "docker") or "docker"
        instances.append({
            "name": planned.name, "service": spec.name, "unit": planned.unit, "engine": spec.engine,
            "manager": spec.manager, "port": planned.port, "npus": list(planned.npus), "bind": spec.bind,
            "model": spec.served_model_name, "user": spec.user, "group": spec.group,
            "dir": f"{settings.dsctl_service_config_dir}/{planned.name}",
            "log_file": f"{settings.dsctl_service_log_dir}/{planned.name}.log",
            "health_timeout": spec.health_timeout_s,
            "kind": "mindie" if spec.engine == "mindie" else "openai",
            "api_key": spec.api_key.get_secret_value() if spec.api_key is not None else None,
            "process_check": [part.format(unit=planned.unit, runtime=runtime) for part in command],
            "process_pattern": pattern,
            "fingerprint": service_render.fingerprint(files),
            # What the instance runs on besides its files (the role folds their state into the fingerprint).
            "stack_paths": {"install_path": None if spec.manager == "container" else settings.dsctl_install_path,
                            "venv": None if spec.manager == "container" else spec.venv},
            "files": [{"path": f.path, "content": f.content, "mode": f"0{f.mode:o}", "owner": f.owner,
                       "group": f.group, "secret": f.secret, "role": f.role} for f in files],
        })
    return instances


def _node_facts(host: str, settings: HostSettings, address: str, chip: str) -> NodeFacts:
    stack = settings.stack
    return NodeFacts(name=host, address=address, npu_count=settings.dsctl_npu_count, chip=chip,
                     cann=stack.cann if stack else None, driver=stack.driver if stack else None,
                     vllm_ascend=stack.vllm_ascend if stack else None, torch_npu=stack.torch_npu if stack else None)


def plan_groups(settings: Mapping[str, HostSettings], addresses: Mapping[str, str],
                only: Collection[str] | None = None) -> list[tuple[MultiNodeSpec, MultiNodeInstance]]:
    """Every multi-host instance these hosts hold (`multinode.plan_services`, checked as a whole against the
    hosts' desired stacks), each with its service; ``only`` (instance or service names) narrows them.  A --limit
    that holds some nodes of an instance but not all is refused: its nodes start and fail together.
    `MultiNodeError`, one line."""
    specs: dict[str, MultiNodeSpec] = {}
    pools: dict[str, list[str]] = {}
    for host, host_settings in settings.items():
        for spec in host_settings.multi_host_services:
            specs.setdefault(spec.name, spec)
            pools.setdefault(spec.name, []).append(host)
    if not specs:
        return []
    originals = dict(specs)
    groups = next((host_settings.host_groups for host_settings in settings.values()), ())
    for group in groups:
        inside = [host for host in group.hosts if host in settings]
        if inside and len(inside) < len(group.hosts):
            missing = ", ".join(host for host in group.hosts if host not in settings)
            raise multinode.MultiNodeError(
                f"--limit: instance {group.name} spans {', '.join(group.hosts)}, but {missing} is left out; its nodes "
                "start and fail together: limit to all of them or none", ExitStatus.USAGE)
    # The groups the whole fleet is cut into (validate_fleet), those inside the limit with their fleet-wide numbers.
    inside_groups = [group for group in groups if group.hosts[0] in settings]
    specs = {name: spec.model_copy(update={"host_groups": [list(group.hosts) for group in inside_groups
                                                           if group.service == name]})
             for name, spec in specs.items()}
    numbers = {name: [group.index for group in inside_groups if group.service == name] for name in specs}
    chips = {host: spec.chip for spec in specs.values() for host in pools[spec.name]}
    hosts = [_node_facts(host, host_settings, addresses.get(host, host), chips.get(host, "910B3"))
             for host, host_settings in settings.items()]
    first = next(iter(settings.values()))
    taken = {host: {npu: planned.name for planned in service.plan_host(host_settings.services,
                                                                       host_settings.dsctl_npu_count)
                    for npu in planned.npus}
             for host, host_settings in settings.items()}
    for spec in specs.values():
        problem = multinode_render.deploy_problem(spec)
        if problem is not None:
            raise multinode.MultiNodeError(problem, ExitStatus.USAGE)
    planned = multinode.plan_services(list(specs.values()), hosts, network=first.network_plan or NetworkPlan(),
                                      pools=pools, taken=taken, config_dir=first.dsctl_service_config_dir,
                                      numbers=numbers)
    chosen = [instance for instance in planned
              if only is None or instance.name in only or instance.service in only]
    return [(originals[instance.service], instance) for instance in chosen]


def _rank_ranges(instance: MultiNodeInstance) -> str:
    """"lab-03 ranks 0-7, lab-04 ranks 8-15": which node holds which HCCL ranks (the rank table's order), for the
    failure a rank that never joined produces (HCCL names ranks, the user thinks in hosts)."""
    parts, first = [], 0
    for node in instance.nodes:
        parts.append(f"{node.host} ranks {first}-{first + len(node.npus) - 1}")
        first += len(node.npus)
    return ", ".join(parts)


def rendered_nodes(settings: Mapping[str, HostSettings],
                   groups: list[tuple[MultiNodeSpec, MultiNodeInstance]]) -> dict[str, list[dict[str, Any]]]:
    """Host -> its nodes of multi-host instances, each in the shape `rendered_instances` gives a single-host
    instance (the role rolls a node out as one) plus ``multinode``: the instance's hosts, head first, and this node's
    rank and role."""
    found: dict[str, list[dict[str, Any]]] = {}
    for spec, instance in groups:
        for node in instance.nodes:
            host_settings = settings[node.host]
            venv = spec.venv or host_settings.dsctl_serving_venv
            spec = spec.model_copy(update={"manager": spec.manager or host_settings.dsctl_service_manager})
            files = multinode_render.render_node(
                spec, instance, node, env=host_settings.environment, config_dir=host_settings.dsctl_service_config_dir,
                log_dir=host_settings.dsctl_service_log_dir, install_path=host_settings.dsctl_install_path, venv=venv)
            unit = f"dsctl-{instance.name}"
            command, pattern = PROCESS_CHECKS[spec.manager]
            found.setdefault(node.host, []).append({
                "name": instance.name, "service": spec.name, "unit": unit, "engine": spec.engine,
                "manager": spec.manager, "port": instance.port, "npus": list(node.npus), "bind": spec.bind,
                "model": spec.served_name, "user": spec.user, "group": spec.group,
                "dir": f"{host_settings.dsctl_service_config_dir}/{instance.name}",
                "log_file": f"{host_settings.dsctl_service_log_dir}/{instance.name}.log",
                "health_timeout": spec.health_timeout_s, "kind": "openai", "api_key": None,
                "process_check": [part.format(unit=unit, runtime="docker") for part in command],
                "process_pattern": pattern,
                "fingerprint": service_render.fingerprint(files),
                "stack_paths": {"install_path": host_settings.dsctl_install_path, "venv": venv},
                "files": [{"path": f.path, "content": f.content, "mode": f"0{f.mode:o}", "owner": f.owner,
                           "group": f.group, "secret": f.secret, "role": f.role} for f in files],
                "multinode": {"hosts": list(instance.hosts), "head": instance.head.host, "node_rank": node.node_rank,
                              "ranks": _rank_ranges(instance), "headless": node.headless,
                              "address": instance.head.address},
            })
    return found


def _holds_secret(instances: list[dict[str, Any]]) -> bool:
    return any(item["api_key"] is not None or any(f["secret"] for f in item["files"]) for item in instances)


def plan_fleet(hostvars: Mapping[str, Mapping[str, Any]], *, validated: Mapping[str, HostSettings] | None = None,
               overrides: Mapping[str, Mapping[str, Any]] | None = None,
               only: Collection[str] | None = None,
               groups: list[tuple[MultiNodeSpec, MultiNodeInstance]] | None = None) -> dict[str, Any]:
    """The ``dsctl_plan`` extra var for these hosts (JSON-serialisable). ``validated``: validate_fleet's result
    when the verb has it already (else validated here; InventoryError on bad input); ``groups``: the multi-host
    instances to deploy (`plan_groups`; each host's ``group_nodes``, else none)."""
    overrides = {str(name): dict(params) for name, params in (overrides or {}).items()}
    settings = dict(validated) if validated is not None else inventory_schema.validate_fleet(hostvars)
    nodes = rendered_nodes(settings, groups or [])
    hosts: dict[str, Any] = {}
    for host in hostvars:
        instances: list[dict[str, Any]] | None = rendered_instances(settings[host], overrides)
        if _holds_secret(instances):
            instances = None
        addresses = settings[host].npu_addresses
        hosts[str(host)] = {"settings": host_settings(str(host), settings_vars(hostvars[host])),
                            "stack": stack_template(settings[host]), "instances": instances,
                            "group_nodes": nodes.get(str(host), []),
                            "group_declared": sorted(group.name for group in settings[host].host_groups
                                                     if str(host) in group.hosts),
                            "npu_network": NetworkPlan((addresses,)).to_dict()[addresses.host] if addresses else None}
    return {"version": PLAN_VERSION, "fleet": sorted(hosts), "overrides": overrides,
            "only": list(only) if only is not None else None, "hosts": hosts}


# Ansible treats every string of an extra-vars file as a template (ansible-core 2.19 trusts extra vars): a
# rendered file, a container's `{{.State.Running}}` check or an already templated inventory value would be
# templated again. Its JSON loader keeps {"__ansible_unsafe": text} as plain, never-templated text.
JINJA_MARKERS = ("{{", "{%", "{#")


def as_extra_var(value: Any) -> Any:
    """``value`` for an extra-vars JSON file: every string holding Jinja delimiters marked unsafe."""
    if isinstance(value, Mapping):
        return {str(key): as_extra_var(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_extra_var(item) for item in value]
    if isinstance(value, str) and any(marker in value for marker in JINJA_MARKERS):
        return {"__ansible_unsafe": value}
    return value


def entry(plan: Any, host: str) -> dict[str, Any] | None:
    """The plan's entry for ``host``, or None when there is no plan of this version covering it."""
    if not isinstance(plan, Mapping) or plan.get("version") != PLAN_VERSION:
        return None
    hosts = plan.get("hosts")
    found = hosts.get(host) if isinstance(hosts, Mapping) else None
    return found if isinstance(found, Mapping) else None


def covers_exactly(plan: Any, host_names: Collection[str]) -> bool:
    """True when the plan was computed for exactly these hosts (then the fleet check already passed)."""
    return (isinstance(plan, Mapping) and plan.get("version") == PLAN_VERSION
            and sorted(str(name) for name in host_names) == list(plan.get("fleet") or []))
