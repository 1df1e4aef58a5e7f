"""The layers, by their imports: commands are one module per verb and only app.py reaches them; verbs never print."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cli" / "dsctl"
VERBS = {"provision", "check", "deploy", "probe", "estimate", "matrix", "lab", "engine", "tune", "upgrade",
         "wheelhouse"}
# What a verb (dsctl.services) must not use: they return results, commands render them.
RENDERING = ("typer", "rich", "click", "dsctl.ui", "dsctl.ui_progress", "dsctl.cli_options", "dsctl.app",
             "dsctl.commands")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, ``from x import y`` giving both x and x.y."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def python_files(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py") if "__pycache__" not in path.parts)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_commands_hold_one_module_per_verb():
    modules = {path.stem for path in (PACKAGE / "commands").glob("*.py")} - {"__init__"}
    assert modules == VERBS
    assert not [path for path in (PACKAGE / "commands").iterdir() if path.is_dir() and path.name != "__pycache__"]


def test_nothing_outside_commands_imports_them_but_the_app():
    allowed = {PACKAGE / "app.py", *(PACKAGE / "commands").glob("*.py")}
    offenders = [f"{path.relative_to(REPO)}:{line}: {module}"
                 for path in python_files(PACKAGE, REPO / "bench", REPO / "playbooks", REPO / "tests")
                 if path not in allowed
                 for line, module in imported_modules(path) if within(module, "dsctl.commands")]
    assert offenders == []


def test_verbs_neither_print_nor_render():
    offenders = []
    for path in python_files(PACKAGE / "services"):
        offenders += [f"{path.relative_to(REPO)}:{line}: imports {module}" for line, module in imported_modules(path)
                      if any(within(module, banned) for banned in RENDERING)]
        calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
        offenders += [f"{path.relative_to(REPO)}:{call.lineno}: print()" for call in calls
                      if isinstance(call.func, ast.Name) and call.func.id == "print"]
    assert offenders == []


def test_the_scan_sees_imports():
    """The rules above are only as good as the scan: it must find both import forms."""
    sample = PACKAGE / "commands" / "deploy.py"
    modules = {module for _, module in imported_modules(sample)}
    assert "dsctl.services.deploy" in modules and "dsctl.services.deploy.deploy" in modules and "typer" in modules


def test_the_app_loads_every_verb_module_by_name():
    """app.py imports the command modules lazily (importlib): its table must name each one, and each must build."""
    from dsctl import app

    assert {module for module, _ in app.VERBS.values()} == VERBS
    for name in app.VERBS:
        assert app.load_verb(name).name == name
