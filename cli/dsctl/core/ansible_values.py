"""Values as dsctl's Jinja filters receive them from Ansible, made plain Python data for the core (pure: it imports
nothing of Ansible, and the plugins import the core only).

Ansible hands filters its own containers and tagged scalars (lazy templating dicts and lists, str/int subclasses
that carry their origin); the core validates and serialises plain dicts, lists, str, int, float, bool and None.
Both filter plugins (playbooks/filter_plugins/) use this one conversion: a plugin cannot import another plugin
(Ansible's loader imports each plugin file under a name of its own, not from a directory on sys.path), but both
already import the dsctl package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """``value`` with every mapping a dict with str keys, every list or tuple a list, every scalar of its exact
    builtin type; anything else unchanged."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value
