"""Output paths checked before a run starts: a probe, a sweep or a tune that can only fail at its end to write
its file (``--record``, ``--csv``, ``--run-dir``, ``--out``, tune's run directory) fails at once instead, one
line naming the option and the fix. Nothing is created here: the check asks the kernel (``os.access``, which also
sees a read-only file system) about the path or its nearest existing parent.
"""

from __future__ import annotations

import os
from pathlib import Path

from dsctl.errors import UsageError


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _refuse(option: str, path: Path, why: str, fix: str) -> UsageError:
    return UsageError(f"{option} {path}: {why}; {fix}")


def check_file(option: str, path: Path) -> None:
    """``path`` is a file this run may create or overwrite, in a directory that exists."""
    path = path.expanduser()
    if path.is_dir():
        raise _refuse(option, path, "is a directory", "give a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise _refuse(option, path, "is not writable", "choose another file or fix its permissions")
        return
    parent = path.absolute().parent
    if not parent.is_dir():
        raise _refuse(option, path, f"directory {parent} does not exist", "create it or choose another path")
    _check_parent(option, path)


def check_dir(option: str, path: Path) -> None:
    """``path`` is a directory this run may create and write files into."""
    path = path.expanduser()
    if path.exists():
        if not path.is_dir():
            raise _refuse(option, path, "is not a directory", "give a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _refuse(option, path, "is not writable", "choose another directory or fix its permissions")
        return
    _check_parent(option, path)


def _check_parent(option: str, path: Path) -> None:
    parent = _nearest_existing(path.absolute().parent)
    if not parent.is_dir():
        raise _refuse(option, path, f"{parent} is not a directory", "choose a path under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _refuse(option, path, f"cannot create it: {parent} is not writable",
                      "choose a writable location or fix its permissions")
