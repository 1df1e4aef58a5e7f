"""`dsctl tune`'s search loop: the decisions of `dsctl.core.tune.study.Study` run over trial slots, one worker thread
per slot, against the wall clock.

    ask up to N candidates (N = trial slots)  ->  settle the invalid, duplicate and screened-out ones at once  ->
    evaluate each of the others in a worker thread  ->  tell each result as it arrives  ->  until the budget of
    evaluations is spent, the sampler runs out of new candidates, or ``max_wall_s`` has passed.

The evaluator's own failure is a result (an ``error`` trial), never a stop.  A deadline: no trial starts after
``max_wall_s``, and the running ones get as long again to finish before they are told as start timeouts.  Ctrl-C:
the running trials are failed and marked interrupted (a resume evaluates them again), then the KeyboardInterrupt
goes on to the caller.  The design of the search is `dsctl.core.tune.search`'s docstring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from dsctl.adapters.study_journal import journal_storage
from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import Candidate, Evaluator, Failure, Outcome, Screen, SearchResult, SearchSettings
from dsctl.core.tune.space import SearchSpace
from dsctl.core.tune.study import Study


class Search(Study):
    """One controller of a study with its evaluator.  ``run()`` drives it to its budget and returns a
    `SearchResult`.  ``storage``: an Optuna storage, a journal file's path (`journal_storage`), or None (memory)."""

    def __init__(self, space: SearchSpace, slos: Sequence[slo_mod.Slo], evaluator: Evaluator, settings: SearchSettings,
                 *, storage: optuna.storages.BaseStorage | str | None = None, study_name: str = "dsctl-tune",
                 resume: bool = False, screen: Screen | None = None, controller: str = "controller-0",
                 baseline: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                 on_event: Callable[[str, TrialRecord], None] | None = None, clock: Callable[[], float] = time.time):
        if isinstance(storage, str):
            storage = journal_storage(Path(storage))
        super().__init__(space, slos, settings, storage=storage, study_name=study_name, resume=resume, screen=screen,
                         controller=controller, baseline=baseline, context=context, on_event=on_event)
        self.evaluator, self.clock = evaluator, clock

    def _evaluate(self, candidate: Candidate) -> Outcome:
        result = self.evaluator(candidate)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        if not isinstance(result, Outcome):
            raise TypeError(f"the evaluator returned {type(result).__name__}, not an Outcome")
        return result

    def _since(self, started: float) -> float:
        return max(0.0, self.clock() - started)

    def run(self) -> SearchResult:
        settings = self.settings
        deadline = None if settings.max_wall_s is None else self.clock() + settings.max_wall_s
        running: dict[concurrent.futures.Future[Outcome], tuple[optuna.trial.Trial, Candidate, float]] = {}
        free_slots = list(range(settings.slots))
        stopped = "budget spent"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=settings.slots, thread_name_prefix="dsctl-trial")
        try:
            while True:
                out_of_time = deadline is not None and self.clock() >= deadline
                while free_slots and not out_of_time and self.wants_more():
                    proposed = self.propose()
                    if proposed is None:
                        continue
                    trial, candidate = proposed
                    candidate = replace(candidate, slot=free_slots.pop(0))
                    self.start(trial, candidate)
                    running[pool.submit(self._evaluate, candidate)] = (trial, candidate, self.clock())
                if not running:
                    if out_of_time:
                        stopped = "wall-time limit reached"
                    else:
                        stopped = self.out_of_asks() or stopped
                    break
                timeout = None if deadline is None else max(0.0, deadline - self.clock()) + 1.0
                done, _ = concurrent.futures.wait(running, timeout=timeout,
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                if not done and deadline is not None and self.clock() >= deadline + settings.max_wall_s:
                    for future, (trial, candidate, started) in list(running.items()):
                        future.cancel()
                        self.abandon(trial, candidate, self._since(started))
                        running.pop(future)
                    stopped = "wall-time limit reached"
                    break
                for future in done:
                    trial, candidate, started = running[future]
                    try:
                        outcome = future.result()
                    except Exception as crash:  # the evaluator's own failure is a result too, never a stop
                        outcome = Outcome(failure=Failure.ERROR, detail=f"{type(crash).__name__}: {crash}")
                    running.pop(future)
                    free_slots.append(candidate.slot)
                    free_slots.sort()
                    self.finish(trial, candidate, outcome, self._since(started))
        except KeyboardInterrupt:
            self.interrupt(trial for trial, _candidate, _started in running.values())
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return self.result(stopped)


async def _await(awaitable: Any) -> Any:
    return await awaitable
