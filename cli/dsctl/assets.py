"""Where the Ansible side (playbooks, roles, templates, sample inventories) lives.

An installed wheel carries it under ``dsctl/_assets`` (pyproject force-include);
an editable install or a source checkout uses the repository's top level.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

ASSET_DIRS = ("playbooks", "roles", "templates", "inventories")


@cache
def asset_root() -> Path:
    bundled = Path(str(resources.files("dsctl"))) / "_assets"
    if (bundled / "playbooks").is_dir():
        return bundled
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "playbooks").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout
    raise FileNotFoundError(f"dsctl's playbooks are missing from {bundled} and {checkout}; reinstall dsctl")


def playbook(name: str) -> Path:
    return asset_root() / "playbooks" / name


def roles_dir() -> Path:
    return asset_root() / "roles"


def templates_dir() -> Path:
    return asset_root() / "templates"


def ansible_cfg() -> Path:
    return asset_root() / "ansible.cfg"
