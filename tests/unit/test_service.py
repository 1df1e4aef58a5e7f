"""Serving services in the inventory: schema, engine parameters, version gates, NPU plan (core.serving.service)."""

from __future__ import annotations

import re

import pytest

from dsctl import data
from dsctl.core.serving.service import (
    DEFAULT_VENV,
    ServiceError,
    ServiceSpec,
    check_params,
    effective_params,
    engine_params,
    plan_host,
    plan_instances,
    registry,
    tuning_params,
    validate_services,
)
from dsctl.errors import ExitStatus

HOST = "lab-01"
VENV = "/opt/dsctl/serving-venv"
# Listens on every address: without a key that takes allow_unauthenticated (see the authentication tests).
CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "npus_per_instance": 4, "allow_unauthenticated": True}
SECRET = "sk-very-secret-9f8e7d"


def validate(services, *, npu_count: int = 8, vllm_ascend: str | None = "v0.13.0",
             manager_default: str = "systemd") -> list[ServiceSpec]:
    return validate_services(HOST, services, npu_count=npu_count, vllm_ascend=vllm_ascend, serving_venv=VENV,
                             manager_default=manager_default)


def problem(services, **kwargs) -> str:
    with pytest.raises(ServiceError) as raised:
        validate(services, **kwargs)
    assert raised.value.exit_status == ExitStatus.USAGE
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"inventory: host {HOST}: dsctl_services")
    return message


def chat(**changes) -> dict:
    return {**CHAT, **changes}


# --------------------------------------------------------------------------- the registry


def test_registry_entries_are_complete():
    document = data.load("engine_params")
    sources = document["sources"]
    for engine, spec in registry().items():
        assert spec["params"], engine
        for name, entry in spec["params"].items():
            assert entry["type"] in ("int", "float", "bool", "str", "enum", "json"), name
            assert entry["confidence"] in ("official", "observed", "inferred"), name
            render = entry["render"]
            key = {"vllm-ascend": ("flag", "additional_config"), "lab-engine": ("flag", "additional_config"),
                   "mindie": ("config",)}[engine]
            assert any(k in render for k in key), (engine, name)
            for part in re.split(r";\s*", entry["source"]):
                word = part.split(" ")[0]
                assert word in sources or not re.fullmatch(r"[a-z0-9_]+", word), (engine, name, word)
            if engine == "mindie":
                assert "default" in entry, name
            if entry.get("removed_in"):
                assert entry["until"] and entry["removed_by"] and entry["replacement"], name
            if entry.get("since"):
                assert entry["before"], name


def test_registry_holds_the_tuning_knobs():
    vllm = {name for name, entry in engine_params("vllm-ascend").items() if entry.get("tune")}
    assert {"max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization",
            "enable_chunked_prefill", "enable_prefix_caching", "block_size", "enforce_eager",
            "multistream_overlap_shared_expert", "pa_shape_list"} <= vllm
    assert not {"stream_num", "batch_size", "kv_sparse_threshold"} & set(engine_params("vllm-ascend"))
    mindie = {name for name, entry in engine_params("mindie").items() if entry.get("tune")}
    assert {"maxBatchSize", "maxPrefillBatchSize", "maxPrefillTokens", "maxSeqLen", "npuMemSize",
            "maxQueueDelayMicroseconds", "supportSelectBatch", "prefillTimeMsPerReq", "decodeTimeMsPerReq"} <= mindie
    assert {"maxInputTokenLen", "cacheBlockSize"} <= set(engine_params("mindie"))
    lab = engine_params("lab-engine")
    assert {"max_num_seqs", "batch_size", "stream_num", "kv_sparse_threshold", "enable_prefix_caching", "chip",
            "seed"} <= set(lab)
    assert "compilation_config" not in lab  # the emulated engine has no such flag


def test_removed_keys_cite_their_prs():
    params = engine_params("vllm-ascend")
    assert params["torchair_graph_config"]["removed_by"] == "vllm-project/vllm-ascend PR #4814"
    assert params["ascend_scheduler_config"]["removed_by"] == "vllm-project/vllm-ascend PR #4612"
    for name in ("torchair_graph_config", "ascend_scheduler_config"):
        assert (params[name]["until"], params[name]["removed_in"]) == ("v0.12.0rc1", "v0.13.0rc1")
    sources = data.load("engine_params")["sources"]
    assert "inferred from the PR date" in sources["vllm_ascend_pr_4814"]
    assert "inferred from the PR date" in sources["vllm_ascend_pr_4612"]


def test_tuning_params_follow_the_version():
    assert "max_num_seqs" in tuning_params("vllm-ascend", vllm_ascend="v0.13.0")
    assert "maxBatchSize" in tuning_params("mindie")


def test_the_registry_file_is_yaml_with_one_schema():
    assert data.load("engine_params")["schema"] == 1


# --------------------------------------------------------------------------- defaults


def test_defaults():
    (spec,) = validate([CHAT])
    assert spec.manager == "systemd"
    assert spec.served_model_name == "DeepSeek-R1-Distill-Qwen-7B"
    assert (spec.instances, spec.tensor_parallel_size, spec.data_parallel_size) == (1, 4, 1)
    assert (spec.port, spec.bind, spec.user, spec.group) == (8000, "0.0.0.0", "dsctl-serve", "HwHiAiUser")
    assert spec.health_timeout_s == 900
    assert spec.venv == VENV
    assert spec.api_key is None and spec.params == {} and spec.env == {}
    assert spec.readiness == {"kind": "http", "paths": ["/health", "/v1/models"]}


def test_host_defaults_and_engine_defaults():
    mindie = {"name": "mi", "engine": "mindie", "model": "/models/qwen/", "npus_per_instance": 2,
              "allow_unauthenticated": True}
    (spec,) = validate([mindie], manager_default="supervisor")
    assert spec.manager == "supervisor"
    assert spec.port == 1025
    assert spec.served_model_name == "qwen"
    assert spec.readiness["line"] == "Daemon start success!"
    (named,) = validate([chat(model="deepseek-ai/DeepSeek-R1")])
    assert named.served_model_name == "DeepSeek-R1"
    assert validate_services(HOST, [CHAT], npu_count=8, vllm_ascend="v0.13.0")[0].venv == DEFAULT_VENV


def test_no_services():
    assert validate(None) == []
    assert validate([]) == []


def test_values_are_normalised():
    (spec,) = validate([chat(params={"gpu_memory_utilization": 1, "compilation_config": {"cudagraph_mode": "FULL"}},
                             env={"TASK_QUEUE_ENABLE": 2, "HCCL_BUFFSIZE": 512, "VLLM_USE_V1": "1"})])
    assert spec.params == {"gpu_memory_utilization": 1.0, "compilation_config": {"cudagraph_mode": "FULL"}}
    assert spec.env == {"TASK_QUEUE_ENABLE": "2", "HCCL_BUFFSIZE": "512", "VLLM_USE_V1": "1"}


def test_a_service_env_takes_the_field_guides_memory_env_by_the_host_envs_rules():
    (spec,) = validate([chat(env={"ASCEND_CACHE_SIZE": 6000000000, "GE_USE_STATIC_MEMORY": 1,
                                  "NPU_MEMORY_FRACTION": 0.96})])
    assert spec.env == {"ASCEND_CACHE_SIZE": "6000000000", "GE_USE_STATIC_MEMORY": "1", "NPU_MEMORY_FRACTION": "0.96"}


# --------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (chat(params={"max_num_seqz": 64}),
         "dsctl_services[0].params.max_num_seqz: unknown vllm-ascend parameter; did you mean max_num_seqs?"),
        (chat(params={"max-num-seqs": 64}),
         "dsctl_services[0].params.max-num-seqs: unknown vllm-ascend parameter; did you mean max_num_seqs?"),
        (chat(params={"frobnicate": 1}),
         "dsctl_services[0].params.frobnicate: unknown vllm-ascend parameter; remove it, or add it with a source to "
         "dsctl/data/engine_params.yaml"),
        ({**CHAT, "npu_per_instance": 4},
         "dsctl_services[0].npu_per_instance: unknown service setting; did you mean npus_per_instance?"),
        ({k: v for k, v in CHAT.items() if k != "model"},
         "dsctl_services[0].model: required but not set (an absolute path to the weights (letters, digits and "
         "._/+- without '..') or a model name such as deepseek-ai/DeepSeek-R1); add it to the service"),
        (chat(npus_per_instance="four"),
         "dsctl_services[0].npus_per_instance: expected an integer 1..16, got 'four'; fix it in group_vars or "
         "host_vars"),
        (chat(engine="vllm"),
         "dsctl_services[0].engine: expected one of vllm-ascend, mindie, lab-engine, got 'vllm'; fix it in "
         "group_vars or host_vars"),
        (chat(name="Chat_1"),
         "dsctl_services[0].name: expected a slug: lower-case letters, digits and '-', starting with a letter, at "
         "most 32 characters, got 'Chat_1'; fix it in group_vars or host_vars"),
        (chat(bind="localhost"),
         "dsctl_services[0].bind: expected an IP address such as 0.0.0.0 or 127.0.0.1, got 'localhost'; fix it in "
         "group_vars or host_vars"),
        (chat(tensor_parallel_size=2),
         "dsctl_services[0].tensor_parallel_size: tensor_parallel_size 2 x data_parallel_size 1 = 2, but "
         "npus_per_instance is 4; make tensor_parallel_size x data_parallel_size equal npus_per_instance"),
        (chat(tensor_parallel_size=2, data_parallel_size=4),
         "dsctl_services[0].data_parallel_size: tensor_parallel_size 2 x data_parallel_size 4 = 8, but "
         "npus_per_instance is 4; make tensor_parallel_size x data_parallel_size equal npus_per_instance"),
        (chat(data_parallel_size=3),
         "dsctl_services[0].data_parallel_size: npus_per_instance 4 is not a multiple of data_parallel_size 3; make "
         "tensor_parallel_size x data_parallel_size equal npus_per_instance"),
        (chat(params={"tensor_parallel_size": 4}),
         "dsctl_services[0].params.tensor_parallel_size: set by the service field tensor_parallel_size, not under "
         "params; move it there"),
        (chat(params={"additional_config": {"enable_kv_nz": True}}),
         "dsctl_services[0].params.additional_config: not a parameter: write its keys directly under params, e.g. "
         "params.multistream_overlap_shared_expert: true"),
        (chat(params={"max_num_seqs": "many"}),
         "dsctl_services[0].params.max_num_seqs: expected an integer from 1 to 1048576, got 'many'; fix it in "
         "group_vars or host_vars"),
        (chat(params={"gpu_memory_utilization": 1.5}),
         "dsctl_services[0].params.gpu_memory_utilization: expected a number > 0.0 and <= 1.0, got 1.5; fix it in "
         "group_vars or host_vars"),
        (chat(params={"block_size": 100}),
         "dsctl_services[0].params.block_size: expected one of 1, 8, 16, 32, 64, 128, 256, got 100; fix it in "
         "group_vars or host_vars"),
        (chat(params={"enable_prefix_caching": "yes"}),
         "dsctl_services[0].params.enable_prefix_caching: expected true or false (unquoted), got 'yes'; fix it in "
         "group_vars or host_vars"),
        (chat(engine="lab-engine", model="deepseek-r1-distill-qwen-7b", params={"kv_sparse_threshold": 1.0}),
         "dsctl_services[0].params.kv_sparse_threshold: expected a number >= 0.0 and < 1.0, got 1.0; fix it in "
         "group_vars or host_vars"),
        (chat(params={"scheduler_config": {"enable_balance_schedulng": True}}),
         "dsctl_services[0].params.scheduler_config.enable_balance_schedulng: unknown key of scheduler_config; did "
         "you mean enable_balance_scheduling?"),
        (chat(params={"pa_shape_list": [8, "x"]}),
         "dsctl_services[0].params.pa_shape_list: expected a list of integers, got [8, 'x']; fix it in group_vars "
         "or host_vars"),
        (chat(params={"stream_num": 8, "max_num_seqs": 4}),
         "dsctl_services[0].params.stream_num: not a vllm-ascend parameter: it belongs to the fixed-batch engine "
         "(CANN 8.0 sites' own server scripts, `--batch-size B --stream-num S`; engine lab-engine in the lab), "
         "and real vLLM stops with \"unrecognized arguments\"; on vllm-ascend tune max_num_seqs and "
         "max_num_batched_tokens (the stream switch is multistream_overlap_shared_expert)"),
        (chat(env={"ASCEND_RT_VISIBLE_DEVICES": "0"}),
         "dsctl_services[0].env.ASCEND_RT_VISIBLE_DEVICES: set by dsctl: each instance is pinned to its own NPUs; "
         "remove it"),
        (chat(env={"1BAD": "x"}),
         "dsctl_services[0].env.1BAD: not an environment variable name; use letters, digits and _"),
        (chat(env={"TASK_QUEUE_ENABLE": 5}),
         "dsctl_services[0].env.TASK_QUEUE_ENABLE: expected one of 0, 1, 2, got 5; pick one of them"),
        # the host env's rules (ascend_env.check_variable): bounds, typos
        (chat(env={"ASCEND_CACHE_SIZE": 6000000000000000}),
         "dsctl_services[0].env.ASCEND_CACHE_SIZE: expected an integer number of bytes from 1 to 1099511627776, got "
         "6000000000000000; write a value in range, e.g. 6000000000"),
        (chat(env={"GE_USE_STATIC_MEMORY": "on"}),
         "dsctl_services[0].env.GE_USE_STATIC_MEMORY: expected one of 0, 1, 2, 3, 4, got 'on'; pick one of them"),
        (chat(env={"HCCL_BUFSIZE": 512}),
         "dsctl_services[0].env.HCCL_BUFSIZE: not a variable dsctl knows; did you mean HCCL_BUFFSIZE?"),
        (chat(env={"LD_PRELOAD": "a.so\\ b.so"}),
         "dsctl_services[0].env.LD_PRELOAD: expected a one-line value without surrounding blanks, leading quotes "
         "or backslashes (the env file holds it unquoted); fix it in group_vars or host_vars"),
        (chat(manager="container"),
         "dsctl_services[0].image: required with manager container (the image that has the engine); add it to the "
         "service"),
        (chat(image="quay.io/ascend/vllm-ascend:v0.13.0"),
         "dsctl_services[0].image: only for manager container (this service uses systemd); remove it or set "
         "manager: container"),
        (chat(time_scale=0.01),
         "dsctl_services[0].time_scale: only for engine lab-engine (the emulated engine); remove it"),
        (chat(user="root"),
         "dsctl_services[0].user: root is refused: NPU services run as an unprivileged user in the HwHiAiUser group "
         "(default dsctl-serve)"),
        (chat(port=65535, instances=2),
         "dsctl_services[0].port: 2 instance(s) from port 65535 need ports up to 65536; pick a lower port"),
        (chat(engine="lab-engine", data_parallel_size=2, tensor_parallel_size=2),
         "dsctl_services[0].data_parallel_size: lab-engine has no data parallelism; run more instances instead"),
        (chat(engine="lab-engine", params={"compilation_config": {}}),
         "dsctl_services[0].params.compilation_config: unknown lab-engine parameter; remove it, or add it with a "
         "source to dsctl/data/engine_params.yaml"),
        (chat(engine="mindie", model="qwen"),
         "dsctl_services[0].model: MindIE loads weights from a directory: give its absolute path (modelWeightPath)"),
        (chat(engine="mindie", api_key=SECRET),
         "dsctl_services[0].api_key: MindIE's config.json has no API key; remove it and put an authenticating "
         "proxy in front of the service"),
        (chat(engine="mindie", params={"maxPrefillBatchSize": 300}),
         "dsctl_services[0].params.maxPrefillBatchSize: 300 is more than maxBatchSize (200, dsctl's default); "
         "MindIE needs maxPrefillBatchSize <= maxBatchSize"),
        (chat(engine="mindie", params={"maxPrefillBatchSize": 300, "maxBatchSize": 100}),
         "dsctl_services[0].params.maxPrefillBatchSize: 300 is more than maxBatchSize (100); MindIE needs "
         "maxPrefillBatchSize <= maxBatchSize"),
        (chat(engine="mindie", params={"maxBatchSize": 40}),
         "dsctl_services[0].params.maxBatchSize: 40 is less than maxPrefillBatchSize (50, dsctl's default); MindIE "
         "needs maxPrefillBatchSize <= maxBatchSize: raise it or set maxPrefillBatchSize too"),
        (chat(engine="mindie", params={"cacheBlockSize": 96}),
         "dsctl_services[0].params.cacheBlockSize: expected an integer from 1 to 128 that is a power of 2, got 96; "
         "fix it in group_vars or host_vars"),
        (chat(engine="mindie", params={"cacheBlockSize": 256}),
         "dsctl_services[0].params.cacheBlockSize: expected an integer from 1 to 128 that is a power of 2, got "
         "256; fix it in group_vars or host_vars"),
        (chat(engine="mindie", params={"maxInputTokenLen": 16384}),
         "dsctl_services[0].params.maxInputTokenLen: 16384 is more than maxSeqLen (8192, dsctl's default); a "
         "prompt must fit the context"),
        (chat(engine="mindie", params={"maxbatchsize": 64}),
         "dsctl_services[0].params.maxbatchsize: unknown mindie parameter; did you mean maxBatchSize?"),
        (chat(engine="mindie", params={"npuDeviceIds": [[0, 1]]}),
         "dsctl_services[0].params.npuDeviceIds: set by the service field npus_per_instance, not under params; "
         "move it there"),
    ],
)
def test_one_line_errors(entry, expected):
    assert problem([entry]) == f"inventory: host {HOST}: {expected}"


def test_the_error_names_the_entry_index():
    message = problem([CHAT, {**CHAT, "name": "embed", "port": 9000, "params": {"max_num_seqz": 1}}],
                      npu_count=8)
    assert message.startswith(f"inventory: host {HOST}: dsctl_services[1].params.max_num_seqz: ")


def test_more_problems_are_counted():
    message = problem([{**CHAT, "npus_per_instance": "four", "instances": "two"}])
    assert message.endswith("(1 more problem in this service)")


@pytest.mark.parametrize(
    ("services", "expected"),
    [
        ("chat", "dsctl_services: expected a list of services (name, engine, model, npus_per_instance, ...), got "
                 "'chat'; fix it in group_vars or host_vars"),
        (["chat"], "dsctl_services[0]: expected a mapping (name, engine, model, npus_per_instance, ...), got 'chat'; "
                   "fix it in group_vars or host_vars"),
    ],
)
def test_list_shape_errors(services, expected):
    assert problem(services) == f"inventory: host {HOST}: {expected}"


def test_an_unknown_manager_default_is_refused():
    with pytest.raises(ServiceError, match=r"^inventory: host lab-01: dsctl_service_manager: expected one of "
                                           r"systemd, supervisor, container, got 'runit'"):
        validate([CHAT], manager_default="runit")


def test_vllm_ascend_needs_a_serving_stack():
    assert problem([CHAT], vllm_ascend=None) == (
        f"inventory: host {HOST}: dsctl_services[0].engine: vllm-ascend needs the serving stack, but "
        'dsctl_vllm_ascend_version is none on this host; set dsctl_vllm_ascend_version (e.g. "v0.13.0") or use '
        "another engine")
    lab = chat(engine="lab-engine", time_scale=0.01)
    assert validate([lab], vllm_ascend=None)[0].time_scale == 0.01


# --------------------------------------------------------------------------- version gates


def test_torchair_graph_config_is_removed_from_v0_13_0rc1():
    entry = chat(params={"torchair_graph_config": {"enabled": True}})
    message = problem([entry], vllm_ascend="v0.13.0")
    assert message.startswith(
        f"inventory: host {HOST}: dsctl_services[0].params.torchair_graph_config: removed in vllm-ascend v0.13.0rc1 "
        "(vllm-project/vllm-ascend PR #4814); use compilation_config")
    assert problem([entry], vllm_ascend="v0.13.0rc1") == message
    for version in ("v0.12.0rc1", "v0.11.0", "v0.9.1"):
        (spec,) = validate([entry], vllm_ascend=version)
        assert spec.params == {"torchair_graph_config": {"enabled": True}}


def test_ascend_scheduler_config_is_removed_from_v0_13_0rc1():
    entry = chat(params={"ascend_scheduler_config": {"enabled": True, "enable_chunked_prefill": False}})
    assert problem([entry], vllm_ascend="v0.18.0").startswith(
        f"inventory: host {HOST}: dsctl_services[0].params.ascend_scheduler_config: removed in vllm-ascend "
        "v0.13.0rc1 (vllm-project/vllm-ascend PR #4612); use the vLLM flags")
    assert validate([entry], vllm_ascend="v0.12.0rc1")[0].params["ascend_scheduler_config"]["enabled"] is True


def test_keys_migrated_from_the_environment_need_a_newer_release():
    entry = chat(params={"weight_nz_mode": 1})
    assert problem([entry], vllm_ascend="v0.13.0") == (
        f"inventory: host {HOST}: dsctl_services[0].params.weight_nz_mode: needs vllm-ascend v0.21.0rc1 or later and "
        "this host runs v0.13.0; set the environment variable VLLM_ASCEND_ENABLE_NZ under env instead")
    assert validate([entry], vllm_ascend="v0.23.0")[0].params == {"weight_nz_mode": 1}


def test_lab_engine_params_are_not_version_gated():
    assert check_params("lab-engine", {"max_num_seqs": 8}, vllm_ascend="v0.7.3") == {"max_num_seqs": 8}


def test_effective_params_fill_mindie_defaults():
    values = effective_params("mindie", {"maxBatchSize": 256})
    assert values["maxBatchSize"] == 256
    assert (values["maxPrefillBatchSize"], values["cacheBlockSize"], values["npuMemSize"]) == (50, 128, -1)
    assert effective_params("vllm-ascend", {"max_num_seqs": 4}) == {"max_num_seqs": 4}


def test_with_params_checks_like_the_inventory():
    (spec,) = validate([chat(api_key=SECRET, params={"max_num_seqs": 64})])
    candidate = spec.with_params({"max_num_seqs": 128, "gpu_memory_utilization": 0.92})
    assert candidate.params == {"max_num_seqs": 128, "gpu_memory_utilization": 0.92}
    assert candidate.api_key.get_secret_value() == SECRET
    assert (candidate.name, candidate.port, candidate.venv) == (spec.name, spec.port, spec.venv)
    with pytest.raises(ServiceError) as raised:
        spec.with_params({"torchair_graph_config": {"enabled": True}})
    assert str(raised.value).startswith("service chat: params.torchair_graph_config: removed in vllm-ascend")


# --------------------------------------------------------------------------- NPU plan


def test_eight_npus_two_tp4_instances():
    (spec,) = validate([chat(instances=2)])
    first, second = plan_host([spec], 8)
    assert (first.name, first.unit, first.npus, first.visible_devices, first.port) == (
        "chat-0", "dsctl-chat-0", (0, 1, 2, 3), "0,1,2,3", 8000)
    assert (second.name, second.unit, second.npus, second.visible_devices, second.port) == (
        "chat-1", "dsctl-chat-1", (4, 5, 6, 7), "4,5,6,7", 8001)
    assert spec.tensor_parallel_size == 4


def test_npus_are_handed_out_in_order_across_services():
    specs = validate([chat(npus_per_instance=2, instances=2),
                      {"name": "mi", "engine": "mindie", "model": "/models/qwen", "npus_per_instance": 4,
                       "allow_unauthenticated": True}])
    instances = plan_host(specs, 8)
    assert [(i.name, i.visible_devices, i.ports) for i in instances] == [
        ("chat-0", "0,1", (8000,)), ("chat-1", "2,3", (8001,)), ("mi-0", "4,5,6,7", (1025, 1026, 1027))]


def test_mindie_instances_take_three_ports_each():
    (spec,) = validate([{"name": "mi", "engine": "mindie", "model": "/models/qwen", "npus_per_instance": 4,
                         "instances": 2, "allow_unauthenticated": True}])
    assert [i.ports for i in plan_instances(spec, list(range(8)))] == [(1025, 1026, 1027), (1028, 1029, 1030)]


def test_plan_instances_needs_exactly_the_service_npus():
    (spec,) = validate([chat(instances=2)])
    with pytest.raises(ServiceError, match="2 x 4 NPUs planned on 4 NPU id"):
        plan_instances(spec, [0, 1, 2, 3])
    with pytest.raises(ServiceError, match="need 8 NPUs but the host has 4"):
        plan_host([spec], 4)


def test_more_npus_than_the_host_has():
    services = [chat(instances=2), {**CHAT, "name": "embed", "port": 9000}]
    assert problem(services) == (
        f"inventory: host {HOST}: dsctl_services[1].instances: the services need 12 NPUs (chat 2 x 4, embed 1 x 4) "
        "but the host has 8 (dsctl_npu_count); lower instances or npus_per_instance")
    assert problem([chat(instances=3)]).startswith(f"inventory: host {HOST}: dsctl_services[0].instances: ")


def test_duplicate_ports_across_services():
    services = [chat(npus_per_instance=2, instances=2), {**CHAT, "name": "embed", "npus_per_instance": 2,
                                                         "port": 8001}]
    assert problem(services) == (
        f"inventory: host {HOST}: dsctl_services[1].port: port 8001 of embed-0 is also used by chat-1 "
        "(dsctl_services[0].port); give each service its own port range (embed needs 1 from its port)")
    mindie = {"name": "mi", "engine": "mindie", "model": "/models/qwen", "npus_per_instance": 2, "port": 7999,
              "allow_unauthenticated": True}
    assert "port 8000 of mi-0 is also used by chat-0 (dsctl_services[0].port)" in problem([chat(npus_per_instance=2),
                                                                                           mindie])


def test_duplicate_service_names():
    assert problem([CHAT, {**CHAT, "port": 9000}]) == (
        f"inventory: host {HOST}: dsctl_services[1].name: 'chat' is also the name of dsctl_services[0]; give each "
        "service on a host its own name")


# --------------------------------------------------------------------------- the API key is a secret


def test_api_key_never_shows():
    (spec,) = validate([chat(api_key=SECRET)])
    assert spec.api_key.get_secret_value() == SECRET
    for text in (str(spec), repr(spec), spec.model_dump_json(), str(spec.model_dump(mode="json"))):
        assert SECRET not in text
    assert "**********" in repr(spec)


@pytest.mark.parametrize(
    "entry",
    [
        chat(api_key=SECRET, npus_per_instance="four"),
        chat(api_key=SECRET, params={"max_num_seqz": 1}),
        chat(api_key=SECRET, engine="mindie"),
        chat(api_key=f"{SECRET} with blanks"),
        chat(api_key=f"'{SECRET}'"),
        chat(api_key="short"),
    ],
)
def test_api_key_never_in_error_text(entry):
    with pytest.raises(ServiceError) as raised:
        validate([entry])
    error = raised.value
    assert SECRET not in str(error) and "'short'" not in str(error)
    assert error.__cause__ is None and error.__suppress_context__
    assert SECRET not in repr(error.args)


def test_an_api_key_problem_says_the_value_is_not_shown():
    message = problem([chat(api_key=f"{SECRET} with blanks")])
    assert message == (
        f"inventory: host {HOST}: dsctl_services[0].api_key: expected a key of 8 to 512 printable ASCII characters "
        "without blanks, quotes or backslashes (the value is not shown); fix it in group_vars or host_vars")


def test_a_spec_built_directly_derives_its_defaults():
    """tune builds candidates without an inventory: the same defaults, the same parameter check."""
    spec = ServiceSpec(name="cand", engine="vllm-ascend", model="/models/m/", npus_per_instance=2,
                       allow_unauthenticated=True, params={"gpu_memory_utilization": 1})
    assert (spec.port, spec.tensor_parallel_size, spec.served_model_name, spec.venv) == (8000, 2, "m", DEFAULT_VENV)
    assert spec.params == {"gpu_memory_utilization": 1.0}
    with pytest.raises(ServiceError, match=r"^params\.max_num_seqz: unknown vllm-ascend parameter; did you mean"):
        ServiceSpec(name="cand", engine="vllm-ascend", model="/models/m", npus_per_instance=2,
                    allow_unauthenticated=True, params={"max_num_seqz": 1})


# --------------------------------------------------------------------------- authentication, groups, paths

OPEN = {k: v for k, v in CHAT.items() if k != "allow_unauthenticated"}


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.0.5", "fe80::1"])
def test_an_api_key_is_required_beyond_loopback(bind):
    assert problem([{**OPEN, "bind": bind}]) == (
        f"inventory: host {HOST}: dsctl_services[0].api_key: the service listens on {bind}"
        f"{' (every address)' if bind in ('0.0.0.0', '::') else ''}, beyond this host, without an api_key; set "
        "api_key (from ansible-vault: api_key: \"{{ vault_chat_api_key }}\"), bind 127.0.0.1, or set "
        "allow_unauthenticated: true to serve anyone who can reach the port")


def test_the_default_bind_needs_a_key_too():
    assert "dsctl_services[0].api_key: the service listens on 0.0.0.0 (every address)" in problem([OPEN])


@pytest.mark.parametrize("service", [
    {**OPEN, "bind": "127.0.0.1"}, {**OPEN, "bind": "127.8.9.10"}, {**OPEN, "bind": "::1"},
    {**OPEN, "api_key": SECRET}, {**OPEN, "allow_unauthenticated": True},
])
def test_loopback_a_key_or_an_explicit_opt_out_pass(service):
    (spec,) = validate([service])
    assert spec.allow_unauthenticated is bool(service.get("allow_unauthenticated"))


def test_the_opt_out_must_be_a_real_boolean():
    assert problem([{**OPEN, "allow_unauthenticated": "yes"}]) == (
        f"inventory: host {HOST}: dsctl_services[0].allow_unauthenticated: expected true or false (unquoted), "
        "got 'yes'; fix it in group_vars or host_vars")


def test_mindie_beyond_loopback_needs_the_opt_out():
    mindie = {"name": "mi", "engine": "mindie", "model": "/models/qwen", "npus_per_instance": 4}
    assert problem([mindie]) == (
        f"inventory: host {HOST}: dsctl_services[0].bind: MindIE has no API key and the service listens on 0.0.0.0 "
        "(every address), beyond this host; bind 127.0.0.1 behind an authenticating proxy, or set "
        "allow_unauthenticated: true")
    assert validate([{**mindie, "bind": "127.0.0.1"}])[0].bind == "127.0.0.1"


def test_tunes_candidates_keep_the_opt_out():
    (spec,) = validate([chat(params={"max_num_seqs": 64})])
    assert spec.with_params({"max_num_seqs": 32}).allow_unauthenticated is True


@pytest.mark.parametrize("group", ["root", "wheel", "sudo", "docker", "disk", "adm", "shadow", "kmem", "lxd"])
def test_privileged_groups_are_refused_for_the_service_user(group):
    assert problem([chat(group=group)]).startswith(
        f"inventory: host {HOST}: dsctl_services[0].group: {group!r} is a privileged group (")


@pytest.mark.parametrize("path", ["/opt/venv$(touch${IFS}/owned)", "/opt/`id`", "/opt/a b", "/opt/x;y",
                                  "/opt/../etc", "/opt/100%", "opt/venv", "/opt/'q'"])
def test_path_fields_take_a_safe_character_set_only(path):
    for field, value in (("venv", path), ("model", path.rstrip("/") + "/weights")):
        message = problem([chat(**{field: value})])
        assert message.startswith(f"inventory: host {HOST}: dsctl_services[0].{field}: expected an absolute path")
        assert "letters, digits and" in message


def test_safe_paths_pass():
    (spec,) = validate([chat(venv="/opt/dsctl/serving-venv_2.1+cpu", model="/models/Qwen2.5-7B.Instruct/")])
    assert spec.venv == "/opt/dsctl/serving-venv_2.1+cpu"
