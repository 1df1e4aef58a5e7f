"""Issue 41, class 1 and class 6's paths: a path a role removes, replaces, chmods or writes as root, refused by where
it leads (dsctl.core.fleet.root_paths), before any host is contacted, by `deploy --render` and `provision --check`.

Each case is one line naming the field (and, for two settings that nest, both), exit 2 (a malformed value) or 3
(two settings that cannot work together); the sentinel counts any connection to the hosts.
"""

from __future__ import annotations

import pytest

from dsctl.app import main

from .battery import assert_names, refusal, site

VERBS = [("deploy", "--render"), ("provision", "--check")]

# Class 1 as the issue lists it: one setting aimed into a system tree (a /proc/<pid>/root detour included).
INTO_A_SYSTEM_TREE = [
    ("dsctl_serving_venv", "/boot/efi"),
    ("dsctl_serving_venv", "/home/alice"),
    ("dsctl_serving_venv", "/proc/self"),
    ("dsctl_serving_venv", "/proc/1/root/opt"),
    ("dsctl_staging_dir", "/usr/lib/x86_64-linux-gnu"),
    ("dsctl_staging_dir", "/lib/modules"),
    ("dsctl_staging_dir", "/home/alice"),
    ("dsctl_staging_dir", "/proc/self/root/usr"),
    ("dsctl_staging_dir", "/usr/bin/X11"),
    ("dsctl_staging_dir", "/dev/shm"),
    ("dsctl_service_config_dir", "/var/lib/docker"),
    ("dsctl_service_config_dir", "/etc/nginx"),
    ("dsctl_service_config_dir", "/proc/self/root/etc"),
    ("dsctl_service_log_dir", "/dev/shm"),
    ("dsctl_install_path", "/proc/self/root/usr/local"),
    # More of the class: root's home, the kernel's files, another service's state, a file in a system tree.
    ("dsctl_serving_venv", "/root/venv"),
    ("dsctl_staging_dir", "/sys/kernel"),
    ("dsctl_env_file", "/proc/self/root/etc/dsctl/env.sh"),
]

# Settings each fine alone, aimed at each other: (the settings, the two fields the line names).
AIMED_AT_EACH_OTHER = [
    ({"dsctl_staging_dir": "/usr/local/Ascend"}, ("dsctl_staging_dir", "dsctl_install_path")),
    ({"dsctl_staging_dir": "/opt/dsctl/serving-venv"}, ("dsctl_staging_dir", "dsctl_serving_venv")),
    ({"dsctl_env_file": "/opt/dsctl/serving-venv/dsctl-env.sh"}, ("dsctl_env_file", "dsctl_serving_venv")),
    ({"dsctl_env_file": "/var/cache/dsctl/packages/dsctl-env.sh"}, ("dsctl_env_file", "dsctl_staging_dir")),
    ({"dsctl_service_log_dir": "/etc/dsctl/services"}, ("dsctl_service_log_dir", "dsctl_service_config_dir")),
    ({"dsctl_staging_dir": "/opt/dsctl/serving-venv-stacks"}, ("dsctl_staging_dir", "dsctl_serving_venv")),
]

CONTAINER_SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/m", "npus_per_instance": 4,
                     "manager": "container", "image": "quay.io/ascend/vllm-ascend:v0.13.0",
                     "allow_unauthenticated": True}


def _cases(cases: list, provision_too: set[int]) -> list:
    """Every case through deploy --render; those at ``provision_too`` through provision --check as well.  Both verbs
    judge the inventory with the same validate_fleet before their first play: a few cases show provision does,
    without paying an inventory read per case twice (the suite's time, issue 41)."""
    return [(*case, verb) for index, case in enumerate(cases) for verb in VERBS
            if verb[0] == "deploy" or index in provision_too]


@pytest.mark.parametrize(("field", "path", "verb"), _cases(INTO_A_SYSTEM_TREE, {0, 7, 9, 14}))
def test_a_path_into_a_system_tree_is_refused_naming_the_setting(capsys, tmp_path, sentinel, verb, field, path):
    inventory = site(tmp_path, sentinel, {field: path})
    line = refusal(capsys, sentinel, [verb[0], inventory, verb[1]], exits=(2,))
    assert_names(line, f"{field}: {path!r}", "Fix: ")


@pytest.mark.parametrize(("settings", "fields", "verb"), _cases(AIMED_AT_EACH_OTHER, {0, 4}))
def test_settings_that_nest_are_refused_naming_both(capsys, tmp_path, sentinel, verb, settings, fields):
    inventory = site(tmp_path, sentinel, settings)
    line = refusal(capsys, sentinel, [verb[0], inventory, verb[1]], exits=(3,))
    assert_names(line, f"{fields[0]}: ", fields[1], "fix: ")


@pytest.mark.parametrize("cache", ["/", "/etc", "/var/run/docker.sock", "/home/alice/.cache"])
def test_a_container_cache_of_the_host_s_own_is_refused(capsys, tmp_path, sentinel, cache):
    inventory = site(tmp_path, sentinel, {"dsctl_services": [{**CONTAINER_SERVICE, "container_cache": cache}]})
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"], exits=(2,))
    assert_names(line, "dsctl_services[0].container_cache", "read-write", "Fix: ")


# Class 6's paths: the gateway's config directory and the pid file nginx's master writes as root.  Only deploy
# runs the gateway (provision's plays never touch it), so deploy is the verb that must refuse it.
@pytest.mark.parametrize(("field", "path"), [
    ("config_dir", "/etc/nginx"),
    ("config_dir", "/proc/self/root/etc/dsctl"),
    ("pid_file", "/etc/passwd"),
    ("pid_file", "/run/sshd.pid"),
    ("pid_file", "/"),
    ("pid_file", "/var/run/nginx.pid"),
])
def test_a_gateway_path_the_system_owns_is_refused(capsys, tmp_path, sentinel, field, path):
    gateway = {"dsctl_gateway": {"services": [{"service": "chat", "port": 8080}], field: path}}
    inventory = site(tmp_path, sentinel, gateway=gateway)
    line = refusal(capsys, sentinel, ["deploy", inventory, "--render"], exits=(2,))
    assert_names(line, f"dsctl_gateway.{field}: ", "Fix: ")


@pytest.mark.parametrize("settings", [
    {},  # the sample's own values
    {"dsctl_serving_venv": "/opt/site/venv", "dsctl_install_path": "/usr/local/Ascend"},
    {"dsctl_staging_dir": "/var/cache/dsctl-site/stage", "dsctl_service_log_dir": "/var/log/dsctl-site",
     "dsctl_env_file": "/etc/dsctl/ascend-env.sh", "dsctl_service_config_dir": "/srv/dsctl/services"},
    {"dsctl_services": [{**CONTAINER_SERVICE, "container_cache": "/var/cache/dsctl/chat"}]},
])
def test_paths_of_dsctl_s_own_still_render(capsys, tmp_path, sentinel, settings):
    inventory = site(tmp_path, sentinel, settings,
                     gateway={"dsctl_gateway": {"services": [{"service": "chat", "port": 8080}],
                                                "config_dir": "/etc/dsctl/gw", "pid_file": "/run/dsctl-gw.pid"}})
    status = main(["deploy", str(inventory), "--render"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
