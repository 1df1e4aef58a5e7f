"""`dsctl deploy` of real vLLM (the CPU build of 0.32.0 serving the lab's tiny model) on a lab host, behind the gateway.

Until this story every instance deploy ever started was dsctl's own emulated engine.  Here the service runs from a
venv of its own (the service field ``venv``, as a site that builds its vLLM itself sets it; .ci/setup installs real
vLLM there with dsctl.lab.real_vllm), so the launch line deploy renders, its health gate (/health, /v1/models, a
first completion), its rollback and the gateway in front meet vLLM's own server.  One host (lab-01) is both the
fleet and the gateway; the engine's processes run as the service account on the CPU.

Costs about 3-5 minutes: real vLLM starts in 45 s alone and several times that beside three busy test workers, and
the story starts it three times (deploy, the refused configuration, the rollback).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.realvllm.conftest import MODEL, VENV, require_real_vllm

from .conftest import address, bring_up, default_hdk_and_cann, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

GATEWAY_PORT = 8080
START_S = 600  # the health gate's bound: real vLLM's start on a crowded two-core machine
# vLLM on a CPU: its KV cache in GiB (its default, 4, is more than the tiny model needs); the hub is never asked.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def real_service(**params) -> dict:
    return {"name": "real", "engine": "vllm-ascend", "venv": str(VENV), "model": str(MODEL),
            "served_model_name": "tiny", "npus_per_instance": 1, "instances": 1, "port": 8000,
            "health_timeout_s": START_S, "allow_unauthenticated": True, "env": ENV,
            "params": {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8, **params}}


def write_inventory(lab, directory: Path, service: dict) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    nodes = data["all"]["children"]["npu_nodes"]
    nodes["vars"]["dsctl_services"] = [service]
    data["all"]["children"]["gateway"] = {
        "hosts": {"lab-01": dict(nodes["hosts"]["lab-01"])},
        "vars": {"dsctl_gateway": {"services": [{"service": "real", "port": GATEWAY_PORT}],
                                   "drain_timeout_s": 120, "health_timeout_s": START_S}}}
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def real_lab(tmp_path_factory):
    require_real_vllm()
    lab = bring_up("--hosts", "1", *default_hdk_and_cann())
    directory = tmp_path_factory.mktemp("real-vllm")
    try:
        result = dsctl("provision", str(write_inventory(lab, directory, real_service())), check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield lab, directory
    finally:
        dsctl("lab", "down")


def deploy(path: Path) -> tuple[int, dict]:
    result = dsctl("deploy", str(path), "--json", check=False, timeout=3 * START_S)
    return result.returncode, json.loads(result.stdout)


def probe(url: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "dsctl", "probe", url, "--json", *args], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["data"]


def engine_pid(lab) -> str:
    return lab.sh_ok("lab-01", "supervisorctl pid dsctl-real-0").strip()


def test_real_vllm_is_deployed_gated_served_through_the_gateway_and_left_alone_when_unchanged(real_lab):
    lab, directory = real_lab
    path = write_inventory(lab, directory, real_service())
    code, report = deploy(path)
    assert code == 0, report["errors"]
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "restarted")]
    launch = lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh")
    assert f"exec {VENV}/bin/vllm serve {MODEL}" in launch and "--enforce-eager" in launch
    pid = engine_pid(lab)
    assert lab.sh_ok("lab-01", f"ps -o user= -p {pid}").strip() != "root"
    assert "vllm" in lab.sh_ok("lab-01", f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    # through the gateway, with the prompt lengths the server counts (its /tokenize, passed through nginx)
    data = probe(f"http://{address('lab-01')}:{GATEWAY_PORT}", "--rate", "4", "--requests", "24",
                 "--prompt-tokens", "64", "--output-tokens", "16")
    metrics = data["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (24, 0), data
    assert metrics["output_tokens_counted_by"]["usage"] == 24 and metrics["total_output_tokens"] == 24 * 16
    assert data["prompt_lengths"]["counted_by"] == "server" and data["prompt_lengths"]["sent"]["agrees"] is True

    code, report = deploy(path)
    assert code == 0, report["errors"]
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "unchanged")]
    assert engine_pid(lab) == pid


def test_a_configuration_real_vllm_refuses_is_rolled_back_in_its_own_words(real_lab):
    lab, directory = real_lab
    before = lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh")
    # dsctl cannot know this checkpoint's positions (4096); vLLM reads its config.json and refuses at start
    code, report = deploy(write_inventory(lab, directory, real_service(max_model_len=65536)))
    assert code == 4, report
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "rolled back")]
    errors = " ".join(report["errors"])
    assert "real-0: the new configuration failed" in errors and "rolled back" in errors
    assert "max_model_len" in errors and "65536" in errors, errors  # vLLM's own sentence, from its log
    assert lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh") == before
    data = probe(f"http://{address('lab-01')}:{GATEWAY_PORT}", "--rate", "inf", "--requests", "4",
                 "--prompt-tokens", "32", "--output-tokens", "8")
    assert (data["metrics"]["completed"], data["metrics"]["failed"]) == (4, 0)
