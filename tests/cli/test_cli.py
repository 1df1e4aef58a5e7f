"""The dsctl command as users meet it: help, version, exit codes, the installed wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsctl import __version__
from dsctl.app import main

REPO = Path(__file__).resolve().parents[2]
LAB_COMMANDS = ["up", "down", "status", "fault", "packages"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    # A bare environment, but the package under test (PYTHONPATH in a worktree) stays the one imported.
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "dsctl", *args], capture_output=True, text=True, env=env)


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"dsctl {__version__}"


@pytest.mark.parametrize("command", [[], ["lab"], *(["lab", c] for c in LAB_COMMANDS)])
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: dsctl" in result.stdout


def test_shell_completion_is_offered():
    assert "--install-completion" in run_cli("--help").stdout


def test_unknown_option_is_a_usage_error():
    result = run_cli("lab", "up", "--hostz", "3")
    assert result.returncode == 2
    assert result.stderr == "dsctl: error: --hostz: no such option; did you mean --hosts or --root?\n"


def test_fault_kind_is_checked_before_anything_runs(capsys):
    assert main(["lab", "fault", "lab-01", "melt-down"]) == 2
    assert "melt-down" in capsys.readouterr().err


def test_packages_to_an_unwritable_place_names_the_option(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("lab", "packages", "--out", str(blocker / "sub"))
    assert result.returncode == 2  # refused before any package is built (adapters/output_paths)
    assert result.stderr.startswith("dsctl: error: --out ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_wheel_carries_the_ansible_side(tmp_path: Path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    wheel = next(tmp_path.glob("dsctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ("dsctl/_assets/ansible.cfg", "dsctl/data/releases.yaml", "dsctl/data/chips.yaml",
                     "dsctl/emu/npu_smi.py", "dsctl/lab/hostinit.py"):
        assert expected in names
    for asset_dir in ("playbooks", "roles", "templates", "inventories"):
        assert any(name.startswith(f"dsctl/_assets/{asset_dir}/") for name in names), asset_dir
