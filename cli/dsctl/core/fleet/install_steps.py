"""What provisioning must do to each Ascend package of one host, decided once (pure).

`plan_install_steps` compares the `DesiredStack` with the parsed `HostState` and returns the ordered steps
for the driver, the firmware, the CANN toolkit, the kernels/ops and NNAL.  Preflight (which installers the
package source must carry), the `npu_driver` and `cann` roles, `dsctl check`'s advice and the coming
`dsctl upgrade` all read these steps instead of comparing versions again, so 8.3.rc2 and 8.3.RC2 are the
same release everywhere (`dsctl.core.fleet.versions.same_version`).

Actions:

* ``install``: the package is absent: run its installer (driver/firmware ``--full``, CANN parts ``--install``);
* ``upgrade``: another version is installed: run the installer with ``--upgrade`` (driver and firmware only).
  The firmware decides by its own upgrade record (``/usr/local/Ascend/firmware/**/upgrade*``, ascend-deployer
  task_firmware.yml; ascend-interfaces.md section 6.2): ``--upgrade`` when the record exists, ``--full`` when
  it does not, whether or not a driver is installed (a driver-only host gets ``--full``; the vendor's installer
  refuses ``--upgrade`` there);
* ``switch``: the wanted version is already installed side by side but not active: repoint ``latest/``
  (the toolkit's link farm and version.cfg, NNAL's ``latest`` link) without running any installer;
* ``none``: the wanted version is installed and active.

Order (shared/reference/ascend-interfaces.md section 6.1): a fresh host gets the driver, then the firmware
(the firmware installer needs the driver's upgrade-tool); a host with a driver gets the firmware first, then
the driver (ascend-deployer install_npu.yml).  Then toolkit, kernels/ops, NNAL.  CANN parts are never
``upgrade``d: ``--upgrade`` replaces the active version, ``--install`` keeps the older one for rollback
(section 6.5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.fleet.versions import compare_versions, same_version
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.hoststate import HostState

ACTIONS = ("install", "upgrade", "switch", "none")
COMPONENTS = ("driver", "firmware", "toolkit", "kernels", "nnal")
INSTALLER_ACTIONS = ("install", "upgrade")


@dataclass(frozen=True)
class InstallStep:
    component: str  # one of COMPONENTS
    action: str  # one of ACTIONS
    wanted: str  # the version the stack asks for, as releases.yaml spells it
    # The version to act on as the host spells it: for a switch, the name of the installed version directory
    # (latest/ must point at "8.3.RC2" even when the inventory said "8.3.rc2").
    target: str
    current: str | None  # what is installed (driver, firmware) or active (CANN parts) now
    package: str | None  # the installer file an install/upgrade runs; None for switch and none
    reason: str  # one sentence for reports and `dsctl check`

    @property
    def runs_installer(self) -> bool:
        return self.action in INSTALLER_ACTIONS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs_installer": self.runs_installer}


def plan_install_steps(desired: DesiredStack, state: HostState) -> tuple[InstallStep, ...]:
    """The ordered steps that take ``state`` to ``desired`` (see the module docstring)."""
    driver = _hdk_step("driver", "Driver", state.driver.installed, desired.driver, desired.driver_run)
    firmware = _firmware_step(state.firmware.installed, state.firmware.upgrade_record, desired.firmware,
                              desired.firmware_run)
    hdk = (driver, firmware) if state.driver.installed is None else (firmware, driver)
    return (*hdk, *_cann_steps(desired, state))


def packages_needed(steps: Iterable[InstallStep]) -> list[str]:
    """Installer files the steps run, in order: what the package source must list in its SHA256SUMS."""
    return [step.package for step in steps if step.runs_installer and step.package]


def by_component(steps: Iterable[InstallStep]) -> dict[str, InstallStep]:
    return {step.component: step for step in steps}


def cann_switch_only(steps: Iterable[InstallStep]) -> bool:
    """The CANN change is a pure switch: some part switches and no CANN installer runs."""
    cann = [step for step in steps if step.component in ("toolkit", "kernels", "nnal")]
    return any(step.action == "switch" for step in cann) and not any(step.runs_installer for step in cann)


def describe(steps: Iterable[InstallStep]) -> str:
    """What the steps do, as a clause for advice: "switch latest/ to the installed CANN 8.5.0 and NNAL's
    latest to its NNAL without running an installer", "upgrade firmware 7.8.0.5.216, install NNAL 8.5.0"."""
    steps = [step for step in steps if step.action != "none"]
    if not steps:
        return "change nothing"
    switched = {step.component: step for step in steps if step.action == "switch"}
    parts = []
    if "toolkit" in switched:
        parts.append(f"switch latest/ to the installed CANN {switched['toolkit'].target}"
                     + (" and NNAL's latest to its NNAL" if "nnal" in switched else ""))
    elif "nnal" in switched:
        parts.append(f"switch NNAL's latest to the installed NNAL {switched['nnal'].target}")
    parts += [f"{step.action} {_TITLES[step.component]} {step.wanted}" for step in steps if step.runs_installer]
    text = ", ".join(parts)
    if switched and not any(step.runs_installer for step in steps):
        text += " without running an installer"
    return text


# --------------------------------------------------------------------------- driver and firmware

_TITLES = {"driver": "driver", "firmware": "firmware", "toolkit": "the CANN toolkit", "kernels": "kernels/ops",
           "nnal": "NNAL"}


def _hdk_step(component: str, title: str, installed: str | None, wanted: str, package: str) -> InstallStep:
    if installed is None:
        return InstallStep(component, "install", wanted, wanted, None, package,
                           f"{title} is not installed, {wanted} wanted.")
    if same_version(installed, wanted):
        return InstallStep(component, "none", wanted, installed, installed, None,
                           f"{title} {installed} is installed.")
    direction = "newer" if compare_versions(wanted, installed) > 0 else "older"
    # The vendor's installers take --upgrade in both directions; going back means installing the older
    # package (ascend-interfaces.md section 6.5: no vendor rollback for driver or firmware).
    return InstallStep(component, "upgrade", wanted, wanted, installed, package,
                       f"{title} {installed} is installed, the {direction} {wanted} wanted.")


def _firmware_step(installed: str | None, record: str | None, wanted: str, package: str) -> InstallStep:
    """Install (--full) or upgrade by the firmware's own upgrade record, never by the driver's presence."""
    if installed is not None and same_version(installed, wanted):
        return _hdk_step("firmware", "Firmware", installed, wanted, package)
    if record is None:
        now = (f"firmware/version.info names {installed} but the firmware has no upgrade record"
               if installed else "Firmware is not installed (no upgrade record)")
        return InstallStep("firmware", "install", wanted, wanted, installed, package,
                           f"{now}, {wanted} wanted: a first install (--full).")
    if installed is None:
        return InstallStep("firmware", "upgrade", wanted, wanted, None, package,
                           f"Firmware has an upgrade record ({record}) but no version.info, {wanted} wanted.")
    return _hdk_step("firmware", "Firmware", installed, wanted, package)


# --------------------------------------------------------------------------- CANN parts


def _find(versions: Iterable[str], wanted: str) -> str | None:
    """The host's spelling of ``wanted`` among ``versions`` (the newest spelling wins when several match)."""
    found = [version for version in versions if same_version(version, wanted)]
    return found[-1] if found else None


def _cann_steps(desired: DesiredStack, state: HostState) -> tuple[InstallStep, ...]:
    cann, wanted = state.cann, desired.cann
    active = cann.active if cann.active and same_version(cann.active, wanted) else None

    toolkit_dir = _find(cann.installed, wanted)
    if active:
        toolkit = InstallStep("toolkit", "none", wanted, active, cann.active, None, f"CANN {active} is active.")
    elif toolkit_dir:
        toolkit = InstallStep("toolkit", "switch", wanted, toolkit_dir, cann.active, None,
                              f"CANN {toolkit_dir} is installed side by side, CANN {cann.active or 'none'} is active.")
    else:
        now = f"CANN {cann.active} is active" if cann.active else "No CANN toolkit is installed"
        toolkit = InstallStep("toolkit", "install", wanted, wanted, cann.active, desired.toolkit_run,
                              f"{now}, {wanted} wanted.")

    kernels_dir = _find(cann.kernels_installed_for, wanted)
    package = desired.kernels_package
    if kernels_dir and toolkit.action == "none":
        kernels = InstallStep("kernels", "none", wanted, kernels_dir, cann.active, None,
                              f"{package} {kernels_dir} is installed into the active CANN.")
    elif kernels_dir:
        # The kernels live in the version directory (opp_kernel): latest/ brings them along with the toolkit.
        kernels = InstallStep("kernels", "switch", wanted, kernels_dir, cann.active, None,
                              f"{package} {kernels_dir} is installed into CANN {kernels_dir}; latest/opp_kernel "
                              "follows the toolkit switch.")
    else:
        kernels = InstallStep("kernels", "install", wanted, wanted, cann.active, desired.kernels_run,
                              f"{package} {wanted} is not installed into CANN {wanted}.")

    nnal_installed = (*cann.nnal_installed, *([cann.nnal_version] if cann.nnal_version else []))
    nnal_dir = _find(nnal_installed, wanted)
    if cann.nnal_version and same_version(cann.nnal_version, wanted):
        nnal = InstallStep("nnal", "none", wanted, nnal_dir or wanted, cann.nnal_version, None,
                           f"NNAL {cann.nnal_version} is active.")
    elif nnal_dir:
        nnal = InstallStep("nnal", "switch", wanted, nnal_dir, cann.nnal_version, None,
                           f"NNAL {nnal_dir} is installed side by side, NNAL {cann.nnal_version or 'none'} is active.")
    else:
        now = f"NNAL {cann.nnal_version} is active" if cann.nnal_version else "NNAL is not installed"
        nnal = InstallStep("nnal", "install", wanted, wanted, cann.nnal_version, desired.nnal_run,
                           f"{now}, {wanted} wanted.")
    return toolkit, kernels, nnal


# --------------------------------------------------------------------------- what a switch writes


def switched_version_cfg(text: str, version: str) -> str:
    """``latest/version.cfg`` after switching to the installed ``version``.

    Every sub-package that has ``version`` in its ``*_installed_version`` runs it (``running`` and ``upgrade``
    name it); one that lacks it (kernels never installed into that version) runs nothing; every installed
    version stays listed, for the next switch (ascend-interfaces.md section 4.4).
    """
    cfg = vf.parse_version_cfg(text)
    switched: vf.VersionCfg = {}
    for component, entry in cfg.items():
        installed = list(entry.get("installed", []))
        match = [pair for pair in installed if same_version(pair[1], version)]
        running = [tuple(match[-1])] if match else []
        switched[component] = {"running": running, "upgrade": list(running), "installed": installed}
    return vf.render_version_cfg(switched)


# --------------------------------------------------------------------------- downgrades

_DOWNGRADE_TITLES = {"driver": "driver", "firmware": "firmware", "toolkit": "CANN"}


def downgrades(steps: Iterable[InstallStep], desired: DesiredStack, state: HostState) -> list[str]:
    """The parts the steps would move to an *older* version than the host runs, each "CANN 8.5.0 -> 8.3.RC2".

    Provision refuses these without ``--allow-downgrade`` (issue 20): after ``dsctl upgrade`` moved a fleet, an
    inventory still naming the old stack would otherwise switch ``latest/`` back silently. Kernels and NNAL follow
    the toolkit and are not named again. vllm-ascend compares the tag the inventory names with the version the
    active serving venv holds (PEP 440 through ``packaging``: wheel versions, not Ascend ones)."""
    found = [f"{_DOWNGRADE_TITLES[step.component]} {step.current} -> {step.target}" for step in steps
             if step.component in _DOWNGRADE_TITLES and step.action != "none" and step.current
             and compare_versions(step.wanted, step.current) < 0]
    running = state.serving.packages.get("vllm-ascend")
    if desired.vllm_ascend and running:
        from packaging.version import InvalidVersion, Version

        try:
            older = Version(desired.vllm_ascend.lstrip("v")) < Version(running)
        except InvalidVersion:
            older = False
        if older:
            found.append(f"vllm-ascend {running} -> {desired.vllm_ascend.lstrip('v')}")
    return found
