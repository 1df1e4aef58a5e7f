"""`dsctl wheelhouse build` offline: pip's real resolver over a local index of wheels that depend on wheels
(the lab's stand-ins), the hash lock it writes, and the one-line refusals before and after pip runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from dsctl import data
from dsctl.app import main
from dsctl.core.fleet import wheel_lock
from dsctl.core.fleet.matrix import release_pins
from dsctl.lab import wheelhouse

RELEASES = data.load("releases")
PINS = release_pins(RELEASES, "v0.13.0")[0]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    """A directory of stand-in wheels with a dependency tree (and the lab's own aarch64 locks to compare)."""
    out = tmp_path_factory.mktemp("mirror")
    wheelhouse.build_wheelhouse(out, RELEASES, arch="aarch64")
    return out


def read_sums(directory: Path) -> dict[str, str]:
    return {name: digest for digest, name in (line.split("  ") for line in
                                              (directory / "SHA256SUMS").read_text().splitlines())}


def test_a_lock_of_the_whole_closure_is_built_offline_with_pips_resolver(mirror, tmp_path, capsys):
    out = tmp_path / "wh"
    args = ["wheelhouse", "build", "--release", "v0.13.0", "--find-links", str(mirror), "--arch", "aarch64",
            "--python", "3.10", "--out", str(out), "--json"]
    assert main(args) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)["data"]
    name = wheel_lock.lock_name(PINS, "aarch64", "3.10")
    assert [lock["file"] for lock in result["locks"]] == [name]
    entries = wheel_lock.parse_lock((out / name).read_text())
    # Two levels and more below the pins: vllm-ascend -> torch-npu -> torch -> sympy -> mpmath; requests -> idna.
    assert {e.name for e in entries} == {"torch", "torch-npu", "vllm", "vllm-ascend", "triton-ascend", "filelock",
                                         "typing-extensions", "sympy", "mpmath", "numpy", "requests", "idna"}
    assert {e.name: e.version for e in entries}["vllm"] == "0.13.0+empty"  # the local version met pin 0.13.0
    assert wheel_lock.lock_problems(entries, PINS) == []
    # Only the closure was downloaded (not torch 2.5.1, nor other rows), each wheel hashed as the lock says.
    wheels = sorted(p.name for p in out.glob("*.whl"))
    assert len(wheels) == len(entries) == result["wheels"]
    sums = read_sums(out)
    assert sorted(sums) == sorted([*wheels, name])
    for file, digest in sums.items():
        assert hashlib.sha256((out / file).read_bytes()).hexdigest() == digest
    assert wheel_lock.lock_wheels(entries, sums) == wheels
    # pip's resolver chose what the lab's own lock (written without pip) lists.
    assert wheel_lock.parse_lock((mirror / name).read_text()) == entries
    assert not list(out.glob(".download-*"))


def test_a_missing_dependency_names_the_pin_and_the_index(mirror, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(mirror, broken)
    (broken / "mpmath-1.3.0-py3-none-any.whl").unlink()
    args = ["wheelhouse", "build", "--release", "v0.13.0", "--find-links", str(broken), "--arch", "x86_64",
            "--out", str(tmp_path / "wh")]
    assert main(args) == 1
    progress, error = capsys.readouterr().err.splitlines()  # one progress line, then the one-line error
    assert progress.endswith(f"resolving {wheel_lock.lock_name(PINS, 'x86_64', '3.11')}")
    assert error.startswith("dsctl: error: wheelhouse: x86_64/py3.11: no wheel of mpmath") and str(broken) in error
    assert not list((tmp_path / "wh").glob(".download-*"))


@pytest.mark.parametrize(("args", "line"), [
    (["--release", "v0.13.0"], "--index-url or --find-links: name the index or mirror to resolve the pins from"),
    (["inv.yml", "--release", "v0.13.0", "--find-links", "x"],
     "INVENTORY or --release: give exactly one (the hosts' rows, or one vllm-ascend tag)"),
    (["--release", "v0.13.0", "--find-links", "x", "--arch", "ppc64le"],
     "arch: expected one of aarch64, x86_64, got 'ppc64le'"),
    (["--release", "v0.13.0", "--find-links", "x", "--python", "311"],
     "python: expected a major.minor version such as 3.11, got '311'"),
    (["--release", "v0.13.0", "--find-links", "x", "--timeout", "0"], "--timeout: 0 should be more than 0 seconds"),
    (["--release", "v0.13.0", "--find-links", "/nonexistent/wheels"],
     "--find-links /nonexistent/wheels: no such directory or file; give a directory of wheels, a page of links, "
     "or a URL"),
])
def test_bad_input_is_refused_before_pip_runs(tmp_path, capsys, args, line):
    assert main(["wheelhouse", "build", *args, "--out", str(tmp_path / "wh")]) == 2
    assert capsys.readouterr().err == f"dsctl: error: {line}\n"
    assert not (tmp_path / "wh").exists()


def test_an_inventory_locks_the_row_of_each_hosts_stack(mirror, tmp_path, capsys):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    npu_nodes:\n      hosts:\n"
        "        kp-01: {}\n        kp-02: {}\n"
        "        kp-03: {dsctl_cann_version: '8.3.RC2', dsctl_driver_version: '25.3.rc1', "
        "dsctl_vllm_ascend_version: v0.12.0rc1}\n"
        "        kp-04: {dsctl_vllm_ascend_version: none}\n"
        "      vars: {dsctl_npu_count: 8, dsctl_package_source: /srv/ascend}\n")
    args = ["wheelhouse", "build", str(inventory), "--find-links", str(mirror), "--arch", "aarch64",
            "--out", str(tmp_path / "wh"), "--json"]
    assert main(args) == 0, capsys.readouterr().err
    locks = json.loads(capsys.readouterr().out)["data"]["locks"]
    # One lock per distinct row (kp-01 and kp-02 share the default one; kp-04 serves nothing).
    assert sorted(lock["file"] for lock in locks) == sorted([
        wheel_lock.lock_name(PINS, "aarch64", "3.11"),
        wheel_lock.lock_name(release_pins(RELEASES, "v0.12.0rc1")[0], "aarch64", "3.11")])


def test_pip_is_bounded_by_the_timeout(mirror, tmp_path, capsys):
    args = ["wheelhouse", "build", "--release", "v0.13.0", "--find-links", str(mirror), "--timeout", "0.01",
            "--out", str(tmp_path / "wh")]
    assert main(args) == 7
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("dsctl: error: wheelhouse: pip did not resolve lock-vllm-ascend-0.13.0-")
    assert error.endswith("in 0.01 s; raise --timeout or use a nearer mirror")
    assert not list((tmp_path / "wh").glob(".download-*"))


@pytest.mark.parametrize("out", ["/proc/dsctl-wheelhouse", "/proc/self/status/x"])
def test_an_out_the_kernel_will_not_create_is_one_line(tmp_path, capsys, out):
    # /proc passes os.access for root, so the mkdir's own refusal is what the user sees, not a traceback.
    assert main(["wheelhouse", "build", "--release", "v0.13.0", "--find-links", str(tmp_path), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsctl: error: --out {out}: ") and err.count("\n") == 1
