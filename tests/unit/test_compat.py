"""file_compatibility: ascend-interfaces.md section 8 on the installed files, plus the boards' verdict."""

from __future__ import annotations

import pytest

from dsctl.core.fleet.compat import Finding, describe_npus, describe_trains, file_compatibility
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.hoststate import parse_host
from tests.unit.test_hoststate import bare_raw, hdk, host_raw, npu_smi_raw

# ascend-interfaces.md 4.1, verbatim (itove/ascend docs/src/ver-2.1.md): the driver of the field failure.
DRIVER_24_1_RC2_2 = """\
Version=24.1.rc2.2
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=V100R001C18SPC001B233
compatible_version=[V100R001C30],[V100R001C13],[V100R001C15],[V100R001C17],[V100R001C18]
compatible_version_fw=[7.0.0,7.2.99]
package_version=24.1.rc2.2
"""


def firmware_7_3_0_1_231() -> dict:
    """Firmware 7.3.0.1.231 (HDK 24.1.rc2, section 9.1) in the shape of the 24.1.rc3 firmware entry;
    no public version.info of it exists, so only its version and HDK differ from the observed file."""
    return {**hdk("24.1.rc3")["firmware"], "version": "7.3.0.1.231", "package_version": "24.1.rc2"}


def field_failure_raw() -> dict:
    """Section 14 item 6: driver 24.1.rc2.2 with firmware 7.3.0.1.231, rebooted (both running)."""
    raw = host_raw("24.1.rc3", ("8.0.0",))
    driver = {"version": "24.1.rc2.2", "compatible_version_fw": vf.parse_ranges("[7.0.0,7.2.99]")}
    raw["files"]["driver_version_info"] = DRIVER_24_1_RC2_2
    raw["files"]["firmware_version_info"] = vf.render_firmware_version_info(firmware_7_3_0_1_231())
    raw["npu_smi"] = npu_smi_raw(driver, "7.3.0.1.231")
    return raw


def findings_of(raw: dict) -> list[Finding]:
    return file_compatibility(parse_host(raw))


def only(findings: list[Finding], code: str) -> Finding:
    matching = [finding for finding in findings if finding.code == code]
    assert len(matching) == 1, findings
    return matching[0]


def test_a_matching_stack_has_no_findings():
    assert findings_of(host_raw("25.5.0", ("8.5.0",))) == []


def test_observed_pair_24_1_rc3_with_cann_8_0_0_is_only_a_warning():
    findings = findings_of(host_raw("24.1.rc3", ("8.0.0",)))
    assert [(f.severity, f.component) for f in findings] == [("warning", "driver")]
    sentence = findings[0].sentence
    assert "24.1.rc3" in sentence and "8.0.0" in sentence and "C20" in sentence
    assert "C13, C15, C17..C19" in sentence


def test_cann_8_5_0_refuses_driver_24_1_rc3():
    findings = findings_of(host_raw("24.1.rc3", ("8.5.0",)))
    error = only(findings, "cann-rejects-driver")
    assert (error.severity, error.component) == ("error", "cann")
    for fact in ("CANN 8.5.0", "C25", "24.1.rc3", "C19", "C21..C25"):
        assert fact in error.sentence
    assert "C19" in error.fix
    assert only(findings, "driver-does-not-list-cann").severity == "warning"


def test_field_failure_firmware_outside_the_driver_range():
    findings = findings_of(field_failure_raw())
    error = only(findings, "firmware-outside-driver-range")
    assert (error.severity, error.component) == ("error", "firmware")
    for fact in ("7.3.0.1.231", "24.1.rc2.2", "[7.0.0,7.2.99]"):
        assert fact in error.sentence
    # The emulated driver reaches the same verdict at runtime: every board says NOK.
    board = only(findings, "board-incompatible")
    assert board.component == "npu" and "NOK" in board.sentence and "NPUs 0-7" in board.sentence


def test_driver_outside_the_firmware_prefix_ranges():
    raw = host_raw("25.5.0", ("8.5.0",))
    raw["files"]["firmware_version_info"] = vf.render_firmware_version_info(hdk("24.1.rc3")["firmware"])
    raw["npu_smi"] = npu_smi_raw(hdk("25.5.0")["driver"], "7.5.0.1.129")
    findings = findings_of(raw)
    error = only(findings, "driver-outside-firmware-range")
    assert (error.severity, error.component) == ("error", "driver")
    assert "25.5.0" in error.sentence and "7.5.0.1.129" in error.sentence and "[24.1,24.1.]" in error.sentence
    assert [f.code for f in findings] == ["driver-outside-firmware-range"]


def test_board_nok_names_the_npus():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_raw(hdk("25.5.0")["driver"], "7.8.0.5.216", compatibility={2: "NOK", 6: "UNKNOWN"})
    findings = findings_of(raw)
    by_sentence = {f.sentence.split(" report")[0]: f for f in findings}
    assert set(by_sentence) == {"NPU 2", "NPU 6"}
    assert all(f.severity == "error" and f.component == "npu" for f in findings)
    assert "NOK" in by_sentence["NPU 2"].sentence and "UNKNOWN" in by_sentence["NPU 6"].sentence


def test_board_verdict_is_skipped_while_a_reboot_is_pending():
    raw = host_raw("25.5.0", ("8.5.0",), running_hdk="24.1.rc3")
    raw["npu_smi"] = npu_smi_raw(hdk("24.1.rc3")["driver"], "7.5.0.1.129", compatibility=dict.fromkeys(range(8), "NOK"))
    findings = findings_of(raw)
    assert [(f.severity, f.code) for f in findings] == [("info", "board-check-deferred")]


def test_missing_train_is_reported_as_unknown_not_as_a_failure():
    raw = host_raw("25.5.0", ("8.5.0",))
    raw["files"]["driver_version_info"] = raw["files"]["driver_version_info"].replace(
        "Innerversion=V100R001C25SPC001B216\n", ""
    )
    findings = findings_of(raw)
    assert [(f.severity, f.code) for f in findings] == [("info", "train-unknown")]


def test_nothing_to_pair_on_a_bare_host():
    assert findings_of(bare_raw()) == []


# ascend-interfaces.md section 8, "Worked examples from the samples above".
WORKED_EXAMPLES = [
    # driver HDK, CANN, codes expected
    ("24.1.rc3", "8.0.0", ["driver-does-not-list-cann"]),
    ("24.1.rc3", "8.3.RC2", ["driver-does-not-list-cann"]),  # CANN lists C19; the driver's list stops at C19
    ("25.3.rc1", "8.3.RC2", []),  # both lists contain the other's train
]


@pytest.mark.parametrize(("hdk_version", "cann_version", "codes"), WORKED_EXAMPLES)
def test_worked_examples(hdk_version, cann_version, codes):
    assert [f.code for f in findings_of(host_raw(hdk_version, (cann_version,)))] == codes


@pytest.mark.parametrize(
    ("trains", "text"),
    [
        (("C13", "C15", "C17", "C18", "C19"), "C13, C15, C17..C19"),
        (("C30", "C13", "C15", "C17", "C18"), "C13, C15, C17..C18, C30"),
        (("C21",), "C21"),
        ((), ""),
    ],
)
def test_describe_trains(trains, text):
    assert describe_trains(trains) == text


@pytest.mark.parametrize(
    ("ids", "text"), [([4], "NPU 4"), ([0, 1, 2, 3, 5], "NPUs 0-3, 5"), ([7, 6, 0], "NPUs 0, 6-7")]
)
def test_describe_npus(ids, text):
    assert describe_npus(ids) == text


def test_finding_to_dict_has_the_report_keys():
    finding = Finding("error", "cann", "A sentence.", "A fix.", "code")
    assert finding.to_dict() == {
        "severity": "error", "component": "cann", "sentence": "A sentence.", "fix": "A fix.", "code": "code"
    }
