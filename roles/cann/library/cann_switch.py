#!/usr/bin/python
"""Switch the active CANN to a version already installed side by side, without running an installer.

What the vendor's installers do when they activate a version, redone for an installed one
(shared/reference/ascend-interfaces.md sections 4.4 and 6.5):

* ``<root>/ascend-toolkit/latest/`` is a farm of relative links into ``../<version>/`` plus real files
  (``version.cfg``, ``platform.ini``, ``remove_latest_softlink.sh``) and real directories (``<arch>-linux/``
  of links into ``../../<version>/<arch>-linux/``, ``python/``, ``tools/``, ``var/``).  A new farm is built
  next to it from the current one, every link that points into the active version retargeted into the
  wanted one (links the wanted version has no target for are dropped, its ``<arch>-linux`` entries and its
  ``opp_kernel`` are linked), ``version.cfg`` replaced by the content the controller computed (running and
  upgrade versions moved to the wanted one, installed versions kept), then swapped in with one
  ``renameat2(RENAME_EXCHANGE)``: ``latest/`` is at every moment either the old farm or the new one.
* ``<root>/ascend-toolkit/set_env.sh`` becomes the wanted version's own ``<version>/set_env.sh`` (what its
  installer wrote there), replaced atomically.
* ``<root>/nnal/atb/latest`` is a link to ``<version>``; it is replaced atomically.

"Switching back is a matter of repointing latest/ and version.cfg" (section 6.5).  Older versions stay.
A crash leaves at most a ``.latest.dsctl-*`` directory next to ``latest/``; the next run cleans it up, or puts
the old farm back if a non-atomic fallback was cut between its two renames.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: cann_switch
short_description: Point latest/ of the CANN toolkit and NNAL at versions installed side by side
description:
  - Rebuilds the toolkit's latest/ link farm for an installed version and swaps it in atomically.
  - Repoints nnal/atb/latest. Runs no installer; supports check mode.
options:
  install_path:
    description: CANN root (holds ascend-toolkit/ and nnal/).
    type: path
    required: true
  toolkit_version:
    description: Installed toolkit version directory to activate; omit to leave the toolkit alone.
    type: str
  version_cfg:
    description: Content of latest/version.cfg after the switch (computed on the controller).
    type: str
  nnal_version:
    description: Installed NNAL version directory to activate; omit to leave NNAL alone.
    type: str
author: dsctl
"""

RETURN = r"""
previous:
  description: The toolkit and NNAL versions that were active before.
  returned: always
  type: dict
"""

import ctypes  # noqa: E402
import errno  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
from collections import Counter  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

NEW_FARM = ".latest.dsctl-new"
OLD_FARM = ".latest.dsctl-old"
RENAME_EXCHANGE = 2  # linux/fs.h


class SwitchError(Exception):
    pass


def exchange(left, right):
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE, Linux >= 3.15); False when unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(left), at_fdcwd, os.fsencode(right), RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), left)


def recover(home):
    """Undo what an interrupted earlier switch left next to latest/."""
    latest, new, old = (os.path.join(home, name) for name in ("latest", NEW_FARM, OLD_FARM))
    if os.path.isdir(old) and not os.path.lexists(latest):
        os.rename(old, latest)  # cut between the fallback's two renames: the old farm comes back
    for leftover in (new, old):
        if os.path.lexists(leftover):
            shutil.rmtree(leftover)


def active_version(latest):
    """The version most top-level links of latest/ point into (``../<version>/...``)."""
    counts = Counter()
    for name in os.listdir(latest):
        path = os.path.join(latest, name)
        if os.path.islink(path):
            parts = os.readlink(path).split("/")
            if len(parts) > 2 and parts[0] == "..":
                counts[parts[1]] += 1
    return counts.most_common(1)[0][0] if counts else None


def retarget(target, current, wanted):
    """``../8.3.RC2/opp`` -> ``../8.5.0/opp`` when the link goes into the current version's directory."""
    parts = target.split("/")
    if os.path.isabs(target) or current not in parts:
        return target
    index = parts.index(current)
    ups = parts[:index]
    if not ups or any(part != ".." for part in ups):
        return target
    parts[index] = wanted
    return "/".join(parts)


def build_farm(home, current, wanted, arch, version_cfg):
    """Copy latest/ into NEW_FARM with its links moved from ``current`` to ``wanted``."""
    latest, staging = os.path.join(home, "latest"), os.path.join(home, NEW_FARM)
    version_dir = os.path.join(home, wanted)
    arch_dir = f"{arch}-linux"
    os.mkdir(staging, 0o755)
    for parent, dirs, files in os.walk(latest):
        relative = os.path.relpath(parent, latest)
        out = staging if relative == "." else os.path.join(staging, relative)
        for name in list(dirs) + files:
            source, dest = os.path.join(parent, name), os.path.join(out, name)
            if os.path.islink(source):
                target = retarget(os.readlink(source), current, wanted)
                if os.path.lexists(os.path.join(os.path.dirname(dest), target)) or target == os.readlink(source):
                    os.symlink(target, dest)
            elif os.path.isdir(source):
                os.mkdir(dest, os.stat(source).st_mode & 0o7777)
            elif relative == "." and name == "version.cfg" and version_cfg is not None:
                with open(dest, "w", encoding="utf-8") as handle:
                    handle.write(version_cfg)
                shutil.copymode(source, dest)
            else:
                shutil.copy2(source, dest)
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(parent, name))]
    # Entries of the wanted version the current one lacked: its <arch>-linux files and its kernels.
    wanted_arch = os.path.join(version_dir, arch_dir)
    staged_arch = os.path.join(staging, arch_dir)
    if os.path.isdir(staged_arch) and not os.path.islink(staged_arch):
        for name in sorted(os.listdir(wanted_arch)):
            if not os.path.lexists(os.path.join(staged_arch, name)):
                os.symlink(f"../../{wanted}/{arch_dir}/{name}", os.path.join(staged_arch, name))
    kernels_link = os.path.join(staging, "opp_kernel")
    if os.path.isdir(os.path.join(version_dir, "opp_kernel")) and not os.path.lexists(kernels_link):
        os.symlink(f"../{wanted}/opp_kernel", kernels_link)
    return staging


def replace_file(path, content, mode):
    temporary = f"{path}.dsctl-new"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(content)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def replace_link(path, target):
    temporary = f"{path}.dsctl-new"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def switch_toolkit(module, home, wanted, version_cfg):
    arch = platform.machine()
    latest = os.path.join(home, "latest")
    record = os.path.join(home, wanted, f"{arch}-linux", "ascend_toolkit_install.info")
    if not os.path.isfile(record):
        raise SwitchError(f"CANN {wanted} is not installed in {home} ({record} missing); install it instead")
    if not module.check_mode:
        recover(home)
    if not os.path.isdir(latest):
        raise SwitchError(f"{latest} is missing, so there is no link farm to switch; reinstall the CANN {wanted} "
                          "toolkit to rebuild it")
    current = active_version(latest)
    changes = []
    if current != wanted or (version_cfg is not None and read(os.path.join(latest, "version.cfg")) != version_cfg):
        changes.append("latest")
    version_env = read(os.path.join(home, wanted, "set_env.sh"))
    set_env = os.path.join(home, "set_env.sh")
    if version_env is not None and read(set_env) != version_env:
        changes.append("set_env.sh")
    if module.check_mode or not changes:
        return current, changes
    if "latest" in changes:
        staging = build_farm(home, current, wanted, arch, version_cfg)
        if exchange(staging, latest):
            shutil.rmtree(staging)  # the old farm, after the exchange
        else:
            old = os.path.join(home, OLD_FARM)
            os.rename(latest, old)
            os.rename(staging, latest)
            shutil.rmtree(old)
    if "set_env.sh" in changes:
        replace_file(set_env, version_env, 0o755)
    return current, changes


def switch_nnal(module, install_path, wanted):
    atb = os.path.join(install_path, "nnal", "atb")
    if not os.path.isfile(os.path.join(atb, wanted, "version.info")):
        raise SwitchError(f"NNAL {wanted} is not installed in {atb}; install it instead")
    latest = os.path.join(atb, "latest")
    current = os.readlink(latest) if os.path.islink(latest) else None
    if current == wanted:
        return current, []
    if os.path.lexists(latest) and not os.path.islink(latest):
        raise SwitchError(f"{latest} is not a link; dsctl will not replace it")
    if not module.check_mode:
        replace_link(latest, wanted)
    return current, ["nnal"]


def main():
    module = AnsibleModule(
        argument_spec={
            "install_path": {"type": "path", "required": True},
            "toolkit_version": {"type": "str"},
            "version_cfg": {"type": "str"},
            "nnal_version": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    install_path = params["install_path"].rstrip("/") or "/"
    previous, changes = {}, []
    try:
        if params["toolkit_version"]:
            previous["toolkit"], done = switch_toolkit(module, os.path.join(install_path, "ascend-toolkit"),
                                                       params["toolkit_version"], params["version_cfg"])
            changes += done
        if params["nnal_version"]:
            previous["nnal"], done = switch_nnal(module, install_path, params["nnal_version"])
            changes += done
    except (SwitchError, OSError) as failure:
        module.fail_json(msg=str(failure), previous=previous)
    module.exit_json(changed=bool(changes), switched=changes, previous=previous)


if __name__ == "__main__":
    main()
