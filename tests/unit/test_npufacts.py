"""Summaries of what npu-smi printed on a host."""

from __future__ import annotations

from pathlib import Path

from dsctl.core.hostfacts import npufacts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu_smi"


def test_summary_of_an_eight_chip_host_with_board_info():
    stdout = (FIXTURES / "info_910b3_x8_25.2.0.txt").read_text() + "@@board\n" + (
        FIXTURES / "board_910b_25.5.1.txt").read_text()
    summary = npufacts.summarize(0, stdout, "")
    assert summary == {
        "driver": "25.2.0",
        "firmware": "7.8.0.6.201",
        "compatibility": "OK",
        "npus": "8 x 910B3",
        "health": "OK",
        "hbm": f"{3408 * 2 + 41052 + 3390 + 3403 + 3400 + 3401 + 3400}/{65536 * 8}",
    }


def test_missing_npu_smi_means_no_driver():
    assert npufacts.summarize(127, "", "bash: npu-smi: command not found") == {
        "note": "no driver: npu-smi not installed"}


def test_a_driver_that_is_not_loaded_reports_the_dcmi_error():
    summary = npufacts.summarize(215, "", "dcmi module initialize failed. ret is -8005\n")
    assert summary == {"note": "dcmi module initialize failed. ret is -8005"}


def test_an_unhealthy_chip_is_named():
    text = (FIXTURES / "info_910b3_x8_25.2.0.txt").read_text()
    sick = text.replace("| 3     910B3               | OK    ", "| 3     910B3               | Alarm ", 1)
    assert npufacts.summarize(0, sick, "")["health"] == "NPU 3 Alarm"
