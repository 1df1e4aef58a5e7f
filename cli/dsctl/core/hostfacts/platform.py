"""Which operating systems, kernels, interpreters and machine sizes an Ascend host may have (pure rules).

One set of rules for the preflight role (through the ``dsctl_platform_blockers`` filter, before any change) and
for ``dsctl check --ready`` (on facts gathered without Python on the host, dsctl.core.hostfacts.readyprobe).
Each blocker is one sentence naming what the host has, what is needed and the fix.

Sources:
- OS list: the Ascend HDK / CANN installation guides' "supported operating systems" tables for Atlas 800T/800I A2
  (openEuler, Kylin, EulerOS, Huawei Cloud EulerOS (HCE), Ubuntu, with the releases named below); dsctl
  accepts any release of a named family where the table lists no release (marked so in the table). Checked
  against: CANN 8.0.0 release notes, "Software Installation" (Atlas 800T A2 gains CULinux 3.0, EulerOS 2.12,
  Kylin V10 SP3; hiascend.com canncommercial/800 releasenote_0002), and MindX DL toolbox "Supported OSs", which
  names each release's default kernel (Ubuntu 20.04: 5.4.0, EulerOS 2.8/2.10: 4.19, openEuler 20.03 LTS: 4.19,
  openEuler 22.03: 5.10, Kylin V10: 4.19; hiascend.com mindx-dl/300 toolboxug_0007): the kernel floors below.
- Kernel >= 5.10, RAM >= 64 GB, free disk >= 200 GB: the deployment guides' prerequisites
  (../shared/reference/field-practice.md, "Deployment steps the guides give"). An OS release whose own kernel is
  older (Kylin V10 ships 4.19, Ubuntu 20.04 5.4) is in Ascend's table with that kernel: the table's floor wins
  for it, so a supported host is not refused for the kernel it is supported with.
- Python: the vllm-ascend matrix row's ``python`` range (cli/dsctl/data/releases.yaml, from vllm-ascend's
  installation.md "Requirements": ">= 3.10, < 3.12" at v0.13.0).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

SUPPORTED_ARCH = ("aarch64", "x86_64")
# The guides' kernel floor, used where the OS table names no older kernel for the release.
DEFAULT_MIN_KERNEL = "5.10"


@dataclass(frozen=True)
class OsEntry:
    family: str  # os-release ID, lower case
    name: str
    releases: tuple[str, ...]  # os-release VERSION_ID values; () = the table names no release
    min_kernel: Mapping[str, str] | None = None  # release -> the kernel that release ships (older than 5.10)


# Ascend HDK/CANN install guides, "supported operating systems" (Atlas 800T A2 / 800I A2).
SUPPORTED_OS: tuple[OsEntry, ...] = (
    OsEntry("openeuler", "openEuler", ("20.03", "22.03", "24.03"), {"20.03": "4.19"}),
    OsEntry("kylin", "Kylin", ("V10",), {"V10": "4.19"}),
    OsEntry("euleros", "EulerOS", ("2.0",), {"2.0": "4.19"}),  # EulerOS 2.x SP8..SP12 all say VERSION_ID="2.0"
    OsEntry("hce", "Huawei Cloud EulerOS", ("2.0",)),
    OsEntry("ubuntu", "Ubuntu", ("20.04", "22.04", "24.04"), {"20.04": "5.4"}),
    # Further families the HDK guides list for some boards; dsctl has not seen their tables' releases.
    OsEntry("centos", "CentOS", ("7", "7.6")),
    OsEntry("bclinux", "BC-Linux", ()),
    OsEntry("uos", "UOS", ()),
    OsEntry("ctyunos", "CTyunOS", ()),
)
# Families a site may opt into with dsctl_extra_supported_os (no Ascend table lists them).
OPT_IN_OS = ("debian", "rhel", "rocky")


@dataclass(frozen=True)
class OsRelease:
    id: str | None
    version_id: str | None
    pretty_name: str | None
    id_like: tuple[str, ...] = ()

    def shown(self) -> str:
        return self.pretty_name or " ".join(p for p in (self.id, self.version_id) if p) or "an unknown OS"


def parse_os_release(text: str | None) -> OsRelease:
    """/etc/os-release (KEY=value, shell quoting) -> its ID, VERSION_ID, PRETTY_NAME and ID_LIKE."""
    values: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value.strip("\"'")]
        values[key.strip()] = " ".join(words)
    id_like = tuple(word.lower() for word in values.get("ID_LIKE", "").split())
    return OsRelease(id=(values.get("ID") or None), version_id=values.get("VERSION_ID") or None,
                     pretty_name=values.get("PRETTY_NAME") or None, id_like=id_like)


def _entry(family: str) -> OsEntry | None:
    return next((entry for entry in SUPPORTED_OS if entry.family == family), None)


def _table_text() -> str:
    return "; ".join(f"{e.name} {'/'.join(e.releases)}" if e.releases else e.name for e in SUPPORTED_OS[:5])


@dataclass(frozen=True)
class Blocker:
    check: str  # "os" | "arch" | "kernel" | "memory" | "disk" | "python" | "packages" | "npus" | "facts"
    sentence: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "sentence": self.sentence, "fix": self.fix}

    def line(self) -> str:
        return f"{self.sentence} Fix: {self.fix}"


def os_blocker(os_id: str | None, version_id: str | None, extra: Iterable[str] = (),
               pretty: str | None = None) -> Blocker | None:
    family = (os_id or "").lower()
    shown = pretty or " ".join(p for p in (os_id, version_id) if p) or "an unknown OS (no /etc/os-release)"
    if family in {str(name).lower() for name in extra}:
        return None
    entry = _entry(family)
    if entry is None:
        opt_in = (f" or, if the site accepts an OS no Ascend table lists, add {family} to dsctl_extra_supported_os"
                  if family else "")
        return Blocker("os", f"{shown} is not an OS the Ascend packages support ({_table_text()}).",
                       f"install a supported OS{opt_in}")
    if entry.releases and (version_id or "") not in entry.releases:
        return Blocker("os", f"{shown} is not a release Ascend's table lists for {entry.name} "
                             f"({', '.join(entry.releases)}).",
                       f"install {entry.name} {' or '.join(entry.releases)}, or add {family} to "
                       "dsctl_extra_supported_os to accept this release")
    return None


def kernel_floor(os_id: str | None, version_id: str | None, configured: str = DEFAULT_MIN_KERNEL) -> str:
    entry = _entry((os_id or "").lower())
    if entry is not None and entry.min_kernel and (version_id or "") in entry.min_kernel:
        return entry.min_kernel[version_id or ""]
    return configured


def kernel_tuple(release: str) -> tuple[int, ...]:
    """"5.10.0-60.18.0.50.oe2203.aarch64" -> (5, 10, 0); the leading dotted numbers only."""
    found = re.match(r"\d+(?:\.\d+)*", release.strip())
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def kernel_blocker(kernel: str | None, floor: str) -> Blocker | None:
    have = kernel_tuple(kernel or "")
    if not have:
        return Blocker("kernel", f"the kernel release could not be read ({kernel!r}).", "check `uname -r` on the host")
    if have < kernel_tuple(floor):
        return Blocker("kernel", f"kernel {kernel} is older than {floor}, the oldest the Ascend driver is "
                                 "supported on for this OS.",
                       "upgrade the kernel (with its kernel-devel/headers for the driver's DKMS build) or set "
                       "dsctl_min_kernel_version if the site's table names an older one")
    return None


def parse_python_version(output: str | None) -> str | None:
    """``python --version`` output ("Python 3.9.9", Python 2 prints it on stderr) -> "3.9.9"."""
    found = re.search(r"^Python (\d+\.\d+(?:\.\d+)?\S*)", output or "", re.M)
    return found.group(1) if found else None


def python_in_range(version: str, specifier: str) -> bool | None:
    """True/False against a PEP 440 range; None when either cannot be read (the caller says so, never guesses)."""
    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


def python_blocker(interpreter: str, output: str | None, rc: int | None, needed: str | None,
                   vllm_ascend: str | None) -> Blocker | None:
    """The serving venv's interpreter against the matrix row's range; None when fine or nothing is needed."""
    if not needed:
        return None
    row = f"vllm-ascend {vllm_ascend}" if vllm_ascend else "the serving stack"
    fix = (f"set dsctl_serving_python to a Python {needed} interpreter on the host (e.g. python3.11 from the "
           "OS packages: dnf/yum install python3.11, or apt install python3.11)")
    version = parse_python_version(output)
    if version is None:
        said = (output or "").strip().splitlines()
        return Blocker("python", f"serving Python {interpreter} did not answer --version (rc {rc}"
                                 f"{': ' + said[-1][:160] if said else ''}); {row} needs Python {needed}.", fix)
    verdict = python_in_range(version, needed)
    if verdict is False:
        return Blocker("python", f"serving Python {interpreter} is {version}; {row} needs Python {needed}.", fix)
    return None


def size_blockers(mem_total_mb: int | None, min_memory_gb: int, disk_path: str | None, disk_free_mb: int | None,
                  min_free_disk_gb: int) -> list[Blocker]:
    found = []
    if mem_total_mb is None or mem_total_mb < min_memory_gb * 1024:
        have = "unknown" if mem_total_mb is None else f"{mem_total_mb / 1024:.1f} GB"
        found.append(Blocker("memory", f"memory is {have}; at least {min_memory_gb} GB is required.",
                             "use a host with more RAM, or lower dsctl_min_memory_gb if the site knows it suffices"))
    if disk_free_mb is None or disk_free_mb < min_free_disk_gb * 1024:
        have = "unknown" if disk_free_mb is None else f"{disk_free_mb / 1024:.1f} GB"
        found.append(Blocker("disk", f"{disk_path or 'the install path'} has {have} free; at least "
                                     f"{min_free_disk_gb} GB is required.",
                             "free disk space there, or lower dsctl_min_free_disk_gb"))
    return found


def platform_blockers(system: Mapping[str, Any], settings: Mapping[str, Any], stack: Mapping[str, Any] | None,
                      python: Mapping[str, Any] | None) -> list[Blocker]:
    """Everything about the machine itself that stops provision: OS, arch, kernel, memory, disk, serving Python.

    ``system``: HostState.system as a dict (arch, kernel, os_id, os_version, os_pretty_name, mem_total_mb,
    disk_path, disk_free_mb); ``settings``: the host's validated settings without the dsctl_ prefix;
    ``python``: {"output", "rc"} of ``<dsctl_serving_python> --version`` (None: not asked).
    """
    found: list[Blocker] = []
    arch = system.get("arch")
    if arch not in SUPPORTED_ARCH:
        found.append(Blocker("arch", f"architecture {arch or 'unknown'} has no Ascend packages.",
                             f"use an {' or '.join(SUPPORTED_ARCH)} host"))
    os_problem = os_blocker(system.get("os_id"), system.get("os_version"),
                            settings.get("extra_supported_os") or (), system.get("os_pretty_name"))
    if os_problem:
        found.append(os_problem)
    floor = kernel_floor(system.get("os_id"), system.get("os_version"),
                         str(settings.get("min_kernel_version") or DEFAULT_MIN_KERNEL))
    kernel_problem = kernel_blocker(system.get("kernel"), floor)
    if kernel_problem:
        found.append(kernel_problem)
    found += size_blockers(system.get("mem_total_mb"), int(settings.get("min_memory_gb", 64)),
                           system.get("disk_path"), system.get("disk_free_mb"),
                           int(settings.get("min_free_disk_gb", 200)))
    if python is not None and stack:
        python_problem = python_blocker(str(settings.get("serving_python") or "/usr/bin/python3"),
                                        python.get("output"), python.get("rc"), stack.get("python"),
                                        stack.get("vllm_ascend"))
        if python_problem:
            found.append(python_problem)
    return found
