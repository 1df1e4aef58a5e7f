"""Start lab hosts from an installed state by running the lab's own installers on them.

The state files a preinstalled host carries are therefore the ones the
installers write, not a copy made for the occasion.  Order and flags follow
what an operator (or ascend-deployer) runs on a fresh server: create the run
user, driver then firmware, then the CANN toolkit, kernels/ops and NNAL (those two
with the toolkit's set_env.sh sourced), then reboot (ascend-interfaces.md sections
5.2, 6.1, 6.2).
"""

from __future__ import annotations

import platform
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dsctl import data
from dsctl.core.lab.plan import LabSpec
from dsctl.errors import DsctlError, UsageError
from dsctl.lab import hosts
from dsctl.lab.hosts import LabPaths, Progress
from dsctl.lab.packages import PackageSpec, package_specs

RUN_USER = "HwHiAiUser"
CREATE_RUN_USER = (
    f"getent group {RUN_USER} >/dev/null || groupadd {RUN_USER}; "
    f"id {RUN_USER} >/dev/null 2>&1 || useradd -g {RUN_USER} -d /home/{RUN_USER} -m -s /bin/bash {RUN_USER}"
)
# Flags as ascend-deployer and the vllm-ascend installation guide pass them.
FLAGS = {
    "driver": ["--nox11", "--full", "--quiet", "--install-for-all",
               f"--install-username={RUN_USER}", f"--install-usergroup={RUN_USER}"],
    "firmware": ["--nox11", "--full", "--quiet"],
    "toolkit": ["--nox11", "--full", "--quiet"],
    "kernels": ["--nox11", "--install", "--quiet"],
    "nnal": ["--nox11", "--install", "--quiet"],
}


# Kernels/ops and NNAL run with the toolkit's env sourced, as vllm-ascend's guide says since #144.
TOOLKIT_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
NEEDS_TOOLKIT_ENV = ("kernels", "nnal")


@dataclass(frozen=True)
class InstallStep:
    component: str
    package: str

    @property
    def argv(self) -> list[str]:
        run = ["bash", f"/tmp/{self.package}", *FLAGS[self.component]]
        if self.component in NEEDS_TOOLKIT_ENV:
            return ["bash", "-c", '. "$0"; exec "$@"', TOOLKIT_ENV, *run]
        return run


def _choose(specs: list[PackageSpec], component: str, version: str, option: str) -> str:
    matches = [s.name for s in specs if s.metadata["component"] == component and s.metadata["version"] == version]
    if not matches:
        known = sorted({s.metadata["version"] for s in specs if s.metadata["component"] == component})
        raise UsageError(f"{option} {version!r} is not a release the lab ships; choose one of: {', '.join(known)}")
    return matches[0]


def plan(spec: LabSpec, arch: str | None = None) -> list[InstallStep]:
    """The installer runs for spec's --driver/--firmware/--cann; raises UsageError on an unknown version."""
    if not (spec.driver or spec.firmware or spec.cann):
        return []
    family = data.load("chips")["chips"][spec.chip]["family"]
    specs = package_specs(data.load("releases"), arch or platform.machine())
    hdk_families = {s.metadata["family"] for s in specs if s.metadata["component"] == "driver"}
    if spec.driver and family not in hdk_families:
        raise UsageError(
            f"--chip {spec.chip} needs {family} driver packages and the lab ships only "
            f"{', '.join(sorted(hdk_families))}; use --chip 910B3 or leave out --driver"
        )
    steps = []
    if spec.driver:
        steps.append(InstallStep("driver", _choose(specs, "driver", spec.driver, "--driver")))
    if spec.firmware:
        steps.append(InstallStep("firmware", _choose(specs, "firmware", spec.firmware, "--firmware")))
    if spec.cann:
        for component in ("toolkit", "kernels", "nnal"):
            steps.append(InstallStep(component, _choose(specs, component, spec.cann, "--cann")))
    return steps


def _install_on(paths: LabPaths, host: str, steps: list[InstallStep]) -> None:
    user = hosts.run_in_host(paths, host, ["sh", "-c", CREATE_RUN_USER])
    if user.returncode != 0:
        raise DsctlError(f"lab host {host}: creating {RUN_USER} failed: {user.stderr.strip()}")
    for step in steps:
        hosts.copy_into_host(paths, host, paths.packages / step.package, f"/tmp/{step.package}")
        result = hosts.run_in_host(paths, host, step.argv)
        if result.returncode != 0:
            tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-2:])
            raise DsctlError(f"lab host {host}: {step.package} exited {result.returncode}: {tail}")


def run(spec: LabSpec, paths: LabPaths, steps: list[InstallStep], progress: Progress) -> None:
    progress("installing " + ", ".join(step.package for step in steps))
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda host: _install_on(paths, host.name, steps), spec.members))
    if any(step.component in ("driver", "firmware") for step in steps):
        progress("rebooting hosts so the new driver and firmware take effect")
        hosts.reboot(paths, spec.members)
