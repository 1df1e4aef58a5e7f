"""Issue 41, class 5 (ports): every port a host listens on is used once, service ports are unprivileged unless
asked for, and a URL's port is explicit and valid.  Each case is refused before any host is contacted, exit 2 or 3,
one line naming the field (tests/cli/battery.py)."""

from __future__ import annotations

import pytest
import yaml

from dsctl.app import main
from dsctl.core.serving.host_ports import host_table
from dsctl.core.serving.port_table import PortClash
from dsctl.core.serving.service import validate_services

from .battery import REPO, assert_names, gateway_on_fleet_host, refusal, site

CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "npus_per_instance": 4, "instances": 2, "port": 8000, "allow_unauthenticated": True}
DEEPSEEK = yaml.safe_load((REPO / "inventories" / "examples" / "deepseek-v3-2x2.yml").read_text())["dsctl_services"][0]
SSH = "SSH"  # stands for the sentinel's port: every host's ansible_port in the battery


def _with_ssh(value, port: int):
    if value == SSH:
        return port
    if isinstance(value, dict):
        return {key: _with_ssh(item, port) for key, item in value.items()}
    if isinstance(value, list):
        return [_with_ssh(item, port) for item in value]
    return value


# (case, services, gateway on atlas-a01 or None, words the line names)
CASES = [
    ("service port 22", [{**CHAT, "port": 22}], None, ("dsctl_services[0].port", "allow_privileged_port")),
    ("service port 80", [{**CHAT, "port": 80}], None, ("dsctl_services[0].port", "1024")),
    ("service port 1023", [{**CHAT, "port": 1023}], None, ("dsctl_services[0].port", "1024")),
    ("multi-host API port 443", [{**DEEPSEEK, "port": 443}], None, ("port", "allow_privileged_port")),
    ("multi-host rpc port 1000", [{**DEEPSEEK, "data_parallel_rpc_port": 1000}], None,
     ("data_parallel_rpc_port", "allow_privileged_port")),
    ("rpc port = API port", [{**DEEPSEEK, "port": 9000, "data_parallel_rpc_port": 9000}], None,
     ("data_parallel_rpc_port", "API port")),
    ("rpc port = the default API port", [{**DEEPSEEK, "data_parallel_rpc_port": 8000}], None,
     ("data_parallel_rpc_port", "8000")),
    ("service on sshd's port", [{**CHAT, "port": SSH}], None, ("dsctl_services[0].port", "sshd", "ansible_port")),
    ("rpc port on sshd's port", [{**DEEPSEEK, "data_parallel_rpc_port": SSH}], None,
     ("dsctl_services[0].data_parallel_rpc_port", "sshd")),
    ("MindIE's extra ports over another service", [{**CHAT, "instances": 1},
     {"name": "mi", "engine": "mindie", "model": "/models/qwen", "npus_per_instance": 4, "port": 7999,
      "allow_unauthenticated": True}], None, ("dsctl_services[1].port", "chat-0")),
    ("gateway on a fleet host, an instance's port", [CHAT], {"services": [{"service": "chat", "port": 8001}]},
     ("dsctl_gateway.services[0].port", "instance chat-1")),
    ("gateway on a fleet host, sshd's port", [CHAT], {"services": [{"service": "chat", "port": SSH}]},
     ("dsctl_gateway.services[0].port", "sshd")),
]


@pytest.mark.parametrize(("services", "gateway", "words"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_a_port_that_cannot_work_is_refused_before_any_host(capsys, tmp_path, sentinel, services, gateway, words):
    inventory = site(tmp_path, sentinel, {"dsctl_services": _with_ssh(services, sentinel.port)})
    if gateway is not None:
        gateway_on_fleet_host(inventory, {"dsctl_gateway": _with_ssh(gateway, sentinel.port)})
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"])
    assert_names(line, *words)


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "127.0.0.1:0", "https://127.0.0.1:0/v1",
                                 "http://127.0.0.1:65536", "http://127.0.0.1:-1", "http://127.0.0.1:80a"])
def test_a_probe_url_without_a_valid_port_is_refused(capsys, sentinel, url):
    line = refusal(capsys, sentinel, ["probe", url, "--requests", "1"], exits=(2,))
    assert_names(line, "URL", url)


def test_valid_ports_still_pass(capsys, tmp_path, sentinel):
    # 1024 is the first unprivileged port; a port below it is the inventory's explicit decision.
    services = [{**CHAT, "instances": 1, "port": 1024},
                {**CHAT, "name": "web", "instances": 1, "port": 443, "allow_privileged_port": True}]
    inventory = site(tmp_path, sentinel, {"dsctl_services": services})
    gateway_on_fleet_host(inventory, {"dsctl_gateway": {"services": [{"service": "chat", "port": 8080}]}})
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0


def test_sshd_defaults_to_port_22():
    # Without ansible_port sshd is on 22: a service given 22 explicitly still loses to it.
    [spec] = validate_services("h", [{**CHAT, "instances": 1, "port": 22, "allow_privileged_port": True}],
                               npu_count=8, vllm_ascend="v0.13.0")
    with pytest.raises(PortClash, match=r"dsctl_services\[0\].port: port 22 of instance chat-0 is also used by sshd"):
        host_table("h", services=[spec], npu_count=8, fields={"chat": "dsctl_services[0]"})
