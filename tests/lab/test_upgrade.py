"""`dsctl upgrade` on the lab: 3 hosts CANN 8.3.RC2 -> 8.5.0 behind the gateway, a probe through the gateway running
all along with 0 failed requests; the lab-only regressed release (releases.yaml 8.5.0.lab1) rolled back at the
canary by the probe gate with its numbers; --check changes nothing.

One lab for the module: lab-01..03 serve (HDK 25.3.rc1, which accepts 8.3.RC2, 8.5.0 and the lab release, so the
HDK never changes), lab-04 is the gateway (nginx from the distribution's packages, as in test_gateway.py). The tests
are one story, in file order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import LAB_ROOT, bring_up, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

DRIVER, FIRMWARE = "25.3.rc1", "7.8.0.2.212"
SERVING = ("lab-01", "lab-02", "lab-03")
ADDRESSES = {"lab-01": "10.78.0.11", "lab-02": "10.78.0.12", "lab-03": "10.78.0.13"}
GATEWAY = "http://10.78.0.14:8080"
TOOLKIT = "/usr/local/Ascend/ascend-toolkit"
# One TP4 instance per host keeps 3 engines, nginx and the probes within a 2-core machine.
SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
           "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": 8000,
           "health_timeout_s": 120, "params": {"max_num_seqs": 32}, "allow_unauthenticated": True}
UPGRADE_TIMEOUT = 1500.0
# The background probe through the gateway and the 2 cores make latencies noisy; the regressed release is 3x slower.
LIMITS = "ttft=100%,throughput=50%"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    lab = bring_up("--hosts", "4", "--driver", DRIVER, "--firmware", FIRMWARE, "--cann", "8.3.RC2")
    try:
        data = yaml.safe_load(lab.inventory.read_text())
        nodes = data["all"]["children"]["npu_nodes"]
        gateway_host = nodes["hosts"].pop("lab-04")
        connection = {key: value for key, value in nodes["vars"].items() if key.startswith("ansible_")}
        nodes["vars"].update(dsctl_driver_version=DRIVER, dsctl_firmware_version=FIRMWARE,
                             dsctl_cann_version="8.3.RC2", dsctl_vllm_ascend_version="v0.11.0",
                             dsctl_services=[SERVICE])
        data["all"]["children"]["gateway"] = {"hosts": {"lab-04": gateway_host}, "vars": {
            **connection, "dsctl_gateway": {"services": [{"service": "chat", "port": 8080}], "drain_timeout_s": 120,
                                            "health_timeout_s": 120}}}
        path = tmp_path_factory.mktemp("upgrade") / "inventory.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        for verb in ("provision", "deploy"):
            result = dsctl(verb, str(path), check=False, timeout=900)
            assert result.returncode == 0, result.stdout + result.stderr
        yield lab, path
    finally:
        dsctl("lab", "down")


def upgrade(path: Path, *args: str) -> tuple[int, dict]:
    result = dsctl("upgrade", str(path), "--json", *args, check=False, timeout=UPGRADE_TIMEOUT)
    assert result.stdout.startswith("{"), result.stderr
    return result.returncode, json.loads(result.stdout)


def active_cann(lab, host: str) -> str:
    return lab.sh_ok(host, f"readlink {TOOLKIT}/latest/runtime").strip().split("/")[1]


def served_cann(host: str) -> str:
    with urllib.request.urlopen(f"http://{ADDRESSES[host]}:8000/version", timeout=10) as response:
        return json.load(response)["cann"]


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
    # 3x slower: output throughput falls to a third (TTFT, which includes fixed costs, grows less)
    assert first.startswith("lab-01: failed at gated: lab-01/chat-0 regressed: throughput "), first
    assert "tok/s (-6" in first and "REGRESSED" in first
    rows = {row["host"]: row["status"] for row in report["data"]["hosts"]}
    assert rows == {"lab-01": "rolled back (gated)", "lab-02": "pending", "lab-03": "pending"}
    assert active_cann(lab, "lab-01") == "8.3.RC2" and served_cann("lab-01") == "8.3.RC2"
    for host in ("lab-02", "lab-03"):
        assert lab.sh(host, f"test -e {TOOLKIT}/8.5.0.lab1").exit_code != 0  # never reached
    check = dsctl("check", str(path), "--json", check=False)
    assert check.returncode == 0, check.stdout + check.stderr


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
