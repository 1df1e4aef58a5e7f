"""Stack resolution and compatibility verdicts from releases.yaml (dsctl.core.fleet.matrix)."""

from __future__ import annotations

import copy

import pytest

from dsctl import data
from dsctl.core.fleet.matrix import INFERRED_STATUS, StackError, check_pair, check_serving, matrix_rows, resolve_stack
from dsctl.core.fleet.stack import DesiredStack
from dsctl.errors import ExitStatus
from dsctl.lab import wheelhouse
from dsctl.lab.packages import package_specs


@pytest.fixture(scope="module")
def releases() -> dict:
    return data.load("releases")


def refusal(releases, **versions) -> StackError:
    with pytest.raises(StackError) as raised:
        resolve_stack(releases, **versions)
    message = str(raised.value)
    assert "\n" not in message
    return raised.value


# --------------------------------------------------------------------------- the default stack


def test_the_default_stack_is_the_vllm_ascend_v0_13_0_set(releases):
    stack = resolve_stack(releases)
    versions = (stack.driver, stack.firmware, stack.cann, stack.vllm_ascend)
    assert versions == ("25.5.0", "7.8.0.5.216", "8.5.0", "v0.13.0")
    assert stack.kernels_package == "910b-ops"
    serving = (stack.torch, stack.torch_npu, stack.vllm, stack.python)
    assert serving == ("2.8.0", "2.8.0.post2", "v0.13.0", ">=3.10,<3.12")
    assert stack.pip_pins == {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0", "vllm-ascend": "0.13.0",
                              "triton-ascend": "3.2.0"}
    assert stack.warnings == ()
    # The HDK release and its pairing are observed; nothing weaker is used.
    assert stack.confidence == "observed"
    assert any("installation.md" in source for source in stack.sources)


def test_the_default_stack_names_the_installers_with_an_arch_placeholder(releases):
    stack = resolve_stack(releases)
    assert stack.driver_run == "Ascend-hdk-910b-npu-driver_25.5.0_linux-{arch}.run"
    assert stack.firmware_run == "Ascend-hdk-910b-npu-firmware_7.8.0.5.216.run"
    assert stack.toolkit_run == "Ascend-cann-toolkit_8.5.0_linux-{arch}.run"
    assert stack.kernels_run == "Ascend-cann-910b-ops_8.5.0_linux-{arch}.run"
    assert stack.nnal_run == "Ascend-cann-nnal_8.5.0_linux-{arch}.run"


@pytest.mark.parametrize(
    "versions",
    [{}, {"driver": "25.3.rc1", "cann": "8.3.RC2", "vllm_ascend": "v0.11.0"},
     {"driver": "24.1.rc3", "cann": "8.0.0", "vllm_ascend": "v0.8.4rc2"}],
)
def test_installer_names_are_the_packages_the_lab_builds(releases, versions):
    stack = resolve_stack(releases, **versions)
    built = {spec.name for spec in package_specs(releases, "aarch64")}
    names = [stack.driver_run, stack.firmware_run, stack.toolkit_run, stack.kernels_run, stack.nnal_run]
    assert {name.replace("{arch}", "aarch64") for name in names} <= built


def test_pins_are_the_normalized_pep_440_versions_the_wheelhouse_names_its_files_with(releases):
    edited = copy.deepcopy(releases)
    row = next(r for r in edited["vllm_ascend_matrix"] if r["vllm_ascend"] == "v0.13.0")
    row.update({"vllm_ascend": "V0.13.0", "torch_npu": "2.8.0-Post2", "vllm": "v0.13.0.0"})
    stack = resolve_stack(edited, vllm_ascend="v0.13.0")  # found whatever the case of the tag
    assert stack.vllm_ascend == "V0.13.0"
    assert stack.pip_pins == {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0.0", "vllm-ascend": "0.13.0",
                              "triton-ascend": "3.2.0"}
    assert all(wheelhouse.normalize_version(version) == version for version in stack.pip_pins.values())


def test_the_stack_round_trips_through_a_dict(releases):
    stack = resolve_stack(releases)
    assert DesiredStack.from_dict(stack.to_dict()) == stack


def test_cann_8_3_uses_the_old_kernels_package(releases):
    stack = resolve_stack(releases, driver="25.3.rc1", cann="8.3.RC2", vllm_ascend="v0.13.0rc1")
    assert stack.kernels_package == "kernels-910b"
    assert stack.kernels_run == "Ascend-cann-kernels-910b_8.3.RC2_linux-{arch}.run"
    assert stack.pip_pins == {"torch": "2.8.0", "torch-npu": "2.8.0", "vllm": "0.13.0", "vllm-ascend": "0.13.0rc1"}
    # Neither official nor observed: only the version files vouch for 25.3.rc1 + 8.3.RC2.
    assert stack.confidence == "inferred"


def test_firmware_follows_the_chosen_driver(releases):
    assert resolve_stack(releases, driver="25.3.rc1").firmware == "7.8.0.2.212"


def test_versions_are_matched_case_insensitively_and_spelled_as_the_data_does(releases):
    stack = resolve_stack(releases, driver="24.1.RC3", cann="8.0.0", vllm_ascend="0.8.4rc2")
    assert (stack.driver, stack.vllm_ascend) == ("24.1.rc3", "v0.8.4rc2")


def test_none_skips_the_serving_stack(releases):
    stack = resolve_stack(releases, vllm_ascend="none")
    assert (stack.vllm_ascend, stack.vllm, stack.torch, stack.torch_npu, stack.python) == (None,) * 5
    assert stack.pip_pins == {}
    assert stack.cann == "8.5.0"


# --------------------------------------------------------------------------- driver <-> CANN trains


def test_cann_8_5_refuses_driver_24_1_and_says_it_is_the_cann_side(releases):
    error = refusal(releases, driver="24.1.rc3", cann="8.5.0")
    message = str(error)
    assert error.exit_status == ExitStatus.VALIDATION_FAILED
    assert message.startswith("dsctl_cann_version: CANN 8.5.0 refuses driver 24.1.rc3 (CANN side")
    assert "C19" in message
    assert 'dsctl_cann_version: "8.0.0"' in message  # the CANN that does accept 24.1.rc3


def test_driver_24_1_rc3_with_cann_8_0_0_is_accepted_with_a_warning(releases):
    stack = resolve_stack(releases, driver="24.1.rc3", cann="8.0.0", vllm_ascend="v0.8.4rc2")
    assert (stack.firmware, stack.kernels_package) == ("7.5.0.1.129", "kernels-910b")
    assert stack.pip_pins == {"torch": "2.5.1", "torch-npu": "2.5.1", "vllm": "0.8.4", "vllm-ascend": "0.8.4rc2"}
    assert len(stack.warnings) == 1
    assert "C20" in stack.warnings[0] and "observed working" in stack.warnings[0]
    assert stack.confidence == "observed"
    assert any("vllm-ascend#451" in source for source in stack.sources)


def test_driver_24_1_rc3_with_cann_8_3_is_refused_on_the_driver_side(releases):
    message = str(refusal(releases, driver="24.1.rc3", cann="8.3.RC2", vllm_ascend="v0.11.0"))
    assert message.startswith("dsctl_driver_version: driver 24.1.rc3 refuses CANN 8.3.RC2 (driver side")
    assert "neither official nor observed" in message
    assert 'dsctl_driver_version: "25.3.rc1"' in message


def test_the_driver_side_miss_is_refused_without_a_pairing(releases):
    unobserved = copy.deepcopy(releases)
    unobserved["observed_pairings"] = [p for p in unobserved["observed_pairings"] if p["driver"] != "24.1.rc3"]
    message = str(refusal(unobserved, driver="24.1.rc3", cann="8.0.0", vllm_ascend="v0.8.4rc2"))
    assert message.startswith("dsctl_driver_version: driver 24.1.rc3 refuses CANN 8.0.0 (driver side")


# --------------------------------------------------------------------------- driver <-> firmware


def test_firmware_outside_the_driver_range_is_refused(releases):
    error = refusal(releases, driver="24.1.rc3", firmware="7.8.0.5.216", cann="8.0.0", vllm_ascend="v0.8.4rc2")
    message = str(error)
    assert error.exit_status == ExitStatus.VALIDATION_FAILED
    assert message.startswith("dsctl_firmware_version: firmware 7.8.0.5.216 is outside driver 24.1.rc3's "
                              "compatible_version_fw [7.0.0,7.5.99]")
    assert 'dsctl_firmware_version: "7.5.0.1.129"' in message


def test_firmware_of_another_release_is_accepted_when_both_files_agree(releases):
    stack = resolve_stack(releases, driver="25.3.rc1", firmware="7.8.0.5.216")
    assert stack.firmware_run == "Ascend-hdk-910b-npu-firmware_7.8.0.5.216.run"
    assert stack.confidence == "inferred"  # no source pairs 25.3.rc1 with 7.8.0.5.216


def test_a_firmware_whose_driver_list_misses_the_driver_is_refused(releases):
    # 7.8.0.2.212 (HDK 25.3.rc1) lists driver prefixes up to 25.3: an older firmware under a newer driver.
    message = str(refusal(releases, driver="25.5.0", firmware="7.8.0.2.212"))
    assert message.startswith("dsctl_firmware_version: driver 25.5.0 does not match firmware 7.8.0.2.212's "
                              "compatible_version_drv [23.0.0,23.0.0.],")
    assert 'set dsctl_firmware_version: "7.8.0.5.216"' in message


# --------------------------------------------------------------------------- vllm-ascend <-> CANN


def test_vllm_ascend_cann_mismatch_names_the_row_and_the_tag_to_use(releases):
    message = str(refusal(releases, driver="24.1.rc3", cann="8.0.0", vllm_ascend="v0.13.0"))
    assert message == (
        'dsctl_vllm_ascend_version: vllm-ascend v0.13.0 needs CANN 8.5.0 (official matrix row), not 8.0.0; '
        'set dsctl_cann_version: "8.5.0" or pick a vllm-ascend release built for CANN 8.0.0 (v0.8.4rc2)'
    )


def test_a_vllm_ascend_release_for_a_cann_the_data_lacks_is_refused(releases):
    message = str(refusal(releases, vllm_ascend="v0.23.0"))
    assert "needs CANN 9.1.0" in message and "does not carry" in message
    assert "v0.13.0" in message


# --------------------------------------------------------------------------- unknown versions


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ({"cann": "7.7.7"}, "dsctl_cann_version: CANN 7.7.7 is not in the releases data (known: 8.0.0, 8.3.RC2, "
                            "8.5.0); pick one of them"),
        ({"driver": "23.0.3"}, "dsctl_driver_version: driver 23.0.3 is not in the releases data (known: 24.1.rc3, "
                               "25.3.rc1, 25.5.0); pick one of them"),
        ({"firmware": "7.3.0.1.231"}, "dsctl_firmware_version: firmware 7.3.0.1.231 is not in the releases data "
                                      "(known: 7.5.0.1.129, 7.8.0.2.212, 7.8.0.5.216); pick one of them"),
    ],
)
def test_an_unknown_version_lists_the_known_ones(releases, versions, expected):
    error = refusal(releases, **versions)
    assert error.exit_status == ExitStatus.USAGE
    assert str(error) == expected


def test_an_unknown_vllm_ascend_tag_lists_the_installable_ones(releases):
    error = refusal(releases, vllm_ascend="v0.99.0")
    assert error.exit_status == ExitStatus.USAGE
    assert "v0.13.0" in str(error) and "v0.8.4rc2" in str(error) and "none" in str(error)
    assert "v0.23.0" not in str(error)  # built for a CANN the data does not carry


# --------------------------------------------------------------------------- check_pair on installed versions


def test_check_pair_reports_every_check(releases):
    verdicts = {v.check: v for v in check_pair(releases, driver="24.1.rc3", firmware="7.5.0.1.129", cann="8.0.0")}
    assert set(verdicts) == {"driver-accepts-firmware", "firmware-accepts-driver", "cann-accepts-driver",
                             "driver-accepts-cann"}
    assert all(v.ok for name, v in verdicts.items() if name != "driver-accepts-cann")
    warning = verdicts["driver-accepts-cann"]
    assert (warning.ok, warning.severity, warning.warns, warning.refuses) == (False, "warning", True, False)
    assert warning.sources


def test_check_pair_on_an_installed_driver_the_data_lacks(releases):
    verdicts = check_pair(releases, driver="25.5.1", firmware="7.8.0.5.216", cann="8.5.0")
    by_check = {v.check: v for v in verdicts}
    assert by_check["known-driver"].refuses
    # The firmware's own list can still judge the driver; the train checks need the driver's data.
    assert by_check["firmware-accepts-driver"].ok
    assert "cann-accepts-driver" not in by_check


def test_check_serving(releases):
    assert check_serving(releases, cann="8.5.0", vllm_ascend="v0.13.0")[0].ok
    assert check_serving(releases, cann="8.3.RC2", vllm_ascend="v0.13.0")[0].refuses


# --------------------------------------------------------------------------- dsctl matrix


def test_matrix_rows_are_the_passing_combinations(releases):
    rows = matrix_rows(releases)
    combos = {(r["driver"], r["cann"], r["vllm_ascend"]) for r in rows}
    assert ("25.5.0", "8.5.0", "v0.13.0") in combos
    assert ("24.1.rc3", "8.0.0", "v0.8.4rc2") in combos
    assert ("25.3.rc1", "8.3.RC2", "v0.11.0") in combos
    assert not any(d == "24.1.rc3" and c in ("8.3.RC2", "8.5.0") for d, c, _ in combos)
    assert not any(d == "25.5.0" and c != "8.5.0" for d, c, _ in combos)
    for row in rows:
        assert row["vllm_ascend"] in {r["vllm_ascend"] for r in releases["vllm_ascend_matrix"]
                                      if r["cann"] == row["cann"]}


def test_matrix_statuses_and_the_default_mark(releases):
    rows = {(r["driver"], r["cann"], r["vllm_ascend"]): r for r in matrix_rows(releases)}
    default = rows[("25.5.0", "8.5.0", "v0.13.0")]
    assert default["default"] and default["status"] == "official" and default["kernels_package"] == "910b-ops"
    assert (default["torch"], default["torch_npu"]) == ("2.8.0", "2.8.0.post2")
    assert sum(r["default"] for r in rows.values()) == 1
    assert rows[("24.1.rc3", "8.0.0", "v0.8.4rc2")]["status"] == "observed"
    assert rows[("24.1.rc3", "8.0.0", "v0.8.4rc2")]["warnings"]
    assert rows[("25.3.rc1", "8.5.0", "v0.13.0")]["status"] == "observed"
    assert rows[("25.3.rc1", "8.3.RC2", "v0.11.0")]["status"] == INFERRED_STATUS
    assert rows[("25.3.rc1", "8.3.RC2", "v0.11.0")]["kernels_package"] == "kernels-910b"
