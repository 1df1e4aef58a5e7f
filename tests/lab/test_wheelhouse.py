"""The lab wheelhouse: deterministic stand-in wheels that a real pip installs with --require-hashes.

Needs no running lab and no root: everything is built into, and installed from, the test's tmp dir.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsctl.lab import packages, wheelhouse

# The v0.13.0 row of releases.yaml vllm_ascend_matrix (CANN 8.5.0), as the roles pin it.
ROW_V0130 = {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0", "vllm-ascend": "0.13.0"}
MODULES = ("torch", "torch_npu", "vllm", "vllm_ascend")
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_CONFIG_FILE": os.devnull}


def file_for(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def read_sums(directory: Path) -> dict[str, str]:
    """File name -> sha256 hex from a ``<hex>  <name>`` manifest."""
    sums = {}
    for line in (directory / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        sums[name] = digest
    return sums


def requirements(sums: dict[str, str]) -> str:
    """The --require-hashes requirements file the roles write for one matrix row."""
    return "".join(
        f"{name}=={version} --hash=sha256:{sums[file_for(name, version)]}\n" for name, version in ROW_V0130.items()
    )


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, **PIP_ENV}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=env, **kwargs)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pkgs")
    packages.build_packages(out, arch="x86_64")
    return out / "wheels"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """An empty venv (with pip) made by the interpreter running the tests."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    result = run(sys.executable, "-m", "venv", path)
    assert result.returncode == 0, result.stderr
    return path


# =========================================================================== building


def test_wheel_names_follow_pep_427(wheels):
    names = sorted(p.name for p in wheels.glob("*.whl"))
    for expected in (
        "torch-2.8.0-py3-none-any.whl",
        "torch_npu-2.8.0.post2-py3-none-any.whl",
        "vllm-0.13.0-py3-none-any.whl",
        "vllm_ascend-0.13.0-py3-none-any.whl",
        "vllm_ascend-0.13.0rc1-py3-none-any.whl",  # 8.3.RC2
        "vllm_ascend-0.8.4rc2-py3-none-any.whl",  # 8.0.0
        "torch_npu-2.5.1-py3-none-any.whl",
    ):
        assert expected in names
    assert not any(name.startswith("vllm_ascend-0.18.0-") for name in names)  # CANN 8.5.1: not a lab release
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"(torch|torch_npu|vllm|vllm_ascend)-[0-9][0-9a-z.+]*-py3-none-any\.whl", name), name


def test_only_rows_of_the_lab_cann_releases(wheels):
    releases = packages.load_releases()
    canns = {c["version"] for c in releases["cann"]}
    expected = set()
    for row in releases["vllm_ascend_matrix"]:
        if row["cann"] in canns:
            expected |= {
                file_for("torch", row["torch"]),
                file_for("torch-npu", row["torch_npu"]),
                file_for("vllm", row["vllm"].removeprefix("v")),
                file_for("vllm-ascend", row["vllm_ascend"].removeprefix("v")),
            }
    assert {p.name for p in wheels.glob("*.whl")} == expected


def test_wheel_contents_are_a_valid_wheel(wheels):
    archive = zipfile.ZipFile(wheels / "torch_npu-2.8.0.post2-py3-none-any.whl")
    info = "torch_npu-2.8.0.post2.dist-info"
    assert archive.namelist() == [
        "torch_npu/__init__.py",
        f"{info}/METADATA",
        f"{info}/WHEEL",
        f"{info}/RECORD",
    ]
    assert archive.testzip() is None
    assert archive.read(f"{info}/METADATA").decode() == (
        "Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.8.0.post2\nSummary: dsctl lab stand-in for torch_npu "
        "2.8.0.post2: imports and reports its version, nothing else\n"
    )
    wheel = archive.read(f"{info}/WHEEL").decode().splitlines()
    assert wheel[0] == "Wheel-Version: 1.0"
    assert {"Root-Is-Purelib: true", "Tag: py3-none-any"} <= set(wheel)
    assert any(line.startswith("Generator: ") for line in wheel)
    init = archive.read("torch_npu/__init__.py").decode()
    assert '__version__ = "2.8.0.post2"' in init and "stand-in" in init.split('"""')[1]

    rows = list(csv.reader(io.StringIO(archive.read(f"{info}/RECORD").decode())))
    assert [r[0] for r in rows] == archive.namelist()
    assert rows[-1] == [f"{info}/RECORD", "", ""]
    for path, digest, size in rows[:-1]:
        data = archive.read(path)
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data)
    for entry in archive.infolist():
        assert entry.date_time == (1980, 1, 1, 0, 0, 0)


def test_sha256sums_match_the_wheels(wheels):
    text = (wheels / "SHA256SUMS").read_text()
    lines = text.splitlines()
    assert lines == sorted(lines, key=lambda line: line.split("  ")[1])
    sums = read_sums(wheels)
    assert sorted(sums) == sorted(p.name for p in wheels.glob("*.whl"))
    for name, digest in sums.items():
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
        assert hashlib.sha256((wheels / name).read_bytes()).hexdigest() == digest
    assert "wheels" not in (wheels.parent / "SHA256SUMS").read_text()  # the .run manifest stays .run only


def test_build_is_deterministic(wheels, tmp_path):
    again = tmp_path / "again"
    written = wheelhouse.build_wheelhouse(again, packages.load_releases())
    assert sorted(p.name for p in written) == sorted(p.name for p in wheels.glob("*.whl"))
    assert (again / "SHA256SUMS").read_bytes() == (wheels / "SHA256SUMS").read_bytes()
    for path in written:
        assert path.read_bytes() == (wheels / path.name).read_bytes()


def test_versions_are_pep_440_normalized_and_bad_rows_skipped():
    assert wheelhouse.normalize_version("v0.13.0rc1") == "0.13.0rc1"
    assert wheelhouse.normalize_version("2.9.0.post1+git4c901a4") == "2.9.0.post1+git4c901a4"
    assert wheelhouse.normalize_version("2.5.1.post1.dev20250619") == "2.5.1.post1.dev20250619"
    assert wheelhouse.normalize_version("1.0-RC-2") == "1.0rc2"
    assert wheelhouse.normalize_version("8.3.RC2") == "8.3rc2"
    assert wheelhouse.normalize_version("not a version") is None
    releases = {
        "cann": [{"version": "8.5.1"}],
        "vllm_ascend_matrix": [
            {
                "vllm_ascend": "v0.18.0",
                "vllm": "v0.18.0",
                "cann": "8.5.1",
                "torch": "2.9.0",
                "torch_npu": "2.9.0.post1+git4c901a4",
            },
            {"vllm_ascend": "v0.99.0", "vllm": "main branch", "cann": "8.5.1", "torch": "2.9.0", "torch_npu": "2.9.0"},
        ],
    }
    names = [s.file_name for s in wheelhouse.stand_ins(releases)]
    assert names == [
        "torch-2.9.0-py3-none-any.whl",
        "torch_npu-2.9.0.post1+git4c901a4-py3-none-any.whl",
        "vllm-0.18.0-py3-none-any.whl",
        "vllm_ascend-0.18.0-py3-none-any.whl",
    ]


# =========================================================================== installing with pip


def test_pip_installs_the_pinned_row_with_hashes(wheels, venv, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text(requirements(read_sums(wheels)))
    python = venv / "bin" / "python"
    result = run(python, "-m", "pip", "install", "--no-index", "--find-links", wheels, "--require-hashes", "-r", req)
    assert result.returncode == 0, result.stdout + result.stderr

    script = f"import importlib\nfor m in {MODULES!r}:\n    print(m, importlib.import_module(m).__version__)\n"
    result = run(python, "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["torch 2.8.0", "torch_npu 2.8.0.post2", "vllm 0.13.0", "vllm_ascend 0.13.0"]

    result = run(python, "-m", "pip", "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    listed = {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(result.stdout)}
    assert {name: listed.get(name) for name in ROW_V0130} == ROW_V0130

    check = run(python, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


def test_pip_refuses_a_tampered_wheel(wheels, venv, tmp_path):
    sums = read_sums(wheels)  # the manifest as written, before the tampering
    tampered = tmp_path / "wheels"
    shutil.copytree(wheels, tampered)
    target = tampered / file_for("torch-npu", "2.8.0.post2")
    data = bytearray(target.read_bytes())
    data[data.index(b"2.8.0.post2", data.index(b"__version__"))] ^= 0x01  # "2" -> "3" in __version__
    target.write_bytes(bytes(data))
    req = tmp_path / "requirements.txt"
    req.write_text(requirements(sums))
    site = tmp_path / "target"
    result = run(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        tampered,
        "--require-hashes",
        "--target",
        site,
        "-r",
        req,
    )
    assert result.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in result.stderr
    assert "torch-npu" in result.stderr.lower().replace("_", "-")
    assert not (site / "torch_npu").exists() and not (site / "torch").exists()
