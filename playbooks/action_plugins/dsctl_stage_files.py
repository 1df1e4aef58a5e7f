"""Controller half of dsctl_stage_files: send many controller files to a host in one transfer.

Why not ansible.builtin.copy with a directory: copy stats, transfers and moves each file separately (three
round trips per file). On a wheelhouse of ~60 wheels that was 197 s of a 296 s lab provision; one tar and one
ansible.builtin.unarchive run is a single transfer whatever the count.  The tar is built here with the
standard library (root-owned, mode 0644, names without directories) and unpacked by Ansible's own unarchive
module, which reports changed only when a file differs.  Nothing here verifies content: the caller installs
the files with pip --require-hashes.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# A bound on the list, so a templating slip (a whole directory listing) fails instead of packing thousands.
MAX_FILES = 10000


def _checked_names(src: str, files) -> list[str]:
    if not isinstance(files, list) or not files:
        raise AnsibleActionFail("dsctl_stage_files: files must be a non-empty list of file names in src")
    if len(files) > MAX_FILES:
        raise AnsibleActionFail(f"dsctl_stage_files: {len(files)} files; at most {MAX_FILES} per task")
    names = sorted({str(name) for name in files})
    for name in names:
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise AnsibleActionFail(f"dsctl_stage_files: {name!r} is not a plain file name")
        try:
            mode = os.lstat(os.path.join(src, name)).st_mode
        except FileNotFoundError:
            raise AnsibleActionFail(f"dsctl_stage_files: {name} is not in {src}; build the wheelhouse again") from None
        # A link would arrive as a link (evil.whl -> /etc/shadow on the host), a FIFO would hang the packing.
        if stat.S_ISLNK(mode):
            raise AnsibleActionFail(f"dsctl_stage_files: {src}/{name} is a symlink; nothing was sent: put the file "
                                    "itself in the wheelhouse (build it again)")
        if not stat.S_ISREG(mode):
            raise AnsibleActionFail(f"dsctl_stage_files: {src}/{name} is not a regular file; nothing was sent: "
                                    "build the wheelhouse again")
    return names


def _pack(src: str, names: list[str], bundle: str) -> None:
    with tarfile.open(bundle, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            # O_NOFOLLOW and fstat: a name swapped for a link after _checked_names is refused here, not packed.
            try:
                descriptor = os.open(os.path.join(src, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as error:
                raise AnsibleActionFail(f"dsctl_stage_files: cannot read {src}/{name} as a regular file "
                                        f"({error.strerror}); nothing was sent: build the wheelhouse again") from None
            with os.fdopen(descriptor, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise AnsibleActionFail(f"dsctl_stage_files: {src}/{name} is not a regular file; nothing was "
                                            "sent: build the wheelhouse again")
                info = tar.gettarinfo(arcname=name, fileobj=handle)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = 0o644
                tar.addfile(info, handle)


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self._task.args
        src, dest = args.get("src"), args.get("dest")
        if not src or not dest:
            raise AnsibleActionFail("dsctl_stage_files: src (a controller directory) and dest are required")
        src = os.path.expanduser(str(src))
        names = _checked_names(src, args.get("files"))
        if self._task.check_mode:
            return {**result, "changed": True, "staged": names}
        try:
            with tempfile.TemporaryDirectory(prefix="dsctl-stage-") as scratch:
                bundle = os.path.join(scratch, "files.tar")
                _pack(src, names, bundle)
                remote = self._connection._shell.join_path(self._connection._shell.tmpdir, "files.tar")
                self._transfer_file(bundle, remote)
                self._fixup_perms2((self._connection._shell.tmpdir, remote))
                unpacked = self._execute_module(
                    module_name="ansible.legacy.unarchive",
                    module_args={"src": remote, "dest": dest, "remote_src": True,
                                 "owner": "root", "group": "root", "mode": "0644"},
                    task_vars=task_vars,
                )
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        if unpacked.get("failed"):
            return {**result, **unpacked}
        return {**result, "changed": bool(unpacked.get("changed")), "staged": names}
