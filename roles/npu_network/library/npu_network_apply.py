#!/usr/bin/python
"""Run the hccn_tool commands the controller decided, in order, stopping at the first failure and putting back
what this run set.

The commands come from dsctl.core.network.hccn_state.plan_changes (one setting of one NPU each: ``hccn_tool -i N
-ip -s address A netmask M``, ``-gateway -s gateway G``, ``-netdetect -s address A``), each with the command that
restores the NPU's earlier value, or none when the NPU had none (hccn_tool cannot unset a setting).  They run as
argument lists (no shell), and only hccn_tool runs: a command whose program is not O(hccn_tool) is refused before
anything does.  One module run for the host's whole list: a loop of ``command`` tasks costs one module start per
setting (24 on an 8-NPU host), most of a first provision's time on the lab.

What it leaves: each setting is one hccn_tool command, which sets the device and then /etc/hccn.conf; when one
fails, the settings this run had made are put back, last first, and the failure says which could not be (no
earlier value) and what hccn_tool said.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: npu_network_apply
short_description: Run hccn_tool set commands in order, putting back what was set when one fails
description:
  - Runs each of O(changes) (C(argv), an argument list whose first element is O(hccn_tool)) in order.
  - Stops at the first command that fails, runs the C(undo) of every command that succeeded, last first, and fails.
  - In check mode nothing runs; the result says what would change.
options:
  hccn_tool:
    description: The driver's hccn_tool; every command must run it.
    type: path
    required: true
  changes:
    description: The commands, each a dict with C(argv) (list), C(undo) (list or null) and C(label) (str).
    type: list
    elements: dict
    required: true
author: dsctl
"""

RETURN = r"""
applied:
  description: Labels of the settings made, in order.
  returned: always
  type: list
put_back:
  description: Labels of the settings put back after a failure.
  returned: on failure
  type: list
"""

import os  # noqa: E402
import subprocess  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

COMMAND_TIMEOUT_S = 60
MAX_CHANGES = 256


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S,
                              env={**os.environ, "LC_ALL": "C"}, check=False)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {COMMAND_TIMEOUT_S} s"
    except OSError as problem:
        return None, "", str(problem)
    return done.returncode, done.stdout[-4096:], done.stderr[-4096:]


def first_line(*texts):
    for text in texts:
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if lines:
            return lines[0]
    return "no output"


def main():
    module = AnsibleModule(
        argument_spec={
            "hccn_tool": {"type": "path", "required": True},
            "changes": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    tool, changes = module.params["hccn_tool"], module.params["changes"]
    if len(changes) > MAX_CHANGES:
        module.fail_json(msg=f"changes: {len(changes)} commands, at most {MAX_CHANGES}")
    for change in changes:
        for key in ("argv", "undo"):
            argv = change.get(key)
            if argv is None and key == "undo":
                continue
            if (not isinstance(argv, list) or not argv or argv[0] != tool
                    or not all(isinstance(part, str) for part in argv)):
                module.fail_json(msg=f"changes: {key} of {change.get('label')!r} must be an argument list running "
                                     f"{tool}; nothing was run")
    labels = [str(change.get("label")) for change in changes]
    if module.check_mode or not changes:
        module.exit_json(changed=bool(changes), applied=labels if changes else [])
    applied = []
    for change in changes:
        label = str(change.get("label"))
        rc, out, err = run(change["argv"])
        if rc == 0:
            applied.append((change, label))
            continue
        put_back, failed_back, stuck = [], [], []
        for done, done_label in reversed(applied):
            if not done.get("undo"):
                stuck.append(done_label)
                continue
            back_rc, back_out, back_err = run(done["undo"])
            (put_back if back_rc == 0 else failed_back).append(
                done_label if back_rc == 0 else f"{done_label} ({first_line(back_err, back_out)})")
        words = first_line(err, out)
        message = f"hccn_tool failed setting {label} (rc {rc}: {words})"
        message += f"; put back: {', '.join(put_back)}" if put_back else "; nothing this run set needed putting back"
        if stuck:
            message += f"; left as set (the NPU had no earlier value; hccn_tool cannot unset one): {', '.join(stuck)}"
        if failed_back:
            message += f"; putting back failed for: {', '.join(failed_back)}"
        message += "; fix the cause, then run dsctl provision again (it sets only what still differs)"
        module.fail_json(msg=message, changed=bool(stuck or failed_back), applied=[name for _, name in applied],
                         put_back=put_back, rc=rc, stdout=out, stderr=err)
    module.exit_json(changed=True, applied=[name for _, name in applied])


if __name__ == "__main__":
    main()
