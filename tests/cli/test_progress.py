"""Progress on stderr: one row (live) or one line per host per stage, not one per task; the probe's bar."""

from __future__ import annotations

import io
import itertools

from rich.console import Console

from dsctl.ui_progress import PlaybookProgress, ProbeProgress, StageProgress, playbook_progress

HOSTS = ("lab-01", "lab-02", "lab-03")
ROLES = ("ascend_preflight", "npu_driver", "cann")


def provision_events(tasks_per_role: int = 20) -> list[dict]:
    """What 3 hosts x 3 roles x 20 tasks stream: 360 results, and lab-02 fails in cann."""
    events = [{"event": "playbook_start"}, {"event": "play_start", "play": "Provision NPU servers"}]
    for host in HOSTS:
        events += [{"event": "runner_start", "host": host, "task": "Check the fleet", "role": None},
                   {"event": "runner_ok", "host": host, "task": "Check the fleet", "role": None}]
    for role, number in itertools.product(ROLES, range(tasks_per_role)):
        task = f"step {number}"
        events.append({"event": "task_start", "task": task, "role": role})
        for host in HOSTS:
            if host == "lab-02" and role == "cann" and number > 5:
                continue
            events.append({"event": "runner_start", "host": host, "task": task, "role": role})
            if host == "lab-02" and role == "cann" and number == 5:
                events.append({"event": "runner_failed", "host": host, "task": task, "role": role,
                               "msg": "installer failed"})
            else:
                kind = "runner_changed" if number % 4 == 0 else "runner_ok"
                events.append({"event": kind, "host": host, "task": task, "role": role})
    events.append({"event": "stats", "hosts": {
        "lab-01": {"ok": 61, "changed": 15}, "lab-02": {"ok": 46, "changed": 12, "failures": 1},
        "lab-03": {"ok": 61, "changed": 15}}})
    return events


def clock():
    ticks = itertools.count()
    return lambda: float(next(ticks))


def test_plain_lines_are_one_per_host_per_stage_change():
    out = io.StringIO()
    progress = StageProgress(Console(file=out, width=200, color_system=None), live=False, clock=clock())
    for event in provision_events():
        progress(event)
    lines = out.getvalue().splitlines()
    # 4 stages (the play's own task, then 3 roles) + the outcome for each of 3 hosts, and one failure line
    assert len(lines) == 3 * 4 + 3 + 1
    for host in HOSTS:
        # stage and outcome lines end with the counts; the failure line with the task and its message
        stages = [line.split()[1] for line in lines if line.startswith(host) and line.endswith("]")]
        expected_end = "failed" if host == "lab-02" else "done"
        assert stages == ["Provision", *ROLES, expected_end], (host, lines)
    assert "lab-02  failed  cann : step 5: installer failed" in lines
    done = next(line for line in lines if line.startswith("lab-01  done"))
    assert done.endswith("ok 61, changed 15, failed 0]")


def test_live_rows_show_stage_task_and_counts():
    out = io.StringIO()
    progress = StageProgress(Console(file=out, width=200, force_terminal=True), live=True, clock=clock(),
                             refresh_per_second=20)
    events = provision_events()
    stop = next(i for i, e in enumerate(events) if e.get("role") == "cann")  # npu_driver just finished
    with progress:
        for event in events[:stop]:
            progress(event)
        rows = progress.rows
        assert set(rows) == set(HOSTS)
        assert (rows["lab-01"].stage, rows["lab-01"].task) == ("npu_driver", "step 19")
        assert rows["lab-01"].ok == 1 + 40 and rows["lab-01"].changed == 10
        table = Console(file=io.StringIO(), width=200, color_system=None)
        table.print(progress.table())
        cells = [line.split() for line in table.file.getvalue().splitlines()]
        assert cells[0] == ["host", "stage", "task", "time", "ok", "changed", "failed"]
        assert ["lab-03", "npu_driver", "step", "19"] == cells[3][:4] and cells[3][-3:] == ["41", "10", "0"]
        for event in events[stop:]:
            progress(event)
    assert progress._view is None  # closed by the stats event
    assert rows["lab-02"].state == "failed" and rows["lab-01"].state == "done"
    shown = out.getvalue()
    assert "lab-02  failed  cann : step 5: installer failed" in shown
    assert shown.count("installer failed") == 1  # printed once above the view; the view shows the state


def test_verbose_keeps_the_task_lines():
    assert isinstance(playbook_progress(verbose=True), PlaybookProgress)
    assert isinstance(playbook_progress(), StageProgress)
    out = io.StringIO()
    progress = PlaybookProgress(Console(file=out, width=200, color_system=None), live=False)
    for event in provision_events(4):
        progress(event)
    assert "TASK npu_driver : step 2" in out.getvalue().splitlines()


def test_probe_progress_notes_and_bar():
    out = io.StringIO()
    with ProbeProgress(Console(file=out, width=120, force_terminal=True), notes=True) as progress:
        progress({"event": "dsctl_note", "msg": "probing http://x/v1/completions [model m]"})
        progress({"event": "dsctl_probe_start", "total": 3})
        for success in (True, False, True):
            progress({"event": "dsctl_probe_request", "success": success})
        assert progress._bar is not None and progress._bar.tasks[0].completed == 3
        assert progress.failed == 1
    assert progress._bar is None
    assert "probing http://x/v1/completions [model m]" in out.getvalue()
    quiet = io.StringIO()
    with ProbeProgress(Console(file=quiet, width=120), notes=False, bar=False) as progress:
        progress({"event": "dsctl_note", "msg": "hidden"})
        progress({"event": "dsctl_probe_start", "total": 3})
    assert quiet.getvalue() == ""


def test_a_finished_trial_shows_its_parameters_as_the_table_does():
    """Knob values in the trial lines as in the result table (0.82, true), not Python's reprs of sampled floats."""
    from dsctl.ui_tune import TuneProgress

    console = Console(file=io.StringIO(), width=200)
    progress = TuneProgress(console, live=False)
    progress({"event": "dsctl_tune_trial", "phase": "told", "number": 3, "status": "screened", "evaluated": 1,
              "budget": 6, "feasible": 0, "crashed": 0,
              "config": {"gpu_memory_utilization": 0.8200000000000001, "enable_prefix_caching": True}})
    line = console.file.getvalue()
    assert "gpu_memory_utilization=0.82 enable_prefix_caching=true |" in line, line
