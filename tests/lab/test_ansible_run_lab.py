"""run_playbook against lab hosts: real ansible-playbook, sshd, callback plugin."""

from __future__ import annotations

import io
import json
import os
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from dsctl.adapters.ansible_run import run_playbook
from dsctl.errors import ExitStatus
from dsctl.ui_progress import PlaybookProgress

from .conftest import requires_lab

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "playbooks" / "events_probe.yml"
pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, bare_lab):
    state = tmp_path_factory.mktemp("state-home-with-a-deliberately-long-name-for-control-sockets")
    secret = f"fake-secret-{uuid.uuid4().hex}"
    probe_id = uuid.uuid4().hex
    streamed: list[dict] = []
    shown = io.StringIO()
    progress = PlaybookProgress(Console(file=shown, width=200, color_system=None), live=False)

    def on_event(event: dict) -> None:
        streamed.append(event)
        progress(event)

    saved = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        run = run_playbook(str(PROBE), bare_lab.inventory, extra_vars={"probe_id": probe_id, "probe_secret": secret},
                           on_event=on_event, timeout=300)
    finally:
        if saved is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = saved
    return run, streamed, shown.getvalue(), secret, probe_id, state


def test_host_statuses_and_exit_status(probe_run):
    run, *_ = probe_run
    assert {name: host.status for name, host in run.hosts.items()} == {
        "lab-01": "changed", "lab-02": "failed", "lab-03": "changed"}
    assert run.rc == 2 and run.stats_seen
    assert run.exit_status() == ExitStatus.PLAYBOOK_FAILED
    assert run.plays == ["Probe the dsctl events stream"]


def test_failing_task_and_installer_tail(probe_run):
    run, *_ = probe_run
    failed = run.hosts["lab-02"]
    assert failed.failed_task == "Fail on lab-02 only" and failed.failed_role is None
    assert failed.failed_msg == "non-zero return code" and failed.failed_rc == 1
    assert failed.stdout_tail == [f"installer log line {i}" for i in range(11, 31)]
    assert failed.stderr_tail == ["installer: giving up"]
    assert (failed.ok, failed.changed, failed.failed) == (4, 1, 1)  # ok includes changed
    assert run.hosts["lab-01"].failed_task is None


def test_secret_is_nowhere_in_the_logs(probe_run):
    run, streamed, shown, secret, *_ = probe_run
    for path in (run.events_file, run.log, run.artifacts / "run.json"):
        assert secret not in path.read_text(), path
    assert secret not in shown
    hidden = [e for e in streamed if e.get("task") == "Use a secret without logging it" and e.get("host")
              and e["event"] != "runner_start"]
    assert sorted(e["host"] for e in hidden) == ["lab-01", "lab-03"]
    assert all(e["msg"] == "output hidden (no_log)" and "stdout_tail" not in e for e in hidden)


def test_events_stream_in_file_order(probe_run):
    run, streamed, *_ = probe_run
    from_file = [json.loads(line) for line in run.events_file.read_text().splitlines()]
    assert streamed == from_file
    assert streamed[0]["event"] == "playbook_start" and streamed[-1]["event"] == "stats"
    loop = [e for e in streamed if e.get("task") == "Echo items in a loop" and e["event"] == "runner_ok"]
    assert sorted(e["host"] for e in loop) == ["lab-01", "lab-02", "lab-03"]  # one aggregated result per host
    assert all(e["stdout_tail"] == ["second"] for e in loop)


def test_facts_are_captured_by_prefix(probe_run):
    run, _, _, _, probe_id, _ = probe_run
    for name in ("lab-01", "lab-02", "lab-03"):
        assert run.hosts[name].facts == {"dsctl_probe_host": name, "ascend_probe_id": probe_id}


def test_progress_lines(probe_run):
    _, _, shown, *_ = probe_run
    lines = shown.splitlines()
    assert "PLAY Probe the dsctl events stream" in lines
    assert "TASK Write a probe file under /tmp" in lines
    assert "lab-01  changed      Write a probe file under /tmp" in lines
    assert "lab-02  failed       Fail on lab-02 only: non-zero return code" in lines
    assert not any(line.startswith("lab-") and line.split()[1] in ("ok", "skipped") for line in lines)


def test_artifacts_outside_the_repo(probe_run):
    run, *_, state = probe_run
    assert not run.artifacts.resolve().is_relative_to(REPO)
    assert run.artifacts.parent == state / "dsctl" / "runs"
    assert "PLAY RECAP" in run.log.read_text()
    assert oct((run.artifacts / "extra_vars.json").stat().st_mode & 0o777) == "0o600"
