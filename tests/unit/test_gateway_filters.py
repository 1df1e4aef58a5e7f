"""The gateway's Ansible filters (playbooks/filter_plugins/dsctl_gateway_filters.py) on inventory-shaped input."""

from __future__ import annotations

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError

from dsctl.assets import asset_root


def filters():
    path = asset_root() / "playbooks" / "filter_plugins" / "dsctl_gateway_filters.py"
    spec = importlib.util.spec_from_file_location("dsctl_gateway_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


FLEET_VARS = {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/packages", "dsctl_service_manager": "supervisor",
              "dsctl_services": [{"name": "chat", "engine": "lab-engine", "model": "m", "npus_per_instance": 4,
                                  "instances": 2, "port": 8000,
                                  "allow_unauthenticated": True}]}
DECLARATION = {"services": [{"service": "chat", "port": 8080}]}


def inventory(gateway_vars: dict | None = None, **fleet_extra):
    hostvars = {"lab-01": {"ansible_host": "10.78.0.11", **FLEET_VARS, **fleet_extra},
                "lab-02": {"ansible_host": "10.78.0.12", **FLEET_VARS, **fleet_extra}}
    groups = {"npu_nodes": ["lab-01", "lab-02"]}
    if gateway_vars is not None:
        hostvars["gw-01"] = {"ansible_host": "10.78.0.13", **gateway_vars}
        groups["gateway"] = ["gw-01"]
    return groups, hostvars


def test_no_gateway_declared_means_no_target():
    assert filters()["dsctl_gateway_targets"](*inventory()) == []


def test_a_gateway_host_and_the_controller_are_targets():
    assert filters()["dsctl_gateway_targets"](*inventory({"dsctl_gateway": DECLARATION})) == [
        {"name": "gw-01", "on_controller": False}]
    groups, hostvars = inventory(dsctl_gateway_on_controller=True, dsctl_gateway=DECLARATION)
    assert filters()["dsctl_gateway_targets"](groups, hostvars) == [{"name": "controller", "on_controller": True}]


def test_the_plan_keeps_recorded_drains_and_applies_this_run_s():
    groups, hostvars = inventory({"dsctl_gateway": DECLARATION})
    plan = filters()["dsctl_gateway_plan"]("gw-01", groups, hostvars, "lab-01/chat-1\n", ["lab-02/chat-0"], None)
    assert plan["drained"] == ["lab-01/chat-1", "lab-02/chat-0"]
    assert plan["drained_state"] == "lab-01/chat-1\nlab-02/chat-0\n"
    assert [m["id"] for m in plan["drain"]] == ["lab-02/chat-0"] and plan["undrain"] == []
    assert 'server "10.78.0.12:8000" down;' in plan["config"]
    assert plan["nginx_argv"] == ["/usr/sbin/nginx", "-c", "/etc/dsctl/gateway/nginx.conf", "-e",
                                  "/var/log/dsctl/gateway-error.log"]
    assert plan["fingerprint"] in plan["config"]


def test_bad_input_is_dsctl_s_one_line():
    groups, hostvars = inventory({"dsctl_gateway": DECLARATION})
    with pytest.raises(AnsibleFilterError, match="dsctl_gateway_undrain: lab-07/chat-0 is not an instance"):
        filters()["dsctl_gateway_plan"]("gw-01", groups, hostvars, "", None, "lab-07/chat-0")
    groups, hostvars = inventory({"dsctl_gateway": {"services": [{"service": "chat", "port": 0}]}})
    with pytest.raises(AnsibleFilterError, match=r"host gw-01: dsctl_gateway.services\[0\].port: expected a port"):
        filters()["dsctl_gateway_targets"](groups, hostvars)


def test_this_run_s_options_in_the_hostvars_are_not_taken_for_settings():
    # deploy hands its plan and options to the play as extra vars, which every host's hostvars then carry.
    run_options = {"dsctl_plan": {"version": 1, "fleet": ["lab-01", "lab-02"], "hosts": {}},
                   "dsctl_deploy_serial": 1, "dsctl_deploy_force_restart": True,
                   "dsctl_service_overrides": {"chat": {"max_num_seqs": 8}}, "dsctl_deploy_only": ["chat-0"]}
    groups, hostvars = inventory({"dsctl_gateway": DECLARATION, **run_options}, **run_options)
    plan = filters()["dsctl_gateway_plan"]("gw-01", groups, hostvars, "", None, None)
    assert 'server "10.78.0.11:8000"' in plan["config"] and 'server "10.78.0.12:8001"' in plan["config"]
