"""What deploy writes on each node of a multi-host instance (dsctl.core.serving.multinode_render) and how the deploy
verb plans the groups (dsctl.core.inventory.host_plan.plan_groups, rendered_nodes): per-node env, the same rank table on
every node, the head's and the workers' command lines, the unit under the host's manager, and the refusals."""

from __future__ import annotations

import json

import pytest
import yaml

from dsctl.assets import asset_root
from dsctl.core.inventory import host_plan
from dsctl.core.inventory import schema as inventory_schema
from dsctl.core.lab.plan import npu_network_settings
from dsctl.core.network.rank_table import check_rank_table
from dsctl.core.serving.multinode import MultiNodeError

HOSTS = ["lab-01", "lab-02", "lab-03", "lab-04"]
ADDRESSES = {host: f"10.78.0.{11 + k}" for k, host in enumerate(HOSTS)}
DEEPSEEK = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "profile": "deepseek-v3",
            "weights": "int8", "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
            "enable_expert_parallel": True, "socket_ifname": "eth0", "allow_unauthenticated": True,
            "max_model_len": 8192, "env": {"HCCL_CONNECT_TIMEOUT": "300"}}


def settings(service: dict | None = None, hosts=HOSTS, **host_vars):
    every = {host: {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/packages",
                    "dsctl_npu_network": npu_network_settings(8), "dsctl_service_manager": "supervisor",
                    "dsctl_services": [service or DEEPSEEK], **host_vars} for host in HOSTS}
    return inventory_schema.validate_fleet({host: every[host] for host in hosts}, fleet=every)


def nodes(service: dict | None = None, **host_vars) -> dict[str, list[dict]]:
    fleet = settings(service, **host_vars)
    return host_plan.rendered_nodes(fleet, host_plan.plan_groups(fleet, ADDRESSES))


def files(node: dict) -> dict[str, str]:
    return {item["path"].rsplit("/", 1)[-1]: item["content"] for item in node["files"]}


def launch_words(node: dict) -> list[str]:
    text = files(node)["launch.sh"]
    command = text[text.index("exec "):].replace("\\\n", " ")
    return command.split()


def env_lines(node: dict) -> dict[str, str]:
    return dict(line.split("=", 1) for line in files(node)["service.env"].splitlines()
                if line and not line.startswith("#"))


def test_two_instances_of_two_nodes_each_head_first_in_inventory_order():
    planned = nodes()
    assert {host: [(n["name"], n["multinode"]["node_rank"], n["multinode"]["head"]) for n in found]
            for host, found in planned.items()} == {
        "lab-01": [("deepseek-0", 0, "lab-01")], "lab-02": [("deepseek-0", 1, "lab-01")],
        "lab-03": [("deepseek-1", 0, "lab-03")], "lab-04": [("deepseek-1", 1, "lab-03")]}
    head, worker = planned["lab-01"][0], planned["lab-02"][0]
    assert head["manager"] == worker["manager"] == "supervisor"  # the host's dsctl_service_manager
    assert head["files"][-1]["path"] == "/etc/supervisor/conf.d/dsctl-deepseek-0.conf"
    assert head["fingerprint"] != worker["fingerprint"]


def test_the_head_serves_the_api_and_the_worker_runs_headless_from_its_first_rank():
    planned = nodes()
    head, worker = launch_words(planned["lab-01"][0]), launch_words(planned["lab-02"][0])
    assert head[:4] == ["exec", "/opt/dsctl/serving-venv/bin/vllm", "serve", "/models/DeepSeek-V3-w8a8"]
    pairs = {word: head[i + 1] for i, word in enumerate(head[:-1]) if word.startswith("--")}
    assert (pairs["--port"], pairs["--host"], pairs["--data-parallel-size"], pairs["--data-parallel-size-local"],
            pairs["--data-parallel-address"], pairs["--tensor-parallel-size"], pairs["--quantization"]) == (
        "8000", "0.0.0.0", "4", "2", ADDRESSES["lab-01"], "4", "ascend")
    assert "--headless" not in head and "--enable-expert-parallel" in head
    worker_pairs = {word: worker[i + 1] for i, word in enumerate(worker[:-1]) if word.startswith("--")}
    assert "--headless" in worker and "--port" not in worker and "--served-model-name" not in worker
    assert (worker_pairs["--data-parallel-start-rank"], worker_pairs["--data-parallel-address"]) == (
        "2", ADDRESSES["lab-01"])


def test_each_node_gets_its_own_address_and_nic_and_the_service_env_keeps_its_timeout():
    planned = nodes()
    head, worker = env_lines(planned["lab-01"][0]), env_lines(planned["lab-02"][0])
    assert (head["HCCL_IF_IP"], worker["HCCL_IF_IP"]) == (ADDRESSES["lab-01"], ADDRESSES["lab-02"])
    assert head["GLOO_SOCKET_IFNAME"] == head["HCCL_SOCKET_IFNAME"] == head["TP_SOCKET_IFNAME"] == "eth0"
    assert head["HCCL_CONNECT_TIMEOUT"] == worker["HCCL_CONNECT_TIMEOUT"] == "300"
    assert head["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "PYTORCH_NPU_ALLOC_CONF" in head  # the host's NPU environment under the node's


def test_every_node_of_an_instance_gets_the_same_rank_table_of_the_planned_npu_addresses():
    fleet = settings()
    planned = host_plan.rendered_nodes(fleet, host_plan.plan_groups(fleet, ADDRESSES))
    tables = [files(planned[host][0])["ranktable.json"] for host in ("lab-01", "lab-02")]
    assert tables[0] == tables[1]
    servers = check_rank_table(json.loads(tables[0]))
    assert [server.server_id for server in servers] == [ADDRESSES["lab-01"], ADDRESSES["lab-02"]]
    plan = fleet["lab-02"].network_plan
    assert [device.device_ip for device in servers[1].devices] == [npu.address for npu in plan.host("lab-02").npus]
    assert [device.rank_id for server in servers for device in server.devices] == list(range(16))


@pytest.mark.parametrize(("change", "words"), [
    ({"engine": "mindie", "enable_expert_parallel": False, "data_parallel_size": None, "tensor_parallel_size": 8},
     "engine: dsctl deploy starts multi-host vllm-ascend instances"),
    ({"manager": "container"}, "manager: multi-host instances run under systemd or supervisor"),
    ({"allow_unauthenticated": False}, "allow_unauthenticated: the head listens on 0.0.0.0"),
])
def test_what_deploy_cannot_start_yet_is_one_line_before_any_host(change, words):
    with pytest.raises(MultiNodeError) as refused:
        nodes({**DEEPSEEK, **change})
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_limit_that_splits_an_instance_is_refused_and_one_that_holds_whole_instances_is_not():
    with pytest.raises(MultiNodeError) as refused:
        host_plan.plan_groups(settings(hosts=["lab-01", "lab-03", "lab-04"]), ADDRESSES)
    assert str(refused.value).startswith("--limit: instance deepseek-0 spans lab-01, lab-02, but lab-02 is left out")
    whole = host_plan.plan_groups(settings(hosts=["lab-03", "lab-04"]), ADDRESSES)
    assert [instance.name for _, instance in whole] == ["deepseek-1"]


def test_only_narrows_to_the_named_instance_or_service():
    fleet = settings()
    assert [i.name for _, i in host_plan.plan_groups(fleet, ADDRESSES, only=["deepseek-1"])] == ["deepseek-1"]
    assert [i.name for _, i in host_plan.plan_groups(fleet, ADDRESSES, only=["deepseek"])] == ["deepseek-0",
                                                                                              "deepseek-1"]
    assert host_plan.plan_groups(fleet, ADDRESSES, only=["chat"]) == []


def test_the_shipped_example_plans_two_instances_of_two_hosts():
    example = yaml.safe_load((asset_root() / "inventories" / "examples" / "deepseek-v3-2x2.yml").read_text())
    (service,) = example["dsctl_services"]
    planned = nodes(service)
    assert [node["name"] for host in HOSTS for node in planned[host]] == ["deepseek-0"] * 2 + ["deepseek-1"] * 2
    assert "--quantization ascend" in files(planned["lab-01"][0])["launch.sh"]
