"""`dsctl upgrade` on the lab, on one fleet (upgrade_fleet.py: 2 serving hosts at CANN 8.3.RC2 behind a gateway):
``--check`` changes nothing; the lab-only regressed release (releases.yaml 8.5.0.lab1) never gets past the canary:
the probe gate stops it with its numbers and lab-01 is switched back; then the good release, 8.5.0, rolls out one
host at a time with probes through the gateway running all along and 0 failed requests.  The day-2 sequence a site
lives through (a bad release caught, the next one rolled out), and one fleet's set-up instead of two.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import dsctl, requires_lab
from .gateway_load import GatewayLoad
from .upgrade_fleet import GATEWAY, LIMITS, SERVING, TOOLKIT, active_cann, served_cann, served_fleet, upgrade

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    yield from served_fleet(tmp_path_factory)


# The tests are one story, in file order, on one fleet: a regressed release stopped at the canary and switched back
# (the fleet as it was), then the good release rolled out behind the gateway.

def test_check_changes_nothing(fleet):
    lab, path = fleet
    code, report = upgrade(path, "--cann", "8.5.0", "--vllm-ascend", "v0.13.0", "--check")
    assert code == 0, report["errors"]
    rows = report["data"]["hosts"]
    assert [(row["host"], row["status"]) for row in rows] == [(host, "would upgrade") for host in SERVING]
    assert rows[0]["from"].startswith("CANN 8.3.RC2, vllm-ascend v0.11.0") and rows[0]["to"].startswith("CANN 8.5.0")
    assert report["data"]["state_file"] is None
    for host in SERVING:
        assert active_cann(lab, host) == "8.3.RC2"
        assert lab.sh(host, f"test -e {TOOLKIT}/8.5.0").exit_code != 0


def test_the_regressed_release_never_gets_past_the_canary(fleet):
    lab, path = fleet
    code, report = upgrade(path, "--cann", "8.5.0.lab1", "--vllm-ascend", "v0.13.0.dev1", "--max-regression", LIMITS)
    assert code == 6, report
    first = report["errors"][0]
    # 3x slower in modelled time: throughput falls and TTFT grows, each by less than 3x (the client's own costs between
    # requests are in both figures, and at the lab's time scale they count twice over)
    assert first.startswith("lab-01: failed at gated: lab-01/chat-0 regressed: "), first
    assert re.search(r"throughput [\d.]+ -> [\d.]+ tok/s \(-[3-9]\d\.\d%", first), first
    assert "REGRESSED" in first
    rows = {row["host"]: row["status"] for row in report["data"]["hosts"]}
    assert rows == {"lab-01": "rolled back (gated)", "lab-02": "pending"}
    assert active_cann(lab, "lab-01") == "8.3.RC2" and served_cann("lab-01") == "8.3.RC2"
    for host in ("lab-02",):
        assert lab.sh(host, f"test -e {TOOLKIT}/8.5.0.lab1").exit_code != 0  # never reached
    check = dsctl("check", str(path), "--json", check=False)
    assert check.returncode == 0, check.stdout + check.stderr


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
