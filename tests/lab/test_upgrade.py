"""`dsctl upgrade` on the lab, the rolling story: 2 hosts CANN 8.3.RC2 -> 8.5.0 behind the gateway, a probe through
the gateway running all along with 0 failed requests.  The fleet: upgrade_fleet.py; the canary story, which rolls a
regressed release back, is test_upgrade_canary.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import requires_lab
from .gateway_load import GatewayLoad
from .upgrade_fleet import GATEWAY, LIMITS, SERVING, TOOLKIT, active_cann, served_cann, served_fleet, upgrade

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    yield from served_fleet(tmp_path_factory)


def test_a_rolling_upgrade_behind_the_gateway_loses_no_request(fleet):
    lab, path = fleet
    with GatewayLoad(GATEWAY, "--rate", "2", "--duration", "20", "--prompt-tokens", "32",
                     "--output-tokens", "16") as load:
        code, report = upgrade(path, "--cann", "8.5.0", "--vllm-ascend", "v0.13.0", "--max-regression", LIMITS)
    assert code == 0, report["errors"]
    rows = report["data"]["hosts"]
    assert [(row["host"], row["batch"], row["status"]) for row in rows] == [
        ("lab-01", 1, "upgraded"), ("lab-02", 2, "upgraded")]
    assert all("ttft" in row["probe"] and "throughput" in row["probe"] for row in rows), rows
    for host in SERVING:
        assert active_cann(lab, host) == "8.5.0" and served_cann(host) == "8.5.0"
        assert lab.sh(host, f"test -e {TOOLKIT}/8.3.RC2").exit_code == 0  # kept for a rollback
    assert not load.problems, load.problems
    assert len(load.runs) >= 2 and load.completed > 0
    assert load.failed == 0, load.runs
    state = json.loads(Path(report["data"]["state_file"]).read_text())
    assert {run["stage"] for run in state["hosts"].values()} == {"undrained"}
