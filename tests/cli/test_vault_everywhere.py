"""The vault options reach every inventory read and every playbook a verb runs (issue 19): the upgrade's
gateway drain and undrain, and `dsctl wheelhouse build INVENTORY`'s inventory read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.adapters import gateway
from dsctl.adapters.inventory import VaultOptions
from dsctl.app import main

ANSIBLE_VAULT = Path(sys.executable).parent / "ansible-vault"
PASSWORD = "correct horse battery staple"
HOSTS = "all:\n  children:\n    npu_nodes:\n      hosts:\n        kp-01: {ansible_host: 192.0.2.11}\n"
GROUP_VARS = "dsctl_npu_count: 8\ndsctl_package_source: /srv/ascend\n"


@pytest.fixture
def vaulted(tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """An inventory whose npu_nodes group_vars are one ansible-vault encrypted file; its password file."""
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    site = tmp_path / "site"
    (site / "group_vars" / "npu_nodes").mkdir(parents=True)
    inventory = site / "hosts.yml"
    inventory.write_text(HOSTS)
    secret = tmp_path / "vault-password"
    secret.write_text(PASSWORD + "\n")
    vault_file = site / "group_vars" / "npu_nodes" / "vault.yml"
    vault_file.write_text(GROUP_VARS)
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(secret), str(vault_file)],
                   check=True, capture_output=True, timeout=60)
    assert vault_file.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    return inventory, secret, vault_file


@pytest.mark.parametrize("step", [gateway.drain, gateway.undrain])
def test_the_gateway_steps_hand_the_vault_password_to_ansible_playbook(fake_ansible, vaulted, step):
    fake_ansible(0, [])
    inventory, secret, _ = vaulted
    result = step(inventory, ["kp-01/chat-0"], vault=VaultOptions(password_file=secret))
    assert result.ok, result.errors
    argv = fake_ansible.argv()
    assert Path(argv[argv.index("-i") + 1]) == inventory
    assert argv[argv.index("--vault-password-file") + 1] == str(secret)


def test_the_prompted_password_reaches_the_gateway_play_too(fake_ansible, vaulted, monkeypatch):
    fake_ansible(0, [])
    inventory, _, _ = vaulted
    monkeypatch.setattr("getpass.getpass", lambda prompt: PASSWORD)
    assert gateway.drain(inventory, ["kp-01/chat-0"], vault=VaultOptions(ask=True)).ok
    assert fake_ansible.vault_seen() == PASSWORD + "\n"


def test_wheelhouse_build_reads_a_vaulted_inventory_with_the_vault_options(vaulted, tmp_path, capsys):
    inventory, secret, vault_file = vaulted
    # --arch ppc64le: refused by the wheelhouse request check, which comes after the inventory read; no pip runs.
    args = ["wheelhouse", "build", str(inventory), "--find-links", str(tmp_path), "--arch", "ppc64le",
            "--out", str(tmp_path / "wh")]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"dsctl: error: inventory: {vault_file}: encrypted with ansible-vault and no vault password was given; pass "
        "--vault-password-file FILE or --ask-vault-pass (or set ANSIBLE_VAULT_PASSWORD_FILE, Ansible's own "
        "setting)\n")
    assert main([*args, "--vault-password-file", str(secret)]) == 2
    assert capsys.readouterr().err == "dsctl: error: arch: expected one of aarch64, x86_64, got 'ppc64le'\n"
    assert not (tmp_path / "wh").exists()
