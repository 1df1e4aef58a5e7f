"""dsctl_stage_files (playbooks/action_plugins): many controller files to a host in one transfer, run by real
ansible-playbook over the local connection."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import run_local_playbook

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the staged files are owned by root")


def stage(tmp_path: Path, src: Path, files: list[str], dest: Path) -> subprocess.CompletedProcess:
    playbook = tmp_path / "stage.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Stage", "dsctl_stage_files": {"src": str(src), "files": files, "dest": str(dest)},
                   "register": "staged"},
                  {"name": "Keep the result", "ansible.builtin.copy": {
                      "content": "{{ staged | to_json }}", "dest": str(tmp_path / "result.json"), "mode": "0600"}}]}]))
    return run_local_playbook(playbook)


def result_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "result.json").read_text())


def test_only_the_named_files_arrive_once_and_a_second_run_changes_nothing(tmp_path):
    src, dest = tmp_path / "wheelhouse", tmp_path / "staging"
    src.mkdir()
    dest.mkdir()
    for name in ("a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl", "unrelated.whl"):
        (src / name).write_bytes(name.encode() * 100)
    first = stage(tmp_path, src, ["b-2.0-py3-none-any.whl", "a-1.0-py3-none-any.whl"], dest)
    assert first.returncode == 0, first.stdout + first.stderr
    assert result_of(tmp_path)["changed"] is True
    assert sorted(p.name for p in dest.iterdir()) == ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"]
    assert (dest / "a-1.0-py3-none-any.whl").read_bytes() == (src / "a-1.0-py3-none-any.whl").read_bytes()
    assert oct((dest / "a-1.0-py3-none-any.whl").stat().st_mode & 0o777) == "0o644"
    second = stage(tmp_path, src, ["a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"], dest)
    assert second.returncode == 0 and result_of(tmp_path)["changed"] is False, second.stdout


@pytest.mark.parametrize(("name", "says"), [("../escape.whl", "not a plain file name"),
                                             ("missing.whl", "is not in")])
def test_a_name_outside_src_is_refused_before_anything_is_sent(tmp_path, name, says):
    src, dest = tmp_path / "wheelhouse", tmp_path / "staging"
    src.mkdir()
    dest.mkdir()
    (tmp_path / "escape.whl").write_bytes(b"outside")
    run = stage(tmp_path, src, [name], dest)
    assert run.returncode != 0 and says in run.stdout, run.stdout
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_link_or_a_non_regular_file_is_refused_before_anything_is_sent(tmp_path, kind):
    src, dest = tmp_path / "wheelhouse", tmp_path / "staging"
    src.mkdir()
    dest.mkdir()
    (src / "good-1.0-py3-none-any.whl").write_bytes(b"good")
    evil = src / "evil-1.0-py3-none-any.whl"
    if kind == "symlink":
        evil.symlink_to("/etc/shadow")
    elif kind == "fifo":
        os.mkfifo(evil)
    else:
        evil.mkdir()
    run = stage(tmp_path, src, ["good-1.0-py3-none-any.whl", evil.name], dest)
    says = "is a symlink" if kind == "symlink" else "is not a regular file"
    assert run.returncode != 0 and f"{evil}" in run.stdout and says in run.stdout, run.stdout
    assert "nothing was sent" in run.stdout
    assert list(dest.iterdir()) == []
