"""`dsctl deploy --render` on the sample inventory: what deploy would write, rendered without any host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample" / "hosts.yml"


def dsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsctl", *args], capture_output=True, text=True, timeout=120)


def test_the_sample_inventory_renders_two_tp4_instances_per_host_under_systemd():
    result = dsctl("deploy", str(SAMPLE), "--render", "--json")
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)["data"]
    units = {(f["host"], f["path"]) for f in files if f["path"].endswith(".service")}
    assert units == {(host, f"/etc/systemd/system/dsctl-chat-{i}.service")
                     for host in ("atlas-a01", "atlas-a02") for i in (0, 1)}
    launch = next(f["content"] for f in files if f["host"] == "atlas-a01" and f["path"].endswith("chat-1/launch.sh"))
    assert "vllm serve /models/DeepSeek-R1-Distill-Qwen-7B" in launch and "--port 8001" in launch
    env = next(f["content"] for f in files if f["host"] == "atlas-a01" and f["path"].endswith("chat-1/service.env"))
    assert "ASCEND_RT_VISIBLE_DEVICES=4,5,6,7" in env


def test_an_unknown_engine_parameter_is_refused_before_any_host(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(SAMPLE.read_text())
    group_vars = tmp_path / "group_vars"
    group_vars.mkdir()
    (group_vars / "npu_nodes.yml").write_text(
        (SAMPLE.parent / "group_vars" / "npu_nodes" / "site.yml").read_text()
        + "dsctl_services:\n  - {name: chat, engine: vllm-ascend, model: /models/m, npus_per_instance: 4,\n"
          "     params: {max_num_seqz: 8}}\n")
    result = dsctl("deploy", str(inventory), "--render")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and "max_num_seqz" in line and "max_num_seqs" in line
