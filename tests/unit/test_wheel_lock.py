"""Hash locks (dsctl.core.fleet.wheel_lock) and the role filters over them: lock names and the one lock choice
per host, PEP 440 matching of local versions, lock text, and the filters the serving_stack role calls."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from dsctl import data
from dsctl.core.fleet import sha256sums, wheel_lock
from dsctl.core.fleet.matrix import release_pins, resolve_stack
from dsctl.core.fleet.stack import serving_venv_name
from dsctl.core.inventory import host_plan
from dsctl.core.inventory import schema as inventory_schema
from dsctl.errors import DsctlError
from dsctl.lab import wheelhouse

REPO = Path(__file__).resolve().parents[2]
RELEASES = data.load("releases")
PINS = resolve_stack(RELEASES).pip_pins  # the default stack: vllm-ascend v0.13.0 on CANN 8.5.0
DIGEST = "a" * 64


def load_filters():
    spec = importlib.util.spec_from_file_location("dsctl_filters_lock_test",
                                                  REPO / "playbooks" / "filter_plugins" / "dsctl_filters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = load_filters()


def test_the_default_row_pins_triton_ascend():
    assert PINS == {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0", "vllm-ascend": "0.13.0",
                    "triton-ascend": "3.2.0"}
    # Rows before vllm-ascend 0.13 name no Triton-Ascend: nothing is pinned for it.
    assert "triton-ascend" not in release_pins(RELEASES, "v0.12.0rc1")[0]
    with pytest.raises(DsctlError, match=r"--release: vllm-ascend v9.9 is not in the matrix; pick one of v0\."):
        release_pins(RELEASES, "v9.9")


def test_lock_names_and_the_choice_per_arch_and_python():
    name = wheel_lock.lock_name(PINS, "aarch64", "3.11")
    assert name == f"lock-{serving_venv_name(PINS)}-aarch64-py3.11.txt"
    assert name.startswith("lock-vllm-ascend-0.13.0-")
    files = [wheel_lock.lock_name(PINS, arch, py) for arch in ("aarch64", "x86_64") for py in ("3.10", "3.11")]
    files.append(wheel_lock.lock_name({**PINS, "torch-npu": "2.8.0.post1"}, "aarch64", "3.11"))
    assert wheel_lock.choose_lock(files, PINS, "aarch64", "3.11") == name
    assert wheel_lock.choose_lock(files, PINS, "arm64", "3.11") == name  # dpkg's spelling
    assert wheel_lock.choose_lock(files, PINS, "x86_64", "3.10").endswith("-x86_64-py3.10.txt")
    assert wheel_lock.choose_lock(files, PINS, "aarch64", "3.9") is None
    # Pin names are compared as PEP 503 names; another pin set is another lock.
    assert wheel_lock.lock_name({k.replace("-", "_"): v for k, v in PINS.items()}, "aarch64", "3.11") == name
    assert wheel_lock.choose_lock(files, {**PINS, "torch": "2.9.0"}, "aarch64", "3.11") is None
    with pytest.raises(DsctlError, match="arch: expected one of aarch64, x86_64, got 'ppc64le'"):
        wheel_lock.lock_name(PINS, "ppc64le", "3.11")
    with pytest.raises(DsctlError, match="python: expected a major.minor"):
        wheel_lock.lock_name(PINS, "aarch64", "3")
    assert wheel_lock.python_of("Python 3.11.2") == "3.11" and wheel_lock.python_of("3.10") == "3.10"


def test_an_aarch64_inventory_renders_aarch64_package_names_and_its_lock(tmp_path):
    settings = inventory_schema.validate_fleet({"kp-01": {"dsctl_npu_count": 8,
                                                          "dsctl_package_source": "/srv/ascend"}})["kp-01"]
    stack = host_plan.stack_for_arch(host_plan.stack_template(settings), "aarch64")
    assert stack["driver_run"] == "Ascend-hdk-910b-npu-driver_25.5.0_linux-aarch64.run"
    assert stack["toolkit_run"] == "Ascend-cann-toolkit_8.5.0_linux-aarch64.run"
    # The lab's wheelhouse built for aarch64 has the lock the role picks for that host (Python 3.11).
    wheelhouse.build_wheelhouse(tmp_path, RELEASES, arch="aarch64")
    sums = FILTERS.parse_sha256sums((tmp_path / "SHA256SUMS").read_text())
    chosen = FILTERS.choose_lock(sums, stack["pip_pins"], "aarch64", "Python 3.11.2")
    assert chosen == wheel_lock.lock_name(stack["pip_pins"], "aarch64", "3.11") and chosen in sums
    assert FILTERS.choose_lock(sums, stack["pip_pins"], "x86_64", "3.11") == ""  # built for aarch64 only
    lock = (tmp_path / chosen).read_text()
    assert hashlib.sha256(lock.encode()).hexdigest() == sums[chosen]
    # Every wheel of the closure, and nothing else, is fetched for it; the pins are all in it.
    wheels = FILTERS.lock_wheels(lock, sums)
    assert {wheel_lock.wheel_of(w)[0] for w in wheels} == {
        "torch", "torch-npu", "vllm", "vllm-ascend", "triton-ascend", "filelock", "typing-extensions", "sympy",
        "mpmath", "numpy", "requests", "idna"}
    assert "vllm-0.13.0+empty-py3-none-any.whl" in wheels
    requirements = FILTERS.lock_requirements(lock, stack["pip_pins"])
    assert "vllm==0.13.0+empty --hash=sha256:" in requirements and requirements.count("--hash=") == 12


@pytest.mark.parametrize(("pin", "version", "ok"), [
    ("2.8.0", "2.8.0+cpu", True),  # PyTorch's CPU index
    ("0.13.0", "0.13.0+empty", True),  # vLLM built from source for Ascend
    ("v0.13.0", "0.13.0", True),
    ("2.8.0", "2.8.0.post2", False),
    ("2.8.0+cpu", "2.8.0", False),  # a pin with a local label wants it
    ("2.8.0+cpu", "2.8.0+cpu", True),
    ("2.8.0", "2.8.1", False),
    ("0.13.0", "0.13.0rc1", False),
])
def test_local_versions_meet_pins_as_pip_sees_them(pin, version, ok):
    assert wheel_lock.pin_matches(pin, version) is ok


def test_wheel_files_of_a_pin_are_found_by_pep_440_not_by_prefix():
    files = ["torch-2.8.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.8.0.post1-py3-none-any.whl",
             "torch_npu-2.8.0.post2-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
             "torch-2.8.0-cp311-cp311-manylinux_2_28_aarch64.whl", "SHA256SUMS", "not-a-wheel.whl"]
    assert wheel_lock.wheels_for("torch", "2.8.0", files) == [
        "torch-2.8.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.8.0-cp311-cp311-manylinux_2_28_aarch64.whl"]
    assert wheel_lock.wheels_for("torch-npu", "2.8.0.post2", files) == [files[2]]
    sums = dict.fromkeys(files, DIGEST)
    assert FILTERS.pinned_wheels({"torch": "2.8.0"}, sums) == wheel_lock.wheels_for("torch", "2.8.0", files)
    with pytest.raises(AnsibleFilterError, match=r"no wheel for vllm==0.13.0 in its SHA256SUMS"):
        FILTERS.pinned_wheels({"vllm": "0.13.0"}, sums)
    # The installed venv: a source-built vllm and a CPU torch meet their pins; a missing one drifts.
    assert FILTERS.pin_drift({"torch": "2.8.0", "vllm": "0.13.0", "triton-ascend": "3.2.0"},
                             {"torch": "2.8.0+cpu", "vllm": "0.13.0+empty"}) == ["triton-ascend"]


def test_the_manifest_filter_reads_as_the_core_does_and_refuses_a_broken_manifest(tmp_path):
    wheelhouse.build_wheelhouse(tmp_path, RELEASES)
    text = (tmp_path / "SHA256SUMS").read_text()
    assert FILTERS.parse_sha256sums(text) == sha256sums.parse(text) != {}
    with pytest.raises(AnsibleFilterError, match=r"^SHA256SUMS line 2 is not '<sha256>  <file name>': 'torch.whl'; "
                                                 r"regenerate it with sha256sum$"):
        FILTERS.parse_sha256sums(f"{DIGEST}  vllm.whl\ntorch.whl\n")


def test_lock_text_round_trips_and_bad_locks_are_one_line_errors():
    wheels = {"torch-2.8.0+cpu-cp311-cp311-linux_x86_64.whl": "1" * 64,
              "torch-2.8.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": "2" * 64,
              "Typing_Extensions-4.12.2-py3-none-any.whl": "3" * 64}
    entries = wheel_lock.lock_entries(wheels)
    text = wheel_lock.render_lock(entries, ["a header"])
    assert text == ("# a header\n"
                    f"torch==2.8.0+cpu --hash=sha256:{'1' * 64} --hash=sha256:{'2' * 64}\n"
                    f"typing-extensions==4.12.2 --hash=sha256:{'3' * 64}\n")
    assert wheel_lock.parse_lock(text) == entries
    assert wheel_lock.lock_problems(entries, {"torch": "2.8.0"}) == []
    assert wheel_lock.lock_problems(entries, {"torch": "2.9.0", "vllm": "0.13.0"}) == [
        "the lock has torch==2.8.0+cpu, the pin is ==2.9.0", "vllm==0.13.0 is not in the lock"]
    with pytest.raises(DsctlError, match="torch appears at 2.8.0 and 2.9.0"):
        wheel_lock.lock_entries({"torch-2.8.0-py3-none-any.whl": DIGEST, "torch-2.9.0-py3-none-any.whl": DIGEST})
    with pytest.raises(DsctlError, match=r"lock line 2 is not 'name==version --hash=sha256:<hex>': 'numpy>=1'"):
        wheel_lock.parse_lock(f"torch==2.8.0 --hash=sha256:{DIGEST}\nnumpy>=1\n")
    with pytest.raises(DsctlError, match="lock line 2: torch is locked twice"):
        wheel_lock.parse_lock(f"torch==2.8.0 --hash=sha256:{DIGEST}\nTorch==2.8.0 --hash=sha256:{DIGEST}\n")
    with pytest.raises(AnsibleFilterError, match=r"lock: vllm==0.13.0 is not in the lock; rebuild it"):
        FILTERS.lock_requirements(text, {"torch": "2.8.0", "vllm": "0.13.0"})
    with pytest.raises(AnsibleFilterError, match=r"no wheel of typing-extensions==4.12.2 with a locked hash"):
        FILTERS.lock_wheels(text, {"torch-2.8.0+cpu-cp311-cp311-linux_x86_64.whl": "1" * 64})
    with pytest.raises(AnsibleFilterError, match="does not match its SHA256SUMS line"):
        FILTERS.verified_text(text, DIGEST, "lock.txt")
    assert FILTERS.verified_text(text, hashlib.sha256(text.encode()).hexdigest(), "lock.txt") == text
    assert FILTERS.plain_requirements({"vllm-ascend": "v0.13.0", "torch": "2.8.0"}) == (
        "torch==2.8.0\nvllm-ascend==0.13.0\n")


def test_pip_failures_become_the_one_thing_that_failed():
    stderr = ("ERROR: Could not find a version that satisfies the requirement torch-npu==2.9.0 (from versions: none)\n"
              "ERROR: No matching distribution found for torch-npu==2.9.0\n")
    assert wheel_lock.pip_failure(stderr) == "no wheel of torch-npu==2.9.0 for this platform"
    conflict = ("ERROR: Cannot install vllm-ascend==0.13.0 because these package versions have conflicting "
                "dependencies.\n")
    assert wheel_lock.pip_failure(conflict) == "conflicting dependencies of vllm-ascend==0.13.0"
    assert wheel_lock.pip_failure("ERROR: HTTP error 503 while getting https://mirror/x\n").startswith("HTTP error 503")
    assert wheel_lock.pip_failure("") == "pip failed without saying why"
