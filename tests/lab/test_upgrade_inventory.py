"""After `dsctl upgrade` the inventory and the fleet agree (issue 20), on a site inventory whose services are in a
vault-encrypted group_vars file (issue 19: every verb that runs playbooks gets the vault password, the upgrade's
drain and undrain included).

One host at CANN 8.3.RC2 / vllm-ascend v0.11.0 serving one TP4 instance:
- `upgrade --cann 8.5.0 --vllm-ascend v0.13.0` writes both into the group_vars file that names them (its comment
  kept); `check` is clean and a `provision` afterwards changes nothing;
- that file set back to the old versions by hand: `provision` refuses the downgrade naming both versions and
  changes nothing; `--allow-downgrade` moves the host back and restarts its instance onto the old stack;
- a provision that switches CANN under a running instance leaves it on the old one: `check` names it (what its
  process has mapped), and `deploy` restarts it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import bring_up, dsctl, requires_lab
from .upgrade_fleet import DRIVER, FIRMWARE, SERVICE, UPGRADE_TIMEOUT, active_cann, served_cann

pytestmark = [pytest.mark.lab, requires_lab]

OLD = {"dsctl_cann_version": "8.3.RC2", "dsctl_vllm_ascend_version": "v0.11.0"}
NEW = {"dsctl_cann_version": "8.5.0", "dsctl_vllm_ascend_version": "v0.13.0"}
ANSIBLE_VAULT = Path(sys.executable).parent / "ansible-vault"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """lab-01 provisioned and serving from a directory inventory: hosts.yml, group_vars/npu_nodes/versions.yml
    (plain) and group_vars/npu_nodes/vault.yml (the services, encrypted)."""
    lab = bring_up("--hosts", "1", "--driver", DRIVER, "--firmware", FIRMWARE, "--cann", "8.3.RC2")
    try:
        root = tmp_path_factory.mktemp("site")
        (root / "hosts.yml").write_text(lab.inventory.read_text())
        group = root / "group_vars" / "npu_nodes"
        group.mkdir(parents=True)
        (group / "versions.yml").write_text("# the stack this fleet runs\n" + yaml.safe_dump(
            {"dsctl_driver_version": DRIVER, "dsctl_firmware_version": FIRMWARE, **OLD}, sort_keys=False))
        password = root.parent / "vault-password"
        password.write_text("lab vault password\n")
        secret = group / "vault.yml"
        secret.write_text(yaml.safe_dump({"dsctl_services": [SERVICE]}))
        subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password), str(secret)],
                       check=True, capture_output=True, timeout=60)
        for verb in ("provision", "deploy"):
            result = run(verb, root, password)
            assert result.returncode == 0, result.stdout + result.stderr
        yield lab, root, password
    finally:
        dsctl("lab", "down")


def run(verb: str, root: Path, password: Path, *args: str):
    return dsctl(verb, str(root), "--vault-password-file", str(password), *args, check=False,
                 timeout=UPGRADE_TIMEOUT)


def versions_file(root: Path) -> dict:
    return yaml.safe_load((root / "group_vars" / "npu_nodes" / "versions.yml").read_text())


def set_versions(root: Path, versions: dict) -> None:
    path = root / "group_vars" / "npu_nodes" / "versions.yml"
    path.write_text(path.read_text().replace(f"dsctl_cann_version: {versions_file(root)['dsctl_cann_version']}",
                                             f"dsctl_cann_version: {versions['dsctl_cann_version']}")
                    .replace(f"dsctl_vllm_ascend_version: {versions_file(root)['dsctl_vllm_ascend_version']}",
                             f"dsctl_vllm_ascend_version: {versions['dsctl_vllm_ascend_version']}"))
    assert {key: versions_file(root)[key] for key in versions} == versions


def findings(result) -> list[dict]:
    return [finding for host in json.loads(result.stdout)["data"]["hosts"] for finding in host["findings"]]


def test_an_upgrade_records_its_versions_so_check_is_clean_and_provision_changes_nothing(site):
    lab, root, password = site
    result = run("upgrade", root, password, "--cann", "8.5.0", "--vllm-ascend", "v0.13.0", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert any("versions.yml: dsctl_cann_version: 8.3.RC2 -> 8.5.0" in line
               for line in json.loads(result.stdout)["data"]["inventory"])
    assert {key: versions_file(root)[key] for key in NEW} == NEW
    assert (root / "group_vars" / "npu_nodes" / "versions.yml").read_text().startswith("# the stack this fleet")
    assert served_cann("lab-01") == "8.5.0"

    checked = run("check", root, password, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    provisioned = run("provision", root, password, "--json")
    assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
    assert [host["changed"] for host in json.loads(provisioned.stdout)["data"]["hosts"]] == [0]
    assert active_cann(lab, "lab-01") == "8.5.0" and served_cann("lab-01") == "8.5.0"


def test_a_downgrade_is_refused_naming_the_versions_and_with_the_flag_restarts_the_instance_onto_it(site):
    lab, root, password = site
    set_versions(root, OLD)
    refused = run("provision", root, password)
    assert refused.returncode != 0
    assert "CANN 8.5.0 -> 8.3.RC2" in refused.stderr + refused.stdout
    assert "vllm-ascend 0.13.0 -> 0.11.0" in refused.stderr + refused.stdout
    assert "--allow-downgrade" in refused.stderr + refused.stdout
    assert active_cann(lab, "lab-01") == "8.5.0" and served_cann("lab-01") == "8.5.0"
    checked = run("check", root, password, "--json")
    assert checked.returncode == 3 and "cann-older" in {f["code"] for f in findings(checked)}

    moved = run("provision", root, password, "--allow-downgrade", "--json")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert json.loads(moved.stdout)["data"]["restarted"] == ["lab-01/chat-0"]
    assert active_cann(lab, "lab-01") == "8.3.RC2" and served_cann("lab-01") == "8.3.RC2"
    assert run("check", root, password).returncode == 0


def test_an_instance_left_on_a_stack_no_longer_active_is_an_error_in_check_and_deploy_restarts_it(site):
    lab, root, password = site
    set_versions(root, NEW)  # a provision, not an upgrade, moves the host: nothing restarts the instance
    moved = run("provision", root, password)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert active_cann(lab, "lab-01") == "8.5.0" and served_cann("lab-01") == "8.3.RC2"
    checked = run("check", root, password, "--json")
    stale = [f for f in findings(checked) if f["code"] == "instance-stale-stack"]
    assert checked.returncode == 3 and len(stale) == 1, checked.stdout
    assert "chat-0" in stale[0]["sentence"] and "CANN 8.3.RC2" in stale[0]["sentence"]
    assert "--restart --limit lab-01" in stale[0]["fix"]
    deployed = run("deploy", root, password)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert served_cann("lab-01") == "8.5.0"
    assert run("check", root, password).returncode == 0
