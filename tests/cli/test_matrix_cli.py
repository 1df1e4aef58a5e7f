"""`dsctl matrix` as users run it: the table, the --json envelope, help."""

from __future__ import annotations

import json
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsctl", *args], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_matrix_prints_the_table_with_the_default_marked():
    result = run_cli("matrix")
    assert result.returncode == 0, result.stderr
    default_rows = [line for line in result.stdout.splitlines() if "│ * │" in line]
    assert len(default_rows) == 1
    for value in ("25.5.0", "7.8.0.5.216", "8.5.0", "910b-ops", "v0.13.0", "2.8.0.post2", "official"):
        assert value in default_rows[0]
    assert "24.1.rc3" in result.stdout and "kernels-910b" in result.stdout
    assert "inferred: passes the version-file checks" in result.stdout
    assert "* default stack" in result.stdout  # the footer explains the marks and statuses
    assert "observed = " in result.stdout


def test_matrix_json_is_one_envelope():
    result = run_cli("matrix", "--json")
    assert result.returncode == 0, result.stderr
    envelope = json.loads(result.stdout)
    assert envelope["command"] == ["matrix"]
    assert envelope["status"] == "success" and envelope["exit_code"] == 0
    data = envelope["data"]
    assert data["default_stack"] == {"driver": "25.5.0", "firmware": "7.8.0.5.216", "cann": "8.5.0",
                                     "vllm_ascend": "v0.13.0"}
    defaults = [row for row in data["rows"] if row["default"]]
    assert len(defaults) == 1
    assert (defaults[0]["torch"], defaults[0]["torch_npu"], defaults[0]["status"]) == ("2.8.0", "2.8.0.post2",
                                                                                        "official")
    observed = next(row for row in data["rows"] if row["driver"] == "24.1.rc3")
    assert observed["cann"] == "8.0.0" and observed["warnings"] and observed["sources"]


def test_matrix_help():
    result = run_cli("matrix", "--help")
    assert result.returncode == 0
    assert "Usage: dsctl matrix" in result.stdout


def test_matrix_rejects_arguments():
    assert run_cli("matrix", "extra").returncode == 2
