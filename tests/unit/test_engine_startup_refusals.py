"""``dsctl engine serve`` refuses bad arguments in one line, exit 1, before it binds or serves (issue 19 item 9)."""

from __future__ import annotations

import pytest

from dsctl.engine import __main__ as engine_main

MODEL = "deepseek-r1-distill-qwen-7b"


def _refusal(capsys, *argv: str) -> str:
    assert engine_main.main(["serve", MODEL, *argv]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_model_len_zero_or_negative_is_refused(capsys, value):
    assert _refusal(capsys, "--max-model-len", value) == f"ValueError: --max-model-len must be positive, got {value}"


@pytest.mark.parametrize("value", ["70000", "-1"])
def test_port_out_of_range_is_one_line(capsys, value):
    assert _refusal(capsys, "--port", value) == f"ValueError: --port must be 0..65535, got {value}"


def test_record_into_a_missing_directory_is_one_line(capsys, tmp_path):
    path = tmp_path / "nowhere" / "record.jsonl"
    line = _refusal(capsys, "--port", "0", "--record", str(path))
    assert line.startswith(f"ValueError: --record {path}: directory {path.parent} does not exist")


def test_record_that_is_a_directory_is_one_line(capsys, tmp_path):
    assert "is a directory" in _refusal(capsys, "--port", "0", "--record", str(tmp_path))
