"""`dsctl tune --write-back`: put the winner's engine parameters into the inventory, where `dsctl deploy` reads them.

The service is found by name in the ``dsctl_services`` lists of the inventory's ``group_vars/`` and ``host_vars/``
files (``NAME.yml``/``.yaml``, or every such file in a ``NAME/`` directory).  Each definition found gets the winner:
Ansible replaces a list variable rather than merging it, so a host whose host_vars define the service runs that
definition, and it must carry the winner too for a later deploy to reproduce the tune (``only=`` restricts the
write to one file).

Edits are round trips through ruamel.yaml (its round-trip loader keeps comments, key order, quoting and the file's
indentation, as guessed from the file): only the service's ``params`` keys the winner sets change (added at the
end of ``params`` when new) and, when the winner sets them, its tensor/data parallel fields.  Each file is written
atomically (a temporary file in the same directory, fsync, rename over the original, mode kept), so an interrupted
write-back leaves the old file or the new one, never half of one.  Vault-encrypted files cannot be edited in place
and are skipped; if that leaves no definition, the write-back is refused.
"""

from __future__ import annotations

import io
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken
from ruamel.yaml.util import load_yaml_guess_indent

from dsctl.adapters.state_files import write_durably
from dsctl.errors import UsageError

SERVICES_VAR = "dsctl_services"
_SUFFIXES = (".yml", ".yaml")


@dataclass(frozen=True)
class Definition:
    path: Path
    index: int  # position in the file's dsctl_services list


@dataclass(frozen=True)
class WriteBack:
    written: tuple[Path, ...]
    changed: dict[str, Any]  # key -> new value (params and fields)
    skipped: tuple[str, ...]  # one line per file passed over (vault-encrypted)


def _vars_files(inventory: Path) -> list[Path]:
    """The inventory's own YAML file (its group and host ``vars`` may define services: `dsctl lab up` writes one
    such file) and its group_vars/host_vars files."""
    root = inventory if inventory.is_dir() else inventory.parent
    files: list[Path] = [inventory] if inventory.is_file() and inventory.suffix in _SUFFIXES else []
    for kind in ("group_vars", "host_vars"):
        base = root / kind
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            if entry.is_file() and entry.suffix in _SUFFIXES:
                files.append(entry)
            elif entry.is_dir():
                files += sorted(p for p in entry.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
    return files


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long lines
    return yaml


def find_definitions(inventory: Path, service: str) -> tuple[list[Definition], list[str]]:
    """Where ``service`` is defined, and the files that could not be read (vault-encrypted)."""
    found: list[Definition] = []
    skipped: list[str] = []
    for path in _vars_files(inventory):
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("$ANSIBLE_VAULT"):
            skipped.append(f"{path}: vault-encrypted, not edited")
            continue
        if SERVICES_VAR not in text:
            continue
        document = _yaml().load(text)
        found += [Definition(path, i) for services in _service_lists(document) for i, entry in enumerate(services)
                  if isinstance(entry, Mapping) and entry.get("name") == service]
    return found, skipped


def _service_lists(node: Any, depth: int = 0) -> list[list[Any]]:
    """Every ``dsctl_services`` list in a vars file (top level) or an inventory file (under a group's or a host's
    vars, at any depth of ``children``); the depth is bounded like Ansible's group nesting in practice."""
    if depth > 32 or not isinstance(node, Mapping):
        return []
    found: list[list[Any]] = []
    for key, value in node.items():
        if key == SERVICES_VAR and isinstance(value, list):
            found.append(value)
        elif isinstance(value, Mapping):
            found += _service_lists(value, depth + 1)
    return found


def _atomic_write(path: Path, text: str) -> None:
    write_durably(path, text, mode=stat.S_IMODE(path.stat().st_mode))


def _edit(path: Path, service: str, params: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    _, indent, block_seq_indent = load_yaml_guess_indent(text)
    yaml = _yaml()
    sequence, offset = indent or 2, block_seq_indent or 0
    yaml.indent(mapping=max(2, sequence - offset), sequence=sequence, offset=offset)
    document = yaml.load(text)
    changed: dict[str, Any] = {}
    for entry in (item for services in _service_lists(document) for item in services):
        if not (isinstance(entry, Mapping) and entry.get("name") == service):
            continue
        current = entry.get("params")
        if not isinstance(current, Mapping):
            current = CommentedMap()
            entry["params"] = current
        last = next(reversed(current), None) if len(current) else None
        for key, value in params.items():
            if key not in current or current[key] != value or isinstance(current[key], bool) != isinstance(value, bool):
                current[key] = value
                changed[f"params.{key}"] = value
        _keep_trailing_comment(current, last)
        for key, value in fields.items():
            if entry.get(key) != value:
                entry[key] = value
                changed[key] = value
    if changed:
        buffer = io.StringIO()
        yaml.dump(document, buffer)
        _atomic_write(path, buffer.getvalue())
    return changed


def _keep_trailing_comment(mapping: CommentedMap, old_last: Any) -> None:
    """Keys appended after ``old_last`` go above the comment lines that followed it (ruamel attaches the comment
    lines after a mapping to its last key, so a new key would land below them, e.g. below the commented-out
    api_key line of the sample inventory)."""
    new_last = next(reversed(mapping), None)
    if old_last is None or new_last == old_last or old_last not in mapping.ca.items:
        return
    slots = mapping.ca.items[old_last]
    token = slots[2] if len(slots) > 2 else None
    if token is None or "\n" not in token.value:
        return
    eol, _, rest = token.value.partition("\n")
    if not rest:
        return
    if eol.strip():
        token.value = eol + "\n"
    else:
        slots[2] = None
        if not any(slots):
            del mapping.ca.items[old_last]
    mapping.ca.items[new_last] = [None, None, CommentToken("\n" + rest, CommentMark(token.column), None), None]


def write_back(inventory: Path, service: str, params: Mapping[str, Any], *, fields: Mapping[str, Any] | None = None,
               only: Path | None = None) -> WriteBack:
    """Write ``params`` (and ``fields``: tensor/data parallel size) into every definition of ``service``.

    Raises `UsageError` (one line) when no editable file defines the service."""
    definitions, skipped = find_definitions(inventory, service)
    if only is not None:
        definitions = [d for d in definitions if d.path.resolve() == only.resolve()]
    if not definitions:
        where = f"{only}" if only is not None else f"{inventory} or its group_vars/host_vars files"
        extra = f" ({'; '.join(skipped)})" if skipped else ""
        raise UsageError(f"--write-back: service {service!r} is not defined in {SERVICES_VAR} in {where}{extra}; "
                         "check the service name or write the parameters by hand")
    written: list[Path] = []
    changed: dict[str, Any] = {}
    for path in dict.fromkeys(d.path for d in definitions):
        edits = _edit(path, service, params, dict(fields or {}))
        if edits:
            written.append(path)
            changed.update(edits)
    return WriteBack(tuple(written), changed, tuple(skipped))
