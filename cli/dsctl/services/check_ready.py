"""The check --ready verb: what would stop `dsctl provision` on each host, read without changing anything.

The hosts run only a POSIX shell script (Ansible's raw, so a host whose Python is too old for Ansible's modules
is read all the same); the rules are dsctl.core.fleet.readiness's, on the controller.
"""

from __future__ import annotations

from typing import Any

from dsctl.core.fleet import readiness
from dsctl.core.hostfacts import readyprobe
from dsctl.core.inventory import host_plan
from dsctl.errors import ExitStatus
from dsctl.services.check import CheckInputs, CheckResult, exit_status_of
from dsctl.services.fleet import load_fleet
from dsctl.services.ports import PlaybookRunner, ProgressSink, no_progress
from dsctl.services.runs import failure_lines
from dsctl.services.upgrade import read_package_sums

PLAYBOOK = "ready.yml"
SCRIPTS_VAR = "dsctl_ready_scripts"
OUTPUT_FACT = "ascend_ready_output"


def check_ready(runner: PlaybookRunner, inputs: CheckInputs, progress: ProgressSink = no_progress) -> CheckResult:
    """Rows per host: {host, status (ready | blocked | unreachable | failed), system, python, npus, packages,
    blockers}; exit 0 all ready, 3 any blocked or failed, 5 only unreachable ones."""
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit)
    settings = {host: {key.removeprefix("dsctl_"): value for key, value in validated.model_dump(mode="json").items()}
                for host, validated in fleet.settings.items()}
    scripts = {host: readyprobe.script(str(values["install_path"]), str(values["serving_python"]))
               for host, values in settings.items()}
    run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=True, vault=inputs.vault,
                     extra_vars={SCRIPTS_VAR: host_plan.as_extra_var(scripts)},
                     on_event=progress, artifacts_dir=inputs.artifacts_dir)
    sums_by_source: dict[str, dict[str, str]] = {}
    rows: list[dict[str, Any]] = []
    for name in sorted(run.hosts):
        outcome = run.hosts[name]
        output = outcome.facts.get(OUTPUT_FACT)
        if output is None or name not in settings:
            rows.append({"host": name, "status": "unreachable" if outcome.status == "unreachable" else "failed",
                         "blockers": [], "system": {}, "python": {}, "packages": []})
            continue
        host_settings = settings[name]
        source = str(host_settings["package_source"])
        if source not in sums_by_source:
            sums_by_source[source] = read_package_sums(source)
        arch = readyprobe.parse_output(str(output), "/", "").get("arch") or "x86_64"
        stack = host_plan.stack_for_arch(host_plan.stack_template(fleet.settings[name]), arch)
        verdict = readiness.assess(str(output), host_settings, stack, sums_by_source[source])
        rows.append({"host": name, **verdict.to_dict()})
    statuses = [{"ready": "ok", "blocked": "error"}.get(row["status"], row["status"]) for row in rows]
    status = exit_status_of(statuses) if rows else ExitStatus.VALIDATION_FAILED
    return CheckResult(hosts=tuple(rows), exit_status=status, errors=tuple(failure_lines(run)), run=run)
