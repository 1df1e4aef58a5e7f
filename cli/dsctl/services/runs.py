"""What a finished playbook run says about its hosts: failures with their log lines, hosts to re-run, versions."""

from __future__ import annotations

from typing import Any

from dsctl.adapters.ansible_run import PlaybookRun

LOG_LINES_SHOWN = 10
REPORT_FACT = "ascend_validate_report"


def failure_lines(run: PlaybookRun) -> list[str]:
    lines = []
    for name, host in sorted(run.hosts.items()):
        if host.status == "failed":
            lines.append(f"{name}: failed at {host.failed_label}: {host.failed_msg}")
            lines += [f"    {line}" for line in (host.stdout_tail or host.stderr_tail)[-LOG_LINES_SHOWN:]]
        elif host.status == "unreachable":
            lines.append(f"{name}: unreachable: {host.failed_msg}")
    return lines


def hosts_to_rerun(run: PlaybookRun) -> list[str]:
    return sorted(run.hosts_with("failed") + run.hosts_with("unreachable"))


def versions_summary(report: dict[str, Any]) -> dict[str, str]:
    """The validation report's versions as the tables show them ("25.5.0 (running 24.1.rc3)", "-")."""
    versions = report.get("versions", {})
    driver, firmware, cann = versions.get("driver", {}), versions.get("firmware", {}), versions.get("cann", {})

    def installed_running(item: dict[str, Any]) -> str:
        installed, running = item.get("installed"), item.get("running")
        if installed and running and installed != running:
            return f"{installed} (running {running})"
        return installed or running or "-"

    return {
        "driver": installed_running(driver),
        "firmware": installed_running(firmware),
        "cann": cann.get("active") or "-",
        "cann_others": ", ".join(v for v in cann.get("installed", []) if v != cann.get("active")),
        "torch_npu": versions.get("torch_npu") or "-",
        "vllm_ascend": versions.get("vllm_ascend") or "-",
    }
