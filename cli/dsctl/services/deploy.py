"""The deploy verb: render and (re)start the inference instances, health-gated, rolling back on failure.

The plan (instances chosen, overrides applied) is computed once here; the play gets it as extra vars and
reports per instance (the inference_service_report fact); the result joins the two.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.inventory import deploy_plan, host_plan
from dsctl.core.inventory.deploy_plan import DeployPlan, plan_deploy
from dsctl.core.serving import service_render
from dsctl.core.serving.multinode import MultiNodeError
from dsctl.errors import DsctlError, ExitStatus
from dsctl.services.fleet import Fleet, check_playbook_options, load_fleet
from dsctl.services.ports import PlaybookRunner, ProgressSink, no_progress
from dsctl.services.runs import failure_lines, hosts_to_rerun

PLAYBOOK = "deploy.yml"
REPORT_FACT = "inference_service_report"
SECRET_SHOWN = "(holds the API key; not shown)"


class DeployInterrupted(DsctlError):
    """Ctrl-C or SIGTERM stopped the run; the message names the instance that was mid-rollout."""

    exit_status = ExitStatus.INTERRUPTED


def _frozen(overrides: Mapping[str, Mapping[str, Any]] | None) -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({str(name): MappingProxyType(dict(params)) for name, params in (overrides or {}).items()})


@dataclass(frozen=True)
class DeployInputs:
    inventory: Path
    limit: str | None = None
    check: bool = False
    diff: bool = False
    serial: int | None = None
    instances: tuple[str, ...] | None = None  # instance ("chat-1") or service ("chat") names; None: all
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # {service: {parameter: value}}
    restart: bool = False  # restart the chosen instances even when nothing changed
    vault: VaultOptions | None = None
    artifacts_dir: Path | None = None
    # Variables laid over the inventory's, per host (dsctl upgrade: the target or previous dsctl_*_version).
    host_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_playbook_options(serial=self.serial, vault=self.vault)
        object.__setattr__(self, "overrides", _frozen(self.overrides))
        if self.instances is not None:
            object.__setattr__(self, "instances", tuple(self.instances))

    def extra_vars(self, plan: DeployPlan) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.serial:
            extra[deploy_plan.SERIAL_VAR] = self.serial
        if self.overrides:
            extra[deploy_plan.OVERRIDES_VAR] = {name: dict(params) for name, params in self.overrides.items()}
        if plan.only is not None:
            extra[deploy_plan.ONLY_VAR] = list(plan.only)
        if self.restart:
            extra[deploy_plan.FORCE_RESTART_VAR] = True
        if plan.host_plans is not None:
            extra[host_plan.PLAN_VAR] = plan.host_plans
        return extra


@dataclass(frozen=True)
class DeployedInstance:
    host: str
    instance: str
    engine: str
    npus: str
    port: int
    status: str  # restarted, unchanged, rolled back, failed, would restart, checked, unreachable, not reached
    endpoint: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class DeployResult:
    instances: tuple[DeployedInstance, ...]
    check_mode: bool
    exit_status: ExitStatus
    errors: tuple[str, ...]
    rerun: tuple[str, ...]
    run: PlaybookRun = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"instances": [row.to_dict() for row in self.instances], "rerun": list(self.rerun),
                "artifacts": str(self.run.artifacts), "check_mode": self.check_mode}


@dataclass(frozen=True)
class RenderedFile:
    host: str
    instance: str
    path: str
    mode: str
    content: str  # SECRET_SHOWN for files holding the API key

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class RenderResult:
    files: tuple[RenderedFile, ...]

    def to_dict(self) -> list[dict[str, Any]]:
        """The envelope's data: the list of files (its shape from before the verb layer)."""
        return [item.to_dict() for item in self.files]


class RolloutTracker:
    """Follows the events for the instance each host is working on: inference_service's task names carry the
    instance name ("Read the deployed fingerprint of chat-1"), and its report fact marks an instance done."""

    def __init__(self, plan: DeployPlan):
        self._patterns = {
            host: [(planned.instance.name, re.compile(rf"(?<![\w-]){re.escape(planned.instance.name)}(?![\w-])"))
                   for planned in plan.of_host(host)]
            for host in {planned.host for planned in plan.instances}}
        self.current: dict[str, tuple[str, str]] = {}  # host -> (instance, last task)
        self.reported: dict[str, set[str]] = {}

    def __call__(self, event: Mapping[str, Any]) -> None:
        host = str(event.get("host") or "")
        if host not in self._patterns:
            return
        if event.get("event") == "runner_start":
            task = str(event.get("task") or "")
            for name, pattern in self._patterns[host]:
                if pattern.search(task):
                    self.current[host] = (name, task)
                    break
            else:
                if host in self.current:
                    self.current[host] = (self.current[host][0], task)
        report = (event.get("facts") or {}).get(REPORT_FACT)
        if isinstance(report, Mapping):
            self.reported.setdefault(host, set()).update(str(name) for name in report)

    def mid_rollout(self) -> list[tuple[str, str, str]]:
        """(host, instance, last task) of every instance started but not reported."""
        return [(host, name, task) for host, (name, task) in sorted(self.current.items())
                if name not in self.reported.get(host, set())]

    def interrupted(self) -> DeployInterrupted:
        busy = self.mid_rollout()
        if not busy:
            return DeployInterrupted("deploy stopped before any instance was being rolled out")
        where = "; ".join(f"{name} on {host} (at: {task})" for host, name, task in busy)
        return DeployInterrupted(f"deploy stopped during the rollout of {where}; run the same dsctl deploy "
                                 "again to finish or roll back that instance")


def prepare(inputs: DeployInputs, *, read: Fleet | None = None) -> DeployPlan:
    """Read and validate the fleet (``read``: the one the calling command read already), then plan: every problem
    is one line before any host is contacted."""
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit, read=read).with_vars(
        inputs.host_vars)
    fleet.check_gateways()  # the gateway play runs after every instance rolled out: its problems are found here
    addresses = {host: fleet.address(host) for host in fleet.settings}
    try:
        groups = host_plan.plan_groups(fleet.settings, addresses, only=inputs.instances)
    except MultiNodeError as refused:
        raise DsctlError(f"dsctl_services: {refused}", refused.exit_status) from None
    plan = plan_deploy(fleet.settings, addresses, overrides=inputs.overrides, instances=inputs.instances,
                       groups=[instance for _, instance in groups])
    return dataclasses.replace(plan, host_plans=fleet.plan(overrides=inputs.overrides, only=plan.only, groups=groups),
                               groups=tuple(groups))


def render(inputs: DeployInputs) -> RenderResult:
    """What deploy would write on each host (``--limit`` host names only), secrets masked; no host contacted."""
    plan = prepare(inputs)
    hosts = set(inputs.limit.split(",")) if inputs.limit else None
    files = []
    for host, settings in plan.settings.items():
        if hosts is not None and host not in hosts:
            continue
        rendered = service_render.render_host(
            settings.services, npu_count=settings.dsctl_npu_count, env=settings.environment,
            config_dir=settings.dsctl_service_config_dir, log_dir=settings.dsctl_service_log_dir,
            install_path=settings.dsctl_install_path)
        for planned in plan.of_host(host):
            name = planned.instance.name
            files += [RenderedFile(host=host, instance=name, path=item.path, mode=f"0{item.mode:o}",
                                   content=SECRET_SHOWN if item.secret else item.content)
                      for item in rendered[name]]
    for host, nodes in host_plan.rendered_nodes(plan.settings, list(plan.groups)).items():
        if hosts is not None and host not in hosts:
            continue
        files += [RenderedFile(host=host, instance=node["name"], path=item["path"], mode=item["mode"],
                               content=item["content"]) for node in nodes for item in node["files"]]
    return RenderResult(files=tuple(files))


def deploy(runner: PlaybookRunner, inputs: DeployInputs, progress: ProgressSink = no_progress, *,
           stop: threading.Event | None = None, read: Fleet | None = None) -> DeployResult:
    """``stop`` (set from another thread) interrupts the run as Ctrl-C does (tune's trial slots); ``read``: the
    fleet the calling command read already (upgrade, tune), not read again."""
    plan = prepare(inputs, read=read)
    tracker = RolloutTracker(plan)

    def on_event(event: Mapping[str, Any]) -> None:
        tracker(event)
        progress(event)

    try:
        run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=inputs.check, diff=inputs.diff,
                         extra_vars=inputs.extra_vars(plan), vault=inputs.vault, on_event=on_event,
                         artifacts_dir=inputs.artifacts_dir, **({"stop": stop} if stop is not None else {}))
    except KeyboardInterrupt:  # the runner stopped ansible-playbook first
        raise tracker.interrupted() from None
    rows = []
    for name in sorted(run.hosts):
        outcome = run.hosts[name]
        reported = outcome.facts.get(REPORT_FACT, {})
        for planned in plan.of_host(name):
            status = reported.get(planned.instance.name) or (
                "unreachable" if outcome.status == "unreachable" else "checked" if inputs.check else "not reached")
            rows.append(DeployedInstance(host=name, instance=planned.instance.name, engine=planned.spec.engine,
                                         npus=planned.instance.visible_devices, port=planned.instance.port,
                                         status=status, endpoint=planned.endpoint))
        for _, instance in plan.groups:
            node = next((node for node in instance.nodes if node.host == name), None)
            if node is None:
                continue
            status = reported.get(instance.name) or (
                "unreachable" if outcome.status == "unreachable" else "checked" if inputs.check else "not reached")
            role = "head" if node.is_head else f"node {node.node_rank}"
            endpoint = f"http://{node.address}:{instance.port}/v1" if node.is_head else f"(headless, {role})"
            rows.append(DeployedInstance(host=name, instance=instance.name, engine=instance.engine,
                                         npus=node.visible_devices, port=instance.port, status=status,
                                         endpoint=endpoint))
    return DeployResult(instances=tuple(rows), check_mode=inputs.check, exit_status=run.exit_status(),
                        errors=tuple(failure_lines(run)), rerun=tuple(hosts_to_rerun(run)), run=run)
