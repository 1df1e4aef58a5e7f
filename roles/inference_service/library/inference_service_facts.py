#!/usr/bin/python
"""Read, in one task, what the deploy role must know about a host before it touches an instance.

* The stack the instances run on: the active CANN (what ``<install_path>/ascend-toolkit/latest`` resolves to
  and the version its ``ascend_toolkit_install.info`` records), the sha256 of the NPU env file, and each serving
  venv (its path resolved through symlinks and the ``name==version`` of every ``*.dist-info`` directory in its
  site-packages).  The role folds these into each instance's fingerprint, so a CANN switch, an env change or a
  venv rebuilt with other pins restarts the instances that run on them.
* The rollout state of every instance directory under the service config dir: the fingerprint that last passed
  the health gate (``.dsctl-fingerprint``), an interrupted rollout (``.dsctl-pending``), the manager metadata
  (``.dsctl-instance.json``) and the good snapshots kept (``.dsctl-good/<fingerprint>/``).
* The service users' accounts (shell, comment, groups), the log directories (owner, mode) and whether
  supervisord runs: the role then creates or starts only what is missing.  These were four tasks of their own,
  each a module run on the host (about 0.25 s of CPU there, per task and host, mostly importing Ansible's
  module_utils): an unchanged deploy ran five such tasks per host, it now runs this one.

Reads only; never changes the host.  Stdlib only; ``read_stack`` and ``read_instances`` are importable.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_service_facts
short_description: Read the serving stack and the rollout state of a host's inference instances
description:
  - Returns the active CANN under each O(install_paths), the digest of O(env_file), the pins of each O(venvs)
    entry, and the state of every instance directory under O(config_dir).
  - Never changes the host; runs in check mode too.
options:
  config_dir:
    description: The service config dir (C(dsctl_service_config_dir)); one directory per instance below it.
    type: path
    required: true
  install_paths:
    description: CANN install paths whose C(ascend-toolkit/latest) the instances use.
    type: list
    elements: path
    default: []
  env_file:
    description: The NPU env file (C(dsctl_env_file)).
    type: path
  venvs:
    description: Serving venvs the instances run from.
    type: list
    elements: path
    default: []
  users:
    description: Service users whose accounts to read.
    type: list
    elements: str
    default: []
  directories:
    description: Directories whose owner and mode to read.
    type: list
    elements: path
    default: []
  supervisor_conf:
    description: supervisord's configuration file; when set, C(supervisorctl -c) asks for supervisord's pid.
    type: path
  resolve:
    description: Paths the role is about to change as root, returned resolved as the host sees them (RV(resolved)).
    type: list
    elements: str
    default: []
author: dsctl
"""

RETURN = r"""
stack:
  description: C(cann) (install path -> latest, version), C(env_file) (path, sha256 or null when absent),
    C(venvs) (path -> real path and sorted C(name==version) pins; null when the venv is absent).
  returned: always
  type: dict
instances:
  description: Instance name -> C(fingerprint) (or empty), C(pending) (the marker's JSON or null; a marker that
    cannot be parsed is C({"unreadable": true})), C(meta) (unit, manager, unit_file) and C(good) (fingerprints
    of the verified-manifest snapshots kept, newest first).
  returned: always
  type: dict
accounts:
  description: User -> null (no such account) or C(uid), C(gid), C(comment), C(shell), C(groups) (every group
    name it is in, its primary one included).
  returned: always
  type: dict
directories:
  description: Path -> null (absent) or C(isdir), C(uid), C(gid), C(mode) (octal string, e.g. C(0755)).
  returned: always
  type: dict
resolved:
  description: The host's real path of each of O(resolve), in order (every symlink of the part that exists
    followed, as C(realpath -m) does), for the role's path rule.
  returned: always
  type: list
supervisor_pid:
  description: What C(supervisorctl pid) printed (a number when supervisord runs), or empty.
  returned: always
  type: str
"""

import glob  # noqa: E402
import grp  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import re  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

FINGERPRINT = ".dsctl-fingerprint"
PENDING = ".dsctl-pending"
META = ".dsctl-instance.json"
GOOD = ".dsctl-good"
# An instance directory's name (service slug, dash, index); anything else under config_dir is not an instance.
INSTANCE_RE = re.compile(r"^[a-z][a-z0-9-]*-[0-9]+$")
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
DIST_INFO_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)\.dist-info$")
META_KEYS = ("unit", "manager", "unit_file", "runtime", "files")
MAX_INSTANCES = 4096  # bound the scan of config_dir


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cann_of(install_path):
    latest = os.path.join(install_path, "ascend-toolkit", "latest")
    if not os.path.exists(latest):
        return {"latest": None, "version": None}
    real = os.path.realpath(latest)
    version = None
    for info in sorted(glob.glob(os.path.join(real, "*-linux", "ascend_toolkit_install.info"))):
        try:
            with open(info, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    key, _, value = line.strip().partition("=")
                    if key.strip() == "version":
                        version = value.strip().strip('"')
        except OSError:
            continue
        if version:
            break
    return {"latest": real, "version": version}


def venv_of(venv):
    if not os.path.isdir(venv):
        return None
    real = os.path.realpath(venv)
    pins = set()
    for site in glob.glob(os.path.join(real, "lib", "python*", "site-packages")):
        for entry in os.listdir(site):
            found = DIST_INFO_RE.match(entry)
            if found:
                pins.add(f"{found.group('name').lower().replace('_', '-')}=={found.group('version')}")
    return {"real": real, "pins": sorted(pins)}


def read_stack(install_paths, env_file, venvs):
    env = None
    if env_file and os.path.isfile(env_file):
        env = sha256_file(env_file)
    return {"cann": {path: cann_of(path) for path in install_paths},
            "env_file": {"path": env_file, "sha256": env},
            "venvs": {path: venv_of(path) for path in venvs}}


def _text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 16)
    except OSError:
        return None


def _json(path, unreadable):
    text = _text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return unreadable
    return value if isinstance(value, dict) else unreadable


def guess_meta(name, directory):
    """The manager of an instance deployed before dsctl recorded it: from where its unit file is."""
    unit = f"dsctl-{name}"
    for manager, path in (("supervisor", f"/etc/supervisor/conf.d/{unit}.conf"),
                          ("systemd", f"/etc/systemd/system/{unit}.service"),
                          ("container", os.path.join(directory, "container-run.sh"))):
        if os.path.isfile(path):
            return {"unit": unit, "manager": manager, "unit_file": path, "runtime": "docker", "files": []}
    return None


def read_instances(config_dir):
    instances = {}
    try:
        names = sorted(os.listdir(config_dir))
    except OSError:
        return instances
    for name in names[:MAX_INSTANCES]:
        directory = os.path.join(config_dir, name)
        if not INSTANCE_RE.match(name) or not os.path.isdir(directory) or os.path.islink(directory):
            continue
        fingerprint = (_text(os.path.join(directory, FINGERPRINT)) or "").strip()
        pending = _json(os.path.join(directory, PENDING), {"unreadable": True})
        if not fingerprint and pending is None:
            continue  # not (yet) a dsctl instance: never touched by a rollout
        good_dir = os.path.join(directory, GOOD)
        good = []
        if os.path.isdir(good_dir):
            for entry in os.listdir(good_dir):
                manifest = os.path.join(good_dir, entry, "manifest.json")
                if FINGERPRINT_RE.match(entry) and os.path.isfile(manifest):
                    good.append((os.stat(manifest).st_mtime, entry))
        meta = _json(os.path.join(directory, META), None)
        if meta is None and isinstance(pending, dict) and pending.get("manager"):
            meta = {key: pending.get(key) for key in META_KEYS}
        instances[name] = {"fingerprint": fingerprint, "pending": pending,
                           "meta": meta if meta is not None else guess_meta(name, directory),
                           "good": [entry for _, entry in sorted(good, reverse=True)]}
    return instances


def read_account(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    groups = []
    for gid in os.getgrouplist(name, entry.pw_gid):
        try:
            groups.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return {"uid": entry.pw_uid, "gid": entry.pw_gid, "comment": entry.pw_gecos, "shell": entry.pw_shell,
            "groups": sorted(set(groups))}


def read_directory(path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return {"isdir": stat.S_ISDIR(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "required": True},
            "install_paths": {"type": "list", "elements": "path", "default": []},
            "env_file": {"type": "path"},
            "venvs": {"type": "list", "elements": "path", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "directories": {"type": "list", "elements": "path", "default": []},
            "supervisor_conf": {"type": "path"},
            "resolve": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    supervisor_pid = ""
    supervisorctl = module.get_bin_path("supervisorctl") if params["supervisor_conf"] else None
    if supervisorctl:
        # read-only: prints supervisord's pid, or an error when it does not run (exit code non-zero)
        _, out, _ = module.run_command([supervisorctl, "-c", params["supervisor_conf"], "pid"])
        supervisor_pid = out.strip()
    module.exit_json(changed=False, stack=read_stack(params["install_paths"], params["env_file"], params["venvs"]),
                     instances=read_instances(params["config_dir"]),
                     accounts={name: read_account(name) for name in params["users"]},
                     directories={path: read_directory(path) for path in params["directories"]},
                     # os.path.realpath (not strict): the existing part's symlinks followed, the rest kept
                     resolved=[os.path.realpath(path) for path in params["resolve"]],
                     supervisor_pid=supervisor_pid)


if __name__ == "__main__":
    main()
