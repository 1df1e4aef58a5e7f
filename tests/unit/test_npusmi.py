"""Renderers and parsers of dsctl.core.hostfacts.npusmi against real npu-smi captures.

Fixtures are verbatim captures; tests/fixtures/npu_smi/SOURCES.md says where each comes from.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from dsctl.core.hostfacts import npusmi
from dsctl.core.hostfacts.npusmi import InfoResult, ListEntry, MappingRow, NpuProcess, NpuStatus
from dsctl.lab import packages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu_smi"

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


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def board_of_section_2_1() -> dict:
    """The hardware behind vllm-project/vllm-ascend#6512: NPU 2 idles at 3343 MB and one
    process holds 37709 MB on it, which the table shows as 41052 / 65536."""
    power = [97.9, 89.5, 92.3, 92.4, 95.6, 97.2, 91.0, 95.4]
    temp = [34, 32, 32, 32, 37, 38, 36, 37]
    hbm = [3408, 3408, 3343, 3390, 3403, 3400, 3401, 3400]
    npus = [
        {
            "id": i,
            "chip_id": 0,
            "logic_id": i,
            "bus_id": BUS_IDS[i],
            "serial": f"1025C90487{i:02d}",
            "health": "OK",
            "hbm_used_mb": hbm[i],
            "memory_used_mb": 0,
            "power_w": power[i],
            "temp_c": temp[i],
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


def status(npu_id: int, **changes) -> NpuStatus:
    values = dict(
        npu_id=npu_id,
        name="910B3",
        health="OK",
        power_w=93.0,
        temp_c=35,
        hugepages_used=0,
        hugepages_total=0,
        chip_id=0,
        bus_id=BUS_IDS[npu_id % 8],
        aicore_pct=0,
        memory_used_mb=0,
        memory_total_mb=0,
        hbm_used_mb=3408,
        hbm_total_mb=65536,
    )
    values.update(changes)
    return NpuStatus(**values)


# --- npu-smi info: rendering ---------------------------------------------------------------------


def test_renders_the_8_npu_capture_byte_for_byte():
    processes = [NpuProcess(npu_id=2, chip_id=0, pid=1333928, name="", memory_mb=37709)]
    npus = npusmi.npus_from_board(board_of_section_2_1(), processes)

    assert npusmi.render_info("25.2.0", npus, processes) == fixture("info_910b3_x8_25.2.0.txt")


def test_every_rendered_line_is_98_wide_even_with_wide_values():
    npus = [
        status(0, hbm_used_mb=65536, power_w=412.5, health="Critical"),
        status(1, memory_used_mb=15038, memory_total_mb=15038),
    ]
    processes = [NpuProcess(0, 0, 4194304, "VLLMEngineCore", 62128)]

    lines = npusmi.render_info("25.0.rc1.1", npus, processes).splitlines()

    assert {len(line) for line in lines} == {98}
    assert "| 0     910B3               | Critical      | 412.5       35" in lines[6]


def test_five_digit_used_value_touches_the_slash():
    text = npusmi.render_info("25.2.0", [status(0, hbm_used_mb=41052)])

    assert "41052/ 65536" in text
    assert "3408 /" not in text


def test_npu_without_process_gets_the_no_process_row_and_busy_npu_does_not():
    text = npusmi.render_info("25.2.0", [status(0), status(1)], [NpuProcess(1, 0, 77, "python", 100)])

    assert "| No running processes found in NPU 0 " in text
    assert "No running processes found in NPU 1" not in text


def test_hbm_used_adds_process_memory_and_never_exceeds_total():
    board = board_of_section_2_1()
    processes = [
        NpuProcess(0, 0, 10, "a", 1000),
        NpuProcess(0, 0, 11, "b", 500),
        NpuProcess(1, 0, 12, "c", 99999),
    ]

    npus = npusmi.npus_from_board(board, processes)

    assert [npu.hbm_used_mb for npu in npus[:3]] == [3408 + 1500, 65536, 3343]


def test_processes_from_records_groups_by_npu_then_chip():
    records = [
        {"pid": 30, "name": "x", "npu": 3, "chip": 0, "memory_mb": 5},
        {"pid": 10, "name": "y", "npu": 1, "chip": 0, "memory_mb": 6},
    ]

    found = npusmi.processes_from_records(records)

    assert found == [NpuProcess(1, 0, 10, "y", 6), NpuProcess(3, 0, 30, "x", 5)]


# --- npu-smi info: parsing real captures ---------------------------------------------------------


def test_parses_the_8_npu_capture():
    result = npusmi.parse_info(fixture("info_910b3_x8_25.2.0.txt"))

    assert (result.tool_version, result.driver_version) == ("25.2.0", "25.2.0")
    assert [npu.npu_id for npu in result.npus] == list(range(8))
    assert result.npus[2] == status(2, power_w=92.3, temp_c=32, hbm_used_mb=41052)
    assert result.processes == [NpuProcess(2, 0, 1333928, "", 37709)]
    assert result.idle_npu_ids() == [0, 1, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    ("name", "driver", "expected"),
    [
        ("info_910b3_24.1.rc1_excerpt.txt", "24.1.rc1", status(0, power_w=97.6, temp_c=52, hbm_used_mb=3525)),
        (
            "info_910b2c_25.0.rc1.1_excerpt.txt",
            "25.0.rc1.1",
            status(0, name="910B2C", power_w=88.3, temp_c=34, bus_id="0000:5A:00.0", hbm_used_mb=3406),
        ),
        (
            "info_910_ddr_24.1.0_excerpt.txt",
            "24.1.0",
            status(
                0,
                name="910B",
                power_w=65.7,
                temp_c=38,
                memory_used_mb=2382,
                memory_total_mb=15038,
                hbm_used_mb=0,
                hbm_total_mb=32768,
            ),
        ),
    ],
)
def test_parses_published_excerpts(name, driver, expected):
    result = npusmi.parse_info(fixture(name))

    assert result.driver_version == driver
    assert result.npus == [expected]
    assert result.processes == []


def test_parses_the_partial_listing_with_a_named_process():
    result = npusmi.parse_info(fixture("info_910b3_25.5.1_named_process.txt"))

    assert result.driver_version == "25.5.1"
    shown = [(npu.npu_id, npu.aicore_pct, npu.hbm_used_mb) for npu in result.npus]
    assert shown == [(0, 0, 3445), (5, 12, 60156)]
    assert result.processes == [NpuProcess(5, 0, 2290156, "VLLMEngineCore", 56630)]


def test_parses_an_a3_listing_with_two_chips_per_npu_and_several_processes():
    result = npusmi.parse_info(fixture("info_a3_ascend910_25.2.3.txt"))

    assert len(result.npus) == 16
    assert [npu.phy_id for npu in result.npus] == list(range(16))
    second_chip = result.npus[1]
    shown = (second_chip.npu_id, second_chip.chip_id, second_chip.power_w, second_chip.hbm_used_mb)
    assert shown == (0, 1, None, 52948)
    assert [p.pid for p in result.processes if p.npu_id == 0] == [3325989, 3330598, 3328327, 3333165, 3328327]
    assert result.idle_npu_ids() == [2, 3, 4, 5]


def test_an_error_message_parses_to_no_npus():
    result = npusmi.parse_info("dcmi module initialize failed. ret is -8005\n")

    assert result == InfoResult("", "", [], [])


# --- npu-smi info: round trip --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("npus", "processes"),
    [
        ([status(i) for i in range(8)], []),
        (
            [status(0, health="Critical"), status(1, hbm_used_mb=60156, aicore_pct=12)],
            [NpuProcess(1, 0, 2290156, "VLLMEngineCore", 56630)],
        ),
        (
            [
                status(
                    0,
                    name="910B",
                    memory_used_mb=2382,
                    memory_total_mb=15038,
                    hbm_used_mb=0,
                    hbm_total_mb=32768,
                )
            ],
            [],
        ),
        (
            [status(3), status(4)],
            [NpuProcess(3, 0, 1, "", 50128), NpuProcess(3, 0, 2, "python", 132), NpuProcess(4, 0, 3, "", 9)],
        ),
    ],
)
def test_parse_inverts_render(npus, processes):
    text = npusmi.render_info("24.1.rc3", npus, processes)

    assert npusmi.parse_info(text) == InfoResult("24.1.rc3", "24.1.rc3", npus, processes)


def test_tool_and_driver_versions_are_read_separately():
    text = npusmi.render_info("23.0.rc2.3", [status(0)], tool_version="23.0.rc3")

    parsed = npusmi.parse_info(text)
    assert (parsed.tool_version, parsed.driver_version) == ("23.0.rc3", "23.0.rc2.3")


# --- -t board ------------------------------------------------------------------------------------


def telegraf_board() -> tuple[dict, dict]:
    board = board_of_section_2_1()
    npu = dict(board["npus"][0], serial="1025C9048791")
    return board, npu


def test_renders_the_telegraf_board_capture_byte_for_byte():
    board, npu = telegraf_board()

    fields = npusmi.board_fields(board, npu, "25.5.1", "7.8.0.6.201", "OK")

    assert npusmi.render_board(fields) == fixture("board_910b_25.5.1.txt")


def test_parses_the_board_capture():
    fields = npusmi.parse_board(fixture("board_910b_25.5.1.txt"))

    assert fields["Software Version"] == "25.5.1"
    assert fields["Firmware Version"] == "7.8.0.6.201"
    assert fields["Compatibility"] == "OK"
    assert fields["PCIe Bus Info"] == "0000:C1:00.0"
    assert len(fields) == 19


def test_board_round_trip_and_missing_firmware_reads_na():
    board, npu = telegraf_board()
    fields = npusmi.board_fields(board, npu, "24.1.rc3", None, "UNKNOWN")

    parsed = npusmi.parse_board(npusmi.render_board(fields))

    assert parsed == {key: str(value) for key, value in fields}
    assert parsed["Firmware Version"] == "NA"


def test_chip_board_view_lists_chip_fields():
    board, npu = telegraf_board()

    parsed = npusmi.parse_board(npusmi.render_board(npusmi.chip_board_fields(board, npu, "7.5.0.1.129")))

    shown = (parsed["Chip ID"], parsed["Chip Name"], parsed["Firmware Version"])
    assert shown == ("0", "910B3", "7.5.0.1.129")
    assert len(parsed["VDie ID"].split()) == 5


# --- -l and -m -----------------------------------------------------------------------------------


def test_renders_and_parses_the_telegraf_list_capture():
    entries = [ListEntry(i, 1) for i in range(8)]

    assert npusmi.render_list(entries) == fixture("list_x8_telegraf.txt")
    assert npusmi.parse_list(fixture("list_x8_telegraf.txt")) == npusmi.ListResult(8, entries)


def test_renders_the_mapping_capture_byte_for_byte():
    board = board_of_section_2_1()
    board["npus"] = board["npus"][:2]

    assert npusmi.render_mapping(npusmi.mapping_from_board(board)) == fixture("mapping_910b3.txt")


def test_parses_the_mapping_capture_with_mcu_rows():
    rows = npusmi.parse_mapping(fixture("mapping_910b3.txt"))

    assert rows == [
        MappingRow(0, 0, 0, "Ascend 910B3"),
        MappingRow(0, 1, None, "Mcu"),
        MappingRow(1, 0, 1, "Ascend 910B3"),
        MappingRow(1, 1, None, "Mcu"),
    ]
    assert [row.logic_id for row in rows if not row.is_mcu] == [0, 1]


def test_parses_an_a3_mapping_with_phy_id():
    # Single-spaced, as in vllm-ascend's cpu_binding unit test.
    text = "NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID Chip Name\n0 0 0 0 Ascend\n0 1 1 1 Ascend\n"

    assert npusmi.parse_mapping(text) == [MappingRow(0, 0, 0, "Ascend", 0), MappingRow(0, 1, 1, "Ascend", 1)]


# --- compatibility -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("firmware", "ranges", "expected"),
    [
        ("7.5.0.1.129", "[7.0.0,7.5.99]", True),  # driver 24.1.rc3 + its firmware (section 8)
        ("7.3.0.1.231", "[7.0.0,7.2.99]", False),  # the field failure of section 14 item 6
        ("7.8.0.6.201", "[7.0.0,8.9.9]", True),
        ("7.8.0.6.201", "[7.0.0,7.2.99],[8.0.0,8.9.9]", False),
        ("8.1.0.2.10", "[7.0.0,7.2.99],[8.0.0,8.9.9]", True),
        ("7.5.0.5.220", "[6.4.0,6.4.99],[7.0.0,7.6.99]", True),
        ("6.9.0.1.1", "[7.0.0,7.5.99]", False),
        ("7.5.99.9.999", "[7.0.0,7.5.99]", True),  # bounds compare as prefixes
        ("7.10.0.1.1", "[7.0.0,7.9.99]", False),  # numeric, not string, order
        ("7.5.0.1.129", "", False),
        ("", "[7.0.0,7.5.99]", False),
    ],
)
def test_firmware_in_ranges(firmware, ranges, expected):
    assert npusmi.firmware_in_ranges(firmware, ranges) is expected


@pytest.mark.parametrize(
    ("firmware", "ranges", "verdict"),
    [
        ("7.5.0.1.129", "[7.0.0,7.5.99]", "OK"),
        ("7.3.0.1.231", "[7.0.0,7.2.99]", "NOK"),
        (None, "[7.0.0,7.5.99]", "UNKNOWN"),
        ("7.5.0.1.129", None, "UNKNOWN"),
    ],
)
def test_compatibility_verdict(firmware, ranges, verdict):
    assert npusmi.compatibility_verdict(firmware, ranges) == verdict


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("dcmi module initialize failed. ret is -8005\n", -8005),
        (
            "DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\n"
            "dcmi model initialized failed, because the device is used. ret is -8020\n",
            -8020,
        ),
        ("+----+\n| npu-smi 25.2.0  Version: 25.2.0 |\n", None),
    ],
)
def test_dcmi_error_code(text, code):
    assert npusmi.dcmi_error_code(text) == code


# --- what the emulated tools may import ------------------------------------------------------------------------


@pytest.mark.parametrize("modules", [*(modules for _, modules in packages.DRIVER_TOOLS.values()),
                                     packages.INSTALLER_MODULES])
def test_modules_shipped_to_bare_hosts_import_only_the_standard_library_and_each_other(modules):
    # The zipapps and installers run under a bare host's /usr/bin/python3: a third-party import (packaging,
    # pydantic) or a dsctl module left out of the list would fail there with ImportError, not in the unit tests.
    shipped = {"dsctl." + name.removesuffix(".py").replace("/", ".") for name in modules}
    for name in modules:
        for node in ast.walk(ast.parse((packages.DSCTL_DIR / name).read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module = node.module
                is_package = module.startswith("dsctl") and module not in shipped
                imported = [f"{module}.{alias.name}" for alias in node.names] if is_package else [module]
            else:
                continue
            for module in imported:
                if module.startswith("dsctl"):
                    assert module in shipped, f"{name} imports {module}, which is not shipped with it"
                else:
                    top = module.split(".")[0]
                    assert top in sys.stdlib_module_names or top == "__future__", f"{name} imports {module}"
