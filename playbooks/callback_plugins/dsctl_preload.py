# Copyright: dsctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load the filter plugins (dsctl's, and through them the dsctl package) once, in ansible-playbook's main process.

Why: ansible-playbook forks a worker for every host and task, and a worker builds its Jinja environment from the
filter plugins; a plugin the main process never loaded is loaded again in every worker.  dsctl_filters imports
dsctl's core (the matrix, the settings schema, pydantic): a few tenths of a second of CPU per host and task.
Workers forked after this callback has loaded them inherit the modules.  bench/ansible_preload.py measures it
(2-core machine: 20 set_fact tasks on 3 local hosts, 13.2 s without, 3.7 s with; 27 s against 5.4 s while the
test suite ran alongside).  It changes no result and prints nothing.
"""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader

DOCUMENTATION = r"""
name: dsctl_preload
type: aggregate
short_description: Load the filter plugins once in the controller's main process
description:
  - At playbook start, loads every filter plugin on the configured paths, so forked workers inherit them
    instead of each importing dsctl's filters (and the dsctl package) again.
  - Prints nothing and changes no result.
requirements:
  - enable in configuration (C(callbacks_enabled=dsctl_preload))
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dsctl_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        # all() imports each plugin file and keeps it in the loader's cache, which the workers' loaders share
        # after fork; the list itself is not needed.
        for _plugin in filter_loader.all():
            pass
