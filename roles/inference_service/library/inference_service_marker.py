#!/usr/bin/python
"""Move an inference instance's rollout state on the host: pending, good, or cleared (see tasks/instance.yml).

Each file is written to a temporary name, flushed and renamed, and the directory flushed after, so a crash or
a power cut leaves either the old or the new state, never a torn marker.  ``good`` writes the metadata, then
the fingerprint, and removes the pending marker last: until that last step a crashed run still finds its
rollout pending.  Stdlib only.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_service_marker
short_description: Mark an inference instance's rollout pending, good or cleared
description:
  - O(state=pending) writes C(.dsctl-pending) with O(content) (the candidate fingerprint and the manager metadata).
  - O(state=good) writes C(.dsctl-instance.json) with O(content), C(.dsctl-fingerprint) with O(fingerprint), then
    removes C(.dsctl-pending).
  - O(state=cleared) removes C(.dsctl-pending).
options:
  instance_dir:
    description: The instance's directory.
    type: path
    required: true
  state:
    description: The state to record.
    type: str
    choices: [pending, good, cleared]
    required: true
  fingerprint:
    description: The fingerprint that passed the health gate (O(state=good)).
    type: str
  content:
    description: The marker's or the metadata's JSON object.
    type: dict
    default: {}
author: dsctl
"""

RETURN = r"""
path:
  description: The instance directory.
  returned: always
  type: str
"""

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

PENDING = ".dsctl-pending"
META = ".dsctl-instance.json"
FINGERPRINT = ".dsctl-fingerprint"
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path, text, mode=0o600):
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.rename(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync_dir(os.path.dirname(path))


def clear(instance_dir):
    path = os.path.join(instance_dir, PENDING)
    if not os.path.exists(path):
        return False
    os.unlink(path)
    _fsync_dir(instance_dir)
    return True


def mark(instance_dir, state, fingerprint=None, content=None):
    """True when the state on the host changed."""
    if state == "pending":
        write_atomically(os.path.join(instance_dir, PENDING), json.dumps(content or {}, sort_keys=True) + "\n")
        return True
    if state == "good":
        if not FINGERPRINT_RE.match(fingerprint or ""):
            raise ValueError(f"fingerprint must be 64 hex digits, got {fingerprint!r}")
        write_atomically(os.path.join(instance_dir, META), json.dumps(content or {}, sort_keys=True) + "\n", 0o644)
        write_atomically(os.path.join(instance_dir, FINGERPRINT), fingerprint + "\n", 0o644)
        clear(instance_dir)
        return True
    return clear(instance_dir)


def main():
    module = AnsibleModule(
        argument_spec={
            "instance_dir": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["pending", "good", "cleared"], "required": True},
            "fingerprint": {"type": "str"},
            "content": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    directory = params["instance_dir"]
    if module.check_mode:
        module.exit_json(changed=params["state"] != "cleared" or os.path.exists(os.path.join(directory, PENDING)),
                         path=directory)
    try:
        changed = mark(directory, params["state"], params["fingerprint"], params["content"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot mark the rollout of {directory} {params['state']}: {exc}", path=directory)
    module.exit_json(changed=changed, path=directory)


if __name__ == "__main__":
    main()
