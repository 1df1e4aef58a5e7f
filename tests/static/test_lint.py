"""Static checks every commit passes: ruff, yamllint --strict, ansible-lint's production profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["yamllint", "--strict", "."],
        ["ansible-lint", "--profile", "production", "--offline"],
        ["ansible-playbook", "--syntax-check", "-i", "inventories/sample/hosts.yml", "playbooks/npu_info.yml",
         "playbooks/provision.yml", "playbooks/check.yml", "playbooks/deploy.yml"],
    ],
    ids=lambda command: command[0],
)
def test_tree_is_clean(command):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
