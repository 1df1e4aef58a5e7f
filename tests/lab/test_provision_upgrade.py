"""`dsctl provision` / `dsctl check` on lab hosts that start with an old HDK and CANN 8.0.0.

One lab, one story: bad input is refused before any host changes; a tampered package is refused on
the host; a run with an installer fault on lab-02 and a sick chip on lab-03 upgrades lab-01 in the
vendor's order, leaves lab-02's old CANN active and does not touch lab-03; once the faults are mended
a second run finishes the fleet, `check` is clean and a third run changes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from .conftest import bring_up, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

OLD = ("24.1.rc3", "7.5.0.1.129", "8.0.0")
NEW_DRIVER, NEW_FIRMWARE, NEW_CANN = "25.5.0", "7.8.0.5.216", "8.5.0"


@pytest.fixture(scope="module")
def old_lab():
    lab = bring_up("--hosts", "3", "--driver", OLD[0], "--firmware", OLD[1], "--cann", OLD[2])
    yield lab
    dsctl("lab", "down")


def inventory_with(lab, directory: Path, **settings) -> Path:
    """The lab's inventory with some dsctl_* settings added to the npu_nodes group."""
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"].update(settings)
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def versions(lab, host: str) -> tuple[str, str, str]:
    driver = lab.sh_ok(host, "sed -n 's/^Version=//p' /usr/local/Ascend/driver/version.info").strip()
    firmware = lab.sh_ok(host, "sed -n 's/^Version=//p' /usr/local/Ascend/firmware/version.info").strip()
    cann = lab.sh_ok(host, "readlink /usr/local/Ascend/ascend-toolkit/latest/set_env.sh").split("/")[1]
    return driver, firmware, cann


def boots(lab) -> dict[str, int]:
    return {h["name"]: h["boots"] for h in lab.status()["data"]}


def provision(inventory: Path, *args: str):
    result = dsctl("provision", str(inventory), "--json", *args, check=False)
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def test_bad_inventory_values_are_one_line_errors_and_change_nothing(old_lab, tmp_path):
    before = boots(old_lab)
    cases = [
        ({"dsctl_npu_count": "eight"}, 2, "dsctl_npu_count"),
        ({"dsctl_npu_cont": 8}, 2, "dsctl_npu_count"),
        ({"dsctl_ascend_env": {"ASCEND_CACHE_SIZE": 6 * 10**15}}, 2, "ASCEND_CACHE_SIZE"),  # ~6 PB: bounded
        ({"dsctl_ascend_env": {"HCCL_BUFFSIZE": "1G"}}, 2, "HCCL_BUFFSIZE"),
        ({"dsctl_cann_version": "7.7.7"}, 2, "dsctl_cann_version"),
        # an incompatible desired combination: CANN 8.5.0 refuses the 24.1.rc3 driver train
        ({"dsctl_driver_version": "24.1.rc3", "dsctl_firmware_version": "7.5.0.1.129"}, 3, "24.1.rc3"),
    ]
    for settings, code, named in cases:
        result = dsctl("provision", str(inventory_with(old_lab, tmp_path, **settings)), check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code, (settings, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("dsctl: error: inventory") and named in lines[0], lines
    assert boots(old_lab) == before
    assert versions(old_lab, "lab-01") == OLD


def test_a_tampered_installer_is_refused_on_the_host(old_lab, tmp_path):
    source = tmp_path / "packages"
    shutil.copytree(old_lab.paths.packages, source)
    firmware = source / f"Ascend-hdk-910b-npu-firmware_{NEW_FIRMWARE}.run"
    firmware.write_bytes(firmware.read_bytes() + b"\n# tampered\n")
    result, report = provision(inventory_with(old_lab, tmp_path, dsctl_package_source=str(source),
                                              dsctl_wheelhouse=str(old_lab.paths.packages / "wheels")),
                               "--limit", "lab-01")
    assert result.returncode == 4, result.stderr
    assert any("checksum mismatch" in line and firmware.name in line for line in report["errors"]), report["errors"]
    assert versions(old_lab, "lab-01") == OLD
    staged = old_lab.sh("lab-01", f"test -e /var/cache/dsctl/packages/{firmware.name}")
    assert staged.exit_code != 0, "the rejected package must not stay where it could be run"


def test_provision_upgrades_in_order_isolates_faults_then_finishes_and_is_idempotent(old_lab, tmp_path):
    dsctl("lab", "fault", "lab-02", "install-fail", "--component", "toolkit")
    dsctl("lab", "fault", "lab-03", "chip-unhealthy", "--npu", "2")
    before = boots(old_lab)

    result, report = provision(old_lab.inventory)
    hosts = {row["host"]: row for row in report["data"]["hosts"]}
    assert result.returncode == 4, result.stderr
    assert hosts["lab-01"]["status"] in ("ok", "changed")
    assert (hosts["lab-01"]["driver"], hosts["lab-01"]["firmware"], hosts["lab-01"]["cann"]) == (
        NEW_DRIVER, NEW_FIRMWARE, NEW_CANN)
    assert hosts["lab-02"]["status"] == "failed" and hosts["lab-03"]["status"] == "failed"
    errors = "\n".join(report["errors"])
    assert "lab-02: failed at cann : Run the toolkit installer" in errors
    assert "lab-03: failed at ascend_preflight" in errors and "unhealthy" in errors
    assert report["data"]["rerun"] == ["lab-02", "lab-03"]

    # lab-01: upgrade order firmware then driver (ascend-deployer), then a reboot activated both
    operations = old_lab.sh_ok("lab-01", "cat /var/log/ascend_seclog/operation.log")
    firmware_at = operations.index(f"npu-firmware_{NEW_FIRMWARE}")
    driver_at = operations.index(f"npu-driver_{NEW_DRIVER}")
    assert firmware_at < driver_at, operations
    after = boots(old_lab)
    assert after["lab-01"] == before["lab-01"] + 1
    assert f"Version: {NEW_DRIVER}" in old_lab.sh_ok("lab-01", "npu-smi info")
    # lab-02: new driver, but the failed toolkit left the old CANN active and in one piece
    assert versions(old_lab, "lab-02") == (NEW_DRIVER, NEW_FIRMWARE, OLD[2])
    assert old_lab.sh("lab-02", f"test -e /usr/local/Ascend/ascend-toolkit/{NEW_CANN}").exit_code != 0
    # lab-03: failed preflight, so nothing ran and it did not reboot
    assert versions(old_lab, "lab-03") == OLD
    assert after["lab-03"] == before["lab-03"]

    check = dsctl("check", str(old_lab.inventory), "--json", check=False)
    audit = {row["host"]: row for row in json.loads(check.stdout)["data"]["hosts"]}
    assert check.returncode == 3
    assert audit["lab-01"]["status"] == "ok"
    assert audit["lab-02"]["status"] == "error"
    assert any(f["component"] == "cann" for f in audit["lab-02"]["findings"] if f["severity"] == "error")
    assert any(f["component"] == "npu" and "2" in f["sentence"] for f in audit["lab-03"]["findings"])

    dsctl("lab", "fault", "lab-03", "chip-healthy", "--npu", "2")
    result, report = provision(old_lab.inventory)
    assert result.returncode == 0, report["errors"]
    hosts = {row["host"]: row for row in report["data"]["hosts"]}
    assert hosts["lab-01"]["changed"] == 0
    for name in ("lab-02", "lab-03"):
        assert versions(old_lab, name) == (NEW_DRIVER, NEW_FIRMWARE, NEW_CANN)
    # the old CANN stays side by side, for rollback
    assert old_lab.sh("lab-03", f"test -d /usr/local/Ascend/ascend-toolkit/{OLD[2]}").exit_code == 0

    check = dsctl("check", str(old_lab.inventory), "--json", check=False)
    assert check.returncode == 0, check.stdout
    assert {row["status"] for row in json.loads(check.stdout)["data"]["hosts"]} == {"ok"}

    result, report = provision(old_lab.inventory)
    assert result.returncode == 0
    assert [row["changed"] for row in report["data"]["hosts"]] == [0, 0, 0]


def test_check_mode_changes_nothing(old_lab, tmp_path):
    before = boots(old_lab)
    result, report = provision(inventory_with(old_lab, tmp_path, dsctl_cann_version="8.5.0",
                                              dsctl_ascend_env={"HCCL_BUFFSIZE": 512}), "--check", "--diff")
    assert result.returncode == 0, report
    env_file = old_lab.sh_ok("lab-01", "cat /etc/profile.d/dsctl-ascend.sh")
    assert "HCCL_BUFFSIZE" not in env_file
    assert boots(old_lab) == before


def test_a_driver_only_host_gets_its_firmware_with_full_and_provisions(old_lab):
    # The firmware package removed by its own uninstaller (its upgrade record goes with it, the chips keep
    # their image): the decision follows the firmware's record, so --full though a driver is installed.
    dsctl("lab", "fault", "lab-01", "uninstall", "--component", "firmware")
    assert old_lab.sh("lab-01", "test -e /usr/local/Ascend/firmware").exit_code != 0
    result, report = provision(old_lab.inventory, "--limit", "lab-01")
    assert result.returncode == 0, report and report["errors"]
    row = report["data"]["hosts"][0]
    assert (row["host"], row["firmware"]) == ("lab-01", NEW_FIRMWARE) and row["status"] in ("ok", "changed")
    firmware_runs = [line for line in old_lab.sh_ok("lab-01", "cat /var/log/ascend_seclog/operation.log").splitlines()
                     if "npu-firmware" in line]
    assert firmware_runs[-1].startswith("Install ") and " success " in firmware_runs[-1], firmware_runs
    assert "--full" in firmware_runs[-1] and "--upgrade" not in firmware_runs[-1]
    assert versions(old_lab, "lab-01") == (NEW_DRIVER, NEW_FIRMWARE, NEW_CANN)
