"""Controller half of ascend_facts: run the read-only collector on the host, parse its output here.

The parser is dsctl.core.hostfacts.hoststate, the same code `dsctl check` uses, so a role's decision (install or
upgrade, reboot pending or not) and the audit never disagree about what a host runs.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    from dsctl.core.hostfacts.hoststate import parse_host
except ImportError as missing:  # ansible-playbook run outside dsctl's environment
    parse_host = None
    IMPORT_ERROR = str(missing)
else:
    IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        if parse_host is None:
            raise AnsibleActionFail(
                f"ascend_facts needs the dsctl package on the controller ({IMPORT_ERROR}); "
                "run ansible-playbook from dsctl's virtualenv"
            )
        result = super().run(tmp, task_vars)
        collected = self._execute_module(
            module_name="ascend_facts", module_args=self._task.args, task_vars=task_vars
        )
        if collected.get("failed"):
            return {**result, **collected}
        raw = collected["ascend_raw"]
        state = parse_host(raw).to_dict()
        return {
            **result,
            "changed": False,
            "ansible_facts": {"ascend_host": state, "ascend_raw": raw},
        }
