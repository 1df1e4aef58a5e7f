"""DeepSeek-V3 (W8A8) as 2 instances of 2 hosts each, deployed, health-gated and rolled back as wholes (issue 22).

A 5-host lab: lab-01..lab-04 are the fleet (HDK 25.3.rc1 and CANN 8.3.RC2 preinstalled, vllm-ascend v0.11.0 and the NPU
plane set by provision; the stack test_upgrade.py starts from), lab-05 runs the nginx gateway in front of the
instances' heads.  Each instance is vllm-ascend
multi-node data parallel with expert parallel (DP 4 x TP 4, 2 DP ranks per node): the head serves the API, the worker
runs --headless; the lab's stand-in `vllm` is the emulated engine, whose ranks link over the lab's NPU plane (real
sockets, HCCL's handshake and timeouts).  The instance's HCCL_CONNECT_TIMEOUT is CANN's minimum, 120 s, at the lab's
time scale 0.5: a rank that never links fails its head after about a minute.

The tests run in order and each starts from the state the previous one left."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dsctl.core.network.rank_table import check_rank_table

from .conftest import address, bring_up, dsctl, lab_capable
from .gateway_load import GatewayLoad
from .upgrade_fleet import DRIVER, FIRMWARE, LIMITS, TOOLKIT, UPGRADE_TIMEOUT, active_cann

pytestmark = pytest.mark.lab

NODES = ("lab-01", "lab-02", "lab-03", "lab-04")
GATEWAY_PORT = 8080
DEEPSEEK = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "profile": "deepseek-v3",
            "weights": "int8", "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
            "enable_expert_parallel": True, "socket_ifname": "eth0", "allow_unauthenticated": True,
            "max_model_len": 8192, "health_timeout_s": 600, "env": {"HCCL_CONNECT_TIMEOUT": "120"}}


def write_inventory(lab, path: Path, service: dict) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    nodes = data["all"]["children"]["npu_nodes"]
    nodes["vars"].update(dsctl_driver_version=DRIVER, dsctl_firmware_version=FIRMWARE, dsctl_cann_version="8.3.RC2",
                         dsctl_vllm_ascend_version="v0.11.0", dsctl_services=[service])
    gateway_host = nodes["hosts"].pop("lab-05")
    connection = {key: nodes["vars"][key] for key in ("ansible_user", "ansible_ssh_private_key_file",
                                                      "ansible_ssh_common_args", "ansible_python_interpreter")}
    data["all"]["children"]["gateway"] = {
        "hosts": {"lab-05": gateway_host},
        "vars": {**connection, "dsctl_gateway": {"services": [{"service": "deepseek", "port": GATEWAY_PORT}],
                                                 "drain_timeout_s": 120, "health_timeout_s": 120}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not lab_capable():
        pytest.skip("the lab needs Linux and root")
    lab = bring_up("--hosts", "5", "--driver", DRIVER, "--firmware", FIRMWARE, "--cann", "8.3.RC2")
    try:
        path = write_inventory(lab, tmp_path_factory.mktemp("multihost") / "hosts.yml", DEEPSEEK)
        result = dsctl("provision", str(path), check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield lab, path
    finally:
        dsctl("lab", "down")


def deploy(path: Path, *args: str) -> tuple[int, dict, str]:
    result = dsctl("deploy", str(path), "--json", *args, check=False)
    return result.returncode, json.loads(result.stdout), result.stderr


def statuses(report: dict) -> dict[str, tuple[str, str]]:
    return {row["host"]: (row["instance"], row["status"]) for row in report["data"]["instances"]}


def pid(lab, host: str, instance: str) -> str:
    return lab.sh_ok(host, f"supervisorctl pid dsctl-{instance}").strip()


def complete(url: str, prompt: str = "hello there") -> dict:
    body = json.dumps({"model": "DeepSeek-V3-w8a8", "prompt": prompt, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", method="POST", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_both_instances_start_health_gated_and_serve_through_the_gateway(fleet):
    lab, path = fleet
    code, report, err = deploy(path)
    assert code == 0, (report, err)
    assert statuses(report) == {"lab-01": ("deepseek-0", "restarted"), "lab-02": ("deepseek-0", "restarted"),
                                "lab-03": ("deepseek-1", "restarted"), "lab-04": ("deepseek-1", "restarted")}
    for head in ("lab-01", "lab-03"):
        assert "All 16 ranks of the instance linked and ready" in lab.sh_ok(head, "cat /var/log/dsctl/deepseek-*.log")
    # the gateway balances over the heads only (a headless worker has no API)
    config = lab.sh_ok("lab-05", "cat /etc/dsctl/gateway/nginx.conf")
    assert f'server "{address("lab-01")}:8000"' in config and f'server "{address("lab-03")}:8000"' in config
    assert address("lab-02") not in config and address("lab-04") not in config
    for _ in range(4):
        assert complete(f"http://{address('lab-05')}:{GATEWAY_PORT}")["usage"]["completion_tokens"] == 4


def test_every_node_holds_the_vendors_rank_table_and_its_own_hccl_env(fleet):
    lab, _ = fleet
    tables = {host: lab.sh_ok(host, f"cat /etc/dsctl/services/{instance}/ranktable.json")
              for host, instance in zip(NODES, ("deepseek-0", "deepseek-0", "deepseek-1", "deepseek-1"), strict=True)}
    assert tables["lab-01"] == tables["lab-02"] and tables["lab-03"] == tables["lab-04"]
    servers = check_rank_table(json.loads(tables["lab-03"]))
    assert [server.server_id for server in servers] == [address("lab-03"), address("lab-04")]
    # each NPU's device_ip is what that NPU holds on its host (hccn_tool, set by provision)
    for server, host in zip(servers, ("lab-03", "lab-04"), strict=True):
        held = [lab.sh_ok(host, f"hccn_tool -i {device.device_id} -ip -g").splitlines()[0].removeprefix("ipaddr:")
                for device in server.devices]
        assert [device.device_ip for device in server.devices] == held
    assert [device.rank_id for server in servers for device in server.devices] == list(range(16))
    env = dict(line.split("=", 1) for line in lab.sh_ok("lab-04", "cat /etc/dsctl/services/deepseek-1/service.env")
               .splitlines() if line and not line.startswith("#"))
    assert (env["HCCL_IF_IP"], env["HCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"], env["HCCL_CONNECT_TIMEOUT"]) == (
        address("lab-04"), "eth0", "eth0", "120")
    worker = lab.sh_ok("lab-04", "cat /etc/dsctl/services/deepseek-1/launch.sh")
    assert "--headless" in worker and f"--data-parallel-address {address('lab-03')}" in worker
    assert "--data-parallel-start-rank 2" in worker and "--port" not in worker


def test_an_unchanged_fleet_restarts_nothing(fleet):
    lab, path = fleet
    before = {host: pid(lab, host, instance) for host, instance in
              zip(NODES, ("deepseek-0", "deepseek-0", "deepseek-1", "deepseek-1"), strict=True)}
    code, report, err = deploy(path)
    assert code == 0, (report, err)
    assert {status for _, status in statuses(report).values()} == {"unchanged"}
    assert before == {host: pid(lab, host, instance) for host, instance in
                      zip(NODES, ("deepseek-0", "deepseek-0", "deepseek-1", "deepseek-1"), strict=True)}


def test_a_configuration_that_cannot_start_rolls_every_node_back_and_the_previous_serves_again(fleet, tmp_path):
    lab, path = fleet
    # The DP coordinator's RPC port on a port another program of the head already holds (vllm-ascend#1955's "port
    # already in use"): no inventory check can know it, vLLM's ZMQ bind fails at start.  A port the inventory itself
    # gives twice, or sshd's, is refused before any host (tests/cli/test_battery_ports.py).
    taken = 13390
    lab.sh_ok("lab-03", "setsid nohup timeout 600 python3 -c 'import socket, time; s = socket.socket(); "
                        f"s.bind((\"0.0.0.0\", {taken})); s.listen(); time.sleep(600)' >/dev/null 2>&1 & sleep 1")
    broken = write_inventory(lab, tmp_path / "broken.yml", {**DEEPSEEK, "data_parallel_rpc_port": taken})
    untouched = pid(lab, "lab-01", "deepseek-0")
    try:
        code, report, _ = deploy(broken, "--instance", "deepseek-1")
    finally:
        lab.sh("lab-03", f"pkill -f '{taken}.*time.sleep' || true")
    assert code != 0
    assert statuses(report) == {"lab-03": ("deepseek-1", "rolled back"), "lab-04": ("deepseek-1", "rolled back")}
    errors = " ".join(report["errors"])
    assert "addr='tcp://" in errors and f":{taken}'" in errors, errors
    assert "rolled back on every node, the previous configuration serves again" in errors
    assert complete(f"http://{address('lab-03')}:8000")["usage"]["completion_tokens"] == 4
    assert pid(lab, "lab-01", "deepseek-0") == untouched  # the other instance never restarted
    assert "--data-parallel-rpc-port 13389" in lab.sh_ok("lab-04", "cat /etc/dsctl/services/deepseek-1/launch.sh")


def test_a_node_cut_off_the_npu_plane_fails_the_deploy_naming_its_ranks_and_the_previous_serves_again(fleet):
    """The NPU plane fails lab-04 for the new configuration's join (a partition healed once HCCL gave up, as a
    flapping switch port would): the deploy fails naming the ranks that never linked and every node rolls back.  The
    previous configuration needs the same links: it serves again because they are back (under a partition that
    lasts, the report says the previous configuration does not serve either)."""
    lab, path = fleet
    log = "/var/log/dsctl/deepseek-1.log"
    failures_before = int(lab.sh_ok("lab-03", f"grep -c 'could not link rank' {log} || true").strip() or 0)
    outcome: dict = {}
    dsctl("lab", "fault", "lab-04", "npu-plane-partition")
    try:
        worker = threading.Thread(target=lambda: outcome.update(
            result=dsctl("deploy", str(path), "--json", "--instance", "deepseek-1", "--restart", check=False)))
        worker.start()
        deadline = time.monotonic() + 300  # HCCL_CONNECT_TIMEOUT 120 s at time scale 0.5, plus the start-up
        while time.monotonic() < deadline:
            count = int(lab.sh_ok("lab-03", f"grep -c 'could not link rank' {log} || true").strip() or 0)
            if count > failures_before or not worker.is_alive():
                break
            time.sleep(2)
    finally:
        dsctl("lab", "fault", "lab-04", "npu-plane-heal")
    worker.join(timeout=600)
    result = outcome["result"]
    report = json.loads(result.stdout)
    assert result.returncode != 0, report
    errors = " ".join(report["errors"])
    assert "HCCL could not link rank 0 with rank(s) 8, 9, 10, 11, 12, 13, 14, 15" in errors, errors
    assert "(EI0006)" in errors and "rolled back on every node, the previous configuration serves again" in errors
    assert statuses(report) == {"lab-03": ("deepseek-1", "rolled back"), "lab-04": ("deepseek-1", "rolled back")}
    assert complete(f"http://{address('lab-05')}:{GATEWAY_PORT}")["usage"]["completion_tokens"] == 4


def test_an_upgrade_moves_each_instances_hosts_together_and_the_gateway_loses_no_request(fleet):
    lab, path = fleet
    with GatewayLoad(f"http://{address('lab-05')}:{GATEWAY_PORT}", "--rate", "2", "--duration", "20",
                     "--prompt-tokens", "32", "--output-tokens", "16") as load:
        result = dsctl("upgrade", str(path), "--json", "--cann", "8.5.0", "--vllm-ascend", "v0.13.0",
                       "--max-regression", LIMITS, check=False, timeout=UPGRADE_TIMEOUT)
    report = json.loads(result.stdout)
    assert result.returncode == 0, report["errors"]
    rows = {row["host"]: (row["batch"], row["status"]) for row in report["data"]["hosts"]}
    # the canary is a whole instance (both its hosts), then the other instance
    assert rows == {"lab-01": (1, "upgraded"), "lab-02": (1, "upgraded"), "lab-03": (2, "upgraded"),
                    "lab-04": (2, "upgraded")}
    for host in NODES:
        assert active_cann(lab, host) == "8.5.0"
        assert lab.sh(host, f"test -e {TOOLKIT}/8.3.RC2").exit_code == 0  # kept for a rollback
    assert not load.problems, load.problems
    assert len(load.runs) >= 2 and load.completed > 0
    assert load.failed == 0, load.runs
