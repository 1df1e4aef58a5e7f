"""Bad input and interrupted runs: a clear one-line error, the documented exit code, nothing left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import LAB_NAME, LAB_ROOT, dsctl, lab_leftovers, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

NOTHING = {"netns": [], "links": [], "mounts": [], "processes": [], "state": []}


@pytest.fixture(autouse=True)
def clean_machine():
    dsctl("lab", "down")
    yield
    dsctl("lab", "down")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--hosts", "0"], "--hosts"),
        (["--npus", "17"], "--npus"),
        (["--chip", "910C"], "--chip"),
        (["--driver", "9.9.9"], "--driver"),
        (["--driver", "24.1.rc3", "--firmware", "1.2.3"], "--firmware"),
        (["--cann", "7.7.7"], "--cann"),
        (["--firmware", "7.5.0.1.129"], "--firmware"),
        (["--chip", "910", "--driver", "24.1.rc3"], "--chip"),
        (["--subnet", "10.78.0.0/30", "--hosts", "3"], "--subnet"),
    ],
)
def test_bad_options_name_the_field_and_create_nothing(args, field):
    result = dsctl("lab", "up", *args, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsctl: error: ") and field in lines[0], result.stderr
    assert lab_leftovers() == NOTHING


def _copy_cli_for_nobody(dest: Path) -> None:
    """Copy dsctl and its libraries where nobody can read them: a clone under a private directory
    (mktemp, /root) is not readable by another user. Typer imports some of them lazily, so the whole
    site directory goes, less what `lab up` never loads."""
    unused = shutil.ignore_patterns("__pycache__", "ansible_collections", "ansible", "ruff", "pip", "setuptools")
    sources = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    for source in sources:
        shutil.copytree(source, dest, ignore=unused, dirs_exist_ok=True, symlinks=True)
    shutil.copytree(Path(__file__).resolve().parents[2] / "cli" / "dsctl", dest / "dsctl", dirs_exist_ok=True,
                    ignore=unused)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_non_root_is_refused_with_exit_8():
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3 to run as another user")
    same_python = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout.strip()
    if same_python != str(sys.version_info[:2]):
        pytest.skip(f"/usr/bin/python3 is {same_python}, the venv {sys.version_info[:2]}: compiled modules differ")
    workdir = Path(tempfile.mkdtemp(prefix="dsctl-nobody-"))
    try:
        workdir.chmod(0o755)
        _copy_cli_for_nobody(workdir / "site")
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
             "import sys; sys.path[:0] = sys.argv[1:]; from dsctl.app import main; sys.exit(main(['lab', 'up']))",
             str(workdir / "site")],
            capture_output=True, text=True, cwd=workdir,
            env={**os.environ, "DSCTL_LAB_ROOT": str(workdir / "lab")},
        )
    finally:
        shutil.rmtree(workdir)
    assert result.returncode == 8, result.stderr
    assert "run dsctl lab as root" in result.stderr
    assert lab_leftovers() == NOTHING


def test_an_interrupted_lab_up_is_cleaned_by_down_and_by_the_next_up():
    env = {**os.environ, "DSCTL_LAB_ROOT": str(LAB_ROOT), "DSCTL_LAB_NAME": LAB_NAME}
    starting = subprocess.Popen([sys.executable, "-m", "dsctl", "lab", "up", "--hosts", "6", "--driver", "24.1.rc3"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not lab_leftovers()["processes"] and time.monotonic() < deadline:
        time.sleep(0.02)
    starting.send_signal(signal.SIGKILL)
    starting.wait()
    assert lab_leftovers()["netns"], "the interrupted lab up should have left namespaces behind"

    result = dsctl("lab", "up", "--hosts", "2")
    assert Path(result.stdout.strip()).is_file()
    # Two hosts and the lab's NPU plane switch, nothing of the six the interrupted run began with.
    assert sorted(lab_leftovers()["netns"]) == [f"dsctl-{LAB_NAME}-01", f"dsctl-{LAB_NAME}-02", f"dsctl-{LAB_NAME}-npu"]

    dsctl("lab", "down")
    assert lab_leftovers() == NOTHING


def test_status_without_a_lab_says_how_to_start_one():
    result = dsctl("lab", "status", check=False)
    assert result.returncode == 1
    assert "dsctl lab up" in result.stderr


def test_fault_on_an_unknown_host_names_the_hosts():
    dsctl("lab", "up", "--hosts", "1")
    result = dsctl("lab", "fault", "lab-09", "network-down", check=False)
    assert result.returncode == 2
    assert "lab-01" in result.stderr
    bad_npu = dsctl("lab", "fault", "lab-01", "chip-unhealthy", "--npu", "8", check=False)
    assert bad_npu.returncode == 2 and "--npu" in bad_npu.stderr
