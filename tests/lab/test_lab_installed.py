"""A lab preinstalled with an older HDK: npu-smi over SSH, faults, idempotent `lab up`, clean teardown."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.core.hostfacts.npusmi import parse_info

from .conftest import Lab, dsctl, lab_leftovers

pytestmark = pytest.mark.lab

DRIVER_NEW = f"Ascend-hdk-910b-npu-driver_25.5.0_linux-{platform.machine()}.run"


def test_every_host_shows_eight_910b3_in_the_real_layout(installed_lab: Lab):
    for host in installed_lab.spec.members:
        text = installed_lab.sh_ok(host.name, "npu-smi info")
        lines = text.splitlines()
        assert lines[1].startswith("| npu-smi 24.1.rc3                 Version: 24.1.rc3")
        assert all(len(line) == 98 for line in lines if line.startswith(("|", "+")))
        info = parse_info(text)
        assert [(npu.npu_id, npu.name, npu.health, npu.hbm_total_mb) for npu in info.npus] == [
            (n, "910B3", "OK", 65536) for n in range(8)
        ]


def test_lab_status_reads_every_host_over_ssh(installed_lab: Lab):
    status = installed_lab.status()
    assert status["exit_code"] == 0
    assert [(h["name"], h["npu"]["driver"], h["npu"]["firmware"], h["npu"]["npus"]) for h in status["data"]] == [
        (f"lab-0{n}", "24.1.rc3", "7.5.0.1.129", "8 x 910B3") for n in (1, 2, 3)
    ]


def test_lab_up_again_with_the_same_options_changes_nothing(installed_lab: Lab):
    boots = {h["name"]: h["boots"] for h in installed_lab.status()["data"]}
    again = dsctl("lab", "up", "--hosts", "3", "--driver", "24.1.rc3", "--firmware", "7.5.0.1.129")
    assert "already up" in again.stderr
    assert {h["name"]: h["boots"] for h in installed_lab.status()["data"]} == boots
    other = dsctl("lab", "up", "--hosts", "2", check=False)
    assert other.returncode == 2
    assert "lab down" in other.stderr


def test_unhealthy_chip_shows_in_npu_smi_health(installed_lab: Lab):
    dsctl("lab", "fault", "lab-02", "chip-unhealthy", "--npu", "3", "--health", "Alarm")
    try:
        healths = {npu.npu_id: npu.health for npu in parse_info(installed_lab.sh_ok("lab-02", "npu-smi info")).npus}
        assert healths == {n: ("Alarm" if n == 3 else "OK") for n in range(8)}
    finally:
        dsctl("lab", "fault", "lab-02", "chip-healthy", "--npu", "3")
    assert {npu.health for npu in parse_info(installed_lab.sh_ok("lab-02", "npu-smi info")).npus} == {"OK"}


def test_armed_installer_fails_midway_and_leaves_the_old_driver(installed_lab: Lab):
    run_file = installed_lab.upload("lab-02", DRIVER_NEW)
    dsctl("lab", "fault", "lab-02", "install-fail", "--component", "driver")
    failed = installed_lab.sh("lab-02", f"bash {run_file} --nox11 --upgrade --quiet")
    assert failed.exit_code == 1
    assert "[ERROR]" in failed.stdout + failed.stderr
    assert "Version=24.1.rc3" in installed_lab.sh_ok("lab-02", "cat /usr/local/Ascend/driver/version.info")
    # The fault fires once: the retry goes through.
    retried = installed_lab.sh("lab-02", f"bash {run_file} --nox11 --upgrade --quiet")
    assert retried.exit_code == 0, retried
    assert "Version=25.5.0" in installed_lab.sh_ok("lab-02", "cat /usr/local/Ascend/driver/version.info")


def test_network_down_makes_the_host_unreachable(installed_lab: Lab):
    dsctl("lab", "fault", "lab-03", "network-down")
    try:
        assert not installed_lab.sh("lab-03", "true", timeout=2).reached
        status = dsctl("lab", "status", "--json", check=False)
        assert status.returncode == 5
        by_host = {h["name"]: h for h in json.loads(status.stdout)["data"]}
        assert by_host["lab-03"]["error"].startswith("unreachable")
        assert by_host["lab-01"]["error"] == ""
    finally:
        dsctl("lab", "fault", "lab-03", "network-up")
    assert installed_lab.sh_ok("lab-03", "hostname").strip() == "lab-03"


def test_full_disk_is_seen_by_df_and_refuses_writes(installed_lab: Lab):
    dsctl("lab", "fault", "lab-01", "disk-full")
    try:
        avail_kb = int(installed_lab.sh_ok("lab-01", "df --output=avail /usr/local | tail -1"))
        assert avail_kb < 1024
        write = installed_lab.sh("lab-01", "head -c 4M /dev/zero > /usr/local/ballast")
        assert write.exit_code != 0
        assert "No space left on device" in write.stderr
    finally:
        dsctl("lab", "fault", "lab-01", "disk-free")
    installed_lab.sh_ok("lab-01", "head -c 4M /dev/zero > /usr/local/ballast && rm /usr/local/ballast")


def test_the_read_only_playbook_reports_every_host(installed_lab: Lab):
    playbook = Path(__file__).resolve().parents[2] / "playbooks" / "npu_info.yml"
    ansible_playbook = str(Path(sys.executable).with_name("ansible-playbook"))
    result = subprocess.run([ansible_playbook, "-i", str(installed_lab.inventory), str(playbook)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("npu-smi 24.1.rc3") == 3
    assert "changed=0" in result.stdout and "changed=1" not in result.stdout


def test_lab_down_leaves_nothing_behind(installed_lab: Lab):
    dsctl("lab", "down")
    assert lab_leftovers() == {"netns": [], "links": [], "mounts": [], "processes": [], "state": []}
