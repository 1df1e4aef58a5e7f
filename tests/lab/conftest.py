"""Lab fixtures: real lab hosts (namespaces, sshd) brought up through the real CLI."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from dsctl.adapters import ssh
from dsctl.core.lab.plan import LabSpec
from dsctl.lab.hosts import LabPaths, load_spec
from dsctl.lab.packages import load_releases


def _worker_index() -> int:
    """pytest-xdist's worker number (gw0 -> 0), 0 when the suite runs in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


# Each pytest worker has a lab of its own (`dsctl lab up --name`): its own bridge, subnet, namespaces and state
# directory, so lab modules run side by side and none touches the default lab a developer may have up.
WORKER = _worker_index()
LAB_NAME = f"t{chr(ord('a') + WORKER)}"
LAB_ROOT = Path(f"/run/dsctl/test-{LAB_NAME}")
LAB_SUBNET = f"10.78.{100 + WORKER}.0/24"


def address(host: str) -> str:
    """The lab address of `lab-NN` in this worker's lab (dsctl.core.lab.plan: hosts from .11)."""
    return f"10.78.{100 + WORKER}.{10 + int(host.removeprefix('lab-'))}"


def lab_capable() -> bool:
    return platform.system() == "Linux" and os.geteuid() == 0


requires_lab = pytest.mark.skipif(not lab_capable(), reason="the lab needs Linux and root")


COMMAND_TIMEOUT = 300.0


def _newest_ansible_log_tail(lines: int = 40) -> str:
    runs = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "dsctl" / "runs"
    logs = sorted(runs.glob("*/ansible.log"), key=lambda log: log.stat().st_mtime)
    if not logs:
        return "(no ansible.log)"
    return f"{logs[-1]}:\n" + "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])


def dsctl(*args: str, check: bool = True, root: Path = LAB_ROOT,
          timeout: float = COMMAND_TIMEOUT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed CLI exactly as a user would (``env``: variables laid over this process's).

    A run that outlives ``timeout`` is interrupted as a user would (SIGINT: dsctl stops its playbook, so
    nothing keeps changing lab hosts under the next test) and fails with where it was stuck.
    """
    env = {**os.environ, "DSCTL_LAB_ROOT": str(root), "DSCTL_LAB_NAME": LAB_NAME, "COLUMNS": "200", **(env or {})}
    argv = [sys.executable, "-m", "dsctl", *args]
    with subprocess.Popen(argv, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                stdout, stderr = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            stuck_at = "\n".join(stderr.splitlines()[-15:])
            raise AssertionError(f"dsctl {' '.join(args)} did not finish in {timeout:g} s; it was at:\n{stuck_at}\n"
                                 f"{_newest_ansible_log_tail()}") from None
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"dsctl {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@dataclass
class Lab:
    paths: LabPaths
    spec: LabSpec
    inventory: Path

    def target(self, name: str) -> ssh.SshTarget:
        host = next(h for h in self.spec.members if h.name == name)
        return ssh.SshTarget(name, host.address, "root", self.paths.client_key, self.paths.known_hosts)

    def sh(self, name: str, command: str, timeout: float = 30.0) -> ssh.SshResult:
        return ssh.run(self.target(name), command, timeout=timeout)

    def sh_ok(self, name: str, command: str) -> str:
        result = self.sh(name, command)
        assert result.exit_code == 0, f"{name}: {command!r} -> {result}"
        return result.stdout

    def upload(self, name: str, package: str) -> str:
        """Copy a package from the lab's package source to /root on the host over SFTP, as a role would."""
        target = self.target(name)
        client = paramiko.SSHClient()
        client.load_host_keys(str(target.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(target.address, username="root", key_filename=str(target.key_file), look_for_keys=False,
                       allow_agent=False)
        try:
            with client.open_sftp() as sftp:
                sftp.put(str(self.paths.packages / package), f"/root/{package}")
        finally:
            client.close()
        return f"/root/{package}"

    def status(self) -> dict:
        return json.loads(dsctl("lab", "status", "--json", check=False).stdout)


def default_hdk_and_cann() -> tuple[str, ...]:
    """`lab up` flags that preinstall the default stack's HDK and CANN (releases.yaml default_stack): a lab whose
    tests are about deploying, not installing, then provisions only the serving venv. Fresh installs are tested
    in test_provision_bare.py."""
    default = load_releases()["default_stack"]
    return ("--driver", default["driver"], "--firmware", default["firmware"], "--cann", default["cann"])


def bring_up(*args: str) -> Lab:
    result = dsctl("lab", "up", *args, *(() if "--subnet" in args else ("--subnet", LAB_SUBNET)))
    inventory = Path(result.stdout.strip().splitlines()[-1])
    paths = LabPaths(LAB_ROOT, LAB_NAME)
    spec = load_spec(paths)
    assert spec is not None
    return Lab(paths, spec, inventory)


def provisioned_lab(hosts: int, tmp_path_factory, directory: str):
    """A lab of ``hosts`` at the default stack, provisioned once (the serving venv on top of the preinstalled HDK and
    CANN); yields (lab, a scratch directory) and takes the lab down at the end."""
    lab = bring_up("--hosts", str(hosts), *default_hdk_and_cann())
    try:
        result = dsctl("provision", str(lab.inventory), check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield lab, tmp_path_factory.mktemp(directory)
    finally:
        dsctl("lab", "down")


def lab_leftovers(root: Path = LAB_ROOT, name: str = LAB_NAME) -> dict[str, list[str]]:
    """Everything this worker's lab could leave behind on this machine (other labs may run beside it)."""
    netns = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
             .stdout.splitlines() if line.startswith(f"dsctl-{name}-")]
    links = [line for line in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
             .stdout.splitlines() if f"dsctl-{name}0" in line or re.search(rf": d{name}\d+[@:]", line)]
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(str(root))]
    processes = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "dsctl.lab.hostinit" in cmdline and str(root) in cmdline:
                processes.append(f"{proc.name}: {cmdline}")
    return {"netns": netns, "links": links, "mounts": mounts, "processes": processes,
            "state": [str(root)] if root.exists() else []}


@pytest.fixture(scope="module")
def bare_lab():
    if not lab_capable():
        pytest.skip("the lab needs Linux and root")
    lab = bring_up("--hosts", "3")
    yield lab
    dsctl("lab", "down")


@pytest.fixture(scope="module")
def installed_lab():
    if not lab_capable():
        pytest.skip("the lab needs Linux and root")
    lab = bring_up("--hosts", "3", "--driver", "24.1.rc3", "--firmware", "7.5.0.1.129")
    yield lab
    dsctl("lab", "down")
