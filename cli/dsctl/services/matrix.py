"""The matrix verb (`dsctl matrix`): every driver / firmware / CANN / vllm-ascend combination dsctl can install,
from the releases data (dsctl.core.fleet.matrix decides which pass), with the default stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsctl import data
from dsctl.core.fleet.matrix import INFERRED_STATUS, matrix_rows

# What each row's status means (the --json result carries it too).
STATUS_MEANINGS = {
    "official": "Huawei's or vllm-ascend's recommended HDK for the CANN, with vllm-ascend's official matrix row",
    "observed": "the driver/CANN pair was seen working on real hosts",
    INFERRED_STATUS: "only the version files' compatibility fields vouch for it; verify on hardware",
}


@dataclass(frozen=True)
class MatrixResult:
    rows: list[dict[str, Any]]  # matrix_rows: one per combination, the default stack's marked "default"
    default_stack: dict[str, str]  # driver, firmware, cann, vllm_ascend

    def to_dict(self) -> dict[str, Any]:
        return {"default_stack": self.default_stack, "statuses": STATUS_MEANINGS, "rows": self.rows}


def matrix() -> MatrixResult:
    releases = data.load("releases")
    default = {key: releases["default_stack"][key] for key in ("driver", "firmware", "cann", "vllm_ascend")}
    return MatrixResult(rows=matrix_rows(releases), default_stack=default)
