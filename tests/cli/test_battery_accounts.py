"""Battery, class 3 (issue 41): the run user and group and each service's user and group are dsctl's own or
listed in dsctl_allowed_accounts; privileged groups and shared system accounts are refused always (even listed),
naming the field, before any host (dsctl.core.serving.service.account_problem, refused_account)."""

from __future__ import annotations

import pytest

from dsctl.app import main

from .battery import assert_names, refusal, site

CHAT = {"name": "chat", "engine": "lab-engine", "model": "/models/m", "npus_per_instance": 1, "bind": "127.0.0.1"}


def service(**fields):
    return {"dsctl_services": [{**CHAT, **fields}]}


# (id, group_vars, the words the line must name)
CASES = [
    ("run group root", {"dsctl_run_group": "root"}, ["dsctl_run_group", "privileged group"]),
    ("run group sudo", {"dsctl_run_group": "sudo"}, ["dsctl_run_group", "privileged group"]),
    ("run group docker", {"dsctl_run_group": "docker"}, ["dsctl_run_group", "privileged group"]),
    ("run group wheel", {"dsctl_run_group": "wheel"}, ["dsctl_run_group", "privileged group"]),
    ("service group kmem", service(group="kmem"), ["dsctl_services[0].group", "privileged group"]),
    ("service group lxd", service(group="lxd"), ["dsctl_services[0].group", "privileged group"]),
    ("run user nobody", {"dsctl_run_user": "nobody"}, ["dsctl_run_user", "shared system account"]),
    ("run user daemon", {"dsctl_run_user": "daemon"}, ["dsctl_run_user", "shared system account"]),
    # more of the class
    ("service user www-data", service(user="www-data"), ["dsctl_services[0].user", "shared system account"]),
    ("service group systemd-journal", service(group="systemd-journal"), ["dsctl_services[0].group", "privileged"]),
    ("run user a person's account", {"dsctl_run_user": "alice"}, ["dsctl_run_user", "dsctl_allowed_accounts"]),
    ("service user not dsctl's", service(user="svc", manager="supervisor"),
     ["dsctl_services[0].user", "dsctl_allowed_accounts"]),
    ("docker allow-listed", {"dsctl_run_group": "docker", "dsctl_allowed_accounts": ["docker"]},
     ["docker", "privileged group"]),
    ("nobody allow-listed", {"dsctl_allowed_accounts": ["nobody"]}, ["dsctl_allowed_accounts", "nobody"]),
]


@pytest.mark.parametrize(("case", "group_vars", "words"), CASES, ids=[case[0] for case in CASES])
def test_an_account_that_is_not_dsctls_own_is_refused_before_any_host(capsys, tmp_path, sentinel, case, group_vars,
                                                                      words):
    inventory = site(tmp_path, sentinel, group_vars)
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"], exits=(2,))
    assert_names(line, *words)


def test_the_provision_check_refuses_too(capsys, tmp_path, sentinel):
    inventory = site(tmp_path, sentinel, {"dsctl_run_group": "docker"})
    assert_names(refusal(capsys, sentinel, ["provision", inventory, "--check"], exits=(2,)), "dsctl_run_group")


@pytest.mark.parametrize("group_vars", [
    {"dsctl_run_user": "npuadmin", "dsctl_run_group": "npuadmin", "dsctl_allowed_accounts": ["npuadmin"]},
    service(user="dsctl-chat"),
    service(user="svc", manager="supervisor") | {"dsctl_allowed_accounts": ["svc"]},
], ids=["allow-listed run account", "a dsctl-* service user", "allow-listed service user"])
def test_dsctls_own_and_allow_listed_accounts_render(capsys, tmp_path, sentinel, group_vars):
    inventory = site(tmp_path, sentinel, group_vars)
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0
