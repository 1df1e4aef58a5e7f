"""Which inventory host names dsctl accepts (pure).

Ansible itself accepts almost any string as a host name: its YAML inventory takes every mapping key, and
``InventoryData.add_host`` checks only that the name is a non-empty string (ansible-core 2.19,
lib/ansible/inventory/data.py: "TODO: add to_safe_host_name"). dsctl puts the names where a name with a
separator, a blank or a slash means something else: in ``--limit`` patterns it builds (`,` `:` `!` `&` `~` `*`
and `[` are pattern syntax:
https://docs.ansible.com/ansible/latest/inventory_guide/intro_patterns.html), in the commands it prints for the
user to run (a `;` there ends the command), in file names and run-directory entries (`/` and `..` leave the
directory), in rendered files and state files keyed by host.

So a host name is what RFC 1123 (section 2.1) allows a host name to be, plus the ``_`` Ansible's own examples
and many sites use: dot-separated labels of letters, digits, ``-`` and ``_``, each 1..63 characters and not
starting with ``-``; at most 253 characters in all (RFC 1035 section 2.3.4). An IPv4 address is such a name; an
IPv6 address is not (its ``:`` is pattern syntax): name the host and put the address in ``ansible_host``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_HOST_NAME = 253
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
RULE = ("dot-separated labels of letters, digits, '-' and '_' (RFC 1123 host names), none starting with '-', "
        f"at most {MAX_HOST_NAME} characters")
FIX = "rename the host in the inventory and put its address in ansible_host"


def host_name_problem(name: str) -> str | None:
    """The one line (without the ``inventory:`` prefix) refusing ``name``, or None for a name dsctl accepts."""
    if isinstance(name, str) and len(name) <= MAX_HOST_NAME and _HOST_NAME.fullmatch(name):
        return None
    return f"host {name!r}: not a host name dsctl accepts ({RULE}); {FIX}"


def first_bad_host_name(names: Iterable[str]) -> str | None:
    """`host_name_problem` of the first refused name among ``names``, or None."""
    for name in names:
        problem = host_name_problem(name)
        if problem is not None:
            return problem
    return None
