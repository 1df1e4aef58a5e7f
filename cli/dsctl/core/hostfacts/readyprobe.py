"""What `dsctl check --ready` reads from a host that may have no usable Python: a POSIX sh script and its parser.

Kylin V10 ships Python 3.7 and ansible-core 2.19 needs 3.8 on the target, so its modules (ascend_facts) cannot
run there; the script runs through Ansible's ``raw`` (a plain shell command), only reads, and prints sections
that `parse_output` turns into the same raw mapping the ascend_facts collector returns (so
dsctl.core.hostfacts.hoststate parses both) plus the serving Python's ``--version``.

Every value put into the script is shell-quoted; the output markers cannot occur in the files read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from dsctl.core.hostfacts.hoststate import COLLECTOR_VERSION

MARK = "----dsctl-ready:"
DRIVER_ROOT = "/usr/local/Ascend"  # the driver ignores --install-path (ascend-interfaces.md section 5.2)
MAX_FILE_BYTES = 262144

_SECTION = re.compile(rf"^{re.escape(MARK)}([a-z_]+)(?::(.*))?----$")


def script(install_path: str, serving_python: str) -> str:
    """The shell script (one string for ``raw``); reads only, exits 0 whatever it finds."""
    q = shlex.quote
    ip = install_path.rstrip("/") or "/"
    files = {
        "driver_version_info": f"{DRIVER_ROOT}/driver/version.info",
        "firmware_version_info": f"{DRIVER_ROOT}/firmware/version.info",
        "ascend_install_info": "/etc/ascend_install.info",
        "cann_install_info": "/etc/Ascend/ascend_cann_install.info",
        "toolkit_version_cfg": f"{ip}/ascend-toolkit/latest/version.cfg",
        "opp_version_info": f"{ip}/ascend-toolkit/latest/opp/version.info",
        "nnal_version_info": f"{ip}/nnal/atb/latest/version.info",
        "os_release": "/etc/os-release",
    }
    lines = [
        "LC_ALL=C; export LC_ALL",
        f"s() {{ printf '\\n{MARK}%s----\\n' \"$1\"; }}",
        f"f() {{ [ -r \"$2\" ] && {{ printf '\\n{MARK}file:%s----\\n' \"$1\"; head -c {MAX_FILE_BYTES} \"$2\"; }}; }}",
        "s arch; uname -m",
        "s kernel; uname -r",
        "s boot_id; cat /proc/sys/kernel/random/boot_id 2>/dev/null",
        "s meminfo; grep '^MemTotal:' /proc/meminfo",
        f"p={q(ip)}; while [ ! -d \"$p\" ]; do p=$(dirname \"$p\"); done",
        "s disk; printf '%s\\n' \"$p\"; df -Pk \"$p\" | tail -n 1",
        *(f"f {name} {q(path)}" for name, path in files.items()),
        f"py={q(serving_python)}",
        "s python; if [ -x \"$py\" ]; then \"$py\" --version 2>&1; printf '\\nrc=%s\\n' \"$?\"; "
        "else printf '%s: not found or not executable\\nrc=127\\n' \"$py\"; fi",
        f"for i in {q(ip)}/ascend-toolkit/*/*-linux/ascend_toolkit_install.info; do [ -f \"$i\" ] || continue; "
        f"v=${{i#{ip}/ascend-toolkit/}}; v=${{v%%/*}}; [ \"$v\" = latest ] && continue; "
        f"printf '\\n{MARK}toolkit:%s----\\n' \"$v\"; head -c {MAX_FILE_BYTES} \"$i\"; "
        f"[ -d {q(ip)}/ascend-toolkit/\"$v\"/opp_kernel ] && printf '\\n{MARK}kernels:%s----\\n' \"$v\"; done",
        f"l={q(ip)}/ascend-toolkit/latest/set_env.sh; [ -L \"$l\" ] && {{ s latest; readlink \"$l\"; }}",
        f"for i in {q(ip)}/nnal/atb/*/version.info; do [ -f \"$i\" ] || continue; "
        f"v=${{i#{ip}/nnal/atb/}}; v=${{v%%/*}}; [ \"$v\" = latest ] && continue; "
        f"[ -L {q(ip)}/nnal/atb/\"$v\" ] && continue; printf '\\n{MARK}nnal:%s----\\n' \"$v\"; done",
        f"u=$(find {DRIVER_ROOT}/driver -name upgrade-tool 2>/dev/null | head -n 1); "
        "[ -n \"$u\" ] && { s upgrade_tool; printf '%s\\n' \"$u\"; }",
        "n=''; for c in /usr/local/bin/npu-smi /usr/local/sbin/npu-smi; do [ -x \"$c\" ] && { n=$c; break; }; done",
        "if [ -n \"$n\" ]; then s npu_smi_path; printf '%s\\n' \"$n\"; s npu_smi_info; "
        "timeout 30 \"$n\" info 2>&1; printf '\\nrc=%s\\n' \"$?\"; fi",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def _split(output: str) -> list[tuple[str, str | None, str]]:
    sections: list[tuple[str, str | None, str]] = []
    name: str | None = None
    arg: str | None = None
    body: list[str] = []
    for line in output.splitlines():
        found = _SECTION.match(line)
        if found:
            if name is not None:
                sections.append((name, arg, "\n".join(body)))
            name, arg, body = found.group(1), found.group(2), []
        elif name is not None:
            body.append(line)
    if name is not None:
        sections.append((name, arg, "\n".join(body)))
    # Each section starts after the newline printed before its marker; drop that blank line's counterpart.
    return [(n, a, text[:-1] if text.endswith("\n") else text) for n, a, text in sections]


def _with_rc(text: str) -> tuple[str, int | None]:
    lines = text.rstrip("\n").splitlines()
    if lines and lines[-1].startswith("rc="):
        try:
            rc = int(lines[-1][3:])
        except ValueError:
            rc = None
        return "\n".join(lines[:-1]).rstrip("\n") + "\n", rc
    return text, None


def parse_output(output: str, install_path: str, serving_python: str) -> dict[str, Any]:
    """The script's output -> an ascend_facts-shaped raw mapping (hoststate.parse_host reads it), with
    ``serving_python`` ({path, rc, output}) and ``os_release`` text added."""
    raw: dict[str, Any] = {
        "collector_version": COLLECTOR_VERSION, "install_path": install_path.rstrip("/") or "/",
        "files": {}, "toolkit_dirs": {}, "kernels_dirs": {}, "toolkit_latest": None, "nnal_dirs": {},
        "npu_smi": {"path": None, "info": None, "boards": {}}, "upgrade_tool": None, "serving": None,
        "run_user": None, "serving_python": None, "disk": None, "mem_total_mb": None,
    }
    os_text = None
    for name, arg, text in _split(output):
        value = text.strip()
        if name == "arch":
            raw["arch"] = value or None
        elif name == "kernel":
            raw["kernel"] = value or None
        elif name == "boot_id":
            raw["boot_id"] = value or None
        elif name == "meminfo":
            found = re.search(r"MemTotal:\s+(\d+)", value)
            raw["mem_total_mb"] = int(found.group(1)) // 1024 if found else None
        elif name == "disk":
            raw["disk"] = _disk(value)
        elif name == "file" and arg:
            if arg == "os_release":
                os_text = text
            else:
                raw["files"][arg] = text
        elif name == "python":
            said, rc = _with_rc(text)
            raw["serving_python"] = {"path": serving_python, "rc": rc, "output": said.strip()[:4096]}
        elif name == "toolkit" and arg:
            raw["toolkit_dirs"][arg] = text
            raw["kernels_dirs"].setdefault(arg, False)
        elif name == "kernels" and arg:
            raw["kernels_dirs"][arg] = True
        elif name == "latest":
            raw["toolkit_latest"] = value.split("/")[1] if value.startswith("../") and "/" in value[3:] else None
        elif name == "nnal" and arg:
            raw["nnal_dirs"][arg] = True
        elif name == "upgrade_tool":
            raw["upgrade_tool"] = value or None
        elif name == "npu_smi_path":
            raw["npu_smi"]["path"] = value or None
        elif name == "npu_smi_info":
            said, rc = _with_rc(text)
            raw["npu_smi"]["info"] = {"rc": rc, "stdout": said, "stderr": ""}
    raw["os_release"] = os_text
    return raw


def _disk(text: str) -> dict[str, Any] | None:
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    fields = lines[-1].split()
    # df -Pk: Filesystem 1024-blocks Used Available Capacity Mounted-on
    try:
        total_kb, free_kb = int(fields[1]), int(fields[3])
    except (IndexError, ValueError):
        return None
    return {"path": lines[0].strip(), "free_mb": free_kb // 1024, "total_mb": total_kb // 1024}


def system_of(raw: Mapping[str, Any], os_release: Mapping[str, Any]) -> dict[str, Any]:
    """The SystemState fields platform.platform_blockers reads, from the parsed output."""
    disk = raw.get("disk") or {}
    return {"arch": raw.get("arch"), "kernel": raw.get("kernel"), "os_id": os_release.get("id"),
            "os_version": os_release.get("version_id"), "os_pretty_name": os_release.get("pretty_name"),
            "mem_total_mb": raw.get("mem_total_mb"), "disk_path": disk.get("path"),
            "disk_free_mb": disk.get("free_mb")}
