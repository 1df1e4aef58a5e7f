"""Drive the gateway (``playbooks/gateway.yml``): sync it with the instances, drain or undrain instances.

What the upgrade verb calls around each batch::

    gateway.drain(inventory, ["lab-01/chat-0", "lab-01/chat-1"], vault=vault)    # out, in-flight requests done
    ...stop, upgrade, restart, health gate...
    gateway.undrain(inventory, ["lab-01/chat-0", "lab-01/chat-1"], vault=vault)  # back in once /health answers

Each returns a `GatewayResult`: the run, each gateway's members (id, state, url) and the failures as one line
each.  A failed drain (the instance kept requests in flight past ``dsctl_gateway.drain_timeout_s``) leaves the
instance drained but running: the caller must not stop it, and undrains it or retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters.ansible_run import EventHandler, PlaybookRun, run_playbook
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.serving.gateway import DRAIN_VAR, UNDRAIN_VAR, member_ids
from dsctl.errors import ExitStatus

PLAYBOOK = "gateway.yml"
REPORT_FACT = "gateway_report"


@dataclass
class GatewayResult:
    run: PlaybookRun
    gateways: dict[str, dict[str, Any]] = field(default_factory=dict)  # gateway name -> {members, drained}
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.run.exit_status() == ExitStatus.OK

    def drained(self) -> set[str]:
        """Members drained on every gateway that reported (an instance is out only when out of all of them)."""
        sets = [set(report.get("drained") or []) for report in self.gateways.values()]
        return set.intersection(*sets) if sets else set()


def _result(run: PlaybookRun) -> GatewayResult:
    result = GatewayResult(run)
    for name, host in run.hosts.items():
        report = host.facts.get(REPORT_FACT)
        if isinstance(report, dict):
            result.gateways[str(report.get("gateway", name))] = report
        if host.status in ("failed", "unreachable"):
            where = f" ({host.failed_label})" if host.failed_label else ""
            result.errors.append(f"{name}{where}: {host.failed_msg or host.status}")
    if not result.ok and not result.errors:
        result.errors.append(run.error or f"{PLAYBOOK} exited {run.rc}; see {run.log}")
    return result


def sync(inventory: Path, *, drain: Sequence[str] = (), undrain: Sequence[str] = (),
         vault: VaultOptions | None = None, on_event: EventHandler | None = None,
         runner: Any = None) -> GatewayResult:
    """Bring every gateway of the inventory in line with the instances, draining and undraining as named.

    ``vault``: the verb's vault options, as for every other playbook (the inventory's vault-encrypted
    group_vars are loaded by this play too, gateway or none).  ``runner``: the verb's PlaybookRunner port
    (dsctl.services.ports), whose run the play goes through with the rest of the verb's plays (its timeout, its
    artifacts); None: ansible_run.run_playbook itself, for a caller without one."""
    extra: dict[str, Any] = {}
    if drain:
        extra[DRAIN_VAR] = member_ids(list(drain), DRAIN_VAR)
    if undrain:
        extra[UNDRAIN_VAR] = member_ids(list(undrain), UNDRAIN_VAR)
    play = runner.run if runner is not None else run_playbook
    run = play(PLAYBOOK, inventory, extra_vars=extra or None, vault=vault, on_event=on_event)
    return _result(run)


def drain(inventory: Path, members: Sequence[str], **options: Any) -> GatewayResult:
    """Take ``members`` (host/instance) out of every gateway and wait until none has a request in flight."""
    return sync(inventory, drain=members, **options)


def undrain(inventory: Path, members: Sequence[str], **options: Any) -> GatewayResult:
    """Put ``members`` back into every gateway once each one's /health answers 200."""
    return sync(inventory, undrain=members, **options)
