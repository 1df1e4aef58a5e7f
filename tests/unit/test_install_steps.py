"""plan_install_steps: install / upgrade / switch / none per package, in the vendor's order (hosts from the
lab's own renderers, stacks from releases.yaml)."""

from __future__ import annotations

import dataclasses

import pytest

from dsctl.core.fleet.install_steps import (
    by_component,
    cann_switch_only,
    describe,
    downgrades,
    packages_needed,
    plan_install_steps,
    switched_version_cfg,
)
from dsctl.core.fleet.stack import serving_venv_name
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.hoststate import parse_host
from tests.unit.test_audit import desired
from tests.unit.test_hoststate import bare_raw, host_raw, version_cfg


def steps_of(raw: dict, stack=None):
    return plan_install_steps(stack or desired(), parse_host(raw))


def actions(steps) -> dict[str, str]:
    return {step.component: step.action for step in steps}


def side_by_side(active: str, other: str, *, other_kernels: bool = True, other_nnal: bool = True) -> dict:
    """HDK 25.3.rc1 with CANN ``active`` and ``other`` installed, ``active`` behind latest/."""
    raw = host_raw("25.3.rc1", (other, active), active=active)
    raw["kernels_dirs"] = {active: True, other: other_kernels}
    raw["nnal_dirs"] = {active: True, **({other: True} if other_nnal else {})}
    return raw


def test_bare_host_installs_everything_driver_before_firmware():
    steps = steps_of(bare_raw())
    assert [step.component for step in steps] == ["driver", "firmware", "toolkit", "kernels", "nnal"]
    assert set(actions(steps).values()) == {"install"}
    stack = desired()
    assert packages_needed(steps) == [stack.driver_run, stack.firmware_run, stack.toolkit_run, stack.kernels_run,
                                      stack.nnal_run]


def test_provisioned_host_needs_nothing():
    steps = steps_of(host_raw())
    assert set(actions(steps).values()) == {"none"}
    assert packages_needed(steps) == [] and describe(steps) == "change nothing"


def test_installed_hdk_upgrades_firmware_before_driver():
    steps = steps_of(host_raw("24.1.rc3", ("8.0.0",)))
    assert [step.component for step in steps][:2] == ["firmware", "driver"]
    hdk = by_component(steps)
    assert hdk["driver"].action == "upgrade" and hdk["driver"].current == "24.1.rc3"
    assert "newer 25.5.0" in hdk["driver"].reason
    assert hdk["firmware"].action == "upgrade"
    assert actions(steps)["toolkit"] == "install" and actions(steps)["nnal"] == "install"


def test_going_back_to_an_older_driver_is_an_upgrade_run_saying_older():
    step = by_component(steps_of(host_raw("25.5.0", ("8.5.0",)), desired("25.3.rc1")))["driver"]
    assert step.action == "upgrade" and "older 25.3.rc1" in step.reason


def driver_only(hdk_version: str = "25.5.0") -> dict:
    """The firmware package uninstalled (its files and upgrade record gone); the chips still run a firmware."""
    raw = host_raw(hdk_version, ("8.5.0",))
    raw["files"]["firmware_version_info"] = None
    raw["firmware_record"] = None
    return raw


def firmware_only(hdk_version: str = "25.5.0") -> dict:
    """The driver package uninstalled: no driver files, no upgrade-tool, no npu-smi; the firmware's stay."""
    raw = host_raw(hdk_version, ("8.5.0",))
    raw["files"]["driver_version_info"] = None
    raw["upgrade_tool"] = None
    raw["npu_smi"] = {"path": None, "info": None, "boards": {}}
    return raw


def hdk_steps(raw: dict, stack=None) -> list[tuple[str, str]]:
    return [(step.component, step.action) for step in steps_of(raw, stack)[:2]]


def test_driver_only_host_gets_the_firmware_with_full_first_though_a_driver_exists():
    assert hdk_steps(driver_only()) == [("firmware", "install"), ("driver", "none")]
    assert hdk_steps(driver_only("24.1.rc3")) == [("firmware", "install"), ("driver", "upgrade")]
    firmware = by_component(steps_of(driver_only()))["firmware"]
    assert "no upgrade record" in firmware.reason and "--full" in firmware.reason
    assert packages_needed(steps_of(driver_only())) == [desired().firmware_run]


def test_firmware_only_host_gets_the_driver_first_and_upgrades_the_firmware_by_its_record():
    assert hdk_steps(firmware_only()) == [("driver", "install"), ("firmware", "none")]
    assert hdk_steps(firmware_only("24.1.rc3")) == [("driver", "install"), ("firmware", "upgrade")]


def test_both_installed_upgrade_firmware_then_driver_and_neither_installs_driver_then_firmware():
    assert hdk_steps(host_raw("24.1.rc3", ("8.0.0",))) == [("firmware", "upgrade"), ("driver", "upgrade")]
    assert hdk_steps(host_raw()) == [("firmware", "none"), ("driver", "none")]
    assert hdk_steps(bare_raw()) == [("driver", "install"), ("firmware", "install")]


def test_the_upgrade_record_not_the_version_file_decides_between_full_and_upgrade():
    # A version file without the record (a half-removed package): --full, as ascend-deployer would run.
    raw = host_raw("24.1.rc3", ("8.0.0",))
    raw["firmware_record"] = None
    firmware = by_component(steps_of(raw))["firmware"]
    assert firmware.action == "install" and firmware.current == "7.5.0.1.129"
    assert "names 7.5.0.1.129 but the firmware has no upgrade record" in firmware.reason
    # The record without a version file: still an installed firmware, so --upgrade.
    raw = host_raw("24.1.rc3", ("8.0.0",))
    raw["files"]["firmware_version_info"] = None
    firmware = by_component(steps_of(raw))["firmware"]
    assert firmware.action == "upgrade" and firmware.current is None and "upgrade record" in firmware.reason
    # A collector without the key: the version file stands in for the record.
    raw = host_raw("24.1.rc3", ("8.0.0",))
    del raw["firmware_record"]
    assert by_component(steps_of(raw))["firmware"].action == "upgrade"
    assert parse_host(raw).firmware.upgrade_record == "/usr/local/Ascend/firmware/version.info"
    assert parse_host(driver_only()).firmware.upgrade_record is None


def test_versions_compare_case_insensitively_like_the_rest_of_dsctl():
    # The host spells the release 8.3.RC2; a stack asking for "8.3.rc2" is the same release: nothing to do.
    stack = dataclasses.replace(desired("25.3.rc1", "8.3.RC2", "v0.11.0"), cann="8.3.rc2", driver="25.3.RC1")
    steps = steps_of(host_raw("25.3.rc1", ("8.3.RC2",)), stack)
    assert set(actions(steps).values()) == {"none"}, steps


def test_installed_side_by_side_is_a_switch_to_the_hosts_spelling_with_no_installer():
    stack = dataclasses.replace(desired("25.3.rc1", "8.3.RC2", "v0.11.0"), cann="8.3.rc2")
    steps = steps_of(side_by_side("8.5.0", "8.3.RC2"), stack)
    parts = by_component(steps)
    assert {name: parts[name].action for name in ("toolkit", "kernels", "nnal")} == {
        "toolkit": "switch", "kernels": "switch", "nnal": "switch"}
    assert {parts[name].target for name in ("toolkit", "kernels", "nnal")} == {"8.3.RC2"}
    assert parts["toolkit"].current == "8.5.0"
    assert packages_needed(steps) == [] and cann_switch_only(steps)
    assert describe(steps) == ("switch latest/ to the installed CANN 8.3.RC2 and NNAL's latest to its NNAL "
                               "without running an installer")


def test_switch_then_install_the_parts_the_other_version_lacks():
    stack = desired("25.3.rc1", "8.3.RC2", "v0.11.0")
    steps = steps_of(side_by_side("8.5.0", "8.3.RC2", other_kernels=False, other_nnal=False), stack)
    assert {k: v for k, v in actions(steps).items() if k in ("toolkit", "kernels", "nnal")} == {
        "toolkit": "switch", "kernels": "install", "nnal": "install"}
    assert packages_needed(steps) == [stack.kernels_run, stack.nnal_run]
    assert not cann_switch_only(steps)
    assert describe(steps) == ("switch latest/ to the installed CANN 8.3.RC2, install kernels/ops 8.3.RC2, "
                               "install NNAL 8.3.RC2")


def test_only_nnal_points_elsewhere():
    raw = host_raw("25.5.0", ("8.5.0",))
    raw["files"]["nnal_version_info"] = host_raw("25.3.rc1", ("8.3.RC2",))["files"]["nnal_version_info"]
    raw["nnal_dirs"] = {"8.3.RC2": True, "8.5.0": True}
    steps = by_component(steps_of(raw))
    assert steps["toolkit"].action == "none" and steps["nnal"].action == "switch"
    assert steps["nnal"].target == "8.5.0" and steps["nnal"].current == "8.3.RC2"
    assert describe(steps.values()) == "switch NNAL's latest to the installed NNAL 8.5.0 without running an installer"


def test_a_new_cann_is_installed_with_the_old_one_kept():
    steps = by_component(steps_of(host_raw("25.5.0", ("8.3.RC2",)), desired()))
    assert steps["toolkit"].action == "install" and steps["toolkit"].current == "8.3.RC2"
    assert "CANN 8.3.RC2 is active, 8.5.0 wanted" in steps["toolkit"].reason


def test_steps_serialise_with_runs_installer():
    step = steps_of(bare_raw())[0].to_dict()
    assert step["runs_installer"] is True and step["package"].startswith("Ascend-hdk-910b-npu-driver")
    assert set(step) == {"component", "action", "wanted", "target", "current", "package", "reason",
                         "runs_installer"}


@pytest.mark.parametrize("kernels_in_target", [True, False])
def test_switched_version_cfg_moves_running_and_keeps_every_installed(kernels_in_target):
    text = version_cfg(["8.3.RC2", "8.5.0"], "8.5.0", ["8.3.RC2", "8.5.0"] if kernels_in_target else ["8.5.0"])
    switched = vf.parse_version_cfg(switched_version_cfg(text, "8.3.rc2"))
    before = vf.parse_version_cfg(text)
    assert vf.version_cfg_running(switched)[1] == "8.3.RC2"
    assert {name: entry["installed"] for name, entry in switched.items()} == {
        name: entry["installed"] for name, entry in before.items()}
    kernels = vf.version_cfg_running(switched, vf.KERNELS_CFG_COMPONENT)
    assert (kernels[1] if kernels else None) == ("8.3.RC2" if kernels_in_target else None)
    # and back again: the original file
    assert switched_version_cfg(switched_version_cfg(text, "8.3.RC2"), "8.5.0") == vf.render_version_cfg(before)


def test_serving_venv_name_is_one_per_pin_set():
    a = desired("25.3.rc1", "8.3.RC2", "v0.11.0").pip_pins
    b = desired().pip_pins
    assert serving_venv_name(a).startswith("vllm-ascend-0.11.0-") and serving_venv_name(b).startswith(
        "vllm-ascend-0.13.0-")
    # stable across spellings of the same names, different for any other pin
    assert serving_venv_name({name.replace("-", "_").upper(): v for name, v in a.items()}) == serving_venv_name(a)
    assert serving_venv_name({**a, "torch-npu": "2.7.1.post2"}) != serving_venv_name(a)
    assert serving_venv_name({}).startswith("stack-")


def test_a_stack_older_than_the_host_runs_is_named_as_a_downgrade_part_by_part():
    """After dsctl upgrade moved the host to 8.5.0 / v0.13.0, an inventory still naming 8.3.RC2 / v0.11.0 (issue 20):
    the CANN switch back and the serving stack's older vllm-ascend are downgrades; the same stack is none."""
    older = desired("25.5.0", "8.3.RC2", "v0.11.0")
    raw = side_by_side("8.5.0", "8.3.RC2")
    raw["serving"]["packages"] = {**raw["serving"]["packages"], "vllm-ascend": "0.13.0"}
    state = parse_host(raw)
    steps = plan_install_steps(older, state)
    assert downgrades(steps, older, state) == ["CANN 8.5.0 -> 8.3.RC2", "vllm-ascend 0.13.0 -> 0.11.0"]
    newer = desired("25.5.0", "8.5.0", "v0.13.0")
    assert downgrades(plan_install_steps(newer, state), newer, state) == []


def test_an_upgrade_and_a_fresh_install_are_not_downgrades():
    stack = desired()
    for raw in (bare_raw(), host_raw("24.1.rc3", ("8.0.0",), packages={"vllm-ascend": "0.9.1"})):
        state = parse_host(raw)
        assert downgrades(plan_install_steps(stack, state), stack, state) == []


def test_an_older_driver_is_a_downgrade():
    stack = desired("25.3.rc1", "8.5.0", "v0.13.0")
    state = parse_host(host_raw("25.5.0", ("8.5.0",), packages={"vllm-ascend": "0.13.0"}))
    found = downgrades(plan_install_steps(stack, state), stack, state)
    assert found[1] == "driver 25.5.0 -> 25.3.rc1" and found[0].startswith("firmware ") and len(found) == 2
