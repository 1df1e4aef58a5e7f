"""Bad-input battery, class 10 (issue 41): headers and hosts.

Header values, host names, versions, numbers YAML 1.1 misreads, lab-only releases, mistyped setting prefixes and an
empty --limit: each refused before any host is contacted (the sentinel counts), exit 2 or 3, one line naming the
field.  The sample inventory with each input laid over it (`battery.site`, `battery.write_raw`).
"""

from __future__ import annotations

import pytest

from dsctl.app import main

from .battery import assert_names, refusal, site, write_raw

# --------------------------------------------------------------------------- header values (probe)

HEADER_VALUES = [
    pytest.param("s3cr3t\r\nX-Injected: 1", "line break", id="crlf-injection"),
    pytest.param("s3cr3t\nX-Injected: 1", "line break", id="lf-injection"),
    pytest.param("s3cr3t\rmore", "line break", id="bare-cr"),
    pytest.param("s3cr3t\x01value", "control character", id="soh"),
    pytest.param("s3cr3t\x7f", "control character", id="del"),
    pytest.param("s3cr3t\x00", "control character", id="nul"),
    pytest.param("s3cr3t-schlüssel", "outside printable ASCII", id="non-ascii"),
    pytest.param(" s3cr3t", "space or tab", id="leading-space"),
    pytest.param("s3cr3t\t", "space or tab", id="trailing-tab"),
]


@pytest.mark.parametrize(("key", "problem"), HEADER_VALUES)
def test_an_api_key_that_is_no_header_value_is_refused_before_sending(capsys, sentinel, key, problem):
    line = refusal(capsys, sentinel, ["probe", sentinel.url, "--rate", "1", "--requests", "1", "--api-key", key])
    assert_names(line, "--api-key", problem, "RFC 9110")
    assert "s3cr3t" not in line  # a secret is never echoed


def test_the_header_rule_accepts_a_usual_key():
    from dsctl.adapters.probe_client import header_value_problem

    assert header_value_problem("sk-proj_AbC.123~+/=") is None
    assert header_value_problem("Bearer with inner space") is None


# --------------------------------------------------------------------------- host names

BAD_HOST_NAMES = [
    pytest.param("node-a;reboot", id="shell-separator"),
    pytest.param("../../etc", id="path-traversal"),
    pytest.param("node a", id="blank"),
    pytest.param("node$(id)", id="command-substitution"),
    pytest.param("-rf", id="leading-dash"),
    pytest.param("a..b", id="empty-label"),
    pytest.param("rack1/node1", id="slash"),
    pytest.param("node*", id="pattern-wildcard"),
    pytest.param("fe80::1", id="ipv6-colons"),
    pytest.param("x" * 64, id="label-over-63"),
]


@pytest.mark.parametrize("name", BAD_HOST_NAMES)
def test_a_host_name_outside_the_safe_set_is_refused_before_rendering(capsys, tmp_path, sentinel, name):
    inventory = site(tmp_path, sentinel, hosts=("atlas-a01", name))
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    assert_names(line, repr(name), "RFC 1123", "ansible_host")


def test_usual_host_names_still_render(capsys, tmp_path, sentinel):
    inventory = site(tmp_path, sentinel, hosts=("atlas-a01", "node_02.dc1.example.com", "10.0.0.7"))
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0


def test_the_roles_path_refuses_the_host_name_too():
    # validate_fleet is what the roles' filters call under plain ansible-playbook.
    from dsctl.core.inventory.schema import InventoryError, validate_fleet

    with pytest.raises(InventoryError, match="node-a;reboot"):
        validate_fleet({"node-a;reboot": {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/p"}})


# --------------------------------------------------------------------------- versions

BAD_VERSIONS = [
    pytest.param("dsctl_min_kernel_version", "abc", id="kernel-word"),
    pytest.param("dsctl_min_kernel_version", "5.10; reboot", id="kernel-shell"),
    pytest.param("dsctl_min_kernel_version", "5.10 ", id="kernel-trailing-space"),
    pytest.param("dsctl_cann_version", "8.0.RC3\n", id="cann-newline"),
    pytest.param("dsctl_cann_version", "$(reboot)", id="cann-substitution"),
    pytest.param("dsctl_driver_version", "24.1.rc3 ", id="driver-trailing-space"),
    pytest.param("dsctl_firmware_version", "7.5.0.1.129'", id="firmware-quote"),
    pytest.param("dsctl_vllm_ascend_version", "v0.13.0 && id", id="vllm-ascend-shell"),
    pytest.param("dsctl_min_kernel_version", "2024-01-01", id="kernel-date-text"),
]


@pytest.mark.parametrize(("field", "value"), BAD_VERSIONS)
def test_a_value_outside_the_version_grammar_is_refused(capsys, tmp_path, sentinel, field, value):
    inventory = site(tmp_path, sentinel, {field: value})
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    # A blank or a line break is refused by the one-line rule every string passes first (dsctl.core.text), its
    # own words; every other value by the version grammar, which shows a good version.
    assert_names(line, field, "surrounding blanks" if value != value.strip() else "quoted")


def test_a_yaml_date_where_the_kernel_version_belongs_is_refused(capsys, tmp_path, sentinel):
    # Unquoted, YAML reads it as a datetime.date: the file is written as a user would.
    inventory = site(tmp_path, sentinel)
    write_raw(inventory, "group_vars/npu_nodes/zz-battery.yml", "dsctl_min_kernel_version: 2024-01-01\n")
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    assert_names(line, "dsctl_min_kernel_version", 'a quoted kernel version such as "5.10"')


@pytest.mark.parametrize("value", ["5.10", "6", "5.10.0-136.12.0.86.oe2203sp1.aarch64", "4.19.90-52.22.v2207.ky10"])
def test_kernel_versions_in_the_grammar_pass(value):
    from dsctl.core.fleet.versions import version_text

    assert version_text(value) == value


# --------------------------------------------------------------------------- numbers YAML 1.1 misreads

MISREAD_NUMBERS = [
    pytest.param("group_vars/npu_nodes/zz-battery.yml", "dsctl_npu_count: 010\n", "dsctl_npu_count", "write 10 or 8",
                 id="octal-npu-count"),
    pytest.param("host_vars/atlas-a01.yml", "dsctl_npu_count: 010\n", "dsctl_npu_count", "octal", id="host-vars"),
    pytest.param("group_vars/npu_nodes/zz-battery.yml", "dsctl_min_free_disk_gb: 0200\n", "dsctl_min_free_disk_gb",
                 "write 200 or 128", id="octal-disk"),
    pytest.param("group_vars/npu_nodes/zz-battery.yml", "dsctl_reboot_timeout: 15:00\n", "dsctl_reboot_timeout",
                 "base-60", id="sexagesimal"),
    pytest.param("group_vars/npu_nodes/zz-battery.yml",
                 "dsctl_services:\n  - name: chat\n    model: /models/m\n    port: 010000\n",
                 "dsctl_services[0].port", "4096", id="nested-port"),
    pytest.param("group_vars/npu_nodes/zz-battery.yml", "dsctl_ascend_env:\n  HCCL_CONNECT_TIMEOUT: 0600\n",
                 "dsctl_ascend_env.HCCL_CONNECT_TIMEOUT", "384", id="env-value"),
]


@pytest.mark.parametrize(("relative", "text", "field", "fix"), MISREAD_NUMBERS)
def test_a_number_yaml_misreads_is_refused_naming_file_key_and_fix(capsys, tmp_path, sentinel, relative, text,
                                                                     field, fix):
    inventory = site(tmp_path, sentinel)
    path = write_raw(inventory, relative, text)
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    assert_names(line, str(path), field, fix)


def test_quoted_or_foreign_leading_zeros_are_left_alone():
    from dsctl.core.fleet.yaml_numbers import misread_number

    assert misread_number('dsctl_npu_count: "010"\nother_tool: 010\ndsctl_reboot_timeout: 900\n') is None


# --------------------------------------------------------------------------- lab-only releases

LAB_RELEASES = [
    pytest.param({"dsctl_cann_version": "8.5.0.lab1", "dsctl_vllm_ascend_version": "v0.13.0.dev1"},
                 "dsctl_cann_version", id="cann-and-row"),
    pytest.param({"dsctl_cann_version": "8.5.0.lab1", "dsctl_vllm_ascend_version": "none"},
                 "dsctl_cann_version", id="cann-alone"),
    pytest.param({"dsctl_cann_version": "8.5.0.LAB1", "dsctl_vllm_ascend_version": "none"},
                 "dsctl_cann_version", id="other-case"),
    pytest.param({"dsctl_cann_version": "8.5.0.lab1", "dsctl_vllm_ascend_version": "v0.13.0.dev1",
                  "dsctl_allow_lab_releases": False}, "dsctl_cann_version", id="explicitly-false"),
    pytest.param({"dsctl_cann_version": "8.5.0.lab1", "dsctl_vllm_ascend_version": "v0.13.0.dev1",
                  "dsctl_allow_lab_releases": "yes"}, "dsctl_allow_lab_releases", id="flag-not-a-boolean"),
]


@pytest.mark.parametrize(("settings", "field"), LAB_RELEASES)
def test_a_lab_only_release_is_refused_on_an_inventory_that_does_not_allow_it(capsys, tmp_path, sentinel,
                                                                              settings, field):
    inventory = site(tmp_path, sentinel, settings)
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    assert_names(line, field)
    if field == "dsctl_cann_version":
        assert_names(line, "lab-only", "dsctl_allow_lab_releases: true")


def test_a_lab_only_release_is_accepted_where_the_inventory_allows_it(capsys, tmp_path, sentinel):
    inventory = site(tmp_path, sentinel, {"dsctl_cann_version": "8.5.0.lab1",
                                          "dsctl_vllm_ascend_version": "v0.13.0.dev1",
                                          "dsctl_allow_lab_releases": True})
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0


def test_the_lab_inventory_allows_lab_releases(tmp_path):
    import yaml

    from dsctl import data
    from dsctl.core.lab.plan import plan_lab
    from dsctl.lab.hosts import LabPaths
    from dsctl.lab.inventory import render_inventory

    spec = plan_lab(hosts=2, npus=8, chip="910B3", chips=data.load("chips")["chips"])
    text = render_inventory(spec, LabPaths(tmp_path))
    assert yaml.safe_load(text)["all"]["children"]["npu_nodes"]["vars"]["dsctl_allow_lab_releases"] is True


# --------------------------------------------------------------------------- mistyped prefixes

MISTYPED = [
    pytest.param("dsctl-serving_venv", "dsctl_serving_venv", id="dash"),
    pytest.param("dsct_serving_venv", "dsctl_serving_venv", id="missing-l"),
    pytest.param("DSCTL_npu_count", "dsctl_npu_count", id="upper-case"),
    pytest.param("dsctlserving_venv", "dsctl_serving_venv", id="no-underscore"),
    pytest.param("dscl_npu_count", "dsctl_npu_count", id="missing-t"),
    pytest.param("dsctl-npu-count", "dsctl_npu_count", id="all-dashes"),
    pytest.param("sdctl_staging_dir", "dsctl_staging_dir", id="swapped"),
]


@pytest.mark.parametrize(("key", "meant"), MISTYPED)
def test_a_mistyped_setting_prefix_is_refused_with_did_you_mean(capsys, tmp_path, sentinel, key, meant):
    inventory = site(tmp_path, sentinel, {key: 8 if "npu_count" in meant or "npu-count" in key else "/opt/x"})
    line = refusal(capsys, sentinel, ["deploy", str(inventory), "--render"])
    assert_names(line, key, f"did you mean {meant}?")


def test_other_tools_keys_are_not_taken_for_dsctl_settings(capsys, tmp_path, sentinel):
    inventory = site(tmp_path, sentinel, {"ansible_become": True, "npu_count": 3, "serving_venv": "/x",
                                          "my_dsctl_notes": "x", "ds_npu_count": 1, "desktop_theme": "dark"})
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0


# --------------------------------------------------------------------------- an empty --limit

EMPTY_LIMITS = [
    pytest.param(["deploy", "{inv}", "--render", "--limit", ""], id="deploy-render-empty"),
    pytest.param(["deploy", "{inv}", "--limit", " "], id="deploy-blank"),
    pytest.param(["check", "{inv}", "--limit", ""], id="check-empty"),
    pytest.param(["provision", "{inv}", "--check", "--limit", ","], id="provision-comma"),
    pytest.param(["deploy", "{inv}", "--render", "--limit", ":"], id="colon"),
    pytest.param(["provision", "{inv}", "--limit", " , : "], id="separators"),
]


@pytest.mark.parametrize("args", EMPTY_LIMITS)
def test_an_empty_limit_is_a_usage_error_not_every_host(capsys, tmp_path, sentinel, args):
    inventory = site(tmp_path, sentinel)
    line = refusal(capsys, sentinel, [arg.format(inv=inventory) for arg in args], exits=(2,))
    assert_names(line, "--limit", "names no host or group")
