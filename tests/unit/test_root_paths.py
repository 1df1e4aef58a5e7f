"""The one rule for a path a role writes, deletes or chmods as root (dsctl.core.fleet.root_paths), and the
inventory and gateway settings it guards."""

from __future__ import annotations

import re

import pytest

from dsctl.core.fleet.root_paths import (
    CLASHES,
    DRIVER_ROOT,
    RootPathRefused,
    check_dir,
    check_env_file,
    check_file,
    host_path_problem,
    path_clashes,
)
from dsctl.core.inventory.schema import HostSettings, InventoryError, validate_host_vars
from dsctl.core.serving.gateway import GatewayError, validate_gateway
from dsctl.core.serving.service import ServiceError, validate_service

SITE = {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/ascend-packages"}
EXAMPLE = "/opt/dsctl/serving-venv"


@pytest.mark.parametrize("path", ["/opt/dsctl/serving-venv", "/opt/dsctl/mirror-venv", "/usr/local/Ascend",
                                  "/var/cache/dsctl/packages", "/etc/dsctl/services", "/var/log/dsctl",
                                  "/srv/dsctl-2.0/services_a+b", "/data/venv", "/opt/x.y"])
def test_a_directory_of_its_own_passes(path):
    assert check_dir(path, action="replace it", example=EXAMPLE) == path


@pytest.mark.parametrize("path, says", [
    ("/", "'/' is the root directory"),
    ("/usr", "'/usr' is a system directory"),
    ("/etc", "'/etc' is a system directory"),
    ("/var", "'/var' is a system directory"),
    ("/home", "'/home' is a system directory"),
    ("/opt", "'/opt' is a system directory"),
    ("/tmp", "'/tmp' is a system directory"),
    ("/usr/local", "'/usr/local' is a system directory"),
    ("/var/log", "'/var/log' is a system directory"),
    ("/etc/shadow", "'/etc/shadow' is a file the system owns"),
    ("/opt/dsctl/serving-venv/", "is not a normalised path"),
    ("/opt//dsctl", "is not a normalised path"),
    ("/opt/./dsctl", "is not a normalised path"),
    ("/opt/dsctl/..", "is not a normalised path"),
    ("//", "is not a normalised path"),
    ("/usr/", "is not a normalised path"),
    ("opt/dsctl", "is not an absolute path"),
])
def test_a_directory_dsctl_would_damage_is_refused_in_one_line(path, says):
    with pytest.raises(RootPathRefused) as refused:
        check_dir(path, action="replace it", example=EXAMPLE)
    text = str(refused.value)
    assert says in text and "dsctl would replace it. Fix: " in text and "\n" not in text


def test_a_path_that_is_not_normalised_is_told_its_normal_form():
    with pytest.raises(RootPathRefused, match=r"Fix: write it as /opt/dsctl$"):
        check_dir("/opt//dsctl/", action="replace it", example=EXAMPLE)


@pytest.mark.parametrize("path", ["/etc/profile.d/dsctl-ascend.sh", "/etc/profile.d/dsctl.sh",
                                  "/etc/dsctl/ascend-env.sh", "/opt/dsctl/env.sh", "/opt/dsctl-site/env"])
def test_an_env_file_of_dsctl_s_own_passes(path):
    assert check_env_file(path, action="overwrite it", example="/etc/profile.d/dsctl-ascend.sh") == path


@pytest.mark.parametrize("path, says", [
    ("/etc/shadow", "is a file the system owns"),
    ("/etc/passwd", "is a file the system owns"),
    ("/etc/sudoers", "is a file the system owns"),
    ("/etc/hosts", "is a file the system owns"),
    ("/etc/profile", "is a file the system owns"),
    ("/etc/profile.d", "is a system directory"),
    ("/etc/profile.d/bash_completion.sh", "is not in a directory of dsctl's own"),
    ("/etc/profile.d/dsctl-ascend", "is not in a directory of dsctl's own"),  # profile.d only sources *.sh
    ("/etc/cron.d/job", "is not in a directory of dsctl's own"),
    ("/root/.bashrc", "is not in a directory of dsctl's own"),
    ("/etc/profile.d/dsctl-ascend.sh/", "is not a normalised path"),
    ("/", "is the root directory"),
])
def test_an_env_file_the_system_owns_is_refused(path, says):
    with pytest.raises(RootPathRefused, match=says):
        check_env_file(path, action="overwrite it", example="/etc/profile.d/dsctl-ascend.sh")


@pytest.mark.parametrize("field, value, expected", [
    ("dsctl_serving_venv", "/usr", "dsctl_serving_venv: '/usr' is a system directory; dsctl would replace it. "
                                   "Fix: a directory of its own such as /opt/dsctl/serving-venv"),
    ("dsctl_serving_venv", "/", "dsctl_serving_venv: '/' is the root directory; dsctl would replace it. "
                                "Fix: a path of its own such as /opt/dsctl/serving-venv"),
    ("dsctl_serving_venv", "/opt/dsctl/serving-venv/", "dsctl_serving_venv: '/opt/dsctl/serving-venv/' is not a "
                                                       "normalised path (a trailing '/', '//', '.' or '..'); dsctl "
                                                       "would replace it. Fix: write it as /opt/dsctl/serving-venv"),
    ("dsctl_staging_dir", "/", "dsctl_staging_dir: '/' is the root directory; dsctl would make it root's alone "
                               "(mode 0700). Fix: a path of its own such as /var/cache/dsctl/packages"),
    ("dsctl_env_file", "/etc/shadow", "dsctl_env_file: '/etc/shadow' is a file the system owns; dsctl would "
                                      "overwrite it. Fix: a file of its own such as /etc/profile.d/dsctl-ascend.sh"),
    ("dsctl_install_path", "/usr", "dsctl_install_path: '/usr' is a system directory"),
    ("dsctl_service_config_dir", "/etc", "dsctl_service_config_dir: '/etc' is a system directory"),
    ("dsctl_service_log_dir", "/var/log", "dsctl_service_log_dir: '/var/log' is a system directory"),
])
def test_every_path_setting_a_role_writes_as_root_takes_the_rule(field, value, expected):
    with pytest.raises(InventoryError) as refused:
        validate_host_vars("lab-01", {**SITE, field: value})
    assert str(refused.value).startswith(f"inventory: host lab-01: {expected}")
    assert refused.value.exit_status == 2


def test_the_defaults_and_the_sample_values_pass():
    settings = validate_host_vars("lab-01", {**SITE, "dsctl_serving_venv": "/opt/dsctl/mirror-venv",
                                             "dsctl_service_config_dir": "/srv/dsctl-2.0/services_a+b"})
    assert settings.dsctl_serving_venv == "/opt/dsctl/mirror-venv"
    assert settings.dsctl_env_file == "/etc/profile.d/dsctl-ascend.sh"


@pytest.mark.parametrize("field", ["config_dir", "state_dir", "log_dir"])
def test_the_gateway_s_directories_take_the_rule(field):
    with pytest.raises(GatewayError, match=rf"dsctl_gateway\.{field}: '/etc' is a system directory; dsctl would "):
        validate_gateway("gw", {"services": [{"service": "chat", "port": 8000}], field: "/etc"})


# --------------------------------------------------------------------------- by where a path leads (issue 41)


@pytest.mark.parametrize("path, tree", [
    ("/proc/self/root/usr", "/proc"), ("/proc/1/root/opt", "/proc"), ("/proc/self", "/proc"),
    ("/sys/kernel", "/sys"), ("/dev/shm", "/dev"), ("/boot/efi", "/boot"), ("/run/user/0", "/run"),
    ("/etc/nginx", "/etc"), ("/etc/dsctlx", "/etc"), ("/var/lib/docker", "/var"), ("/var/run/docker.sock", "/var"),
    ("/usr/lib/x86_64-linux-gnu", "/usr"), ("/usr/bin/X11", "/usr"), ("/usr/local/Ascendx", "/usr"),
    ("/lib/modules", "/lib"), ("/home/alice", "/home"), ("/root/venv", "/root"), ("/snap/core", "/snap"),
])
def test_a_path_inside_a_system_tree_is_refused_whatever_its_name(path, tree):
    with pytest.raises(RootPathRefused) as refused:
        check_dir(path, action="replace it", example=EXAMPLE)
    assert str(refused.value).startswith(f"{path!r} is inside {tree} (")
    assert "Fix: a directory of its own such as /opt/dsctl/serving-venv" in str(refused.value)


@pytest.mark.parametrize("path", [
    "/usr/local/Ascend", "/usr/local/Ascend/cann-9", "/etc/dsctl", "/etc/dsctl-site/services", "/run/dsctl",
    "/var/lib/dsctl-gateway", "/var/cache/dsctl/packages", "/var/log/dsctl", "/var/log/dsctl-site",
    "/opt/site/venv", "/srv/models", "/mnt/nvme/dsctl", "/tmp/dsctl-test", "/var/tmp/stage", "/data/venv",
])
def test_dsctl_s_own_subtrees_and_a_site_s_directories_pass(path):
    assert check_dir(path, action="replace it", example=EXAMPLE) == path


@pytest.mark.parametrize("path", ["/opt", "/srv", "/mnt", "/media", "/tmp", "/var/tmp", "/proc", "/run"])
def test_a_shared_or_system_directory_itself_is_refused(path):
    with pytest.raises(RootPathRefused, match=rf"^'{path}' is a system directory; "):
        check_dir(path, action="replace it", example=EXAMPLE)


@pytest.mark.parametrize("path, says", [
    ("/etc/passwd", "'/etc/passwd' is a file the system owns"),
    ("/run/sshd.pid", "'/run/sshd.pid' is not in a directory of dsctl's own"),
    ("/", "'/' is the root directory"),
    ("/nginx.pid", "'/nginx.pid' is in the root directory"),
    ("/var/run/nginx.pid", "'/var/run/nginx.pid' is in '/var/run', which is a system directory"),
    ("/etc/nginx/nginx.pid", "'/etc/nginx/nginx.pid' is in '/etc/nginx', which is inside /etc"),
    ("/proc/self/root/run/dsctl-gw.pid", "which is inside /proc"),
])
def test_a_pid_file_the_system_owns_is_refused(path, says):
    with pytest.raises(RootPathRefused, match=re.escape(says)):
        check_file(path, action="write a pid", example="/run/dsctl-gateway.pid", drop_in="/run", dsctl_named=False)


@pytest.mark.parametrize("path", ["/run/dsctl-gateway.pid", "/run/dsctl/gw.pid", "/var/lib/dsctl-gateway/nginx.pid",
                                  "/opt/site/nginx.pid"])
def test_a_pid_file_of_dsctl_s_own_passes(path):
    assert check_file(path, action="write a pid", example="/run/dsctl-gateway.pid", drop_in="/run",
                      dsctl_named=False) == path


@pytest.mark.parametrize("path", ["/proc/self/root/etc/dsctl/env.sh", "/root/dsctl/env.sh", "/usr/dsctl/env.sh"])
def test_an_env_file_in_a_dsctl_directory_inside_a_system_tree_is_refused(path):
    with pytest.raises(RootPathRefused, match=r"which is inside /"):
        check_env_file(path, action="overwrite it", example="/etc/profile.d/dsctl-ascend.sh")


def test_the_path_the_host_resolves_is_judged_by_the_same_rule():
    assert host_path_problem("dsctl_staging_dir", "/var/cache/dsctl/packages", "/var/cache/dsctl/packages") == ""
    problem = host_path_problem("dsctl_staging_dir", "/opt/x/stage", "/usr/stage")
    assert problem.startswith("dsctl_staging_dir: /opt/x/stage resolves on the host to /usr/stage, and '/usr/stage' is "
                              "inside /usr")
    assert "(nothing was changed). Fix: " in problem and "\n" not in problem
    assert host_path_problem("dsctl_serving_venv", "/proc/self/root/usr", "/usr").startswith(
        "dsctl_serving_venv: '/proc/self/root/usr' is inside /proc")  # the path as given is refused first
    assert "inside /proc" in host_path_problem("dsctl_env_file", "/etc/dsctl/e.sh", "/proc/1/root/etc/dsctl/e.sh",
                                               kind="env_file")
    assert "file the system owns" in host_path_problem("dsctl_gateway.pid_file", "/run/dsctl-gw.pid", "/etc/passwd",
                                                       kind="run_file")


# --------------------------------------------------------------------------- which settings may not nest


DEFAULTS = {field: HostSettings.model_fields[field].default for field in
            ("dsctl_install_path", "dsctl_serving_venv", "dsctl_staging_dir", "dsctl_env_file",
             "dsctl_service_config_dir", "dsctl_service_log_dir")}

# One case per row of CLASHES that a valid single value can reach.
NESTED = [
    ({"dsctl_staging_dir": "/usr/local/Ascend"}, "dsctl_staging_dir: '/usr/local/Ascend' is the same directory as "
                                                 "dsctl_install_path (/usr/local/Ascend)"),
    ({"dsctl_install_path": "/opt/cann", "dsctl_staging_dir": "/usr/local/Ascend"},
     "dsctl_staging_dir: '/usr/local/Ascend' is the same directory as the driver's root (/usr/local/Ascend)"),
    ({"dsctl_install_path": "/opt/dsctl/stage/cann", "dsctl_staging_dir": "/opt/dsctl/stage"},
     "dsctl_staging_dir: '/opt/dsctl/stage' contains dsctl_install_path (/opt/dsctl/stage/cann)"),
    ({"dsctl_staging_dir": "/opt/dsctl/serving-venv"}, "dsctl_staging_dir: '/opt/dsctl/serving-venv' is the same "
                                                       "directory as dsctl_serving_venv (/opt/dsctl/serving-venv)"),
    ({"dsctl_staging_dir": "/opt/dsctl/serving-venv-stacks/wheels"},
     "dsctl_staging_dir: '/opt/dsctl/serving-venv-stacks/wheels' is inside dsctl_serving_venv's stacks"),
    ({"dsctl_staging_dir": "/opt/dsctl"}, "dsctl_staging_dir: '/opt/dsctl' contains dsctl_serving_venv"),
    ({"dsctl_staging_dir": "/etc/dsctl"}, "dsctl_staging_dir: '/etc/dsctl' contains dsctl_service_config_dir"),
    ({"dsctl_staging_dir": "/var/log/dsctl"}, "dsctl_staging_dir: '/var/log/dsctl' is the same directory as "
                                              "dsctl_service_log_dir"),
    ({"dsctl_serving_venv": "/usr/local/Ascend"}, "dsctl_serving_venv: '/usr/local/Ascend' is the same directory "
                                                  "as dsctl_install_path"),
    ({"dsctl_install_path": "/opt/cann", "dsctl_serving_venv": "/usr/local/Ascend"},
     "dsctl_serving_venv: '/usr/local/Ascend' is the same directory as the driver's root"),
    ({"dsctl_service_config_dir": "/opt/dsctl/serving-venv/services"},
     "dsctl_service_config_dir: '/opt/dsctl/serving-venv/services' is inside dsctl_serving_venv"),
    ({"dsctl_service_log_dir": "/opt/dsctl/serving-venv-stacks/logs"},
     "dsctl_service_log_dir: '/opt/dsctl/serving-venv-stacks/logs' is inside dsctl_serving_venv's stacks"),
    ({"dsctl_service_log_dir": "/etc/dsctl/services"}, "dsctl_service_log_dir: '/etc/dsctl/services' is the same "
                                                       "directory as dsctl_service_config_dir"),
    ({"dsctl_service_log_dir": "/etc/dsctl/services/logs"}, "is inside dsctl_service_config_dir"),
    ({"dsctl_env_file": "/opt/dsctl/serving-venv/dsctl.sh"}, "dsctl_env_file: '/opt/dsctl/serving-venv/dsctl.sh' is "
                                                             "inside dsctl_serving_venv"),
    ({"dsctl_env_file": "/var/cache/dsctl/packages/env.sh"}, "is inside dsctl_staging_dir"),
    ({"dsctl_env_file": "/etc/dsctl/services/env.sh"}, "dsctl_env_file: '/etc/dsctl/services/env.sh' is inside "
                                                       "dsctl_service_config_dir"),
]


@pytest.mark.parametrize("settings, says", NESTED)
def test_each_row_of_the_table_is_refused_naming_both_settings(settings, says):
    problems = path_clashes({**DEFAULTS, **settings})
    assert problems, settings
    assert problems[0].startswith(says) if says.startswith("dsctl_") else says in problems[0], problems[0]
    assert "; fix: give " in problems[0] and "\n" not in problems[0]


def test_every_row_of_the_table_is_reached_and_names_real_settings():
    reached = set()
    for settings, _ in NESTED:
        paths = {**DEFAULTS, **settings}
        reached |= {clash for clash in CLASHES if path_clashes(paths, [clash])}
    assert reached == set(CLASHES)
    for clash in CLASHES:
        for field in (clash.field, clash.other):
            assert field in HostSettings.model_fields or field == DRIVER_ROOT, field


@pytest.mark.parametrize("settings", [
    {},
    {"dsctl_staging_dir": "/usr/local/Ascend/staging"},  # inside the install path: nothing there locks it
    {"dsctl_serving_venv": "/opt/dsctl/serving-venv-2"},  # a sibling, not the stacks directory
    {"dsctl_service_config_dir": "/var/log/dsctl/services"},  # the config dir inside the log dir is harmless
    {"dsctl_env_file": "/etc/dsctl/ascend-env.sh"},
])
def test_settings_apart_pass(settings):
    assert path_clashes({**DEFAULTS, **settings}) == []


def test_a_clash_is_a_validation_failure_of_the_host():
    with pytest.raises(InventoryError) as refused:
        validate_host_vars("lab-01", {**SITE, "dsctl_staging_dir": "/opt/dsctl/serving-venv"})
    assert str(refused.value).startswith("inventory: host lab-01: dsctl_staging_dir: '/opt/dsctl/serving-venv' is "
                                         "the same directory as dsctl_serving_venv")
    assert refused.value.exit_status == 3


@pytest.mark.parametrize("cache", ["/", "/etc", "/var/run/docker.sock", "/proc/self/root", "/home/alice"])
def test_a_container_cache_takes_the_rule(cache):
    service = {"name": "chat", "engine": "vllm-ascend", "model": "/models/m", "npus_per_instance": 4,
               "manager": "container", "image": "vllm-ascend:v0.13.0", "bind": "127.0.0.1", "container_cache": cache}
    with pytest.raises(ServiceError, match=r"dsctl_services\[0\]\.container_cache: .* dsctl would mount it "
                                           r"read-write into the container\. Fix: "):
        validate_service("lab-01", 0, service, npu_count=8, vllm_ascend="v0.13.0")
