"""The upgrade verb: roll a new CANN (with its serving stack, and the HDK when asked) over the fleet, batch by batch
behind the gateway, probe-gated, rolling a failed batch back to the stack it ran (issue 11).

Before anything changes (any problem: nothing touched, one line each, exit 3):
the fleet is read and checked (``dsctl check``: every host answers and is healthy, its versions are the "from"
stack); the plan is made (dsctl.core.upgrade.plan: targets checked against the matrix, packages present in the
source's SHA256SUMS, the previous HDK packages present when the HDK changes, disk for a side-by-side CANN); every
instance to be upgraded gets a baseline probe.

Per batch, the hosts moving together (dsctl.core.upgrade.state records each step in ``state.json``, which
dsctl.adapters.upgrade_state keeps):

    drain (gateway.yml: out of the gateway, in-flight requests finished)
    -> provision limited to the batch with the target versions (playbooks/provision.yml installs the new CANN next
       to the old one, builds the new stack's venv next to the old one, switches latest/, env and venv;
       ascend-interfaces.md s.6.5)
    -> deploy --restart limited to the batch (each instance health-gated)
    -> probe gate: each instance against its baseline within --max-regression (dsctl.core.upgrade.gate)
    -> undrain (back into the gateway once /health answers)

Any failure → the batch's hosts are provisioned with their previous versions (the old CANN and venv are still
installed: a switch, no installer; a changed HDK is reinstalled from the source), restarted, probed (they must
serve), undrained; the run halts, later hosts untouched, and the result names host, stage and reason.

Exit statuses: 0 every host upgraded (or nothing to do); 2 bad options; 3 the preflight refused (nothing
touched); 4 a batch failed in a playbook and was rolled back; 6 the probe gate refused a batch (rolled back);
1 a rollback itself failed (the host needs a person; ``--rollback`` retries); 130 interrupted (``--resume``).

Progress records: ``dsctl_upgrade`` with ``batch`` (1-based), ``batches``, ``canary``, ``host`` (None: the batch),
``stage``, ``elapsed_s`` and ``msg``; the playbooks' own events pass through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from dsctl import data
from dsctl.adapters import gateway as gateway_adapter
from dsctl.adapters import inventory_versions, package_source, upgrade_state
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import sha256sums
from dsctl.core.fleet.versions import same_version
from dsctl.core.inventory import host_plan
from dsctl.core.inventory.deploy_plan import PlannedInstance
from dsctl.core.load import limits
from dsctl.core.load.slo_spec import Slo
from dsctl.core.load.workload import LengthSpec
from dsctl.core.serving.multinode import MultiNodeError
from dsctl.core.serving.service import Instance
from dsctl.core.upgrade import gate
from dsctl.core.upgrade.gate import parse_slos
from dsctl.core.upgrade.plan import (
    VARIABLES,
    BatchSize,
    UpgradePlan,
    Versions,
    check_targets,
    current_versions,
    plan_upgrade,
)
from dsctl.core.upgrade.state import DONE, ROLLED_BACK, STAGES, STATE_FILE, StateError, UpgradeState
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services import check as check_verb
from dsctl.services import deploy as deploy_verb
from dsctl.services import provision as provision_verb
from dsctl.services.fleet import Fleet, load_fleet
from dsctl.services.ports import PlaybookRunner, Prober, ProgressSink, no_progress
from dsctl.services.probe import ProbeConfig, probe

GATE_WARMUP = 2
HEALTHY_STATUSES = ("ok", "warning", "error")  # "error" may be version drift the upgrade is about; judged below
SICK_COMPONENTS = ("npu", "system")  # error findings there mean the host is not fit to be upgraded


class UpgradeInterrupted(DsctlError):
    exit_status = ExitStatus.INTERRUPTED


# --------------------------------------------------------------------------------------------- ports


class GatewayResultLike(Protocol):
    @property
    def ok(self) -> bool: ...

    errors: list[str]
    gateways: dict[str, dict[str, Any]]


class Gateway(Protocol):
    """What the verb asks of the gateway (dsctl.adapters.gateway; tests hand in their own)."""

    def drain(self, inventory: Path, members: Sequence[str], **options: Any) -> GatewayResultLike: ...

    def undrain(self, inventory: Path, members: Sequence[str], **options: Any) -> GatewayResultLike: ...


# --------------------------------------------------------------------------------------------- inputs, results


@dataclass(frozen=True)
class GateWorkload:
    """The probe every instance gets for the baseline and again for the gate (closed loop, small)."""

    requests: int = 24
    concurrency: int = 4
    prompt_tokens: str = "128"
    output_tokens: str = "32"
    timeout: float = 120.0


@dataclass(frozen=True)
class UpgradeInputs:
    inventory: Path
    cann: str | None = None
    driver: str | None = None
    firmware: str | None = None
    vllm_ascend: str | None = None
    batch: str = "1"
    canary: int | None = None
    max_regression: str = gate.DEFAULT
    slos: tuple[Slo, ...] = ()  # --slo: absolute bounds on the gate probe (parse_slos)
    check: bool = False
    resume: bool = False
    rollback: bool = False
    workload: GateWorkload = field(default_factory=GateWorkload)
    vault: VaultOptions | None = None
    state_dir: Path | None = None  # None: $XDG_STATE_HOME/dsctl/upgrades/<inventory>-<hash>

    def __post_init__(self) -> None:
        if self.resume and self.rollback:
            raise UsageError("--resume: give it or --rollback, not both")
        versions = self.overrides()
        if (self.resume or self.rollback) and versions.as_host_vars():
            which = "--resume" if self.resume else "--rollback"
            raise UsageError(f"{which}: the versions come from the state file; leave out --cann/--driver/--firmware/"
                             "--vllm-ascend")
        if self.firmware and not self.driver:
            raise UsageError("--firmware: give --driver with it (firmware is upgraded with its driver)")
        BatchSize.parse(self.batch)
        gate.parse_max_regression(self.max_regression)
        if self.canary is not None and self.canary < 0:
            raise UsageError(f"--canary {self.canary}: must not be negative")
        w = self.workload
        if w.requests < 1 or w.concurrency < 1:
            raise UsageError("--probe-requests and --probe-concurrency: must be at least 1")
        try:  # the bounds of every probe (dsctl.core.load.limits; the command line's callbacks apply them too)
            limits.check("--probe-requests", w.requests, limits.MAX_REQUESTS, "requests of one probe")
            limits.check("--probe-concurrency", w.concurrency, limits.MAX_CONCURRENCY, "requests in flight")
            if self.canary is not None:
                limits.check("--canary", self.canary, limits.MAX_HOSTS, "hosts")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        # Parsed here, not at the first baseline probe: after dsctl check has contacted every host.
        for option, spec in (("--probe-prompt-tokens", w.prompt_tokens), ("--probe-output-tokens", w.output_tokens)):
            try:
                LengthSpec.parse(spec, option)
            except ValueError as bad:
                raise UsageError(str(bad)) from None

    def overrides(self) -> Versions:
        return Versions(driver=self.driver, firmware=self.firmware, cann=self.cann, vllm_ascend=self.vllm_ascend)

    def state_path(self) -> Path:
        """The fleet's state file, keyed by `upgrade_state.fleet_key`: one fleet, one state, however its inventory
        is spelt."""
        if self.state_dir is not None:
            return self.state_dir / STATE_FILE
        return upgrade_state.fleet_state_path(self.inventory)

    def legacy_state_path(self) -> Path:
        """Where dsctl before issue 19 kept it (the path as given, made absolute), still read if present."""
        if self.state_dir is not None:
            return self.state_dir / STATE_FILE
        return upgrade_state.state_path(Path(self.inventory).expanduser().absolute())


@dataclass(frozen=True)
class UpgradedHost:
    host: str
    batch: int | None  # 1-based; None: not in any batch (already on its target)
    source: str  # the pieces that change, as they are: "CANN 8.3.RC2, vllm-ascend v0.11.0"
    target: str  # and as they will be: "CANN 8.5.0, vllm-ascend v0.13.0"
    probe: str  # the gate's changes against the baseline ("chat-0: ttft +3.2%, throughput -1.0%"), "-" if not gated
    stage: str
    status: str  # upgraded, rolled back (<stage>), failed, pending, unchanged, would upgrade
    error: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)  # {"from": {...}, "to": {...}}: all four versions
    gate: dict[str, Any] | None = None  # per instance: the gate's checks with baseline and current numbers

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "batch": self.batch, "from": self.source, "to": self.target, "probe": self.probe,
                "stage": self.stage, "status": self.status, "error": self.error, "versions": self.versions,
                "gate": self.gate}


@dataclass(frozen=True)
class UpgradeResult:
    hosts: tuple[UpgradedHost, ...]
    check_mode: bool
    exit_status: ExitStatus
    errors: tuple[str, ...]
    state_file: str | None
    halted: dict[str, str] | None = None
    plan: dict[str, Any] | None = None
    inventory: tuple[str, ...] = ()  # what was (or, with --check, would be) written into the inventory

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [row.to_dict() for row in self.hosts], "check_mode": self.check_mode,
                "state_file": self.state_file, "halted": self.halted, "plan": self.plan,
                "inventory": list(self.inventory)}


class _BatchFailed(Exception):
    def __init__(self, host: str, stage: str, reason: str, status: ExitStatus):
        super().__init__(reason)
        self.host, self.stage, self.reason, self.status = host, stage, reason, status


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------- the run


class _Run:
    """One invocation: the fleet, the ports, the state and its file."""

    def __init__(self, runner: PlaybookRunner, prober: Prober, gateway: Gateway, inputs: UpgradeInputs,
                 progress: ProgressSink, fleet: Fleet, state: UpgradeState, path: Path):
        self.runner, self.prober, self.gateway, self.inputs = runner, prober, gateway, inputs
        self.progress, self.fleet, self.state = progress, fleet, state
        self.path = path
        self.limits = gate.parse_max_regression(state.max_regression)
        self.slos = parse_slos(state.slo)
        self.instances = _instances(fleet)
        self.started = time.monotonic()
        self.batch_index = 0

    # ---------------------------------------------------------------- plumbing

    def save(self) -> None:
        upgrade_state.write(self.path, self.state)

    def say(self, hosts: Sequence[str] | None, stage: str, msg: str) -> None:
        batches = len(self.state.batches)
        self.progress({"event": "dsctl_upgrade", "batch": self.batch_index + 1, "batches": batches,
                       "canary": self.batch_index == 0 and batches > 1, "host": ",".join(hosts) if hosts else None,
                       "stage": stage, "elapsed_s": round(time.monotonic() - self.started, 1), "msg": msg})

    def members(self, hosts: Sequence[str]) -> list[str]:
        return [f"{item.host}/{item.instance.name}" for host in hosts for item in self.instances.get(host, [])]

    def versions_vars(self, hosts: Sequence[str], which: str) -> dict[str, dict[str, str]]:
        runs = self.state.hosts
        return {host: (runs[host].target if which == "target" else runs[host].source).as_host_vars()
                for host in hosts}

    # ---------------------------------------------------------------- steps

    def drain(self, hosts: Sequence[str]) -> None:
        members = self.members(hosts)
        if not members:
            return
        result = self.gateway.drain(self.inputs.inventory, members, vault=self.inputs.vault, on_event=self.progress,
                                    runner=self.runner)
        if not result.ok:
            raise _BatchFailed(hosts[0], "drained", "drain failed: " + "; ".join(result.errors),
                               ExitStatus.PLAYBOOK_FAILED)
        if not result.gateways:
            self.say(hosts, "drained", "no gateway in the inventory: clients of these instances see them stop")

    def undrain(self, hosts: Sequence[str]) -> GatewayResultLike | None:
        members = self.members(hosts)
        if not members:
            return None
        return self.gateway.undrain(self.inputs.inventory, members, vault=self.inputs.vault, on_event=self.progress,
                                    runner=self.runner)

    def provision(self, hosts: Sequence[str], which: str) -> None:
        # Going back to the source stack is a downgrade the rollback exists for; the verb restarts and probes the
        # instances itself.
        inputs = provision_verb.ProvisionInputs(inventory=self.inputs.inventory, limit=",".join(hosts),
                                                vault=self.inputs.vault, host_vars=self.versions_vars(hosts, which),
                                                allow_downgrade=which == "source", restart_downgraded=False,
                                                upgrade_guard=False)
        result = provision_verb.provision(self.runner, inputs, self.progress, read=self.fleet)
        _raise_for(result.exit_status, result.errors, hosts, "installed", [h.host for h in result.hosts
                                                                          if h.status in ("failed", "unreachable")])
        pending = [h.host for h in result.hosts if h.status == "pending-reboot"]
        if pending:
            raise _BatchFailed(pending[0], "installed", "the host waits for a reboot the inventory does not allow "
                               "(dsctl_allow_reboot)", ExitStatus.PLAYBOOK_FAILED)

    def restart(self, hosts: Sequence[str], which: str) -> None:
        if not any(self.instances.get(host) for host in hosts):
            return
        inputs = deploy_verb.DeployInputs(inventory=self.inputs.inventory, limit=",".join(hosts), restart=True,
                                          vault=self.inputs.vault, host_vars=self.versions_vars(hosts, which))
        result = deploy_verb.deploy(self.runner, inputs, self.progress, read=self.fleet)
        bad = [row.host for row in result.instances if row.status not in ("restarted", "unchanged")]
        _raise_for(result.exit_status, result.errors, hosts, "restarted", bad)

    def probe_instance(self, item: PlannedInstance) -> dict[str, Any]:
        return probe_instance(self.prober, self.inputs.workload, item)

    def gate(self, hosts: Sequence[str]) -> None:
        for host in hosts:
            lines = []
            for item in self.instances.get(host, []):
                key = f"{host}/{item.instance.name}"
                try:
                    metrics = self.probe_instance(item)
                except DsctlError as exc:
                    raise _BatchFailed(host, "gated", f"{key}: the gate probe failed: {exc}",
                                       ExitStatus.SLO_NOT_MET) from None
                verdict = gate.compare(self.state.baseline.get(key) or {}, metrics, self.limits, self.slos)
                lines.append(f"{item.instance.name}: {verdict.summary()}")
                self.state.hosts[host].gate = {**(self.state.hosts[host].gate or {}), item.instance.name: {
                    **verdict.to_dict(), "summary": verdict.summary(), "delta": verdict.delta()}}
                self.say([host], "gated", f"{key}: {verdict.summary()}")
                if not verdict.passed:
                    regressed = verdict.failed_requests or not all(check.passed for check in verdict.checks)
                    what = "regressed" if regressed else "missed the --slo"
                    raise _BatchFailed(host, "gated", f"{key} {what}: {verdict.reason()}", ExitStatus.SLO_NOT_MET)

    # ---------------------------------------------------------------- a batch

    def run_batch(self, index: int, hosts: list[str]) -> None:
        self.batch_index = index
        self.state.restart_batch(hosts, _now())
        stage = self.state.batch_stage(hosts)
        kind = "canary" if index == 0 and len(self.state.batches) > 1 else "batch"
        self.say(hosts, stage, f"{kind} {index + 1}/{len(self.state.batches)}: {', '.join(hosts)}"
                 + (f" (resuming after {stage})" if stage != "pending" else ""))
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("drained", lambda: self.drain(hosts)),
            ("installed", lambda: self.provision(hosts, "target")),
            ("switched", lambda: None),  # provision.yml switches latest/, env and venv in the same run
            ("restarted", lambda: self.restart(hosts, "target")),
            ("gated", lambda: self.gate(hosts)),
            ("undrained", lambda: self._undrain_or_fail(hosts)),
        ]
        for name, action in steps:
            if STAGES.index(name) <= STAGES.index(stage):
                continue
            began = time.monotonic()
            action()
            for host in hosts:
                self.state.advance(host, name, _now())
            self.save()
            self.say(hosts, name, f"{name} ({time.monotonic() - began:.1f} s)")

    def _undrain_or_fail(self, hosts: Sequence[str]) -> None:
        result = self.undrain(hosts)
        if result is not None and not result.ok:
            raise _BatchFailed(hosts[0], "undrained", "undrain failed: " + "; ".join(result.errors),
                               ExitStatus.PLAYBOOK_FAILED)

    def roll_back(self, hosts: Sequence[str]) -> list[str]:
        """Return ``hosts`` to their previous stack, restart, verify, undrain; the problems of the rollback."""
        problems: list[str] = []
        for host in hosts:
            self.state.rolling_back(host, _now())
        self.save()
        # A host that got past the drain may have changed, even half-way (a failed installer): provision it back.
        # One that failed at the drain itself never changed and only goes back into the gateway.
        switched = [host for host in hosts if _stage_before_rollback(self.state.hosts[host]) != "pending"]
        self.say(hosts, "rolling-back", "rolling back to " + "; ".join(
            f"{host}: {self.state.hosts[host].source.label()}" for host in hosts))
        try:
            if switched:
                self.provision(switched, "source")
                self.restart(switched, "source")
                for host in switched:
                    for item in self.instances.get(host, []):
                        metrics = self.probe_instance(item)
                        if metrics.get("failed") or not metrics.get("completed"):
                            raise _BatchFailed(host, "rolling-back", f"{host}/{item.instance.name} does not serve "
                                               f"on the previous stack ({metrics.get('failed')} requests failed)",
                                               ExitStatus.ERROR)
            result = self.undrain(hosts)
            if result is not None and not result.ok:
                raise _BatchFailed(hosts[0], "rolling-back", "undrain failed: " + "; ".join(result.errors),
                                   ExitStatus.ERROR)
        except (_BatchFailed, DsctlError) as exc:
            reason = exc.reason if isinstance(exc, _BatchFailed) else str(exc)
            for host in hosts:
                self.state.rollback_failed(host, reason, _now())
            problems.append(f"rollback of {', '.join(hosts)} failed: {reason}; fix it and run dsctl upgrade "
                            f"{self.inputs.inventory} --rollback")
        else:
            for host in hosts:
                self.state.rolled_back(host, _now())
            self.say(hosts, ROLLED_BACK, "rolled back, serving on the previous stack")
        self.save()
        return problems


def probe_instance(prober: Prober, workload: GateWorkload, item: PlannedInstance) -> dict[str, Any]:
    """The gate workload against one instance directly (it is drained from the gateway when gated); its metrics."""
    cfg = ProbeConfig(url=f"http://{item.address}:{item.instance.port}", model=item.spec.served_model_name,
                      concurrency=workload.concurrency, requests=workload.requests, warmup=GATE_WARMUP,
                      prompt_tokens=workload.prompt_tokens, output_tokens=workload.output_tokens,
                      timeout=workload.timeout,
                      api_key=item.spec.api_key.get_secret_value() if item.spec.api_key else None)
    return dict(probe(prober, cfg).data["metrics"])


def _stage_before_rollback(run: Any) -> str:
    for entry in reversed(run.history):
        if entry.get("stage") == "rolling-back":
            return str(entry.get("from_stage") or "pending")
    return run.stage


def _raise_for(status: ExitStatus, errors: Sequence[str], hosts: Sequence[str], stage: str,
               bad_hosts: Sequence[str]) -> None:
    if status == ExitStatus.OK:
        return
    host = bad_hosts[0] if bad_hosts else hosts[0]
    mine = [line for line in errors if line.startswith(f"{host}:")]
    index = errors.index(mine[0]) if mine else 0
    tail = [line.strip() for line in errors[index:index + 6]]
    raise _BatchFailed(host, stage, " | ".join(tail) or f"the play exited {int(status)}", ExitStatus.PLAYBOOK_FAILED)


def _instances(fleet: Fleet) -> dict[str, list[PlannedInstance]]:
    from dsctl.core.inventory.deploy_plan import plan_deploy

    addresses = {host: fleet.address(host) for host in fleet.settings}
    plan = plan_deploy(fleet.settings, addresses)
    found: dict[str, list[PlannedInstance]] = {}
    for item in plan.instances:
        found.setdefault(item.host, []).append(item)
    # A multi-host instance is drained, probed and gated at its head (the only node with an API); its batch holds all
    # its hosts (_host_groups), and the deploy of that batch restarts every node.
    try:
        groups = host_plan.plan_groups(fleet.settings, addresses)
    except MultiNodeError as refused:
        raise DsctlError(f"dsctl_services: {refused}", refused.exit_status) from None
    for spec, instance in groups:
        head = instance.head
        found.setdefault(head.host, []).append(PlannedInstance(
            host=head.host, address=head.address, spec=spec,
            instance=Instance(service=spec.name, index=instance.index, npus=head.npus, port=instance.port)))
    return found


# --------------------------------------------------------------------------------------------- preflight


def read_package_sums(source: str, pin: str | None = None) -> dict[str, str]:
    """The package source's SHA256SUMS (a directory on the controller or an http(s) URL); {} when absent. For a
    directory, only the packages whose file is there too (the roles verify each digest when they fetch it).
    ``pin`` (dsctl_package_manifest_sha256): a manifest whose bytes have another sha256 raises ValueError; a
    malformed one raises DsctlError (dsctl.core.fleet.sha256sums, as strict as provisioning's reading of it)."""
    location = package_source.manifest_location(source)
    raw = package_source.read_manifest(source)
    if raw is None:
        return {}
    got = hashlib.sha256(raw).hexdigest()
    if pin is not None and got != pin:
        raise ValueError(f"dsctl_package_manifest_sha256: {location} has sha256 {got}, the inventory pins {pin}; "
                         "the source is refused (changed or tampered with): if its packages were updated on purpose, "
                         "pin the new `sha256sum SHA256SUMS`")
    sums = sha256sums.parse(raw.decode("utf-8", "replace"), location)
    if package_source.is_remote(source):
        return sums
    here = package_source.present(source, sums)
    return {name: digest for name, digest in sums.items() if name in here}


def _healthy(host: str, report: Mapping[str, Any]) -> str | None:
    status = report.get("status")
    if status not in HEALTHY_STATUSES:
        return f"{host}: not fit to upgrade: dsctl check says {status}" + (
            "; reboot it first" if status == "pending-reboot" else "")
    sick = [f["sentence"] for f in report.get("findings") or []
            if f.get("severity") == "error" and f.get("component") in SICK_COMPONENTS]
    unhealthy = (report.get("npus") or {}).get("unhealthy") or []
    if unhealthy:
        sick.append(f"{len(unhealthy)} NPU chip(s) not OK")
    return f"{host}: not fit to upgrade: {' '.join(sick)}" if sick else None


def _desired(fleet: Fleet) -> dict[str, Versions]:
    """Each host's inventory versions (its resolved stack)."""
    desired = {}
    for host, settings in fleet.settings.items():
        stack = settings.stack
        desired[host] = Versions() if stack is None else Versions(
            driver=stack.driver, firmware=stack.firmware, cann=stack.cann, vllm_ascend=stack.vllm_ascend)
    return desired


def _host_groups(fleet: Fleet) -> list[tuple[str, ...]]:
    """The hosts of each multi-host instance (the same on every host's settings): one batch each."""
    groups = next((settings.host_groups for settings in fleet.settings.values()), ())
    return [group.hosts for group in groups]


def preflight(runner: PlaybookRunner, prober: Prober, inputs: UpgradeInputs, fleet: Fleet,
              progress: ProgressSink) -> tuple[UpgradePlan, list[str], dict[str, Any]]:
    """The plan, the preflight problems (one line each) and the baseline metrics ("host/instance" -> metrics)."""
    releases = data.load("releases")
    # A target the data does not carry (--cann 9.9.9) is refused for what it is before any host is contacted,
    # not reported after dsctl check as "not fit to upgrade: unreachable" of hosts it never needed.
    try:
        check_targets(releases, _desired(fleet), inputs.overrides(),
                      allow_lab={host: settings.dsctl_allow_lab_releases for host, settings in fleet.settings.items()})
    except DsctlError as refused:
        if refused.exit_status != ExitStatus.VALIDATION_FAILED:
            raise  # a version the data does not carry: a usage error
        # An incompatible stack is a plan problem, reported as the plan's are (the table, --json's envelope).
        problems = [str(refused)]
        return UpgradePlan(hosts=(), batches=(), unchanged=(), problems=tuple(problems)), problems, {}
    fleet.check_controller_files()  # the packages and locks each batch's provision reads, before dsctl check
    checked = check_verb.check(runner, check_verb.CheckInputs(inventory=inputs.inventory, vault=inputs.vault),
                               progress, read=fleet)
    problems: list[str] = []
    reports = {str(row["host"]): row for row in checked.hosts}
    hosts = list(fleet.settings)
    current: dict[str, Versions] = {}
    arch: dict[str, str] = {}
    free: dict[str, int | None] = {}
    for host in hosts:
        report = reports.get(host)
        if report is None:
            problems.append(f"{host}: dsctl check did not report it")
            continue
        sick = _healthy(host, report)
        if sick:
            problems.append(sick)
        current[host] = current_versions(releases, report)
        raw = (checked.run.hosts[host].facts.get("ascend_raw") if host in checked.run.hosts else None) or {}
        arch[host] = str(raw.get("arch") or "")
        free[host] = (raw.get("disk") or {}).get("free_mb")
    if problems:
        return UpgradePlan(hosts=(), batches=(), unchanged=(), problems=tuple(problems)), problems, {}
    desired = _desired(fleet)
    sums: dict[str, str] = {}
    for source, pin in {(settings.dsctl_package_source, settings.dsctl_package_manifest_sha256)
                        for settings in fleet.settings.values()}:
        try:
            sums.update(read_package_sums(source, pin))
        except (ValueError, DsctlError) as unusable:  # reported with the plan's other problems
            problems.append(str(unusable))
    plan = plan_upgrade(releases, hosts, current=current, desired=desired, overrides=inputs.overrides(), arch=arch,
                        package_sums=sums, batch=BatchSize.parse(inputs.batch), canary=inputs.canary,
                        disk_free_mb=free, together=_host_groups(fleet))
    problems += plan.problems
    baseline: dict[str, Any] = {}
    if problems or inputs.check:
        return plan, problems, baseline
    instances = _instances(fleet)
    for batch in plan.batches:
        for host in batch:
            for item in instances.get(host, []):
                key = f"{host}/{item.instance.name}"
                progress({"event": "dsctl_upgrade", "batch": 0, "batches": len(plan.batches), "canary": False,
                          "host": host, "stage": "baseline", "elapsed_s": 0.0, "msg": f"baseline probe of {key}"})
                try:
                    metrics = probe_instance(prober, inputs.workload, item)
                except DsctlError as exc:
                    problems.append(f"{key}: the baseline probe failed: {exc}")
                    continue
                if metrics.get("failed") or not metrics.get("completed"):
                    problems.append(f"{key}: the baseline probe had {metrics.get('failed')} failed requests; the "
                                    "instance must serve cleanly before an upgrade")
                baseline[key] = metrics
    return plan, problems, baseline


# --------------------------------------------------------------------------------------------- the verb


def _rows(state: UpgradeState, plan: UpgradePlan | None = None) -> tuple[UpgradedHost, ...]:
    rows = []
    for index, batch in enumerate(state.batches):
        for host in batch:
            run = state.hosts[host]
            probe_text = "; ".join(f"{name}: {item.get('delta')}" for name, item in (run.gate or {}).items()) or "-"
            error = f"{run.error['stage']}: {run.error['reason']}" if run.error else None
            rows.append(UpgradedHost(host=host, batch=index + 1, source=run.source.changed_label(run.target),
                                     target=run.target.changed_label(run.source), probe=probe_text, stage=run.stage,
                                     status=run.status, error=error, gate=run.gate,
                                     versions={"from": run.source.to_dict(), "to": run.target.to_dict()}))
    for host in plan.unchanged if plan else ():
        item = plan.host(host)
        rows.append(UpgradedHost(host=host, batch=None, source=item.source.label(), target=item.target.label(),
                                 probe="-", stage="-", status="unchanged",
                                 versions={"from": item.source.to_dict(), "to": item.target.to_dict()}))
    return tuple(rows)


def _load_state(path: Path) -> UpgradeState:
    if not path.is_file():
        raise UsageError(f"--resume/--rollback: no upgrade state at {path}; run dsctl upgrade without them first")
    return upgrade_state.read(path)


def upgrade(runner: PlaybookRunner, prober: Prober, inputs: UpgradeInputs, progress: ProgressSink = no_progress,
            gateway: Gateway | None = None) -> UpgradeResult:
    gateway = gateway if gateway is not None else gateway_adapter
    fleet = load_fleet(inputs.inventory, vault=inputs.vault)
    # As deploy does: a gateway the play would refuse is refused here, before dsctl check, a probe or a drain.
    fleet.check_gateways()
    path = inputs.state_path()
    if not path.is_file() and inputs.legacy_state_path().is_file():
        path = inputs.legacy_state_path()
    if inputs.check:  # reads the fleet, writes no state: it may run beside an upgrade
        return _upgrade(runner, prober, inputs, progress, gateway, fleet, path)
    # One upgrade of a fleet at a time: a second would read a state the first is rewriting and act on the same hosts.
    with upgrade_state.locked(path, f"an upgrade of {inputs.inventory}"):
        return _upgrade(runner, prober, inputs, progress, gateway, fleet, path)


def _changes(inputs: UpgradeInputs) -> dict[str, str]:
    """The inventory variables the command line's versions set: what a finished upgrade writes back."""
    return inputs.overrides().as_host_vars()


def _changed_inventory(state: UpgradeState, fleet: Fleet) -> list[str]:
    """Hosts whose inventory versions differ from those recorded when the upgrade began, one line each."""
    now = _desired(fleet)
    lines = []
    for host, recorded in state.inventory_versions.items():
        then = Versions.from_dict(recorded)
        current = now.get(host, Versions())
        if then.to_dict() != current.to_dict():
            lines.append(f"{host}: {then.changed_label(current)} when the upgrade began, "
                         f"{current.changed_label(then)} now")
    return lines


def _upgrade(runner: PlaybookRunner, prober: Prober, inputs: UpgradeInputs, progress: ProgressSink,
             gateway: Gateway, fleet: Fleet, path: Path) -> UpgradeResult:
    plan: UpgradePlan | None = None
    if inputs.resume or inputs.rollback:
        state = _load_state(path)
        if sorted(state.hosts) != sorted(set(state.hosts) & set(fleet.settings)):
            raise UsageError(f"--resume/--rollback: {path} names hosts the inventory no longer has; restore the "
                             "inventory or remove the state file")
        changed = _changed_inventory(state, fleet) if inputs.resume and not state.inventory_written else []
        if changed:
            raise UsageError(f"--resume: the inventory changed since the upgrade began ({'; '.join(changed)}); "
                             "restore it, or undo the upgrade with --rollback")
        fleet.check_controller_files()  # what the provision of the remaining (or rolled back) batches reads
    else:
        # Before any host is contacted: the versions this upgrade installs must be recordable in the inventory
        # (issue 20), or the next provision would switch the fleet back.
        edit = inventory_versions.plan_edit(inputs.inventory, list(fleet.settings), _changes(inputs)) \
            if _changes(inputs) else None
        if path.is_file() and not inputs.check:
            if upgrade_state.read(path).unfinished():
                raise UsageError(f"an upgrade of this inventory is unfinished ({path}); continue it with --resume or "
                                 "undo it with --rollback")
        plan, problems, baseline = preflight(runner, prober, inputs, fleet, progress)
        if problems:
            return UpgradeResult(hosts=(), check_mode=inputs.check, exit_status=ExitStatus.VALIDATION_FAILED,
                                 errors=tuple(problems), state_file=None, plan=plan.to_dict())
        state = UpgradeState.new(plan, inventory=str(inputs.inventory), max_regression=inputs.max_regression,
                                 now=_now(), slo=",".join(s.label for s in inputs.slos))
        if inputs.check:
            rows = tuple(dataclasses.replace(row, status="would upgrade" if row.batch else row.status, stage="-")
                         for row in _rows(state, plan))
            return UpgradeResult(hosts=rows, check_mode=True, exit_status=ExitStatus.OK, errors=(), state_file=None,
                                 plan=plan.to_dict(), inventory=tuple(edit.describe() if edit else ()))
        state.baseline = baseline
        state.inventory_versions = {host: versions.to_dict() for host, versions in _desired(fleet).items()}
        state.inventory_changes = _changes(inputs)
    run = _Run(runner, prober, gateway, inputs, progress, fleet, state, path)
    run.save()
    try:
        if inputs.rollback:
            return _rollback_all(run, plan)
        return _forward(run, plan)
    except KeyboardInterrupt:
        run.save()
        raise UpgradeInterrupted(f"upgrade interrupted; state in {path}: run dsctl upgrade {inputs.inventory} "
                                 "--resume to continue or --rollback to undo") from None
    except DsctlError as exc:
        if exc.exit_status != ExitStatus.INTERRUPTED:
            raise
        run.save()
        raise UpgradeInterrupted(f"{exc}; upgrade state in {path}: run dsctl upgrade {inputs.inventory} --resume "
                                 "to continue or --rollback to undo") from None


def _forward(run: _Run, plan: UpgradePlan | None) -> UpgradeResult:
    state = run.state
    while (found := state.next_batch()) is not None:
        index, hosts = found
        try:
            run.run_batch(index, hosts)
        except (_BatchFailed, StateError, DsctlError) as exc:
            if isinstance(exc, DsctlError) and exc.exit_status == ExitStatus.INTERRUPTED:
                raise
            if isinstance(exc, _BatchFailed):
                host, stage, reason, status = exc.host, exc.stage, exc.reason, exc.status
            else:
                reached = state.batch_stage(hosts)
                host, stage, reason, status = hosts[0], STAGES[min(STAGES.index(reached) + 1, len(STAGES) - 1)] \
                    if reached in STAGES else reached, str(exc), ExitStatus.PLAYBOOK_FAILED
            state.fail(host, stage, reason, _now())
            run.save()
            run.say([host], "failed", f"{host} failed at {stage}: {reason}")
            problems = run.roll_back(hosts)
            untouched = [h for h, r in state.hosts.items() if r.stage == "pending"]
            errors = [f"{host}: failed at {stage}: {reason}",
                      f"batch {index + 1} ({', '.join(hosts)}) rolled back to its previous stack" if not problems
                      else problems[0]]
            if untouched:
                errors.append(f"not reached, untouched: {', '.join(untouched)}")
            return UpgradeResult(hosts=_rows(state, plan), check_mode=False,
                                 exit_status=ExitStatus.ERROR if problems else status, errors=tuple(errors),
                                 state_file=str(run.path), halted=state.halted,
                                 plan=plan.to_dict() if plan else None)
    written, problems = _record_in_inventory(run, state.inventory_changes)
    return UpgradeResult(hosts=_rows(state, plan), check_mode=False,
                         exit_status=ExitStatus.ERROR if problems else ExitStatus.OK, errors=tuple(problems),
                         state_file=str(run.path), plan=plan.to_dict() if plan else None, inventory=tuple(written))


def _record_in_inventory(run: _Run, changes: Mapping[str, str], *, undo: bool = False) -> tuple[list[str], list[str]]:
    """Write ``changes`` into the inventory once the whole fleet runs them, and read it back through Ansible: every
    host must now resolve them. Otherwise the files are restored and the line says what to set by hand (the fleet
    is upgraded either way; provision refuses to move it back without --allow-downgrade)."""
    if not changes:
        return [], []
    inputs, state = run.inputs, run.state
    by_hand = ", ".join(f"{var}: {value}" for var, value in changes.items())
    try:
        edit = inventory_versions.plan_edit(inputs.inventory, list(run.fleet.settings), changes)
        previous = inventory_versions.apply(edit)
    except (DsctlError, OSError) as failed:
        return [], [f"the fleet runs the new versions but the inventory could not record them ({failed}); set "
                    f"{by_hand} in it by hand"]
    resolved = _desired(load_fleet(inputs.inventory, vault=inputs.vault))
    fields = {var: key for key, var in VARIABLES.items()}
    wrong = sorted(host for host in run.fleet.settings for var, value in changes.items()
                   if not same_version(str(getattr(resolved.get(host, Versions()), fields[var]) or ""), value))
    if wrong:
        inventory_versions.restore(previous)
        return [], [f"the inventory still resolves other versions for {', '.join(wrong)} after dsctl wrote "
                    f"{by_hand} (defined where dsctl cannot edit: a vault-encrypted file, an INI inventory or a "
                    "template); the files are as they were: set it there by hand"]
    if undo:
        state.inventory_written = {}
    else:
        old = {site.variable: str(site.value) for site in edit.sites}
        state.inventory_written = {var: [old.get(var, ""), value] for var, value in changes.items()}
    run.save()
    lines = edit.describe()
    for line in lines:
        run.say(None, DONE, f"inventory: {line}")
    return lines, []


def _rollback_all(run: _Run, plan: UpgradePlan | None) -> UpgradeResult:
    """--rollback: every touched host back to its previous stack, the last batches first."""
    state = run.state
    state.rollback = True
    run.save()
    problems: list[str] = []
    for index in reversed(range(len(state.batches))):
        hosts = [host for host in state.batches[index] if state.hosts[host] in state.to_undo()]
        if not hosts:
            continue
        run.batch_index = index
        in_gateway = [host for host in hosts if state.hosts[host].stage == DONE]
        if in_gateway:
            try:
                run.drain(in_gateway)
            except _BatchFailed as exc:
                problems.append(f"{exc.host}: rollback: {exc.reason}")
                continue
        problems += run.roll_back(hosts)
    written: list[str] = []
    if not problems and state.inventory_written:
        # The finished upgrade wrote its versions into the inventory: the rollback writes the old ones back.
        written, problems = _record_in_inventory(
            run, {var: old for var, (old, _new) in state.inventory_written.items() if old}, undo=True)
    return UpgradeResult(hosts=_rows(state, plan), check_mode=False,
                         exit_status=ExitStatus.ERROR if problems else ExitStatus.OK, errors=tuple(problems),
                         state_file=str(run.path), plan=plan.to_dict() if plan else None, inventory=tuple(written))
