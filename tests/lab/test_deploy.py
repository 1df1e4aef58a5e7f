"""`dsctl deploy` on provisioned lab hosts: two instances per host under supervisor, health-gated, day-2 safe.

The services run `<venv>/bin/vllm serve ...`, exactly what a real host runs; on the lab the serving venv's
stand-in vllm is dsctl's emulated engine.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import bring_up, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

KEY = "lab-test-key-0123456789"


def service(name: str, port: int, **params) -> dict:
    return {"name": name, "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
            "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": port,
            "health_timeout_s": 120, "allow_unauthenticated": True, "params": {"max_num_seqs": 32, **params}}


@pytest.fixture(scope="module")
def served_lab(tmp_path_factory):
    lab = bring_up("--hosts", "2")
    result = dsctl("provision", str(lab.inventory), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    yield lab, tmp_path_factory.mktemp("deploy")
    dsctl("lab", "down")


def inventory(lab, directory: Path, services: list[dict]) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"] = services
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def deploy(path: Path, *args: str) -> tuple[int, dict]:
    result = dsctl("deploy", str(path), "--json", *args, check=False)
    return result.returncode, json.loads(result.stdout)


def pids(lab) -> dict[tuple[str, str], str]:
    found = {}
    for host in ("lab-01", "lab-02"):
        for unit in ("dsctl-a-0", "dsctl-b-0"):
            found[(host, unit)] = lab.sh(host, f"supervisorctl pid {unit}").stdout.strip()
    return found


def probe(url: str, *args: str):
    return dsctl("probe", url, "--rate", "inf", "--requests", "4", "--prompt-tokens", "32", "--output-tokens", "8",
                 "--json", *args, check=False)


def test_two_instances_per_host_serve_and_an_unchanged_deploy_restarts_nothing(served_lab):
    lab, directory = served_lab
    path = inventory(lab, directory, [service("a", 8000), service("b", 8001)])
    code, report = deploy(path)
    assert code == 0, report["errors"]
    rows = report["data"]["instances"]
    assert {(r["host"], r["instance"], r["npus"], r["port"], r["status"]) for r in rows} == {
        (h, i, n, p, "restarted") for h in ("lab-01", "lab-02")
        for i, n, p in (("a-0", "0,1,2,3", 8000), ("b-0", "4,5,6,7", 8001))}
    for row in rows:
        result = probe(row["endpoint"].removesuffix("/v1"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["data"]["metrics"]["completed"] == 4
    # the instance's NPUs and user come from the inventory, not from root
    environment = lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/service.env")
    assert "ASCEND_RT_VISIBLE_DEVICES=4,5,6,7" in environment
    assert lab.sh_ok("lab-01", "ps -o user= -p $(supervisorctl pid dsctl-a-0)").strip() != "root"

    before = pids(lab)
    code, report = deploy(path)
    assert code == 0
    assert {r["status"] for r in report["data"]["instances"]} == {"unchanged"}
    assert pids(lab) == before


def test_changing_one_parameter_restarts_only_that_instance(served_lab):
    lab, directory = served_lab
    before = pids(lab)
    code, report = deploy(inventory(lab, directory, [service("a", 8000), service("b", 8001, max_num_seqs=16)]))
    assert code == 0, report["errors"]
    statuses = {(r["host"], r["instance"]): r["status"] for r in report["data"]["instances"]}
    assert statuses == {("lab-01", "a-0"): "unchanged", ("lab-01", "b-0"): "restarted",
                        ("lab-02", "a-0"): "unchanged", ("lab-02", "b-0"): "restarted"}
    after = pids(lab)
    for host in ("lab-01", "lab-02"):
        assert after[(host, "dsctl-a-0")] == before[(host, "dsctl-a-0")]
        assert after[(host, "dsctl-b-0")] != before[(host, "dsctl-b-0")]
    assert "--max-num-seqs 16" in lab.sh_ok("lab-02", "cat /etc/dsctl/services/b-0/launch.sh")


def test_a_config_that_cannot_start_is_rolled_back_and_the_old_one_serves(served_lab):
    lab, directory = served_lab
    # 5 % of a 64 GB chip cannot hold the 7B weights: the engine stops at start-up, as vLLM does.
    bad = service("b", 8001, max_num_seqs=16, gpu_memory_utilization=0.05)
    code, report = deploy(inventory(lab, directory, [service("a", 8000), bad]), "--limit", "lab-01")
    assert code == 4
    statuses = {r["instance"]: r["status"] for r in report["data"]["instances"] if r["host"] == "lab-01"}
    assert statuses == {"a-0": "unchanged", "b-0": "rolled back"}
    errors = " ".join(report["errors"])
    assert "b-0: the new configuration failed" in errors and "rolled back" in errors
    assert "memory" in errors.lower()
    result = probe("http://10.78.0.11:8001")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--max-num-seqs 16" in lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/launch.sh")
    assert "gpu-memory-utilization" not in lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/launch.sh")


def test_an_api_key_is_required_when_set_and_never_shown(served_lab):
    lab, directory = served_lab
    keyed = {**service("a", 8000), "api_key": KEY}
    path = inventory(lab, directory, [keyed, service("b", 8001, max_num_seqs=16)])
    result = dsctl("deploy", str(path), "--limit", "lab-02", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert KEY not in result.stdout + result.stderr
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen("http://10.78.0.12:8000/v1/models", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request("http://10.78.0.12:8000/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert probe("http://10.78.0.12:8000", "--api-key", KEY).returncode == 0
    mode = lab.sh_ok("lab-02", "stat -c %a /etc/dsctl/services/a-0/service.env").strip()
    assert mode == "600"
    rendered = dsctl("deploy", str(path), "--render", "--limit", "lab-02")
    assert KEY not in rendered.stdout and "not shown" in rendered.stdout
    runs = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "dsctl" / "runs"
    newest = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    for item in newest.rglob("*"):
        if item.is_file() and stat.S_ISREG(item.stat().st_mode):
            assert KEY.encode() not in item.read_bytes(), item
