"""Issue 41, class 6 (gateway; its path cases are the paths class's): a gateway that can never reach an instance
(bound to loopback on another host), or that takes a port its host already uses, is refused by `deploy --render`
before any host is contacted, one line naming dsctl_gateway.services[i] (tests/cli/battery.py)."""

from __future__ import annotations

import pytest
import yaml

from dsctl.app import main

from .battery import REPO, assert_names, gateway_on_fleet_host, refusal, site

CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "npus_per_instance": 4, "instances": 2, "port": 8000, "allow_unauthenticated": True}
DEEPSEEK = yaml.safe_load((REPO / "inventories" / "examples" / "deepseek-v3-2x2.yml").read_text())["dsctl_services"][0]
GATEWAY = {"dsctl_gateway": {"services": [{"service": "chat", "port": 8080}]}}


# (case, fleet group_vars, where the gateway runs: "gw-01" | "controller" | "atlas-a01", words named)
CASES = [
    ("service on 127.0.0.1", {"dsctl_services": [{**CHAT, "bind": "127.0.0.1"}]}, "gw-01",
     ("dsctl_gateway.services[0]", "127.0.0.1", "dsctl_services[0].bind")),
    ("service on ::1", {"dsctl_services": [{**CHAT, "bind": "::1"}]}, "gw-01", ("dsctl_gateway.services[0]", "::1")),
    ("service on 127.0.0.2 (all of 127/8 is loopback)", {"dsctl_services": [{**CHAT, "bind": "127.0.0.2"}]},
     "gw-01", ("dsctl_gateway.services[0]", "127.0.0.2")),
    ("gateway on the controller", {"dsctl_services": [{**CHAT, "bind": "127.0.0.1"}],
                                   "dsctl_gateway_on_controller": True, **GATEWAY}, "controller",
     ("dsctl_gateway.services[0]", "127.0.0.1")),
    ("gateway on one fleet host, loopback instances on the other", {"dsctl_services": [{**CHAT, "bind": "127.0.0.1"}]},
     "atlas-a01", ("atlas-a02", "dsctl_gateway.services[0]", "127.0.0.1")),
    ("multi-host head on loopback", {"dsctl_services": [{**DEEPSEEK, "bind": "127.0.0.1"}]}, "gw-01",
     ("dsctl_gateway.services[0]", "127.0.0.1")),
]


@pytest.mark.parametrize(("fleet", "where", "words"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_gateway_that_cannot_reach_its_instances_is_refused(capsys, tmp_path, sentinel, fleet, where, words):
    gateway = GATEWAY if where == "gw-01" else None
    if fleet["dsctl_services"][0]["name"] == "deepseek":
        gateway = {"dsctl_gateway": {"services": [{"service": "deepseek", "port": 8080}]}}
    inventory = site(tmp_path, sentinel, fleet, gateway=gateway)
    if where == "atlas-a01":
        gateway_on_fleet_host(inventory, GATEWAY)
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"])
    assert_names(line, *words)


@pytest.mark.parametrize(("port", "words"), [(8000, ("instance chat-0",)), (8001, ("instance chat-1",)),
                                             ("SSH", ("sshd", "ansible_port"))])
def test_a_gateway_on_a_fleet_host_takes_no_port_of_that_host(capsys, tmp_path, sentinel, port, words):
    inventory = site(tmp_path, sentinel, {"dsctl_services": [CHAT]})
    port = sentinel.port if port == "SSH" else port
    gateway_on_fleet_host(inventory, {"dsctl_gateway": {"services": [{"service": "chat", "port": port}]}})
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"])
    assert_names(line, "dsctl_gateway.services[0].port", *words)


def test_a_gateway_host_of_its_own_keeps_sshd_s_port(capsys, tmp_path, sentinel):
    inventory = site(tmp_path, sentinel, {"dsctl_services": [CHAT]},
                     gateway={"dsctl_gateway": {"services": [{"service": "chat", "port": sentinel.port}]}})
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"])
    assert_names(line, "gw-01", "dsctl_gateway.services[0].port", "sshd")


def test_reachable_gateways_still_pass(capsys, tmp_path, sentinel):
    # A service on every address, or on loopback behind a gateway of its own host, is reachable.
    inventory = site(tmp_path, sentinel, {"dsctl_services": [CHAT]}, gateway=GATEWAY)
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    single = site(tmp_path, sentinel, {"dsctl_services": [{**CHAT, "bind": "127.0.0.1"}]}, hosts=("atlas-a01",),
                  name="single")
    gateway_on_fleet_host(single, GATEWAY)
    assert main(["deploy", str(single), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0
