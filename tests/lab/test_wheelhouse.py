"""The lab wheelhouse: deterministic stand-in wheels that a real pip installs with --require-hashes.

Needs no running lab and no root: everything is built into, and installed from, the test's tmp dir; the
vllm stand-in's `vllm serve` (dsctl's emulated engine, vendored) is served from that venv on 127.0.0.1.
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
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from dsctl.core.fleet import wheel_lock
from dsctl.lab import packages, wheelhouse

# The v0.13.0 row of releases.yaml vllm_ascend_matrix (CANN 8.5.0), as the roles pin it.
ROW_V0130 = {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0", "vllm-ascend": "0.13.0",
             "triton-ascend": "3.2.0"}
# The versions the stand-ins carry: vllm as built from source for Ascend (a local version).
INSTALLED_V0130 = {**ROW_V0130, "vllm": "0.13.0+empty"}
MODULES = ("torch", "torch_npu", "vllm", "vllm_ascend", "triton")
# The dependency stand-ins every row's closure holds (dsctl.lab.wheelhouse.DEPENDENCIES).
DEPENDENCIES = {"filelock": "3.16.1", "typing-extensions": "4.12.2", "sympy": "1.13.3", "mpmath": "1.3.0",
                "numpy": "1.26.4", "requests": "2.32.3", "idna": "3.10"}
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_CONFIG_FILE": os.devnull}
# Some of what the vendored engine must hold (the whole set is computed: wheelhouse.engine_closure).
ESSENTIAL = {
    "dsctl/__init__.py",
    "dsctl/core/perf/engine_sched.py",
    "dsctl/core/perf/engine_config.py",
    "dsctl/core/perf/perfmodel.py",
    "dsctl/core/hostfacts/versionfiles.py",
    "dsctl/engine/cann.py",
    "dsctl/data/__init__.py",
    "dsctl/data/profiles.yaml",
    "dsctl/engine/__main__.py",
    "dsctl/engine/profiles.py",
    "dsctl/engine/server.py",
    "dsctl/errors.py",
}
MODEL_PATH = "/models/DeepSeek-R1-Distill-Qwen-7B"
PROFILE = "deepseek-r1-distill-qwen-7b"
ENTRY_POINT = ["vllm/entrypoints/__init__.py", "vllm/entrypoints/cli/__init__.py", "vllm/entrypoints/cli/main.py"]


def file_for(name: str, version: str) -> str:
    local = "+empty" if name == "vllm" else ""
    return f"{name.replace('-', '_')}-{version}{local}-py3-none-any.whl"


def read_sums(directory: Path) -> dict[str, str]:
    """File name -> sha256 hex from a ``<hex>  <name>`` manifest."""
    sums = {}
    for line in (directory / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        sums[name] = digest
    return sums


def requirements(sums: dict[str, str]) -> str:
    """Top-level pins only, hashed: what the roles wrote before locks (it cannot install a dependency tree)."""
    return "".join(
        f"{name}=={version} --hash=sha256:{sums[file_for(name, version)]}\n" for name, version in ROW_V0130.items()
    )


def lock_of(wheels: Path, arch: str = "x86_64", python: str = "3.11") -> Path:
    """The lab's lock of the v0.13.0 row: what provisioning installs from (dsctl.core.fleet.wheel_lock)."""
    return wheels / wheel_lock.lock_name(ROW_V0130, arch, python)


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without PYTHONPATH or the stand-in's DSCTL_ENGINE_* knobs, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DSCTL_ENGINE_")}
    return {**env, **PIP_ENV, **extra}


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=clean_env(),
                          **kwargs)


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


@pytest.fixture(scope="module")
def installed(wheels, venv, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The venv with the v0.13.0 row installed as the roles install it, and pip's result."""
    python = venv / "bin" / "python"
    result = run(python, "-m", "pip", "install", "--no-index", "--find-links", wheels, "--require-hashes", "-r",
                 lock_of(wheels))
    return venv, result


# =========================================================================== building


def test_wheel_names_follow_pep_427(wheels):
    names = sorted(p.name for p in wheels.glob("*.whl"))
    for expected in (
        "torch-2.8.0-py3-none-any.whl",
        "torch_npu-2.8.0.post2-py3-none-any.whl",
        "vllm-0.13.0+empty-py3-none-any.whl",  # a local version, as vLLM built from source names itself
        "vllm_ascend-0.13.0-py3-none-any.whl",
        "triton_ascend-3.2.0-py3-none-any.whl",  # from the vllm-ascend 0.13 rows
        "mpmath-1.3.0-py3-none-any.whl",  # a dependency of a dependency (torch -> sympy -> mpmath)
        "vllm_ascend-0.13.0rc1-py3-none-any.whl",  # 8.3.RC2
        "vllm_ascend-0.8.4rc2-py3-none-any.whl",  # 8.0.0
        "torch_npu-2.5.1-py3-none-any.whl",
    ):
        assert expected in names
    assert not any(name.startswith("vllm_ascend-0.18.0-") for name in names)  # CANN 8.5.1: not a lab release
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"[a-z_]+-[0-9][0-9a-z.+]*-py3-none-any\.whl", name), name


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
            if row.get("triton_ascend"):
                expected.add(file_for("triton-ascend", row["triton_ascend"]))
    expected |= {file_for(name, version) for name, version in DEPENDENCIES.items()}
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
        "2.8.0.post2: imports and reports its version, nothing else\nRequires-Dist: torch==2.8.0\n"
        "Requires-Dist: numpy\n"
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


def test_vllm_wheel_carries_the_entry_point_and_the_vendored_engine(wheels):
    archive = zipfile.ZipFile(wheels / "vllm-0.13.0+empty-py3-none-any.whl")
    info = "vllm-0.13.0+empty.dist-info"
    names = archive.namelist()
    vendored = [n for n in names if n.startswith("dsctl/")]
    assert ESSENTIAL <= set(vendored)
    assert vendored == list(wheelhouse.vendored_dsctl())
    assert names == [*vendored, "vllm/__init__.py", *ENTRY_POINT, f"{info}/METADATA", f"{info}/WHEEL",
                     f"{info}/entry_points.txt", f"{info}/RECORD"]
    assert archive.read(f"{info}/entry_points.txt").decode() == (
        "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
    )
    metadata = archive.read(f"{info}/METADATA").decode()
    assert "Summary: dsctl lab stand-in for vllm 0.13.0+empty: `vllm serve` runs" in metadata
    assert "Requires-Dist: numpy\nRequires-Dist: requests>=2.26.0\n" in metadata
    rows = list(csv.reader(io.StringIO(archive.read(f"{info}/RECORD").decode())))
    assert [r[0] for r in rows] == names
    for path, digest, size in rows[:-1]:
        data = archive.read(path)
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data)
    for path in vendored:  # byte for byte the installed dsctl package's files
        assert archive.read(path) == (wheelhouse.DSCTL_DIR / path.removeprefix("dsctl/")).read_bytes(), path
    assert archive.read("vllm/entrypoints/cli/main.py").decode() == wheelhouse.STAND_IN_VLLM_MAIN
    compile(wheelhouse.STAND_IN_VLLM_MAIN, "vllm/entrypoints/cli/main.py", "exec")

    # Every vllm stand-in carries the same serving files; no other distribution carries any.
    for path in wheels.glob("*.whl"):
        other = zipfile.ZipFile(path)
        served = {n: other.read(n) for n in other.namelist() if n.startswith(("dsctl/", "vllm/entrypoints/"))}
        if path.name.startswith("vllm-"):
            assert served == {n: archive.read(n) for n in [*vendored, *ENTRY_POINT]}, path.name
        else:
            assert served == {}, path.name


def test_the_vendored_closure_covers_what_the_engine_imports_without_pyyaml(tmp_path):
    """Run the engine up to a start-up failure (after its lazy imports) with no site-packages: no PyYAML."""
    modules = wheelhouse.engine_closure([wheelhouse.ENGINE_ROOT])
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(wheelhouse.DSCTL_DIR.parent)!r})\n"
        "from dsctl.engine.__main__ import main\n"
        "status = main(['serve', 'deepseek-v3', '-tp', '1', '--host', '127.0.0.1', '--port', '0',"
        " '--time-scale', '0.0001'])\n"
        "assert 'yaml' not in sys.modules or not hasattr(sys.modules['yaml'], '__file__'), 'PyYAML imported'\n"
        "print(json.dumps([status, sorted(m for m in sys.modules if m.split('.')[0] == 'dsctl')]))\n"
    )
    result = run(sys.executable, "-S", "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    status, imported = json.loads(result.stdout.splitlines()[-1])
    assert status == 1 and "NPU out of memory" in result.stderr  # got past the imports of serve() and _start()
    assert "dsctl.core.perf.engine_sched" in imported and "dsctl.core.perf.perfmodel" in imported
    assert set(imported) <= set(modules)
    assert not any(m.startswith(("dsctl.lab", "dsctl.commands", "dsctl.adapters")) for m in modules)


def stand_in_main() -> types.ModuleType:
    """The vllm stand-in's entry point module, loaded from the source the wheels carry."""
    module = types.ModuleType("stand_in_vllm_main")
    exec(compile(wheelhouse.STAND_IN_VLLM_MAIN, "vllm/entrypoints/cli/main.py", "exec"), module.__dict__)
    return module


def test_vllm_serve_arguments_become_the_engines():
    from dsctl.engine.__main__ import build_parser

    main = stand_in_main()
    parser = build_parser()
    models = main.load_models(None)

    def argv(*args: str, **environ: str) -> tuple[list[str], list[str]]:
        return main.engine_argv(list(args), parser, main.load_models, environ)

    # A checkpoint path maps to its profile; the served name stays as given; start-up defaults to 2 s.
    assert argv(MODEL_PATH, "--served-model-name", "r1-7b", "--host", "127.0.0.1", "--port", "8000",
                "--tensor-parallel-size", "1", "--max-num-seqs", "8") == (
        [PROFILE, "--served-model-name", "r1-7b", "--host", "127.0.0.1", "--port", "8000",
         "--tensor-parallel-size", "1", "--max-num-seqs", "8", "--startup", "2"], [])
    # No --served-model-name: vLLM serves under the model string as given.
    assert argv(MODEL_PATH + "/")[0] == [PROFILE, "--served-model-name", MODEL_PATH + "/", "--startup", "2"]
    # Hugging Face ids, --model, underscores, vLLM flags the engine does not model (with their values).
    assert argv("--model=deepseek-ai/DeepSeek-R1", "--max_num_seqs", "4", "--kv-cache-dtype", "auto",
                "--enable-prefix-caching", "--compilation-config={}", "--no-enable-chunked-prefill") == (
        ["deepseek-r1", "--max-num-seqs", "4", "--enable-prefix-caching", "--no-enable-chunked-prefill",
         "--served-model-name", "deepseek-ai/DeepSeek-R1", "--startup", "2"],
        ["--kv-cache-dtype", "auto", "--compilation-config={}"])
    # Flags real vLLM does not have are refused as its argparse refuses them (a knob of the fixed-batch engine,
    # a typo), flag and value; vLLM's own unmodelled flags and the emulation's controls are not.
    assert main.unrecognized(["--stream-num", "4", "--max-num-seqs", "8", "--kv_sparse_threshold=0.1",
                              "--max-num-seqz", "3", "--compilation-config", "{}", "--time-scale", "0.1"],
                             parser) == ["--stream-num", "4", "--kv_sparse_threshold=0.1", "--max-num-seqz", "3"]
    assert argv("--model", "/m/DeepSeek_V2_Lite", "--served-model-name", "a", "b", "--jitter", "-1")[0] == (
        ["deepseek-v2-lite", "--served-model-name", "a", "b", "--jitter", "-1", "--startup", "2"])
    assert argv(MODEL_PATH, "--model", MODEL_PATH)[0] == [PROFILE, "--served-model-name", MODEL_PATH, "--startup", "2"]
    # An unknown model goes on as given (the engine lists the profiles it knows).
    assert argv("/models/Llama-3-8B")[0][0] == "/models/Llama-3-8B"
    # The environment's defaults, and flags winning over them.
    env = {"DSCTL_ENGINE_TIME_SCALE": "0.05", "DSCTL_ENGINE_STARTUP": "0"}
    assert argv(PROFILE, **env)[0] == [PROFILE, "--served-model-name", PROFILE, "--time-scale", "0.05",
                                       "--startup", "0"]
    assert argv(PROFILE, "--time-scale=1", "--startup", "5", **env)[0] == [
        PROFILE, "--time-scale=1", "--startup", "5", "--served-model-name", PROFILE]
    assert argv(PROFILE, DSCTL_ENGINE_STARTUP="model")[0] == [PROFILE, "--served-model-name", PROFILE]
    assert main.match_profile("DeepSeek-R1-Distill-Qwen-7B", models) == PROFILE
    assert main.match_profile("r1-7b", models) == PROFILE  # an alias


def test_sha256sums_match_the_wheels(wheels):
    text = (wheels / "SHA256SUMS").read_text()
    lines = text.splitlines()
    assert lines == sorted(lines, key=lambda line: line.split("  ")[1])
    sums = read_sums(wheels)
    assert sorted(sums) == sorted(p.name for p in [*wheels.glob("*.whl"), *wheels.glob("lock-*.txt")])
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
    names = [s.file_name for s in wheelhouse.stand_ins(releases) if s.name not in wheelhouse.DEPENDENCIES]
    assert names == [
        "torch-2.9.0-py3-none-any.whl",
        "torch_npu-2.9.0.post1+git4c901a4-py3-none-any.whl",
        "vllm-0.18.0+empty-py3-none-any.whl",
        "vllm_ascend-0.18.0-py3-none-any.whl",
    ]


# =========================================================================== installing with pip


def test_pip_installs_the_pinned_row_with_hashes(installed, tmp_path):
    venv, result = installed
    assert result.returncode == 0, result.stdout + result.stderr
    python = venv / "bin" / "python"

    script = f"import importlib\nfor m in {MODULES!r}:\n    print(m, importlib.import_module(m).__version__)\n"
    result = run(python, "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["torch 2.8.0", "torch_npu 2.8.0.post2", "vllm 0.13.0+empty",
                                          "vllm_ascend 0.13.0", "triton 3.2.0"]

    result = run(python, "-m", "pip", "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    listed = {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(result.stdout)}
    assert {name: listed.get(name) for name in ROW_V0130} == INSTALLED_V0130
    # The dependency tree came with it, every wheel hash-checked against the lock.
    assert {name: listed.get(name) for name in DEPENDENCIES} == DEPENDENCIES
    assert set(listed) - {"pip", "setuptools"} == set(ROW_V0130) | set(DEPENDENCIES)

    check = run(python, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize(("name", "version", "module"), [("torch-npu", "2.8.0.post2", "torch_npu"),
                                                        ("mpmath", "1.3.0", "mpmath")])  # a dependency's dependency
def test_pip_refuses_a_tampered_wheel(wheels, venv, tmp_path, name, version, module):
    lock = lock_of(wheels).read_text()  # the lock as written, before the tampering
    tampered = tmp_path / "wheels"
    shutil.copytree(wheels, tampered)
    target = tampered / file_for(name, version)
    data = bytearray(target.read_bytes())
    data[data.index(version.encode(), data.index(b"__version__"))] ^= 0x01  # "2" -> "3" in __version__
    target.write_bytes(bytes(data))
    req = tmp_path / "lock.txt"
    req.write_text(lock)
    site = tmp_path / "target"
    result = run(venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--find-links", tampered,
                 "--require-hashes", "--target", site, "-r", req)
    assert result.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in result.stderr
    assert name in result.stderr.lower().replace("_", "-")
    assert not (site / module).exists() and not (site / "torch").exists()


def test_hashes_of_the_pins_alone_cannot_install_the_dependency_tree(wheels, venv, tmp_path):
    """What the roles did before locks: --require-hashes then demands a hashed line for every dependency."""
    req = tmp_path / "requirements.txt"
    req.write_text(requirements(read_sums(wheels)))
    result = run(venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--find-links", wheels,
                 "--require-hashes", "--target", tmp_path / "target", "-r", req)
    assert result.returncode != 0
    assert "In --require-hashes mode, all requirements must have their versions pinned with ==" in result.stderr
    assert "filelock" in result.stderr  # a dependency of torch, which the pins do not name


# =========================================================================== serving from the venv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(port: int, path: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Served:
    """One server process (its own process group), its port and output."""

    def __init__(self, args: list, port: int, directory: Path, name: str, **env: str):
        self.port = port
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        self.began = time.monotonic()
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([str(a) for a in args], stdout=out, stderr=err, cwd=directory,
                                         env=clean_env(**env), start_new_session=True)
        self.ready_after: float | None = None

    def wait_healthy(self, timeout: float = 30.0) -> float:
        deadline = self.began + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.err.read_text()}"
            try:
                if http(self.port, "/health")[0] == 200:
                    self.ready_after = time.monotonic() - self.began
                    return self.ready_after
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"no /health 200 in {timeout} s: {self.err.read_text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


def test_vllm_serve_and_the_engine_module_serve_from_the_venv_alone(installed, tmp_path):
    venv, result = installed
    assert result.returncode == 0, result.stdout + result.stderr
    python, vllm = venv / "bin" / "python", venv / "bin" / "vllm"
    assert vllm.is_file() and os.access(vllm, os.X_OK)  # pip made the console script from entry_points.txt

    # The venv holds the four stand-ins and pip, nothing third-party: dsctl is the vendored copy.
    probe = run(python, "-c", "import dsctl, importlib.util; print(dsctl.__file__);"
                "print([m for m in ('yaml', 'pydantic', 'typer', 'rich') if importlib.util.find_spec(m)])",
                cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    location, third_party = probe.stdout.splitlines()
    assert Path(location).is_relative_to(venv) and third_party == "[]"
    version = run(vllm, "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, "0.13.0+empty\n")
    refused = run(vllm, "bench", "serve", cwd=tmp_path)
    assert refused.returncode == 2 and "not a command of the lab stand-in" in refused.stderr
    refused = run(vllm, "serve", MODEL_PATH, "--stream-num", "4", "--port", str(free_port()), cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == "vllm: error: unrecognized arguments: --stream-num 4"

    common = ["--host", "127.0.0.1", "--max-num-seqs", "8"]
    ports = {name: free_port() for name in ("fast", "plain", "module")}
    commands = {
        # As the lab-engine engine runs it: the engine's own flags.
        "fast": [vllm, "serve", MODEL_PATH, "--served-model-name", "r1-7b", *common, "--port", ports["fast"],
                 "--time-scale", "0.01", "--startup", "0"],
        # Exactly a real host's command line: the stand-in's default start-up (DSCTL_ENGINE_STARTUP unset).
        "plain": [vllm, "serve", MODEL_PATH, "--served-model-name", "r1-7b", *common, "--tensor-parallel-size", "1",
                  "--port", ports["plain"]],
        "module": [python, "-m", "dsctl.engine", "serve", PROFILE, "--host", "127.0.0.1", "--port", ports["module"],
                   "--time-scale", "0.01", "--startup", "0"],
    }
    servers = {name: Served(command, ports[name], tmp_path, name) for name, command in commands.items()}
    try:
        for name, served in servers.items():
            served.wait_healthy(30)
            status, body = http(served.port, "/v1/models")
            assert status == 200
            ids = [m["id"] for m in json.loads(body)["data"]]
            assert ids == (["r1-7b"] if name != "module" else [PROFILE])
            status, body = http(served.port, "/v1/completions",
                                {"model": ids[0], "prompt": "Hello", "max_tokens": 4, "temperature": 0})
            assert status == 200, body
            completion = json.loads(body)
            assert completion["usage"]["completion_tokens"] == 4
            assert completion["choices"][0]["finish_reason"] == "length"
        assert servers["plain"].ready_after < 2 + 8  # the default start-up: 2 modelled seconds, not a minute
    finally:
        codes = {name: served.stop() for name, served in servers.items()}
    assert codes == {"fast": 0, "plain": 0, "module": 0}, {n: s.err.read_text() for n, s in servers.items()}
    log = servers["plain"].out.read_text()
    assert f"model='{PROFILE}', served_model_name=r1-7b" in log and "Loading weights took 2.00 seconds" in log
    assert "Uvicorn running on http://127.0.0.1:" in servers["fast"].out.read_text()
    assert "Traceback" not in "".join(s.err.read_text() for s in servers.values())
