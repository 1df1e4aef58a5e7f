"""`dsctl matrix`: the driver / firmware / CANN / vllm-ascend combinations dsctl can install."""

from __future__ import annotations

from typing import Annotated

import typer

from dsctl import ui
from dsctl.services.matrix import STATUS_MEANINGS, matrix

COLUMNS = ["", "driver", "firmware", "CANN", "kernels", "vllm-ascend", "torch", "torch-npu", "status", "warnings"]


def show(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False) -> None:
    """List every supported combination from the releases data; * marks the default stack."""
    result = matrix()
    rows = result.rows
    if as_json:
        ui.emit_json(["matrix"], result.to_dict())
        return
    ui.print_table(
        "Supported stacks (dsctl/data/releases.yaml)",
        COLUMNS,
        [["*" if row["default"] else "", row["driver"], row["firmware"], row["cann"], row["kernels_package"],
          row["vllm_ascend"] or "-", row["torch"] or "-", row["torch_npu"] or "-", row["status"],
          len(row["warnings"]) or ""] for row in rows],
    )
    console = ui.stdout_console()
    console.print("* default stack (used for every dsctl_*_version the inventory leaves unset)", markup=False)
    for status, meaning in STATUS_MEANINGS.items():
        console.print(f"{status} = {meaning}", markup=False)
    console.print("warnings: accepted although a compatibility field disagrees; --json gives the text", markup=False)
