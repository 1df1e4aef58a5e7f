"""`dsctl provision` on bare lab hosts: the fresh-install path, an unreachable host, check, idempotency."""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading

import pytest
import yaml

from .conftest import bring_up, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture
def package_url(bare_fleet):
    """The lab's package directory served over HTTP from the controller's side of the lab bridge."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(bare_fleet.paths.packages))
    server = http.server.ThreadingHTTPServer((bare_fleet.spec.gateway, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{bare_fleet.spec.gateway}:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def bare_fleet():
    lab = bring_up("--hosts", "3")
    yield lab
    dsctl("lab", "down")


def _http_inventory(lab, url: str, tmp_path, **pins: str):
    """The lab's inventory with its package source served over ``url`` (and the lab's pins, unless overridden)."""
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"].update(
        dsctl_package_source=url, dsctl_wheelhouse=f"{url}/wheels", **pins)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    return inventory


def test_a_pinned_manifest_digest_that_does_not_match_refuses_the_source_before_any_change(bare_fleet, package_url,
                                                                                           tmp_path):
    lab = bare_fleet  # first in the module: the hosts are still bare, so "nothing changed" is visible on them
    wrong = "0" * 64
    inventory = _http_inventory(lab, package_url, tmp_path, dsctl_package_manifest_sha256=wrong)
    result = dsctl("provision", str(inventory), "--limit", "lab-03", "--json", check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 4, result.stderr
    row = report["data"]["hosts"][0]
    assert (row["host"], row["status"], row["changed"]) == ("lab-03", "failed", 0)
    errors = "\n".join(report["errors"])
    assert "lab-03: failed at ascend_preflight" in errors
    assert f"the inventory pins {wrong}" in errors and "dsctl_package_manifest_sha256" in errors
    # nothing was copied, installed or created on the host
    assert lab.sh_ok("lab-03", "ls -A /usr/local/Ascend /var/cache/dsctl 2>/dev/null | wc -l").strip() == "0"
    assert lab.sh("lab-03", "id HwHiAiUser").exit_code != 0


def test_fresh_hosts_are_provisioned_while_an_unreachable_one_is_reported(bare_fleet):
    lab = bare_fleet
    dsctl("lab", "fault", "lab-03", "network-down")
    result = dsctl("provision", str(lab.inventory), "--json", check=False)
    report = json.loads(result.stdout)
    hosts = {row["host"]: row for row in report["data"]["hosts"]}
    assert result.returncode == 5, result.stderr
    assert hosts["lab-03"]["status"] == "unreachable"
    assert report["data"]["rerun"] == ["lab-03"]
    for name in ("lab-01", "lab-02"):
        assert hosts[name]["status"] == "changed"
        wanted = ("25.5.0", "7.8.0.5.216", "8.5.0")
        assert (hosts[name]["driver"], hosts[name]["firmware"], hosts[name]["cann"]) == wanted
        assert (hosts[name]["torch_npu"], hosts[name]["vllm_ascend"]) == ("2.8.0.post2", "0.13.0")
    # fresh host: the driver went in before the firmware (it needs the driver's upgrade-tool)
    operations = lab.sh_ok("lab-01", "cat /var/log/ascend_seclog/operation.log")
    assert operations.index("npu-driver_25.5.0") < operations.index("npu-firmware_7.8.0.5.216")
    # the run user the driver needs, the managed env file, the pinned venv
    assert "HwHiAiUser" in lab.sh_ok("lab-01", "id HwHiAiUser")
    env_file = lab.sh_ok("lab-01", "cat /etc/profile.d/dsctl-ascend.sh")
    assert "ascend-toolkit/set_env.sh" in env_file and "PYTORCH_NPU_ALLOC_CONF" in env_file
    # the lab's inventory applies the long-context profile: the field guide's memory env, as asked
    assert "export ASCEND_CACHE_SIZE='6000000000'" in env_file and "export GE_USE_STATIC_MEMORY='1'" in env_file
    written = {entry["name"]: entry for entry in hosts["lab-01"]["env"]}
    assert (written["ASCEND_CACHE_SIZE"]["source"], written["ASCEND_CACHE_SIZE"]["confidence"]) == (
        "field guide", "field practice, effect unknown")
    loaded = lab.sh_ok("lab-01", "bash -c '. /etc/profile.d/dsctl-ascend.sh && echo $ASCEND_TOOLKIT_HOME'")
    assert "/usr/local/Ascend/ascend-toolkit/latest" in loaded
    probe = "import torch_npu, vllm_ascend; print(torch_npu.__version__, vllm_ascend.__version__)"
    imported = lab.sh_ok("lab-01", f"/opt/dsctl/serving-venv/bin/python -c '{probe}'")
    assert imported.split() == ["2.8.0.post2", "0.13.0"]
    # The whole dependency tree came from the wheelhouse's lock, every wheel hash-checked (--require-hashes).
    assert venv_distributions(lab, "lab-01", "/opt/dsctl/serving-venv") == LOCKED_V0130
    requirements = lab.sh_ok("lab-01", "cat /opt/dsctl/serving-venv/dsctl-requirements.txt")
    assert "mpmath==1.3.0 --hash=sha256:" in requirements and "vllm==0.13.0+empty --hash=sha256:" in requirements

    dsctl("lab", "fault", "lab-03", "network-up")


# The closure of the v0.13.0 row among the lab's stand-ins (dsctl.lab.wheelhouse), as the venv lists it.
LOCKED_V0130 = {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0+empty", "vllm-ascend": "0.13.0",
                "triton-ascend": "3.2.0", "filelock": "3.16.1", "typing-extensions": "4.12.2", "sympy": "1.13.3",
                "mpmath": "1.3.0", "numpy": "1.26.4", "requests": "2.32.3", "idna": "3.10"}


def venv_distributions(lab, host: str, venv: str) -> dict[str, str]:
    script = ("import importlib.metadata as m, json, re; print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name'])"
              ".lower(): d.version for d in m.distributions()}))")
    listed = json.loads(lab.sh_ok(host, f'{venv}/bin/python -I -c "{script}"'))
    return {name: version for name, version in listed.items() if name not in ("pip", "setuptools")}


def test_an_http_package_source_is_downloaded_and_verified_on_the_host(bare_fleet, package_url, tmp_path):
    lab = bare_fleet
    inventory = _http_inventory(lab, package_url, tmp_path)  # pinned by `dsctl lab up`: plain http is accepted
    assert "dsctl_package_manifest_sha256" in lab.inventory.read_text()
    result = dsctl("provision", str(inventory), "--limit", "lab-03", "--json", check=False)
    assert result.returncode == 0, result.stdout
    row = json.loads(result.stdout)["data"]["hosts"][0]
    assert (row["host"], row["status"], row["cann"], row["vllm_ascend"]) == ("lab-03", "changed", "8.5.0", "0.13.0")


def test_a_site_index_serves_the_pins_with_the_locks_hashes(bare_fleet, package_url, tmp_path):
    """dsctl_pip_index_url: pip installs from the lab's PEP 503 index over http, every wheel checked against the
    lock (dsctl_pip_lock); a venv of its own, so the host's serving venv is left as it is."""
    lab = bare_fleet
    lock = next((lab.paths.packages / "wheels").glob("lock-vllm-ascend-0.13.0-*-x86_64-py3.11.txt"))
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"].update(
        dsctl_pip_index_url=f"{package_url}/wheels/simple/", dsctl_pip_lock=str(lock),
        dsctl_serving_venv="/opt/dsctl/mirror-venv")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    result = dsctl("provision", str(inventory), "--limit", "lab-02", "--tags", "serving", "--json", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert venv_distributions(lab, "lab-02", "/opt/dsctl/mirror-venv") == LOCKED_V0130
    requirements = lab.sh_ok("lab-02", "cat /opt/dsctl/mirror-venv/dsctl-requirements.txt")
    assert requirements.count("--hash=sha256:") == len(LOCKED_V0130)


def test_check_is_clean_and_a_second_provision_changes_nothing(bare_fleet):
    lab = bare_fleet
    result = dsctl("check", str(lab.inventory), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" ok ") >= 3
    # the field guide's memory env verified on every host, with its source and confidence
    assert "ASCEND_CACHE_SIZE=6000000000 profile long-context; field guide; field practice, effect unknown; " \
           "verified" in re.sub(r" {2,}", " ", result.stdout), result.stdout
    before = {h["name"]: h["boots"] for h in lab.status()["data"]}

    result = dsctl("provision", str(lab.inventory), "--json", check=False)
    assert result.returncode == 0
    rows = json.loads(result.stdout)["data"]["hosts"]
    assert [(row["changed"], row["status"]) for row in rows] == [(0, "ok")] * 3
    assert {h["name"]: h["boots"] for h in lab.status()["data"]} == before


def test_check_reports_env_drift_without_changing_anything(bare_fleet):
    lab = bare_fleet
    lab.sh_ok("lab-02", "sed -i -e 's/^export TASK_QUEUE_ENABLE=.*/export TASK_QUEUE_ENABLE=2/' "
                        "-e 's/^export GE_USE_STATIC_MEMORY=.*/export GE_USE_STATIC_MEMORY=0/' "
                        "/etc/profile.d/dsctl-ascend.sh")
    result = dsctl("check", str(lab.inventory), "--json", check=False)
    hosts = {row["host"]: row for row in json.loads(result.stdout)["data"]["hosts"]}
    assert result.returncode == 3
    assert hosts["lab-02"]["status"] == "error"
    assert any(f["component"] == "env" and "TASK_QUEUE_ENABLE" in f["sentence"] for f in hosts["lab-02"]["findings"])
    assert any(f["component"] == "env" and "GE_USE_STATIC_MEMORY is '0'" in f["sentence"]
               for f in hosts["lab-02"]["findings"])
    states = {entry["name"]: entry["state"] for entry in hosts["lab-02"]["env"]}
    assert (states["GE_USE_STATIC_MEMORY"], states["ASCEND_CACHE_SIZE"]) == ("drift", "verified")
    assert {entry["state"] for entry in hosts["lab-01"]["env"]} == {"verified"}
    assert "TASK_QUEUE_ENABLE=2" in lab.sh_ok("lab-02", "cat /etc/profile.d/dsctl-ascend.sh")
