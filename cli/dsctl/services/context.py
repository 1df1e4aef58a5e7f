"""The application context on the Typer context (``ctx.obj``): the ports every verb is handed."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsctl.services.ports import PlaybookRunner, Prober
from dsctl.services.runtime import AnsiblePlaybookRunner, HttpProber


@dataclass(frozen=True)
class AppContext:
    runner: PlaybookRunner = field(default_factory=AnsiblePlaybookRunner)
    prober: Prober = field(default_factory=HttpProber)
