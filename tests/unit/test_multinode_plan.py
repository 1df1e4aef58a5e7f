"""Multi-host instances: host groups, each node's role, vllm-ascend argv and env, MindIE's multi-node env and config
keys, the rank table, and every refusal (dsctl.core.serving.multinode)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dsctl.core.network.hccn_plan import plan_network
from dsctl.core.network.rank_table import RankMember, check_rank_table, expected_device_ips
from dsctl.core.perf.estimate import estimate
from dsctl.core.serving.multinode import (
    MultiNodeError,
    NodeFacts,
    plan_instances,
    plan_services,
    taken_npus,
    validate_multinode,
)
from dsctl.core.serving.service import plan_host, validate_services
from dsctl.core.serving.service_render import render_host
from dsctl.errors import ExitStatus

NAMES = [f"lab-0{k}" for k in range(1, 5)]
NETWORK = plan_network({name: {"dsctl_npu_count": 8, "dsctl_npu_network": {"subnets": ["10.20.0.0/24"]}}
                        for name in NAMES})
# DeepSeek-V3 W8A8 over 2 Atlas 800T A2 hosts, DP 4 x TP 4 with expert parallel (vllm-ascend Multi-Node-DP).
DEEPSEEK = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "profile": "deepseek-v3",
            "weights": "int8", "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
            "enable_expert_parallel": True, "socket_ifname": "enp189s0f0"}


def facts(name: str, **changes) -> NodeFacts:
    host = NodeFacts(name=name, address=f"10.78.0.{10 + int(name[-1])}", npu_count=8, chip="910B3", cann="8.5.0",
                     driver="25.5.0", vllm_ascend="v0.13.0", torch_npu="2.8.0.post2", model_present=True)
    return replace(host, **changes)


HOSTS = [facts(name) for name in NAMES]


def spec(**changes):
    return validate_multinode({**DEEPSEEK, **changes})


def options(argv) -> dict[str, str | bool]:
    """``--flag value`` pairs and bare ``--flag`` switches of a command line."""
    found: dict[str, str | bool] = {}
    words = list(argv[3:])
    while words:
        word = words.pop(0)
        if words and not words[0].startswith("--"):
            found[word] = words.pop(0)
        else:
            found[word] = True
    return found


def refused(call, *args, **kwargs) -> MultiNodeError:
    with pytest.raises(MultiNodeError) as raised:
        call(*args, **kwargs)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("service ")
    return raised.value


# --------------------------------------------------------------------------- plans


def check_vllm_instance(instance, service, hosts):
    assert instance.hosts == tuple(host.name for host in hosts)
    head = instance.head
    assert head.is_head and not head.headless and all(node.headless for node in instance.nodes[1:])
    local = service.npus_per_node // service.tp
    starts = []
    for rank, (node, host) in enumerate(zip(instance.nodes, hosts, strict=True)):
        assert node.node_rank == rank and node.address == host.address
        assert node.npus == tuple(range(service.npus_per_node)) and node.visible_devices == "0,1,2,3,4,5,6,7"
        assert node.tensor_parallel_size * node.data_parallel_size_local == service.npus_per_node
        assert node.argv[:3] == ("vllm", "serve", service.model)
        flags = options(node.argv)
        assert flags["--data-parallel-size"] == str(instance.data_parallel_size) == str(local * service.nodes)
        assert flags["--data-parallel-size-local"] == str(local)
        assert flags["--tensor-parallel-size"] == str(service.tp)
        assert flags["--data-parallel-address"] == head.address  # every node reaches the head
        assert flags["--data-parallel-rpc-port"] == "13389"
        assert ("--headless" in flags) == (rank > 0) and ("--port" in flags) == (rank == 0)
        assert ("--enable-expert-parallel" in flags) == service.enable_expert_parallel
        starts.append(int(flags["--data-parallel-start-rank"]))
        assert node.data_parallel_start_rank == starts[-1]
        env = node.env
        assert env["HCCL_IF_IP"] == host.address
        assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"
        assert env["OMP_PROC_BIND"] == "false"
        assert int(env["HCCL_BUFFSIZE"]) > 0 and 120 <= int(env["HCCL_CONNECT_TIMEOUT"]) <= 7200
        assert int(env["VLLM_RPC_TIMEOUT"]) >= 600_000  # milliseconds
        assert node.mindie_config == {}
    # DP ranks: each node's block follows the previous one's, covering 0..dp-1.
    assert starts == [rank * local for rank in range(service.nodes)]
    assert instance.world_size == service.nodes * service.npus_per_node
    members = [RankMember(host=h.name, server_id=h.address, npus=tuple(range(8))) for h in hosts]
    servers = check_rank_table(json.loads(json.dumps(instance.rank_table)),
                               plan=expected_device_ips(members, NETWORK))
    assert [server.server_id for server in servers] == [host.address for host in hosts]
    assert instance.rank_table_path == f"/etc/dsctl/services/{instance.name}/ranktable.json"


def test_two_hosts_one_instance():
    service = spec()
    (instance,) = plan_instances(service, HOSTS[:2], network=NETWORK)
    assert (instance.name, instance.port, instance.expert_parallel) == ("deepseek-0", 8000, True)
    check_vllm_instance(instance, service, HOSTS[:2])


def test_four_hosts_two_instances_of_two():
    service = spec()
    instances = plan_instances(service, HOSTS, network=NETWORK)
    assert [instance.name for instance in instances] == ["deepseek-0", "deepseek-1"]
    for instance, hosts in zip(instances, (HOSTS[:2], HOSTS[2:]), strict=True):
        check_vllm_instance(instance, service, hosts)


def test_four_hosts_one_instance_of_four():
    service = spec(nodes=4, tensor_parallel_size=8, data_parallel_size=4)
    (instance,) = plan_instances(service, HOSTS, network=NETWORK)
    check_vllm_instance(instance, service, HOSTS)
    assert [node.data_parallel_start_rank for node in instance.nodes] == [0, 1, 2, 3]
    assert instance.world_size == 32


def test_layout_defaults_from_either_size():
    assert (spec(tensor_parallel_size=None).tp, spec(tensor_parallel_size=None).dp) == (4, 4)
    assert (spec(data_parallel_size=None).tp, spec(data_parallel_size=None).dp) == (4, 4)
    only_nodes = spec(tensor_parallel_size=None, data_parallel_size=None)
    assert (only_nodes.tp, only_nodes.dp) == (8, 2)


def test_host_groups_are_honoured_head_first():
    service = spec(host_groups=[["lab-03", "lab-01"], ["lab-04", "lab-02"]])
    instances = plan_instances(service, HOSTS, network=NETWORK)
    assert [instance.hosts for instance in instances] == [("lab-03", "lab-01"), ("lab-04", "lab-02")]
    check_vllm_instance(instances[0], service, [HOSTS[2], HOSTS[0]])


def test_per_host_nic_and_env_overrides():
    hosts = [facts("lab-01", socket_ifname="eth1"), facts("lab-02")]
    (instance,) = plan_instances(spec(env={"HCCL_BUFFSIZE": 200}), hosts, network=NETWORK)
    assert instance.nodes[0].env["HCCL_SOCKET_IFNAME"] == "eth1"
    assert instance.nodes[1].env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"
    assert all(node.env["HCCL_BUFFSIZE"] == "200" for node in instance.nodes)


def test_mindie_nodes():
    service = spec(engine="mindie", enable_expert_parallel=False, manager="container", port=None)
    (instance,) = plan_instances(service, HOSTS[:2], network=NETWORK)
    assert instance.port == 1025
    for node, host in zip(instance.nodes, HOSTS[:2], strict=True):
        assert node.argv == ()
        env = node.env
        assert env["RANKTABLEFILE"] == env["RANK_TABLE_FILE"] == instance.rank_table_path
        assert env["MIES_CONTAINER_IP"] == host.address and "HOST_IP" not in env
        assert (env["HCCL_EXEC_TIMEOUT"], env["ATB_LLM_HCCL_ENABLE"], env["ATB_LLM_COMM_BACKEND"]) == ("0", "1", "hccl")
        assert 120 <= int(env["HCCL_CONNECT_TIMEOUT"]) <= 7200
        assert node.mindie_config["BackendConfig.multiNodesInferEnabled"] is True
        assert node.mindie_config["BackendConfig.ModelDeployConfig.ModelConfig[0].worldSize"] == 16
    assert instance.nodes[1].headless and not instance.head.headless
    bare = plan_instances(spec(engine="mindie", enable_expert_parallel=False), HOSTS[:2], network=NETWORK)
    assert bare[0].nodes[1].env["HOST_IP"] == HOSTS[1].address and "MIES_CONTAINER_IP" not in bare[0].nodes[1].env


def resolve(document, dotted: str):
    for part in dotted.replace("[", ".[").split("."):
        document = document[int(part[1:-1])] if part.startswith("[") else document[part]
    return document


def test_mindie_config_keys_exist_in_dsctls_config_template():
    (instance,) = plan_instances(spec(engine="mindie", enable_expert_parallel=False), HOSTS[:2], network=NETWORK)
    single = validate_services("lab-01", [{"name": "mi", "engine": "mindie", "model": "/models/DeepSeek-V3-w8a8",
                                           "npus_per_instance": 8, "tensor_parallel_size": 4,
                                           "data_parallel_size": 2, "bind": "127.0.0.1"}],
                               npu_count=8, vllm_ascend=None)
    files = render_host(single, npu_count=8, env={})
    (config,) = [f for f in files["mi-0"] if f.role == "config"]
    document = json.loads(config.content)
    for path, value in instance.head.mindie_config.items():
        assert type(resolve(document, path)) is type(value), path  # the key is where the template has it


def test_single_host_instances_count_as_taken():
    chat = validate_services("lab-02", [{"name": "chat", "engine": "vllm-ascend", "model": "/models/m",
                                         "npus_per_instance": 4, "bind": "127.0.0.1"}], npu_count=8,
                             vllm_ascend="v0.13.0")
    taken = taken_npus({"lab-02": plan_host(chat, 8)})
    assert taken == {"lab-02": {0: "chat-0", 1: "chat-0", 2: "chat-0", 3: "chat-0"}}
    problem = refused(plan_instances, spec(), HOSTS[:2], network=NETWORK, taken=taken)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "instance deepseek-0 (lab-01, lab-02): lab-02 NPU 0 is also in chat-0" in str(problem)


# --------------------------------------------------------------------------- refusals


def test_one_npu_in_two_instances():
    second = spec(name="deepseek-b")
    problem = refused(plan_services, [spec(), second], HOSTS, network=NETWORK,
                      pools={"deepseek": NAMES[:2], "deepseek-b": NAMES[1:3]})
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert str(problem).startswith("service deepseek-b: instance deepseek-b-0 (lab-02, lab-03): lab-02 NPU 0 is also "
                                   "in deepseek-0; an NPU serves one instance")


def test_host_count_that_does_not_divide():
    problem = refused(plan_instances, spec(), HOSTS[:3], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "service deepseek: nodes: 3 host(s) (lab-01, lab-02, lab-03) do not divide into instances of 2 nodes" in \
        str(problem)


@pytest.mark.parametrize(("changes", "words"), [
    ({"tensor_parallel_size": 4, "data_parallel_size": 2},
     "tensor_parallel_size: tensor_parallel_size 4 x data-parallel-size-local 1 = 4, but npus_per_node is 8"),
    ({"tensor_parallel_size": 3}, "tensor_parallel_size: tensor_parallel_size 3 x data-parallel-size-local 2 = 6"),
    ({"tensor_parallel_size": None, "data_parallel_size": 3},
     "data_parallel_size: 3 DP ranks do not spread evenly over 2 nodes"),
])
def test_tp_times_local_dp_not_the_nodes_npus(changes, words):
    problem = refused(spec, **changes)
    assert problem.exit_status == ExitStatus.USAGE
    assert str(problem).startswith("service deepseek: ") and words in str(problem)


def test_expert_parallel_for_a_dense_model():
    problem = refused(spec, model="/models/DeepSeek-R1-Distill-Qwen-7B", profile=None, weights="bf16",
                      tensor_parallel_size=4, data_parallel_size=4)
    assert problem.exit_status == ExitStatus.USAGE
    assert "enable_expert_parallel: deepseek-r1-distill-qwen-7b is a dense model" in str(problem)


def test_a_layout_vllm_refuses():
    problem = refused(spec, npus_per_node=6, tensor_parallel_size=3, data_parallel_size=4)
    assert problem.exit_status == ExitStatus.USAGE
    assert "Total number of attention heads (128) must be divisible by tensor parallel size (3)" in str(problem)


def test_mixed_chips_in_one_instance():
    problem = refused(plan_instances, spec(), [HOSTS[0], facts("lab-02", chip="910B4")], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "lab-02 has 910B4 NPUs, the head lab-01 910B3" in str(problem)


@pytest.mark.parametrize(("changes", "words"), [
    ({"cann": "8.3.RC2"}, "lab-02 runs CANN 8.3.RC2, the head lab-01 8.5.0"),
    ({"driver": "25.2.0"}, "lab-02 runs driver 25.2.0, the head lab-01 25.5.0"),
    ({"vllm_ascend": "v0.11.0"}, "lab-02 runs vllm-ascend v0.11.0, the head lab-01 v0.13.0"),
])
def test_mixed_stacks_in_one_instance(changes, words):
    problem = refused(plan_instances, spec(), [HOSTS[0], facts("lab-02", **changes)], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert words in str(problem) and "provision or upgrade the group's hosts together" in str(problem)


def test_model_path_missing_on_a_node():
    problem = refused(plan_instances, spec(), [HOSTS[0], facts("lab-02", model_present=False)], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "the model path /models/DeepSeek-V3-w8a8 is missing on lab-02" in str(problem)


def test_a_model_that_does_not_fit_even_across_the_group():
    problem = refused(plan_instances, spec(weights="bf16"), HOSTS[:2], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    # The bound is estimate's own: weights and one full-context request (the profile's max_model_len) over the group.
    context = spec().model_profile.max_model_len
    bound = estimate("910B3", "deepseek-v3", prompt_tokens=context - 1, output_tokens=1, chips=16,
                     weight_bytes=2.0).min_chips_for_memory
    assert bound > 16
    assert f"does not fit on 16 910B3 NPUs (2 x 8) with a {context}-token context" in str(problem)
    assert f"estimate's memory bound needs at least {bound} NPUs" in str(problem)


def test_a_host_without_an_npu_network_plan():
    problem = refused(plan_instances, spec(), [HOSTS[0], facts("lab-05")], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "lab-05 has no NPU network plan" in str(problem)


def test_too_few_npus_on_a_host():
    problem = refused(plan_instances, spec(), [HOSTS[0], facts("lab-02", npu_count=4)], network=NETWORK)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "lab-02 has 4 NPUs, npus_per_node is 8" in str(problem)


def test_no_nic_name():
    problem = refused(plan_instances, spec(socket_ifname=None), HOSTS[:2], network=NETWORK)
    assert problem.exit_status == ExitStatus.USAGE
    assert "socket_ifname: required for lab-01" in str(problem)


@pytest.mark.parametrize(("changes", "words"), [
    ({"profile": None, "model": "/models/DeepSeek-V3-mine"}, "profile: dsctl has no profile for 'DeepSeek-V3-mine'"),
    ({"model": "deepseek-ai/DeepSeek-V3"}, "model: every node of a multi-host instance loads the weights itself"),
    ({"nodes": 1}, "nodes: expected an integer 2..64"),
    ({"engine": "lab-engine"}, "engine: expected vllm-ascend or mindie"),
    ({"tensor_parallel": 4}, "tensor_parallel: unknown multi-host service setting"),
    ({"env": {"HCCL_IF_IP": "10.0.0.1"}}, "env.HCCL_IF_IP: set for each node by dsctl"),
    ({"env": {"HCCL_CONNECT_TIMEOUT": 10}}, "env.HCCL_CONNECT_TIMEOUT: expected"),
    ({"engine": "mindie"}, "enable_expert_parallel: a vllm-ascend flag"),
])
def test_malformed_specs(changes, words):
    problem = refused(spec, **changes)
    assert problem.exit_status == ExitStatus.USAGE
    assert words in str(problem)


@pytest.mark.parametrize(("groups", "words"), [
    ([["lab-01", "lab-02", "lab-03"]], "host_groups[0]: 3 host(s), but nodes is 2"),
    ([["lab-01", "lab-09"]], "host_groups[0][1]: lab-09 is not a host of this service"),
    ([["lab-01", "lab-01"]], "host_groups[0][1]: lab-01 is already node 0 of this group"),
])
def test_bad_host_groups(groups, words):
    problem = refused(plan_instances, spec(host_groups=groups), HOSTS, network=NETWORK)
    assert problem.exit_status == ExitStatus.USAGE
    assert words in str(problem)


def test_host_facts_hold_an_ip_and_a_nic_name():
    with pytest.raises(MultiNodeError, match="host lab-01: address 'lab-01.example' is not an IP address"):
        facts("lab-01", address="lab-01.example")
    with pytest.raises(MultiNodeError, match="socket_ifname 'eth0; reboot' is not a network interface name"):
        facts("lab-01", socket_ifname="eth0; reboot")


def test_problems_are_counted():
    hosts = [HOSTS[0], facts("lab-02", cann="8.3.RC2"), HOSTS[2], facts("lab-04", model_present=False)]
    problem = refused(plan_instances, spec(), hosts, network=NETWORK)
    assert "instance deepseek-0" in str(problem) and str(problem).endswith("(1 more problem in the multi-host plan)")
