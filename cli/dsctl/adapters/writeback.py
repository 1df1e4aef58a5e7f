"""`dsctl tune --write-back`: put the winner's engine parameters into the inventory, where `dsctl deploy` reads them.

Where the service is defined: the ``dsctl_services`` lists of the inventory itself (a YAML inventory file, or every
YAML file of an inventory directory: the group and host ``vars`` at any depth of ``children``) and of its
``group_vars/`` and ``host_vars/`` files, found as Ansible finds them (``NAME``, ``NAME.yml``, ``NAME.yaml`` or
``NAME.json``, the first that exists, and in a ``NAME/`` directory every file with one of those extensions or
none; hidden files and ``~`` backups skipped).  Each definition found gets the winner: Ansible replaces a list
variable rather than merging it, so a host whose host_vars define the service runs that definition, and it must
carry the winner too for a later deploy to reproduce the tune (``only=`` restricts the write to one file).

`check` says, before the tune restarts anything, whether the write-back can succeed; `write_back` runs the same
checks again on what the files hold at the end.  Refused, in one line naming the file, the reason and the fix:
a file that is not UTF-8 or not YAML ruamel.yaml can round-trip (an INI inventory, a JSON file, whose rewrite
would be YAML); no definition left once vault-encrypted files and templated or encrypted ``dsctl_services`` are
passed over; ``params`` that is a Jinja template (``"{{ x }}"``: writing would replace it with the winner's keys
alone) or comes from a merge key (``<<: *common``); a definition, its ``params`` or its list reached through a YAML
anchor that another variable or service shares (``params: *common``: writing would silently change that one too);
a file or directory this user cannot write, or a file owned by another user or group that a rewrite would take
over.

Edits are round trips through ruamel.yaml (its round-trip loader keeps comments, key order, quoting and the file's
indentation, as guessed from the file): only the service's ``params`` keys the winner sets change (added at the
end of ``params`` when new) and, when the winner sets them, its tensor/data parallel fields.  Each file is written
atomically (`state_files.write_durably`: a temporary file beside it, fsync, rename over it, fsync the directory),
so an interrupted write leaves the old file or the new one, never half of one; the file keeps its mode, owner and
group, and a symlinked file is written through the link (the target is replaced, the link stays).  Every file's
new text is made before the first is written, and when a later write fails the files already written get their
old text back: a failed write-back leaves the inventory as it was.
"""

from __future__ import annotations

import grp
import io
import os
import pwd
import stat
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap, TaggedScalar
from ruamel.yaml.error import CommentMark, MarkedYAMLError, YAMLError
from ruamel.yaml.tokens import CommentToken

from dsctl.adapters import yaml_roundtrip
from dsctl.adapters.state_files import write_durably
from dsctl.errors import DsctlError, UsageError

SERVICES_VAR = "dsctl_services"
# Ansible's order for group_vars/NAME and host_vars/NAME (DataLoader.find_vars_files): the first that exists wins.
_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")
# What Ansible skips in an inventory directory (inventory.manager.IGNORED with the default ignore extensions).
_INVENTORY_SKIPPED_DIRS = ("group_vars", "host_vars", "vars_plugins")
_INVENTORY_SKIPPED_ENDINGS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg",
                              ".retry")
_MAX_DEPTH = 64  # group nesting in an inventory file and directory nesting in group_vars: far beyond practice
_BOM = "\ufeff"
_ALTERNATIVE = "or tune without --write-back and write the winner by hand"


@dataclass(frozen=True)
class Definition:
    path: Path
    index: int  # position in the file's dsctl_services list


@dataclass(frozen=True)
class WriteBack:
    written: tuple[Path, ...]
    changed: dict[str, Any]  # key -> new value (params and fields)
    skipped: tuple[str, ...]  # one line per file passed over (vault-encrypted, templated)


@dataclass
class _Source:
    """One file that defines the service, checked: what write-back would rewrite."""

    path: Path  # as found (a symlink stays one)
    target: Path  # the file written: the link's target
    kind: str  # "vars" or "inventory"
    text: str  # without a byte order mark
    bom: bool
    info: os.stat_result = field(repr=False)
    indices: tuple[int, ...] = ()  # the definitions' positions in their dsctl_services lists


# --------------------------------------------------------------------------- the files Ansible reads


def _hidden(name: str) -> bool:
    return name.startswith(".") or name.endswith("~")


def _vars_dir(directory: Path, depth: int = 0) -> list[Path]:
    """A group_vars/NAME/ directory as Ansible reads it: files with a vars extension or none, subdirectories
    without an extension, sorted by name."""
    if depth > _MAX_DEPTH:
        return []
    found: list[Path] = []
    for entry in sorted(directory.iterdir()):
        if _hidden(entry.name):
            continue
        suffix = os.path.splitext(entry.name)[1]
        if entry.is_dir() and not suffix:
            found += _vars_dir(entry, depth + 1)
        elif entry.is_file() and suffix in _VARS_SUFFIXES:
            found.append(entry)
    return found


def _vars_files(base: Path, names: frozenset[str] = frozenset()) -> list[Path]:
    """group_vars/ or host_vars/: for every NAME the first of NAME (a file or a directory), NAME.yml, NAME.yaml,
    NAME.json that exists, as Ansible looks them up (the others it never reads).  An entry with another extension
    is taken only when ``names`` holds it: a host named npu-01.example.com has host_vars/npu-01.example.com, but
    services.yml.bak is nobody's."""
    if not base.is_dir():
        return []
    entries = {entry.name: entry for entry in base.iterdir() if not _hidden(entry.name)}
    found: list[Path] = []
    for name in sorted(entries):
        entry = entries[name]
        if os.path.splitext(name)[1] not in _VARS_SUFFIXES and name not in names:
            continue
        suffix = next((s for s in _VARS_SUFFIXES[1:] if name.endswith(s) and len(name) > len(s)), "")
        stem = name[:len(name) - len(suffix)]
        if suffix and any(stem + earlier in entries for earlier in _VARS_SUFFIXES[:_VARS_SUFFIXES.index(suffix)]):
            continue  # NAME (or NAME.yml before NAME.yaml) exists: Ansible reads that one, not this
        if entry.is_dir():
            if not suffix:
                found += _vars_dir(entry)
        elif entry.is_file():
            found.append(entry)
    return found


def _inventory_files(inventory: Path, depth: int = 0) -> list[Path]:
    """The inventory file, or the files of an inventory directory Ansible tries as inventory sources (every
    entry but hidden ones, group_vars/, host_vars/, vars_plugins/ and the ignored extensions, recursively)."""
    if inventory.is_file():
        return [inventory]
    if not inventory.is_dir() or depth > _MAX_DEPTH:
        return []
    found: list[Path] = []
    for entry in sorted(inventory.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(_INVENTORY_SKIPPED_ENDINGS) or (
                entry.name in _INVENTORY_SKIPPED_DIRS):
            continue
        found += _inventory_files(entry, depth + 1)
    return found


def _sources(inventory: Path, hosts: frozenset[str]) -> list[tuple[Path, str]]:
    root = inventory if inventory.is_dir() else inventory.parent
    files = [(path, "inventory") for path in _inventory_files(inventory)]
    files += [(path, "vars") for path in _vars_files(root / "group_vars")]
    files += [(path, "vars") for path in _vars_files(root / "host_vars", hosts)]
    return files


# --------------------------------------------------------------------------- reading one file


def _template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _own(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping's own keys: without what a merge key (``<<: *anchor``) brings in."""
    if isinstance(mapping, CommentedMap):
        return dict(mapping.non_merged_items())
    return dict(mapping)


def _merged(mapping: Any) -> list[Any]:
    """The mappings a merge key brings into ``mapping`` (ruamel keeps them apart from the mapping's own keys)."""
    if not isinstance(mapping, CommentedMap):
        return []
    return [item[1] if isinstance(item, tuple) else item for item in mapping.merge]


def _service_vars(document: Any, kind: str) -> list[Mapping[str, Any]]:
    """The mappings of variables that hold ``dsctl_services``: a vars file's top level, or an inventory file's
    group ``vars`` and host entries (groups at the top, their ``children`` at any depth)."""
    if not isinstance(document, Mapping):
        return []
    if kind == "vars":
        return [document] if SERVICES_VAR in document else []
    found: dict[int, Mapping[str, Any]] = {}  # a group under several parents is one group
    seen: set[int] = set()
    groups: deque[tuple[Any, int]] = deque((group, 0) for group in document.values())
    while groups:
        group, depth = groups.popleft()
        if not isinstance(group, Mapping) or id(group) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(group))
        hosts, children = group.get("hosts"), group.get("children")
        for holder in [group.get("vars"), *(hosts.values() if isinstance(hosts, Mapping) else ())]:
            if isinstance(holder, Mapping) and SERVICES_VAR in holder:
                found.setdefault(id(holder), holder)
        if isinstance(children, Mapping):
            groups.extend((child, depth + 1) for child in children.values())
    return list(found.values())


def _children(node: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(node, Mapping):
        yield from _own(node).items()
        yield from (("<<", source) for source in _merged(node))
    elif isinstance(node, list):
        yield from enumerate(node)


def _reaches(document: Any) -> tuple[dict[int, list[tuple[int, Any]]], dict[int, str]]:
    """Every mapping and list of the document -> each place it appears (parent, key): an anchor's node appears
    once for its anchor and once per alias.  Also the first path to each, for the refusal's words."""
    reached: dict[int, list[tuple[int, Any]]] = {}
    where: dict[int, str] = {id(document): ""}
    queue: deque[Any] = deque([document])
    while queue:
        node = queue.popleft()
        for key, child in _children(node):
            if not isinstance(child, Mapping | list):
                continue
            reached.setdefault(id(child), []).append((id(node), key))
            if id(child) not in where:
                step = f"[{key}]" if isinstance(key, int) else (f".{key}" if where[id(node)] else str(key))
                where[id(child)] = where[id(node)] + step
                queue.append(child)
    return reached, where


def _anchor(node: Any) -> str:
    """The anchor's name (``common`` of ``&common``), or "" for a node without one."""
    anchor = node.yaml_anchor() if hasattr(node, "yaml_anchor") else None
    return str(anchor.value) if anchor is not None and anchor.value else ""


def _decoded(path: Path, raw: bytes) -> tuple[str, bool]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"--write-back: {path} is not UTF-8 (byte 0x{raw[exc.start]:02x} on line {line}), and "
                         f"write-back rewrites it as UTF-8 text; save it as UTF-8, {_ALTERNATIVE}") from None
    return (text[1:], True) if text.startswith(_BOM) else (text, False)


def _loaded(path: Path, kind: str, text: str) -> Any:
    try:
        return yaml_roundtrip.loader().load(text)
    except YAMLError as exc:
        problem = exc.problem if isinstance(exc, MarkedYAMLError) and exc.problem else str(exc).splitlines()[0]
        mark = exc.problem_mark if isinstance(exc, MarkedYAMLError) else None
        at = f" at line {mark.line + 1}" if mark is not None else ""
        fix = ("move the service's dsctl_services into group_vars/GROUP.yml" if kind == "inventory"
               else "fix that line")
        raise UsageError(f"--write-back: {path} is not YAML that ruamel.yaml can rewrite ({problem}{at}); {fix}, "
                         f"{_ALTERNATIVE}") from None


def _examine(path: Path, kind: str, service: str, skipped: list[str]) -> _Source | None:
    """``path`` if it defines ``service`` and write-back can rewrite it; None if it does not define it; a
    `UsageError` (one line) when it does (or may: a file it cannot parse that names the service) but cannot be
    rewritten safely."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--write-back: {path} cannot be read ({exc.strerror}); make it readable, "
                         f"{_ALTERNATIVE}") from None
    if raw.lstrip().startswith(b"$ANSIBLE_VAULT"):
        skipped.append(f"{path}: vault-encrypted, not edited")
        return None
    if SERVICES_VAR.encode() not in raw:
        return None
    names_it = service.encode() in raw  # a file that cannot define it is no reason to refuse, whatever it holds
    if kind == "inventory" and path.suffix == ".ini":
        if not names_it:
            return None
        raise UsageError(f"--write-back: {path} is an INI inventory that defines {SERVICES_VAR}, and write-back "
                         "edits YAML only; move the service's dsctl_services into group_vars/GROUP.yml, "
                         f"{_ALTERNATIVE}")
    try:
        text, bom = _decoded(path, raw)
        document = _loaded(path, kind, text)
    except UsageError:
        if names_it:
            raise
        return None
    lists: list[tuple[Mapping[str, Any], list[Any]]] = []
    for holder in _service_vars(document, kind):
        value = holder[SERVICES_VAR]
        if isinstance(value, TaggedScalar) and "vault" in str(value.tag):
            skipped.append(f"{path}: {SERVICES_VAR} is vault-encrypted (!vault), not edited")
        elif _template(value):
            skipped.append(f"{path}: {SERVICES_VAR} is a template ({str(value).strip()[:60]}), not edited")
        elif isinstance(value, list):
            lists.append((holder, value))
            if any(_template(entry) for entry in value):
                skipped.append(f"{path}: an entry of {SERVICES_VAR} is a template, not edited")
    positions: dict[int, tuple[int, Any]] = {}  # a list two groups share (by alias) is one list
    for _, value in lists:
        for index, entry in enumerate(value):
            if isinstance(entry, Mapping) and entry.get("name") == service:
                positions.setdefault(id(entry), (index, entry))
    if not positions:
        return None
    if path.suffix == ".json":
        raise UsageError(f"--write-back: {path} defines service {service!r} in JSON, and a rewrite would be YAML; "
                         f"move the definition into a .yml file, {_ALTERNATIVE}")
    _check_structure(path, service, document, lists, [entry for _, entry in positions.values()])
    target = Path(os.path.realpath(path))
    info = target.stat()
    _check_writable(path, target, info)
    return _Source(path=path, target=target, kind=kind, text=text, bom=bom, info=info,
                   indices=tuple(index for index, _ in positions.values()))


def _check_structure(path: Path, service: str, document: Any, lists: list[tuple[Any, list[Any]]],
                     entries: list[Any]) -> None:
    """Refuse what an edit would get wrong: templated params, and nodes shared through YAML anchors."""
    reached, where = _reaches(document)
    holders = {id(holder) for holder, _ in lists}
    list_ids = {id(value) for _, value in lists}
    entry_ids = {id(entry) for entry in entries}

    def foreign(node: Any, allowed: Any) -> str | None:
        for parent, key in reached.get(id(node), []):
            if not allowed(parent, key):
                base = where.get(parent, "")
                return base + (f"[{key}]" if isinstance(key, int) else (f".{key}" if base else str(key)))
        return None

    def refuse(what: str, node: Any, other: str, fix: str) -> UsageError:
        return UsageError(f"--write-back: {path}: {what} is shared through the YAML anchor &{_anchor(node)} with "
                          f"{other}; writing the winner there would change that one too; {fix}, {_ALTERNATIVE}")

    for _, value in lists:
        other = foreign(value, lambda parent, key: parent in holders and key == SERVICES_VAR)
        if other is not None:
            raise refuse(SERVICES_VAR, value, other,
                         f"write {SERVICES_VAR} out in full there")
    for entry in entries:
        other = foreign(entry, lambda parent, _key: parent in list_ids)
        if other is not None:
            raise refuse(f"the definition of service {service!r}", entry, other,
                         f"give {service} a definition of its own")
        own = _own(entry)
        if "params" in entry and "params" not in own:
            source = next((m for m in _merged(entry) if "params" in m), None)
            merge = f"<<: *{_anchor(source)}" if _anchor(source) else "<<"
            raise UsageError(f"--write-back: {path}: service {service!r} takes its params from the merge key "
                             f"`{merge}` (defined at {where.get(id(source), '?')}), and writing the winner into them "
                             f"would change every mapping that merges them; give {service} a params mapping of its "
                             f"own, {_ALTERNATIVE}")
        params = own.get("params")
        if _template(params):
            raise UsageError(f"--write-back: {path}: the params of service {service!r} are a template "
                             f"({str(params).strip()[:60]}), which write-back would replace with the winner's keys "
                             f"alone; write the params out as a mapping, {_ALTERNATIVE}")
        if params is not None and not isinstance(params, Mapping):
            raise UsageError(f"--write-back: {path}: the params of service {service!r} are not a mapping; write "
                             f"them as name: value lines, {_ALTERNATIVE}")
        if params is not None:
            other = foreign(params, lambda parent, key: parent in entry_ids and key == "params")
            if other is not None:
                raise refuse(f"the params mapping of service {service!r}", params, other,
                             f"give {service} a params mapping of its own")


def _name(uid: int | None = None, gid: int | None = None) -> str:
    try:
        return pwd.getpwuid(uid).pw_name if uid is not None else f"group {grp.getgrgid(gid).gr_name}"
    except KeyError:
        return f"uid {uid}" if uid is not None else f"gid {gid}"


def _check_writable(path: Path, target: Path, info: os.stat_result) -> None:
    """The atomic write needs the file writable (a read-only file is the user's word), its directory writable
    (the temporary file and the rename), and the file's owner and group kept (only root can give a file away)."""
    effective = os.access in os.supports_effective_ids
    shown = f"{path} (-> {target})" if target != path.absolute() else str(path)
    me = _name(uid=os.geteuid())
    if not os.access(target, os.W_OK, effective_ids=effective):
        raise UsageError(f"--write-back: {shown} is not writable by {me} (mode {stat.S_IMODE(info.st_mode):04o}, "
                         f"owner {_name(uid=info.st_uid)}); make it writable, {_ALTERNATIVE}")
    if not os.access(target.parent, os.W_OK | os.X_OK, effective_ids=effective):
        raise UsageError(f"--write-back: the directory {target.parent} is not writable by {me}, and write-back "
                         f"replaces {target.name} through a temporary file beside it; make the directory writable, "
                         f"{_ALTERNATIVE}")
    if os.geteuid() == 0:
        return
    if info.st_uid != os.geteuid():
        owner = _name(uid=info.st_uid)
        raise UsageError(f"--write-back: {shown} belongs to {owner}, and rewriting it as {me} would make it {me}'s; "
                         f"run the tune as {owner}{' (or root)' if info.st_uid else ''}, {_ALTERNATIVE}")
    if info.st_gid not in {os.getegid(), *os.getgroups()}:
        raise UsageError(f"--write-back: {shown} belongs to {_name(gid=info.st_gid)}, which {me} is not in, so a "
                         f"rewrite would lose that group; run the tune as a member of it (or root), {_ALTERNATIVE}")


def _collect(inventory: Path, service: str, only: Path | None, hosts: frozenset[str]
             ) -> tuple[list[_Source], list[str]]:
    skipped: list[str] = []
    sources: dict[Path, _Source] = {}
    for path, kind in _sources(inventory, hosts):
        if only is not None and path.resolve() != only.resolve():
            continue
        source = _examine(path, kind, service, skipped)
        if source is not None:
            sources.setdefault(source.target, source)  # a link and its target are one file
    return list(sources.values()), skipped


def _plan(inventory: Path, service: str, only: Path | None, hosts: frozenset[str]
          ) -> tuple[list[_Source], list[str]]:
    """`_collect`, refusing when it finds no definition to edit."""
    sources, skipped = _collect(inventory, service, only, hosts)
    if not sources:
        where = f"{only}" if only is not None else f"{inventory} or its group_vars/host_vars files"
        if skipped:  # defined, perhaps, where write-back cannot edit it
            raise UsageError(f"--write-back: no definition of service {service!r} that write-back can edit in "
                             f"{where} ({'; '.join(skipped)}); keep {SERVICES_VAR} in "
                             "a plain YAML file (vault-encrypt only its secrets, as inventories/sample does), "
                             f"{_ALTERNATIVE}")
        raise UsageError(f"--write-back: service {service!r} is not defined in {SERVICES_VAR} in {where}; "
                         "check the service name or write the parameters by hand")
    return sources, skipped


def check(inventory: Path, service: str, *, only: Path | None = None, hosts: tuple[str, ...] = ()
          ) -> tuple[Path, ...]:
    """The files a write-back of ``service`` would rewrite; `UsageError` (one line: the file, the reason, the fix)
    when it could not succeed.  Run before the tune restarts anything, so that a refusal costs nothing.
    ``hosts``: the tuned hosts, whose host_vars/HOST files count whatever their name looks like."""
    return tuple(source.path for source in _plan(inventory, service, only, frozenset(hosts))[0])


def find_definitions(inventory: Path, service: str, *, hosts: tuple[str, ...] = ()
                     ) -> tuple[list[Definition], list[str]]:
    """Where ``service`` is defined (each definition in each editable file), and the files passed over; a file
    that names the service but cannot be edited safely is a `UsageError`, as for `check`."""
    sources, skipped = _collect(inventory, service, None, frozenset(hosts))
    return [Definition(source.path, index) for source in sources for index in source.indices], skipped


# --------------------------------------------------------------------------- editing


def _edit(source: _Source, service: str, params: Mapping[str, Any], fields: Mapping[str, Any]
          ) -> tuple[str | None, dict[str, Any]]:
    """The file's new text (None: nothing changes) and what changed."""
    yaml = yaml_roundtrip.editor(source.text)
    document = yaml.load(source.text)
    changed: dict[str, Any] = {}
    entries = {id(entry): entry for holder in _service_vars(document, source.kind)
               if isinstance(holder[SERVICES_VAR], list) for entry in holder[SERVICES_VAR]
               if isinstance(entry, Mapping) and entry.get("name") == service}
    for entry in entries.values():
        current = _own(entry).get("params")
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
    if not changed:
        return None, changed
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return (_BOM if source.bom else "") + buffer.getvalue(), changed


def _write(source: _Source, text: str) -> None:
    """Atomically, keeping the file's mode, owner and group; through a symlink to its target."""
    info = source.info
    write_durably(source.target, text, mode=stat.S_IMODE(info.st_mode), owner=(info.st_uid, info.st_gid))


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
               only: Path | None = None, hosts: tuple[str, ...] = ()) -> WriteBack:
    """Write ``params`` (and ``fields``: tensor/data parallel size) into every definition of ``service``.

    Raises `UsageError` (one line) for what `check` refuses (the files as they are now), and whatever a write
    raises (an OSError) once the files already written got their old text back."""
    sources, skipped = _plan(inventory, service, only, frozenset(hosts))
    edits: list[tuple[_Source, str]] = []
    changed: dict[str, Any] = {}
    for source in sources:
        text, edited = _edit(source, service, params, dict(fields or {}))
        if text is not None:
            edits.append((source, text))
            changed.update(edited)
    done: list[_Source] = []
    try:
        for source, text in edits:
            _write(source, text)
            done.append(source)
    except BaseException as failure:
        lost = []
        for source in done:
            try:
                _write(source, (_BOM if source.bom else "") + source.text)
            except OSError as exc:
                lost.append(f"{source.path} ({exc.strerror})")
        if lost:
            raise DsctlError(f"--write-back: writing {edits[len(done)][0].path} failed ({failure}), and "
                             f"{', '.join(lost)} could not be put back: it holds the winner, the other files do "
                             "not; restore it from version control or finish the write-back by hand") from failure
        raise
    return WriteBack(tuple(source.path for source, _ in edits), changed, tuple(skipped))
