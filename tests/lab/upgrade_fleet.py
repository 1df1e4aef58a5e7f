"""The fleet of the `dsctl upgrade` lab story (test_upgrade.py): lab-01 and lab-02 serve
one TP4 instance each at CANN 8.3.RC2 / vllm-ascend v0.11.0 (HDK 25.3.rc1, which accepts 8.3.RC2, 8.5.0 and the lab
release, so the HDK never changes), lab-03 is the gateway
(nginx from the distribution's packages, as in test_gateway.py).

The canary story (a regressed release switched back) and the rolling one run on it one after the other.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import yaml

from .conftest import address, bring_up, dsctl

DRIVER, FIRMWARE = "25.3.rc1", "7.8.0.2.212"
SERVING = ("lab-01", "lab-02")
ADDRESSES = {host: address(host) for host in SERVING}
GATEWAY = f"http://{address('lab-03')}:8080"
TOOLKIT = "/usr/local/Ascend/ascend-toolkit"
# One TP4 instance per host keeps the engines, nginx and the probes within a 2-core machine; two serving hosts are
# the smallest rolling upgrade (a canary, then the rest) behind a gateway that always has a member to send to.
SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
           "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": 8000,
           "health_timeout_s": 120, "params": {"max_num_seqs": 32}, "allow_unauthenticated": True}
UPGRADE_TIMEOUT = 1500.0
# The background probe through the gateway and the 2 cores make latencies noisy; the regressed release is 3x slower.
LIMITS = "ttft=100%,throughput=50%"


def served_fleet(tmp_path_factory):
    """Bring the fleet up, provision and deploy it; yield (lab, inventory path); take it down at the end."""
    lab = bring_up("--hosts", "3", "--driver", DRIVER, "--firmware", FIRMWARE, "--cann", "8.3.RC2")
    try:
        data = yaml.safe_load(lab.inventory.read_text())
        nodes = data["all"]["children"]["npu_nodes"]
        gateway_host = nodes["hosts"].pop("lab-03")
        connection = {key: value for key, value in nodes["vars"].items() if key.startswith("ansible_")}
        nodes["vars"].update(dsctl_driver_version=DRIVER, dsctl_firmware_version=FIRMWARE,
                             dsctl_cann_version="8.3.RC2", dsctl_vllm_ascend_version="v0.11.0",
                             dsctl_services=[SERVICE])
        data["all"]["children"]["gateway"] = {"hosts": {"lab-03": gateway_host}, "vars": {
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
