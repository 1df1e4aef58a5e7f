"""A bare lab (no driver): reachability, isolation, installs over SSH, pending-reboot semantics."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.core.hostfacts.npusmi import parse_board, parse_info

from .conftest import Lab

pytestmark = pytest.mark.lab

ARCH = platform.machine()
DRIVER_OLD = f"Ascend-hdk-910b-npu-driver_24.1.rc3_linux-{ARCH}.run"
FIRMWARE_OLD = "Ascend-hdk-910b-npu-firmware_7.5.0.1.129.run"
DRIVER_NEW = f"Ascend-hdk-910b-npu-driver_25.5.0_linux-{ARCH}.run"
FIRMWARE_NEW = "Ascend-hdk-910b-npu-firmware_7.8.0.5.216.run"


def reboot_with_ansible(lab: Lab, host: str) -> None:
    """ansible.builtin.reboot with the inventory's reboot command: drops SSH, waits for a new boot id."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "-i", str(lab.inventory), host, "-m", "ansible.builtin.reboot",
         "-a", "reboot_command={{ dsctl_reboot_command }} reboot_timeout=60"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r'"?rebooted"?: true', result.stdout), result.stdout


def boot_id(lab: Lab, host: str) -> str:
    return lab.sh_ok(host, "cat /proc/sys/kernel/random/boot_id").strip()


def test_each_host_answers_over_ssh_with_its_own_identity(bare_lab: Lab):
    identities = {}
    for host in bare_lab.spec.members:
        out = bare_lab.sh_ok(host.name, "hostname; cat /etc/machine-id; ip -4 -o addr show eth0")
        hostname, machine_id, addr = out.splitlines()
        assert hostname == host.name
        assert f"inet {host.address}/" in addr
        identities[host.name] = machine_id
    assert len(set(identities.values())) == len(identities)


def test_ansible_ping_with_host_key_checking_on(bare_lab: Lab, tmp_path: Path):
    ansible = str(Path(sys.executable).with_name("ansible"))
    ok = subprocess.run([ansible, "-i", str(bare_lab.inventory), "all", "-m", "ansible.builtin.ping"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("SUCCESS") == 3

    # The same inventory against an empty known_hosts must be refused: checking is really on.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(bare_lab.inventory.read_text().replace(str(bare_lab.paths.known_hosts), str(empty)))
    # A fresh control-socket directory, so the connection of the first run is not reused.
    env = {**os.environ, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")}
    refused = subprocess.run([ansible, "-i", str(inventory), "lab-01", "-m", "ansible.builtin.ping"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0
    assert "Host key verification failed" in refused.stdout + refused.stderr


def test_bare_host_has_no_driver_tools(bare_lab: Lab):
    result = bare_lab.sh("lab-03", "npu-smi info")
    assert result.exit_code == 127
    assert bare_lab.sh("lab-03", "test -e /usr/local/Ascend || test -e /usr/local/Ascend/driver/tools/upgrade-tool"
                       ).exit_code == 1


def test_an_install_on_one_host_is_invisible_elsewhere(bare_lab: Lab):
    controller_had_driver = Path("/usr/local/Ascend/driver/version.info").exists()
    bare_lab.sh_ok("lab-02", "groupadd HwHiAiUser && useradd -g HwHiAiUser -m HwHiAiUser")
    run_file = bare_lab.upload("lab-02", DRIVER_OLD)
    out = bare_lab.sh_ok("lab-02", f"bash {run_file} --nox11 --full --quiet --install-for-all")
    assert "Driver package installed successfully! Reboot needed" in out
    assert "Version=24.1.rc3" in bare_lab.sh_ok("lab-02", "cat /usr/local/Ascend/driver/version.info")
    assert bare_lab.sh("lab-01", "test -e /usr/local/Ascend/driver/version.info").exit_code == 1
    assert bare_lab.sh("lab-01", "id HwHiAiUser").exit_code == 1
    assert Path("/usr/local/Ascend/driver/version.info").exists() == controller_had_driver


def test_driver_and_firmware_take_effect_only_after_reboot(bare_lab: Lab):
    host = "lab-01"
    bare_lab.sh_ok(host, "groupadd HwHiAiUser && useradd -g HwHiAiUser -m HwHiAiUser")
    for package, flags in ((DRIVER_OLD, "--full --install-for-all"), (FIRMWARE_OLD, "--full")):
        bare_lab.sh_ok(host, f"bash {bare_lab.upload(host, package)} --nox11 --quiet {flags}")

    # Installed but not loaded: the device cannot be opened until the host boots the new driver.
    not_loaded = bare_lab.sh(host, "npu-smi info")
    assert not_loaded.exit_code != 0
    assert "-8005" in not_loaded.stdout + not_loaded.stderr

    first_boot = boot_id(bare_lab, host)
    reboot_with_ansible(bare_lab, host)
    assert boot_id(bare_lab, host) != first_boot
    info = parse_info(bare_lab.sh_ok(host, "npu-smi info"))
    assert info.driver_version == "24.1.rc3"
    assert [npu.name for npu in info.npus] == ["910B3"] * 8
    board = parse_board(bare_lab.sh_ok(host, "npu-smi info -t board -i 0"))
    assert board["Firmware Version"] == "7.5.0.1.129"
    assert board["Compatibility"] == "OK"

    # Upgrade (firmware first, then driver): files change now, npu-smi keeps the old versions until reboot.
    bare_lab.sh_ok(host, f"bash {bare_lab.upload(host, FIRMWARE_NEW)} --nox11 --upgrade --quiet")
    bare_lab.sh_ok(host, f"bash {bare_lab.upload(host, DRIVER_NEW)} --nox11 --upgrade --quiet")
    assert "Version=25.5.0" in bare_lab.sh_ok(host, "cat /usr/local/Ascend/driver/version.info")
    assert parse_info(bare_lab.sh_ok(host, "npu-smi info")).driver_version == "24.1.rc3"
    assert parse_board(bare_lab.sh_ok(host, "npu-smi info -t board -i 0"))["Firmware Version"] == "7.5.0.1.129"

    reboot_with_ansible(bare_lab, host)
    assert parse_info(bare_lab.sh_ok(host, "npu-smi info")).driver_version == "25.5.0"
    board = parse_board(bare_lab.sh_ok(host, "npu-smi info -t board -i 5"))
    assert (board["Software Version"], board["Firmware Version"]) == ("25.5.0", "7.8.0.5.216")


def test_check_ready_names_the_python_of_an_openeuler_host_and_provision_refuses_in_preflight(bare_lab: Lab):
    """Issue 12's acceptance: a host reporting openEuler 22.03 with Python 3.9 is named before anything changes."""
    import json

    from .conftest import dsctl

    host, inventory = "lab-03", str(bare_lab.inventory)
    dsctl("lab", "fault", host, "os-openeuler")
    try:
        assert bare_lab.sh_ok(host, "/usr/bin/python3 --version").strip() == "Python 3.9.9"
        assert bare_lab.sh(host, "/usr/bin/python3 -c 'print(1)'").exit_code != 0  # the stand-in runs nothing
        ready = dsctl("check", "--ready", inventory, "--limit", host, "--json", check=False)
        assert ready.returncode == 3, ready.stdout + ready.stderr
        row = json.loads(ready.stdout)["data"]["hosts"][0]
        assert (row["status"], row["system"]["os_id"], row["system"]["os_version"]) == ("blocked", "openEuler", "22.03")
        assert row["python"] == {"path": "/usr/bin/python3", "version": "3.9.9"}
        assert [b["check"] for b in row["blockers"]] == ["python"]
        table = dsctl("check", "--ready", inventory, "--limit", host, check=False).stdout
        assert ("lab-03: blocks provision: serving Python /usr/bin/python3 is 3.9.9; vllm-ascend v0.13.0 needs "
                "Python >=3.10,<3.12. Fix: set dsctl_serving_python") in table
        refused = dsctl("provision", inventory, "--limit", host, check=False)
        assert refused.returncode != 0 and "is 3.9.9; vllm-ascend v0.13.0 needs" in refused.stdout + refused.stderr
        # preflight stopped it: no package copied, no run user, nothing under /usr/local/Ascend
        assert bare_lab.sh(host, "test -e /var/cache/dsctl || test -e /usr/local/Ascend || id HwHiAiUser"
                           ).exit_code == 1
    finally:
        dsctl("lab", "fault", host, "os-native")
    assert bare_lab.sh_ok(host, "/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])'").strip() != "(3, 9)"
    ready = dsctl("check", "--ready", inventory, "--limit", host, "--json", check=False)
    assert ready.returncode == 0, ready.stdout + ready.stderr
