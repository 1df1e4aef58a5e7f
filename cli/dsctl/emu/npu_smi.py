"""The emulated ``npu-smi`` of a lab host (installed as /usr/local/bin/npu-smi).

Standard library plus dsctl.emu.hwstate and dsctl.core.hostfacts.npusmi only: it is
packed into a self-contained zipapp by the driver .run package.

Supported: ``info``, ``info -t board -i N [-c C]``, ``info -m``, ``info -l``,
``info -h``. What it shows comes from the emulated hardware:

* driver version = the driver loaded at boot (``running()["driver"]``), so an
  installed-but-not-rebooted upgrade still shows the old version, as on a real
  host (ascend-interfaces.md section 2.2);
* firmware = the firmware active at boot (``running()["firmware"]``);
* health, power, HBM from ``board()``; processes from ``npu_processes()``.

Messages and exit codes, and where they come from:

* driver not loaded / no board: "dcmi module initialize failed. ret is -8005"
  (Ascend/mind-cluster FAQ: printed by ``npu-smi info`` after an NPU driver or
  firmware upgrade without reboot; also longllovers/Deploying-DeepSeek-on-Ascend-910A).
  Printed on stderr as in the failure fixture of openJiuwen-ai/sciencediscovery
  npu-devices.test.ts.
* exit status 215: observed for ``npu-smi info -t board -i 1`` when that card
  is not present (a public verl-on-Ascend recipe's notes) and for a failed ``-t proc-mem`` query;
  used here for every failure (inferred for the -8005 case).
* "Error parameter of -t" followed by the ``info`` usage: real output for an
  unsupported -t type (openyuanrong/runtime, heterogeneous_collector unit test). The same pattern for
  a bad -i/-c value is inferred, as is the bad-card message below.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsctl.core.hostfacts import npusmi
from dsctl.emu import hwstate

EXIT_OK = 0
EXIT_FAILURE = 215  # see module docstring
DCMI_INIT_FAILED = "dcmi module initialize failed. ret is -8005"
INVALID_CARD = "The card id {card} is invalid."  # inferred: no published capture found
INVALID_CHIP = "The chip id {chip} is invalid."  # inferred

# `npu-smi info -h` of the 910B generation (options as quoted from `npu-smi info --help`
# by a public 910B project; command list as in the openyuanrong/runtime collector test).
INFO_USAGE = """\
Usage: npu-smi info <watch|proc|-h|-m|-l|-t type> [Options...]

Commands:
       watch          Show all device's status in scrolling format
       proc           Show device's matrix process status in scrolling format
       -h, --help     Show this help text and exit
       -m             Show all device's mapping information
       -l             Show all device's topology information
       -t type        Show information for type
                      type: board, flash, memory, usages, sensors, temp, power, volt, mac-addr,
                            common, health, product, ecc, ip, sys-time, i2c_check, work-mode,
                            ecc-enable, p2p-enable, ssh-enable, license, customized-info,
                            device-share, nve-level, aicpu-config, pcie-err, mcu-monitor,
                            err-count, boot-area, vnpu-mode, info-vnpu, vnpu-svm, cpu-num-cfg,
                            first-power-on-date, proc-mem, phyid-remap, vnpu-cfg-recover, key-manage,
                            template-info, pkcs-enable, p2p-mem-cfg, pwm-mode, pwm-duty-ratio,
                            boot-select, topo, hccs, sio-info, spod-info, tls-csr-get, tls-cert,
                            tls-cert-period, rootkey, hccs-bw.

Options:
       -i %d          Card ID
       -c %d          Chip ID
       -p %d          Chip Physical ID
"""

# Inferred: the top-level help was not found in any public capture.
TOP_USAGE = """\
Usage: npu-smi <info|set|clear|upgrade|-h|-v> [Options...]
"""

EMULATED_TYPES = ("board",)


class UsageError(Exception):
    """Bad command line; the message is printed before the usage text."""


@dataclass(frozen=True)
class Request:
    action: str  # "table", "board", "mapping", "list", "help"
    card: int | None = None
    chip: int | None = None


def _option_values(args: Sequence[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    position = 0
    while position < len(args):
        option = args[position]
        if option not in ("-t", "-i", "-c", "-p"):
            raise UsageError(f"Error parameter of {option}")
        if position + 1 >= len(args):
            raise UsageError(f"Error parameter of {option}")
        values[option] = args[position + 1]
        position += 2
    return values


def _int_option(values: dict[str, str], option: str) -> int | None:
    if option not in values:
        return None
    text = values[option]
    if not text.isdigit():
        raise UsageError(f"Error parameter of {option}")
    return int(text)


def parse_command_line(args: Sequence[str]) -> Request:
    if not args or args[0] != "info":
        raise UsageError("")
    rest = list(args[1:])
    if not rest:
        return Request("table")
    if rest[0] in ("-h", "--help"):
        return Request("help")
    if rest == ["-m"]:
        return Request("mapping")
    if rest == ["-l"]:
        return Request("list")
    values = _option_values(rest)
    if values.get("-t") not in EMULATED_TYPES:
        raise UsageError("Error parameter of -t")
    card = _int_option(values, "-i")
    if card is None:
        raise UsageError("Error parameter of -i")
    return Request("board", card=card, chip=_int_option(values, "-c"))


class DeviceError(Exception):
    """A failure npu-smi reports after talking to the driver."""


def _loaded_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """The board and this boot's driver; DCMI init fails without either."""
    running = hwstate.running()
    if running.get("driver") is None or not hwstate.present():
        raise DeviceError(DCMI_INIT_FAILED)
    return hwstate.board(), running


def _find_npu(board: dict[str, Any], card: int) -> dict[str, Any]:
    for npu in board["npus"]:
        if int(npu["id"]) == card:
            return npu
    raise DeviceError(INVALID_CARD.format(card=card))


def _board_text(board: dict[str, Any], running: dict[str, Any], card: int, chip: int | None) -> str:
    npu = _find_npu(board, card)
    firmware = running.get("firmware")
    if chip is not None:
        if chip != int(npu.get("chip_id", 0)):
            raise DeviceError(INVALID_CHIP.format(chip=chip))
        return npusmi.render_board(npusmi.chip_board_fields(board, npu, firmware))
    driver = running["driver"]
    verdict = npusmi.compatibility_verdict(firmware, driver.get("compatible_version_fw"))
    return npusmi.render_board(npusmi.board_fields(board, npu, driver["version"], firmware, verdict))


def _table_text(board: dict[str, Any], running: dict[str, Any]) -> str:
    processes = npusmi.processes_from_records(hwstate.npu_processes())
    npus = npusmi.npus_from_board(board, processes)
    return npusmi.render_info(running["driver"]["version"], npus, processes)


def _list_text(board: dict[str, Any]) -> str:
    return npusmi.render_list([npusmi.ListEntry(int(npu["id"]), 1) for npu in board["npus"]])


def render_request(request: Request) -> str:
    board, running = _loaded_state()
    if request.action == "board":
        return _board_text(board, running, request.card, request.chip)
    if request.action == "mapping":
        return npusmi.render_mapping(npusmi.mapping_from_board(board))
    if request.action == "list":
        return _list_text(board)
    return _table_text(board, running)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        request = parse_command_line(args)
    except UsageError as error:
        message = str(error)
        sys.stdout.write((message + "\n" if message else "") + (INFO_USAGE if message else TOP_USAGE))
        return EXIT_FAILURE
    if request.action == "help":
        sys.stdout.write(INFO_USAGE)
        return EXIT_OK
    try:
        sys.stdout.write(render_request(request))
    except DeviceError as error:
        sys.stderr.write(f"{error}\n")
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
