"""The emulated npu-smi and upgrade-tool, run as lab hosts run them: separate processes
reading the hardware state under DSCTL_LAB_RUN_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.core.hostfacts import npusmi
from dsctl.emu import hwstate

BUS_IDS = [
    "0000:C1:00.0",
    "0000:C2:00.0",
    "0000:81:00.0",
    "0000:82:00.0",
    "0000:01:00.0",
    "0000:02:00.0",
    "0000:41:00.0",
    "0000:42:00.0",
]
IDLE_HBM = 3408
SERVING_MB = 37709


def board_910b3() -> dict:
    npus = [
        {
            "id": i,
            "chip_id": 0,
            "logic_id": i,
            "bus_id": BUS_IDS[i],
            "serial": f"1025C90487{i:02d}",
            "health": "OK",
            "hbm_used_mb": IDLE_HBM,
            "memory_used_mb": 0,
            "power_w": 93.0 + i,
            "temp_c": 35,
            "aicore_pct": 0,
        }
        for i in range(8)
    ]
    return {
        "chip": "910B3",
        "family": "910b",
        "npu_smi_name": "910B3",
        "hbm_total_mb": 65536,
        "memory_total_mb": 0,
        "pci_device_id": "0xD802",
        "subsystem_vendor_id": "0x19E5",
        "subsystem_device_id": "0x3003",
        "product_name": "IT21HMDC_Bin5",
        "board_id": "0x60",
        "npus": npus,
    }


class Lab:
    """One emulated host's state directory, and a way to run its tools against it."""

    def __init__(self, root: Path):
        self.root = root
        self.hw_dir = root / "hw"
        self.hw_dir.mkdir(parents=True)
        (root / "npu-procs").mkdir()
        self.set_board(board_910b3())
        self.boot(driver="25.2.0", fw_ranges="[7.0.0,7.8.99]", firmware="7.5.0.1.129")

    def set_board(self, board: dict) -> None:
        hwstate.save_board(board, hw_dir=self.hw_dir)

    def boot(self, driver: str | None, fw_ranges: str = "", firmware: str | None = None) -> None:
        loaded = None if driver is None else {"version": driver, "compatible_version_fw": fw_ranges}
        hwstate.save_running(
            {"boot_id": "b1", "driver": loaded, "firmware": firmware}, path=self.root / "running.json"
        )

    def start_process(self, npu: int, memory_mb: int, name: str = "VLLMEngineCore") -> int:
        # The record must name a live pid: the test runner itself.
        pid = os.getpid()
        record = {"pid": pid, "name": name, "npu": npu, "chip": 0, "memory_mb": memory_mb}
        hwstate._write_json(self.root / "npu-procs" / f"{pid}.json", record)
        return pid

    def run(self, module: str, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, DSCTL_LAB_RUN_DIR=str(self.root))
        return subprocess.run(
            [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60
        )

    def npu_smi(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("dsctl.emu.npu_smi", *args)

    def upgrade_tool(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("dsctl.emu.upgrade_tool", *args)


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path / "run")


# --- npu-smi info --------------------------------------------------------------------------------


def test_info_shows_every_npu_and_the_serving_process(lab):
    pid = lab.start_process(npu=2, memory_mb=SERVING_MB)

    result = lab.npu_smi("info")

    assert result.returncode == 0, result.stderr
    info = npusmi.parse_info(result.stdout)
    assert info.driver_version == "25.2.0"
    assert [npu.npu_id for npu in info.npus] == list(range(8))
    assert info.npus[2].hbm_used_mb == IDLE_HBM + SERVING_MB
    assert info.npus[3].hbm_used_mb == IDLE_HBM
    assert info.processes == [npusmi.NpuProcess(2, 0, pid, "VLLMEngineCore", SERVING_MB)]
    assert {len(line) for line in result.stdout.splitlines()} == {98}


def test_info_after_an_upgrade_without_reboot_shows_the_driver_loaded_at_boot(lab):
    lab.boot(driver="24.1.rc3", fw_ranges="[7.0.0,7.5.99]", firmware="7.5.0.1.129")

    table = lab.npu_smi("info")
    board = lab.npu_smi("info", "-t", "board", "-i", "0")

    assert npusmi.parse_info(table.stdout).driver_version == "24.1.rc3"
    assert npusmi.parse_board(board.stdout)["Software Version"] == "24.1.rc3"


def test_unhealthy_chip_shows_its_health(lab):
    board = board_910b3()
    board["npus"][3]["health"] = "Critical"
    lab.set_board(board)

    info = npusmi.parse_info(lab.npu_smi("info").stdout)

    assert [npu.health for npu in info.npus] == ["OK"] * 3 + ["Critical"] + ["OK"] * 4


@pytest.mark.parametrize(
    "args", [("info",), ("info", "-m"), ("info", "-l"), ("info", "-t", "board", "-i", "0")]
)
def test_driver_installed_but_not_loaded_fails_dcmi_init(lab, args):
    lab.boot(driver=None)

    result = lab.npu_smi(*args)

    assert result.returncode == 215
    assert result.stdout == ""
    assert result.stderr == "dcmi module initialize failed. ret is -8005\n"


def test_host_without_a_board_fails_dcmi_init(lab):
    (lab.hw_dir / hwstate.BOARD_FILE).unlink()

    result = lab.npu_smi("info")

    assert result.returncode == 215
    assert npusmi.dcmi_error_code(result.stderr) == -8005


# --- -t board ------------------------------------------------------------------------------------


def test_board_reports_ok_when_firmware_is_in_the_drivers_range(lab):
    lab.boot(driver="24.1.rc3", fw_ranges="[7.0.0,7.5.99]", firmware="7.5.0.1.129")

    result = lab.npu_smi("info", "-t", "board", "-i", "5")

    assert result.returncode == 0
    fields = npusmi.parse_board(result.stdout)
    assert fields["NPU ID"] == "5"
    assert fields["Firmware Version"] == "7.5.0.1.129"
    assert fields["PCIe Bus Info"] == BUS_IDS[5]
    assert fields["Compatibility"] == "OK"


def test_board_reports_nok_when_firmware_is_outside_the_drivers_range(lab):
    lab.boot(driver="24.1.rc2.2", fw_ranges="[7.0.0,7.2.99]", firmware="7.3.0.1.231")

    fields = npusmi.parse_board(lab.npu_smi("info", "-t", "board", "-i", "0").stdout)

    assert fields["Compatibility"] == "NOK"


def test_board_accepts_options_in_any_order_and_the_chip_option(lab):
    result = lab.npu_smi("info", "-i", "1", "-c", "0", "-t", "board")

    assert result.returncode == 0
    fields = npusmi.parse_board(result.stdout)
    assert (fields["NPU ID"], fields["Chip ID"], fields["Chip Name"]) == ("1", "0", "910B3")


def test_board_for_a_card_that_is_not_there_fails(lab):
    result = lab.npu_smi("info", "-t", "board", "-i", "9")

    assert result.returncode == 215
    assert result.stdout == ""
    assert "9" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("info", "-t", "board", "-i", "x"), "Error parameter of -i"),
        (("info", "-t", "board"), "Error parameter of -i"),
        (("info", "-t", "nonsense", "-i", "0"), "Error parameter of -t"),
    ],
)
def test_bad_usage_prints_the_error_then_the_info_usage(lab, args, message):
    result = lab.npu_smi(*args)

    assert result.returncode == 215
    assert result.stdout.splitlines()[0] == message
    assert "Usage: npu-smi info <watch|proc|-h|-m|-l|-t type> [Options...]" in result.stdout


def test_info_help_succeeds(lab):
    result = lab.npu_smi("info", "-h")

    assert result.returncode == 0
    assert result.stdout.startswith("Usage: npu-smi info")


# --- -m and -l -----------------------------------------------------------------------------------


def test_mapping_lists_each_chip_and_its_mcu(lab):
    rows = npusmi.parse_mapping(lab.npu_smi("info", "-m").stdout)

    assert [(r.npu_id, r.logic_id) for r in rows if not r.is_mcu] == [(i, i) for i in range(8)]
    assert sum(r.is_mcu for r in rows) == 8


def test_list_counts_the_cards(lab):
    board = board_910b3()
    board["npus"] = board["npus"][:4]
    lab.set_board(board)

    listing = npusmi.parse_list(lab.npu_smi("info", "-l").stdout)

    assert listing == npusmi.ListResult(4, [npusmi.ListEntry(i, 1) for i in range(4)])


# --- upgrade-tool --------------------------------------------------------------------------------


def test_component_versions_report_the_active_firmware_for_every_device(lab):
    result = lab.upgrade_tool("--device_index", "-1", "--component", "-1", "--version")

    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert (lines[0], lines[-1]) == ("{", "}")
    for device in range(8):
        assert (
            f"Get component version(7.5.0.1.129) succeed for deviceId({device}), componentType(0)." in lines
        )
        assert f'\t{{"device_id":{device}, "component":nve, "version":7.5.0.1.129}}' in lines


def test_component_versions_of_one_device(lab):
    result = lab.upgrade_tool("--device_index", "3", "--component", "-1", "--version")

    assert "deviceId(3)" in result.stdout
    assert "deviceId(0)" not in result.stdout


def test_system_version_reports_the_driver_loaded_at_boot(lab):
    lab.boot(driver="24.1.rc3", fw_ranges="[7.0.0,7.5.99]", firmware="7.5.0.1.129")

    result = lab.upgrade_tool("--device_index", "-1", "--system_version")

    assert result.returncode == 0
    assert "Get system version(24.1.rc3) succeed, deviceId(7)" in result.stdout.splitlines()
    assert result.stdout.count('"version":24.1.rc3}') == 8


def test_upgrade_tool_fails_when_the_driver_is_not_loaded(lab):
    lab.boot(driver=None)

    result = lab.upgrade_tool("--device_index", "-1", "--component", "-1", "--version")

    assert result.returncode == 1
    assert result.stdout == ""
    assert "-8005" in result.stderr


def test_upgrade_tool_rejects_unknown_arguments(lab):
    result = lab.upgrade_tool("--device_index", "-1", "--frobnicate")

    assert result.returncode == 1
    assert result.stdout.startswith("Usage: upgrade-tool")
