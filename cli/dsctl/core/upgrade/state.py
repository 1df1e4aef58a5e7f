"""The run state of an upgrade (pure): where every host is, written as JSON after every step.

Per host the stages go, in this order (a batch's hosts move together):

    pending -> drained -> installed -> switched -> restarted -> gated -> undrained      (upgraded)

and on a failure at any of them:

    ... -> rolling-back -> rolled-back   (switched back to the previous stack, restarted, verified, undrained)

The file is rewritten after every step (dsctl.adapters.upgrade_state writes it atomically), so

* ``--resume`` finds the first batch not finished and re-enters each host at the stage after the one it
  reached (every step is idempotent: provision and deploy converge, drain and undrain are set operations); hosts
  of a batch that was rolled back are upgraded again from the start;
* ``--rollback`` knows what to undo: a host that got past ``drained`` is switched back, every touched host ends
  undrained on its previous stack; hosts never reached are left alone.

One fleet, one state: the file is keyed by the inventory resolved (`inventory_source`, `state_dir_name`), so every
spelling of an inventory finds the same upgrade, and `unfinished_upgrade` is the refusal a provision of a fleet
half-way through an upgrade gets.  Where the file lives and how it is read and written: dsctl.adapters.upgrade_state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from dsctl.core.upgrade.plan import UpgradePlan, Versions
from dsctl.errors import DsctlError

STATE_VERSION = 1
STATE_FILE = "state.json"
LOCK_FILE = "state.lock"  # flock()ed while an upgrade of the fleet runs (adapters/state_files)
# Files Ansible skips in a directory inventory (its INVENTORY_IGNORE_EXTS default).
IGNORED_SUFFIXES = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
STAGES = ("pending", "drained", "installed", "switched", "restarted", "gated", "undrained")
ROLLING_BACK, ROLLED_BACK = "rolling-back", "rolled-back"
DONE = "undrained"
# Host statuses, for the tables
PENDING, UPGRADING, UPGRADED, FAILED, RESTORED = "pending", "upgrading", "upgraded", "failed", "rolled back"


class StateError(DsctlError):
    """The state file cannot be used (another version, corrupt, or a step out of order)."""


@dataclass
class HostRun:
    host: str
    source: Versions
    target: Versions
    stage: str = "pending"
    status: str = PENDING
    history: list[dict[str, Any]] = field(default_factory=list)  # {"stage", "at"}
    error: dict[str, str] | None = None  # {"stage", "reason"} of the failure that stopped this host
    gate: dict[str, Any] | None = None  # the probe gate's result (GateResult.to_dict) and its summary line

    @property
    def touched(self) -> bool:
        return self.stage != "pending"

    @property
    def past_drain(self) -> bool:
        """The host's stack may have changed: a rollback must switch it back."""
        return self.stage in STAGES[2:] or self.stage == ROLLING_BACK

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "from": self.source.to_dict(), "to": self.target.to_dict(), "stage": self.stage,
                "status": self.status, "history": list(self.history), "error": self.error, "gate": self.gate}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostRun:
        return cls(host=str(data["host"]), source=Versions.from_dict(data["from"]),
                   target=Versions.from_dict(data["to"]), stage=str(data["stage"]), status=str(data["status"]),
                   history=list(data.get("history") or []), error=data.get("error"), gate=data.get("gate"))


@dataclass
class UpgradeState:
    inventory: str
    batches: list[list[str]]
    hosts: dict[str, HostRun]
    max_regression: str
    created: str
    updated: str
    baseline: dict[str, Any] = field(default_factory=dict)  # "host/instance" -> probe metrics
    halted: dict[str, str] | None = None  # {"host", "stage", "reason"} of the failure that halted the run
    rollback: bool = False  # a --rollback of the whole fleet is (or was) under way
    # Issue 20: each host's versions as the inventory resolved them when the upgrade began (a --resume after the
    # inventory changed is refused), and the variables the finished upgrade wrote into it ({var: [from, to]}).
    inventory_versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    inventory_written: dict[str, list[str]] = field(default_factory=dict)
    inventory_changes: dict[str, str] = field(default_factory=dict)  # what the upgrade writes once every host is done
    slo: str = ""  # --slo as canonical terms (slo_spec labels, comma-joined): a --resume gates on the same bounds

    # ------------------------------------------------------------------ building and reading

    @classmethod
    def new(cls, plan: UpgradePlan, *, inventory: str, max_regression: str, now: str, slo: str = "") -> UpgradeState:
        hosts = {item.host: HostRun(item.host, item.source, item.target) for item in plan.hosts
                 if any(item.host in batch for batch in plan.batches)}
        return cls(inventory=inventory, batches=[list(b) for b in plan.batches], hosts=hosts,
                   max_regression=max_regression, created=now, updated=now, slo=slo)

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "inventory": self.inventory, "batches": self.batches,
                "hosts": {name: run.to_dict() for name, run in self.hosts.items()},
                "max_regression": self.max_regression, "created": self.created, "updated": self.updated,
                "baseline": self.baseline, "halted": self.halted, "rollback": self.rollback,
                "inventory_versions": self.inventory_versions, "inventory_written": self.inventory_written,
                "inventory_changes": self.inventory_changes, "slo": self.slo}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "the state file") -> UpgradeState:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"{source}: not JSON ({exc.msg} at line {exc.lineno}); remove it to start over") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise StateError(f"{source}: not a version {STATE_VERSION} upgrade state; remove it to start over")
        try:
            hosts = {str(name): HostRun.from_dict(run) for name, run in data["hosts"].items()}
            state = cls(inventory=str(data["inventory"]), batches=[list(map(str, b)) for b in data["batches"]],
                        hosts=hosts, max_regression=str(data["max_regression"]), created=str(data["created"]),
                        updated=str(data["updated"]), baseline=dict(data.get("baseline") or {}),
                        halted=data.get("halted"), rollback=bool(data.get("rollback")),
                        inventory_versions=dict(data.get("inventory_versions") or {}), slo=str(data.get("slo") or ""),
                        inventory_written={str(k): list(v) for k, v in (data.get("inventory_written") or {}).items()},
                        inventory_changes={str(k): str(v) for k, v in (data.get("inventory_changes") or {}).items()})
        except (KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"{source}: a field is missing or malformed ({exc}); remove it to start over") from None
        for run in state.hosts.values():
            if run.stage not in (*STAGES, ROLLING_BACK, ROLLED_BACK):
                raise StateError(f"{source}: host {run.host} has unknown stage {run.stage!r}")
        # An edited file: every batch, table and rollback looks its hosts up in "hosts" (else a KeyError).
        for number, batch in enumerate(state.batches, start=1):
            for host in batch:
                if host not in state.hosts:
                    raise StateError(f"{source}: batch {number} names host {host}, which \"hosts\" does not "
                                     "list; restore the file or remove it to start over")
        return state

    # ------------------------------------------------------------------ transitions

    def _run(self, host: str) -> HostRun:
        if host not in self.hosts:
            raise StateError(f"host {host} is not part of this upgrade")
        return self.hosts[host]

    def advance(self, host: str, stage: str, now: str) -> None:
        """Record that ``host`` reached ``stage``: only the stage right after its current one is accepted."""
        run = self._run(host)
        if stage not in STAGES[1:]:
            raise StateError(f"{stage!r} is not an upgrade stage")
        current = run.stage if run.stage in STAGES else None
        if current is None or STAGES.index(stage) != STAGES.index(current) + 1:
            raise StateError(f"{host}: cannot go from {run.stage} to {stage}")
        run.stage = stage
        run.status = UPGRADED if stage == DONE else UPGRADING
        run.history.append({"stage": stage, "at": now})
        self.updated = now

    def fail(self, host: str, stage: str, reason: str, now: str) -> None:
        """``host`` failed at ``stage`` (the stage it was attempting): the run halts and the host rolls back."""
        run = self._run(host)
        run.error = {"stage": stage, "reason": reason}
        run.status = FAILED
        run.history.append({"stage": f"failed at {stage}", "at": now})
        if self.halted is None:
            self.halted = {"host": host, "stage": stage, "reason": reason}
        self.updated = now

    def rolling_back(self, host: str, now: str) -> None:
        run = self._run(host)
        if run.stage == ROLLED_BACK:
            raise StateError(f"{host}: already rolled back")
        if run.stage != ROLLING_BACK:
            run.history.append({"stage": ROLLING_BACK, "from_stage": run.stage, "at": now})
        run.stage = ROLLING_BACK
        self.updated = now

    def rolled_back(self, host: str, now: str) -> None:
        run = self._run(host)
        run.stage = ROLLED_BACK
        run.status = RESTORED if run.error is None or self.rollback else f"{RESTORED} ({run.error['stage']})"
        run.history.append({"stage": ROLLED_BACK, "at": now})
        self.updated = now

    def rollback_failed(self, host: str, reason: str, now: str) -> None:
        """The rollback itself failed: the host needs a person; it stays in rolling-back for --rollback."""
        run = self._run(host)
        run.status = FAILED
        run.error = {"stage": ROLLING_BACK, "reason": reason} if run.error is None else {
            **run.error, "rollback": reason}
        run.history.append({"stage": "rollback failed", "at": now})
        self.updated = now

    # ------------------------------------------------------------------ what is next

    def resumable(self) -> bool:
        return not self.finished() and not self.rollback

    def finished(self) -> bool:
        return all(run.stage == DONE for run in self.hosts.values())

    def next_batch(self) -> tuple[int, list[str]] | None:
        """The first batch with a host not upgraded (index, hosts), or None when every host is."""
        for index, batch in enumerate(self.batches):
            if any(self.hosts[host].stage != DONE for host in batch):
                return index, list(batch)
        return None

    def restart_batch(self, hosts: Sequence[str], now: str) -> None:
        """Before (re-)entering a batch on --resume: rolled-back hosts start over from pending, the halt is lifted."""
        for host in hosts:
            run = self._run(host)
            if run.stage == ROLLED_BACK:
                run.stage, run.status, run.error, run.gate = "pending", PENDING, None, None
                run.history.append({"stage": "pending (resumed)", "at": now})
        self.halted = None
        self.updated = now

    def batch_stage(self, hosts: Sequence[str]) -> str:
        """The stage every host of the batch has reached (the least advanced one)."""
        stages = [self._run(host).stage for host in hosts]
        if any(stage not in STAGES for stage in stages):
            return ROLLING_BACK
        return min(stages, key=STAGES.index)

    def to_undo(self) -> list[HostRun]:
        """Hosts --rollback must return to their previous stack: touched and not already rolled back."""
        return [run for run in self.hosts.values() if run.touched and run.stage != ROLLED_BACK]

    def moved(self) -> list[str]:
        """The hosts an unfinished upgrade left off their previous stack (neither pending nor rolled back), sorted;
        none once every host is upgraded."""
        if self.finished():
            return []
        return sorted(host for host, run in self.hosts.items() if run.stage not in ("pending", ROLLED_BACK))

    def unfinished(self) -> bool:
        """Half done: some hosts on the new stack, the inventory not yet naming it (`moved`)."""
        return bool(self.moved())


def next_stage(stage: str) -> str | None:
    """The stage after ``stage`` (None after the last one)."""
    index = STAGES.index(stage)
    return STAGES[index + 1] if index + 1 < len(STAGES) else None


def inventory_source(files: Iterable[str]) -> str | None:
    """Of the file names in a directory inventory, the one inventory source when there is exactly one (hidden files
    and those Ansible ignores left out): the fleet is then keyed as that file, since Ansible reads the same hosts and
    group_vars either way.  None otherwise."""
    sources = [name for name in files if not name.startswith(".") and not name.endswith(IGNORED_SUFFIXES)]
    return sources[0] if len(sources) == 1 else None


def state_dir_name(key: PurePath) -> str:
    """The directory holding a fleet's state, named by its key (`inventory_source`, the inventory resolved): the
    key's stem and a digest of the whole key."""
    return f"{key.stem}-{hashlib.sha256(str(key).encode()).hexdigest()[:8]}"


def unfinished_upgrade(state: UpgradeState | None, where: str, inventory: str | Path) -> str | None:
    """The line refusing a provision of a fleet whose upgrade (``state``, read from ``where``) is half done: provision
    would move the hosts on the new stack back.  None when there is no state or the upgrade is not half done."""
    moved = state.moved() if state is not None else []
    if not moved:
        return None
    return (f"an upgrade of this inventory is unfinished ({', '.join(moved)} on its new stack; {where}): finish it "
            f"with dsctl upgrade {inventory} --resume or undo it with --rollback before provisioning")
