"""The OS / kernel / interpreter / size rules (dsctl.core.hostfacts.platform) and check --ready's probe and verdict
(dsctl.core.hostfacts.readyprobe, dsctl.core.fleet.readiness), on the openEuler 22.03 and Kylin V10 os-release files
of real Atlas 800T A2 servers (tests/fixtures/os_release)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dsctl.core.fleet import readiness
from dsctl.core.hostfacts import platform, readyprobe
from dsctl.core.inventory import host_plan
from dsctl.core.inventory.schema import InventoryError, validate_fleet, validate_host_vars

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "os_release"
SITE = {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/ascend-packages", "dsctl_vllm_ascend_version": "v0.13.0"}
GB = 1024


def settings_of(**extra):
    validated = validate_fleet({"node-1": {**SITE, **extra}})["node-1"]  # attaches the resolved stack
    plain = {k.removeprefix("dsctl_"): v for k, v in validated.model_dump(mode="json").items()}
    # the stack as check --ready hands it to assess: installer names for the host's arch
    return plain, host_plan.stack_for_arch(host_plan.stack_template(validated), "aarch64")


def system(os_file: str | None = "openeuler-22.03", kernel="5.10.0-60.18.0.50.oe2203.aarch64", arch="aarch64",
           mem_gb=512, free_gb=800) -> dict:
    release = platform.parse_os_release((FIXTURES / os_file).read_text() if os_file else None)
    return {"arch": arch, "kernel": kernel, "os_id": release.id, "os_version": release.version_id,
            "os_pretty_name": release.pretty_name, "mem_total_mb": mem_gb * GB, "disk_path": "/usr/local/Ascend",
            "disk_free_mb": free_gb * GB}


def checks(blockers) -> list[str]:
    return [b.check for b in blockers]


# --------------------------------------------------------------------------- os-release and the OS table


def test_openeuler_and_kylin_os_release_are_read():
    euler = platform.parse_os_release((FIXTURES / "openeuler-22.03").read_text())
    kylin = platform.parse_os_release((FIXTURES / "kylin-v10").read_text())
    assert (euler.id, euler.version_id, euler.pretty_name) == ("openEuler", "22.03", "openEuler 22.03 LTS")
    assert (kylin.id, kylin.version_id) == ("kylin", "V10")
    assert kylin.pretty_name == "Kylin Linux Advanced Server V10 (Sword)"


@pytest.mark.parametrize(("os_id", "version"), [("openEuler", "22.03"), ("openeuler", "24.03"), ("kylin", "V10"),
                                                ("euleros", "2.0"), ("hce", "2.0"), ("ubuntu", "20.04"),
                                                ("ubuntu", "22.04"), ("ubuntu", "24.04")])
def test_the_oses_ascend_tables_name_pass(os_id, version):
    assert platform.os_blocker(os_id, version) is None


def test_a_release_the_table_does_not_name_is_refused_with_the_releases():
    blocker = platform.os_blocker("ubuntu", "18.04", pretty="Ubuntu 18.04.6 LTS")
    assert "Ubuntu 18.04.6 LTS" in blocker.sentence and "20.04, 22.04, 24.04" in blocker.sentence
    assert "dsctl_extra_supported_os" in blocker.fix


def test_debian_only_where_the_site_opts_in():
    refused = platform.os_blocker("debian", "12", pretty="Debian GNU/Linux 12 (bookworm)")
    assert refused.check == "os" and "add debian to dsctl_extra_supported_os" in refused.fix
    assert platform.os_blocker("debian", "12", extra=["debian"]) is None


def test_extra_supported_os_is_a_list_of_ids():
    with pytest.raises(InventoryError, match="dsctl_extra_supported_os"):
        validate_host_vars("node-1", {**SITE, "dsctl_extra_supported_os": "debian"})


# --------------------------------------------------------------------------- kernel


def test_kernel_below_5_10_blocks_where_the_table_names_no_older_kernel():
    found = platform.platform_blockers(system("openeuler-22.03", kernel="4.18.0-1.el8.aarch64"), settings_of()[0],
                                       None, None)
    assert checks(found) == ["kernel"] and "4.18.0-1.el8.aarch64 is older than 5.10" in found[0].sentence


def test_kylin_v10_keeps_the_4_19_kernel_it_is_supported_with():
    plain, _ = settings_of()
    assert platform.platform_blockers(system("kylin-v10", kernel="4.19.90-24.4.v2101.ky10.aarch64"), plain, None,
                                      None) == []
    older = platform.platform_blockers(system("kylin-v10", kernel="4.14.0-115.ky10.aarch64"), plain, None, None)
    assert checks(older) == ["kernel"]


def test_kernel_tuple_reads_distribution_suffixes():
    assert platform.kernel_tuple("5.10.0-60.18.0.50.oe2203.aarch64") == (5, 10, 0)
    assert platform.kernel_tuple("6.18.44-fc-v1045") == (6, 18, 44)


# --------------------------------------------------------------------------- memory and disk


def test_the_guides_minimums_are_the_defaults():
    found = platform.platform_blockers(system(mem_gb=32, free_gb=150), settings_of()[0], None, None)
    assert checks(found) == ["memory", "disk"]
    assert "32.0 GB; at least 64 GB" in found[0].sentence and "at least 200 GB" in found[1].sentence
    lowered = settings_of(dsctl_min_memory_gb=16, dsctl_min_free_disk_gb=100)[0]
    assert platform.platform_blockers(system(mem_gb=32, free_gb=150), lowered, None, None) == []


# --------------------------------------------------------------------------- the serving Python


def test_openeuler_python_3_9_against_the_0_13_row():
    plain, stack = settings_of()
    assert stack["python"] == ">=3.10,<3.12"
    found = platform.platform_blockers(system(), plain, stack, {"output": "Python 3.9.9\n", "rc": 0})
    assert checks(found) == ["python"]
    assert found[0].sentence == ("serving Python /usr/bin/python3 is 3.9.9; vllm-ascend v0.13.0 needs Python "
                                 ">=3.10,<3.12.")
    assert "set dsctl_serving_python to a Python >=3.10,<3.12 interpreter" in found[0].fix


def test_kylin_python_3_7_and_a_chosen_3_11():
    plain, stack = settings_of()
    assert checks(platform.platform_blockers(system("kylin-v10", kernel="4.19.90-24.4.v2101.ky10.aarch64"), plain,
                                             stack, {"output": "Python 3.7.9", "rc": 0})) == ["python"]
    chosen, stack = settings_of(dsctl_serving_python="/usr/bin/python3.11")
    assert platform.platform_blockers(system(), chosen, stack, {"output": "Python 3.11.6", "rc": 0}) == []


def test_an_interpreter_that_does_not_answer_is_named():
    plain, stack = settings_of(dsctl_serving_python="/opt/py/bin/python3")
    found = platform.platform_blockers(system(), plain, stack,
                                       {"output": "/opt/py/bin/python3: not found or not executable", "rc": 127})
    assert checks(found) == ["python"] and "/opt/py/bin/python3 did not answer --version (rc 127" in found[0].sentence


def test_python_2_prints_its_version_on_stderr_and_is_read():
    assert platform.parse_python_version("Python 2.7.18") == "2.7.18"


def test_no_python_check_without_a_serving_row():
    plain, stack = settings_of(dsctl_vllm_ascend_version="none")
    assert platform.platform_blockers(system(), plain, stack, {"output": "Python 3.9.9", "rc": 0}) == []


# --------------------------------------------------------------------------- check --ready: probe and verdict


def probe_output(os_file: str, python: str, kernel: str, mem_kb: int = 528_000_000, free_kb: int = 900_000_000,
                 npu_smi: str | None = None) -> str:
    mark = readyprobe.MARK
    parts = [f"{mark}arch----\naarch64", f"{mark}kernel----\n{kernel}", f"{mark}meminfo----\nMemTotal: {mem_kb} kB",
             f"{mark}disk----\n/usr/local\n/dev/sda2 {free_kb * 2} {free_kb} {free_kb} 50% /",
             f"{mark}file:os_release----\n{(FIXTURES / os_file).read_text()}", f"{mark}python----\n{python}\nrc=0"]
    if npu_smi is not None:
        parts += [f"{mark}npu_smi_path----\n/usr/local/bin/npu-smi", f"{mark}npu_smi_info----\n{npu_smi}\nrc=0"]
    return "\n" + "\n\n".join(parts) + "\n"


def test_ready_on_a_bare_openeuler_host_names_python_and_the_missing_packages():
    plain, stack = settings_of()
    verdict = readiness.assess(probe_output("openeuler-22.03", "Python 3.9.9", "5.10.0-60.18.0.50.oe2203.aarch64"),
                               plain, stack, sums={})
    assert verdict.system["os_id"] == "openEuler" and verdict.system["mem_total_mb"] == 528_000_000 // 1024
    assert checks(verdict.blockers) == ["python", "packages"]
    assert "is 3.9.9; vllm-ascend v0.13.0 needs Python >=3.10,<3.12" in verdict.blockers[0].sentence
    # a bare host needs the whole stack, aarch64 names
    assert verdict.packages and all("aarch64" in name for name in verdict.packages if "firmware" not in name)
    assert verdict.to_dict()["python"] == {"path": "/usr/bin/python3", "version": "3.9.9"}


def test_ready_with_every_package_listed_and_python_3_11():
    plain, stack = settings_of(dsctl_serving_python="/usr/bin/python3.11")
    first = readiness.assess(probe_output("kylin-v10", "Python 3.11.6", "4.19.90-24.4.v2101.ky10.aarch64"),
                             plain, stack, sums={})
    sums = {name: "0" * 64 for name in first.packages}
    verdict = readiness.assess(probe_output("kylin-v10", "Python 3.11.6", "4.19.90-24.4.v2101.ky10.aarch64"),
                               plain, stack, sums=sums)
    assert verdict.ready and verdict.to_dict()["status"] == "ready"


def test_empty_output_is_a_blocker_not_a_pass():
    plain, stack = settings_of()
    verdict = readiness.assess("", plain, stack, sums=None)
    assert not verdict.ready and verdict.blockers[0].check == "facts"


def test_the_probe_script_runs_under_plain_sh_and_only_reads(tmp_path):
    # The real script on this machine (any Linux): everything it prints parses; it writes nothing.
    install = tmp_path / "no such dir" / "Ascend"
    script = readyprobe.script(str(install), "/bin/true --version; touch /tmp/pwned")
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and not Path("/tmp/pwned").exists()
    raw = readyprobe.parse_output(done.stdout, str(install), "x")
    assert raw["arch"] and raw["kernel"] and raw["mem_total_mb"] > 0
    assert raw["disk"]["path"] == str(tmp_path) and raw["disk"]["free_mb"] > 0
    assert raw["serving_python"]["rc"] == 127 and "not found" in raw["serving_python"]["output"]
    assert list(tmp_path.iterdir()) == []


def test_the_preflight_filter_gives_the_role_one_line_per_blocker():
    import importlib.util

    from dsctl.assets import asset_root

    path = asset_root() / "playbooks" / "filter_plugins" / "dsctl_filters.py"
    spec = importlib.util.spec_from_file_location("dsctl_filters_for_platform", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    blockers = module.FilterModule().filters()["dsctl_platform_blockers"]
    plain, stack = settings_of()
    # what ascend_facts reports for an openEuler 22.03 host whose python3 is 3.9 (ascend_host.system, serving_python)
    found = blockers(system(), plain, stack, {"path": "/usr/bin/python3", "rc": 0, "output": "Python 3.9.9\n"})
    assert [b["check"] for b in found] == ["python"]
    assert found[0]["line"].startswith("serving Python /usr/bin/python3 is 3.9.9; vllm-ascend v0.13.0 needs")
    assert "Fix: set dsctl_serving_python" in found[0]["line"]
    assert blockers(system(), plain, stack, None) == []  # a collector that did not ask


def test_check_ready_refuses_a_bad_interpreter_setting_before_any_host_is_contacted(tmp_path, capsys):
    from dsctl.app import main

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n        node-1: {ansible_host: 192.0.2.1}\n"
                         "      vars: {dsctl_npu_count: 8, dsctl_package_source: /srv/p, "
                         "dsctl_serving_python: python3.11}\n")
    assert main(["check", "--ready", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert "dsctl_serving_python" in err and "python3.11" in err and err.count("\n") == 1
