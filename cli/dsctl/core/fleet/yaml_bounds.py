"""How much a YAML document may expand through its aliases (pure): the "billion laughs" bound.

An alias (``*a``) stands for the whole node its anchor (``&a``) names, so nine lines of nine aliases each
describe 9**9 nodes. PyYAML builds such a document by reference (cheap), but whatever then walks it as a tree does
the full work: Ansible's variable merging and templating took 88 s on one small inventory before succeeding. A
user's YAML (inventories, group_vars, host_vars, --param values) is therefore checked before it is loaded or
handed to Ansible: the events are counted (at most ``MAX_ALIASES`` aliases), and when there are aliases the node
graph (PyYAML's composer, which shares aliased nodes instead of copying them) is sized as the tree it stands for
(at most ``MAX_EXPANDED_NODES`` nodes; an alias inside its own anchor never ends). Both bounds are far above what
an inventory needs (the sample uses no alias at all).

A document that is not valid YAML is left to its reader, which reports the error with its position.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_ALIASES = 1_000
MAX_EXPANDED_NODES = 1_000_000

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class TooLarge(ValueError):
    """A document whose aliases expand beyond the bounds (one line: where, how much, the bound)."""


def check(text: str, where: str) -> None:
    """Raise `TooLarge` when ``text`` has more than ``MAX_ALIASES`` aliases or expands to more than
    ``MAX_EXPANDED_NODES`` nodes; ``where`` names the file or option in the message."""
    try:
        aliases = 0
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise TooLarge(f"{where}: more than {MAX_ALIASES} YAML aliases (*name); dsctl refuses it "
                                   "(alias expansion is bounded); write the values out or use group_vars")
        if not aliases:
            return  # without aliases the tree is no larger than the text
        for document in yaml.compose_all(text, Loader=_Loader):
            if document is not None:
                size = expanded_size(document, MAX_EXPANDED_NODES)
                if size > MAX_EXPANDED_NODES:
                    raise TooLarge(f"{where}: its YAML aliases expand to more than {MAX_EXPANDED_NODES} nodes; "
                                   "dsctl refuses it (alias expansion is bounded); write the values out instead "
                                   "of nesting aliases")
    except yaml.YAMLError:
        return


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes of the tree ``root`` stands for, every alias expanded; ``limit + 1`` as soon as it exceeds ``limit``
    or a node contains itself. Each distinct node is sized once (iteratively: no recursion limit)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        children = _children(node)
        if not children_done:
            if key in open_nodes:
                return limit + 1  # an alias inside its own anchor: endless
            open_nodes.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    return limit + 1
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_nodes.discard(key)
        total = 1 + sum(sizes[id(child)] for child in children)
        if total > limit:
            return limit + 1
        sizes[key] = total
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def safe_load(text: str, where: str) -> Any:
    """`yaml.safe_load` of user text, its alias expansion bounded first (`check`)."""
    check(text, where)
    return yaml.safe_load(text)
