"""A stand-in ansible-playbook for the CLI tests: it records its argv and appends scripted dsctl_events lines.

Everything else stays real: dsctl's runner (adapters.ansible_run, the real AnsiblePlaybookRunner), its event
tail, ansible-inventory reading the inventory, the schema and the planner.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.adapters import ansible_run

FAKE_ANSIBLE = """\
#!{python}
import json, os, sys, time
spec = json.load(open(os.environ["FAKE_SPEC"]))
open(os.environ["FAKE_ARGV"], "w").write(json.dumps(sys.argv))
open(os.environ["FAKE_ARGV"] + ".pid", "w").write(str(os.getpid()))
if "--vault-password-file" in sys.argv:  # what the password file held while the playbook ran
    vault = sys.argv[sys.argv.index("--vault-password-file") + 1]
    open(os.environ["FAKE_ARGV"] + ".vault", "w").write(open(vault).read())
    open(os.environ["FAKE_ARGV"] + ".vault-mode", "w").write(oct(os.stat(vault).st_mode & 0o777))
open(os.environ["FAKE_ARGV"] + ".env", "w").write(json.dumps(dict(os.environ)))
print(spec.get("log", "PLAY [fake]"), flush=True)
with open(os.environ["DSCTL_EVENTS_FILE"], "a") as events:
    for event in spec["events"]:
        line = json.dumps(event) + "\\n"
        events.write(line[:10]); events.flush(); time.sleep(0.01)  # a half-written line must wait
        events.write(line[10:]); events.flush()
time.sleep(spec.get("sleep", 0))
sys.exit(spec["rc"])
"""


@pytest.fixture
def fake_ansible(tmp_path, monkeypatch):
    binary = tmp_path / "bin" / "ansible-playbook"
    binary.parent.mkdir()
    binary.write_text(FAKE_ANSIBLE.format(python=sys.executable))
    binary.chmod(0o755)
    monkeypatch.setattr(ansible_run, "ansible_playbook_bin", lambda: binary)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("FAKE_ARGV", str(tmp_path / "argv.json"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")

    def configure(rc, events, **extra):
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"rc": rc, "events": events, **extra}))
        monkeypatch.setenv("FAKE_SPEC", str(spec))
        return inventory

    configure.argv = lambda: json.loads((tmp_path / "argv.json").read_text())
    configure.vault_seen = lambda: (tmp_path / "argv.json.vault").read_text()
    configure.vault_mode_seen = lambda: int((tmp_path / "argv.json.vault-mode").read_text(), 8)
    configure.env_seen = lambda: json.loads((tmp_path / "argv.json.env").read_text())
    return configure


REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def run_local_playbook(playbook: Path) -> subprocess.CompletedProcess:
    """Real ansible-playbook on ``playbook`` over the local connection, with dsctl's ansible.cfg and plugins."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
           "PYTHONPATH": str(REPO / "cli")}
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def sentinel():
    """A loopback port that counts connections: the battery's hosts point at it (tests/cli/battery.py)."""
    from .battery import Sentinel

    listener = Sentinel()
    yield listener
    listener.close()


@pytest.fixture
def provisionable(tmp_path) -> Path:
    """The sample inventory with its dsctl_package_source a directory on this controller (the sample's
    /srv/ascend-packages is an example path): provision refuses a missing one before any play (issue 41)."""
    root = tmp_path / "sample"
    shutil.copytree(REPO / "inventories" / "sample", root)
    packages = tmp_path / "packages"
    packages.mkdir()
    (packages / "SHA256SUMS").write_text("")
    (root / "group_vars" / "npu_nodes" / "zz-packages.yml").write_text(f"dsctl_package_source: {packages}\n")
    return root / "hosts.yml"
