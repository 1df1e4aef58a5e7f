"""Live progress of a playbook run on stderr, fed by dsctl_events events (adapters.ansible_run on_event)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn

from dsctl.ui import stderr_console

_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold red", "skipped": "dim"}


def task_label(event: dict[str, Any]) -> str:
    task = event.get("task") or ""
    return f"{event['role']} : {task}" if event.get("role") else task


class PlaybookProgress:
    """Call with each event. On a terminal: one live row per host (current task, tasks done) under PLAY lines
    and changed/failed/unreachable results; elsewhere plain lines, and TASK lines too. ``verbose`` adds ok and
    skipped results. Use as a context manager, or call close() when the run is over."""

    def __init__(self, console: Console | None = None, *, verbose: bool = False, live: bool | None = None):
        self.console = console or stderr_console()
        self.verbose = verbose
        self.live = self.console.is_terminal if live is None else live
        self._progress: Progress | None = None
        self._rows: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}
        self._width = 0

    def __enter__(self) -> PlaybookProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def _row(self, host: str) -> TaskID | None:
        if not self.live:
            return None
        if self._progress is None:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.fields[host]}"), TextColumn("{task.completed:>4.0f} done"),
                TextColumn("{task.description}"), console=self.console, transient=True,
            )
            self._progress.start()
        if host not in self._rows:
            self._rows[host] = self._progress.add_task("", total=None, host=host.ljust(self._width))
        return self._rows[host]

    def __call__(self, event: dict[str, Any]) -> None:
        kind = str(event.get("event", ""))
        host = str(event.get("host") or "")
        self._width = max(self._width, len(host))
        if kind == "play_start":
            self._line(f"[bold]PLAY[/bold] {escape(str(event.get('play', '')))}")
        elif kind == "task_start" and not self.live:
            self._line(f"TASK {escape(task_label(event))}")
        elif kind == "runner_start" and host:
            row = self._row(host)
            if row is not None and self._progress is not None:
                self._progress.update(row, description=escape(task_label(event)))
        elif kind.startswith("runner_") and host:
            status = kind.removeprefix("runner_")
            row = self._row(host)
            if row is not None and self._progress is not None:
                stopped = status == "unreachable" or (status == "failed" and not event.get("ignore_errors"))
                label = f"[bold red]{status}[/]: {escape(task_label(event))}" if stopped else None
                self._progress.update(row, advance=1, description=label)
            if status in ("changed", "failed", "unreachable") or self.verbose:
                shown = "ignored" if status == "failed" and event.get("ignore_errors") else status
                style = "dim" if shown == "ignored" else _STYLE.get(status, "default")
                text = f"{escape(host.ljust(self._width))}  [{style}]{shown:<11}[/]  {escape(task_label(event))}"
                if status in ("failed", "unreachable") and event.get("msg"):
                    text += f": {escape(str(event['msg']))}"
                self._line(text)
        elif kind == "stats":
            self.close()
