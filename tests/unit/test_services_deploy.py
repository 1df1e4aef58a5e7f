"""The deploy verb's plan (real schema and planner, no I/O): chosen instances, parameter overrides, extra vars,
the filter the role renders through, and naming the instance an interrupted rollout was on."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from dsctl.adapters import inventory
from dsctl.core.inventory.deploy_plan import FORCE_RESTART_VAR, ONLY_VAR, OVERRIDES_VAR, SERIAL_VAR, plan_deploy
from dsctl.core.inventory.schema import validate_fleet
from dsctl.errors import ExitStatus, UsageError
from dsctl.services.deploy import DeployInputs, DeployInterrupted, RolloutTracker

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventories" / "sample"


@functools.cache
def _sample_hostvars() -> dict[str, dict]:
    return inventory.host_vars(SAMPLE)


def sample_hostvars(**changes) -> dict[str, dict]:
    """The sample inventory's hosts as Ansible sees them (group_vars merged, the vaulted key templated)."""
    return {name: {**values, **changes} for name, values in _sample_hostvars().items()}


def chat(**fields) -> dict:
    return {"name": "chat", "engine": "vllm-ascend", "model": "/models/m", "npus_per_instance": 4, "instances": 2,
            "params": {"max_num_seqs": 64}, "allow_unauthenticated": True, **fields}


def plan(services=None, **kwargs):
    hostvars = sample_hostvars(**({"dsctl_services": services} if services is not None else {}))
    settings = validate_fleet(hostvars)
    addresses = {host: values["ansible_host"] for host, values in hostvars.items()}
    return plan_deploy(settings, addresses, **kwargs)


def test_all_instances_by_default_with_their_endpoints():
    result = plan()
    assert result.only is None
    assert [(p.host, p.instance.name, p.instance.visible_devices, p.endpoint) for p in result.instances] == [
        ("atlas-a01", "chat-0", "0,1,2,3", "http://192.0.2.11:8000/v1"),
        ("atlas-a01", "chat-1", "4,5,6,7", "http://192.0.2.11:8001/v1"),
        ("atlas-a02", "chat-0", "0,1,2,3", "http://192.0.2.12:8000/v1"),
        ("atlas-a02", "chat-1", "4,5,6,7", "http://192.0.2.12:8001/v1")]


def test_chosen_instances_and_services_expand_to_instance_names():
    services = [chat(instances=1), chat(name="side", instances=1, port=9000)]
    one = plan(services, instances=("chat-0",))
    assert one.only == ("chat-0",)
    assert {(p.host, p.instance.name) for p in one.instances} == {("atlas-a01", "chat-0"), ("atlas-a02", "chat-0")}
    both = plan(services, instances=("side", "chat-0", "side-0"))
    assert both.only == ("side-0", "chat-0")
    assert [p.instance.name for p in both.of_host("atlas-a01")] == ["chat-0", "side-0"]


def test_an_unknown_instance_is_refused_naming_what_exists():
    with pytest.raises(UsageError) as refused:
        plan(instances=("chat-7",))
    assert str(refused.value) == ("--instance chat-7: no such instance or service (instances: chat-0, chat-1; "
                                  "services: chat)")
    assert refused.value.exit_status == ExitStatus.USAGE


def test_overrides_are_checked_by_the_service_schema_before_any_play():
    changed = plan(overrides={"chat": {"max_num_seqs": 16, "gpu_memory_utilization": 0.8}})
    spec = changed.instances[0].spec
    # merged over the inventory's parameters, which stay unless overridden
    assert spec.params["max_num_seqs"] == 16 and spec.params["gpu_memory_utilization"] == 0.8
    assert spec.params["max_num_batched_tokens"] == 8192
    with pytest.raises(UsageError, match=r"^--param \(host atlas-a01\): service chat: params.max_num_seqz: unknown "
                                         r"vllm-ascend parameter; did you mean max_num_seqs\?$"):
        plan(overrides={"chat": {"max_num_seqz": 16}})
    with pytest.raises(UsageError, match="max_num_seqs"):
        plan(overrides={"chat": {"max_num_seqs": "many"}})
    with pytest.raises(UsageError, match=r"^--param chatty: no service 'chatty' in dsctl_services \(known: chat\)$"):
        plan(overrides={"chatty": {"max_num_seqs": 16}})


def test_extra_vars_carry_exactly_what_was_asked():
    inventory = SAMPLE / "hosts.yml"
    plain = DeployInputs(inventory=inventory)
    assert plain.extra_vars(plan()) == {}
    asked = DeployInputs(inventory=inventory, serial=1, instances=("chat-1",), restart=True,
                         overrides={"chat": {"max_num_seqs": 16}})
    assert asked.extra_vars(plan(instances=asked.instances, overrides=asked.overrides)) == {
        SERIAL_VAR: 1, OVERRIDES_VAR: {"chat": {"max_num_seqs": 16}}, ONLY_VAR: ["chat-1"], FORCE_RESTART_VAR: True}
    with pytest.raises(TypeError):  # the inputs are frozen, overrides included
        asked.overrides["chat"]["max_num_seqs"] = 1  # type: ignore[index]
    with pytest.raises(UsageError, match="--serial"):
        DeployInputs(inventory=inventory, serial=0)


def load_filters():
    path = REPO / "playbooks" / "filter_plugins" / "dsctl_filters.py"
    spec = importlib.util.spec_from_file_location("dsctl_filters_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_role_filter_applies_the_same_overrides_and_choice():
    filters = load_filters()
    host_vars = {"inventory_hostname": "atlas-a01", **sample_hostvars()["atlas-a01"]}
    every = filters.service_instances(host_vars)
    assert [i["name"] for i in every] == ["chat-0", "chat-1"]
    only = filters.service_instances(host_vars, {"chat": {"max_num_seqs": 16}}, ["chat-1"])
    assert [i["name"] for i in only] == ["chat-1"]
    launch = next(f["content"] for f in only[0]["files"] if f["path"].endswith("launch.sh"))
    assert "--max-num-seqs 16" in launch
    assert only[0]["fingerprint"] != every[1]["fingerprint"]
    # empty choice (the role's default) means every instance, unchanged
    assert filters.service_instances(host_vars, {}, []) == every
    with pytest.raises(filters.AnsibleFilterError, match="max_num_seqz"):
        filters.service_instances(host_vars, {"chat": {"max_num_seqz": 1}})


def runner_start(host: str, task: str) -> dict:
    return {"event": "runner_start", "host": host, "task": task, "role": "inference_service"}


def test_an_interrupted_rollout_names_the_instance_it_was_on():
    tracker = RolloutTracker(plan())
    for event in [runner_start("atlas-a01", "Read the deployed fingerprint of chat-0"),
                  {"event": "runner_ok", "host": "atlas-a01", "task": "Report an unchanged instance",
                   "facts": {"inference_service_report": {"chat-0": "unchanged"}}},
                  runner_start("atlas-a01", "Read the deployed fingerprint of chat-1"),
                  runner_start("atlas-a01", "Write the instance's files"),
                  runner_start("atlas-a01", "Wait until the instance serves (health, model list, one completion)"),
                  runner_start("atlas-a02", "Read the deployed fingerprint of chat-0"),
                  {"event": "runner_ok", "host": "atlas-a02", "task": "Report a restarted instance",
                   "facts": {"inference_service_report": {"chat-0": "restarted"}}}]:
        tracker(event)
    assert tracker.mid_rollout() == [
        ("atlas-a01", "chat-1", "Wait until the instance serves (health, model list, one completion)")]
    error = tracker.interrupted()
    assert isinstance(error, DeployInterrupted) and error.exit_status == ExitStatus.INTERRUPTED
    assert str(error).startswith("deploy stopped during the rollout of chat-1 on atlas-a01 (at: Wait until")
    assert "chat-0" not in str(error)


def test_instance_names_match_whole_words_only():
    # chat-1 is an instance of chat and the prefix of chat-1-0, the instance of service chat-1
    services = [chat(npus_per_instance=2), chat(name="chat-1", instances=1, npus_per_instance=2, port=9000)]
    tracker = RolloutTracker(plan(services))
    tracker(runner_start("atlas-a01", "Read the deployed fingerprint of chat-1-0"))
    assert tracker.mid_rollout() == [("atlas-a01", "chat-1-0", "Read the deployed fingerprint of chat-1-0")]
    assert str(RolloutTracker(plan()).interrupted()) == "deploy stopped before any instance was being rolled out"
