"""Output: tables and data on stdout, progress and diagnostics on stderr, one --json envelope."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

RESULT_VERSION = "1"


def stdout_console() -> Console:
    # Piped output (CI logs, `| less`) gets a wide fixed width instead of rich's 80-column fallback.
    width = None if sys.stdout.isatty() else 200
    return Console(soft_wrap=False, highlight=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def progress(message: str) -> None:
    stderr_console().print(f"[dim]•[/dim] {message}")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                wrap: Sequence[str] = ()) -> None:
    """``wrap``: columns whose long cells wrap onto more lines (the others keep their width)."""
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        if column in wrap:
            table.add_column(column, overflow="fold", ratio=1)
        else:
            table.add_column(column, overflow="fold", no_wrap=True)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    stdout_console().print(table)


def emit_json(command: Sequence[str], data: Any, *, exit_code: int = 0, errors: Sequence[str] = ()) -> None:
    status = "success" if exit_code == 0 else ("partial" if data else "error")
    envelope = {
        "dsctl_result_version": RESULT_VERSION,
        "command": list(command),
        "status": status,
        "exit_code": exit_code,
        "data": data,
        "errors": list(errors),
    }
    sys.stdout.write(json.dumps(envelope, indent=1, sort_keys=False) + "\n")


def print_run_tail(errors: Sequence[str], *, rerun: Sequence[str], command: str, inventory: Any, log: Any) -> None:
    """After a playbook verb: failures with their log lines, which hosts to re-run, where the run's log is."""
    console = stderr_console()
    for line in errors:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if rerun:
        console.print(f"re-run these hosts once fixed: dsctl {command} {inventory} --limit {','.join(rerun)}",
                      markup=False, soft_wrap=True)
    console.print(f"run log: {log}", markup=False, style="dim", soft_wrap=True)
