"""Live progress of `dsctl tune`: one row per trial slot (instance), and a line of totals.

On a terminal a live table redrawn by rich's own thread: each slot's host, instance, trial and stage (deploying,
probing at R req/s, quality check, its last result), and above it trials done of the budget, running, crashed,
and the best goodput so far.  Elsewhere (CI logs, pipes) one line per finished trial and per note.  The verb's
records are ``dsctl_note``, ``dsctl_tune_trial`` (dsctl.services.tune_driver) and ``dsctl_tune_slot``
(dsctl.services.tune_live).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dsctl.services.tune_driver import format_value
from dsctl.ui import stderr_console


@dataclass
class _Slot:
    host: str
    instance: str
    trial: str = "-"
    stage: str = "idle"
    since: float = 0.0


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:.3g} req/s"


class TuneProgress:
    def __init__(self, console: Console | None = None, *, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.console = console or stderr_console()
        self.live = self.console.is_terminal if live is None else live
        self._clock = clock
        self._started = clock()
        self._slots: dict[int, _Slot] = {}
        self._totals = "starting"
        self._lock = threading.Lock()
        self._view: Live | None = None

    def __enter__(self) -> TuneProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._view is not None:
            self._view.stop()
            self._view = None

    def _line(self, text: str) -> None:
        if self._view is not None:
            self._view.console.print(text, highlight=False, soft_wrap=True, markup=False)
        else:
            self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def render(self) -> Group:
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        for column in ("slot", "host", "instance", "trial", "stage", "time"):
            table.add_column(column, no_wrap=True, overflow="ellipsis", justify="right" if column == "time" else "left")
        now = self._clock()
        with self._lock:
            slots = sorted(self._slots.items())
            totals = self._totals
        for index, slot in slots:
            table.add_row(str(index), slot.host, slot.instance, slot.trial, slot.stage, f"{now - slot.since:.0f} s")
        return Group(Text(f"{totals} | {now - self._started:.0f} s"), table)

    def _show(self) -> None:
        if self.live and self._view is None:
            self._view = Live(get_renderable=self.render, console=self.console, transient=True, refresh_per_second=4)
            self._view.start()

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        if kind == "dsctl_note":
            self._line(f"• {event['msg']}")
        elif kind == "dsctl_tune_slot":
            with self._lock:
                slot = self._slots.setdefault(int(event["slot"]), _Slot(str(event["host"]), str(event["instance"])))
                if event.get("trial") is not None:
                    slot.trial = str(event["trial"])
                slot.stage, slot.since = str(event["stage"]), self._clock()
            self._show()
        elif kind == "dsctl_tune_trial" and event.get("phase") == "told":
            best = event.get("best")
            with self._lock:
                self._totals = (f"{event['evaluated']}/{event['budget']} restarts, {event['feasible']} feasible, "
                                f"{event['crashed']} crashed, best {_rate(best)}")
            status = str(event["status"])
            if status == "feasible":
                status = f"feasible at {_rate(event.get('rate'))} (objective {_rate(event.get('objective'))})"
            elif event.get("detail"):
                status = f"{status}: {str(event['detail']).splitlines()[0][:100]}"
            where = f" on {event['instance']}@{event['host']}" if event.get("host") else ""
            config = " ".join(f"{k}={format_value(v)}" for k, v in (event.get("config") or {}).items())
            # Finished trials stay readable above the live table (and are the whole log elsewhere).
            self._line(f"trial {event['number']}{where}: {status} | {config} | {self._totals}")
