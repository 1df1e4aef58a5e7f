"""Run one command on many hosts over SSH (paramiko), host keys checked against a known_hosts file."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko


@dataclass(frozen=True)
class SshTarget:
    name: str
    address: str
    user: str
    key_file: Path
    known_hosts: Path
    port: int = 22


@dataclass(frozen=True)
class SshResult:
    name: str
    exit_code: int | None  # None: the host could not be reached
    stdout: str = ""
    stderr: str = ""
    error: str = ""

    @property
    def reached(self) -> bool:
        return self.exit_code is not None


def run(target: SshTarget, command: str, timeout: float = 10.0) -> SshResult:
    client = paramiko.SSHClient()
    client.load_host_keys(str(target.known_hosts))
    # An unknown or changed host key is refused, never added.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            target.address, port=target.port, username=target.user, key_filename=str(target.key_file),
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, look_for_keys=False,
            allow_agent=False,
        )
        _stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
        out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
        return SshResult(target.name, stdout.channel.recv_exit_status(), out, err)
    except (OSError, paramiko.SSHException) as exc:
        return SshResult(target.name, None, error=f"{type(exc).__name__}: {exc}".strip())
    finally:
        client.close()


def run_many(targets: list[SshTarget], command: str, timeout: float = 10.0, workers: int = 8) -> list[SshResult]:
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(targets)))) as pool:
        return list(pool.map(lambda target: run(target, command, timeout), targets))
