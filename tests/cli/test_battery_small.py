"""Bad-input battery: `dsctl wheelhouse build` (class 10) and class 11, the smaller ones (issue 41).

wheelhouse build must refuse before pip runs: pip is replaced by a stand-in that fails the test if called, so each
case takes a fraction of a second.  Class 11: a directory inventory without hosts, --ask-vault-pass with nothing on
stdin and no terminal, `dsctl engine serve --port` out of range.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.adapters import pip_download

from .battery import REPO, assert_names, refusal, site


@pytest.fixture
def no_pip(monkeypatch):
    def refuse_to_run(argv, timeout):
        raise AssertionError(f"pip ran: {argv}")

    monkeypatch.setattr(pip_download, "run", refuse_to_run)


# --------------------------------------------------------------------------- wheelhouse build

INDEX = "https://127.0.0.1:9/simple"
WHEELHOUSE = [
    pytest.param(["--python", "3.99"], "--python 3.99", "3.10, 3.11", id="python-3.99"),
    pytest.param(["--python", "3.9"], "--python 3.9", ">=3.10,<3.12", id="python-below-row"),
    pytest.param(["--python", "3.12"], "--python 3.12", ">=3.10,<3.12", id="python-above-row"),
    pytest.param(["--out", ""], "--out", "name the wheelhouse directory", id="out-empty"),
    pytest.param(["--out", "  "], "--out", "name the wheelhouse directory", id="out-blank"),
    pytest.param(["--index-url", "ftp://127.0.0.1/simple"], "--index-url", "http(s)", id="ftp"),
    pytest.param(["--index-url", "file:///etc"], "--index-url", "not a simple index", id="file-etc"),
    pytest.param(["--index-url", "file:///nonexistent/simple"], "--index-url", "not a directory", id="file-missing"),
    pytest.param(["--index-url", "gopher://127.0.0.1/"], "--index-url", "http(s)", id="gopher"),
    pytest.param(["--index-url", "https://127.0.0.1/ simple"], "--index-url", "blank", id="blank-in-url"),
    pytest.param(["--index-url", "127.0.0.1/simple"], "--index-url", "http(s)", id="no-scheme"),
    pytest.param(["--find-links", "ftp://127.0.0.1/wheels"], "--find-links", "http(s)", id="find-links-ftp"),
]


@pytest.mark.parametrize(("extra", "field", "fix"), WHEELHOUSE)
def test_wheelhouse_build_refuses_before_pip_runs(capsys, tmp_path, sentinel, no_pip, extra, field, fix):
    args = ["wheelhouse", "build", "--release", "v0.13.0", "--index-url", INDEX, "--arch", "x86_64",
            "--out", str(tmp_path / "wh"), *extra]
    line = refusal(capsys, sentinel, args, exits=(2,))
    assert_names(line, field, fix)
    assert not (tmp_path / "wh").exists()


def test_a_local_simple_index_passes_the_check(tmp_path, no_pip):
    # file:// is accepted where pip can read it: <index>/<project>/index.html for every pinned project.
    from dsctl import data
    from dsctl.core.fleet.matrix import release_pins
    from dsctl.services.wheelhouse import WheelhouseRequest, check_request

    pins, supported = release_pins(data.load("releases"), "v0.13.0")
    for name in pins:
        (tmp_path / "simple" / name).mkdir(parents=True)
        (tmp_path / "simple" / name / "index.html").write_text("<html></html>")
    check_request(WheelhouseRequest(stacks=(pins,), arches=("x86_64",), pythons=("3.11",), out=tmp_path / "wh",
                                    index_url=(tmp_path / "simple").as_uri(), python_ranges=(supported,)))


# --------------------------------------------------------------------------- a directory inventory without hosts

def _only_group_vars(root: Path) -> None:
    (root / "group_vars").mkdir(parents=True)
    (root / "group_vars" / "all.yml").write_text("dsctl_npu_count: 8\n")


def _empty(root: Path) -> None:
    root.mkdir()


def _readme_only(root: Path) -> None:
    root.mkdir()
    (root / "README.md").write_text("# the fleet: atlas-a01\n")


def _skipped_files_only(root: Path) -> None:
    _only_group_vars(root)
    (root / "hosts.yml.bak").write_text("all: {}\n")
    (root / ".hidden.yml").write_text("all: {}\n")


def _host_vars_only(root: Path) -> None:
    (root / "host_vars").mkdir(parents=True)
    (root / "host_vars" / "atlas-a01.yml").write_text("dsctl_npu_count: 8\n")


@pytest.mark.parametrize("layout", [_only_group_vars, _empty, _readme_only, _skipped_files_only, _host_vars_only])
def test_a_directory_inventory_without_hosts_gets_dsctls_own_line(capsys, tmp_path, sentinel, layout):
    root = tmp_path / "inventory"
    layout(root)
    line = refusal(capsys, sentinel, ["deploy", str(root), "--render"])
    assert_names(line, str(root), "no hosts in group npu_nodes", "all.children.npu_nodes.hosts")
    assert "Completely failed" not in line


# --------------------------------------------------------------------------- --ask-vault-pass without a terminal

@pytest.mark.parametrize("stdin", [b"", b"\n"])
def test_ask_vault_pass_with_nothing_on_stdin_and_no_terminal_is_one_line(tmp_path, sentinel, stdin):
    # A new session has no controlling terminal: getpass would warn (GetPassWarning, "may be echoed") first.
    inventory = site(tmp_path, sentinel)
    env = {**os.environ, "PYTHONPATH": str(REPO / "cli")}
    result = subprocess.run([sys.executable, "-m", "dsctl", "deploy", str(inventory), "--render", "--ask-vault-pass"],
                            input=stdin, capture_output=True, env=env, timeout=60, start_new_session=True)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("dsctl: error: --ask-vault-pass: no password entered"), lines
    assert sentinel.connections == 0


# --------------------------------------------------------------------------- dsctl engine serve --port

@pytest.mark.parametrize("port", ["70000", "65536", "-1", "abc", "99999999999999999999", "8000.5"])
def test_engine_serve_port_out_of_range_is_a_usage_error(capsys, sentinel, port):
    line = refusal(capsys, sentinel, ["engine", "serve", "deepseek-r1-distill-qwen-7b", f"--port={port}"],
                   exits=(2,))
    assert_names(line, "--port", port)
