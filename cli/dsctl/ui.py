"""Output: tables and data on stdout, progress and diagnostics on stderr, one --json envelope."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
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


def print_env_sources(hosts: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], *,
                      states: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """The NPU env of each host (ascend_env.annotated_env entries), hosts with the same env and states together:
    every value with its origin, source and confidence (and ``states[host][name]``, e.g. "verified"), then each
    warning once."""
    groups: dict[str, tuple[list[str], Sequence[Mapping[str, Any]], Mapping[str, str]]] = {}
    for host, entries in hosts:
        host_states = (states or {}).get(host, {})
        key = json.dumps([list(entries), host_states], sort_keys=True, default=str)
        groups.setdefault(key, ([], entries, host_states))[0].append(host)
    out = stdout_console()
    warnings: list[str] = []
    for names, entries, host_states in groups.values():
        out.print(f"NPU env of {', '.join(names)}:", markup=False, soft_wrap=True)
        width = max((len(f"{e['name']}={e['value']}") for e in entries), default=0)
        for entry in entries:
            state = host_states.get(entry["name"])
            detail = "; ".join(part for part in (entry["origin"], entry["source"], entry["confidence"], state) if part)
            out.print(f"  {entry['name'] + '=' + entry['value']:<{width}}  {detail}", markup=False, soft_wrap=True)
            if entry.get("warning") and entry["warning"] not in warnings:
                warnings.append(entry["warning"])
    for line in warnings:
        out.print(f"warning: {line}", markup=False, soft_wrap=True)
