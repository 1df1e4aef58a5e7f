"""Live progress on stderr: playbook runs fed by dsctl_events events (adapters.ansible_run on_event), per host
and stage (StageProgress) or per task (PlaybookProgress, `-v`), and the probe's request bar (ProbeProgress)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn
from rich.table import Table

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


@dataclass
class _HostRow:
    host: str
    stage: str = ""
    task: str = ""
    stage_started: float = 0.0
    ok: int = 0
    changed: int = 0
    failed: int = 0
    state: str = "running"  # running, done, failed, unreachable


class StageProgress:
    """Call with each event. One row per host: its stage (the role of the running task, else the play), that
    task, the time in the stage and ok/changed/failed so far. On a terminal a live table; elsewhere one line
    per host each time its stage changes. A host's failure is one line in both; the full log stays in the
    run directory (task lines: PlaybookProgress, `-v`). Use as a context manager, or call close()."""

    def __init__(self, console: Console | None = None, *, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, refresh_per_second: float = 4.0):
        self.console = console or stderr_console()
        self.live = self.console.is_terminal if live is None else live
        self._clock = clock
        self._refresh_rate = refresh_per_second
        self._started = clock()
        self._play = ""
        self._rows: dict[str, _HostRow] = {}
        self._lock = threading.Lock()
        self._view: Live | None = None

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._view is not None:
            self._view.stop()
            self._view = None

    @property
    def rows(self) -> dict[str, _HostRow]:
        return self._rows

    def _width(self) -> int:
        return max((len(name) for name in self._rows), default=0)

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def _counts(self, row: _HostRow) -> str:
        return (f"[{self._clock() - self._started:.0f} s, ok {row.ok}, changed {row.changed}, "
                f"failed {row.failed}]")

    def table(self) -> Table:
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        for column in ("host", "stage", "task", "time", "ok", "changed", "failed"):
            table.add_column(column, no_wrap=True, overflow="ellipsis",
                             justify="right" if column in ("time", "ok", "changed", "failed") else "left")
        now = self._clock()
        with self._lock:
            rows = list(self._rows.values())
        for row in rows:
            style = {"failed": "bold red", "unreachable": "bold red", "done": "green"}.get(row.state, "")
            task = row.task if row.state == "running" else row.state
            table.add_row(row.host, row.stage, task, f"{now - row.stage_started:.0f} s", str(row.ok),
                          str(row.changed), str(row.failed), style=style)
        return table

    def _show(self) -> None:
        if not self.live:
            return
        if self._view is None:  # redrawn by Live's own thread (refresh_per_second), not once per event
            self._view = Live(get_renderable=self.table, console=self.console, transient=True,
                              refresh_per_second=self._refresh_rate)
            self._view.start()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = str(event.get("event", ""))
        host = str(event.get("host") or "")
        if kind == "play_start":
            self._play = str(event.get("play", ""))
        elif kind == "stats":
            self._finish(event.get("hosts") or {})
        elif kind.startswith("runner_") and host:
            self._result(kind.removeprefix("runner_"), host, event)
            self._show()

    def _result(self, status: str, host: str, event: dict[str, Any]) -> None:
        with self._lock:
            row = self._rows.get(host)
            if row is None:
                row = self._rows[host] = _HostRow(host, stage_started=self._clock())
        if status == "start":
            stage = str(event.get("role") or self._play)
            if stage != row.stage:
                row.stage, row.stage_started = stage, self._clock()
                if not self.live:
                    self._line(f"{host.ljust(self._width())}  {stage}  {self._counts(row)}")
            row.task = str(event.get("task") or "")
            return
        if status in ("ok", "changed"):
            row.ok += 1
            row.changed += status == "changed"
        elif status in ("failed", "unreachable") and not event.get("ignore_errors"):
            row.failed += status == "failed"
            row.state = status
            text = f"{host.ljust(self._width())}  {status}  {task_label(event)}"
            self._line(text + (f": {event['msg']}" if event.get("msg") else ""))

    def _finish(self, stats: dict[str, dict[str, int]]) -> None:
        for name, counts in stats.items():
            with self._lock:
                row = self._rows.setdefault(name, _HostRow(name, stage_started=self._clock()))
            row.ok, row.changed, row.failed = counts.get("ok", 0), counts.get("changed", 0), counts.get("failures", 0)
            if counts.get("unreachable"):
                row.state = "unreachable"
            elif row.failed:
                row.state = "failed"
            else:
                row.state = "done"
            if not self.live:
                self._line(f"{name.ljust(self._width())}  {row.state}  {self._counts(row)}")
        self.close()


def playbook_progress(*, verbose: bool = False, console: Console | None = None) -> PlaybookProgress | StageProgress:
    """The sink a playbook verb reports to: per host and stage, or with ``verbose`` every task as before."""
    return PlaybookProgress(console) if verbose else StageProgress(console)


class ProbeProgress:
    """Renders the probe verb's records: notes as lines (``notes``), a request bar on a terminal."""

    def __init__(self, console: Console | None = None, *, notes: bool = True, bar: bool | None = None):
        self.console = console or stderr_console()
        self.notes = notes
        self.bar_enabled = self.console.is_terminal if bar is None else bar
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self.failed = 0

    def __enter__(self) -> ProbeProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "dsctl_note" and self.notes:
            self.console.print(f"[dim]•[/dim] {escape(str(event.get('msg', '')))}", highlight=False)
        elif kind == "dsctl_probe_start" and self.bar_enabled and self._bar is not None:  # the next sweep level
            self.failed = 0
            self._bar.reset(self._task, total=event.get("total"), failed=0)  # type: ignore[arg-type]
        elif kind == "dsctl_probe_start" and self.bar_enabled and self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("probe"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                                 console=self.console, transient=True, refresh_per_second=4)
            self._task = self._bar.add_task("probe", total=event.get("total"), failed=0)
            self._bar.start()
        elif kind == "dsctl_probe_request":
            if not event.get("success"):
                self.failed += 1
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, advance=1, failed=self.failed)
