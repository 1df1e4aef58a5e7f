"""Numbers YAML 1.1 reads otherwise than they are written, in the values of dsctl's settings (pure).

Ansible loads inventories with PyYAML's YAML 1.1 resolvers, which read a plain integer with a leading zero as
octal (``dsctl_npu_count: 010`` is 8) and one with colons as base 60 (``port: 1:30`` is 90): the YAML 1.1
int type, https://yaml.org/type/int.html (YAML 1.2 dropped both).  Once loaded, 8 is all that is left, so the
file's text is checked: every plain scalar under a ``dsctl_*`` key (at any depth: a service's port too) that
the resolver makes an int or a float from such a spelling is refused, naming the key and both readings.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


def _reading(node: yaml.ScalarNode) -> str | None:
    """What YAML 1.1 makes of a misleading plain number, or None when the scalar means what it says."""
    if node.style or node.tag not in (_INT_TAG, _FLOAT_TAG):  # plain: None (PyYAML) or "" (libyaml)
        return None  # quoted, or not a number: the schema judges it
    text = node.value
    if node.tag == _INT_TAG and _LEADING_ZERO.fullmatch(text):
        value = yaml.load(text, Loader=_Loader)
        digits = text.lstrip("+-").lstrip("0").replace("_", "") or "0"
        return (f"{text} has a leading zero, which YAML 1.1 (Ansible's loader) reads as the octal number {value}; "
                f'write {digits} or {value}, or quote it ("{text}") if it is text')
    if _SEXAGESIMAL.fullmatch(text):
        value = yaml.load(text, Loader=_Loader)
        return (f"{text} is read by YAML 1.1 (Ansible's loader) as the base-60 number {value}; write {value}, "
                f'or quote it ("{text}") if it is text')
    return None


def _walk(node: yaml.Node, path: str, seen: set[int]) -> str | None:
    if id(node) in seen:  # an alias: its node was checked where its anchor is
        return None
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        reading = _reading(node)
        return f"{path}: {reading}" if reading else None
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found = _walk(item, f"{path}[{index}]", seen)
            if found:
                return found
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            found = _walk(value, f"{path}.{key.value}" if isinstance(key, yaml.ScalarNode) else path, seen)
            if found:
                return found
    return None


def _settings(node: yaml.Node, prefix: str, seen: set[int]) -> str | None:
    """The first misread number under a ``prefix*`` key anywhere in the document (hosts.yml nests them)."""
    if id(node) in seen:
        return None
    seen.add(id(node))
    children: list[tuple[yaml.Node | None, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        children = list(node.value)
    elif isinstance(node, yaml.SequenceNode):
        children = [(None, item) for item in node.value]
    for key, value in children:
        if isinstance(key, yaml.ScalarNode) and str(key.value).startswith(prefix):
            found = _walk(value, str(key.value), set())
        else:
            found = _settings(value, prefix, seen)
        if found:
            return found
    return None


def misread_number(text: str, prefix: str = "dsctl_") -> str | None:
    """``key.path: problem; fix`` for the first number under a ``prefix*`` key of ``text`` that YAML 1.1 reads
    otherwise than it is written, or None.  Text that is not YAML is left to its reader (None)."""
    try:
        documents = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError:
        return None
    for document in documents:
        if document is not None:
            found = _settings(document, prefix, set())
            if found:
                return found
    return None
