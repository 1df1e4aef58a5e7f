"""`dsctl upgrade` on the lab, the canary story: --check changes nothing, and the lab-only regressed release
(releases.yaml 8.5.0.lab1) never gets past the canary: the probe gate stops it with its numbers and lab-01 is
switched back.  The fleet: upgrade_fleet.py.  The tests are one story, in file order.
"""

from __future__ import annotations

import re

import pytest

from .conftest import dsctl, requires_lab
from .upgrade_fleet import LIMITS, SERVING, TOOLKIT, active_cann, served_cann, served_fleet, upgrade

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    yield from served_fleet(tmp_path_factory)


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
