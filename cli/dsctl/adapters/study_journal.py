"""The study journal of `dsctl tune` (``study.journal`` in the run directory): an Optuna JournalStorage on a file,
whose writes Ctrl-C and SIGTERM never cut.

The journal (``JournalFileBackend``, an append-only log with a file lock) lets several controllers (processes) share
one study and ``--resume`` continue an interrupted one (`dsctl.core.tune.study` runs a study on the storage it is
handed).  Its lock is a file, so a signal landing in the middle of a write is held until the write is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import BaseJournalBackend


def journal_storage(path: Path) -> optuna.storages.BaseStorage:
    """An Optuna JournalStorage on ``path`` (created if missing; shared safely by several processes)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(_SignalSafeBackend(JournalFileBackend(str(path))))


_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_held() -> Any:
    """Hold Ctrl-C and SIGTERM for the duration, then deliver them to the handlers they would have met.

    Optuna's journal lock (``JournalFileSymlinkLock.release``) renames its lock file and unlinks it, and on any
    BaseException unlinks it again: a KeyboardInterrupt landing between the two turns into FileNotFoundError
    (seen in CI: a Ctrl-C'd live tune ended "internal error" instead of restoring its instances), and one landing
    after the lock is taken leaves it held.  Signal handlers run only in the main thread, so only there is
    anything held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: pending.append(signum))
                for signum in _HELD_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


class _SignalSafeBackend(BaseJournalBackend):
    """A journal backend whose writes are never cut by Ctrl-C or SIGTERM (`_signals_held`); reads take no lock."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def read_logs(self, log_number_from: int) -> Any:
        return self._backend.read_logs(log_number_from)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with _signals_held():
            self._backend.append_logs(logs)
