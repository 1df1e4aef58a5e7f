"""Read an Ansible inventory the way ansible-playbook will: `ansible-inventory --list`, group_vars merged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.assets import asset_root
from dsctl.errors import UsageError

NPU_GROUP = "npu_nodes"


@dataclass(frozen=True)
class VaultOptions:
    """How Ansible gets the vault password: a password file (``--vault-password-file``), a prompt
    (``--ask-vault-pass``) or neither (Ansible then honours ``ANSIBLE_VAULT_PASSWORD_FILE`` itself)."""

    password_file: Path | None = None
    ask: bool = False


def host_vars(inventory: Path, group: str = NPU_GROUP, vault: VaultOptions | None = None,
              limit: str | None = None) -> dict[str, dict[str, Any]]:
    """Every host of ``group`` with its merged variables; a missing file or empty group is a usage error."""
    if not inventory.is_file() and not inventory.is_dir():
        raise UsageError(f"inventory: {inventory} does not exist; pass the path `dsctl lab up` printed or your own")
    command = [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory), "--list"]
    env = {**os.environ, "ANSIBLE_CONFIG": str(asset_root() / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if result.returncode != 0:
        detail = next((line for line in result.stderr.splitlines() if "ERROR" in line), result.stderr.strip()[-300:])
        raise UsageError(f"inventory: {inventory} cannot be parsed: {detail.strip()}")
    listing = json.loads(result.stdout)
    meta = listing.get("_meta", {}).get("hostvars", {})
    hosts = _group_hosts(listing, group)
    if not hosts:
        raise UsageError(
            f"inventory: {inventory} has no hosts in group {group}; list your NPU servers under "
            f"all.children.{group}.hosts (see inventories/sample/hosts.yml)"
        )
    return {host: meta.get(host, {}) for host in hosts}


def _group_hosts(listing: dict[str, Any], group: str) -> list[str]:
    """Hosts of a group and of its child groups, in inventory order."""
    seen: list[str] = []
    pending = [group]
    while pending:
        entry = listing.get(pending.pop(0), {})
        seen += [host for host in entry.get("hosts", []) if host not in seen]
        pending += entry.get("children", [])
    return seen
