"""The import graph of dsctl and of the playbooks' plugins: no cycles, and each layer imports only the layers below.

Read from the source with ``ast`` (nothing is imported), every import counts: at module level, inside a function
(the usual way to dodge an import loop is to import inside the function that needs it: it is still a dependency)
or under ``if TYPE_CHECKING:``.  Relative imports are resolved, and ``from pkg import name`` is an edge to the
module ``pkg.name`` when there is one, else to ``pkg`` (its ``__init__.py``, which is module ``pkg``).  Importing
``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too, but those implicit parent edges are not counted: a package
whose ``__init__`` imported its own submodules would otherwise be a cycle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO / "cli"  # cli/dsctl/x/y.py is module dsctl.x.y
# The Ansible plugins that run inside ansible-playbook's process and import the dsctl package.  Modules under
# library/ run on the managed hosts and cannot import dsctl; they are scanned all the same, so that one that did
# would be held to the plugins' rule.
PLUGIN_DIRS = ("filter_plugins", "action_plugins", "callback_plugins", "library", "module_utils")

# Rule (a): no cycle, neither between modules nor between packages (`package_of`).  A loop means neither side can be
# read, tested or moved without the other; dodging it with an import inside a function hides it, so those count.

# The layers, as prefixes: a module is within a prefix when it is the prefix or starts with prefix + ".".
CORE = ("dsctl.core",)

# Rule (b): the core is pure and the bottom of the stack, so that the verbs, the Ansible plugins, the emulated
# engine and the lab can all build on it without dragging in I/O, Ansible runs, the CLI or one another.  It may use
# the package's base below it: dsctl.errors (the one exception family every layer raises), dsctl.data (the packaged
# YAML tables) and dsctl.assets (where the packaged templates are: the renderers read their Jinja files).
CORE_MUST_NOT_IMPORT = ("dsctl.services", "dsctl.adapters", "dsctl.engine", "dsctl.lab", "dsctl.emu",
                        "dsctl.commands", "dsctl.ui", "dsctl.ui_progress", "dsctl.ui_tune", "dsctl.cli_options",
                        "dsctl.app")

# Rule (c): a plugin runs in ansible-playbook's process (and in each of its forked workers), on values Ansible
# templated: it needs the pure decisions and nothing else (a plugin that imported a verb or an adapter would run
# dsctl's I/O inside Ansible).  dsctl.errors is allowed because the core raises DsctlError and the plugins turn it
# into Ansible's own error; dsctl.data is not needed (the core reads the tables it needs) and is not allowed.
PLUGINS_MAY_IMPORT = ("dsctl.core", "dsctl.errors")

# Rule (d): the command layer parses the command line, calls one verb and renders what it returns.  It reaches the
# rest of dsctl only through the verbs (dsctl.services), so that a verb is the whole of what a command does and the
# tuner, the tests and bench/ can call the same verb without the CLI.  Its own modules are allowed, and
# dsctl.errors (UsageError).  A command takes the types, defaults and parsers of its verb's inputs and results
# from the verb's module (dsctl.services.X), even where that module has them from the core.
COMMAND_LAYER = ("dsctl.commands", "dsctl.ui", "dsctl.ui_progress", "dsctl.ui_tune", "dsctl.cli_options", "dsctl.app")
COMMANDS_MAY_IMPORT = ("dsctl.services", "dsctl.errors", *COMMAND_LAYER)
COMMANDS_MAY_IMPORT_EXACTLY = ("dsctl",)  # the package itself, for its __version__ (`dsctl --version`)
# The commands themselves are held to rule (d).  The rest of the command layer (ui*, cli_options, app) is held to
# it too: a helper there that reached the core would be the commands reaching it by another name.
HELD_TO_COMMAND_RULE = COMMAND_LAYER


def within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def module_name(path: Path) -> str:
    """dsctl's dotted name for a file under cli/, or ``playbooks/<dir>/<file>`` for a plugin."""
    if path.is_relative_to(PACKAGE_ROOT):
        parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return str(path.relative_to(REPO))


def package_files() -> list[Path]:
    return sorted(path for path in (PACKAGE_ROOT / "dsctl").rglob("*.py") if "__pycache__" not in path.parts)


def plugin_files() -> list[Path]:
    return sorted(path for directory in PLUGIN_DIRS for path in (REPO / "playbooks" / directory).glob("*.py"))


MODULES = {module_name(path): path for path in package_files()}


def resolve(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of dsctl's modules (None outside dsctl)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def imports_of(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dsctl module) of every import in ``source`` (module ``module``), wherever it is in the file."""
    found = []
    for node in ast.walk(ast.parse(source, filename=module)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, resolve(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if submodule in MODULES else resolve(base)))
    return [(line, target) for line, target in found if target is not None and target != module]


@cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}, for dsctl's modules and the plugins."""
    edges: dict[str, dict[str, int]] = {}
    for path in [*package_files(), *plugin_files()]:
        targets: dict[str, int] = {}
        for line, target in imports_of(module_name(path), path.read_text(), path.name == "__init__.py"):
            targets.setdefault(target, line)
        edges[module_name(path)] = targets
    return edges


def where(edges: dict[str, dict[str, int]], source: str, target: str) -> str:
    path = MODULES.get(source) or REPO / source
    return f"{path.relative_to(REPO)}:{edges[source][target]}: {source} imports {target}"


def find_cycle(edges: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of the graph as a path [a, b, ..., a], or None (an iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in sorted(edges):
        if start in state:
            continue
        path = [start]
        stack = [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            for target in stack[-1]:
                if state.get(target) == 1:
                    return [*path[path.index(target):], target]
                if target not in state and target in edges:
                    state[target] = 1
                    path.append(target)
                    stack.append(iter(sorted(edges[target])))
                    break
            else:
                state[path.pop()] = 2
                stack.pop()
    return None


def package_of(module: str) -> str:
    """The package a module belongs to: a package itself, the directory of a module in a subpackage
    (dsctl.core.fleet.matrix: dsctl.core.fleet), or the module itself when it is directly in dsctl/ (dsctl.app,
    dsctl.errors: each a layer or base of its own) or a plugin."""
    if module.startswith("playbooks/") or MODULES[module].name == "__init__.py" or module.count(".") < 2:
        return module
    return module.rpartition(".")[0]


def package_graph(edges: dict[str, dict[str, int]]) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], str]]:
    """The graph of packages (`package_of`), and for each of its edges one module import that makes it."""
    packages: dict[str, dict[str, int]] = {}
    witness: dict[tuple[str, str], str] = {}
    for source in sorted(edges):
        for target in sorted(edges[source]):
            above, below = package_of(source), package_of(target)
            packages.setdefault(below, {})
            if above != below:
                packages.setdefault(above, {})[below] = 1
                witness.setdefault((above, below), where(edges, source, target))
            else:
                packages.setdefault(above, {})
    return packages, witness


def test_no_import_cycles():
    edges = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle:\n" + "\n".join(
        where(edges, source, target) for source, target in zip(cycle, cycle[1:], strict=False))


def test_no_cycles_between_packages():
    """No loop between packages either (core.fleet importing core.serving while core.serving imports core.fleet):
    each package can be read, tested and moved above those it imports."""
    packages, witness = package_graph(graph())
    cycle = find_cycle(packages)
    assert cycle is None, "packages in a cycle:\n" + "\n".join(
        witness[source, target] for source, target in zip(cycle, cycle[1:], strict=False))


def test_core_imports_nothing_above_it():
    edges = graph()
    offenders = [where(edges, source, target) for source in sorted(edges) if within(source, CORE)
                 for target in sorted(edges[source]) if within(target, CORE_MUST_NOT_IMPORT)]
    assert not offenders, "the core imports a layer above it:\n" + "\n".join(offenders)


def test_plugins_import_the_core_only():
    edges = graph()
    offenders = [where(edges, source, target) for source in sorted(edges) if source.startswith("playbooks/")
                 for target in sorted(edges[source]) if not within(target, PLUGINS_MAY_IMPORT)]
    assert not offenders, "a plugin imports more than the core:\n" + "\n".join(offenders)


def test_commands_import_the_verbs_only():
    edges = graph()
    offenders = [where(edges, source, target) for source in sorted(edges) if within(source, HELD_TO_COMMAND_RULE)
                 for target in sorted(edges[source]) if not within(target, COMMANDS_MAY_IMPORT)
                 and target not in COMMANDS_MAY_IMPORT_EXACTLY]
    assert not offenders, "the command layer imports around the verbs:\n" + "\n".join(offenders)


def test_the_scan_sees_every_kind_of_import():
    """The rules above are only as good as the scan: function-level, relative and submodule imports are edges."""
    edges = graph()
    assert "dsctl.services.provision" in edges["dsctl.services.upgrade"]  # a module-level import
    assert "dsctl.services.context" in edges["dsctl.app"]
    assert "dsctl.core.hostfacts.hoststate" in edges["playbooks/action_plugins/ascend_facts.py"]  # inside a try
    sample = ("def f():\n    from . import compat\n    from .. import serving\n"
              "    from ..serving.service import X\n    import dsctl.core.upgrade.state\n")
    found = {target for _, target in imports_of("dsctl.core.fleet.sample", sample)}
    assert {target for _, target in imports_of("dsctl.core.fleet", "from . import compat\n", True)} == {
        "dsctl.core.fleet.compat"}
    assert found == {"dsctl.core.fleet.compat", "dsctl.core.serving", "dsctl.core.serving.service",
                     "dsctl.core.upgrade.state"}
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None
    assert package_of("dsctl.core.fleet.matrix") == "dsctl.core.fleet" and package_of("dsctl.core") == "dsctl.core"
    assert package_of("dsctl.app") == "dsctl.app" and package_of("dsctl.core.text") == "dsctl.core"
