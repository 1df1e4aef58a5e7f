"""The provision verb: install driver, firmware, CANN, the NPU environment and the serving stack; validate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.errors import ExitStatus
from dsctl.services import host_plan
from dsctl.services.fleet import check_playbook_options, load_fleet
from dsctl.services.ports import PlaybookRunner, ProgressSink, no_progress
from dsctl.services.runs import REPORT_FACT, failure_lines, hosts_to_rerun, versions_summary

PLAYBOOK = "provision.yml"


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

    def __post_init__(self) -> None:
        check_playbook_options(forks=self.forks, tags=self.tags, vault=self.vault)


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

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [host.to_dict() for host in self.hosts], "rerun": list(self.rerun),
                "artifacts": str(self.run.artifacts), "check_mode": self.check_mode}


def provision(runner: PlaybookRunner, inputs: ProvisionInputs, progress: ProgressSink = no_progress
              ) -> ProvisionResult:
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit).with_vars(inputs.host_vars)
    run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=inputs.check, diff=inputs.diff,
                     tags=inputs.tags, forks=inputs.forks, vault=inputs.vault, on_event=progress,
                     extra_vars={host_plan.PLAN_VAR: fleet.plan()},
                     artifacts_dir=inputs.artifacts_dir)
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
        hosts.append(ProvisionedHost(host=name, **versions_summary(report), changed=outcome.changed, status=status,
                                     stack=stack, env=env))
    return ProvisionResult(hosts=tuple(hosts), check_mode=inputs.check, exit_status=run.exit_status(),
                           errors=tuple(failure_lines(run)), rerun=tuple(hosts_to_rerun(run)), run=run)
