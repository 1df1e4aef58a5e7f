"""The one rule for a path a role writes, deletes or chmods as root (dsctl.core.fleet.root_paths), and the
inventory and gateway settings it guards."""

from __future__ import annotations

import pytest

from dsctl.core.fleet.inventory_schema import InventoryError, validate_host_vars
from dsctl.core.fleet.root_paths import RootPathRefused, check_dir, check_env_file
from dsctl.core.serving.gateway import GatewayError, validate_gateway

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
