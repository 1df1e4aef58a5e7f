"""The one rule for a path a role writes, deletes or chmods as root, and which of them may not nest (pure).

A path setting that reaches ``file: state=absent``, ``mode: 0700`` or ``copy: dest=`` as root must name a place of
dsctl's own: ``dsctl_serving_venv: /usr`` would have the serving_stack role remove /usr, ``dsctl_staging_dir: /``
would chmod / 0700, ``dsctl_env_file: /etc/shadow`` would overwrite the password file.  The character set is
checked before this (dsctl.core.serving.service.safe_path); this rule adds what a character set cannot say, by
where the path leads, not by its name:

- normalised: absolute, no ``.`` or ``..`` part, no ``//``, no trailing ``/`` (``/opt/x/`` + ``-stacks`` is a
  directory inside /opt/x, and a stat of ``/opt/x/`` follows a link the role means to replace);
- not ``/`` and not inside a tree the kernel, the distribution or a user owns (SYSTEM_TREES: /proc, /sys, /dev,
  /boot, /run, /etc, /usr, /var, /home, /root, ...), whatever the name below it: ``/proc/self/root/usr`` is /usr,
  ``/dev/shm`` is shared memory, ``/home/alice`` is a person's.  Inside those trees only dsctl's own subtrees are
  allowed (DSCTL_PARENTS: ``/etc/dsctl``, ``/var/lib/dsctl-gateway``, ...; PRODUCT_ROOTS: CANN's
  /usr/local/Ascend);
- /opt, /srv, /mnt, /media and /tmp are shared (SHARED_ROOTS): never the directory itself, a directory below it is
  the site's to give dsctl (/opt/dsctl/serving-venv, /srv/models);
- a file dsctl writes is not one the system owns (SYSTEM_FILES), and stays in a directory of dsctl's own (a path
  part named dsctl or dsctl-*) or, under a dsctl name, in the one system directory meant for it (/etc/profile.d
  for the env file, /run for a pid file).

The pure rule sees the path as written.  A symlink on the host (``/opt/x`` -> ``/usr``) is seen by the roles,
which resolve each path on the host and hand the real path to the same rule (`host_path_problem`, through the
filter ``dsctl_root_path_problems``; roles/ascend_preflight/tasks/root_paths.yml) before anything destructive.

`path_clashes` is the other half: settings that are each fine but nest in or equal one another (the staging
directory made 0700 while it is the serving venv, the log directory inside the config directory); CLASHES is the
table, each row with why.

Each refusal is a `RootPathRefused` (a ValueError, so pydantic reports it on the field) whose text, after the
field name, is the whole one-line error: what the value is, what dsctl would do to it, and the fix.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dsctl.errors import DsctlError, ExitStatus

# Directories a distribution owns, named as such in an error: dsctl never replaces, chmods or deletes one of them.
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

# Trees refused with everything under them (the Filesystem Hierarchy Standard's roles of each,
# https://refspecs.linuxfoundation.org/FHS_3.0/fhs/index.html), with why, for the error.
SYSTEM_TREES = {
    "/proc": "the kernel's process files (/proc/<pid>/root leads back to /)",
    "/sys": "the kernel's device and driver files",
    "/dev": "device files and shared memory",
    "/boot": "the kernel and the boot loader",
    "/run": "the running system's state",
    "/etc": "the system's configuration",
    "/usr": "the distribution's programs and libraries",
    "/bin": "the distribution's programs", "/sbin": "the distribution's programs",
    "/lib": "the distribution's libraries", "/lib32": "the distribution's libraries",
    "/lib64": "the distribution's libraries", "/libx32": "the distribution's libraries",
    "/var": "the system's variable data (package databases, spools, other services' state)",
    "/snap": "snapd's packages", "/lost+found": "fsck's recovered files",
    "/home": "users' home directories", "/root": "root's home directory",
}

# Shared directories: never the directory itself; one below it is the site's to give dsctl (FHS: /opt/<package>,
# /srv/<site data>, /mnt and /media for mounts).  /tmp and /var/tmp likewise: a planted symlink there is not
# followed by root (fs.protected_symlinks, https://docs.kernel.org/admin-guide/sysctl/fs.html#protected-symlinks),
# and the roles resolve every path on the host before using it.
SHARED_ROOTS = frozenset({"/opt", "/srv", "/mnt", "/media", "/tmp", "/var/tmp"})

# Inside a system tree, dsctl's own subtrees: a child of these named dsctl or dsctl-* (the defaults /etc/dsctl/...,
# /var/cache/dsctl/packages, /var/log/dsctl, /var/lib/dsctl-gateway, /run/dsctl-gateway.pid).
DSCTL_PARENTS = ("/etc", "/run", "/var/lib", "/var/cache", "/var/log")

# Inside a system tree, the products' own roots: CANN's documented install root, the default dsctl_install_path
# (the driver always installs there: Ascend/ascend-deployer README.en.rst; docs/reference ascend-interfaces.md).
ASCEND_ROOT = "/usr/local/Ascend"
PRODUCT_ROOTS = (ASCEND_ROOT,)

# Files the system owns that a file setting must never name (dsctl would overwrite them).
SYSTEM_FILES = frozenset({
    "/etc/shadow", "/etc/gshadow", "/etc/passwd", "/etc/group", "/etc/sudoers", "/etc/hosts", "/etc/hostname",
    "/etc/fstab", "/etc/resolv.conf", "/etc/profile", "/etc/bashrc", "/etc/bash.bashrc", "/etc/environment",
    "/etc/crontab", "/etc/login.defs", "/etc/os-release", "/etc/machine-id", "/etc/ld.so.conf",
    "/etc/ld.so.preload", "/etc/nsswitch.conf", "/etc/security/limits.conf", "/etc/ssh/sshd_config",
    "/etc/ascend_install.info",
})

PROFILE_D = "/etc/profile.d"
RUN = "/run"


class RootPathRefused(ValueError):
    """A path a role would damage as root; str() is the error after the field name (one line)."""


def is_within(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or below it (both normalised absolute paths)."""
    return directory == "/" or path == directory or path.startswith(directory + "/")


def _dsctl_name(name: str) -> bool:
    return name == "dsctl" or name.startswith("dsctl-")


def _owned_by_dsctl(directory: str) -> bool:
    return any(_dsctl_name(part) for part in directory.split("/"))


def _allowed_inside(value: str) -> bool:
    """``value`` lies in one of dsctl's own subtrees of a system tree."""
    if any(is_within(value, root) for root in PRODUCT_ROOTS):
        return True
    if any(value.startswith(root + "/") for root in SHARED_ROOTS):
        return True
    for parent in DSCTL_PARENTS:
        if value.startswith(parent + "/") and _dsctl_name(value[len(parent) + 1:].split("/")[0]):
            return True
    return False


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


def _refuse_system(value: str, action: str, fix: str, subject: str = "") -> None:
    """`RootPathRefused` if ``value`` is a system file or directory or lies in a system tree; ``subject`` is what
    the error says before "is ..." (default: the value itself)."""
    subject = subject or repr(value)
    if value in SYSTEM_FILES:
        raise RootPathRefused(f"{subject} is a file the system owns; dsctl would {action}. Fix: {fix}")
    if value in SYSTEM_DIRS or value in SYSTEM_TREES or value in SHARED_ROOTS:
        raise RootPathRefused(f"{subject} is a system directory; dsctl would {action}. Fix: {fix}")
    if _allowed_inside(value):
        return
    tree = next((tree for tree in SYSTEM_TREES if is_within(value, tree)), None)
    if tree is not None:
        raise RootPathRefused(f"{subject} is inside {tree} ({SYSTEM_TREES[tree]}); dsctl would {action}. "
                              f"Fix: {fix}")


def check_dir(value: str, *, action: str, example: str) -> str:
    """``value`` if it is a directory dsctl may own as root, else `RootPathRefused`.

    ``action`` says what the role does there ("replace it"), ``example`` is a good value (the setting's default).
    """
    _normal(value, action, example)
    _refuse_system(value, action, f"a directory of its own such as {example}")
    return value


def check_file(value: str, *, action: str, example: str, drop_in: str, suffix: str = "",
               dsctl_named: bool = True) -> str:
    """``value`` if it is a file dsctl may write as root, else `RootPathRefused`: in the system directory
    ``drop_in`` under a dsctl name ending in ``suffix``, or in a directory the directory rule allows (`check_dir`)
    that, when ``dsctl_named``, has a part named dsctl or dsctl-*."""
    _normal(value, action, example)
    fix = f"a file of its own such as {example}"
    if value in SYSTEM_FILES or value in SYSTEM_DIRS or value in SYSTEM_TREES or value in SHARED_ROOTS:
        _refuse_system(value, action, fix)
    directory, name = posixpath.split(value)
    if directory == drop_in and name.startswith("dsctl") and name.endswith(suffix):
        return value
    if directory == drop_in or (dsctl_named and not _owned_by_dsctl(directory)):
        raise RootPathRefused(f"{value!r} is not in a directory of dsctl's own; dsctl would {action}. Fix: "
                              f"{drop_in}/dsctl-<name>{suffix} or a path under a dsctl directory, such as {example}")
    if directory == "/":
        raise RootPathRefused(f"{value!r} is in the root directory; dsctl would {action}. Fix: {fix}")
    _refuse_system(directory, action, fix, subject=f"{value!r} is in {directory!r}, which")
    return value


def check_env_file(value: str, *, action: str, example: str) -> str:
    """An env file dsctl may write as root: /etc/profile.d/dsctl*.sh (profile.d only sources *.sh) or in a
    directory of dsctl's own; else `RootPathRefused`."""
    return check_file(value, action=action, example=example, drop_in=PROFILE_D, suffix=".sh")


def root_dir(action: str, example: str):
    """A pydantic AfterValidator function: `check_dir` with this action and example."""
    return lambda value: check_dir(value, action=action, example=example)


def root_env_file(action: str, example: str):
    """A pydantic AfterValidator function: `check_env_file` with this action and example."""
    return lambda value: check_env_file(value, action=action, example=example)


def root_run_file(action: str, example: str):
    """A pydantic AfterValidator function for a file a daemon writes as root (a pid file): /run/dsctl*, or in a
    directory the directory rule allows."""
    return lambda value: check_file(value, action=action, example=example, drop_in=RUN, dsctl_named=False)


_HOST_CHECKS = {
    "dir": lambda path, action: check_dir(path, action=action, example="/opt/dsctl/<name>"),
    "env_file": lambda path, action: check_env_file(path, action=action, example="/etc/profile.d/dsctl-ascend.sh"),
    "run_file": lambda path, action: check_file(path, action=action, example="/run/dsctl-gateway.pid", drop_in=RUN,
                                                dsctl_named=False),
}
_ON_THE_HOST = "change it as root (nothing was changed)"


def host_path_problem(field: str, given: str, resolved: str, *, kind: str = "dir") -> str:
    """The refusal of a path a role is about to change as root, "" if it passes: ``given`` as the role has it and
    ``resolved`` as the host resolved it (realpath: every symlink followed, /proc/<pid>/root included), each by
    the same rule as the inventory schema, so /opt/x -> /usr is judged where it leads.  ``kind``: dir, env_file
    (`check_env_file`) or run_file (a pid file).  One line that starts with ``field``."""
    check = _HOST_CHECKS[kind]
    try:
        check(given, _ON_THE_HOST)
    except RootPathRefused as refused:
        return f"{field}: {refused}"
    if resolved != given:
        try:
            check(resolved, _ON_THE_HOST)
        except RootPathRefused as refused:
            return f"{field}: {given} resolves on the host to {resolved}, and {refused}"
    return ""


# --------------------------------------------------------------------------- which paths may not nest


class PathClash(DsctlError):
    """Two path settings that nest in or equal one another (a combination: exit 3); one line naming both."""

    exit_status = ExitStatus.VALIDATION_FAILED


SAME, INSIDE, CONTAINS = "is the same directory as", "is inside", "contains"


class Clash(NamedTuple):
    """``field`` may not stand in any of the ``forbidden`` relations to ``other`` (SAME, INSIDE, CONTAINS)."""

    field: str
    other: str
    forbidden: frozenset[str]
    why: str


def _clash(field: str, other: str, *forbidden: str, why: str) -> Clash:
    return Clash(field, other, frozenset(forbidden), why)


DRIVER_ROOT = "the driver's root"  # always /usr/local/Ascend, whatever dsctl_install_path says

# The pairs a role would damage: one removes or replaces a directory (serving_stack: the venv becomes a link, each
# stack's venv kept in <venv>-stacks beside it), chmods it (ascend_package: staging 0700 root-only;
# inference_service: logs 0755) or archives what is in it (inference_service moves instance directories out of the
# config dir) while the other lives there.  A relation not listed is harmless (the staging directory inside the
# install path: nothing there removes or locks it).
CLASHES: tuple[Clash, ...] = (
    _clash("dsctl_staging_dir", "dsctl_install_path", SAME, CONTAINS,
           why="the staging directory is made root's alone (0700): CANN there is unreadable to the services"),
    _clash("dsctl_staging_dir", DRIVER_ROOT, SAME, CONTAINS,
           why="the staging directory is made root's alone (0700): the driver there is unreadable to the services"),
    _clash("dsctl_staging_dir", "dsctl_serving_venv", SAME, INSIDE, CONTAINS,
           why="the staging directory is made root's alone (0700) and the serving venv is replaced by a link: one "
               "locks or removes the other"),
    _clash("dsctl_staging_dir", "dsctl_service_config_dir", SAME, CONTAINS,
           why="the staging directory is made root's alone (0700): the services could not read their launch files"),
    _clash("dsctl_staging_dir", "dsctl_service_log_dir", SAME, CONTAINS,
           why="the staging directory is made root's alone (0700) and the log directory 0755: each run undoes the "
               "other"),
    _clash("dsctl_serving_venv", "dsctl_install_path", SAME, CONTAINS,
           why="the serving venv is replaced by a link: CANN there would be removed with it"),
    _clash("dsctl_serving_venv", DRIVER_ROOT, SAME, CONTAINS,
           why="the serving venv is replaced by a link: the driver there would be removed with it"),
    _clash("dsctl_service_config_dir", "dsctl_serving_venv", SAME, INSIDE,
           why="the serving venv is replaced by a link: the instances' directories there would go with it"),
    _clash("dsctl_service_log_dir", "dsctl_serving_venv", SAME, INSIDE,
           why="the serving venv is replaced by a link: the logs there would go with it"),
    _clash("dsctl_service_log_dir", "dsctl_service_config_dir", SAME, INSIDE,
           why="the config directory holds the instances' directories, which dsctl re-renders, snapshots and "
               "archives: keep the logs apart from them"),
    _clash("dsctl_env_file", "dsctl_serving_venv", SAME, INSIDE,
           why="the serving venv is replaced by a link: the env file there would go with it"),
    _clash("dsctl_env_file", "dsctl_staging_dir", SAME, INSIDE,
           why="the staging directory is made root's alone (0700): no service or login shell could read the env "
               "file"),
    _clash("dsctl_env_file", "dsctl_service_config_dir", SAME, INSIDE,
           why="the config directory's instance directories are re-rendered and archived"),
)

_STACKS_SUFFIX = "-stacks"  # serving_stack keeps each stack's venv in <dsctl_serving_venv>-stacks


def _areas(field: str, path: str) -> tuple[tuple[str, str], ...]:
    """(label, path) of each directory ``field`` owns: the serving venv owns its stacks directory too."""
    if field == "dsctl_serving_venv":
        return (field, path), (f"{field}'s stacks", path + _STACKS_SUFFIX)
    return ((field, path),)


def _relation(path: str, other: str) -> str | None:
    if path == other:
        return SAME
    if is_within(path, other):
        return INSIDE
    if is_within(other, path):
        return CONTAINS
    return None


def path_clashes(paths: Mapping[str, str], table: Sequence[Clash] = CLASHES) -> list[str]:
    """Each pair of ``paths`` (field -> normalised absolute path) that ``table`` forbids, as one line naming
    both fields, why, and the fix; [] when none.  The driver's root (/usr/local/Ascend) is always there."""
    paths = {DRIVER_ROOT: ASCEND_ROOT, **paths}
    problems = []
    for clash in table:
        if clash.field not in paths or clash.other not in paths:
            continue
        found = next(((label, path, other_label, other, relation)
                      for label, path in _areas(clash.field, paths[clash.field])
                      for other_label, other in _areas(clash.other, paths[clash.other])
                      if (relation := _relation(path, other)) in clash.forbidden), None)
        if found is None:
            continue
        label, path, other_label, other, relation = found
        problems.append(f"{label}: {path!r} {relation} {other_label} ({other}): {clash.why}; fix: give "
                        f"{clash.field} a path apart from {clash.other}")
    return problems


def check_clashes(paths: Mapping[str, str]) -> None:
    """`PathClash` with the first of `path_clashes`."""
    problems = path_clashes(paths)
    if problems:
        raise PathClash(problems[0])
