"""The side effects a verb drives, as small protocols: tests and the tuner hand in the real ones (services.runtime).

A progress sink gets dicts: the dsctl_events records of a playbook run (playbooks/callback_plugins/dsctl_events.py)
as they arrive, and the verbs' own records, whose ``event`` key starts with ``dsctl_`` (see the verbs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.adapters.probe_client import Load, RunResult, Target, Timeouts
from dsctl.core.load.probe_metrics import RequestRecord


class ProgressSink(Protocol):
    def __call__(self, event: Mapping[str, Any]) -> None: ...


def no_progress(event: Mapping[str, Any]) -> None:
    """A sink that drops everything (callers that only want the result)."""


class PlaybookRunner(Protocol):
    def run(self, playbook: str, inventory: Path, *, limit: str | None = None, check: bool = False,
            diff: bool = False, tags: str | None = None, forks: int | None = None,
            extra_vars: Mapping[str, Any] | None = None, vault: VaultOptions | None = None,
            on_event: ProgressSink | None = None, artifacts_dir: Path | None = None,
            stop: threading.Event | None = None) -> PlaybookRun:
        """Run one of dsctl's playbooks to the end; KeyboardInterrupt (or ``stop`` set, from another thread) stops
        it and raises KeyboardInterrupt."""
        ...


# Per measured request, after it finished: a reason to stop the whole probe (early stop), or None.
FinishHook = Callable[[RequestRecord], str | None]
# (model, workload index) -> (request body, prompt tokens).
BodyMaker = Callable[[str, int], tuple[bytes, int]]


class Prober(Protocol):
    def probe(self, target: Target, *, path: str, model: str | None, api_key: str | None,
              request_id_header: str | None, timeouts: Timeouts,
              load: Load, warmup: int, body: BodyMaker, backstop: float, on_model: Callable[[str], None],
              on_finish: FinishHook, lag_samples: list[float] | None = None, keep_text: bool = False,
              preflight: Callable[[str], bytes] | None = None) -> tuple[str, RunResult]:
        """Resolve the model (``model`` or the first of /v1/models), call ``on_model``, run the load;
        return (model, result); ``keep_text`` keeps each request's generated text in its record. ``preflight``
        (model -> body): one non-streamed request sent to ``path`` before the load (and its warm-up), its answer in
        ``result.preflight``. Raises DsctlError when the server cannot be used at all."""
        ...

    def prompt_token_counts(self, target: Target, *, api_key: str | None, timeouts: Timeouts,
                            bodies: list[bytes]) -> tuple[list[int] | None, str]:
        """The server's token count of each ``bodies`` entry ({"prompt": ...} or {"messages": [...]}) from its
        ``POST /tokenize`` (vLLM's), as usage.prompt_tokens would count it: (counts, ""), or (None, why not) when
        the server offers no such count (404 from MindIE, the emulated engine, a gateway that routes only /v1)."""
        ...

    def engine_time_scale(self, target: Target, *, api_key: str | None, timeouts: Timeouts) -> float | None:
        """The wall seconds per modelled second of dsctl's emulated engine (the lab), which says so in its
        /version; None for any other server (real vLLM, MindIE, a gateway in front of them), or when it cannot
        be asked."""
        ...
