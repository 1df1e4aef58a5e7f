"""audit_host: statuses, drift and health findings on hosts built from the lab's own renderers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsctl.core.fleet.audit import HostReport, audit_host, fleet_summary, overall_status, python_satisfies
from dsctl.core.fleet.compat import Finding
from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.hostfacts import npusmi
from dsctl.core.hostfacts.hoststate import parse_host
from dsctl.emu.npu_smi import DCMI_INIT_FAILED
from tests.unit.test_compat import field_failure_raw
from tests.unit.test_hoststate import (
    DEVICE_BUSY,
    ENV_EXPECTED,
    RELEASES,
    SERVING_PINS,
    bare_raw,
    cann,
    hdk,
    host_raw,
    npu_smi_failed,
    npu_smi_raw,
)


def desired(hdk_version: str = "25.5.0", cann_version: str = "8.5.0", vllm_ascend: str | None = "v0.13.0"):
    """The stack the matrix would resolve, assembled here from releases.yaml (dsctl.core.fleet.matrix is not used)."""
    row = next((r for r in RELEASES["vllm_ascend_matrix"] if r["vllm_ascend"] == vllm_ascend), None)
    kernels = cann(cann_version)["kernels"]["package"]
    pins = {}
    if row:
        pins = {"torch": row["torch"], "torch-npu": row["torch_npu"], "vllm": row["vllm"].lstrip("v"),
                "vllm-ascend": row["vllm_ascend"].lstrip("v")}
        if row.get("triton_ascend"):
            pins["triton-ascend"] = row["triton_ascend"]
    return DesiredStack(
        driver=hdk(hdk_version)["driver"]["version"],
        firmware=hdk(hdk_version)["firmware"]["version"],
        cann=cann_version,
        kernels_package=kernels,
        vllm_ascend=row and row["vllm_ascend"],
        vllm=row and row["vllm"],
        torch=row and row["torch"],
        torch_npu=row and row["torch_npu"],
        python=row and row["python"],
        driver_run=f"Ascend-hdk-910b-npu-driver_{hdk_version}_linux-{{arch}}.run",
        firmware_run=f"Ascend-hdk-910b-npu-firmware_{hdk(hdk_version)['firmware']['version']}.run",
        toolkit_run=f"Ascend-cann-toolkit_{cann_version}_linux-{{arch}}.run",
        kernels_run=f"Ascend-cann-{kernels}_{cann_version}_linux-{{arch}}.run",
        nnal_run=f"Ascend-cann-nnal_{cann_version}_linux-{{arch}}.run",
        pip_pins=pins,
    )


def audit(raw: dict, stack: DesiredStack | None = None, *, npus: int | None = 8, env: dict | None = ENV_EXPECTED):
    return audit_host(parse_host(raw), stack, expected_npus=npus, env_expected=env)


def codes(report: HostReport, severity: str | None = None) -> list[str]:
    return [f.code for f in report.findings if severity is None or f.severity == severity]


def one(report: HostReport, code: str) -> Finding:
    matching = [f for f in report.findings if f.code == code]
    assert len(matching) == 1, report.findings
    return matching[0]


# --------------------------------------------------------------------------- whole hosts


def test_healthy_provisioned_host_is_ok():
    report = audit(host_raw(), desired())
    assert report.status == "ok", report.findings
    assert report.findings == ()


def test_healthy_report_dict_shape():
    report = audit(host_raw(), desired())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["status"] == "ok" and data["pending_reboot"] is False and data["findings"] == []
    assert data["versions"] == {
        "driver": {"installed": "25.5.0", "running": "25.5.0"},
        "firmware": {"installed": "7.8.0.5.216", "running": "7.8.0.5.216"},
        "cann": {"active": "8.5.0", "installed": ["8.5.0"]},
        "kernels": "8.5.0",
        "nnal": "8.5.0",
        "torch": "2.8.0",
        "torch_npu": "2.8.0.post2",
        "vllm": "0.13.0",
        "vllm_ascend": "0.13.0",
    }
    assert data["npus"]["count"] == 8 and data["npus"]["chips"] == ["910B3"] and data["npus"]["unhealthy"] == []
    assert data["npus"]["hbm_total_mb"] == 8 * 65536 and data["npus"]["hbm_used_mb"] == 8 * 3408


def test_bare_host_without_desired_stack_is_ok_and_with_one_is_all_drift():
    assert audit(bare_raw(), None, npus=None, env=None).status == "ok"
    report = audit(bare_raw(), desired())
    assert report.status == "error"
    assert {"driver-drift", "firmware-drift", "cann-drift", "env-missing", "serving-venv-missing"} <= set(codes(report))
    driver = one(report, "driver-drift")
    assert "not installed" in driver.sentence and "25.5.0" in driver.sentence and "dsctl provision" in driver.fix


def test_bare_host_expecting_npus_without_a_stack_says_no_driver():
    report = audit(bare_raw(), None, npus=8, env=None)
    assert one(report, "npu-count").severity == "error"


def test_observed_pair_24_1_rc3_cann_8_0_0_is_a_warning_only():
    stack = desired("24.1.rc3", "8.0.0", "v0.8.4rc2")
    report = audit(host_raw("24.1.rc3", ("8.0.0",), packages=stack.pip_pins), stack)
    assert report.status == "warning", report.findings
    assert codes(report, "error") == []
    assert codes(report, "warning") == ["driver-does-not-list-cann"]


def test_cann_8_5_0_on_driver_24_1_rc3_is_an_error_on_the_cann_side():
    report = audit(host_raw("24.1.rc3", ("8.5.0",)), None)
    assert report.status == "error"
    error = one(report, "cann-rejects-driver")
    assert error.component == "cann" and "8.5.0" in error.sentence and "24.1.rc3" in error.sentence


def test_driver_installed_not_running_is_pending_reboot_and_board_check_waits():
    raw = host_raw("25.5.0", ("8.5.0",), running_hdk="24.1.rc3")
    raw["npu_smi"] = npu_smi_raw(hdk("24.1.rc3")["driver"], "7.5.0.1.129", compatibility={0: "NOK"})
    report = audit(raw, desired())
    assert report.status == "pending-reboot", report.findings
    assert report.pending_reboot and "board-incompatible" not in codes(report)
    pending = [f for f in report.findings if f.code == "pending-reboot"]
    assert any("25.5.0" in f.sentence and "24.1.rc3" in f.sentence and f.component == "driver" for f in pending)
    data = report.to_dict()
    assert data["versions"]["driver"] == {"installed": "25.5.0", "running": "24.1.rc3"}
    assert data["pending_reboot"] is True


def test_fresh_driver_before_reboot_is_pending_even_though_npu_smi_fails():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_failed(DCMI_INIT_FAILED + "\n")
    report = audit(raw, desired())
    assert report.status == "pending-reboot", report.findings
    assert one(report, "npu-smi-error").severity == "info"


def test_errors_win_over_a_pending_reboot():
    raw = host_raw("25.5.0", ("8.5.0",), running_hdk="24.1.rc3", nnal=False)
    assert audit(raw, desired()).status == "error"


def test_field_failure_firmware_outside_driver_range_is_an_error():
    report = audit(field_failure_raw(), None)
    assert report.status == "error"
    assert one(report, "firmware-outside-driver-range").component == "firmware"


# --------------------------------------------------------------------------- drift


def test_wrong_driver_installed_names_both_versions():
    report = audit(host_raw("24.1.rc3", ("8.5.0",)), desired())
    drift = one(report, "driver-drift")
    assert drift.severity == "error" and "24.1.rc3 installed" in drift.sentence and "25.5.0 wanted" in drift.sentence
    assert "dsctl provision" in drift.fix
    assert "7.5.0.1.129 installed" in one(report, "firmware-drift").sentence


def test_desired_cann_installed_side_by_side_but_not_active():
    report = audit(host_raw("25.5.0", ("8.3.RC2", "8.5.0"), active="8.3.RC2"), desired())
    finding = one(report, "cann-inactive")
    assert finding.component == "cann" and "8.5.0" in finding.sentence and "8.3.RC2" in finding.sentence


def test_side_by_side_advice_names_what_provision_does():
    raw = host_raw("25.5.0", ("8.3.RC2", "8.5.0"), active="8.3.RC2")
    raw["kernels_dirs"] = {"8.3.RC2": True, "8.5.0": True}
    raw["nnal_dirs"] = {"8.3.RC2": True, "8.5.0": True}
    fix = one(audit(raw, desired()), "cann-inactive").fix
    assert fix.startswith("Run dsctl provision: it will switch latest/ to the installed CANN 8.5.0 and NNAL's latest")
    assert "without running an installer" in fix and "serving venv" in fix
    # NNAL 8.5.0 missing: the advice says provision installs it after the switch
    raw["nnal_dirs"] = {"8.3.RC2": True}
    fix = one(audit(raw, desired()), "cann-inactive").fix
    assert "switch latest/ to the installed CANN 8.5.0, install NNAL 8.5.0" in fix
    assert "without running an installer" not in fix


def test_nnal_installed_side_by_side_is_switched_not_reinstalled():
    raw = host_raw("25.5.0", ("8.5.0",))
    raw["files"]["nnal_version_info"] = host_raw("25.3.rc1", ("8.3.RC2",))["files"]["nnal_version_info"]
    raw["nnal_dirs"] = {"8.3.RC2": True, "8.5.0": True}
    fix = one(audit(raw, desired()), "nnal-mismatch").fix
    assert "switch NNAL's latest to the installed NNAL 8.5.0" in fix


def test_other_cann_active_and_desired_missing():
    report = audit(host_raw("25.5.0", ("8.3.RC2",)), desired())
    assert "8.3.RC2 active, 8.5.0 wanted" in one(report, "cann-drift").sentence


@pytest.mark.parametrize(("stack", "severity"), [(desired(), "error"), (None, "warning")])
def test_missing_kernels_and_nnal(stack, severity):
    report = audit(host_raw(kernels=False, nnal=False), stack)
    assert one(report, "kernels-missing").severity == severity
    nnal = one(report, "nnal-missing")
    assert nnal.severity == severity and "libatb.so" in nnal.sentence
    assert report.to_dict()["versions"]["kernels"] is None


def test_nnal_of_another_cann():
    raw = host_raw("25.5.0", ("8.5.0",))
    raw["files"]["nnal_version_info"] = host_raw("24.1.rc3", ("8.0.0",))["files"]["nnal_version_info"]
    finding = one(audit(raw, desired()), "nnal-mismatch")
    assert "8.0.0" in finding.sentence and "8.5.0" in finding.sentence


def test_env_drift_missing_changed_and_extra():
    env = {**ENV_EXPECTED, "TASK_QUEUE_ENABLE": "2", "OMP_NUM_THREADS": "1"}
    del env["HCCL_OP_EXPANSION_MODE"]
    report = audit(host_raw(env=env), desired())
    assert report.status == "error"
    assert "HCCL_OP_EXPANSION_MODE" in one(report, "env-missing-variable").sentence
    changed = one(report, "env-changed")
    assert "TASK_QUEUE_ENABLE" in changed.sentence and "'2'" in changed.sentence and "'1'" in changed.sentence
    extra = one(report, "env-extra")
    assert extra.severity == "warning" and "OMP_NUM_THREADS" in extra.sentence
    assert {f.component for f in report.findings} == {"env"}


def test_env_not_checked_without_expectations():
    assert audit(host_raw(env={"X": "1"}), desired(), env=None).status == "ok"


def test_serving_pin_drift_compares_normalised_names():
    # vllm built from source reports 0.13.0+empty: PEP 440 says it meets the pin 0.13.0 (no drift).
    packages = {"Torch": "2.8.0", "torch_npu": "2.8.0.post1", "vllm": "0.13.0+empty", "Triton-Ascend": "3.2.0"}
    report = audit(host_raw(packages=packages), desired())
    drift = [f for f in report.findings if f.code == "serving-pin-drift"]
    assert len(drift) == 2 and all(f.component == "serving" and f.severity == "error" for f in drift)
    sentences = " ".join(f.sentence for f in drift)
    assert "torch-npu 2.8.0.post1" in sentences and "2.8.0.post2 wanted" in sentences
    assert "vllm-ascend is not installed" in sentences


def test_serving_python_outside_the_matrix_row():
    raw = host_raw()
    raw["serving"]["python"] = "3.12.1"
    finding = one(audit(raw, desired()), "serving-python")
    assert "3.12.1" in finding.sentence and ">=3.10,<3.12" in finding.sentence


def test_no_serving_checks_without_pins():
    assert audit(host_raw(packages={}), desired(vllm_ascend=None)).status == "ok"


# --------------------------------------------------------------------------- NPUs and host


def test_npu_count_differs_from_the_inventory():
    report = audit(host_raw(npus=7), desired())
    finding = one(report, "npu-count")
    assert finding.severity == "error" and "7 NPUs visible" in finding.sentence and "8 expected" in finding.sentence


@pytest.mark.parametrize(("health", "severity", "status"), [("Critical", "error", "error"),
                                                            ("Warning", "warning", "warning")])
def test_unhealthy_chip(health, severity, status):
    report = audit(host_raw(health={3: health}), desired())
    finding = one(report, "npu-unhealthy")
    assert (finding.severity, finding.component) == (severity, "npu")
    assert "NPU 3" in finding.sentence and health in finding.sentence
    assert report.status == status
    assert report.to_dict()["npus"]["unhealthy"] == [{"npu": 3, "chip": 0, "health": health}]


def test_board_nok_is_an_error_naming_the_npu():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_raw(hdk("25.5.0")["driver"], "7.8.0.5.216", compatibility={5: "NOK"})
    report = audit(raw, desired())
    assert report.status == "error" and "NPU 5" in one(report, "board-incompatible").sentence


def test_device_held_by_a_container_is_an_npu_smi_error():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_failed(DEVICE_BUSY)
    finding = one(audit(raw, desired()), "npu-smi-error")
    assert finding.severity == "error" and "-8020" in finding.sentence and "container" in finding.fix


def test_busy_npus_and_hbm_are_reported_without_changing_the_status():
    raw = host_raw()
    processes = (npusmi.NpuProcess(npu_id=2, chip_id=0, pid=1333928, name="VLLMEngineCore", memory_mb=37709),)
    raw["npu_smi"] = npu_smi_raw(hdk("25.5.0")["driver"], "7.8.0.5.216", processes=processes)
    report = audit(raw, desired())
    busy = one(report, "npu-busy")
    assert busy.severity == "info" and "NPU 2" in busy.sentence and "41117/65536" in busy.sentence
    assert report.status == "ok"


def test_chip_with_less_hbm_than_its_siblings():
    raw = host_raw()
    table = raw["npu_smi"]["info"]["stdout"].splitlines()
    # NPU 6's second row (rows start after the 6 header lines; 3 lines per chip).
    row = 6 + 3 * 6 + 1
    table[row] = table[row].replace("/ 65536", "/ 32768")
    raw["npu_smi"]["info"]["stdout"] = "\n".join(table) + "\n"
    finding = one(audit(raw, desired()), "hbm-size")
    assert finding.severity == "warning" and "NPU 6" in finding.sentence


def test_mixed_firmware_is_a_warning():
    raw = host_raw()
    raw["npu_smi"]["boards"]["7"]["stdout"] = raw["npu_smi"]["boards"]["7"]["stdout"].replace(
        "7.8.0.5.216", "7.8.0.5.208"
    )
    finding = one(audit(raw, desired()), "firmware-mixed")
    assert "7.8.0.5.208 on NPU 7" in finding.sentence and "NPUs 0-6" in finding.sentence


def test_run_user_missing():
    raw = host_raw()
    raw["run_user"] = {"name": "HwHiAiUser", "exists": False, "group_exists": False}
    report = audit(raw, desired())
    assert {"run-user-missing", "run-group-missing"} <= set(codes(report, "error"))
    assert "HwHiAiUser" in one(report, "run-user-missing").sentence


def test_install_record_without_the_driver_path():
    raw = host_raw()
    raw["files"]["ascend_install_info"] = None
    assert one(audit(raw, desired()), "install-record").severity == "warning"


def test_truncated_npu_smi_output_is_a_warning_finding():
    raw = host_raw()
    raw["npu_smi"]["info"]["stdout"] = "\n".join(raw["npu_smi"]["info"]["stdout"].splitlines()[:20]) + "\n"
    report = audit(raw, desired())
    assert "unreadable-facts" in codes(report, "warning")
    assert one(report, "npu-count").severity == "error"  # the cut-off chips are not counted


# --------------------------------------------------------------------------- status and fleet


@pytest.mark.parametrize(
    ("severities", "pending", "status"),
    [
        ([], False, "ok"),
        (["info"], False, "ok"),
        (["warning", "info"], False, "warning"),
        (["warning"], True, "pending-reboot"),
        (["error", "warning"], True, "error"),
    ],
)
def test_overall_status(severities, pending, status):
    findings = [Finding(severity, "system", "s.", "f.") for severity in severities]
    assert overall_status(findings, pending) == status


def test_fleet_summary_counts_and_exit():
    reports = {
        "lab-01": audit(host_raw(), desired()),
        "lab-02": audit(host_raw("25.5.0", ("8.5.0",), running_hdk="24.1.rc3"), desired()),
        "lab-03": audit(host_raw(health={1: "Warning"}), desired()),
    }
    summary = fleet_summary(reports)
    assert summary["counts"] == {"ok": 1, "warning": 1, "pending-reboot": 1, "error": 0}
    assert summary["hosts"]["pending-reboot"] == ["lab-02"]
    assert summary["worst"] == "pending-reboot" and summary["exit_worthy"] is True
    assert summary["total"] == 3
    json.dumps(summary)


def test_fleet_of_ok_and_warning_hosts_is_not_exit_worthy():
    reports = {"a": audit(host_raw(), desired()), "b": audit(host_raw(health={0: "Warning"}), desired())}
    assert fleet_summary(reports)["exit_worthy"] is False
    assert fleet_summary({}) == {"total": 0, "counts": dict.fromkeys(("ok", "warning", "pending-reboot", "error"), 0),
                                 "hosts": {s: [] for s in ("ok", "warning", "pending-reboot", "error")},
                                 "worst": "ok", "exit_worthy": False}


@pytest.mark.parametrize(
    ("version", "specifier", "ok"),
    [
        ("3.11.2", ">=3.10,<3.12", True),
        ("3.12.1", ">=3.10,<3.12", False),
        ("3.9.18", ">=3.10,<3.13", False),
        ("3.11.2", "==3.11.*", True),
        ("3.10.0", "~=3.10", True),
        ("3.11.2", "weird", True),
        ("3.11.2", ">=3.10, weird, <3.11", False),  # unreadable clauses are skipped, the others still count
        ("3.12.0", "!=3.12.*", False),
        ("3.13.0rc1", ">=3.10,<3.14", True),  # a pre-release interpreter is judged by its numbers
        ("3.12.0rc1", ">=3.10,<3.12", False),  # PEP 440: <3.12 excludes 3.12's own pre-releases
        ("3.11", ">=3.11.0", True),
        ("not a version", ">=3.10", True),
    ],
)
def test_python_satisfies(version, specifier, ok):
    assert python_satisfies(version, specifier) is ok


def test_pins_fixture_matches_the_matrix_row():
    # Guards the test data: the healthy host's venv is exactly the v0.13.0 row.
    assert desired().pip_pins == SERVING_PINS


def test_versions_are_the_same_release_in_any_spelling():
    stack = dataclasses.replace(desired("25.3.rc1", "8.3.RC2", "v0.11.0"), cann="8.3.rc2", driver="25.3.RC1")
    raw = host_raw("25.3.rc1", ("8.3.RC2",), packages=stack.pip_pins)
    report = audit(raw, stack)
    assert not [code for code in codes(report, "error")], report.findings


def test_an_instance_whose_process_maps_another_cann_than_the_active_one_is_an_error_naming_the_fix():
    from dsctl.core.fleet.audit import instance_findings

    instances = [{"name": "chat-0", "pid": 4242, "cann": ["8.5.0"]},
                 {"name": "chat-1", "pid": 4243, "cann": ["8.3.RC2"]}, {"name": "chat-2", "pid": None, "cann": []}]
    found = instance_findings("lab-01", "inv.yml", instances, "8.3.rc2")
    assert [(f.severity, f.code) for f in found] == [("error", "instance-stale-stack")]
    assert found[0].sentence == ("Instance chat-0 (pid 4242) runs on CANN 8.5.0, but CANN 8.3.rc2 is active: it was "
                                 "started before latest/ was switched.")
    assert found[0].fix == "Restart it onto the active stack: dsctl deploy inv.yml --restart --limit lab-01."
    assert instance_findings("lab-01", "inv.yml", instances[1:], "8.3.RC2") == []
