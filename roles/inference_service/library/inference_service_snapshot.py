#!/usr/bin/python
"""Keep, verify and restore the last good files of an inference instance, one directory per fingerprint.

``<instance dir>/.dsctl-good/<fingerprint>/`` holds a copy of every file of a configuration that passed the
health gate (``files/0``, ``files/1``, ...) and ``manifest.json``: for each file its path on the host, sha256,
mode, owner and group.  A snapshot is built in a temporary directory, each copy checked against the sha256 of
its source, flushed, and only then renamed into place, so a crash or a full disk never leaves a partial
snapshot under a fingerprint's name.  Before a snapshot is used it is verified against its manifest; a
snapshot that does not verify is never restored.

Every failure fails the task (the role never ignores a backup or restore failure).  Stdlib only.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_service_snapshot
short_description: Keep, verify and restore an inference instance's last good files
description:
  - O(state=kept) copies O(files) into C(<instance_dir>/.dsctl-good/<fingerprint>/) with a sha256 manifest,
    unless a snapshot of that fingerprint exists and verifies.
  - O(state=restored) verifies the snapshot of O(fingerprint) and puts its files back (mode, owner, group).
  - O(state=verified) only verifies it.
  - O(state=pruned) removes all but the O(keep) newest snapshots, never the one of O(fingerprint).
options:
  instance_dir:
    description: The instance's directory.
    type: path
    required: true
  fingerprint:
    description: The fingerprint (64 hex digits) the snapshot is kept under.
    type: str
    required: true
  state:
    description: What to do.
    type: str
    choices: [kept, restored, verified, pruned]
    default: kept
  files:
    description: Paths of the files to keep (O(state=kept)).
    type: list
    elements: path
    default: []
  keep:
    description: Snapshots left by O(state=pruned).
    type: int
    default: 3
author: dsctl
"""

RETURN = r"""
path:
  description: The snapshot's directory.
  returned: always
  type: str
files:
  description: Paths the snapshot holds.
  returned: always
  type: list
  elements: str
removed:
  description: Fingerprints removed by O(state=pruned).
  returned: when state is pruned
  type: list
  elements: str
"""

import grp  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

GOOD = ".dsctl-good"
MANIFEST = "manifest.json"
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 64
WHAT = {"kept": "backup of the last good files failed, the instance was not touched",
        "restored": "restore of the last good files failed",
        "verified": "the backup of the last good files does not verify",
        "pruned": "pruning old backups of the last good files failed"}


class SnapshotError(Exception):
    pass


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def snapshot_dir(instance_dir, fingerprint):
    if not FINGERPRINT_RE.match(fingerprint or ""):
        raise SnapshotError(f"fingerprint must be 64 hex digits, got {fingerprint!r}")
    return os.path.join(instance_dir, GOOD, fingerprint)


def verify(instance_dir, fingerprint):
    """The manifest of a snapshot whose every copy matches it; SnapshotError saying what does not."""
    directory = snapshot_dir(instance_dir, fingerprint)
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"no readable manifest in {directory}: {exc}") from None
    entries = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("fingerprint") != fingerprint or not isinstance(entries, list) or not entries:
        raise SnapshotError(f"the manifest in {directory} is not a snapshot of {fingerprint}")
    for entry in entries:
        stored = os.path.join(directory, "files", str(entry.get("stored", "")))
        try:
            actual = sha256_file(stored)
        except OSError as exc:
            raise SnapshotError(f"{entry.get('path')}: the kept copy {stored} cannot be read: {exc}") from None
        if actual != entry.get("sha256"):
            raise SnapshotError(f"{entry.get('path')}: the kept copy {stored} does not match the manifest "
                                f"(sha256 {actual}, manifest {entry.get('sha256')})")
    return manifest


def keep(instance_dir, fingerprint, files):
    """(changed, manifest): a verified snapshot of ``files`` under ``fingerprint``."""
    directory = snapshot_dir(instance_dir, fingerprint)
    if os.path.isdir(directory):
        try:
            return False, verify(instance_dir, fingerprint)
        except SnapshotError:
            pass  # rebuilt below from the files that serve now
    if not files or len(files) > MAX_FILES:
        raise SnapshotError(f"expected 1 to {MAX_FILES} files to keep, got {len(files)}")
    good = os.path.join(instance_dir, GOOD)
    if not os.path.isdir(good):
        os.mkdir(good, 0o700)  # a file in its place or a full disk fails here, before the instance is touched
    temporary = os.path.join(good, f".tmp-{fingerprint}-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(os.path.join(temporary, "files"), 0o700)
    try:
        entries = []
        for index, path in enumerate(files):
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise SnapshotError(f"{path} is not a regular file")
            source = sha256_file(path)
            stored = os.path.join(temporary, "files", str(index))
            shutil.copyfile(path, stored)
            with open(stored, "rb") as handle:
                os.fsync(handle.fileno())
            if sha256_file(stored) != source or sha256_file(path) != source:
                raise SnapshotError(f"{path} changed while it was copied")
            entries.append({"path": path, "stored": str(index), "sha256": source,
                            "mode": f"0{stat.S_IMODE(info.st_mode):o}",
                            "owner": _name(pwd.getpwuid, info.st_uid), "group": _name(grp.getgrgid, info.st_gid)})
        manifest = {"fingerprint": fingerprint, "created": time.time(), "files": entries}
        with open(os.path.join(temporary, MANIFEST), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(os.path.join(temporary, "files"))
        _fsync_dir(temporary)
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        os.rename(temporary, directory)
        _fsync_dir(good)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return True, verify(instance_dir, fingerprint)


def restore(instance_dir, fingerprint):
    """Put a verified snapshot's files back, each replaced atomically (temporary file, then rename)."""
    manifest = verify(instance_dir, fingerprint)
    directory = snapshot_dir(instance_dir, fingerprint)
    for entry in manifest["files"]:
        path = entry["path"]
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        temporary = os.path.join(parent, f".{os.path.basename(path)}.dsctl-restore")
        shutil.copyfile(os.path.join(directory, "files", entry["stored"]), temporary)
        try:
            os.chown(temporary, pwd.getpwnam(entry["owner"]).pw_uid, grp.getgrnam(entry["group"]).gr_gid)
            os.chmod(temporary, int(entry["mode"], 8))
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
            if sha256_file(temporary) != entry["sha256"]:
                raise SnapshotError(f"{path}: the restored copy does not match the manifest")
            os.rename(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        _fsync_dir(parent)
    return manifest


def prune(instance_dir, fingerprint, count):
    good = os.path.join(instance_dir, GOOD)
    if not os.path.isdir(good):
        return []
    snapshots = []
    for entry in os.listdir(good):
        path = os.path.join(good, entry)
        if FINGERPRINT_RE.match(entry) and os.path.isdir(path):
            manifest = os.path.join(path, MANIFEST)
            snapshots.append((os.stat(manifest).st_mtime if os.path.exists(manifest) else 0.0, entry))
        elif entry.startswith(".tmp-"):
            shutil.rmtree(path)  # left by a crash while a snapshot was built
    ordered = [entry for _, entry in sorted(snapshots, reverse=True) if entry != fingerprint]
    removed = ordered[max(count - 1, 0):]
    for entry in removed:
        shutil.rmtree(os.path.join(good, entry))
    return removed


def main():
    module = AnsibleModule(
        argument_spec={
            "instance_dir": {"type": "path", "required": True},
            "fingerprint": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["kept", "restored", "verified", "pruned"], "default": "kept"},
            "files": {"type": "list", "elements": "path", "default": []},
            "keep": {"type": "int", "default": 3},
        },
        supports_check_mode=True,
    )
    params = module.params
    instance_dir, fingerprint, state = params["instance_dir"], params["fingerprint"], params["state"]
    path = os.path.join(instance_dir, GOOD, fingerprint)
    try:
        path = snapshot_dir(instance_dir, fingerprint)
        if module.check_mode or state == "verified":
            manifest = verify(instance_dir, fingerprint) if os.path.isdir(path) or state == "verified" else None
            module.exit_json(changed=manifest is None and state in ("kept", "restored"), path=path,
                             files=[e["path"] for e in (manifest or {}).get("files", [])])
        if state == "kept":
            changed, manifest = keep(instance_dir, fingerprint, params["files"])
        elif state == "restored":
            changed, manifest = True, restore(instance_dir, fingerprint)
        else:
            removed = prune(instance_dir, fingerprint, params["keep"])
            module.exit_json(changed=bool(removed), path=path, files=[], removed=removed)
    except SnapshotError as exc:
        module.fail_json(msg=f"{WHAT[state]} ({path}): {exc}", path=path)
    except OSError as exc:
        reason = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc.strerror or exc)
        module.fail_json(msg=f"{WHAT[state]} ({path}): {reason}", path=path)
    module.exit_json(changed=changed, path=path, files=[e["path"] for e in manifest["files"]])


if __name__ == "__main__":
    main()
