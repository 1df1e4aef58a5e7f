"""`dsctl lab up --name` and `dsctl lab snapshot`: labs side by side that never see each other, and snapshots that
bring back exactly the saved state (files, installed versions, supervised processes) in seconds.

Two labs for the module: this worker's (1 host, HDK preinstalled) and a second named one (1 bare host) that
chooses its own subnet.  Services here are plain supervisord programs: what `dsctl deploy` makes of them is
tested by test_deploy.py, which restores a snapshot of its deployed fleet too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dsctl.adapters import ssh
from dsctl.lab.hosts import LabPaths

from .conftest import LAB_NAME, LAB_ROOT, bring_up, dsctl, lab_leftovers, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

OTHER = f"{LAB_NAME}x"
OTHER_ROOT = Path(f"/run/dsctl/test-{OTHER}")
DRIVER, FIRMWARE = "24.1.rc3", "7.5.0.1.129"
PROGRAM = """[program:snaptest]
command=/bin/sh -c 'echo "$$" > /run/snaptest.pid; exec sleep 100000'
autostart=true
autorestart=false
"""


def other(*args: str, check: bool = True):
    return dsctl(*args, "--name", OTHER, "--root", str(OTHER_ROOT), check=check)


@pytest.fixture(scope="module")
def labs():
    lab = bring_up("--hosts", "1", "--driver", DRIVER, "--firmware", FIRMWARE)
    other("lab", "down")
    second = json.loads(other("lab", "up", "--hosts", "1", "--json").stdout)["data"]
    try:
        yield lab, second
    finally:
        other("lab", "down")
        dsctl("lab", "down")


def test_two_named_labs_never_see_each_others_hosts(labs):
    lab, second = labs
    mine = lab.spec.members[0]
    theirs = second["hosts"][0]
    assert theirs["name"] == mine.name == "lab-01" and theirs["address"] != mine.address
    assert second["spec"]["subnet"] != lab.spec.subnet
    lab.sh_ok("lab-01", "echo mine > /etc/which-lab")
    status = json.loads(other("lab", "status", "--json").stdout)
    assert status["data"][0]["address"] == theirs["address"] and status["data"][0]["npu"]["note"]  # bare: no npu-smi
    assert [row["name"] for row in lab.status()["data"]] == ["lab-01"]
    # The other lab's host is its own machine: its own identity, none of this lab's files or driver.
    other_paths = LabPaths(OTHER_ROOT, OTHER)
    theirs_target = ssh.SshTarget("lab-01", theirs["address"], "root", other_paths.client_key, other_paths.known_hosts)
    seen = ssh.run(theirs_target, "cat /etc/which-lab; cat /etc/machine-id; command -v npu-smi", timeout=30)
    assert "mine" not in seen.stdout and "npu-smi" not in seen.stdout
    assert lab.sh_ok("lab-01", "cat /etc/machine-id").strip() not in seen.stdout
    # Nor can one lab's host reach the other's: each bridge is a network of its own.
    reach = lab.sh("lab-01", f"timeout 3 bash -c '</dev/tcp/{theirs['address']}/22'")
    assert reach.exit_code != 0


def test_restore_brings_back_files_versions_and_supervised_processes(labs):
    lab, _ = labs
    lab.sh_ok("lab-01", "mkdir -p /etc/supervisor/conf.d && cat > /etc/supervisor/conf.d/snaptest.conf <<'EOF'\n"
              f"{PROGRAM}EOF\nsupervisord -c /etc/supervisor/supervisord.conf && echo saved > /opt/state.txt")
    deadline = time.monotonic() + 20
    while lab.sh("lab-01", "test -s /run/snaptest.pid").exit_code != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    before_pid = lab.sh_ok("lab-01", "cat /run/snaptest.pid").strip()
    saved = json.loads(dsctl("lab", "snapshot", "save", "deployed", "--json").stdout)["data"]
    assert saved["hosts"] == ["lab-01"] and saved["stacks"]["lab-01"]["driver"] == DRIVER
    # Saving froze the host for a moment and let it go on: the same process still runs.
    assert lab.sh_ok("lab-01", "kill -0 $(cat /run/snaptest.pid) && cat /run/snaptest.pid").strip() == before_pid

    # Change everything a restore must undo: a file, a removed file, the driver, the running program.
    dsctl("lab", "fault", "lab-01", "uninstall", "--component", "driver")
    lab.sh_ok("lab-01", "rm /opt/state.txt; echo later > /etc/added-later; supervisorctl stop snaptest")
    boots = lab.status()["data"][0]["boots"]

    restored = dsctl("lab", "snapshot", "restore", "deployed")
    assert "restored" in restored.stderr
    assert lab.sh_ok("lab-01", "cat /opt/state.txt").strip() == "saved"
    assert lab.sh("lab-01", "test -e /etc/added-later").exit_code != 0
    row = lab.status()["data"][0]
    assert row["npu"]["driver"] == DRIVER and row["boots"] == boots + 1  # a power cycle: booted once more
    # The saved disk's supervisord and its program came back at boot, as a fresh process.
    deadline = time.monotonic() + 20
    while lab.sh("lab-01", "supervisorctl status snaptest | grep -q RUNNING").exit_code != 0:
        assert time.monotonic() < deadline, lab.sh("lab-01", "supervisorctl status")
        time.sleep(0.2)
    assert lab.sh_ok("lab-01", "cat /run/snaptest.pid").strip() != before_pid


def test_list_delete_and_bad_snapshots_are_one_line_errors(labs):
    lab, _ = labs
    listed = json.loads(dsctl("lab", "snapshot", "list", "--json").stdout)["data"]
    assert [entry["name"] for entry in listed] == ["deployed"]
    for args in (["restore", "missing"], ["delete", "missing"], ["save", "../x"], ["save", "deployed"]):
        result = dsctl("lab", "snapshot", *args, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "NAME" in result.stderr, result.stderr
    marker = lab.sh_ok("lab-01", "cat /proc/sys/kernel/random/boot_id").strip()
    archive = LAB_ROOT / "snapshots" / "deployed" / "lab-01.disk.tar"
    with open(archive, "r+b") as handle:
        handle.seek(archive.stat().st_size // 2)
        handle.write(b"\0corrupt\0")
    result = dsctl("lab", "snapshot", "restore", "deployed", check=False)
    assert result.returncode == 2 and "corrupt" in result.stderr and "lab-01.disk.tar" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert lab.sh_ok("lab-01", "cat /proc/sys/kernel/random/boot_id").strip() == marker  # nothing was touched
    dsctl("lab", "snapshot", "delete", "deployed")
    assert json.loads(dsctl("lab", "snapshot", "list", "--json").stdout)["data"] == []


def test_taking_one_lab_down_leaves_the_other_running(labs):
    lab, second = labs
    other("lab", "down")
    assert all(not found for found in lab_leftovers(OTHER_ROOT, OTHER).values())
    assert lab.status()["exit_code"] == 0  # this worker's lab is untouched
