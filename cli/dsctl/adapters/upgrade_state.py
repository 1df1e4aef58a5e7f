"""Where `dsctl upgrade` keeps a fleet's run state on the controller, and reading and writing it.

``$XDG_STATE_HOME/dsctl/upgrades/<key>/state.json`` (next to the run directories), the key being the inventory
resolved (symlinks, ``..``, relative spellings; dsctl.core.upgrade.state names the key, the file and what it holds).
Without it ``inv`` and ``inv/../inv`` were two upgrades, each blind to the other's unfinished state.  Written
durably and locked while an upgrade runs (dsctl.adapters.state_files).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from dsctl.adapters import ansible_run, state_files
from dsctl.core.upgrade.state import (
    LOCK_FILE,
    STATE_FILE,
    StateError,
    UpgradeState,
    inventory_source,
    state_dir_name,
)


def fleet_key(inventory: Path) -> Path:
    """The path that names a fleet: the inventory resolved, and a directory inventory holding a single inventory
    file keyed as that file (`inventory_source`)."""
    real = Path(os.path.realpath(Path(inventory).expanduser()))
    if real.is_dir():
        source = inventory_source(entry.name for entry in real.iterdir() if entry.is_file())
        if source is not None:
            return real / source
    return real


def state_path(key: Path) -> Path:
    """The state file of the fleet keyed ``key`` (`fleet_key`)."""
    return ansible_run.runs_dir().parent / "upgrades" / state_dir_name(key) / STATE_FILE


def fleet_state_path(inventory: Path) -> Path:
    """The state file of the fleet ``inventory`` names, however it is spelt."""
    return state_path(fleet_key(inventory))


def read(path: Path) -> UpgradeState:
    """The state in ``path``; StateError when it is not one (OSError when it cannot be read)."""
    return UpgradeState.from_json(path.read_text(encoding="utf-8"), str(path))


def read_if_any(path: Path) -> UpgradeState | None:
    """The state in ``path``, or None when there is none or it cannot be used (dsctl upgrade itself reports a
    broken state file)."""
    if not path.is_file():
        return None
    try:
        return read(path)
    except (OSError, StateError):
        return None


def write(path: Path, state: UpgradeState) -> None:
    """Atomic and durable: an interrupted write or a power cut leaves the old state or the new one."""
    state_files.write_durably(path, state.to_json())


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """The lock beside the state file ``path``, held while the block runs: one upgrade of a fleet at a time
    (`state_files.StateLocked` naming the holder otherwise)."""
    with state_files.exclusive(path.with_name(LOCK_FILE), what):
        yield
