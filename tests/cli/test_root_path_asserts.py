"""The roles' own last check before they change a path as root (roles/ascend_preflight/tasks/root_paths.yml), run by
real ansible-playbook over the local connection without dsctl: a staging directory that leads into /usr through a
symlink, or through /proc/self/root, stops ascend_package before it makes anything (issue 41, class 1)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from .conftest import run_local_playbook

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role's tasks run as root")

INSTALLER = "Ascend-test.run"


def run_ascend_package(tmp_path: Path, staging: str) -> subprocess.CompletedProcess:
    source = tmp_path / "packages"
    source.mkdir(exist_ok=True)
    (source / INSTALLER).write_text("#!/bin/sh\n")
    digest = hashlib.sha256((source / INSTALLER).read_bytes()).hexdigest()
    playbook = tmp_path / "stage.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Stage an installer", "ansible.builtin.include_role": {"name": "ascend_package"},
                   "vars": {"ascend_package_staging_dir": staging, "ascend_package_source": str(source),
                            "ascend_package_file": INSTALLER, "ascend_package_checksums": {INSTALLER: digest}}}]}]))
    return run_local_playbook(playbook)


def test_a_staging_dir_of_its_own_is_staged_into(tmp_path):
    staging = tmp_path / "stage"
    run = run_ascend_package(tmp_path, str(staging))
    assert run.returncode == 0, run.stdout + run.stderr
    assert (staging / INSTALLER).is_file() and oct(staging.stat().st_mode & 0o777) == "0o700"


def test_a_staging_dir_behind_a_symlink_into_usr_is_refused_and_nothing_is_made(tmp_path):
    # If the check let it through, the role would make /usr/lib/<name> root's alone: a name of this test's own,
    # removed again below, so a failing test leaves nothing behind.
    name = f"dsctl-test-{uuid.uuid4().hex[:12]}"
    (tmp_path / "site").symlink_to("/usr/lib")
    try:
        run = run_ascend_package(tmp_path, str(tmp_path / "site" / name))
        assert run.returncode != 0
        assert f"dsctl_staging_dir: {tmp_path}/site/{name} resolves on the host to /usr/lib/{name}" in run.stdout, \
            run.stdout
        assert "(nothing was changed). Fix: " in run.stdout
        assert not Path("/usr/lib", name).exists()
    finally:
        shutil.rmtree(Path("/usr/lib", name), ignore_errors=True)


def test_a_staging_dir_through_proc_self_root_is_refused_as_written(tmp_path):
    name = f"dsctl-test-{uuid.uuid4().hex[:12]}"
    try:
        run = run_ascend_package(tmp_path, f"/proc/self/root/usr/lib/{name}")
        assert run.returncode != 0
        assert f"dsctl_staging_dir: '/proc/self/root/usr/lib/{name}' is inside /proc" in run.stdout, run.stdout
        assert not Path("/usr/lib", name).exists()
    finally:
        shutil.rmtree(Path("/usr/lib", name), ignore_errors=True)
