"""`dsctl upgrade` on the lab, the rolling story: 3 hosts CANN 8.3.RC2 -> 8.5.0 behind the gateway, a probe through
the gateway running all along with 0 failed requests.  The fleet: upgrade_fleet.py; the canary story, which rolls a
regressed release back, is test_upgrade_canary.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import LAB_ROOT, requires_lab
from .upgrade_fleet import GATEWAY, LIMITS, SERVING, TOOLKIT, active_cann, served_cann, served_fleet, upgrade

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    yield from served_fleet(tmp_path_factory)


class GatewayLoad:
    """Probes through the gateway back to back until stopped: the clients of the whole upgrade."""

    def __init__(self):
        self.runs: list[dict] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        argv = [sys.executable, "-m", "dsctl", "probe", GATEWAY, "--rate", "2", "--duration", "20",
                "--prompt-tokens", "32", "--output-tokens", "16", "--json"]
        env = {**os.environ, "DSCTL_LAB_ROOT": str(LAB_ROOT)}
        while not self._stop.is_set():
            result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            try:
                self.runs.append(json.loads(result.stdout)["data"]["metrics"])
            except (ValueError, KeyError, TypeError):
                self.problems.append(f"probe exited {result.returncode}: {result.stderr[-500:]}")

    def __enter__(self) -> GatewayLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=360)

    @property
    def failed(self) -> int:
        return sum(run["failed"] for run in self.runs)

    @property
    def completed(self) -> int:
        return sum(run["completed"] for run in self.runs)


def test_a_rolling_upgrade_behind_the_gateway_loses_no_request(fleet):
    lab, path = fleet
    with GatewayLoad() as load:
        code, report = upgrade(path, "--cann", "8.5.0", "--vllm-ascend", "v0.13.0", "--max-regression", LIMITS)
    assert code == 0, report["errors"]
    rows = report["data"]["hosts"]
    assert [(row["host"], row["batch"], row["status"]) for row in rows] == [
        ("lab-01", 1, "upgraded"), ("lab-02", 2, "upgraded"), ("lab-03", 3, "upgraded")]
    assert all("ttft" in row["probe"] and "throughput" in row["probe"] for row in rows), rows
    for host in SERVING:
        assert active_cann(lab, host) == "8.5.0" and served_cann(host) == "8.5.0"
        assert lab.sh(host, f"test -e {TOOLKIT}/8.3.RC2").exit_code == 0  # kept for a rollback
    assert not load.problems, load.problems
    assert len(load.runs) >= 2 and load.completed > 0
    assert load.failed == 0, load.runs
    state = json.loads(Path(report["data"]["state_file"]).read_text())
    assert {run["stage"] for run in state["hosts"].values()} == {"undrained"}
