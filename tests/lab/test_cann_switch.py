"""CANN A -> B -> A on one lab host under one driver: the way back is a switch, not an install.

A = CANN 8.3.RC2 (kernels-910b, vllm-ascend v0.11.0) and B = CANN 8.5.0 (910b-ops, vllm-ascend v0.13.0) are
both accepted by HDK 25.3.rc1 / firmware 7.8.0.2.212 (`dsctl matrix`), so the HDK never changes.  The host
starts with A installed by the lab's own installers; provision A builds A's serving venv; provision B installs
B's toolkit, ops and NNAL next to A and builds B's venv; provision A again finds everything of A installed
side by side: it repoints latest/ and the serving venv and runs no installer and no pip install.  After each
provision `check` is clean and a deploy restarts the instance, which then reports the active CANN.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import address, bring_up, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

HOST, ADDRESS = "lab-01", address("lab-01")
DRIVER, FIRMWARE = "25.3.rc1", "7.8.0.2.212"
A = {"cann": "8.3.RC2", "vllm_ascend": "v0.11.0", "kernels": "kernels-910b"}
B = {"cann": "8.5.0", "vllm_ascend": "v0.13.0", "kernels": "910b-ops"}
TOOLKIT = "/usr/local/Ascend/ascend-toolkit"
# Tasks that run a vendor installer or pip: none of them may change anything when switching back.
INSTALLER_TASKS = {
    "Install the driver", "Upgrade the driver", "Install or upgrade the firmware (needs the driver's upgrade-tool)",
    "Run the toolkit installer", "Run the kernels installer", "Run the NNAL installer",
    "Install the pinned distributions (pip verifies every wheel's hash)",
}
# TP4: the model has 28 attention heads, and vLLM (like the lab engine) refuses a tensor-parallel size not dividing it.
SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
           "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": 8000,
           "health_timeout_s": 120, "params": {"max_num_seqs": 32},
           "allow_unauthenticated": True}


@pytest.fixture(scope="module")
def lab_a(tmp_path_factory):
    lab = bring_up("--hosts", "1", "--driver", DRIVER, "--firmware", FIRMWARE, "--cann", A["cann"])
    directory = tmp_path_factory.mktemp("cann-switch")
    yield lab, stack_inventory(lab, directory, A), stack_inventory(lab, directory, B)
    dsctl("lab", "down")


def stack_inventory(lab, directory: Path, stack: dict) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"].update(
        dsctl_driver_version=DRIVER, dsctl_firmware_version=FIRMWARE, dsctl_cann_version=stack["cann"],
        dsctl_vllm_ascend_version=stack["vllm_ascend"], dsctl_services=[SERVICE])
    path = directory / f"inventory-{stack['cann']}.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(verb: str, inventory: Path) -> tuple[int, dict]:
    result = dsctl(verb, str(inventory), "--json", check=False)
    assert result.stdout.startswith("{"), result.stderr
    return result.returncode, json.loads(result.stdout)


def changed_tasks(report: dict) -> set[str]:
    events = Path(report["data"]["artifacts"]) / "events.jsonl"
    return {event["task"] for event in map(json.loads, events.read_text().splitlines())
            if event.get("event", "").startswith("runner_") and event.get("changed") and event.get("host") == HOST}


def active(lab) -> tuple[str, str, str]:
    """(toolkit latest/, NNAL latest, serving venv's vllm-ascend) as the host itself shows them."""
    toolkit = lab.sh_ok(HOST, f"readlink {TOOLKIT}/latest/runtime").strip().split("/")[1]
    nnal = lab.sh_ok(HOST, "readlink /usr/local/Ascend/nnal/atb/latest").strip()
    vllm_ascend = lab.sh_ok(HOST, "/opt/dsctl/serving-venv/bin/python -c "
                                  "'import importlib.metadata as m; print(m.version(\"vllm-ascend\"))'").strip()
    return toolkit, nnal, vllm_ascend


def expected(stack: dict) -> tuple[str, str, str]:
    return stack["cann"], stack["cann"], stack["vllm_ascend"].lstrip("v")


def expect_clean_check(inventory: Path, cann: str) -> None:
    """Exit 0 and no error. CANN 8.5.0 on driver 25.3.rc1 keeps one warning: the driver's train list stops at
    C23 while 8.5.0 is C25 (an observed working pair, `dsctl matrix` marks it); nothing else may appear."""
    code, report = run("check", inventory)
    host = report["data"]["hosts"][0]
    assert code == 0 and host["status"] in ("ok", "warning"), host["findings"]
    assert {f["code"] for f in host["findings"]} <= {"driver-does-not-list-cann"}, host["findings"]
    assert host["versions"]["cann"]["active"] == cann


def expect_restarted_on(lab, inventory: Path, cann: str) -> None:
    before = lab.sh(HOST, "supervisorctl pid dsctl-chat-0").stdout.strip()
    code, report = run("deploy", inventory)
    assert code == 0, report["errors"]
    assert [row["status"] for row in report["data"]["instances"]] == ["restarted"], report["data"]["instances"]
    assert lab.sh_ok(HOST, "supervisorctl pid dsctl-chat-0").strip() != before
    with urllib.request.urlopen(f"http://{ADDRESS}:8000/version", timeout=10) as response:
        assert json.load(response).get("cann") == cann


# The tests below are one story, in file order, on the same host.


def test_provision_a_check_and_deploy(lab_a):
    lab, inventory_a, _ = lab_a
    code, report = run("provision", inventory_a)
    assert code == 0, report["errors"]
    assert active(lab) == expected(A)
    expect_clean_check(inventory_a, A["cann"])
    code, report = run("deploy", inventory_a)
    assert code == 0, report["errors"]


def test_provision_b_installs_next_to_a_and_check_is_clean(lab_a):
    lab, inventory_a, inventory_b = lab_a
    code, report = run("provision", inventory_b)
    assert code == 0, report["errors"]
    done = changed_tasks(report)
    assert {"Run the toolkit installer", "Run the kernels installer", "Run the NNAL installer",
            "Install the pinned distributions (pip verifies every wheel's hash)"} <= done, done
    assert active(lab) == expected(B)
    assert lab.sh(HOST, f"ls {TOOLKIT}/{A['cann']}/*-linux/ascend_toolkit_install.info").exit_code == 0
    expect_clean_check(inventory_b, B["cann"])
    # asked for A now, check names what provision will do: a switch, no installer
    code, report = run("check", inventory_a)
    inactive = [f for f in report["data"]["hosts"][0]["findings"] if f["code"] == "cann-inactive"]
    assert code == 3 and len(inactive) == 1, report["data"]["hosts"][0]["findings"]
    assert f"switch latest/ to the installed CANN {A['cann']} and NNAL's latest" in inactive[0]["fix"]
    assert "without running an installer" in inactive[0]["fix"]


def test_deploy_on_b_restarts_the_instance_on_b(lab_a):
    lab, _, inventory_b = lab_a
    expect_restarted_on(lab, inventory_b, B["cann"])


def test_provision_a_again_switches_without_any_installer_or_pip(lab_a):
    lab, inventory_a, _ = lab_a
    operations = lab.sh_ok(HOST, "cat /var/log/ascend_seclog/operation.log")
    pip_log_marker = lab.sh_ok(HOST, "ls -d /opt/dsctl/serving-venv-stacks/*").split()
    code, report = run("provision", inventory_a)
    assert code == 0, report["errors"]
    done = changed_tasks(report)
    assert not done & INSTALLER_TASKS, done
    assert "Switch latest/ to the CANN toolkit installed side by side (its kernels/ops come along)" in done, done
    assert "Switch NNAL's latest to the version installed side by side" in done, done
    # the host's own record of installer runs did not grow; both stacks' venvs are still there, none new
    assert lab.sh_ok(HOST, "cat /var/log/ascend_seclog/operation.log") == operations
    assert lab.sh_ok(HOST, "ls -d /opt/dsctl/serving-venv-stacks/*").split() == pip_log_marker
    assert active(lab) == expected(A)
    # latest/ is A's whole farm again: A's kernels, version.cfg running A, B still installed for the next switch
    assert lab.sh_ok(HOST, f"readlink {TOOLKIT}/latest/opp_kernel").strip() == f"../{A['cann']}/opp_kernel"
    cfg = lab.sh_ok(HOST, f"cat {TOOLKIT}/latest/version.cfg")
    running = next(line for line in cfg.splitlines() if line.startswith("toolkit_running_version="))
    installed = next(line for line in cfg.splitlines() if line.startswith("toolkit_installed_version="))
    assert running.endswith(f":{A['cann']}]") and f":{B['cann']}]" in installed, cfg
    assert lab.sh(HOST, f"ls -d {TOOLKIT}/.latest.dsctl-*").exit_code != 0
    expect_clean_check(inventory_a, A["cann"])


def test_deploy_on_a_restarts_the_instance_on_a(lab_a):
    lab, inventory_a, _ = lab_a
    expect_restarted_on(lab, inventory_a, A["cann"])


def test_a_further_provision_changes_nothing(lab_a):
    _, inventory_a, _ = lab_a
    code, report = run("provision", inventory_a)
    assert code == 0 and report["data"]["hosts"][0]["changed"] == 0, changed_tasks(report)
