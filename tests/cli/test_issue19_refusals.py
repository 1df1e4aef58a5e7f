"""Small refusals of issue 19 item 9: each is one line naming the option or setting and the fix, exit 2, before
any work starts (nothing is simulated, built or contacted)."""

from __future__ import annotations

import os

import pytest

from dsctl.app import main

from .test_probe_cli import one_error_line


def test_tune_simulate_refuses_zero_slots(capsys):
    # Before: `slots or 1` ran 0 slots as 1.
    assert main(["tune", "--simulate", "--model", "r1-7b", "--slo", "ttft=200ms", "--slots", "0"]) == 2
    assert "--slots must be at least 1, got 0" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["check"], ["deploy", "--render"], ["provision"]])
def test_a_non_regular_inventory_is_not_called_missing(capsys, tmp_path, command):
    fifo = tmp_path / "inventory.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        assert main([command[0], path, *command[1:]]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"inventory: {path} is not a file or directory of an inventory" in line
