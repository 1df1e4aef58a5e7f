"""Inputs on a provisioned lab host: a vault-encrypted API key end to end, and a login account refused.

One lab host for the module: provisioned once, then deployed through the CLI as a site would
(``dsctl deploy INV --vault-password-file F``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import address, bring_up, default_hdk_and_cann, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

KEY = "vaulted-lab-key-5e6f7a8b9c"
PASSWORD = "lab vault password"
HOST, ADDRESS = "lab-01", address("lab-01")
ANSIBLE_VAULT = Path(sys.executable).parent / "ansible-vault"


def service(**changes) -> dict:
    return {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
            "served_model_name": "r1-7b", "npus_per_instance": 4, "port": 8000, "health_timeout_s": 120,
            "api_key": "{{ vault_chat_api_key }}", "params": {"max_num_seqs": 16}, **changes}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The lab inventory as a site's directory: hosts.yml, and the key in an ansible-vault encrypted file."""
    lab = bring_up("--hosts", "1", *default_hdk_and_cann())
    result = dsctl("provision", str(lab.inventory), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    directory = tmp_path_factory.mktemp("site")
    password_file = directory / "vault-password"
    password_file.write_text(PASSWORD + "\n")
    vault_file = directory / "group_vars" / "npu_nodes" / "vault.yml"
    vault_file.parent.mkdir(parents=True)
    vault_file.write_text(f"vault_chat_api_key: {KEY}\n")
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password_file), str(vault_file)],
                   check=True, capture_output=True, timeout=60)
    yield lab, directory, password_file, vault_file
    dsctl("lab", "down")


def write_inventory(lab, directory: Path, services: list[dict], allowed_accounts: list[str] | None = None) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"] = services
    if allowed_accounts:
        data["all"]["children"]["npu_nodes"]["vars"]["dsctl_allowed_accounts"] = allowed_accounts
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def get(path: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"http://{ADDRESS}:8000{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_vault_encrypted_api_key_works_end_to_end(site):
    lab, directory, password_file, vault_file = site
    inventory = write_inventory(lab, directory, [service()])

    # Without the password: one line naming the encrypted file, before any play and with the host untouched.
    refused = dsctl("deploy", str(inventory), check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and str(vault_file) in refused.stderr
    assert lab.sh(HOST, "test -e /etc/dsctl/services/chat-0").exit_code != 0

    result = dsctl("deploy", str(inventory), "--json", "--vault-password-file", str(password_file), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(result.stdout)["data"]["instances"]
    assert (row["instance"], row["status"]) == ("chat-0", "restarted")
    assert KEY not in result.stdout + result.stderr

    # The instance refuses a request without the key (or with another) and serves one with it.
    assert get("/v1/models") == 401
    assert get("/v1/models", "not-the-key-000") == 401
    assert get("/v1/models", KEY) == 200
    probe = dsctl("probe", f"http://{ADDRESS}:8000", "--rate", "inf", "--requests", "2", "--prompt-tokens", "16",
                  "--output-tokens", "4", "--api-key", KEY, "--json", check=False)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert json.loads(probe.stdout)["data"]["metrics"]["completed"] == 2
    # the decrypted key is on the host only in the instance's 0600 env file
    assert lab.sh_ok(HOST, "stat -c %a /etc/dsctl/services/chat-0/service.env").strip() == "600"
    assert KEY not in lab.sh_ok(HOST, "cat /etc/dsctl/services/chat-0/launch.sh /etc/supervisor/conf.d/*.conf")

    again = dsctl("deploy", str(inventory), "--json", "--vault-password-file", str(password_file), check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["status"] for r in json.loads(again.stdout)["data"]["instances"]] == ["unchanged"]


def test_an_existing_login_account_is_refused_as_service_user_and_left_as_it_is(site):
    lab, directory, password_file, _ = site
    lab.sh_ok(HOST, "id alice >/dev/null 2>&1 || useradd --create-home --shell /bin/bash alice")
    before = lab.sh_ok(HOST, "getent passwd alice")
    running = lab.sh_ok(HOST, "supervisorctl pid dsctl-chat-0").strip()
    # Allow-listed, or the schema refuses alice before any host (not an account dsctl creates): the role's own
    # check of an existing login account is what this test shows.
    inventory = write_inventory(lab, directory, [service(user="alice", params={"max_num_seqs": 8})],
                                allowed_accounts=["alice"])
    result = dsctl("deploy", str(inventory), "--json", "--vault-password-file", str(password_file), check=False)
    assert result.returncode == 4, result.stdout + result.stderr
    errors = " ".join(json.loads(result.stdout)["errors"])
    assert "service user alice is an existing login account (shell /bin/bash)" in errors
    assert "set the service's user to a new name" in errors
    assert lab.sh_ok(HOST, "getent passwd alice") == before  # still a login account, in no new group
    assert "HwHiAiUser" not in lab.sh_ok(HOST, "id -nG alice")
    # nothing of the instance changed: same process, same files
    assert lab.sh_ok(HOST, "supervisorctl pid dsctl-chat-0").strip() == running
    assert "--max-num-seqs 16" in lab.sh_ok(HOST, "cat /etc/dsctl/services/chat-0/launch.sh")
