"""The one rule for a path a role writes, deletes or chmods as root (pure).

A path setting that reaches ``file: state=absent``, ``mode: 0700`` or ``copy: dest=`` as root must name a place of
dsctl's own: ``dsctl_serving_venv: /usr`` would have the serving_stack role remove /usr, ``dsctl_staging_dir: /``
would chmod / 0700, ``dsctl_env_file: /etc/shadow`` would overwrite the password file.  The character set is
checked before this (dsctl.core.serving.service.safe_path); this rule adds what a character set cannot say:

- normalised: absolute, no ``.`` or ``..`` part, no ``//``, no trailing ``/`` (``/opt/x/`` + ``-stacks`` is a
  directory inside /opt/x, and a stat of ``/opt/x/`` follows a link the role means to replace);
- not ``/`` and not a system directory itself (SYSTEM_DIRS): below one is fine, /usr/local/Ascend is CANN's home;
- a file dsctl writes is not one the system owns (SYSTEM_FILES), and an env file stays in /etc/profile.d under
  a dsctl name or in a directory of dsctl's own (a path part named dsctl or dsctl-*).

Each refusal is a `RootPathRefused` (a ValueError, so pydantic reports it on the field) whose text, after the
field name, is the whole one-line error: what the value is, what dsctl would do to it, and the fix.
"""

from __future__ import annotations

import posixpath

# Directories a distribution owns: dsctl may create below them, never replace, chmod or delete one of them.
SYSTEM_DIRS = frozenset({
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/lost+found", "/media",
    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/etc/default", "/etc/init.d", "/etc/pam.d", "/etc/profile.d", "/etc/security", "/etc/ssh", "/etc/ssl",
    "/etc/sudoers.d", "/etc/systemd", "/etc/systemd/system", "/etc/cron.d", "/etc/apt", "/etc/yum.repos.d",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/include", "/usr/share",
    "/usr/src", "/usr/local", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib", "/usr/local/share",
    "/usr/local/etc", "/usr/local/include", "/usr/local/src",
    "/var/cache", "/var/lib", "/var/log", "/var/run", "/var/spool", "/var/tmp", "/var/mail", "/var/opt",
    "/var/local", "/var/lock", "/var/backups", "/var/www",
})

# Files the system owns that a file setting must never name (dsctl would overwrite them).
SYSTEM_FILES = frozenset({
    "/etc/shadow", "/etc/gshadow", "/etc/passwd", "/etc/group", "/etc/sudoers", "/etc/hosts", "/etc/hostname",
    "/etc/fstab", "/etc/resolv.conf", "/etc/profile", "/etc/bashrc", "/etc/bash.bashrc", "/etc/environment",
    "/etc/crontab", "/etc/login.defs", "/etc/os-release", "/etc/machine-id", "/etc/ld.so.conf",
    "/etc/ld.so.preload", "/etc/nsswitch.conf", "/etc/security/limits.conf", "/etc/ssh/sshd_config",
    "/etc/ascend_install.info",
})

PROFILE_D = "/etc/profile.d"


class RootPathRefused(ValueError):
    """A path a role would damage as root; str() is the error after the field name (one line)."""


def _owned_by_dsctl(directory: str) -> bool:
    return any(part == "dsctl" or part.startswith("dsctl-") for part in directory.split("/"))


def _normal(value: str, action: str, example: str) -> None:
    if not value.startswith("/"):
        raise RootPathRefused(f"{value!r} is not an absolute path; dsctl would {action}. Fix: an absolute path "
                              f"such as {example}")
    if value == "/":
        raise RootPathRefused(f"'/' is the root directory; dsctl would {action}. Fix: a path of its own such "
                              f"as {example}")
    if value.endswith("/") or "//" in value or any(part in (".", "..") for part in value.split("/")):
        normal = posixpath.normpath(value)
        normal = "/" + normal.lstrip("/")  # normpath keeps a leading '//'
        raise RootPathRefused(f"{value!r} is not a normalised path (a trailing '/', '//', '.' or '..'); dsctl "
                              f"would {action}. Fix: write it as {normal}")


def check_dir(value: str, *, action: str, example: str) -> str:
    """``value`` if it is a directory dsctl may own as root, else `RootPathRefused`.

    ``action`` says what the role does there ("replace it"), ``example`` is a good value (the setting's default).
    """
    _normal(value, action, example)
    _refuse_system(value, action, f"a directory of its own such as {example}")
    return value


def _refuse_system(value: str, action: str, fix: str) -> None:
    if value in SYSTEM_FILES:
        raise RootPathRefused(f"{value!r} is a file the system owns; dsctl would {action}. Fix: {fix}")
    if value in SYSTEM_DIRS:
        raise RootPathRefused(f"{value!r} is a system directory; dsctl would {action}. Fix: {fix}")


def check_env_file(value: str, *, action: str, example: str) -> str:
    """``value`` if it is an env file dsctl may write as root: in /etc/profile.d under a dsctl name, or in a
    directory of dsctl's own; else `RootPathRefused`."""
    _normal(value, action, example)
    _refuse_system(value, action, f"a file of its own such as {example}")
    directory, name = posixpath.split(value)
    if directory == PROFILE_D and name.startswith("dsctl") and name.endswith(".sh"):
        return value
    if directory != PROFILE_D and _owned_by_dsctl(directory):
        return value
    raise RootPathRefused(f"{value!r} is not in a directory of dsctl's own; dsctl would {action}. Fix: "
                          f"{PROFILE_D}/dsctl-<name>.sh or a path under a dsctl directory, such as {example}")


def root_dir(action: str, example: str):
    """A pydantic AfterValidator function: `check_dir` with this action and example."""
    return lambda value: check_dir(value, action=action, example=example)


def root_env_file(action: str, example: str):
    """A pydantic AfterValidator function: `check_env_file` with this action and example."""
    return lambda value: check_env_file(value, action=action, example=example)
