"""Battery, class 2 (issue 41): a trailing newline, a control character or a surrounding blank in any string
setting is refused by the schema's one string type (dsctl.core.text.Text), naming the field, before any host."""

from __future__ import annotations

import pytest
import yaml

from dsctl.core.text import NotOneLine, one_line

from .battery import assert_names, refusal, site

CHAT = {"name": "chat", "engine": "lab-engine", "model": "/models/m", "npus_per_instance": 1, "bind": "127.0.0.1"}
GATEWAY = {"services": [{"service": "chat", "port": 8080}]}

# (id, group_vars, gateway group vars, the words the line must name)
CASES = [
    ("run user root\\n", {"dsctl_run_user": "root\n"}, None, ["dsctl_run_user", "'root\\n'", "line break"]),
    ("staging dir /usr\\n", {"dsctl_staging_dir": "/usr\n"}, None, ["dsctl_staging_dir", "line break"]),
    ("run group HwHiAiUser\\n", {"dsctl_run_group": "HwHiAiUser\n"}, None, ["dsctl_run_group", "line break"]),
    ("NPU env name MY_VAR\\n", {"dsctl_ascend_env": {"MY_VAR\n": "1"}}, None, ["dsctl_ascend_env['MY_VAR\\n']"]),
    ("service env name MY_VAR\\n", {"dsctl_services": [{**CHAT, "env": {"MY_VAR\n": "1"}}]}, None,
     ["dsctl_services[0].env['MY_VAR\\n']"]),
    ("gateway pid_file /etc/passwd\\n", None, {"dsctl_gateway": {**GATEWAY, "pid_file": "/etc/passwd\n"}},
     ["dsctl_gateway.pid_file", "line break"]),
    # more of the class: other fields, other control characters, blanks around a value
    ("service group HwHiAiUser\\n", {"dsctl_services": [{**CHAT, "group": "HwHiAiUser\n"}]}, None,
     ["dsctl_services[0].group", "line break"]),
    ("service user CR", {"dsctl_services": [{**CHAT, "user": "dsctl-serve\r"}]}, None,
     ["dsctl_services[0].user", "carriage return"]),
    ("version with a trailing blank", {"dsctl_min_kernel_version": "5.10 "}, None,
     ["dsctl_min_kernel_version", "blanks around it"]),
    ("serving venv with a tab", {"dsctl_serving_venv": "/opt/dsctl/venv\t"}, None, ["dsctl_serving_venv", "tab"]),
    ("model path with NUL", {"dsctl_services": [{**CHAT, "model": "/models/m\x00"}]}, None,
     ["dsctl_services[0].model", "NUL"]),
    ("multi-host socket_ifname\\n", {"dsctl_services": [{"name": "big", "engine": "vllm-ascend", "model": "/models/m",
                                                          "nodes": 2, "npus_per_node": 8,
                                                          "socket_ifname": "eth0\n"}]}, None,
     ["socket_ifname", "line break"]),
    ("gateway worker_user with ESC", None, {"dsctl_gateway": {**GATEWAY, "worker_user": "dsctl-gateway\x1b"}},
     ["dsctl_gateway.worker_user", "control character"]),
]


def test_safe_dump_keeps_the_newline():
    # The harness writes group_vars with yaml.safe_dump: the value the inventory reader gets holds the line break.
    assert yaml.safe_load(yaml.safe_dump({"dsctl_run_user": "root\n"})) == {"dsctl_run_user": "root\n"}


@pytest.mark.parametrize(("case", "group_vars", "gateway", "words"), CASES, ids=[case[0] for case in CASES])
def test_a_string_that_is_not_one_line_is_refused_before_any_host(capsys, tmp_path, sentinel, case, group_vars,
                                                                  gateway, words):
    inventory = site(tmp_path, sentinel, group_vars, gateway=gateway)
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"], exits=(2,))
    assert_names(line, *words)


@pytest.mark.parametrize("value", ["root\n", "a\rb", "\tx", "x\x7f", "x\x85", "x\u2028y", " x", "x ", "x\x00"])
def test_the_type_rule_refuses_control_characters_and_surrounding_blanks(value):
    with pytest.raises(NotOneLine, match="expected one line"):
        one_line(value)


@pytest.mark.parametrize("value", ["HwHiAiUser", "/opt/dsctl/serving-venv", "shutdown -r now", "5.10", "é"])
def test_the_type_rule_keeps_one_line_values(value):
    assert one_line(value) == value
