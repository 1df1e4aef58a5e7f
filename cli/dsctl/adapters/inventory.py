"""Read an Ansible inventory the way ansible-playbook will: parsed, vault-decrypted and templated by Ansible.

`host_vars` returns, for every host of the fleet group, the ``dsctl_*`` settings and the connection
variables (``ansible_host``, ``ansible_port``, ``ansible_user``) as the play will see them: group_vars and
host_vars merged, vault-encrypted files and inline ``!vault`` values decrypted, and Jinja such as
``api_key: "{{ vault_chat_api_key }}"`` rendered.  Other variables are left out: dsctl does not read them, and
Ansible renders a variable only when a task uses it, so an undefined variable in another tool's key must not
stop dsctl either.

The reading is done by Ansible's own Python API (DataLoader with the vault secrets, InventoryManager with
``subset`` for ``--limit``, VariableManager, Templar) in a child process (``python -m
dsctl.adapters.inventory``): Ansible keeps its vault secrets, configuration and plugin caches in
process-wide state that can be initialised once, and dsctl (the tuner) reads inventories many times per
process.  The child gets dsctl's ansible.cfg (``ANSIBLE_CONFIG``), the one ansible-playbook gets, so both read
the inventory alike (duplicate YAML keys are an error, a file no plugin can parse is an error).  The vault
password reaches the child on stdin, never in its argv or environment.

A value that cannot be rendered before the play gathers facts (``"{{ ansible_default_ipv4.address }}"``) is
returned as written; any other undefined variable is an error naming the host and the field.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.assets import asset_root
from dsctl.core.fleet import host_names, setting_names, yaml_bounds, yaml_numbers
from dsctl.errors import DsctlError, UsageError

NPU_GROUP = "npu_nodes"
# Read from the inventory besides the dsctl_* settings: how the CLI reaches a host (deploy's endpoints).
CONNECTION_VARS = ("ansible_host", "ansible_port", "ansible_user")
SETTINGS_PREFIX = "dsctl_"
READ_TIMEOUT_SECONDS = 120
_HOSTS_NAMED = 10
_VAULT_HINT = ("pass --vault-password-file FILE or --ask-vault-pass (or set ANSIBLE_VAULT_PASSWORD_FILE, "
               "Ansible's own setting)")


@dataclass(frozen=True)
class VaultOptions:
    """How Ansible gets the vault password: a password file (``--vault-password-file``), a prompt
    (``--ask-vault-pass``) or neither (Ansible then honours ``ANSIBLE_VAULT_PASSWORD_FILE`` itself).

    With ``ask``, the password is asked once (`prompted_password`) and kept in memory for the rest of the
    command: the inventory reader and ansible-playbook both get it."""

    password_file: Path | None = None
    ask: bool = False
    _entered: list[str] = field(default_factory=list, repr=False, compare=False)

    def prompted_password(self) -> str | None:
        """The password typed at the prompt (asked on first use), or None without ``ask``."""
        if not self.ask:
            return None
        if not self._entered:
            terminal = _has_terminal()
            try:
                if terminal:
                    password = getpass.getpass("Vault password: ")
                else:
                    # No terminal to prompt on: getpass would print a GetPassWarning and "Password input may be
                    # echoed" before reading a line of stdin. The line is read all the same, without that noise
                    # (a password piped in, as Ansible's own prompt takes one).
                    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                        warnings.simplefilter("ignore", getpass.GetPassWarning)
                        password = getpass.getpass("Vault password: ")
            except EOFError:
                password = ""
            if not password:
                raise UsageError("--ask-vault-pass: no password entered; type the vault password at the prompt "
                                 "or use --vault-password-file FILE")
            self._entered.append(password)
        return self._entered[0]


def _has_terminal() -> bool:
    """Whether getpass can prompt on the controlling terminal (it opens /dev/tty, as here)."""
    try:
        descriptor = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(descriptor)
    return True


MAX_YAML_FILE_BYTES = 16 * 1024 * 1024  # one inventory, group_vars or host_vars file
_YAML_SUFFIXES = ("", ".yml", ".yaml", ".json")  # what Ansible reads as variable files


def _inventory_files(inventory: Path) -> list[Path]:
    """One walk of ``inventory``: the files Ansible reads YAML from (the file, or every file under the directory,
    and the group_vars/ and host_vars/ next to it)."""
    inventory = inventory.expanduser()
    directory = inventory.is_dir()
    roots = [inventory] if directory else [inventory, inventory.parent / "group_vars", inventory.parent / "host_vars"]
    everything: list[Path] = []
    for root in roots:
        if root.is_file():
            everything.append(root)
        elif root.is_dir():
            everything += sorted(p for p in root.rglob("*") if p.is_file())
    return [p for p in dict.fromkeys(everything) if p in roots or (not p.name.startswith(".")
                                                                   and p.suffix.lower() in _YAML_SUFFIXES)]


def check_yaml_bounds(inventory: Path, yaml_files: Sequence[Path] | None = None) -> None:
    """Refuse (one line) an inventory whose YAML is too large or expands too far through aliases
    (`dsctl.core.fleet.yaml_bounds`), or writes a dsctl setting's number as YAML 1.1 misreads it (010 is 8:
    `dsctl.core.fleet.yaml_numbers`), before Ansible (the reader's child or ansible-playbook) parses it.
    ``yaml_files``: `_inventory_files`' list, when the caller has walked the inventory already."""
    for path in _inventory_files(inventory) if yaml_files is None else yaml_files:
        try:
            if path.stat().st_size > MAX_YAML_FILE_BYTES:
                raise UsageError(f"inventory: {path}: more than {MAX_YAML_FILE_BYTES >> 20} MiB; an inventory "
                                 "file that large is refused, split it or remove what the fleet does not need")
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # unreadable: Ansible reports it in its own words
        try:
            yaml_bounds.check(text, f"inventory: {path}")
        except yaml_bounds.TooLarge as exc:
            raise UsageError(str(exc)) from None
        # Bounded first: composing the document is then cheap.  010 is 8 once Ansible has loaded it.
        misread = yaml_numbers.misread_number(text, SETTINGS_PREFIX)
        if misread is not None:
            raise UsageError(f"inventory: {path}: {misread}")


HostsVars = dict[str, dict[str, Any]]  # host -> its dsctl_* settings and connection variables


def host_vars(inventory: Path, group: str = NPU_GROUP, vault: VaultOptions | None = None,
              limit: str | None = None) -> dict[str, dict[str, Any]]:
    """`read_groups` without other groups: the hosts of ``group``."""
    return read_groups(inventory, group, vault=vault, limit=limit)[0]


def read_groups(inventory: Path, group: str = NPU_GROUP, *, also: Sequence[str] = (),
                vault: VaultOptions | None = None, limit: str | None = None) -> tuple[HostsVars, dict[str, HostsVars]]:
    """Host -> its dsctl_* settings and connection variables, rendered, for every host of ``group`` that
    ``limit`` (an Ansible pattern, as ``--limit`` takes it) selects, in inventory order.

    Raises `UsageError` (one line) for a missing inventory, a YAML syntax error or duplicate key (file, line,
    column), a vault value without its password, an undefined variable (host and field), an empty group, or a
    limit that selects no host of the group.
    """
    if not inventory.is_file() and not inventory.is_dir():
        # /dev/null or a FIFO exists: "does not exist" would send the user looking for the wrong mistake.
        if inventory.exists():
            raise UsageError(f"inventory: {inventory} is not a file or directory of an inventory; pass an "
                             "inventory YAML file or its directory")
        raise UsageError(f"inventory: {inventory} does not exist; pass the path `dsctl lab up` printed or your own")
    check_yaml_bounds(inventory, _inventory_files(inventory))
    vault = vault or VaultOptions()
    if vault.password_file is not None and not Path(vault.password_file).expanduser().is_file():
        raise UsageError(f"--vault-password-file: {vault.password_file} does not exist; pass the file that holds "
                         "the vault password")
    request = {
        "inventory": str(Path(inventory).expanduser().absolute()),
        "group": group,
        "limit": limit,
        # Read in the same child (one Ansible start): every host of these groups, --limit or not, none is fine.
        "also": list(also),
        "password_file": str(Path(vault.password_file).expanduser().absolute()) if vault.password_file else None,
        "password": vault.prompted_password(),
        # dsctl's setting names: the child refuses a variable that is one of them mistyped (the schema is imported
        # here, not in the child, which stays light).
        "settings": _setting_names(),
    }
    hosts, groups, _ = _read_in_child(inventory, request)
    return _named_safely(hosts, groups)


def _named_safely(hosts: HostsVars, groups: dict[str, HostsVars]) -> tuple[HostsVars, dict[str, HostsVars]]:
    """The read, once every host name in it is one dsctl accepts (`dsctl.core.fleet.host_names`): before anything
    is rendered, written under a host's name or contacted."""
    problem = host_names.first_bad_host_name([*hosts, *(host for members in groups.values() for host in members)])
    if problem is not None:
        raise UsageError(f"inventory: {problem}")
    return hosts, groups


def _setting_names() -> list[str]:
    from dsctl.core.inventory.schema import HostSettings

    return HostSettings.setting_names()


def _read_in_child(inventory: Path, request: Mapping[str, Any]) -> tuple[HostsVars, dict[str, HostsVars], list[str]]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(asset_root() / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PYTHONUNBUFFERED": "1"}
    try:
        result = subprocess.run([sys.executable, "-m", "dsctl.adapters.inventory"], input=json.dumps(request),
                                capture_output=True, text=True, env=env, timeout=READ_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise DsctlError(f"inventory: reading {inventory} took more than {READ_TIMEOUT_SECONDS} s "
                         "(a dynamic inventory or a vault password script that hangs?)") from None
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        detail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        raise DsctlError(f"inventory: Ansible could not read {inventory}: {detail}") from None
    if "error" in answer:
        raise UsageError(answer["error"])
    return answer["hosts"], answer.get("groups", {}), answer.get("group_names", [])


# --------------------------------------------------------------------------- the child process
# Everything below runs in `python -m dsctl.adapters.inventory` and imports Ansible.


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during, outermost first (bounded: Ansible nests few)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < 20:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _origin(exc: BaseException) -> str | None:
    """``file, line L, column C`` of an Ansible error, when Ansible knows where it came from."""
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # a later ansible-core moved it: the message still says what is wrong
        return None
    for link in _chain(exc):
        obj = getattr(link, "obj", None)
        origin = obj if isinstance(obj, Origin) else Origin.get_tag(obj)
        if origin is not None and isinstance(origin.path, str):
            line, column = origin.line_num, origin.col_num
            return origin.path + (f", line {line}" if line else "") + (f", column {column}" if line and column else "")
    return None


_TAGGED_TYPE = re.compile(r"<class '[\w.]*?_AnsibleTagged(\w+)'>")


def _message(exc: BaseException) -> str:
    """Ansible's one-line message; for YAML syntax errors the parser's own words (problem and context)."""
    cause = next((link for link in _chain(exc) if getattr(link, "problem", None)), None)
    problem = getattr(cause, "problem", None)
    if problem:
        context = getattr(cause, "context", None)
        text = f"{problem} ({context})" if context else str(problem)
    else:
        text = str(getattr(exc, "message", None) or exc).removeprefix("YAML parsing failed: ")
    text = _TAGGED_TYPE.sub(lambda match: match.group(1).lower(), text)
    return " ".join(text.split()).rstrip(".")


class _Refused(Exception):
    """One line for the user; the child prints it as {"error": ...}."""


def _is_vault_error(exc: BaseException) -> bool:
    from ansible.parsing.vault import AnsibleVaultError

    return any(isinstance(link, AnsibleVaultError) for link in _chain(exc)) or \
        "undecryptable" in str(exc) or "vault secrets" in str(exc)


def _vault_files(source: str) -> list[str]:
    """The ansible-vault encrypted files under the inventory's group_vars and host_vars."""
    root = source if os.path.isdir(source) else os.path.dirname(source)
    found = []
    for top in ("group_vars", "host_vars"):
        for directory, _, names in sorted(os.walk(os.path.join(root, top))):
            for name in sorted(names):
                path = os.path.join(directory, name)
                try:
                    with open(path, "rb") as stream:
                        if stream.read(14) == b"$ANSIBLE_VAULT":
                            found.append(path)
                except OSError:
                    continue
    return found


def _vault_refusal(where: str, have_password: bool) -> _Refused:
    if have_password:
        return _Refused(f"inventory: {where}: the vault password given does not decrypt it; pass the password "
                        "it was encrypted with (--vault-password-file FILE or --ask-vault-pass)")
    return _Refused(f"inventory: {where}: encrypted with ansible-vault and no vault password was given; "
                    f"{_VAULT_HINT}")


def _located(exc: BaseException, fallback: str, *, source: str, have_password: bool) -> _Refused:
    if _is_vault_error(exc):
        where = _origin(exc) or ", ".join(_vault_files(source)) or fallback
        return _vault_refusal(where, have_password)
    where = _origin(exc) or fallback
    message = _message(exc)
    if "duplicate" in message.lower():
        return _Refused(f"inventory: {where}: {message}; keep one of the two keys")
    return _Refused(f"inventory: {where}: {message}")


def _candidate_files(source: str) -> list[str]:
    """The files Ansible tries as inventory sources under ``source`` (itself, or a directory's entries)."""
    from ansible.inventory.manager import IGNORED

    if not os.path.isdir(source):
        return [source]
    found = []
    for name in sorted(os.listdir(source)):
        if IGNORED.search(name.encode()):
            continue
        found += _candidate_files(os.path.join(source, name))
    return found


def _parse_problem(loader: Any, source: str, error: BaseException, have_password: bool) -> _Refused:
    """Why Ansible could not parse the inventory: the YAML error (file, line, column) or the plugin's word."""
    from ansible.errors import AnsibleError
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    candidates = _candidate_files(source)
    if not candidates:  # a directory with no file Ansible reads as an inventory (only group_vars, a README): no hosts
        raise _no_hosts(source, NPU_GROUP, "the directory has no inventory file, only files Ansible skips; ")
    for path in candidates:
        try:
            loader.load_from_file(path, cache="none")
        except AnsibleError as invalid:
            return _located(invalid, path, source=source, have_password=have_password)
        if path.endswith((".yml", ".yaml", ".json")):
            plugin = inventory_loader.get("yaml")
            try:
                plugin.parse(InventoryData(), loader, path, cache=False)
            except AnsibleError as invalid:
                return _Refused(f"inventory: {path}: not a YAML inventory Ansible can read: {_message(invalid)}; "
                                "see inventories/sample/hosts.yml")
    return _Refused(f"inventory: {source}: {_message(error)}")


def _no_hosts(source: str, group: str, why: str = "") -> _Refused:
    where = "in a hosts.yml in it " if os.path.isdir(source) else ""
    return _Refused(f"inventory: {source} has no hosts in group {group}; {why}list your NPU servers {where}under "
                    f"all.children.{group}.hosts (see inventories/sample/hosts.yml)")


_FACT_NAME = re.compile(r"^ansible_\w+$")
_ERROR_NAME = re.compile(r"'(ansible_\w+)'")


def _needs_facts(text: str, variables: Mapping[str, Any], error: BaseException) -> bool:
    """Whether a template failed only because it uses facts, which exist once the play gathers them.

    Facts are ``ansible_facts`` and the ``ansible_<fact>`` variables Ansible injects
    (INJECT_FACTS_AS_VARS), directly or through ``hostvars[...]``."""
    import jinja2
    import jinja2.meta

    try:
        names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(text))
    except jinja2.TemplateSyntaxError:
        return False
    if "ansible_facts" in names or any(_FACT_NAME.match(n) and n not in variables for n in names):
        return True
    return any(name not in variables for name in _ERROR_NAME.findall(str(error)))


def _is_template(value: Any) -> bool:
    return any(mark in value for mark in ("{{", "{%", "{#"))


def _render(templar: Any, value: Any, variables: Mapping[str, Any], host: str, path: str, *,
            have_password: bool) -> Any:
    """``value`` with every string rendered by Ansible's Templar, leaf by leaf (so one value that needs facts
    stays as written without keeping the others from being rendered); plain Python types out."""
    from ansible.errors import AnsibleError, AnsibleUndefinedVariable
    from ansible.parsing.vault import EncryptedString

    if isinstance(value, Mapping):
        return {str(key): _render(templar, item, variables, host, f"{path}.{key}", have_password=have_password)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_render(templar, item, variables, host, f"{path}[{index}]", have_password=have_password)
                for index, item in enumerate(value)]
    encrypted = isinstance(value, EncryptedString)
    if not encrypted and not (isinstance(value, str) and _is_template(value)):
        return _plain(value)
    try:
        return _plain(templar.template(value))
    except AnsibleError as failed:
        if _is_vault_error(failed):
            where = _origin(failed)
            raise _vault_refusal(f"host {host}: {path}" + (f" ({where})" if where else ""), have_password) \
                from None
        if not isinstance(failed, AnsibleUndefinedVariable):
            raise _Refused(f"inventory: host {host}: {path}: cannot be rendered: {_message(failed)}") from None
        if not encrypted and _needs_facts(str(value), variables, failed):
            return str(value)
        raise _Refused(f"inventory: host {host}: {path}: {_message(failed)}; define it in group_vars or host_vars "
                       "(a vault-encrypted one in a file the inventory loads)") from None


def _plain(value: Any) -> Any:
    """Ansible's tagged containers and strings as plain JSON-ready values."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, bool):
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return str(value)


def _vault_secrets(loader: Any, request: Mapping[str, Any]) -> bool:
    """Ansible's own vault setup (password files, vault ids, ANSIBLE_VAULT_PASSWORD_FILE) plus the password
    typed at dsctl's prompt; also the context inline ``!vault`` values decrypt through."""
    from ansible import constants
    from ansible.cli import CLI
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecret, VaultSecretsContext

    files = [request["password_file"]] if request.get("password_file") else []
    try:
        secrets = CLI.setup_vault_secrets(loader, vault_ids=list(constants.DEFAULT_VAULT_IDENTITY_LIST),
                                          vault_password_files=files, ask_vault_pass=False, auto_prompt=False,
                                          initialize_context=False)
    except AnsibleError as failed:
        origin = "--vault-password-file" if files else "ANSIBLE_VAULT_PASSWORD_FILE"
        raise _Refused(f"{origin}: {_message(failed)}; pass a readable file that holds the vault password") \
            from None
    if request.get("password") is not None:
        secrets.append((constants.DEFAULT_VAULT_IDENTITY, VaultSecret(str(request["password"]).encode())))
    loader.set_vault_secrets(secrets)
    VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    return bool(secrets)


def _hosts_label(names: list[str]) -> str:
    shown = ", ".join(names[:_HOSTS_NAMED])
    return shown + (f", ... ({len(names)} hosts)" if len(names) > _HOSTS_NAMED else "")


def read(request: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The child's work: `host_vars` for one request (see there)."""
    return read_all(request)[0]


def read_all(request: Mapping[str, Any]) -> tuple[HostsVars, dict[str, HostsVars], list[str]]:
    """The child's work: `read_groups` for one request (see there)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    source, group, limit = request["inventory"], request["group"], request.get("limit")
    loader = DataLoader()
    have_password = _vault_secrets(loader, request)
    try:
        inventory = InventoryManager(loader=loader, sources=[source])
    except AnsibleError as failed:
        raise _parse_problem(loader, source, failed, have_password) from None
    if group not in inventory.groups or not inventory.get_hosts(group):
        raise _no_hosts(source, group)
    every = [host.name for host in inventory.get_hosts(group)]
    if limit:
        try:
            inventory.subset(limit)
            chosen = inventory.get_hosts(group)
        except AnsibleError as failed:
            raise _Refused(f"--limit {limit!r}: {_message(failed)}") from None
        if not chosen:
            raise _Refused(f"--limit {limit!r} matches no host of {group} (hosts: {_hosts_label(every)}); "
                           "give host names, groups or patterns such as 'atlas-a0*'")
    else:
        chosen = inventory.get_hosts(group)
    manager = VariableManager(loader=loader, inventory=inventory)
    settings = list(request.get("settings") or ())

    def values_of(members: Any) -> dict[str, dict[str, Any]]:
        hosts: dict[str, dict[str, Any]] = {}
        for host in members:
            try:
                variables = manager.get_vars(host=host, include_hostvars=True)
            except AnsibleError as failed:  # group_vars/host_vars: YAML syntax, duplicate key, vault file
                raise _located(failed, f"variables of host {host.name}", source=source,
                               have_password=have_password) from None
            for key in variables:  # a mistyped dsctl_ prefix would be ignored in silence: the default used instead
                meant = setting_names.misspelt_setting(str(key), settings) if settings else None
                if meant is not None:
                    raise _Refused(f"inventory: host {host.name}: {setting_names.misspelt_message(str(key), meant)}")
            templar = Templar(loader=loader, variables=variables)
            keys = [key for key in variables if str(key).startswith(SETTINGS_PREFIX) or key in CONNECTION_VARS]
            hosts[host.name] = {str(key): _render(templar, variables[key], variables, host.name, str(key),
                                                  have_password=have_password) for key in keys}
        return hosts

    chosen_hosts = values_of(chosen)
    also = request.get("also") or []
    if also:
        # The other groups whole: a gateway fronts hosts outside --limit too, and the NPU network plan is the whole
        # fleet's.  subset(None) undoes --limit (remove_restriction() alone leaves Ansible's subset in place).
        inventory.subset(None)
        inventory.remove_restriction()
    others = {name: values_of(inventory.get_hosts(name)) if name in inventory.groups else {} for name in also}
    return chosen_hosts, others, sorted(inventory.groups)


def _child() -> int:
    request = json.loads(sys.stdin.read())
    answer_stream, sys.stdout = sys.stdout, sys.stderr  # whatever Ansible displays stays out of the answer
    try:
        hosts, groups, group_names = read_all(request)
        answer: dict[str, Any] = {"hosts": hosts, "groups": groups, "group_names": group_names}
    except _Refused as refused:
        answer = {"error": str(refused)}
    answer_stream.write(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
