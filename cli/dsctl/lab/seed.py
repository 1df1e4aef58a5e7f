"""The files a lab host's own disk starts with: the host's identity on top of the controller's OS.

Written into the host's upper layers before its first boot, so the host sees
them at their usual paths and nobody else does.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from dsctl.lab import keys

REBOOT_COMMAND = "/usr/local/sbin/dsctl-lab-reboot"
# What a new home starts with on the controller's distribution (root's home is the host's own, see hostinit).
SKELETON = Path("/etc/skel")

# sshd as a hardened real host runs it: keys only, root by key, one host key of its own.
SSHD_CONFIG = """\
# sshd of lab host {hostname} (written by dsctl lab)
Port 22
ListenAddress {address}
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
PidFile /run/sshd.pid
# Ansible opens several sessions per host at once.
MaxStartups 100:30:200
MaxSessions 50
ClientAliveInterval 0
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
"""

# The lab's reboot: ask the host's PID 1 to reboot, after this command has
# returned, as `shutdown -r +0` does, so the SSH session that ran it ends cleanly.
REBOOT_SCRIPT = """\
#!/bin/sh
# Reboot this lab host (dsctl lab). A real site sets its own reboot command.
# The helper must outlive this SSH session. Ansible may run the command on a pseudo-terminal (ssh -tt), whose
# hangup when the session ends could reach the helper before setsid detached it: about one host in sixteen
# never rebooted in 32-host runs. Ignoring SIGHUP from the start (inherited by the helper) closed that.
# The reboot kills the helper too; if a signal were ever lost the helper is still alive and asks again.
trap '' HUP
setsid -f sh -c 'sleep 1; while kill -USR1 1; do sleep 5; done' </dev/null >/dev/null 2>&1
echo "Rebooting $(hostname)."
"""


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def seed_host_disk(upper: Path, *, hostname: str, address: str, authorized_key: str) -> str:
    """Populate a host's upper layers; return its host public key line."""
    etc = upper / "etc"
    _write(etc / "hostname", hostname + "\n")
    _write(etc / "hosts", f"127.0.0.1\tlocalhost\n{address}\t{hostname}\n")
    _write(etc / "machine-id", uuid.uuid4().hex + "\n", 0o444)
    _write(etc / "ssh" / "sshd_config", SSHD_CONFIG.format(hostname=hostname, address=address))
    host_key = keys.write_ed25519_keypair(etc / "ssh" / "ssh_host_ed25519_key", f"root@{hostname}")
    if SKELETON.is_dir():
        shutil.copytree(SKELETON, upper / "root", symlinks=True, dirs_exist_ok=True)
    root_ssh = upper / "root" / ".ssh"
    _write(root_ssh / "authorized_keys", authorized_key + "\n", 0o600)
    root_ssh.chmod(0o700)
    (upper / "root").chmod(0o700)
    _write(upper / REBOOT_COMMAND.lstrip("/"), REBOOT_SCRIPT, 0o755)
    return host_key
