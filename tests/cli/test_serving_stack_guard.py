"""serving_stack's last check before it removes the directory at dsctl_serving_venv: the role's own tasks, taken
from roles/serving_stack/tasks/main.yml and run by real ansible-playbook over the local connection."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import run_local_playbook

ROOT = Path(__file__).resolve().parents[2]
GUARDED = ["Look at the serving venv path", "Look for dsctl's marks in the directory at the serving venv path",
           "Refuse to remove a directory dsctl did not make",
           "Remove a serving venv made before venvs were kept per stack"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role's tasks run as root")


def role_tasks() -> list[dict]:
    tasks = yaml.safe_load((ROOT / "roles/serving_stack/tasks/main.yml").read_text())
    chosen = [task for task in tasks if task.get("name") in GUARDED]
    assert [task["name"] for task in chosen] == GUARDED  # renamed or reordered: update GUARDED
    return chosen


def run_guard(tmp_path: Path, venv: str) -> subprocess.CompletedProcess:
    defaults = yaml.safe_load((ROOT / "roles/serving_stack/defaults/main.yml").read_text())
    playbook = tmp_path / "guard.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"serving_stack_pins": {"vllm": "0.13.0"}, "serving_stack_venv": venv,
                 "serving_stack_marker": defaults["serving_stack_marker"]},
        "tasks": role_tasks()}]))
    return run_local_playbook(playbook)


@pytest.mark.parametrize("mark", [".dsctl-managed", "dsctl-requirements.txt"])
def test_a_venv_dsctl_made_is_removed(tmp_path, mark):
    venv = tmp_path / "serving-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / mark).write_text("")
    run = run_guard(tmp_path, str(venv))
    assert run.returncode == 0, run.stdout + run.stderr
    assert not venv.exists()


@pytest.mark.parametrize("suffix", ["", "/"])
def test_a_directory_without_dsctl_s_mark_or_with_a_trailing_slash_is_kept(tmp_path, suffix):
    venv = tmp_path / "serving-venv"
    (venv / "bin").mkdir(parents=True)
    if suffix:
        (venv / ".dsctl-managed").write_text("")  # marked, but the path is not the normalised one
    run = run_guard(tmp_path, str(venv) + suffix)
    assert run.returncode != 0
    assert "dsctl did not make" in run.stdout and "nothing was removed" in run.stdout, run.stdout
    assert (venv / "bin").is_dir()
