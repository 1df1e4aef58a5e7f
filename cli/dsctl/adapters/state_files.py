"""A run's state file on the controller: written so a crash leaves the old state or the new one, and locked so
two dsctl processes never drive the same fleet's run at once (`dsctl upgrade`'s state.json)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dsctl.errors import DsctlError, ExitStatus


class StateLocked(DsctlError):
    """Another live dsctl holds the lock: exit ERROR (1), nothing was done; wait for it or stop it."""

    exit_status = ExitStatus.ERROR


def write_durably(path: Path, text: str, mode: int | None = None, owner: tuple[int, int] | None = None) -> None:
    """``text`` to ``path``: a temporary file beside it, fsync, rename over it, fsync the directory (the rename
    itself survives a power cut: without it a rebooted controller may find no state, and start the upgrade over).
    ``mode``: the file's permission bits (mkstemp's 0600 otherwise); ``owner``: its (uid, gid), which the new
    file would otherwise lose to the writer's (setting another uid takes root; a PermissionError leaves ``path``
    as it was)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            if owner is not None:
                made = os.fstat(out.fileno())
                uid, gid = owner
                if (made.st_uid, made.st_gid) != (uid, gid):  # before the mode: chown clears set-id bits
                    os.fchown(out.fileno(), uid if uid != made.st_uid else -1, gid if gid != made.st_gid else -1)
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextlib.contextmanager
def exclusive(lock: Path, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``lock`` (created, holding this pid) while the block runs; another holder
    makes it `StateLocked` naming that holder's pid.  The kernel drops the lock when the process dies, so a
    crashed run never leaves a stale lock behind (the pid left in the file is only read while it is locked)."""
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise StateLocked(f"{what} is already running (pid {holder}, lock {lock}); wait for it to finish or "
                              "stop it, then run this again") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(descriptor, 0)
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
