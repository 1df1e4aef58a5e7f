"""Typer/Click usage errors are one line, `dsctl: error: <option>: <problem>`, exit 2; --help stays as it was."""

from __future__ import annotations

import pytest

from dsctl.app import main


@pytest.mark.parametrize("args, line", [
    (["probe", "http://127.0.0.1:9", "--concurrency", "x"], "--concurrency: 'x' is not a valid integer"),
    (["probe", "http://127.0.0.1:9", "--burstiness", "x"], "--burstiness: 'x' is not a valid float"),
    (["estimate"], "--chip: required option is missing"),
    (["provision"], "INVENTORY: required argument is missing"),
    (["provision", "inv.yml", "--forks", "0"], "--forks: '0' should be greater than or equal to 1"),
    (["lab", "up", "--hosts"], "--hosts: requires an argument"),
    (["matrix", "--json=3"], "--json: does not take a value"),
    (["deploy", "inv.yml", "--serial", "many"], "--serial: 'many' is not a valid integer"),
    (["bogus"], "no such command 'bogus'"),
    (["matrix", "extra"], "got unexpected extra argument(s) (extra)"),
])
def test_usage_errors_are_one_line(capsys, args, line):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err == f"dsctl: error: {line}\n"
    assert captured.out == ""


def test_a_bad_choice_names_the_argument_and_the_choices(capsys):
    assert main(["lab", "fault", "lab-01", "melt-down"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsctl: error: KIND: 'melt-down' is not one of 'chip-unhealthy', ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("args", [["--help"], ["deploy", "--help"], ["probe", "--help"], ["lab", "up", "--help"]])
def test_help_is_unchanged(capsys, args):
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "Usage: dsctl" in captured.out and "Options" in captured.out and captured.err == ""


def test_no_command_shows_the_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "Usage: dsctl" in capsys.readouterr().out
