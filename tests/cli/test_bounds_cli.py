"""Bounded work as users meet it (issue 12): huge counts, burstiness 0, unwritable outputs and an alias bomb in an
inventory are refused in one line, exit 2, before any request is sent or any host contacted."""

from __future__ import annotations

import time

import pytest

from dsctl.app import main
from dsctl.core.load import limits

from ..unit.test_bounds import billion_laughs
from .test_probe_cli import one_error_line

URL = "http://127.0.0.1:9"  # nothing listens: a refusal that came after the first request would exit 1


@pytest.mark.parametrize("args, needle", [
    (["probe", URL, "--rate", "1", "--requests", "999999999999"], f"--requests 999999999999: more than the "
                                                                  f"{limits.MAX_REQUESTS}"),
    (["probe", URL, "--rate", "1", "--prompt-tokens", "99999999999"], f"{limits.MAX_TOKENS} tokens"),
    (["probe", URL, "--concurrency", "1000000000"], f"--concurrency 1000000000: more than the "
                                                    f"{limits.MAX_CONCURRENCY}"),
    (["probe", URL, "--rate", "1", "--arrival", "gamma", "--burstiness", "0"], "--burstiness 0: must be greater"),
    (["estimate", "--chip", "910B3", "--model", "r1-7b", "--prompt-tokens", "128", "--concurrency", "1000000000"],
     f"--concurrency 1000000000: more than the {limits.MAX_CONCURRENCY}"),
    (["tune", "--simulate", "--model", "r1-7b", "--slo", "ttft=200ms", "--prompt-tokens", "99999999999"],
     "--prompt-tokens"),
])
def test_huge_work_is_refused_at_once(capsys, args, needle):
    started = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - started < 1.0
    assert needle in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("option", ["--record", "--csv"])
def test_an_output_file_in_a_missing_directory_is_refused_before_the_probe(capsys, tmp_path, option):
    target = tmp_path / "no-such-dir" / "out"
    assert main(["probe", URL, "--rate", "1", "--requests", "5", option, str(target)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{option} {target}" in line and "does not exist" in line


def test_a_sweep_run_dir_that_is_a_file_is_refused_before_the_sweep(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    assert main(["probe", URL, "--sweep", "rate=1:4:2", "--run-dir", str(tmp_path / "f")]) == 2
    assert "--run-dir" in one_error_line(capsys.readouterr().err)


def test_lab_packages_out_that_is_a_file_is_refused_before_building(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    assert main(["lab", "packages", "--out", str(tmp_path / "f")]) == 2
    assert "--out" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("verb", ["check", "provision", "deploy"])
def test_an_alias_bomb_in_an_inventory_is_refused_before_ansible_reads_it(capsys, tmp_path, verb):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n        a: {ansible_host: 10.0.0.1}\n"
                         "      vars:\n" + "".join(f"        {line}\n" for line in billion_laughs().splitlines()))
    started = time.monotonic()
    assert main([verb, str(inventory)]) == 2
    assert time.monotonic() - started < 1.0
    assert "its YAML aliases expand to more than" in one_error_line(capsys.readouterr().err)


def test_a_plain_http_package_source_without_a_pin_is_refused_before_any_host(capsys, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n        a: {ansible_host: 192.0.2.1}\n"
                         "      vars:\n        dsctl_npu_count: 8\n"
                         "        dsctl_package_source: http://mirror.example/ascend\n")
    assert main(["provision", str(inventory)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "dsctl_package_source: plain http://" in line and "dsctl_package_manifest_sha256" in line


@pytest.mark.parametrize("setting, value, needle", [
    ("dsctl_serving_venv", "/usr", "dsctl_serving_venv: '/usr' is a system directory; dsctl would replace it. "
                                   "Fix: a directory of its own such as /opt/dsctl/serving-venv"),
    ("dsctl_serving_venv", "/opt/dsctl/serving-venv/", "dsctl_serving_venv: '/opt/dsctl/serving-venv/' is not a "
                                                       "normalised path"),
    ("dsctl_staging_dir", "/", "dsctl_staging_dir: '/' is the root directory"),
    ("dsctl_env_file", "/etc/shadow", "dsctl_env_file: '/etc/shadow' is a file the system owns"),
])
@pytest.mark.parametrize("verb", ["check", "provision"])
def test_a_path_a_role_would_damage_as_root_is_refused_before_any_host(capsys, tmp_path, verb, setting, value,
                                                                        needle):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n"
                         "        a: {ansible_host: 127.0.0.1, ansible_port: 9}\n"
                         "      vars:\n        dsctl_npu_count: 8\n        dsctl_package_source: /srv/ascend\n"
                         f"        {setting}: {value}\n")
    assert main([verb, str(inventory)]) == 2
    assert needle in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("args, needle", [
    (["--cann", "9.9.9"], "--cann 9.9.9: CANN 9.9.9 is not in the releases data"),
    (["--vllm-ascend", "v9.9.9"], "--vllm-ascend v9.9.9: vllm-ascend v9.9.9 is not in the releases data"),
    (["--probe-prompt-tokens", "abc"], "--probe-prompt-tokens 'abc': expected N"),
])
def test_upgrade_refuses_its_targets_and_options_before_any_host(capsys, tmp_path, args, needle):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n"
                         "        a: {ansible_host: 127.0.0.1, ansible_port: 9}\n"
                         "      vars:\n        dsctl_npu_count: 8\n        dsctl_package_source: /srv/ascend\n")
    started = time.monotonic()
    assert main(["upgrade", str(inventory), *args]) == 2
    assert time.monotonic() - started < 5.0  # no ansible-playbook ran
    line = one_error_line(capsys.readouterr().err)
    assert needle in line and "unreachable" not in line
