#!/usr/bin/python
"""Documentation of dsctl_stage_files; the work is done by its action plugin (playbooks/action_plugins)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: dsctl_stage_files
short_description: Copy many files from a controller directory to a host in one transfer
description:
  - Packs the named files of a controller directory into one tar and unpacks it on the host with
    M(ansible.builtin.unarchive); changed only when a file on the host differs.
  - Files land owned by root with mode 0644. The task checks nothing about their content.
options:
  src:
    description: Controller directory holding the files.
    type: path
    required: true
  files:
    description: Plain file names in O(src) (no directories), at most 10000.
    type: list
    elements: str
    required: true
  dest:
    description: Existing directory on the host.
    type: path
    required: true
author: dsctl
"""

EXAMPLES = r"""
- name: Stage the wheels a lock names
  dsctl_stage_files:
    src: /srv/wheelhouse
    files: [torch-2.8.0-py3-none-any.whl]
    dest: /var/lib/dsctl/staging/wheels
"""

RETURN = r"""
staged:
  description: The file names sent.
  returned: success
  type: list
  elements: str
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "str", "required": True},
            "dest": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="dsctl_stage_files runs through its action plugin; check action_plugins in ansible.cfg")


if __name__ == "__main__":
    main()
