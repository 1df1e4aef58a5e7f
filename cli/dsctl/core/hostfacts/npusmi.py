"""Render and parse the text that Ascend's ``npu-smi`` prints.

Pure and standard library only: the renderers run inside the emulated
``npu-smi`` on lab hosts (a zipapp without dsctl's dependencies), and the
parsers are what dsctl's roles and ``dsctl check`` apply to real hosts.

Layouts follow real captures (ascend-interfaces.md sections 2.1-2.5):

* ``npu-smi info``: ``vllm-project/vllm-ascend#6512`` (8 x 910B3, 25.2.0), with
  variants from ``#834``, ``#4621``, an old 910 board showing DDR usage
  (``longllovers/Deploying-DeepSeek-on-Ascend-910A``), a 25.5.1 listing with a
  named process (``openJiuwen-ai/sciencediscovery``) and an A3 listing with
  several processes per NPU (``vllm-project/vllm-ascend#4930``).
* ``npu-smi info -t board -i N`` and ``npu-smi info -l``: ``yunionio/telegraf``
  ``plugins/inputs/npu_smi/npu_smi_test.go`` (``boardOutput``, ``listOutput``).
* ``npu-smi info -m``: ``openJiuwen-ai/sciencediscovery``
  ``services/runner/src/npu-devices.test.ts``.

The renderers reproduce those bytes exactly; the parsers rely only on what
every capture shares (``|`` cell borders, ``key : value`` lines, whitespace
separated mapping columns), never on our own column widths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.hostfacts import versionorder

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NpuStatus:
    """One two-row block of ``npu-smi info`` (one chip; on A2 one chip per NPU)."""

    npu_id: int
    name: str
    health: str
    power_w: float | None  # None prints "-" (second chip of an A3 card)
    temp_c: int | None
    hugepages_used: int
    hugepages_total: int
    chip_id: int
    bus_id: str
    aicore_pct: int | None
    memory_used_mb: int
    memory_total_mb: int
    hbm_used_mb: int | None  # None on boards whose table has no HBM column (310P)
    hbm_total_mb: int | None
    phy_id: int | None = None  # A3 tables add a "Phy-ID" after the chip id


@dataclass(frozen=True)
class NpuProcess:
    """One row of the process table."""

    npu_id: int
    chip_id: int
    pid: int
    name: str  # often empty when the process runs in a container
    memory_mb: int


@dataclass(frozen=True)
class InfoResult:
    tool_version: str  # "npu-smi <ver>"; equal to the driver version in every 910B sample
    driver_version: str  # "Version: <ver>"
    npus: list[NpuStatus] = field(default_factory=list)
    processes: list[NpuProcess] = field(default_factory=list)

    def idle_npu_ids(self) -> list[int]:
        busy = {process.npu_id for process in self.processes}
        return sorted({npu.npu_id for npu in self.npus} - busy)


@dataclass(frozen=True)
class MappingRow:
    """One row of ``npu-smi info -m``; ``logic_id`` is None for the Mcu ("-")."""

    npu_id: int
    chip_id: int
    logic_id: int | None
    chip_name: str
    phy_id: int | None = None  # A3 adds a "Chip Phy-ID" column

    @property
    def is_mcu(self) -> bool:
        return self.chip_name == "Mcu"


@dataclass(frozen=True)
class ListEntry:
    npu_id: int
    chip_count: int


@dataclass(frozen=True)
class ListResult:
    total_count: int
    npus: list[ListEntry] = field(default_factory=list)


# ---------------------------------------------------------------------------
# npu-smi info: rendering
# ---------------------------------------------------------------------------

TABLE_WIDTH = 98
_CELL_WIDTHS = (27, 15, 52)  # dashes between the "+" of each column, section 2.2

_RULE = "+" + "-" * (TABLE_WIDTH - 2) + "+"
_COLUMN_RULE = "+" + "+".join("-" * width for width in _CELL_WIDTHS) + "+"
_BLOCK_RULE = "+" + "+".join("=" * width for width in _CELL_WIDTHS) + "+"
_NPU_HEADER = (
    "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
    "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
)
_PROCESS_HEADER = (
    "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |"
)
_NO_PROCESS = "No running processes found in NPU {npu_id}"


def _used_total(used: object, total: object, total_width: int) -> str:
    # The used value is left-justified in 5 columns then "/ ", so a 5-digit value
    # prints as "41052/ 65536" with no space before the slash (section 2.2).
    return f"{used!s:<5}/ {total!s:<{total_width}}"


def _table_line(*cells: str) -> str:
    return "| " + "| ".join(cells) + "|"


def _text_or_dash(value: object | None) -> str:
    return "-" if value is None else str(value)


def _power_text(power_w: float | None) -> str:
    return "-" if power_w is None else f"{power_w:.1f}"


def _status_rows(npu: NpuStatus) -> list[str]:
    first = _table_line(
        f"{npu.npu_id:<6}{npu.name:<20}",
        f"{npu.health:<14}",
        f"{_power_text(npu.power_w):<12}{_text_or_dash(npu.temp_c):<18}"
        + _used_total(npu.hugepages_used, npu.hugepages_total, 14),
    )
    second = _table_line(
        f"{npu.chip_id:<26}",
        f"{npu.bus_id:<14}",
        f"{_text_or_dash(npu.aicore_pct):<12}"
        + _used_total(npu.memory_used_mb, npu.memory_total_mb, 11)
        + _used_total(_text_or_dash(npu.hbm_used_mb), _text_or_dash(npu.hbm_total_mb), 14),
    )
    return [first, second, _BLOCK_RULE]


def _process_row(process: NpuProcess) -> str:
    return _table_line(
        f"{process.npu_id:<8}{process.chip_id:<18}",
        f"{process.pid:<14}",
        f"{process.name:<25}",
        f"{process.memory_mb:<24}",
    )


def _process_rows(npu_ids: Iterable[int], processes: Sequence[NpuProcess]) -> list[str]:
    lines: list[str] = []
    for npu_id in npu_ids:
        own = [process for process in processes if process.npu_id == npu_id]
        if own:
            lines.extend(_process_row(process) for process in own)
        else:
            lines.append(_table_line(f"{_NO_PROCESS.format(npu_id=npu_id):<{TABLE_WIDTH - 3}}"))
        lines.append(_BLOCK_RULE)
    return lines


def _unique_in_order(values: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(values))


def render_info(
    driver_version: str,
    npus: Sequence[NpuStatus],
    processes: Sequence[NpuProcess] = (),
    tool_version: str | None = None,
) -> str:
    """The full ``npu-smi info`` table; every line is 98 characters.

    Processes print under their NPU in the order given; an NPU without any
    prints the "No running processes found" row.
    """
    tool = tool_version or driver_version
    version_line = _table_line(f"{f'npu-smi {tool}':<33}{f'Version: {driver_version}':<{TABLE_WIDTH - 36}}")
    lines = [_RULE, version_line, _COLUMN_RULE, *_NPU_HEADER, _BLOCK_RULE]
    for npu in npus:
        lines.extend(_status_rows(npu))
    lines += [_COLUMN_RULE, _PROCESS_HEADER, _BLOCK_RULE]
    lines += _process_rows(_unique_in_order(npu.npu_id for npu in npus), processes)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# npu-smi info: parsing
# ---------------------------------------------------------------------------

_VERSION_RE = re.compile(r"npu-smi\s+(?P<tool>\S+)\s+Version:\s*(?P<driver>\S+)")
_BUS_ID_RE = re.compile(r"^(?:[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]|NA)$")
_PAIR_RE = r"(\S+?)\s*/\s*(\S+)"  # "3408 / 65536", "41052/ 65536", "0    / 0"
_STATUS_METRICS_RE = re.compile(rf"^(?P<power>\S+)\s+(?P<temp>\S+)\s+{_PAIR_RE}$")
_CHIP_METRICS_RE = re.compile(rf"^(?P<aicore>\S+)\s+{_PAIR_RE}(?:\s+{_PAIR_RE})?$")
_NO_PROCESS_RE = re.compile(r"No running processes found in NPU\s+(\d+)")


def _cells(line: str) -> list[str]:
    """The stripped cells of a "| a | b |" line; [] for rules and other text."""
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|")):
        return []
    return [cell.strip() for cell in stripped[1:-1].split("|")]


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_chip_row(cells: list[str]) -> bool:
    return len(cells) == 3 and bool(_BUS_ID_RE.match(cells[1]))


def _status_row_fields(cells: list[str]) -> dict[str, Any] | None:
    if len(cells) != 3:
        return None
    first = cells[0].split(None, 1)
    metrics = _STATUS_METRICS_RE.match(cells[2])
    if len(first) != 2 or not first[0].isdigit() or not metrics:
        return None
    power, temp, hp_used, hp_total = metrics.groups()
    return {
        "npu_id": int(first[0]),
        "name": first[1],
        "health": cells[1],
        "power_w": _float_or_none(power),
        "temp_c": _int_or_none(temp),
        "hugepages_used": int(hp_used),
        "hugepages_total": int(hp_total),
    }


def _chip_row_fields(cells: list[str]) -> dict[str, Any] | None:
    ids = cells[0].split()
    metrics = _CHIP_METRICS_RE.match(cells[2])
    if not ids or not all(part.isdigit() for part in ids) or not metrics:
        return None
    aicore, mem_used, mem_total, hbm_used, hbm_total = metrics.groups()
    return {
        "chip_id": int(ids[0]),
        "phy_id": int(ids[1]) if len(ids) > 1 else None,
        "bus_id": cells[1],
        "aicore_pct": _int_or_none(aicore),
        "memory_used_mb": int(mem_used),
        "memory_total_mb": int(mem_total),
        "hbm_used_mb": _int_or_none(hbm_used) if hbm_used else None,
        "hbm_total_mb": _int_or_none(hbm_total) if hbm_total else None,
    }


def _process_from_cells(cells: list[str]) -> NpuProcess | None:
    ids = cells[0].split()
    if len(cells) != 4 or len(ids) != 2 or not all(part.isdigit() for part in ids):
        return None
    if not cells[1].isdigit() or not cells[3].isdigit():
        return None
    return NpuProcess(int(ids[0]), int(ids[1]), int(cells[1]), cells[2], int(cells[3]))


def _is_process_header(cells: list[str]) -> bool:
    return any(cell.startswith("Process id") for cell in cells)


def parse_info(text: str) -> InfoResult:
    """Parse ``npu-smi info``.

    Accepts full tables and published excerpts (lines that are not table rows,
    such as "...", are skipped). A chip row (the one with a Bus-Id) completes
    the status row above it; process rows are read once the process header
    has been seen, so they can never be mistaken for chips.
    """
    header = _VERSION_RE.search(text)
    tool_version, driver_version = (header["tool"], header["driver"]) if header else ("", "")
    npus: list[NpuStatus] = []
    processes: list[NpuProcess] = []
    pending: dict[str, Any] | None = None
    in_processes = False
    for line in text.splitlines():
        cells = _cells(line)
        if not cells:
            continue
        if _is_process_header(cells):
            in_processes = True
        elif in_processes:
            process = _process_from_cells(cells)
            if process:
                processes.append(process)
        elif _is_chip_row(cells):
            chip = _chip_row_fields(cells)
            if pending is not None and chip is not None:
                npus.append(NpuStatus(**pending, **chip))
            pending = None
        else:
            pending = _status_row_fields(cells) or pending
    return InfoResult(tool_version, driver_version, npus, processes)


# ---------------------------------------------------------------------------
# From the emulated hardware state (hwstate.board() / npu_processes())
# ---------------------------------------------------------------------------


def processes_from_records(records: Iterable[Mapping[str, Any]]) -> list[NpuProcess]:
    """hwstate records {"pid", "name", "npu", "chip", "memory_mb"}, grouped by NPU and chip."""
    found = [
        NpuProcess(
            int(r["npu"]), int(r.get("chip", 0)), int(r["pid"]), str(r.get("name", "")), int(r["memory_mb"])
        )
        for r in records
    ]
    return sorted(found, key=lambda process: (process.npu_id, process.chip_id))


def npus_from_board(board: Mapping[str, Any], processes: Sequence[NpuProcess] = ()) -> list[NpuStatus]:
    """Turn hwstate.board() into table rows.

    HBM used = the board's idle figure plus what the NPU's processes hold,
    capped at the total: the driver never reports more than the chip has.
    """
    hbm_total = int(board["hbm_total_mb"])
    statuses = []
    for npu in board["npus"]:
        held = sum(process.memory_mb for process in processes if process.npu_id == npu["id"])
        statuses.append(
            NpuStatus(
                npu_id=int(npu["id"]),
                name=str(board["npu_smi_name"]),
                health=str(npu["health"]),
                power_w=float(npu["power_w"]),
                temp_c=int(npu["temp_c"]),
                hugepages_used=0,
                hugepages_total=0,
                chip_id=int(npu.get("chip_id", 0)),
                bus_id=str(npu["bus_id"]),
                aicore_pct=int(npu.get("aicore_pct", 0)),
                memory_used_mb=int(npu.get("memory_used_mb", 0)),
                memory_total_mb=int(board.get("memory_total_mb", 0)),
                hbm_used_mb=min(int(npu.get("hbm_used_mb", 0)) + held, hbm_total),
                hbm_total_mb=hbm_total,
            )
        )
    return statuses


def mapping_from_board(board: Mapping[str, Any]) -> list[MappingRow]:
    """Each 910B card has its NPU chip plus an Mcu chip with no device node (section 2.5)."""
    rows = []
    for npu in board["npus"]:
        chip_id = int(npu.get("chip_id", 0))
        name = f"Ascend {board['npu_smi_name']}"
        rows.append(MappingRow(int(npu["id"]), chip_id, int(npu["logic_id"]), name))
        rows.append(MappingRow(int(npu["id"]), chip_id + 1, None, "Mcu"))
    return rows


# ---------------------------------------------------------------------------
# key : value outputs (-t board, -l, -c chip board)
# ---------------------------------------------------------------------------

_KEY_INDENT = " " * 8
_KEY_WIDTH = 31


def render_key_values(groups: Sequence[Sequence[tuple[str, object]]]) -> str:
    """Groups of "        <key padded to 31>: <value>" lines, separated by a blank line.

    Layout of every key/value query in yunionio/telegraf npu_smi_test.go.
    """
    blocks = ["\n".join(_key_value_line(key, value) for key, value in group) for group in groups]
    return "\n\n".join(blocks) + "\n"


def _key_value_line(key: str, value: object) -> str:
    return f"{_KEY_INDENT}{key:<{_KEY_WIDTH}}: {value}"


def _key_value_lines(text: str) -> Iterable[tuple[str, str]]:
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip():
            yield key.strip(), value.strip()


def render_board(fields: Sequence[tuple[str, object]]) -> str:
    """``npu-smi info -t board -i N`` (also the chip view with ``-c``)."""
    return render_key_values([fields])


def parse_board(text: str) -> dict[str, str]:
    """Key -> value of a board (or any single key/value) query.

    Splits on the first colon only: values such as "0000:C1:00.0" keep theirs.
    """
    return dict(_key_value_lines(text))


def board_fields(
    board: Mapping[str, Any],
    npu: Mapping[str, Any],
    driver_version: str,
    firmware_version: str | None,
    compatibility: str,
) -> list[tuple[str, object]]:
    """Fields and order of telegraf's ``boardOutput`` (910B, 25.5.1)."""
    return [
        ("NPU ID", npu["id"]),
        ("Product Name", board["product_name"]),
        ("Model", "NA"),
        ("Manufacturer", "Huawei"),
        ("Serial Number", npu["serial"]),
        ("Software Version", driver_version),
        ("Firmware Version", firmware_version or "NA"),
        ("Compatibility", compatibility),
        ("Board ID", board["board_id"]),
        ("PCB ID", "A"),
        ("BOM ID", 1),
        ("PCIe Bus Info", npu["bus_id"]),
        ("Slot ID", npu["id"]),  # inferred: the published NPU 0 shows Slot ID 0
        ("Class ID", "NA"),
        ("PCI Vendor ID", "0x19E5"),
        ("PCI Device ID", board["pci_device_id"]),
        ("Subsystem Vendor ID", board["subsystem_vendor_id"]),
        ("Subsystem Device ID", board["subsystem_device_id"]),
        ("Chip Count", 1),
    ]


def _die_id(serial: str, salt: str) -> str:
    # Real die ids are fused per chip; any stable per-serial value will do for the lab.
    digits = hashlib.sha1(f"{salt}:{serial}".encode(), usedforsecurity=False).hexdigest().upper()
    return " ".join(digits[i : i + 8] for i in range(0, 40, 8))


def chip_board_fields(
    board: Mapping[str, Any], npu: Mapping[str, Any], firmware_version: str | None
) -> list[tuple[str, object]]:
    """``npu-smi info -t board -i N -c C``: field list from Ascend/mind-cluster
    docs/zh/faultdiag/user_guide.md (an older 910 capture); die ids are made up."""
    return [
        ("NPU ID", npu["id"]),
        ("Chip ID", npu.get("chip_id", 0)),
        ("Chip Type", "Ascend"),
        ("Chip Name", board["npu_smi_name"]),
        ("Chip Version", "V1"),
        ("Board ID", board["board_id"]),
        ("PCB ID", "NA"),
        ("BOM ID", 1),
        ("VDie ID", _die_id(str(npu["serial"]), "v")),
        ("NDie ID", _die_id(str(npu["serial"]), "n")),
        ("Chip Position ID", npu.get("chip_id", 0)),
        ("PCIe Bus Info", npu["bus_id"]),
        ("Firmware Version", firmware_version or "NA"),
    ]


def render_list(npus: Sequence[ListEntry]) -> str:
    """``npu-smi info -l``: "Total Count" then one NPU ID / Chip Count pair per card.

    Layout of ``listOutput`` in yunionio/telegraf plugins/inputs/npu_smi/npu_smi_test.go.
    """
    groups = [[("Total Count", len(npus))]]
    groups += [[("NPU ID", entry.npu_id), ("Chip Count", entry.chip_count)] for entry in npus]
    return render_key_values(groups)


def parse_list(text: str) -> ListResult:
    total = 0
    entries: list[ListEntry] = []
    npu_id: int | None = None
    for key, value in _key_value_lines(text):
        if key == "Total Count" and value.isdigit():
            total = int(value)
        elif key == "NPU ID" and value.isdigit():
            npu_id = int(value)
        elif key == "Chip Count" and value.isdigit() and npu_id is not None:
            entries.append(ListEntry(npu_id, int(value)))
            npu_id = None
    return ListResult(total, entries)


# ---------------------------------------------------------------------------
# npu-smi info -m
# ---------------------------------------------------------------------------

_MAPPING_HEADER = ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")
_MAPPING_WIDTH = 31
_MAPPING_NAME_WIDTH = 30


def _mapping_name(name: str) -> str:
    # Real output pads the header and "Mcu" names to 30 but prints "Ascend 910B3"
    # bare (openJiuwen-ai/sciencediscovery NPU_SMI_MAPPING_910B3, verbatim).
    return name if name.startswith("Ascend") else f"{name:<{_MAPPING_NAME_WIDTH}}"


def _mapping_line(npu_id: object, chip_id: object, logic_id: object, name: str) -> str:
    columns = "".join(f"{value!s:<{_MAPPING_WIDTH}}" for value in (npu_id, chip_id, logic_id))
    return f"\t{columns}{_mapping_name(name)}"


def render_mapping(rows: Sequence[MappingRow]) -> str:
    """``npu-smi info -m``: tab-indented, columns padded to 31 (910B layout, no Phy-ID)."""
    lines = [_mapping_line(*_MAPPING_HEADER)]
    lines += [_mapping_line(r.npu_id, r.chip_id, _text_or_dash(r.logic_id), r.chip_name) for r in rows]
    return "\n".join(lines) + "\n"


def parse_mapping(text: str) -> list[MappingRow]:
    """Rows of ``npu-smi info -m``, Mcu rows included (``logic_id`` None).

    Columns are whitespace separated; the name is the rest of the line, as it
    holds a space ("Ascend 910B3"). An A3 header with "Phy-ID" adds one column.
    """
    id_columns = 3
    rows = []
    for line in text.splitlines():
        if "NPU ID" in line:
            id_columns = 4 if "Phy-ID" in line else 3
            continue
        parts = line.split()
        if len(parts) <= id_columns or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        logic = parts[2]
        if not (logic.isdigit() or logic == "-"):
            continue
        phy_id = _int_or_none(parts[3]) if id_columns == 4 else None
        name = " ".join(parts[id_columns:])
        rows.append(MappingRow(int(parts[0]), int(parts[1]), _int_or_none(logic), name, phy_id))
    return rows


# ---------------------------------------------------------------------------
# Driver/firmware compatibility
# ---------------------------------------------------------------------------

_RANGE_RE = re.compile(r"\[\s*([^\],\[]+?)\s*,\s*([^\],\[]+?)\s*\]")


def firmware_in_ranges(firmware: str, ranges_text: str) -> bool:
    """Whether ``firmware`` lies in one of the driver's ``compatible_version_fw`` ranges.

    ``ranges_text`` is e.g. "[7.0.0,7.5.99]" or "[7.0.0,7.2.99],[8.0.0,8.9.9]"; the comparison is
    `dsctl.core.hostfacts.versionorder.in_ranges`, the one dsctl's own checks use.
    """
    return versionorder.in_ranges(firmware, _RANGE_RE.findall(ranges_text))


def compatibility_verdict(firmware: str | None, ranges_text: str | None) -> str:
    """The board query's Compatibility field.

    Values documented for ``npu-smi info -t board``: OK, NOK, UNKNOWN (firmware
    install abnormal or firmware too old to say), NOT SUPPORT (hiascend.com
    Atlas 200I A2 23.0.RC3 npusmi_008; DCMI_COMPAT_OK/NOK/UNKNOWN in the DCMI API).
    """
    if not firmware or not ranges_text or not _RANGE_RE.search(ranges_text):
        return "UNKNOWN"
    return "OK" if firmware_in_ranges(firmware, ranges_text) else "NOK"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

_DCMI_RET_RE = re.compile(r"dcmi .*?ret is (-\d+)")


def dcmi_error_code(text: str) -> int | None:
    """The DCMI return code of a failed npu-smi ("... ret is -8005"), if any.

    -8005 = DCMI_ERR_CODE_INNER_ERR (driver not usable, e.g. after an upgrade
    without reboot); -8020 = device used by another container.
    """
    match = _DCMI_RET_RE.search(text)
    return int(match[1]) if match else None
