"""`dsctl upgrade` keeps the inventory the one source of truth: the versions it installed are written where the
inventory defines them (issue 20).

Why a writer at all: without it the next `dsctl provision` switches the fleet back to the versions the inventory
still names. kubespray and the GPU Operator avoid that by taking the version *from* the single source of truth;
dsctl keeps the user's `--cann 8.5.0` and makes the inventory follow it, once the whole fleet runs it.

`plan_edit` (before any host changes) finds every definition of each version variable that applies to the fleet's
hosts: the ``vars`` of a group or a host in a YAML inventory file (any depth of ``children``), and the top-level
keys of ``group_vars/NAME`` / ``host_vars/NAME`` files and directories (with or without a .yml/.yaml suffix, as
Ansible reads them). It refuses, one line each, what cannot be edited faithfully: a templated value
(``"{{ cann }}"``), a value reached through a YAML merge key or alias (another group shares it), an unwritable file.
A variable defined nowhere is added to the ``npu_nodes`` group's vars (the YAML inventory file's, else
``group_vars/npu_nodes.yml``). `apply` edits with ruamel.yaml's round trip (comments, order and quoting kept),
writes each file atomically through its symlink with owner and mode kept, and returns the old contents so the
caller can `restore` them when Ansible, reading the edited inventory back, still resolves another version (a
vault-encrypted file or an INI inventory defining it: dsctl cannot edit those).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from dsctl.adapters import yaml_roundtrip
from dsctl.adapters.state_files import write_durably
from dsctl.core.upgrade.plan import VARIABLES  # the upgrade's version fields -> their inventory variables
from dsctl.errors import UsageError

SUFFIXES = (".yml", ".yaml")
NPU_GROUP = "npu_nodes"
MAX_DEPTH = 32  # group nesting walked in an inventory file


@dataclass(frozen=True)
class Site:
    """One definition of ``variable``: in ``path``, the mapping at ``keys`` (() for a vars file's top level)."""

    path: Path
    keys: tuple[str, ...]
    variable: str
    value: Any
    scope: str  # "group npu_nodes", "host lab-01"


@dataclass(frozen=True)
class VersionEdit:
    changes: dict[str, str]  # variable -> new value
    sites: tuple[Site, ...]  # existing definitions to rewrite
    additions: tuple[Site, ...] = ()  # variables defined nowhere: added here (value: the new one)

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(site.path for site in (*self.sites, *self.additions)))

    def describe(self) -> list[str]:
        return [f"{site.path}: {site.variable}: {site.value} -> {self.changes[site.variable]} ({site.scope})"
                for site in self.sites] + [f"{site.path}: {site.variable}: {site.value} (added, {site.scope})"
                                           for site in self.additions]


def _is_vault(text: str) -> bool:
    return text.lstrip().startswith("$ANSIBLE_VAULT")


def _vars_files(root: Path, kind: str) -> list[tuple[str, Path]]:
    """(group or host name, file) of ``root/kind``: NAME, NAME.yml, NAME.yaml, or every file in NAME/."""
    base = root / kind
    if not base.is_dir():
        return []
    found = []
    for entry in sorted(base.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found += [(entry.name, p) for p in sorted(entry.rglob("*")) if p.is_file() and not p.name.startswith(".")
                      and (p.suffix in SUFFIXES or not p.suffix)]
        elif entry.is_file() and (entry.suffix in SUFFIXES or not entry.suffix):
            found.append((entry.name.removesuffix(entry.suffix) if entry.suffix in SUFFIXES else entry.name, entry))
    return found


def _inventory_files(inventory: Path) -> list[Path]:
    if inventory.is_file():
        return [inventory] if inventory.suffix in SUFFIXES else []
    return sorted(p for p in inventory.iterdir() if p.is_file() and p.suffix in SUFFIXES)


def _walk(node: Any, keys: tuple[str, ...], group: str, members: dict[str, set[str]],
          depth: int = 0) -> Iterable[tuple[tuple[str, ...], str, Any]]:
    """(keys of a vars mapping, scope, mapping) of a YAML inventory group, recording group -> hosts."""
    if depth > MAX_DEPTH or not isinstance(node, Mapping):
        return
    hosts = members.setdefault(group, set())
    if isinstance(node.get("vars"), Mapping):
        yield (*keys, "vars"), f"group {group}", node["vars"]
    if isinstance(node.get("hosts"), Mapping):
        for host, host_vars in node["hosts"].items():
            hosts.add(str(host))
            if isinstance(host_vars, Mapping):
                yield (*keys, "hosts", str(host)), f"host {host}", host_vars
    if isinstance(node.get("children"), Mapping):
        for child, sub in node["children"].items():
            yield from _walk(sub, (*keys, "children", str(child)), str(child), members, depth + 1)
            hosts |= members.get(str(child), set())


def _applies(scope: str, fleet: set[str], members: dict[str, set[str]]) -> bool:
    kind, _, name = scope.partition(" ")
    if kind == "host":
        return name in fleet
    if name == "all" or name not in members:
        return True  # a group the YAML files do not describe (an INI source): assume it reaches the fleet
    return bool(members[name] & fleet)


def _own(mapping: Any, key: str) -> bool:
    """``key`` is the mapping's own, not merged in from ``<<: *anchor`` (editing it would change the anchor's
    other users, or not take effect at all)."""
    if isinstance(mapping, CommentedMap):
        return key in mapping._ok  # noqa: SLF001 (ruamel's own-keys set; merged keys are not in it)
    return key in mapping


def _check_value(site: Site, mapping: Any) -> None:
    flag = "--" + next(name for name, var in VARIABLES.items() if var == site.variable).replace("_", "-")
    fix = (f"set {site.variable} to the version you upgrade to by hand, then run dsctl upgrade without {flag} "
           "(it takes the inventory's versions)")
    if not _own(mapping, site.variable):
        raise UsageError(f"{site.path}: {site.variable} ({site.scope}) comes from a YAML merge key (<<: *anchor) "
                         f"that other groups may share; dsctl does not edit it: {fix}")
    value = site.value
    if getattr(value, "tag", None) is not None and str(getattr(value.tag, "value", "")) == "!vault":
        raise UsageError(f"{site.path}: {site.variable} ({site.scope}) is vault-encrypted: {fix}")
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        raise UsageError(f"{site.path}: {site.variable} ({site.scope}) is templated ({value!r}): {fix}")
    if hasattr(value, "anchor") and getattr(value.anchor, "value", None):
        raise UsageError(f"{site.path}: {site.variable} ({site.scope}) is a YAML anchor other values may use: {fix}")


def _writable(path: Path) -> None:
    target = Path(os.path.realpath(path))
    if not os.access(target, os.W_OK) or not os.access(target.parent, os.W_OK):
        raise UsageError(f"{path}: not writable by this user, so dsctl upgrade cannot record the versions it "
                         "installs; run as the inventory's owner, or set them by hand and run without the flags")


def _load(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; dsctl upgrade cannot record versions in it") from None
    if _is_vault(text):
        return None
    return yaml_roundtrip.loader().load(text)


def plan_edit(inventory: Path, hosts: Iterable[str], changes: Mapping[str, str]) -> VersionEdit:
    """Where each of ``changes`` (variable -> new value) is written for ``hosts``; raises `UsageError`."""
    inventory = Path(inventory)
    fleet = set(hosts)
    root = inventory if inventory.is_dir() else inventory.parent
    members: dict[str, set[str]] = {}
    candidates: list[tuple[Site, Any]] = []
    group_anchor: tuple[Path, tuple[str, ...]] | None = None
    for path in _inventory_files(inventory):
        document = _load(path)
        if not isinstance(document, Mapping):
            continue
        for group, node in document.items():
            for keys, scope, mapping in _walk(node, (str(group),), str(group), members):
                if scope == f"group {NPU_GROUP}" and group_anchor is None:
                    group_anchor = (path, keys)
                candidates += [(Site(path, keys, var, mapping[var], scope), mapping) for var in changes
                               if var in mapping]
            if group_anchor is None and isinstance(node, Mapping):
                found = _npu_group_keys(node, (str(group),))
                if found is not None:
                    group_anchor = (path, found)
    for kind, scope_kind in (("group_vars", "group"), ("host_vars", "host")):
        for name, path in _vars_files(root, kind):
            document = _load(path)
            if not isinstance(document, Mapping):
                continue
            candidates += [(Site(path, (), var, document[var], f"{scope_kind} {name}"), document) for var in changes
                           if var in document]
    sites: list[Site] = []
    for site, mapping in candidates:
        if not _applies(site.scope, fleet, members):
            continue
        _check_value(site, mapping)
        if str(site.value) != str(changes[site.variable]):
            sites.append(site)
    additions: list[Site] = []
    defined = {site.variable for site, _ in candidates if _applies(site.scope, fleet, members)}
    missing = [var for var in changes if var not in defined]
    if missing:
        where = group_anchor
        if where is None:
            where = (root / "group_vars" / f"{NPU_GROUP}.yml", ())
            if not where[0].parent.is_dir() and not inventory.is_dir():
                raise UsageError(f"{inventory}: {', '.join(missing)} is set nowhere dsctl can edit; add it to the "
                                 f"{NPU_GROUP} group's vars, then run dsctl upgrade again")
        additions = [Site(where[0], where[1], var, changes[var], f"group {NPU_GROUP}") for var in missing]
    edit = VersionEdit(dict(changes), tuple(sites), tuple(additions))
    for path in edit.files:
        _writable(path) if path.exists() else _writable(path.parent / ".")
    return edit


def _npu_group_keys(node: Any, keys: tuple[str, ...], depth: int = 0) -> tuple[str, ...] | None:
    """The keys of the npu_nodes group's (future) ``vars`` mapping in an inventory file without one."""
    if depth > MAX_DEPTH or not isinstance(node, Mapping) or not isinstance(node.get("children"), Mapping):
        return None
    for child, sub in node["children"].items():
        if str(child) == NPU_GROUP and isinstance(sub, Mapping):
            return (*keys, "children", NPU_GROUP, "vars")
        found = _npu_group_keys(sub, (*keys, "children", str(child)), depth + 1)
        if found is not None:
            return found
    return None


def _dig(document: Any, keys: tuple[str, ...]) -> Any:
    node = document
    for index, key in enumerate(keys):
        if key not in node or node[key] is None:
            if index == len(keys) - 1:
                node[key] = CommentedMap()
            else:
                raise KeyError(key)
        node = node[key]
    return node


def apply(edit: VersionEdit) -> dict[Path, bytes | None]:
    """Write the edit; the files' previous contents (None: the file did not exist) for `restore`."""
    previous: dict[Path, bytes | None] = {}
    for path in edit.files:
        previous[path] = path.read_bytes() if path.exists() else None
        text = previous[path].decode("utf-8") if previous[path] is not None else ""
        yaml = yaml_roundtrip.editor(text)
        document = yaml.load(text) if text.strip() else CommentedMap()
        for site in (*edit.sites, *edit.additions):
            if site.path != path:
                continue
            mapping = _dig(document, site.keys) if site.keys else document
            mapping[site.variable] = type(site.value)(edit.changes[site.variable]) \
                if isinstance(site.value, str) and site in edit.sites else str(edit.changes[site.variable])
        buffer = io.StringIO()
        if not text.strip():
            buffer.write("---\n")
        yaml.dump(document, buffer)
        _write_in_place(path, buffer.getvalue())
    return previous


def restore(previous: Mapping[Path, bytes | None]) -> None:
    for path, content in previous.items():
        if content is None:
            path.unlink(missing_ok=True)
        else:
            _write_in_place(path, content.decode("utf-8"))


def _write_in_place(path: Path, text: str) -> None:
    """Atomically, through a symlink to its target, keeping the target's mode, owner and group."""
    target = Path(os.path.realpath(path))
    if target.exists():
        info = target.stat()
        write_durably(target, text, mode=info.st_mode & 0o7777, owner=(info.st_uid, info.st_gid))
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_durably(target, text, mode=0o644)
