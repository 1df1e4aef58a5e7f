"""The whole suite: Ctrl-C works in the tests whatever the harness that started them.

A background job of a non-interactive shell (a CI script's `cmd &`) starts with SIGINT ignored, and the tests'
own subprocesses (dsctl, ansible-playbook, the fake ansible) would inherit that: every test of interrupt handling
would then fail for a reason users do not have.  Python's own handler here gives those children the default
disposition again (a handler, unlike SIG_IGN, is not inherited across exec).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

signal.signal(signal.SIGINT, signal.default_int_handler)


# Seconds each test file took in a fresh-clone four-worker run of the suite (it prints them at its end; tests/lab/
# README.md lists the lab stories).
# Only the order in which pytest-xdist hands out files depends on it: the longest first, so that no long lab
# story starts last and runs alone at the end.  A file not listed counts as short.
FILE_SECONDS = {
    "tests/lab/test_multihost_deploy.py": 652,
    "tests/lab/test_deploy.py": 597,
    "tests/lab/test_upgrade.py": 564,
    "tests/lab/test_cann_switch.py": 475,
    "tests/lab/test_provision_upgrade.py": 423,
    "tests/lab/test_tune_live.py": 419,
    "tests/lab/test_provision_bare.py": 338,
    "tests/lab/test_gateway.py": 281,
    "tests/lab/test_npu_network.py": 148,
    "tests/lab/test_real_vllm_deploy.py": 371,  # 138 s alone: real vLLM starts three times
    "tests/realvllm/test_vllm_parser.py": 20,
    "tests/realvllm/test_refusals.py": 15,
    "tests/lab/test_deploy_inputs.py": 139,
    "tests/cli/test_tune_cli.py": 75,
    "tests/lab/test_lab_errors.py": 66,
    "tests/static/test_lint.py": 59,
    "tests/engine/test_evaluate_live.py": 43,
    "tests/lab/test_lab_bare.py": 42,
    "tests/lab/test_lab_installed.py": 36,
    "tests/unit/test_upgrade_verb.py": 35,
    "tests/lab/test_npu_plane.py": 34,
    "tests/cli/test_battery_paths.py": 53,
    "tests/cli/test_battery_hosts.py": 45,
    "tests/cli/test_battery_plans.py": 23,
    "tests/cli/test_battery_accounts.py": 19,
    "tests/unit/test_inventory_reader.py": 30,
    "tests/engine/test_engine_server.py": 28,
    "tests/unit/test_evaluate.py": 27,
    "tests/lab/test_lab_snapshot.py": 27,
    "tests/engine/test_service_health.py": 23,
    "tests/lab/test_wheelhouse.py": 21,
    "tests/lab/test_packages.py": 16,
}


def pytest_collection_modifyitems(session, config, items):
    """Longest files first, each file's tests in their own order (lab stories run in file order)."""
    def cost(item) -> float:
        return FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0.0)

    items[:] = sorted(items, key=lambda item: -cost(item))  # sorted() is stable: a file's order is kept


# What a test file costs in CPU, not only in wall time (the suite is CPU-bound: four workers share two cores, so a
# file's wall time says as much about its neighbours as about itself).  With DSCTL_TEST_CPU=1, as root, each worker
# moves itself into a CPU-accounting cgroup of its own; everything it starts (dsctl, ansible-playbook, the lab hosts'
# sshd, their modules, engines and real vLLM: a child stays in its parent's cgroup) is counted there, and each test's
# CPU-seconds are added to its file.  Off by default (CI's machine may not allow it); the table says when it was on.
CPU_GROUPS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_cpu_usage: Path | None = None
_FILE_CPU: dict[str, float] = {}


def _cpu_seconds() -> float:
    text = _cpu_usage.read_text() if _cpu_usage is not None else ""
    if _cpu_usage is not None and _cpu_usage.name == "cpu.stat":
        return int(text.split("usage_usec", 1)[1].split()[0]) / 1e6
    return int(text) / 1e9


def pytest_configure(config):
    global _cpu_usage
    if os.environ.get("DSCTL_TEST_CPU") != "1":
        return
    name = f"dsctl-tests-{os.getpid()}"
    for root in CPU_GROUPS:
        usage = "cpuacct.usage" if root.name == "cpuacct" else "cpu.stat"
        if (root / usage).exists() or (root / "cgroup.procs").exists():
            try:
                (root / name).mkdir(exist_ok=True)
                (root / name / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                continue
            _cpu_usage = root / name / usage
            return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu_seconds() if _cpu_usage is not None else None
    yield
    if before is not None:
        path = item.nodeid.split("::", 1)[0]
        _FILE_CPU[path] = _FILE_CPU.get(path, 0.0) + _cpu_seconds() - before


def pytest_unconfigure(config):
    """Back into the parent group, and this worker's group removed (kept while a process it started still runs)."""
    if _cpu_usage is not None:
        try:
            (_cpu_usage.parent.parent / "cgroup.procs").write_text(str(os.getpid()))
            _cpu_usage.parent.rmdir()
        except OSError:
            pass


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and _FILE_CPU:
        workeroutput["dsctl_file_cpu"] = dict(_FILE_CPU)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for path, seconds in (getattr(node, "workeroutput", {}) or {}).get("dsctl_file_cpu", {}).items():
        _FILE_CPU[path] = _FILE_CPU.get(path, 0.0) + seconds


# test file -> [seconds in setup + call + teardown, tests, first start, last stop]
_FILE_TIMES: dict[str, list[float]] = {}


def pytest_runtest_logreport(report):
    """Adds up each file's time (on the xdist controller too, which gets every worker's reports)."""
    entry = _FILE_TIMES.setdefault(report.nodeid.split("::", 1)[0], [0.0, 0, report.start, report.stop])
    entry[0] += report.duration
    entry[2], entry[3] = min(entry[2], report.start), max(entry[3], report.stop)
    if report.when == "call":
        entry[1] += 1


def pytest_terminal_summary(terminalreporter):
    """The time of every test file, longest first: what each lab story costs (its tests' setup, calls and
    teardown, including bringing its lab up and down), so that the next change can see what it adds."""
    if not _FILE_TIMES:
        return
    cpu = " + CPU-seconds (DSCTL_TEST_CPU=1)" if _FILE_CPU else ""
    terminalreporter.section(f"time per test file (setup + tests + teardown; from - to: seconds into the run){cpu}")
    began = min(entry[2] for entry in _FILE_TIMES.values())
    rows = sorted(_FILE_TIMES.items(), key=lambda item: -item[1][0])
    for path, (seconds, tests, start, stop) in rows:
        span = f"{start - began:6.0f} - {stop - began:6.0f}"
        used = f"{_FILE_CPU.get(path, 0.0):8.1f} CPU-s  " if _FILE_CPU else ""
        terminalreporter.write_line(f"{seconds:8.1f} s  {used}{tests:5d} tests  {span}  {path}")
    total = sum(entry[0] for entry in _FILE_TIMES.values())
    used = f", {sum(_FILE_CPU.values()):.0f} CPU-s" if _FILE_CPU else ""
    terminalreporter.write_line(f"{total:8.1f} s{used}  in all test files (workers side by side: the wall time is "
                                "less)")
