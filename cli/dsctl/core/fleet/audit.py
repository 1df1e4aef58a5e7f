"""Audit of one host: what is wrong with it, how badly, and what to do (pure).

`audit_host` joins three kinds of findings on a parsed `HostState`:

* compatibility of the installed files with each other and the boards' verdict (dsctl.core.fleet.compat);
* drift from the `DesiredStack` the inventory asks for: driver, firmware, CANN (installed, side by side,
  active), kernels/ops and NNAL, the serving venv's pins, the managed env file;
* host health: NPU count, chip health, HBM, npu-smi failures, the run user, a pending reboot.

The status is the worst finding: "error" > "pending-reboot" > "warning" > "ok".  A pending reboot is its
own status because the host is neither broken nor ready: the installed stack only runs after the reboot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, Specifier
from packaging.version import InvalidVersion, Version

from dsctl.core.fleet import install_steps, wheel_lock
from dsctl.core.fleet.compat import Finding, describe_npus, file_compatibility
from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.fleet.versions import compare_versions, same_version
from dsctl.core.hostfacts.hoststate import DriverState, EnvState, HostState, RunUserState, ServingState, pep503_name

STATUSES = ("ok", "warning", "pending-reboot", "error")  # best to worst
# Statuses that should make `dsctl check` exit non-zero: the host cannot serve the desired stack now.
EXIT_WORTHY = ("error", "pending-reboot")
PROVISION = "Run dsctl provision"
DOWNGRADE = "dsctl provision --allow-downgrade (or dsctl upgrade --rollback right after an upgrade)"


@dataclass(frozen=True)
class HostReport:
    status: str  # one of STATUSES
    findings: tuple[Finding, ...]
    state: HostState

    @property
    def pending_reboot(self) -> bool:
        return self.state.pending_reboot

    def to_dict(self) -> dict[str, Any]:
        """The report as `dsctl check --json` prints it per host (the caller adds the host name)."""
        state, packages = self.state, self.state.serving.packages
        kernels = state.cann.kernels_version if state.cann.kernels_installed is not False else None
        return {
            "status": self.status,
            "versions": {
                "driver": {"installed": state.driver.installed, "running": state.driver.running},
                "firmware": {"installed": state.firmware.installed, "running": state.firmware.running},
                "cann": {"active": state.cann.active, "installed": list(state.cann.installed)},
                "kernels": kernels,
                "nnal": state.cann.nnal_version,
                "torch": packages.get("torch"),
                "torch_npu": packages.get("torch-npu"),
                "vllm": packages.get("vllm"),
                "vllm_ascend": packages.get("vllm-ascend"),
            },
            "npus": {
                "count": state.npus.count,
                "chips": list(state.npus.chip_names),
                "unhealthy": [{"npu": sick.npu, "chip": sick.chip, "health": sick.health}
                              for sick in state.npus.unhealthy],
                "hbm_used_mb": state.npus.hbm_used_mb,
                "hbm_total_mb": state.npus.hbm_total_mb,
            },
            "pending_reboot": state.pending_reboot,
            "pending_reasons": list(state.pending_reasons),
            "findings": [finding.to_dict() for finding in self.findings],
        }


def audit_host(
    state: HostState,
    desired: DesiredStack | None,
    *,
    expected_npus: int | None,
    env_expected: dict[str, str] | None,
) -> HostReport:
    """All findings for one host and its overall status.

    ``desired`` None audits compatibility and health only (no drift); ``env_expected`` None skips the env file.
    """
    findings = [
        *file_compatibility(state),
        *_pending_findings(state),
        *_problem_findings(state),
        *_stack_drift(state, desired),
        *_cann_parts(state, desired),
        *_npu_findings(state, expected_npus, drift_checked=desired is not None),
        *_firmware_spread(state),
        *_env_findings(state.env, env_expected),
        *_serving_findings(state.serving, desired),
        *_run_user_findings(state.run_user),
        *_install_record_findings(state.driver),
    ]
    return HostReport(overall_status(findings, state.pending_reboot), tuple(findings), state)


def overall_status(findings: list[Finding], pending_reboot: bool) -> str:
    severities = {finding.severity for finding in findings}
    if "error" in severities:
        return "error"
    if pending_reboot:
        return "pending-reboot"
    return "warning" if "warning" in severities else "ok"


def fleet_summary(reports: Mapping[str, HostReport]) -> dict[str, Any]:
    """Counts per status, the hosts in each, the worst status and whether it is worth a non-zero exit."""
    hosts: dict[str, list[str]] = {status: [] for status in STATUSES}
    for name in sorted(reports):
        hosts[reports[name].status].append(name)
    present = [status for status in STATUSES if hosts[status]]
    worst = present[-1] if present else "ok"
    return {
        "total": len(reports),
        "counts": {status: len(names) for status, names in hosts.items()},
        "hosts": hosts,
        "worst": worst,
        "exit_worthy": worst in EXIT_WORTHY,
    }


# --------------------------------------------------------------------------- reboot and unreadable facts


def _pending_findings(state: HostState) -> list[Finding]:
    return [
        Finding(
            "info",
            "firmware" if reason.startswith("firmware") else "driver",
            f"Reboot pending: {reason}.",
            "Reboot the host to load the installed driver and firmware.",
            "pending-reboot",
        )
        for reason in state.pending_reasons
    ]


def _problem_findings(state: HostState) -> list[Finding]:
    return [
        Finding(
            "warning",
            problem.component,
            _sentence(problem.message),
            "Look at the raw output on the host; if it is intact, report the format to the dsctl maintainers.",
            "unreadable-facts",
        )
        for problem in state.problems
    ]


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]) + ("" if text.endswith(".") else ".")


# --------------------------------------------------------------------------- drift from the desired stack


def _stack_drift(state: HostState, desired: DesiredStack | None) -> list[Finding]:
    if desired is None:
        return []
    findings = [
        *_version_drift("driver", "Driver", state.driver.installed, desired.driver),
        *_version_drift("firmware", "Firmware", state.firmware.installed, desired.firmware),
    ]
    cann = state.cann
    if not desired.cann or (cann.active and _same(cann.active, desired.cann)):
        return findings
    if cann.active and compare_versions(desired.cann, cann.active) < 0:
        # Provision refuses a downgrade without --allow-downgrade (issue 20): "run provision" would be no fix, and
        # after dsctl upgrade the usual cause is an inventory still naming the stack the upgrade left.
        findings.append(Finding(
            "error", "cann", f"CANN {cann.active} is active, the inventory names the older CANN {desired.cann}.",
            f"If dsctl upgrade moved this host, set dsctl_cann_version: {cann.active} in the inventory; to go back "
            f"on purpose: {DOWNGRADE}.", "cann-older"))
        return findings
    if any(_same(version, desired.cann) for version in cann.installed):
        findings.append(
            Finding(
                "error",
                "cann",
                f"CANN {desired.cann} is installed side by side but CANN {cann.active or 'none'} is active.",
                f"{PROVISION}: it will {_cann_plan(state, desired)}.",
                "cann-inactive",
            )
        )
    else:
        now = f"CANN {cann.active} active" if cann.active else "CANN not installed"
        findings.append(
            Finding(
                "error", "cann", f"{now}, {desired.cann} wanted.", f"{PROVISION} to install CANN {desired.cann}.",
                "cann-drift",
            )
        )
    return findings


def _cann_plan(state: HostState, desired: DesiredStack) -> str:
    """What provision does to the CANN parts, from the same install steps the roles follow."""
    steps = [step for step in install_steps.plan_install_steps(desired, state)
             if step.component in ("toolkit", "kernels", "nnal")]
    plan = install_steps.describe(steps)
    if desired.pip_pins:
        plan += ", then point the serving venv at the venv of that stack (built only if it has none yet)"
    return plan


def _version_drift(component: str, title: str, installed: str | None, wanted: str | None) -> list[Finding]:
    if not wanted or (installed and _same(installed, wanted)):
        return []
    now = f"{title} {installed} installed" if installed else f"{title} not installed"
    if installed and compare_versions(wanted, installed) < 0:
        return [Finding("error", component, f"{now}, the inventory names the older {wanted}.",
                        f"If dsctl upgrade moved this host, set dsctl_{component}_version: {installed} in the "
                        f"inventory; to go back on purpose: {DOWNGRADE}.", f"{component}-older")]
    return [
        Finding("error", component, f"{now}, {wanted} wanted.", f"{PROVISION} to install {component} {wanted}.",
                f"{component}-drift")
    ]


def _cann_parts(state: HostState, desired: DesiredStack | None) -> list[Finding]:
    """Kernels/ops and NNAL of the active CANN: vllm-ascend needs both (section 9.3)."""
    cann = state.cann
    if not cann.active:
        return []
    # Without a desired stack we cannot know the host is meant to serve, so a missing part is only a warning.
    severity = "error" if desired is not None else "warning"
    findings = []
    if cann.kernels_installed is False:
        package = f"{desired.kernels_package} " if desired is not None else "kernels/ops package "
        findings.append(
            Finding(
                severity,
                "cann",
                f"Kernels/ops are not installed for the active CANN {cann.active}.",
                f"{PROVISION} to install {package}{cann.active}." if desired is not None
                else f"Install the CANN {cann.active} {package.strip()} into the toolkit.",
                "kernels-missing",
            )
        )
    if cann.kernels_version and not _same(cann.kernels_version, cann.active):
        findings.append(
            Finding(
                "warning",
                "cann",
                f"latest/opp belongs to CANN {cann.kernels_version} while CANN {cann.active} is active.",
                f"{PROVISION} to rebuild latest/ for CANN {cann.active}.",
                "kernels-mismatch",
            )
        )
    if not cann.nnal_version:
        findings.append(
            Finding(
                severity,
                "cann",
                f"NNAL (ATB) is not installed for CANN {cann.active}, so vllm-ascend fails with "
                "\"libatb.so: cannot open shared object file\".",
                f"{PROVISION} to install NNAL {cann.active}." if desired is not None
                else f"Install the NNAL package of CANN {cann.active}.",
                "nnal-missing",
            )
        )
    elif not _same(cann.nnal_version, cann.active):
        side_by_side = next((version for version in cann.nnal_installed if _same(version, cann.active)), None)
        if desired is None:
            fix = f"Install the NNAL package of CANN {cann.active}."
        elif side_by_side:
            fix = f"{PROVISION} to switch NNAL's latest to the installed NNAL {side_by_side} (no installer runs)."
        else:
            fix = f"{PROVISION} to install NNAL {cann.active}."
        findings.append(
            Finding(
                severity,
                "cann",
                f"NNAL {cann.nnal_version} does not match the active CANN {cann.active}.",
                fix,
                "nnal-mismatch",
            )
        )
    return findings


# --------------------------------------------------------------------------- NPUs


def _npu_findings(state: HostState, expected: int | None, *, drift_checked: bool) -> list[Finding]:
    npus = state.npus
    if not npus.present:
        if state.driver.installed:
            return [
                Finding(
                    "error",
                    "npu",
                    f"npu-smi was not found although driver {state.driver.installed} is installed.",
                    "Reinstall the driver, which ships npu-smi.",
                    "npu-smi-missing",
                )
            ]
        if expected and not drift_checked:  # with a desired stack the driver drift already says this
            return [
                Finding(
                    "error",
                    "npu",
                    f"No NPU driver is installed (npu-smi not found), {expected} NPUs expected.",
                    f"{PROVISION} to install the driver and firmware.",
                    "npu-count",
                )
            ]
        return []
    if npus.error:
        return [_npu_smi_error(state)]
    findings = []
    if expected is not None and npus.count != expected:
        ids = sorted({chip.npu for chip in npus.chips})
        findings.append(
            Finding(
                "error",
                "npu",
                f"{npus.count} NPUs visible ({describe_npus(ids)}), {expected} expected.",
                "Check the missing cards with `npu-smi info -l` and lspci, or correct the inventory's NPU count.",
                "npu-count",
            )
        )
    findings += _health_findings(state)
    findings += _hbm_findings(state)
    return findings


def _npu_smi_error(state: HostState) -> Finding:
    npus = state.npus
    if npus.dcmi_code == -8005 and state.pending_reboot:
        return Finding(
            "info",
            "npu",
            f"npu-smi cannot reach the NPUs until the pending reboot ({npus.error}).",
            "Reboot the host to load the installed driver.",
            "npu-smi-error",
        )
    fixes = {
        -8020: "Stop the container or process holding the device (see /proc/uda/namespace_node), then check again.",
        -8005: "Reboot if a driver or firmware was just installed, otherwise reinstall the driver.",
    }
    return Finding(
        "error",
        "npu",
        f"npu-smi failed: {npus.error}" + ("" if npus.error and npus.error.endswith(".") else "."),
        fixes.get(npus.dcmi_code, "Run `npu-smi info` on the host and fix what it reports."),
        "npu-smi-error",
    )


def _health_findings(state: HostState) -> list[Finding]:
    by_health: dict[str, list[int]] = {}
    for sick in state.npus.unhealthy:
        by_health.setdefault(sick.health, []).append(sick.npu)
    findings = []
    for health, ids in by_health.items():
        # ascend-deployer's health gate refuses every non-OK value; a Warning still serves, so it only warns here.
        severity = "warning" if health.casefold() == "warning" else "error"
        findings.append(
            Finding(
                severity,
                "npu",
                f"{describe_npus(ids)} health is {health}.",
                f"Inspect with `npu-smi info -t health -i {ids[0]}`; driver and firmware changes are refused "
                "while a chip is not OK.",
                "npu-unhealthy",
            )
        )
    return findings


def _hbm_findings(state: HostState) -> list[Finding]:
    chips, findings = state.npus.chips, []
    totals: dict[str, list[int]] = {}
    for chip in chips:
        if chip.hbm_total_mb:
            totals.setdefault(chip.name, []).append(chip.hbm_total_mb)
    for name, values in totals.items():
        usual = max(set(values), key=values.count)
        short = sorted({c.npu for c in chips if c.name == name and c.hbm_total_mb and c.hbm_total_mb != usual})
        if short:
            findings.append(
                Finding(
                    "warning",
                    "npu",
                    f"{describe_npus(short)} report a different HBM size than the other {name} chips ({usual} MB).",
                    f"Check with `npu-smi info -t memory -i {short[0]}`; a chip losing HBM needs hardware service.",
                    "hbm-size",
                )
            )
    busy = [chip for chip in chips if chip.npu in state.npus.busy]
    if busy:
        usage = ", ".join(f"{chip.hbm_used_mb}/{chip.hbm_total_mb} MB on NPU {chip.npu}" for chip in busy)
        findings.append(
            Finding(
                "info",
                "npu",
                f"{describe_npus(state.npus.busy)} run processes holding HBM ({usage}).",
                "Stop the workload before changing the driver, firmware or CANN: there is no hot upgrade.",
                "npu-busy",
            )
        )
    return findings


def _firmware_spread(state: HostState) -> list[Finding]:
    if not state.firmware.running_mixed:
        return []
    by_version: dict[str, list[int]] = {}
    for board in state.npus.boards:
        if board.firmware_version:
            by_version.setdefault(board.firmware_version, []).append(board.npu)
    spread = ", ".join(f"{version} on {describe_npus(ids)}" for version, ids in by_version.items())
    return [
        Finding(
            "warning",
            "firmware",
            f"The NPUs run different firmware: {spread}.",
            "Reinstall the firmware, which flashes every NPU, and reboot.",
            "firmware-mixed",
        )
    ]


# --------------------------------------------------------------------------- env file, serving venv, run user


def _env_findings(env: EnvState, expected: dict[str, str] | None) -> list[Finding]:
    if expected is None:
        return []
    if not env.present:
        if not expected:
            return []
        return [
            Finding("error", "env", "The managed env file is missing.", f"{PROVISION} to write it.", "env-missing")
        ]
    findings = []
    missing = sorted(set(expected) - set(env.values))
    if missing:
        findings.append(
            Finding("error", "env", f"The env file does not set {', '.join(missing)}.",
                    f"{PROVISION} to rewrite the env file.", "env-missing-variable")
        )
    for name in sorted(set(expected) & set(env.values)):
        if env.values[name] != expected[name]:
            findings.append(
                Finding("error", "env", f"{name} is {env.values[name]!r} in the env file, {expected[name]!r} wanted.",
                        f"{PROVISION} to rewrite the env file.", "env-changed")
            )
    extra = sorted(set(env.values) - set(expected))
    if extra:
        findings.append(
            Finding(
                "warning",
                "env",
                f"The env file also sets {', '.join(extra)}, which the inventory does not ask for.",
                f"{PROVISION} to rewrite the env file, or add the variables to the inventory if they are wanted.",
                "env-extra",
            )
        )
    return findings


def _serving_findings(serving: ServingState, desired: DesiredStack | None) -> list[Finding]:
    if desired is None or not desired.pip_pins:
        return []
    pins = {pep503_name(name): _bare_version(version) for name, version in desired.pip_pins.items()}
    if not serving.exists:
        wanted = ", ".join(f"{name} {version}" for name, version in pins.items())
        venv = f"The serving venv {serving.venv}" if serving.venv else "The serving venv"
        return [
            Finding("error", "serving", f"{venv} does not exist; {wanted} wanted.", f"{PROVISION} to create it.",
                    "serving-venv-missing")
        ]
    findings = []
    for name, wanted in pins.items():
        have = serving.packages.get(name)
        if have is None:
            sentence = f"{name} is not installed in the serving venv, {wanted} wanted."
        elif not wheel_lock.pin_matches(wanted, have):  # PEP 440: 0.13.0+empty meets the pin 0.13.0
            sentence = f"{name} {have} is installed in the serving venv, {wanted} wanted."
        else:
            continue
        findings.append(
            Finding("error", "serving", sentence,
                    f"{PROVISION} to point the serving venv at the venv of the pinned stack (built from the "
                    "wheelhouse only when that stack has none yet).",
                    "serving-pin-drift")
        )
    if desired.python and serving.python and not python_satisfies(serving.python, desired.python):
        findings.append(
            Finding("error", "serving",
                    f"The serving venv runs Python {serving.python}, outside {desired.python}.",
                    f"{PROVISION} to rebuild the serving venv with a Python in {desired.python}.",
                    "serving-python")
        )
    return findings


def _bare_version(version: str) -> str:
    # Pins are written without the tag's "v" ("0.13.0" for v0.13.0); pip reports lower-case versions.
    return version.strip().lower().removeprefix("v")


def python_satisfies(version: str, specifier: str) -> bool:
    """``"3.11.2"`` against ``">=3.10,<3.12"`` (a PEP 440 specifier set, as the matrix rows and pip write them).

    Clauses ``packaging`` cannot read, and a version it cannot read, count as satisfied: a wrong verdict here
    would block a working host.  Pre-release interpreters (3.13.0rc1) are judged by their numbers, as pip's
    ``Requires-Python`` check does.
    """
    try:
        have = Version(version.strip())
    except InvalidVersion:
        return True
    for clause in specifier.split(","):
        if not clause.strip():
            continue
        try:
            readable = Specifier(clause.strip())
        except InvalidSpecifier:
            continue
        if not readable.contains(have, prereleases=True):
            return False
    return True


def _run_user_findings(user: RunUserState) -> list[Finding]:
    name = user.name or "HwHiAiUser"
    findings = []
    if user.exists is False:
        findings.append(
            Finding("error", "system", f"The run user {name} does not exist.",
                    f"Create user {name} before installing the driver, which installs for that user.",
                    "run-user-missing")
        )
    if user.group_exists is False:
        findings.append(
            Finding("error", "system", f"The run group {name} does not exist.",
                    f"Create group {name} before installing the driver.", "run-group-missing")
        )
    return findings


def _install_record_findings(driver: DriverState) -> list[Finding]:
    if not driver.installed or driver.install_record_path:
        return []
    return [
        Finding(
            "warning",
            "driver",
            "/etc/ascend_install.info has no Driver_Install_Path_Param, so CANN's set_env.sh cannot find "
            "the driver libraries.",
            f"Reinstall driver {driver.installed} to rewrite its install record.",
            "install-record",
        )
    ]


def _same(left: str, right: str) -> bool:
    # The one version equality of dsctl (install_steps decides with it too): "8.3.rc2" is "8.3.RC2".
    return same_version(left, right)


# --------------------------------------------------------------------------- running instances


def instance_findings(host: str, inventory: str, instances: list[Mapping[str, Any]],
                      active_cann: str | None) -> list[Finding]:
    """An instance whose process has a CANN other than the active one mapped (issue 20): started before
    ``latest/`` was switched (a provision or an upgrade without the restart), it serves on a stack the host's
    files no longer say. ``instances``: ascend_facts' ``instances`` (name, pid, cann: the mapped version dirs)."""
    findings = []
    for item in instances:
        loaded = [str(version) for version in item.get("cann") or []]
        if not item.get("pid") or not loaded or not active_cann:
            continue
        stale = [version for version in loaded if not same_version(version, active_cann)]
        if stale:
            findings.append(Finding(
                "error", "serving",
                f"Instance {item.get('name')} (pid {item.get('pid')}) runs on CANN {', '.join(stale)}, but CANN "
                f"{active_cann} is active: it was started before latest/ was switched.",
                f"Restart it onto the active stack: dsctl deploy {inventory} --restart --limit {host}.",
                "instance-stale-stack"))
    return findings
