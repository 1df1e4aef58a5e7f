"""`dsctl matrix`: the driver / firmware / CANN / vllm-ascend combinations dsctl can install."""

from __future__ import annotations

from typing import Annotated

import typer

from dsctl import data, ui
from dsctl.core.fleet.matrix import INFERRED_STATUS, matrix_rows

STATUS_MEANINGS = {
    "official": "Huawei's or vllm-ascend's recommended HDK for the CANN, with vllm-ascend's official matrix row",
    "observed": "the driver/CANN pair was seen working on real hosts",
    INFERRED_STATUS: "only the version files' compatibility fields vouch for it; verify on hardware",
}
COLUMNS = ["", "driver", "firmware", "CANN", "kernels", "vllm-ascend", "torch", "torch-npu", "status", "warnings"]


def show(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False) -> None:
    """List every supported combination from the releases data; * marks the default stack."""
    releases = data.load("releases")
    rows = matrix_rows(releases)
    if as_json:
        default = {key: releases["default_stack"][key] for key in ("driver", "firmware", "cann", "vllm_ascend")}
        ui.emit_json(["matrix"], {"default_stack": default, "statuses": STATUS_MEANINGS, "rows": rows})
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
