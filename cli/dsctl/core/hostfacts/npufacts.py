"""One host's NPU picture from the text `npu-smi` printed on it (pure)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dsctl.core.hostfacts.npusmi import parse_board, parse_info

BOARD_MARKER = "@@board"
# Read over SSH exactly what an operator would type; the output is parsed on the controller.
NPU_QUERY = f"npu-smi info && echo '{BOARD_MARKER}' && npu-smi info -t board -i 0"
COMMAND_NOT_FOUND = 127


def summarize(exit_code: int, stdout: str, stderr: str) -> dict[str, Any]:
    if exit_code == COMMAND_NOT_FOUND:
        return {"note": "no driver: npu-smi not installed"}
    info_text, _, board_text = stdout.partition(BOARD_MARKER + "\n")
    if exit_code != 0 and not info_text.strip().startswith("+"):
        message = (stdout.strip() or stderr.strip()).splitlines()
        return {"note": message[-1] if message else f"npu-smi exited {exit_code}"}
    info = parse_info(info_text)
    board = parse_board(board_text) if board_text.strip() else {}
    names = Counter(npu.name for npu in info.npus)
    sick = [f"NPU {npu.npu_id} {npu.health}" for npu in info.npus if npu.health != "OK"]
    return {
        "driver": info.driver_version,
        "firmware": board.get("Firmware Version", "-"),
        "compatibility": board.get("Compatibility", "-"),
        "npus": ", ".join(f"{count} x {name}" for name, count in names.items()),
        "health": "; ".join(sick) if sick else "OK",
        "hbm": f"{sum(n.hbm_used_mb or 0 for n in info.npus)}/{sum(n.hbm_total_mb or 0 for n in info.npus)}",
    }
