"""The dsctl_* host variables and the fleet check (dsctl.core.inventory.schema)."""

from __future__ import annotations

import re

import pytest

from dsctl.core.inventory.schema import HostSettings, InventoryError, validate_fleet, validate_host_vars
from dsctl.errors import DsctlError, ExitStatus

SITE = {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/ascend-packages",
        "ansible_host": "192.0.2.11", "ansible_user": "root", "some_other_tool_setting": 1}


def problem(hostvars: dict, host: str = "lab-01") -> InventoryError:
    with pytest.raises(InventoryError) as raised:
        validate_host_vars(host, hostvars)
    assert "\n" not in str(raised.value)
    return raised.value


def test_defaults_and_ignored_keys():
    settings = validate_host_vars("lab-01", SITE)
    assert settings.dsctl_npu_count == 8
    assert settings.dsctl_reboot_command == "shutdown -r now"
    assert settings.dsctl_allow_reboot is True
    assert settings.dsctl_reboot_timeout == 900
    assert settings.dsctl_force_unhealthy is False
    assert settings.dsctl_install_path == "/usr/local/Ascend"
    assert (settings.dsctl_run_user, settings.dsctl_run_group) == ("HwHiAiUser", "HwHiAiUser")
    assert (settings.dsctl_min_free_disk_gb, settings.dsctl_min_memory_gb) == (200, 64)
    assert settings.dsctl_serving_python == "/usr/bin/python3" and settings.dsctl_extra_supported_os == []
    assert settings.dsctl_serving_venv == "/opt/dsctl/serving-venv"
    assert settings.dsctl_wheelhouse == "/srv/ascend-packages/wheels"
    assert settings.dsctl_staging_dir == "/var/cache/dsctl/packages"
    assert settings.dsctl_env_file == "/etc/profile.d/dsctl-ascend.sh"
    assert settings.dsctl_pip_index_url is None
    assert settings.dsctl_cann_version is None
    assert settings.stack is None
    assert settings.environment["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"


def test_the_wheelhouse_follows_a_url_source():
    settings = validate_host_vars("a", {**SITE, "dsctl_package_source": "https://mirror.example/ascend/"})
    assert settings.dsctl_wheelhouse == "https://mirror.example/ascend/wheels"


def test_the_sample_inventory_settings_pass():
    sample = {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/ascend-packages",
              "dsctl_reboot_command": "shutdown -r now"}
    assert validate_host_vars("atlas-a01", sample).dsctl_reboot_command == "shutdown -r now"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"dsctl_npu_count": "eight"},
         "inventory: host lab-01: dsctl_npu_count: expected an integer 1..16, got 'eight'; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_npu_count": 17},
         "inventory: host lab-01: dsctl_npu_count: expected an integer 1..16, got 17; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_allow_reboot": "no"},
         "inventory: host lab-01: dsctl_allow_reboot: expected true or false (unquoted), got 'no'; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_package_source": "ascend-packages"},
         "inventory: host lab-01: dsctl_package_source: expected an absolute path of letters, digits and . _ / + - "
         "without '..' or an http(s):// URL, "
         "got 'ascend-packages'; fix it in group_vars or host_vars"),
        ({"dsctl_pip_index_url": "ftp://mirror"},
         "inventory: host lab-01: dsctl_pip_index_url: expected an http(s):// URL, got 'ftp://mirror'; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_cann_version": 8.5},
         'inventory: host lab-01: dsctl_cann_version: expected a quoted version string, got the number 8.5; '
         'quote it: dsctl_cann_version: "8.5"'),
        ({"dsctl_min_free_disk_gb": 0},
         "inventory: host lab-01: dsctl_min_free_disk_gb: expected an integer number of GB >= 1, got 0; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_reboot_timeout": 5},
         "inventory: host lab-01: dsctl_reboot_timeout: expected an integer number of seconds, 30..7200, got 5; "
         "fix it in group_vars or host_vars"),
        ({"dsctl_install_path": "usr/local/Ascend"},
         "inventory: host lab-01: dsctl_install_path: expected an absolute path of letters, digits and . _ / + - "
         "without '..', got 'usr/local/Ascend'; "
         "fix it in group_vars or host_vars"),
    ],
)
def test_a_bad_value_is_one_line_naming_host_and_variable(override, expected):
    error = problem({**SITE, **override})
    assert error.exit_status == ExitStatus.USAGE
    assert str(error) == expected


def test_a_missing_required_variable():
    message = str(problem({"dsctl_package_source": "/srv/p"}))
    assert message.startswith("inventory: host lab-01: dsctl_npu_count: required but not set")


def test_several_problems_on_one_host_are_counted():
    message = str(problem({**SITE, "dsctl_npu_count": 0, "dsctl_min_free_disk_gb": 0}))
    assert message.endswith("(1 more problem on this host)")


def test_a_misspelt_dsctl_variable_gets_a_suggestion():
    message = str(problem({**SITE, "dsctl_npu_cont": 8}))
    assert message.startswith("inventory: host lab-01: dsctl_npu_cont: unknown dsctl variable; "
                              "did you mean dsctl_npu_count?")


def test_an_unknown_dsctl_variable_without_a_close_name():
    assert "unknown dsctl variable" in str(problem({**SITE, "dsctl_frobnicate": True}))


def test_the_ascend_env_is_checked_with_the_host_named():
    message = str(problem({**SITE, "dsctl_ascend_env": {"ASCEND_CACHE_SIZE": 6 * 10**15}}))
    assert message.startswith("inventory: host lab-01: dsctl_ascend_env.ASCEND_CACHE_SIZE: expected an integer "
                              "number of bytes from 1 to 1099511627776")


def test_the_env_profile_is_applied_and_overridden_by_explicit_entries():
    settings = validate_host_vars("a", {**SITE, "dsctl_ascend_env_profile": "long-context",
                                        "dsctl_ascend_env": {"ENABLE_FUSION_ATTENTION": 0}})
    assert settings.environment["ASCEND_CACHE_SIZE"] == "6000000000"
    assert settings.environment["GE_USE_STATIC_MEMORY"] == "1"
    assert settings.environment["ENABLE_FUSION_ATTENTION"] == "0"
    assert "GE_USE_STATIC_MEMORY" not in validate_host_vars("a", SITE).environment  # default: no profile


def test_an_unknown_env_profile_is_one_line_naming_the_host():
    assert str(problem({**SITE, "dsctl_ascend_env_profile": "long_context"})) == (
        "inventory: host lab-01: dsctl_ascend_env_profile: no profile 'long_context'; did you mean long-context?")


def test_an_empty_ascend_env_key_means_no_overrides():
    assert validate_host_vars("a", {**SITE, "dsctl_ascend_env": None}).dsctl_ascend_env == {}


def test_the_stack_field_cannot_be_set_from_the_inventory():
    assert validate_host_vars("a", {**SITE, "stack": {"driver": "x"}}).stack is None


def test_every_setting_is_a_dsctl_variable():
    assert all(name.startswith("dsctl_") for name in HostSettings.setting_names())
    assert "stack" not in HostSettings.setting_names()


# --------------------------------------------------------------------------- the fleet


def test_validate_fleet_attaches_each_hosts_stack():
    fleet = validate_fleet({
        "lab-01": SITE,
        "lab-02": {**SITE, "dsctl_driver_version": "24.1.rc3", "dsctl_cann_version": "8.0.0",
                   "dsctl_vllm_ascend_version": "v0.8.4rc2"},
        "lab-03": {**SITE, "dsctl_vllm_ascend_version": "none"},
    })
    assert list(fleet) == ["lab-01", "lab-02", "lab-03"]
    assert fleet["lab-01"].stack.driver == "25.5.0"
    assert fleet["lab-01"].stack.pip_pins["torch-npu"] == "2.8.0.post2"
    assert fleet["lab-02"].stack.cann == "8.0.0" and fleet["lab-02"].stack.warnings
    assert fleet["lab-03"].stack.pip_pins == {}
    dumped = fleet["lab-01"].model_dump(mode="json")
    assert dumped["stack"]["kernels_run"] == "Ascend-cann-910b-ops_8.5.0_linux-{arch}.run"


def test_an_incompatible_stack_names_the_host_and_exits_validation_failed():
    with pytest.raises(InventoryError) as raised:
        validate_fleet({"lab-01": SITE, "lab-02": {**SITE, "dsctl_driver_version": "24.1.rc3",
                                                    "dsctl_cann_version": "8.5.0"}})
    assert raised.value.exit_status == ExitStatus.VALIDATION_FAILED
    assert str(raised.value).startswith(
        "inventory: host lab-02: dsctl_cann_version: CANN 8.5.0 refuses driver 24.1.rc3")


def test_an_unknown_version_in_the_fleet_is_a_usage_error():
    with pytest.raises(InventoryError) as raised:
        validate_fleet({"lab-01": {**SITE, "dsctl_cann_version": "7.7.7"}})
    assert raised.value.exit_status == ExitStatus.USAGE
    assert str(raised.value) == ("inventory: host lab-01: dsctl_cann_version: CANN 7.7.7 is not in the releases data "
                                 "(known: 8.0.0, 8.3.RC2, 8.5.0); pick one of them")


def test_a_problem_shared_by_several_hosts_says_how_many():
    hosts = {f"lab-0{i}": {**SITE, "dsctl_npu_count": "eight"} for i in range(1, 6)}
    hosts["lab-06"] = {**SITE, "dsctl_cann_version": "8.0.0"}
    hosts["lab-07"] = SITE
    with pytest.raises(InventoryError) as raised:
        validate_fleet(hosts)
    assert str(raised.value) == (
        "inventory: 5 hosts (lab-01, lab-02, lab-03, ...): dsctl_npu_count: expected an integer 1..16, got 'eight'; "
        "fix it in group_vars or host_vars (other problems on 1 more host)"
    )


PATH_SETTINGS = ["dsctl_install_path", "dsctl_serving_venv", "dsctl_staging_dir", "dsctl_env_file",
                 "dsctl_service_config_dir", "dsctl_service_log_dir", "dsctl_package_source", "dsctl_wheelhouse"]


@pytest.mark.parametrize("field", PATH_SETTINGS)
@pytest.mark.parametrize("value", ["/etc/$(touch${IFS}/owned)", "/etc/`id`", "/etc/dsctl/../../root",
                                   "/etc/a b", "/etc/x;reboot", "/etc/100%"])
def test_every_path_setting_takes_a_safe_character_set_only(field, value):
    error = problem({**SITE, field: value})
    assert error.exit_status == ExitStatus.USAGE
    assert str(error).startswith(f"inventory: host lab-01: {field}: expected an absolute path of letters, digits "
                                 "and . _ / + - without '..'")
    # (the wheelhouse, derived from dsctl_package_source, is the "1 more problem" there)
    assert str(error).removesuffix(" (1 more problem on this host)").endswith(
        f"got {value!r}; fix it in group_vars or host_vars")


def test_safe_path_settings_pass():
    settings = validate_host_vars("a", {**SITE, "dsctl_service_config_dir": "/srv/dsctl-2.0/services_a+b"})
    assert settings.dsctl_service_config_dir == "/srv/dsctl-2.0/services_a+b"
    assert HostSettings.model_fields["dsctl_service_log_dir"].default == "/var/log/dsctl"


# -- package trust (issue 12) ----------------------------------------------------------------------------------

PIN = "3f" * 32


@pytest.mark.parametrize("extra, field", [
    ({"dsctl_package_source": "http://mirror.example/ascend"}, "dsctl_package_source"),
    ({"dsctl_package_source": "HTTP://mirror.example/ascend"}, "dsctl_package_source"),
    ({"dsctl_package_source": "http://mirror.example/ascend", "dsctl_package_manifest_sha256": PIN},
     "dsctl_wheelhouse"),  # its default, <source>/wheels, is plain http too
    ({"dsctl_wheelhouse": "http://mirror.example/wheels"}, "dsctl_wheelhouse"),
])
def test_a_plain_http_source_without_a_pinned_manifest_is_refused(extra, field):
    message = str(problem({**SITE, **extra}))
    pin = field.replace("dsctl_package_source", "dsctl_package_manifest").replace("dsctl_wheelhouse",
                                                                                   "dsctl_wheelhouse_manifest")
    assert message.startswith(f"inventory: host lab-01: {field}: plain http://")
    assert f"set {pin}_sha256" in message and "sha256sum SHA256SUMS" in message


def test_a_pinned_http_source_https_and_directories_are_accepted():
    pinned = validate_host_vars("lab-01", {**SITE, "dsctl_package_source": "http://mirror.example/ascend",
                                           "dsctl_package_manifest_sha256": PIN.upper(),
                                           "dsctl_wheelhouse_manifest_sha256": PIN})
    assert pinned.dsctl_package_manifest_sha256 == PIN  # normalised to lower case, as sha256sum prints it
    assert validate_host_vars("lab-01", {**SITE, "dsctl_package_source": "https://mirror.example/a"})
    assert validate_host_vars("lab-01", SITE).dsctl_package_manifest_sha256 is None


def test_a_pin_that_is_not_a_digest_is_refused():
    message = str(problem({**SITE, "dsctl_package_manifest_sha256": "sha256:abc"}))
    assert "dsctl_package_manifest_sha256: expected a sha256 digest" in message


def test_lab_inventory_pins_the_manifests_it_wrote(tmp_path):
    import hashlib

    from dsctl.lab.inventory import manifest_pins

    (tmp_path / "wheels").mkdir()
    (tmp_path / "SHA256SUMS").write_bytes(b"ab  x.run\n")
    assert manifest_pins(tmp_path) == {"dsctl_package_manifest_sha256": hashlib.sha256(b"ab  x.run\n").hexdigest()}
    (tmp_path / "wheels" / "SHA256SUMS").write_bytes(b"")
    assert manifest_pins(tmp_path)["dsctl_wheelhouse_manifest_sha256"] == hashlib.sha256(b"").hexdigest()


def test_upgrade_reads_a_pinned_manifest_only_when_its_digest_matches(tmp_path):
    import hashlib

    from dsctl.services.upgrade import read_package_sums

    manifest = ("ab" * 32 + "  Ascend-cann-toolkit_8.5.0_linux-x86_64.run\n").encode()
    (tmp_path / "SHA256SUMS").write_bytes(manifest)
    (tmp_path / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_bytes(b"")
    pin = hashlib.sha256(manifest).hexdigest()
    assert list(read_package_sums(str(tmp_path), pin)) == ["Ascend-cann-toolkit_8.5.0_linux-x86_64.run"]
    with pytest.raises(ValueError, match=f"the inventory pins {PIN}; the source is refused"):
        read_package_sums(str(tmp_path), PIN)
    (tmp_path / "SHA256SUMS").write_bytes(manifest + b"truncated  line\n")
    where = re.escape(f"{tmp_path}/SHA256SUMS")
    with pytest.raises(DsctlError, match=f"^{where} line 2 is not .*; regenerate it with sha256sum$"):
        read_package_sums(str(tmp_path))


def test_root_as_the_run_user_is_refused():
    # Accepted before: the npu_driver role would then give root the run group and /bin/bash.
    line = str(problem({**SITE, "dsctl_run_user": "root"}))
    assert line.startswith("inventory: host lab-01: dsctl_run_user: root is refused: the npu_driver role would "
                           "change that account's group and shell")
    assert problem({**SITE, "dsctl_run_user": "root"}).exit_status == ExitStatus.USAGE
    allowed = {**SITE, "dsctl_run_user": "rooty", "dsctl_allowed_accounts": ["rooty"]}  # a site's own account
    assert validate_host_vars("lab-01", allowed).dsctl_run_user == "rooty"


def test_a_malformed_gateway_is_refused_with_the_host_settings():
    # Typed Any before: any value passed until the gateway was planned, after the rollout.
    line = str(problem({**SITE, "dsctl_gateway": {"services": [{"service": "chat", "port": "x"}]}}))
    assert line.startswith("inventory: host lab-01: dsctl_gateway.services[0].port: expected a port")
    assert str(problem({**SITE, "dsctl_gateway": "chat"})).startswith(
        "inventory: host lab-01: dsctl_gateway: expected a mapping with services")
    settings = validate_host_vars("lab-01", {**SITE, "dsctl_gateway": {"services": [{"service": "chat", "port": 80}]}})
    assert settings.dsctl_gateway.services[0].service == "chat"
