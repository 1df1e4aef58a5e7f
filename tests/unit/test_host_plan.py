"""The per-host plan (core/inventory/host_plan.py) the verbs hand to the plays as dsctl_plan: it equals what the
role filters compute without one, and a filter given a plan returns the plan's entry instead of validating again.
Real schema, renderer and filter module; the inventories are read by the real ansible-inventory."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl import data
from dsctl.adapters import inventory
from dsctl.core.inventory import host_plan
from dsctl.core.lab.plan import plan_lab
from dsctl.lab.hosts import LabPaths
from dsctl.lab.inventory import render_inventory

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventories" / "sample"
ARCHES = ("x86_64", "aarch64", "any")
OVERRIDES = {"chat": {"max_num_seqs": 16}}


def load_filters():
    path = REPO / "playbooks" / "filter_plugins" / "dsctl_filters.py"
    spec = importlib.util.spec_from_file_location("dsctl_filters_plan_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = load_filters()


@functools.cache
def sample_hostvars() -> dict[str, dict]:
    return inventory.host_vars(SAMPLE)


@functools.cache
def lab_hostvars(root: str) -> dict[str, dict]:
    """The inventory `dsctl lab up` writes for 2 hosts x 8 NPUs, read back as Ansible sees it."""
    spec = plan_lab(hosts=2, npus=8, chip="910B3", chips=data.load("chips")["chips"])
    paths = LabPaths(Path(root))
    paths.inventory.write_text(render_inventory(spec, paths))
    return inventory.host_vars(paths.inventory)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, dict]:
    return lab_hostvars(str(tmp_path_factory.mktemp("lab")))


def as_play_sees(hostvars: dict[str, dict], host: str, plan=None) -> dict:
    """One host's hostvars in the play: inventory_hostname, and dsctl_plan when the verb handed one in."""
    return {"inventory_hostname": host, **hostvars[host], **({"dsctl_plan": plan} if plan is not None else {})}


def assert_plan_equals_filters(hostvars: dict[str, dict], overrides: dict, only: list[str] | None) -> dict:
    plan = host_plan.plan_fleet(hostvars, overrides=overrides, only=only)
    assert json.loads(json.dumps(plan)) == plan  # what the extra-vars file carries, unchanged
    assert plan["version"] == host_plan.PLAN_VERSION and plan["fleet"] == sorted(hostvars)
    for host in hostvars:
        entry = plan["hosts"][host]
        bare = as_play_sees(hostvars, host)
        assert entry["settings"] == FILTERS.host_settings(bare)
        for arch in ARCHES:
            assert host_plan.stack_for_arch(entry["stack"], arch) == FILTERS.desired_stack(bare, arch)
        if entry["instances"] is not None:
            assert entry["instances"] == FILTERS.service_instances(bare, overrides)
        # and a play handed the plan gets exactly what the filters would compute without it
        given = as_play_sees(hostvars, host, plan)
        assert FILTERS.host_settings(given) == FILTERS.host_settings(bare)
        for arch in ARCHES:
            assert FILTERS.desired_stack(given, arch) == FILTERS.desired_stack(bare, arch)
        assert FILTERS.service_instances(given, overrides, only) == FILTERS.service_instances(bare, overrides, only)
        assert FILTERS.service_instances(given, overrides) == FILTERS.service_instances(bare, overrides)
    return plan


def test_the_sample_plan_equals_the_filters_and_keeps_the_vaulted_key_out():
    plan = assert_plan_equals_filters(sample_hostvars(), OVERRIDES, ["chat-1"])
    # The sample's service holds a vaulted API key: its instances are rendered by the filter on the
    # controller, never written in clear into the run directory's extra-vars file.
    assert all(entry["instances"] is None for entry in plan["hosts"].values())
    key = FILTERS.service_instances(as_play_sees(sample_hostvars(), "atlas-a01"))[0]["api_key"]
    assert key and key not in json.dumps(plan)
    assert plan["hosts"]["atlas-a01"]["stack"]["driver_run"].count("{arch}") == 1


def test_the_lab_plan_equals_the_filters_with_rendered_instances(lab):
    plan = assert_plan_equals_filters(lab, OVERRIDES, ["chat-1"])
    for entry in plan["hosts"].values():
        assert [item["name"] for item in entry["instances"]] == ["chat-0", "chat-1"]
        launch = next(f["content"] for f in entry["instances"][0]["files"] if f["path"].endswith("launch.sh"))
        assert "--max-num-seqs 16" in launch
    assert_plan_equals_filters(lab, {}, None)


def recognisable_plan(lab) -> dict:
    """A real lab plan whose entries say, recognisably, that they came from the plan and not from validation."""
    plan = copy.deepcopy(host_plan.plan_fleet(lab))
    for entry in plan["hosts"].values():
        entry["settings"] = {**entry["settings"], "npu_count": 3, "service_config_dir": "/from/the/plan"}
        entry["stack"] = {**entry["stack"], "cann": "from-the-plan"}
        entry["instances"] = [{**item, "fingerprint": "from-the-plan"} for item in entry["instances"]]
    return plan


def test_a_filter_given_a_plan_returns_its_entry_without_validating(lab):
    plan = recognisable_plan(lab)
    host = sorted(lab)[0]
    # settings that would not validate: only the plan can answer for this host
    broken = {**as_play_sees(lab, host, plan), "dsctl_npu_count": "many"}
    with pytest.raises(FILTERS.AnsibleFilterError, match="dsctl_npu_count"):
        FILTERS.host_settings({key: value for key, value in broken.items() if key != "dsctl_plan"})
    assert FILTERS.host_settings(broken)["service_config_dir"] == "/from/the/plan"
    stack = FILTERS.desired_stack(broken, "aarch64")
    assert stack["cann"] == "from-the-plan" and "aarch64" in stack["driver_run"] and "{arch}" not in stack["driver_run"]
    assert [(i["name"], i["fingerprint"]) for i in FILTERS.service_instances(broken, {}, ["chat-1"])] == [
        ("chat-1", "from-the-plan")]
    assert len(FILTERS.service_instances(broken)) == 2
    hostvars = {name: {**as_play_sees(lab, name, plan), "dsctl_npu_count": "many"} for name in lab}
    assert FILTERS.fleet_problems(sorted(lab), hostvars) == []


def test_a_plan_for_other_hosts_or_other_overrides_is_not_used(lab):
    plan = recognisable_plan(lab)
    host, other = sorted(lab)
    hostvars = {name: {**as_play_sees(lab, name, plan), "dsctl_npu_count": "many"} for name in lab}
    hostvars["atlas-x99"] = {**as_play_sees(lab, host), "inventory_hostname": "atlas-x99", "dsctl_plan": plan,
                             "dsctl_npu_count": "many"}
    # the play's hosts are not the plan's fleet (e.g. --limit outside dsctl): the fleet is validated again
    problems = FILTERS.fleet_problems([host, other, "atlas-x99"], hostvars)
    assert len(problems) == 1 and "dsctl_npu_count" in problems[0]
    assert FILTERS.fleet_problems([host], hostvars) != []
    # a host the plan does not cover is validated as without a plan
    with pytest.raises(FILTERS.AnsibleFilterError, match="dsctl_npu_count"):
        FILTERS.host_settings(hostvars["atlas-x99"])
    # overrides other than the plan's: the instances are rendered again, from the host's own (valid) settings
    given = as_play_sees(lab, host, plan)
    rendered = FILTERS.service_instances(given, OVERRIDES)
    assert rendered == FILTERS.service_instances(as_play_sees(lab, host), OVERRIDES)
    assert all(item["fingerprint"] != "from-the-plan" for item in rendered)
    # a plan of another version is ignored
    assert FILTERS.host_settings(as_play_sees(lab, host, {**plan, "version": 99})) == FILTERS.host_settings(
        as_play_sees(lab, host))


def test_the_plan_reaches_a_real_play_verbatim_through_the_extra_vars_file(lab, tmp_path):
    """ansible-playbook templates extra-vars strings: the plan marks those holding Jinja delimiters unsafe, so a
    container's `{{.State.Running}}` check (and any rendered file) arrives as computed. Local connection only."""
    services = [*lab[sorted(lab)[0]]["dsctl_services"],
                {"name": "boxed", "engine": "vllm-ascend", "model": "/models/m", "npus_per_instance": 4,
                 "instances": 1, "port": 9000, "manager": "container", "image": "example/vllm-ascend:v0.13.0",
                 "params": {"max_num_seqs": 8}, "allow_unauthenticated": True}]
    hostvars = {"localhost": {**lab[sorted(lab)[0]], "dsctl_npu_count": 16, "dsctl_services": services}}
    plan = host_plan.plan_fleet(hostvars)
    expected = plan["hosts"]["localhost"]["instances"]
    assert "{{.State.Running}}" in expected[-1]["process_check"][3]
    extra = tmp_path / "extra_vars.json"
    extra.write_text(json.dumps({host_plan.PLAN_VAR: host_plan.as_extra_var(plan)}))
    out = tmp_path / "instances.json"
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.copy:\n"
        f"        dest: {out}\n"
        "        content: \"{{ hostvars[inventory_hostname] | dsctl_service_instances | to_json }}\"\n"
        "        mode: '0600'\n")
    env = {**os.environ, "ANSIBLE_FILTER_PLUGINS": str(REPO / "playbooks" / "filter_plugins")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(tmp_path / "play.yml"), "-e", f"@{extra}",
                           "-e", f"ansible_python_interpreter={sys.executable}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # localhost has no dsctl_* settings: only the plan can have answered, and it arrived unchanged
    assert json.loads(out.read_text()) == expected
