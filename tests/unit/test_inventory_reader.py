"""Reading an inventory as Ansible will (dsctl.adapters.inventory.host_vars): real files, real ansible-vault."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsctl.adapters.ansible_run import run_playbook
from dsctl.adapters.inventory import VaultOptions, host_vars
from dsctl.errors import UsageError

ANSIBLE_VAULT = Path(sys.executable).parent / "ansible-vault"
PASSWORD = "correct horse battery staple"
KEY = "sk-from-the-vault-1234"
HOSTS = """\
all:
  children:
    npu_nodes:
      hosts:
        atlas-a01: {ansible_host: 192.0.2.11}
        atlas-a02: {ansible_host: 192.0.2.12}
        login-01: {ansible_host: 192.0.2.99}
"""
# One host that is this machine, for plays that must run (ansible-playbook's side of the same inventory).
LOCAL_HOST = ("all:\n  children:\n    npu_nodes:\n      hosts:\n        local-01:\n"
              f"          ansible_connection: local\n          ansible_python_interpreter: {sys.executable}\n")
SERVICES = """\
dsctl_npu_count: 8
model_root: /models
dsctl_services:
  - name: chat
    model: "{{ model_root }}/DeepSeek-R1"
    npus_per_instance: "{{ 2 * 2 }}"
    api_key: "{{ vault_chat_api_key }}"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    return write(tmp_path / "vault-password", PASSWORD + "\n")


def encrypt_string(password_file: Path, name: str, value: str) -> str:
    """``name: !vault |...`` as `ansible-vault encrypt_string` prints it."""
    result = subprocess.run([str(ANSIBLE_VAULT), "encrypt_string", "--vault-password-file", str(password_file),
                             "--name", name, value], capture_output=True, text=True, check=True, timeout=60)
    return result.stdout


def inventory(tmp_path: Path, *, vars_text: str = SERVICES, hosts: str = HOSTS) -> Path:
    site = tmp_path / "site"
    write(site / "group_vars" / "npu_nodes" / "main.yml", vars_text)
    return write(site / "hosts.yml", hosts)


def refused(*args, **kwargs) -> str:
    with pytest.raises(UsageError) as raised:
        host_vars(*args, **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- templating and vault


def test_an_inline_vault_value_is_decrypted_and_the_templates_rendered(tmp_path, password_file):
    hosts = inventory(tmp_path)
    write(hosts.parent / "group_vars" / "npu_nodes" / "vault.yml",
          encrypt_string(password_file, "vault_chat_api_key", KEY))
    found = host_vars(hosts, vault=VaultOptions(password_file=password_file))
    assert list(found) == ["atlas-a01", "atlas-a02", "login-01"]
    first = found["atlas-a01"]
    assert first["ansible_host"] == "192.0.2.11"
    assert first["dsctl_services"] == [{"name": "chat", "model": "/models/DeepSeek-R1", "npus_per_instance": 4,
                                        "api_key": KEY}]
    assert type(first["dsctl_services"][0]["npus_per_instance"]) is int  # Ansible's native rendering
    assert "model_root" not in first  # only dsctl_* settings and connection variables are read


def test_a_vault_encrypted_file_is_decrypted_with_ansible_vault_password_file(tmp_path, password_file,
                                                                              monkeypatch):
    hosts = inventory(tmp_path)
    vault_file = write(hosts.parent / "group_vars" / "npu_nodes" / "vault.yml", f"vault_chat_api_key: {KEY}\n")
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password_file), str(vault_file)],
                   check=True, capture_output=True, timeout=60)
    assert vault_file.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))  # Ansible's own setting
    found = host_vars(hosts)
    assert found["login-01"]["dsctl_services"][0]["api_key"] == KEY


def test_without_the_vault_password_the_encrypted_file_is_named(tmp_path, password_file, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    hosts = inventory(tmp_path)
    vault_file = write(hosts.parent / "group_vars" / "npu_nodes" / "vault.yml", f"vault_chat_api_key: {KEY}\n")
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password_file), str(vault_file)],
                   check=True, capture_output=True, timeout=60)
    assert refused(hosts) == (
        f"inventory: {vault_file}: encrypted with ansible-vault and no vault password was given; pass "
        "--vault-password-file FILE or --ask-vault-pass (or set ANSIBLE_VAULT_PASSWORD_FILE, Ansible's own setting)")
    wrong = write(tmp_path / "wrong", "not the password\n")
    assert refused(hosts, vault=VaultOptions(password_file=wrong)).startswith(
        f"inventory: {vault_file}: the vault password given does not decrypt it;")


def test_an_inline_vault_value_without_its_password_names_host_field_and_line(tmp_path, password_file,
                                                                              monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: 8\n" + "dsctl_services:\n  - name: chat\n"
                      + encrypt_string(password_file, "api_key", KEY).replace("api_key", "    api_key", 1))
    message = refused(hosts)
    assert message.startswith("inventory: host atlas-a01: dsctl_services[0].api_key (")
    assert "main.yml, line 4" in message and "no vault password was given" in message
    assert KEY not in message


def test_a_missing_password_file_is_refused(tmp_path):
    assert refused(inventory(tmp_path), vault=VaultOptions(password_file=tmp_path / "nope")) == (
        f"--vault-password-file: {tmp_path / 'nope'} does not exist; pass the file that holds the vault password")


def test_a_value_that_needs_facts_is_left_as_written(tmp_path):
    hosts = inventory(tmp_path, vars_text='dsctl_npu_count: 8\ndsctl_services:\n'
                                          '  - bind: "{{ ansible_default_ipv4.address }}"\n'
                                          '    port: "{{ 8000 + 1 }}"\n'
                                          '    name: "{{ ansible_facts.hostname }}-chat"\n')
    (service,) = host_vars(hosts)["atlas-a01"]["dsctl_services"]
    assert service == {"bind": "{{ ansible_default_ipv4.address }}", "port": 8001,
                       "name": "{{ ansible_facts.hostname }}-chat"}


def test_an_undefined_variable_names_host_and_field(tmp_path):
    hosts = inventory(tmp_path)  # vault_chat_api_key is never defined
    assert refused(hosts) == (
        "inventory: host atlas-a01: dsctl_services[0].api_key: 'vault_chat_api_key' is undefined; define it in "
        "group_vars or host_vars (a vault-encrypted one in a file the inventory loads)")


def test_an_undefined_variable_in_another_tools_key_is_not_dsctls_business(tmp_path):
    hosts = inventory(tmp_path, vars_text='dsctl_npu_count: 8\nmonitoring_token: "{{ undefined_elsewhere }}"\n')
    assert host_vars(hosts)["atlas-a02"] == {"dsctl_npu_count": 8, "ansible_host": "192.0.2.12"}


# --------------------------------------------------------------------------- parse errors


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    hosts = inventory(tmp_path, hosts=HOSTS.replace("{ansible_host: 192.0.2.12}", "{ansible_host: 192.0.2.12"))
    assert refused(hosts) == f"inventory: {hosts}, line 7, column 17: did not find expected ',' or '}}' " \
                             "(while parsing a flow mapping)"


def test_a_syntax_error_in_group_vars_names_that_file(tmp_path):
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: [8\n")
    message = refused(hosts)
    assert message.startswith(f"inventory: {hosts.parent / 'group_vars' / 'npu_nodes' / 'main.yml'}, line 2")
    assert "did not find expected ',' or ']'" in message


def test_a_duplicate_key_names_file_and_key(tmp_path):
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: 8\ndsctl_package_source: /srv\ndsctl_npu_count: 4\n")
    assert refused(hosts) == (
        f"inventory: {hosts.parent / 'group_vars' / 'npu_nodes' / 'main.yml'}, line 3, column 1: Found duplicate "
        "mapping key 'dsctl_npu_count'; keep one of the two keys")


def test_a_duplicate_host_in_the_inventory_file_is_refused_too(tmp_path):
    hosts = inventory(tmp_path, hosts=HOSTS + "        atlas-a01: {ansible_host: 192.0.2.13}\n")
    assert refused(hosts) == f"inventory: {hosts}, line 8, column 9: Found duplicate mapping key 'atlas-a01'; " \
                             "keep one of the two keys"


def test_ansible_playbook_refuses_the_duplicate_key_as_well(tmp_path):
    """dsctl's ansible.cfg makes ansible-playbook agree with the reader: a duplicate key is an error."""
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: 8\ndsctl_npu_count: 4\n",
                      hosts=LOCAL_HOST)
    playbook = write(tmp_path / "show.yml", "- hosts: npu_nodes\n  gather_facts: false\n  tasks:\n"
                                            "    - ansible.builtin.debug: {var: dsctl_npu_count}\n")
    run = run_playbook(str(playbook), hosts, artifacts_dir=tmp_path / "run", timeout=120)
    assert run.rc != 0
    assert "duplicate mapping key 'dsctl_npu_count'" in run.log.read_text()


def test_not_an_inventory_shape(tmp_path):
    hosts = inventory(tmp_path, hosts="all:\n  children:\n    npu_nodes:\n      hosts:\n        - atlas-a01\n")
    assert refused(hosts) == (
        f"inventory: {hosts}: not a YAML inventory Ansible can read: Invalid \"hosts\" entry for \"npu_nodes\" "
        "group, requires a dictionary, found \"list\" instead; see inventories/sample/hosts.yml")


def test_a_missing_inventory_and_an_empty_group(tmp_path):
    assert refused(tmp_path / "nothing.yml").startswith(f"inventory: {tmp_path / 'nothing.yml'} does not exist")
    hosts = inventory(tmp_path, hosts="all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1:\n")
    assert refused(hosts) == (f"inventory: {hosts} has no hosts in group npu_nodes; list your NPU servers under "
                              "all.children.npu_nodes.hosts (see inventories/sample/hosts.yml)")


# --------------------------------------------------------------------------- --limit


def test_limit_takes_ansible_patterns(tmp_path):
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: 8\n")
    assert list(host_vars(hosts, limit="atlas-*")) == ["atlas-a01", "atlas-a02"]
    assert list(host_vars(hosts, limit="npu_nodes:!atlas-a02")) == ["atlas-a01", "login-01"]
    assert list(host_vars(hosts, limit="~login-\\d+")) == ["login-01"]


def test_a_limit_that_matches_no_host_is_a_usage_error(tmp_path):
    hosts = inventory(tmp_path, vars_text="dsctl_npu_count: 8\n")
    assert refused(hosts, limit="h*") == (
        "--limit 'h*' matches no host of npu_nodes (hosts: atlas-a01, atlas-a02, login-01); give host names, "
        "groups or patterns such as 'atlas-a0*'")


# --------------------------------------------------------------------------- --ask-vault-pass

ASK_SCRIPT = """
import json, os, sys
from pathlib import Path
from dsctl.adapters.ansible_run import run_playbook
from dsctl.adapters.inventory import VaultOptions, host_vars
inventory, playbook, artifacts = map(Path, sys.argv[1:4])
vault = VaultOptions(ask=True)
first = host_vars(inventory, vault=vault)
again = host_vars(inventory, vault=vault)          # no second prompt: the password is kept in memory
run = run_playbook(str(playbook), inventory, artifacts_dir=artifacts, vault=vault, timeout=120)
print("RESULT " + json.dumps({"key": first["local-01"]["dsctl_services"][0]["api_key"], "same": first == again,
                              "rc": run.rc, "left": sorted(p.name for p in artifacts.iterdir())}))
"""


def _talk(command: list[str], answer: str, timeout: float = 120.0) -> tuple[str, int]:
    """Run ``command`` on a pseudo-terminal (getpass reads the controlling terminal); type ``answer`` at each
    password prompt.  Returns the transcript and the exit status."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execv(command[0], command)
    transcript, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            transcript += chunk
            if transcript.rstrip().endswith(b"Vault password:"):
                os.write(fd, answer.encode() + b"\n")
                transcript += b"<typed>\n"
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return transcript.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def test_ask_vault_pass_prompts_once_and_hands_the_password_to_ansible_playbook(tmp_path, password_file,
                                                                                 monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    hosts = inventory(tmp_path, vars_text=SERVICES,
                      hosts=LOCAL_HOST)
    write(hosts.parent / "group_vars" / "npu_nodes" / "vault.yml",
          encrypt_string(password_file, "vault_chat_api_key", KEY))
    playbook = write(tmp_path / "check.yml", "- hosts: npu_nodes\n  gather_facts: false\n  tasks:\n"
                                             "    - ansible.builtin.assert:\n"
                                             f"        that: vault_chat_api_key == '{KEY}'\n")
    script = write(tmp_path / "ask.py", ASK_SCRIPT)
    artifacts = tmp_path / "run"
    transcript, status = _talk([sys.executable, str(script), str(hosts), str(playbook), str(artifacts)], PASSWORD)
    assert status == 0, transcript
    assert transcript.count("Vault password:") == 1, transcript
    result = __import__("json").loads(transcript.split("RESULT ", 1)[1].splitlines()[0])
    assert result["key"] == KEY and result["same"] is True
    assert result["rc"] == 0, (artifacts / "ansible.log").read_text()
    assert "vault-password" not in result["left"]  # the run's password file is removed after the run
    assert PASSWORD not in (artifacts / "run.json").read_text()


@pytest.fixture
def children(monkeypatch) -> list[object]:
    """The limit of every read that started Ansible in a child."""
    from dsctl.adapters import inventory as reader

    started: list[object] = []
    real = reader._read_in_child

    def counted(inventory, request):
        started.append(request["limit"])
        return real(inventory, request)

    monkeypatch.setattr(reader, "_read_in_child", counted)
    return started


def test_every_read_is_one_ansible_child_and_a_limit_is_ansibles_to_resolve(tmp_path: Path, children: list[object]):
    # Nothing is kept between reads (a command reads its fleet once and hands it on: dsctl.services.fleet.Fleet.only);
    # a host named like a group: which of the two the pattern means is Ansible's to say
    path = write(tmp_path / "hosts.yml", HOSTS + "    login-01:\n      hosts:\n        atlas-a02: {}\n")
    assert list(host_vars(path)) == ["atlas-a01", "atlas-a02", "login-01"]
    assert list(host_vars(path, limit="atlas-a02,atlas-a01")) == ["atlas-a01", "atlas-a02"]  # inventory order
    assert list(host_vars(path, limit="atlas-a01")) == ["atlas-a01"]
    assert "login-01" in host_vars(path, limit="login-01")
    assert list(host_vars(path, limit="atlas-a0*")) == ["atlas-a01", "atlas-a02"]
    assert children == [None, "atlas-a02,atlas-a01", "atlas-a01", "login-01", "atlas-a0*"]
    with pytest.raises(UsageError, match="matches no host"):
        host_vars(path, limit="atlas-a09")
    path.write_text(HOSTS.replace("192.0.2.11", "192.0.2.21"))
    assert host_vars(path)["atlas-a01"]["ansible_host"] == "192.0.2.21"
    assert children[-1] is None and len(children) == 7


def test_a_limited_read_still_gives_the_other_groups_whole(tmp_path: Path):
    # The NPU network plan is the whole fleet's and a gateway fronts hosts outside --limit: a limit (names or a
    # pattern) narrows the hosts read, never the groups asked for beside them.
    from dsctl.adapters.inventory import read_groups

    path = write(tmp_path / "hosts.yml", HOSTS)
    every = list(host_vars(path))
    assert len(every) > 2
    for limit in ("atlas-a02", "*a02"):
        hosts, groups = read_groups(path, limit=limit, also=("npu_nodes",))
        assert list(hosts) == ["atlas-a02"], limit
        assert list(groups["npu_nodes"]) == every, limit
