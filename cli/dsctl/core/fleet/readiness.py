"""`dsctl check --ready` for one host: everything that would stop `dsctl provision`, from facts read without Python.

Pure: takes the probe's output (dsctl.core.hostfacts.readyprobe), the host's validated settings, its desired stack
for the host's architecture and the package source's manifest, and returns the blockers. The machine rules are
dsctl.core.hostfacts.platform's (the preflight role uses the same), the packages a host needs come from
dsctl.core.fleet.install_steps (the same decision provision acts on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.fleet import install_steps
from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.hostfacts import platform, readyprobe
from dsctl.core.hostfacts.hoststate import HostState, parse_host
from dsctl.core.hostfacts.platform import Blocker


@dataclass(frozen=True)
class Readiness:
    state: HostState
    system: dict[str, Any]
    python: dict[str, Any] | None
    packages: tuple[str, ...]
    blockers: tuple[Blocker, ...] = field(default=())

    @property
    def ready(self) -> bool:
        return not self.blockers

    def to_dict(self) -> dict[str, Any]:
        python = self.python or {}
        return {"status": "ready" if self.ready else "blocked", "system": self.system,
                "python": {"path": python.get("path"),
                           "version": platform.parse_python_version(python.get("output"))},
                "npus": {"count": self.state.npus.count, "present": self.state.npus.present,
                         "unhealthy": [{"npu": u.npu, "health": u.health} for u in self.state.npus.unhealthy]},
                "packages": list(self.packages), "blockers": [b.to_dict() for b in self.blockers]}


def assess(output: str, settings: Mapping[str, Any], stack: Mapping[str, Any] | None,
           sums: Mapping[str, str] | None) -> Readiness:
    """``settings``: validated, without the dsctl_ prefix; ``stack``: DesiredStack dict for this host's arch
    (installer names resolved); ``sums``: the package source's SHA256SUMS ({} if unreadable, None if not read)."""
    install_path = str(settings.get("install_path") or "/usr/local/Ascend")
    python_path = str(settings.get("serving_python") or "/usr/bin/python3")
    raw = readyprobe.parse_output(output, install_path, python_path)
    os_release = platform.parse_os_release(raw.get("os_release"))
    system = readyprobe.system_of(raw, {"id": os_release.id, "version_id": os_release.version_id,
                                        "pretty_name": os_release.pretty_name})
    state = parse_host(raw)
    blockers = platform.platform_blockers(system, settings, stack, raw.get("serving_python") or {})
    if not raw.get("arch"):
        blockers.insert(0, Blocker("facts", "the host's probe printed nothing dsctl could read.",
                                   "run the probe by hand (`dsctl check --ready -v`) and look at its output"))
    packages: tuple[str, ...] = ()
    if stack:
        steps = install_steps.plan_install_steps(DesiredStack.from_dict(dict(stack)), state)
        packages = tuple(install_steps.packages_needed(steps))
        if sums is not None:
            missing = [name for name in packages if name not in sums]
            if missing:
                blockers.append(Blocker("packages", f"the package source lacks {', '.join(missing)} "
                                                    f"({raw.get('arch')}).",
                                        "add them with their checksums to dsctl_package_source's SHA256SUMS"))
    blockers += _npu_blockers(state, settings)
    return Readiness(state=state, system=system, python=raw.get("serving_python"), packages=packages,
                     blockers=tuple(blockers))


def _npu_blockers(state: HostState, settings: Mapping[str, Any]) -> list[Blocker]:
    npus = state.npus
    if not npus.present:
        return []  # no driver yet: provision installs it, then the NPUs are counted
    if npus.error:
        return [Blocker("npus", f"npu-smi: {npus.error}", "fix what npu-smi reports (see `npu-smi info` on the host)")]
    found = []
    wanted = settings.get("npu_count")
    if wanted is not None and npus.count != wanted:
        found.append(Blocker("npus", f"npu-smi shows {npus.count} NPUs, the inventory expects {wanted}.",
                             "fix dsctl_npu_count or the server's NPUs"))
    if npus.unhealthy and not settings.get("force_unhealthy"):
        chips = ", ".join(f"NPU {u.npu} {u.health}" for u in npus.unhealthy)
        found.append(Blocker("npus", f"unhealthy chips: {chips}.",
                             "fix the chips first, or set dsctl_force_unhealthy: true to install anyway"))
    return found
