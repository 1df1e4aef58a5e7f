"""The provision verb: install driver, firmware, CANN, the NPU environment and the serving stack; validate."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters import upgrade_state
from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.inventory import host_plan
from dsctl.core.upgrade.state import unfinished_upgrade
from dsctl.errors import ExitStatus, UsageError
from dsctl.services.fleet import Fleet, check_playbook_options, load_fleet
from dsctl.services.ports import PlaybookRunner, ProgressSink, no_progress
from dsctl.services.runs import REPORT_FACT, failure_lines, hosts_to_rerun, versions_summary

PLAYBOOK = "provision.yml"
DOWNGRADES_FACT = "ascend_preflight_downgrades"  # set by ascend_preflight: the parts moved to an older version
# The tags of playbooks/provision.yml's roles (tests/unit keeps this equal to the playbook), and Ansible's special
# ones (https://docs.ansible.com/ansible/latest/playbook_guide/playbooks_tags.html#special-tags): a tag the play
# does not have would reach every host, run the preflight (tagged always) and then nothing.
TAGS = ("driver", "network", "cann", "env", "serving", "validate")
SPECIAL_TAGS = ("all", "always", "never", "tagged", "untagged")


@dataclass(frozen=True)
class ProvisionInputs:
    inventory: Path
    limit: str | None = None
    check: bool = False
    diff: bool = False
    tags: str | None = None
    forks: int | None = None
    vault: VaultOptions | None = None
    artifacts_dir: Path | None = None  # None: a new run directory under $XDG_STATE_HOME/dsctl/runs
    # Variables laid over the inventory's, per host (dsctl upgrade: the target or previous dsctl_*_version).
    host_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Allow a stack older than a host runs (ascend_preflight refuses it otherwise); the downgraded hosts' instances
    # are restarted onto it afterwards, so none keeps serving on the stack provision replaced.
    allow_downgrade: bool = False
    # dsctl upgrade restarts (and gates) the instances itself, batch by batch.
    restart_downgraded: bool = True
    upgrade_guard: bool = True  # refuse while an upgrade of the fleet is half done (dsctl upgrade's own runs: off)

    def __post_init__(self) -> None:
        check_playbook_options(forks=self.forks, tags=self.tags, vault=self.vault)
        for tag in (part.strip() for part in (self.tags or "").split(",")):
            if tag and tag not in TAGS + SPECIAL_TAGS:
                raise UsageError(f"--tags {tag}: provision has no such tag; use one or more of {', '.join(TAGS)}")


@dataclass(frozen=True)
class ProvisionedHost:
    host: str
    driver: str
    firmware: str
    cann: str
    cann_others: str
    torch_npu: str
    vllm_ascend: str
    changed: int
    status: str  # ok, changed, pending-reboot, failed, unreachable
    stack: dict[str, Any] | None  # the desired stack the host was provisioned to
    downgrades: list[str] = field(default_factory=list)  # "CANN 8.5.0 -> 8.3.RC2": what --allow-downgrade moved back
    # The NPU env written to the host: each value with origin, source, confidence, warning (annotated_env).
    env: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class ProvisionResult:
    hosts: tuple[ProvisionedHost, ...]
    check_mode: bool
    exit_status: ExitStatus
    errors: tuple[str, ...]
    rerun: tuple[str, ...]
    run: PlaybookRun = field(repr=False)
    restarted: tuple[str, ...] = ()  # "host/instance" restarted onto a downgraded stack

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [host.to_dict() for host in self.hosts], "rerun": list(self.rerun),
                "artifacts": str(self.run.artifacts), "check_mode": self.check_mode,
                "restarted": list(self.restarted)}


def provision(runner: PlaybookRunner, inputs: ProvisionInputs, progress: ProgressSink = no_progress, *,
              read: Fleet | None = None) -> ProvisionResult:
    """``read``: the fleet the calling command has read already (dsctl upgrade), not read again."""
    read = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit, read=read)
    fleet = read.with_vars(inputs.host_vars)
    if inputs.upgrade_guard and not inputs.check:
        path = upgrade_state.fleet_state_path(inputs.inventory)
        refusal = unfinished_upgrade(upgrade_state.read_if_any(path), str(path), inputs.inventory)
        if refusal:
            raise UsageError(refusal)
    extra: dict[str, Any] = {host_plan.PLAN_VAR: fleet.plan()}
    if inputs.allow_downgrade:
        extra[host_plan.ALLOW_DOWNGRADE_VAR] = True
    fleet.check_controller_files()  # last of the checks (the inventory's own come first), before the play
    run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=inputs.check, diff=inputs.diff,
                     tags=inputs.tags, forks=inputs.forks, vault=inputs.vault, on_event=progress,
                     extra_vars=extra, artifacts_dir=inputs.artifacts_dir)
    hosts = []
    for name in sorted(run.hosts):
        outcome = run.hosts[name]
        report = outcome.facts.get(REPORT_FACT, {})
        status = outcome.status
        if status in ("ok", "changed") and report.get("status") == "pending-reboot":
            status = "pending-reboot"
        settings = fleet.settings.get(name)
        stack = settings.stack.to_dict() if settings is not None and settings.stack else None
        env = settings.environment_sources if settings is not None else []
        downgrades = [str(part) for part in outcome.facts.get(DOWNGRADES_FACT) or []]
        hosts.append(ProvisionedHost(host=name, **versions_summary(report), changed=outcome.changed, status=status,
                                     stack=stack, env=env, downgrades=downgrades))
    result = ProvisionResult(hosts=tuple(hosts), check_mode=inputs.check, exit_status=run.exit_status(),
                             errors=tuple(failure_lines(run)), rerun=tuple(hosts_to_rerun(run)), run=run)
    moved = [host.host for host in hosts if host.downgrades and host.status in ("ok", "changed")]
    if not moved or inputs.check or not inputs.restart_downgraded or result.exit_status != ExitStatus.OK:
        return result
    return _restart_downgraded(runner, inputs, fleet, result, moved, progress, read)


def _restart_downgraded(runner: PlaybookRunner, inputs: ProvisionInputs, fleet: Fleet, result: ProvisionResult,
                        moved: list[str], progress: ProgressSink, read: Fleet) -> ProvisionResult:
    """Restart the instances of the downgraded hosts onto the stack now active (health-gated, as deploy does)."""
    from dsctl.services import deploy as deploy_verb

    with_instances = [host for host in moved if fleet.settings[host].services]
    if not with_instances:
        return result
    deployed = deploy_verb.deploy(runner, deploy_verb.DeployInputs(
        inventory=inputs.inventory, limit=",".join(with_instances), restart=True, vault=inputs.vault,
        host_vars={host: inputs.host_vars[host] for host in with_instances if host in inputs.host_vars}), progress,
        read=read)
    restarted = tuple(f"{row.host}/{row.instance}" for row in deployed.instances if row.status == "restarted")
    errors = (*result.errors, *(f"restart onto the downgraded stack: {line}" for line in deployed.errors))
    status = result.exit_status if deployed.exit_status == ExitStatus.OK else deployed.exit_status
    return dataclasses.replace(result, restarted=restarted, errors=errors, exit_status=status)
