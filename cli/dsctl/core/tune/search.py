"""`dsctl tune`'s search: Optuna's ask/tell over trial slots, with screening, crash classes and resume.

Shape (style.md section 5.7, optuna's seams): the strategy is Optuna's seeded TPE sampler with constraints; the
evaluation is injected (``evaluator(candidate) -> Outcome``: the live tune restarts one instance through deploy's
health gate and probes it, ``--simulate`` and the tests run an offline model); the driver owns the loop::

    ask up to N candidates (N = trial slots, one per instance)  ->  check the space's dependencies  ->  screen
    (``screen(candidate) -> reason | None``, e.g. estimate's roofline bound)  ->  evaluate in a worker thread  ->
    tell each result as it arrives  ->  until the budget of evaluations is spent.

Every result is data.  A crash (out_of_memory, aclrtmalloc, graph_capture, start_timeout, bad_flag, error), an
SLO miss and a failed quality guard are told as *complete* trials with positive constraint values (Optuna's
``Trial.set_constraint``, its 5.x replacement for ``constraints_func``; on older releases a ``constraints_func``
reads the same values from the trial's user attributes), so the TPE sampler puts them in its "bad" group and
steers away (SLO-Guard's "crashes as extreme violations", serving-and-tuning.md 6.8 and 13.5).  Constraint
values: an SLO's relative margin (capped at `MAX_SLO_VIOLATION`), `CRASH_VIOLATION` for a crash or an invalid
configuration, the agreement shortfall for quality.  A screened-out or invalid candidate is told infeasible
without being evaluated and counted on its own; so is a duplicate of a configuration already measured (it gets
the earlier result, costs nothing and is never started twice).

Budget: ``budget`` evaluations (restarts) in the whole study, whoever runs them; screened, invalid and duplicate
candidates do not spend it, but asks are bounded too (`SearchSettings.max_asks`).  Waits are bounded by
``max_wall_s``; the evaluator must bound its own waits (deploy's health timeout, the probe's duration).

Resume and sharing: the study lives in an Optuna JournalStorage on a journal file (``JournalFileBackend``, an
append-only log with a file lock), so several controllers (processes) can share one study, and ``resume=True``
continues an interrupted one.  A trial this controller left RUNNING (it was killed) or that Ctrl-C interrupted is
failed and its configuration queued again, so it is evaluated exactly once and nothing is repeated.  The sampler
is reseeded before every ask from (seed, controller, number of trials asked so far): with one slot and a
deterministic evaluator, an interrupted and resumed study asks exactly the candidates an uninterrupted one asks.

Objectives: ``capacity`` (the default): the highest offered rate the candidate sustains while meeting every SLO
(`dsctl.core.tune.capacity`: probes sized for the SLO's percentile, a warm-up, a steady-state window; the
evaluator's rate search gives it as ``Outcome.rate``); ``goodput`` / ``throughput``: request goodput or request
throughput at the rate the metrics were measured at (``--rate``, or the highest that held).

Refinement: the last ``refine_share`` (a quarter) of the budget goes to a local search around the incumbent: each
ask is a configuration one knob's move away from it (`SearchSpace.neighbours`: the other boolean, the adjacent
choice, a step or a factor of 5/4 of a number; a tensor-parallel move takes the per-rank step budget along, so each
NPU's share of a step stays) that no trial has had, in `refinement_order` (the move that continues
the incumbent's climb first, then by what the same move did elsewhere in the run, then every knob once before any
twice; ties in a seeded order), queued with Optuna's
``enqueue_trial`` so screens, duplicates and the budget treat it as any other trial; when the incumbent changes the
search moves with it.  Why: on capacity landscapes the top can be narrow (bench/landscape.py moe-vllm: 10 of 149
feasible configurations within 5 % of the optimum, along max_num_batched_tokens at tensor parallel 2) and TPE at
25 restarts lands near it without climbing onto it; a sampler that only models the space keeps spending restarts
on other regions.  ``refine_share=0`` turns it off (bench/tune.py's random and TPE baselines).

Best: the highest objective among feasible trials.  Where the trials' verdicts carry a noise (capacity: the rate
search's bracket and the repeats' spread, `capacity.relative_noise`), trials are taken in order and a candidate
replaces the incumbent only when it beats it beyond the larger noise (`capacity.beats`); otherwise ties go to the
one with more SLO headroom (the lower binding margin), then to the earlier trial.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import math
import random
import re
import signal
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import FrozenTrial, TrialState

from dsctl.core.tune import capacity as capacity_mod
from dsctl.core.tune import quality as quality_mod
from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.space import Knob, SearchSpace, comparable, differing
from dsctl.errors import UsageError

CRASH_VIOLATION = 100.0
MAX_SLO_VIOLATION = 10.0  # an SLO missed 10x over is as bad as it gets for steering; a crash is worse
OBJECTIVES = ("capacity", "goodput", "throughput")
STRATEGIES = ("tpe", "random")
_ATTR = "dsctl"  # the user attribute holding a trial's record


class Failure(StrEnum):
    """Why a candidate is infeasible; recorded with every trial."""

    OUT_OF_MEMORY = "out_of_memory"
    ACLRTMALLOC = "aclrtmalloc"
    GRAPH_CAPTURE = "graph_capture"
    START_TIMEOUT = "start_timeout"
    BAD_FLAG = "bad_flag"
    SLO_MISS = "slo_miss"
    QUALITY = "quality"
    SCREENED = "screened"
    INVALID = "invalid"
    # no verdict: the load generator, not the instance, was the limit of its probes (`rate_search.measured`);
    # hidden from the sampler (it learned nothing of the configuration), never ranked
    UNMEASURED = "unmeasured"
    ERROR = "error"  # the engine (or the evaluator) failed in a way no pattern names


CRASHES = frozenset({Failure.OUT_OF_MEMORY, Failure.ACLRTMALLOC, Failure.GRAPH_CAPTURE, Failure.START_TIMEOUT,
                     Failure.BAD_FLAG, Failure.ERROR})

# Log signatures, checked in this order (the aclrtMalloc lines also say "NPU out of memory").  Sources:
# serving-and-tuning.md 9.2 and 11 (vllm-ascend FAQ #12, #17), field-practice.md ("aclrtMalloc failed",
# ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED), vLLM's own start-up words (No available memory for the cache blocks,
# argparse's "unrecognized arguments").
FAILURE_PATTERNS: tuple[tuple[Failure, re.Pattern[str]], ...] = (
    (Failure.ACLRTMALLOC, re.compile(r"aclrtMalloc failed|ACL_ERROR_RT_MEMORY_ALLOCATION", re.I)),
    (Failure.GRAPH_CAPTURE, re.compile(r"error code is 207008|AclmdlRICaptureBegin|graph capture failed", re.I)),
    (Failure.OUT_OF_MEMORY, re.compile(r"out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                                       r"larger than the available KV cache memory", re.I)),
    (Failure.BAD_FLAG, re.compile(r"unrecognized arguments|error: argument |invalid choice|"
                                  r"cannot be converted to|unknown .* parameter", re.I)),
    (Failure.START_TIMEOUT, re.compile(r"not ready after|timed out waiting|start(?:-up)? timeout", re.I)),
)


def classify_failure(text: str, *, timed_out: bool = False) -> Failure:
    """The failure class of an engine that did not start or died under load, from its last log lines."""
    for failure, pattern in FAILURE_PATTERNS:
        if pattern.search(text or ""):
            return failure
    return Failure.START_TIMEOUT if timed_out else Failure.ERROR


@dataclass(frozen=True)
class Candidate:
    """One configuration to evaluate: what the evaluator deploys on its slot."""

    number: int  # the Optuna trial number
    config: dict[str, Any]  # knob -> value
    params: dict[str, Any]  # engine parameters (registry names)
    fields: dict[str, Any]  # service fields (tensor/data parallel size)
    needs_quality: bool  # a lossy knob differs from the baseline: measure agreement
    slot: int = -1  # which trial slot runs it (set by the driver)


@dataclass(frozen=True)
class Outcome:
    """What an evaluation found.  ``failure`` for a crash (metrics may be missing); otherwise ``metrics`` is a
    `probe_metrics.calculate_metrics` summary.  ``objective`` overrides the value taken from the metrics (e.g. the
    highest SLO-holding rate of a rate search).  ``agreement`` is the quality guard's measurement (lossy
    candidates).  ``data`` is recorded as is (versions, env, log tail)."""

    metrics: Mapping[str, Any] | None = None
    failure: Failure | None = None
    detail: str = ""
    objective: float | None = None
    rate: float | None = None
    agreement: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


class Ruled(str):
    """A screen's reason that is arithmetic, not a prediction (the engine's memory check: weights, KV cache, a
    step's activations against HBM): the sampler is told it as an infeasible trial with constraint value
    ``violation``, as the restart would have ended, so it learns the region.  A plain reason is a prediction and is
    kept from the sampler (see `Search._tell`)."""

    violation: float

    def __new__(cls, text: str, violation: float = 0.0) -> Ruled:
        ruled = super().__new__(cls, text)
        ruled.violation = violation
        return ruled


Evaluator = Callable[[Candidate], Any]  # returns an Outcome, or an awaitable of one
Screen = Callable[[Candidate], str | None]  # a reason (str, or `Ruled`) or None


@dataclass(frozen=True)
class SearchSettings:
    budget: int  # evaluations (restarts) in the study
    slots: int = 1  # candidates evaluated at once
    seed: int = 0
    objective: str = "capacity"
    n_startup_trials: int | None = None  # random trials before TPE models; default max(4, min(10, budget // 3))
    max_asks: int | None = None  # default 20 x budget + 100
    max_wall_s: float | None = None  # stop asking after this; running trials get the same again to finish
    min_agreement: float = quality_mod.DEFAULT_MIN_AGREEMENT
    npus_per_instance: int = 1
    strategy: str = "tpe"  # or "random": seeded uniform sampling, the baseline the benchmark compares with
    refine_share: float = 0.25  # the budget's last share: neighbours of the incumbent (see "Refinement"); 0: none

    def check(self) -> None:
        if self.budget < 1:
            raise UsageError(f"--budget must be at least 1, got {self.budget}")
        if self.slots < 1:
            raise UsageError(f"trial slots must be at least 1, got {self.slots}")
        if self.objective not in OBJECTIVES:
            raise UsageError(f"--objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"search strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if not 0 <= self.min_agreement <= 1:
            raise UsageError(f"--min-agreement must be in [0, 1], got {self.min_agreement}")
        if not 0 <= self.refine_share < 1:
            raise ValueError(f"refine_share must be in [0, 1), got {self.refine_share}")


@dataclass
class SearchResult:
    trials: list[TrialRecord]  # every finished trial of the study, by number
    best: TrialRecord | None
    counts: dict[str, int]
    stopped: str  # why the loop ended
    study_name: str

    @property
    def closest(self) -> TrialRecord | None:
        """With no feasible trial: the evaluated one nearest to feasibility (smallest binding margin)."""
        measured = [t for t in self.trials if t.evaluated and t.margin is not None and t.failure not in CRASHES]
        return min(measured, key=lambda t: (t.margin, t.number)) if measured else None


# --------------------------------------------------------------------------- optuna plumbing


def distribution(knob: Knob) -> BaseDistribution:
    if knob.kind == "bool":
        return CategoricalDistribution([False, True])
    if knob.kind == "categorical":
        return CategoricalDistribution(list(knob.choices))
    if knob.kind == "int":
        return IntDistribution(int(knob.low), int(knob.high), log=knob.log,
                               step=1 if knob.log else int(knob.step or 1))
    return FloatDistribution(float(knob.low), float(knob.high), log=knob.log,
                             step=None if knob.log else knob.step)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {knob.name: distribution(knob) for knob in space.knobs}


def _constraints_from_attrs(trial: FrozenTrial) -> Sequence[float]:
    """For Optuna releases without Trial.set_constraint: the constraint values the driver stored."""
    record = trial.user_attrs.get(_ATTR) or {}
    return list((record.get("constraints") or {"none": 0.0}).values())


_HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")


def _sampler(seed: int, n_startup: int, strategy: str = "tpe") -> optuna.samplers.BaseSampler:
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate / constant_liar are marked experimental
        kwargs: dict[str, Any] = {} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_from_attrs}
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=True,
                                          constant_liar=True, **kwargs)


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


def _fingerprint(space: SearchSpace, slos: Sequence[slo_mod.Slo], objective: str) -> str:
    """What a study is about; a resume must not change it."""
    body = {"space": [k.to_dict() for k in space.knobs], "constraints": [c.text for c in space.constraints],
            "slos": [s.label for s in slos], "objective": objective, "engine": space.engine}
    return json.dumps(body, sort_keys=True, default=str)


# --------------------------------------------------------------------------- the driver


class Search:
    """One controller of a study.  ``run()`` drives it to its budget and returns a `SearchResult`."""

    def __init__(self, space: SearchSpace, slos: Sequence[slo_mod.Slo], evaluator: Evaluator, settings: SearchSettings,
                 *, storage: optuna.storages.BaseStorage | str | None = None, study_name: str = "dsctl-tune",
                 resume: bool = False, screen: Screen | None = None, controller: str = "controller-0",
                 baseline: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                 on_event: Callable[[str, TrialRecord], None] | None = None, clock: Callable[[], float] = time.time):
        settings.check()
        if not space.knobs:
            raise UsageError(f"tune space {space.name} has no knob to search; add one with --param name=lo:hi")
        if not slos:
            raise UsageError("tune needs at least one --slo")
        self.space, self.slos, self.evaluator, self.settings = space, tuple(slos), evaluator, settings
        self.screen, self.controller, self.on_event, self.clock = screen, controller, on_event, clock
        self.context = dict(context or {})  # versions, env: recorded with every trial
        self.baseline = {k: v for k, v in (baseline or {}).items()
                         if k in space.names and space.knob(k).contains(v)}
        self.dists = distributions(space)
        self.n_startup = settings.n_startup_trials or max(4, min(10, settings.budget // 3))
        self.max_asks = settings.max_asks or 20 * settings.budget + 100
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        fingerprint = _fingerprint(space, slos, settings.objective)
        if isinstance(storage, str):
            storage = journal_storage(Path(storage))
        existing = optuna.study.get_all_study_names(storage) if storage is not None else []
        if study_name in existing and not resume:
            raise UsageError(f"study {study_name!r} already exists in the journal; pass --resume to continue it "
                             "or use another run directory")
        if resume and study_name not in existing:
            raise UsageError(f"--resume: no study {study_name!r} in the journal; start a new tune without --resume")
        self.study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                         load_if_exists=resume,
                                         sampler=_sampler(settings.seed, self.n_startup, settings.strategy))
        if resume:
            if self.study.user_attrs.get("fingerprint") != fingerprint:
                raise UsageError("--resume: the study was started with another space, SLO or objective; resume with "
                                 "the same options or start a new run directory")
            self._reclaim()
        else:
            self.study.set_user_attr("fingerprint", fingerprint)
            if self.baseline:
                self.study.enqueue_trial(dict(self.baseline), user_attrs={"dsctl_origin": "baseline"})
        self.asks = 0

    # ------------------------------------------------------------------ study bookkeeping

    def _records(self) -> list[TrialRecord]:
        out = []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            raw = trial.user_attrs.get(_ATTR)
            if raw is not None:
                out.append(TrialRecord.from_dict(raw))
        return sorted(out, key=lambda record: record.number)

    def _spent(self) -> int:
        """Evaluations finished or running in the whole study (every controller)."""
        spent = 0
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING,
                                                                   TrialState.FAIL)):
            if trial.state == TrialState.RUNNING:
                spent += trial.user_attrs.get("dsctl_evaluating", False)
            else:
                spent += bool((trial.user_attrs.get(_ATTR) or {}).get("evaluated"))
        return spent

    def _asked_so_far(self) -> int:
        """Trials asked in the study, minus those interrupted (their retry takes their place)."""
        return sum(1 for trial in self.study.get_trials(deepcopy=False)
                   if trial.state != TrialState.WAITING and not trial.user_attrs.get("dsctl_interrupted"))

    def _reclaim(self) -> None:
        """Fail the trials this controller left running when it was killed, and queue their configurations again
        (also those Ctrl-C interrupted) unless a retry is already queued or done."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {trial.user_attrs.get("dsctl_retry_of") for trial in trials}
        for trial in trials:
            mine = trial.user_attrs.get("dsctl_controller") == self.controller
            if trial.state == TrialState.RUNNING and mine:
                optuna.trial.Trial(self.study, trial._trial_id).set_user_attr("dsctl_interrupted", True)
                self.study.tell(trial.number, state=TrialState.FAIL)
            elif not (trial.state == TrialState.FAIL and trial.user_attrs.get("dsctl_interrupted") and mine):
                continue
            if trial.number not in retried and trial.params:
                self.study.enqueue_trial(dict(trial.params), user_attrs={"dsctl_retry_of": trial.number})

    # ------------------------------------------------------------------ one trial

    def _ask(self) -> tuple[optuna.trial.Trial, Candidate]:
        index = self._asked_so_far()
        seed = zlib.crc32(f"{self.settings.seed}:{self.controller}:{index}".encode()) & 0x7FFFFFFF
        self.study.sampler = _sampler(seed, self.n_startup, self.settings.strategy)
        trial = self.study.ask(self.dists)
        trial.set_user_attr("dsctl_controller", self.controller)
        self.asks += 1
        config = {name: self.space.knob(name).snap(trial.params[name]) for name in self.space.names}
        lossy = [name for name in self.space.lossy if not self._same_value(name, config)]
        candidate = Candidate(number=trial.number, config=config, params=self.space.params(config),
                              fields=self.space.fields(config), needs_quality=bool(lossy))
        return trial, candidate

    def _same_value(self, name: str, config: Mapping[str, Any]) -> bool:
        if name not in self.baseline:
            return False
        return comparable(config[name]) == comparable(self.baseline[name])

    def _duplicate_of(self, candidate: Candidate) -> FrozenTrial | None:
        """An earlier evaluated (or running) trial that deploys the same parameters and fields."""
        target = {**candidate.params, **candidate.fields}
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            if trial.number == candidate.number:
                continue
            record = trial.user_attrs.get(_ATTR)
            if trial.state == TrialState.RUNNING:
                if not trial.user_attrs.get("dsctl_evaluating"):
                    continue
                params = trial.user_attrs.get("dsctl_deploys") or {}
            elif record is None or not record.get("evaluated"):
                continue
            else:
                params = {**record["params"], **record["fields"]}
            if differing(params, target) == []:
                return trial
        return None

    def _record(self, candidate: Candidate, *, evaluated: bool, failure: Failure | None, detail: str = "",
                outcome: Outcome | None = None, started: float | None = None) -> TrialRecord:
        metrics = dict(outcome.metrics) if outcome is not None and outcome.metrics is not None else None
        verdict = slo_mod.judge(self.slos, metrics) if metrics is not None else None
        constraints: dict[str, float] = {}
        objective = None
        margin = verdict.margin if verdict is not None else None
        if verdict is not None:
            constraints.update({key: min(value, MAX_SLO_VIOLATION) for key, value in verdict.margins().items()})
            constraints["sustained"] = 0.0
            objective = self._objective(outcome, metrics)
            if failure is None and not verdict.met:
                failure, detail = Failure.SLO_MISS, verdict.line
            elif failure is None:
                probe = capacity_mod.judge_probe(self.slos, metrics)
                if not probe.met:  # the SLO statistics held, but over a window the instance did not sustain
                    failure, detail = Failure.SLO_MISS, probe.detail
                    constraints["sustained"] = min(probe.margin, MAX_SLO_VIOLATION)
                    margin = probe.margin
        agreement = outcome.agreement if outcome is not None else None
        if failure is None and candidate.needs_quality:
            if agreement is None:
                failure, detail = Failure.QUALITY, "a lossy knob changed but no output agreement was measured"
            elif agreement < self.settings.min_agreement:
                failure = Failure.QUALITY
                detail = (f"greedy outputs agree {agreement:.3f} with the baseline's, below --min-agreement "
                          f"{self.settings.min_agreement:g}")
        if failure in CRASHES or failure == Failure.INVALID:
            constraints["failure"] = CRASH_VIOLATION
        elif failure == Failure.SCREENED:
            constraints["failure"] = MAX_SLO_VIOLATION
        else:
            constraints["failure"] = 0.0
        if candidate.needs_quality and agreement is not None:
            constraints["quality"] = max(0.0, self.settings.min_agreement - agreement)
        finished = self.clock()
        return TrialRecord(
            number=candidate.number, controller=self.controller, config=candidate.config, params=candidate.params,
            fields=candidate.fields, evaluated=evaluated, feasible=failure is None, failure=failure.value if failure
            else None, detail=detail, objective_name=self.settings.objective, objective=objective,
            margin=margin,
            binding=verdict.binding.slo.key if verdict is not None else None,
            slo_values=verdict.values() if verdict is not None else {}, constraints=constraints, metrics=metrics,
            rate=outcome.rate if outcome is not None else None, agreement=agreement,
            npus=self.settings.npus_per_instance, slot=candidate.slot,
            capacity=_capacity(outcome, self.settings.npus_per_instance),
            duration_s=None if started is None else max(0.0, finished - started),
            context={**self.context, **(dict(outcome.data) if outcome is not None else {})})

    def _objective(self, outcome: Outcome, metrics: Mapping[str, Any]) -> float:
        if outcome.objective is not None:
            return float(outcome.objective)
        if self.settings.objective == "capacity":
            return float(outcome.rate or 0.0)  # the highest rate that held (sustained, SLO met)
        key = "request_goodput" if self.settings.objective == "goodput" else "request_throughput"
        value = metrics.get(key)
        if value is None and key == "request_goodput":
            # SLOs with no per-request form (itl, error_rate: vLLM's --goodput takes ttft, tpot and e2el only) give
            # the probe no goodput bounds; the run's SLO verdict is on its aggregate statistics, so every completed
            # request of a run that meets them counts: goodput is the completed-request throughput.
            value = metrics.get("request_throughput")
        return float(value or 0.0)

    def _tell(self, trial: optuna.trial.Trial, record: TrialRecord, *, ruled: bool = False) -> None:
        trial.set_user_attr(_ATTR, record.to_dict())
        if record.failure == Failure.UNMEASURED or (not ruled and not record.evaluated
                                                    and record.failure in (Failure.SCREENED, Failure.INVALID)):
            # Kept as a record, hidden from the sampler (Optuna's TPE skips FAIL trials): told as complete
            # infeasible trials (at MAX_SLO_VIOLATION, below a crash's) predictions formed the "least bad" group
            # whenever no evaluated trial had finished yet (several slots running), and TPE then kept proposing
            # more of them.  A `Ruled` reason is told, at the violation of the crash it predicts: hidden, TPE asked
            # for 198 configurations the memory check ruled out in one 25-restart run (bench/tune.py long-fixed),
            # spent the screen's consultations and then restarted into the same out-of-memory region.  An unmeasured
            # trial is hidden too: its probes measured the load generator, not the configuration.
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            if _HAS_SET_CONSTRAINT:
                for key, value in record.constraints.items():
                    trial.set_constraint(key, value)
            self.study.tell(trial, values=record.objective if record.objective is not None else 0.0)
        if self.on_event is not None:
            self.on_event("told", record)

    def _told_copy(self, trial: optuna.trial.Trial, candidate: Candidate, original: FrozenTrial) -> None:
        raw = dict(original.user_attrs[_ATTR])
        record = TrialRecord.from_dict({**raw, "number": candidate.number, "controller": self.controller,
                                        "config": candidate.config, "evaluated": False, "duplicate_of":
                                        original.number, "slot": -1, "duration_s": 0.0})
        self._tell(trial, record)

    # ------------------------------------------------------------------ the loop

    def _evaluate(self, candidate: Candidate) -> Outcome:
        result = self.evaluator(candidate)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        if not isinstance(result, Outcome):
            raise TypeError(f"the evaluator returned {type(result).__name__}, not an Outcome")
        return result

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
                while (free_slots and not out_of_time and self._spent() < settings.budget
                       and self.asks < self.max_asks):
                    if self._refining():
                        self._enqueue_neighbour()
                    trial, candidate = self._ask()
                    if self._settle_without_evaluating(trial, candidate):
                        continue
                    slot = free_slots.pop(0)
                    candidate = replace(candidate, slot=slot)
                    trial.set_user_attr("dsctl_evaluating", True)
                    trial.set_user_attr("dsctl_deploys", {**candidate.params, **candidate.fields})
                    if self.on_event is not None:
                        self.on_event("started", self._record(candidate, evaluated=False, failure=None,
                                                             detail="running"))
                    running[pool.submit(self._evaluate, candidate)] = (trial, candidate, self.clock())
                if not running:
                    if out_of_time:
                        stopped = "wall-time limit reached"
                    elif self.asks >= self.max_asks and self._spent() < settings.budget:
                        stopped = (f"{self.asks} candidates asked and the sampler keeps proposing configurations "
                                   "already measured or ruled out")
                    break
                timeout = None if deadline is None else max(0.0, deadline - self.clock()) + 1.0
                done, _ = concurrent.futures.wait(running, timeout=timeout,
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                if not done and deadline is not None and self.clock() >= deadline + settings.max_wall_s:
                    for future, (trial, candidate, started) in list(running.items()):
                        future.cancel()
                        self._tell(trial, self._record(candidate, evaluated=True, failure=Failure.START_TIMEOUT,
                                                       detail="the evaluation did not return before the deadline",
                                                       started=started))
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
                    self._tell(trial, self._record(candidate, evaluated=True, failure=outcome.failure,
                                                   detail=outcome.detail, outcome=outcome, started=started))
        except KeyboardInterrupt:
            for trial, _candidate, _started in running.values():
                trial.set_user_attr("dsctl_interrupted", True)
                self.study.tell(trial, state=TrialState.FAIL)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return self.result(stopped)

    def _refining(self) -> bool:
        """Whether the run is in its refinement share: the last ``refine_share`` of the budget, once the sampler's
        random start-up is done."""
        share = self.settings.refine_share
        if share <= 0:
            return False
        spent = self._spent()
        return spent >= max(self.n_startup, self.settings.budget - math.ceil(share * self.settings.budget))

    def _enqueue_neighbour(self) -> None:
        """Queue one configuration a knob's move away from the incumbent (`SearchSpace.neighbours`) that no trial
        has had yet and the space allows, in `refinement_order`; nothing when one is queued already or every
        neighbour was tried (the sampler asks as before)."""
        trials = self.study.get_trials(deepcopy=False)
        if any(trial.state == TrialState.WAITING for trial in trials):
            return
        records = self._records()
        incumbent = best_trial(records)
        if incumbent is None:
            return
        tried = [trial.params for trial in trials if trial.params]
        base = {name: incumbent.config[name] for name in self.space.names if name in incumbent.config}
        moves = [move for move in self.space.neighbours(base)
                 if not self.space.violations(move) and not any(differing(move, params) == [] for params in tried)]
        if not moves:
            return
        asked = self._asked_so_far()  # as _ask's reseeding: an interrupted and resumed study queues the same moves
        order = random.Random(zlib.crc32(f"{self.settings.seed}:{self.controller}:refine:{asked}".encode()))
        order.shuffle(moves)
        measured = [r for r in records if r.evaluated and r.duplicate_of is None]
        first = refinement_order(incumbent, base, moves, measured, self.space.moved_knob, self.space.switches)[0]
        self.study.enqueue_trial(first, user_attrs={"dsctl_origin": "refine"})

    def _settle_without_evaluating(self, trial: optuna.trial.Trial, candidate: Candidate) -> bool:
        """Tell an invalid, duplicate or screened-out candidate at once; True when it was."""
        problems = self.space.violations(candidate.config)
        if problems:
            self._tell(trial, self._record(candidate, evaluated=False, failure=Failure.INVALID,
                                           detail="; ".join(problems)))
            return True
        original = self._duplicate_of(candidate)
        if original is not None:
            if original.state == TrialState.RUNNING:
                record = self._record(candidate, evaluated=False, failure=Failure.INVALID,
                                      detail=f"same deployment as trial {original.number}, still running")
                record.duplicate_of = original.number
                record.constraints["failure"] = 0.0  # not a bad configuration: only a busy one
                self._tell(trial, record)
            else:
                self._told_copy(trial, candidate, original)
            return True
        reason = self.screen(candidate) if self.screen is not None else None
        if reason:
            record = self._record(candidate, evaluated=False, failure=Failure.SCREENED, detail=str(reason))
            ruled = isinstance(reason, Ruled)
            if ruled:
                record.constraints["failure"] = reason.violation
            self._tell(trial, record, ruled=ruled)
            return True
        return False

    def result(self, stopped: str = "") -> SearchResult:
        records = self._records()
        return SearchResult(trials=records, best=best_trial(records), counts=count(records), stopped=stopped,
                            study_name=self.study.study_name)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _capacity(outcome: Outcome | None, npus: int) -> dict[str, Any] | None:
    """The rate search's capacity summary (`rate_search.capacity_summary`) with the rate per NPU."""
    raw = (outcome.data.get("capacity") if outcome is not None else None) or None
    if raw is None:
        return None
    rate = raw.get("sustained_rate")
    return {**raw, "npus": npus, "per_npu": None if rate is None else rate / max(1, npus)}


def _noise(record: TrialRecord) -> float:
    return float((record.capacity or {}).get("noise") or 0.0)


def standing(records: Sequence[TrialRecord]) -> tuple[dict[str, int], TrialRecord | None]:
    """A run so far, as its progress shows it after each trial: the counts and the incumbent the result will name
    (`best_trial`: with noisy verdicts a later trial wins only beyond the noise, so not simply the top figure)."""
    return count(records), best_trial(records)


def best_trial(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The highest objective among feasible evaluated trials; with noisy verdicts a later trial replaces the
    incumbent only beyond the noise; without, ties go to the lower binding margin, then the earlier trial."""
    feasible = [r for r in records if r.feasible and r.evaluated and r.objective is not None]
    if not feasible:
        return None
    if any(_noise(r) > 0 for r in feasible):
        incumbent = None
        for record in sorted(feasible, key=lambda r: r.number):
            if incumbent is None or capacity_mod.beats(record.objective, _noise(record), incumbent.objective,
                                                       _noise(incumbent)):
                incumbent = record
        return incumbent
    top = max(r.objective for r in feasible)
    tied = [r for r in feasible if math.isclose(r.objective, top, rel_tol=1e-9, abs_tol=1e-12)]
    return min(tied, key=lambda r: (r.margin if r.margin is not None else 0.0, r.number))


def baseline_doubt(baseline: TrialRecord | None) -> str | None:
    """Why no winner may be declared over ``baseline`` (the inventory's own configuration, the trial the winner
    is measured against), or None: its trial is unmeasured (the load generator was the limit of its probes), or
    the probe its capacity rests on was undersized (fewer measured requests than the sample-size rule asks,
    `capacity.SteadyState.undersized`): a candidate "beating" such a figure beats the controller's, not the
    instance's (issue 42: a winner declared at 3.67 req/s over a baseline probe of 809 of 1,000 samples, 3.08)."""
    if baseline is None:
        return None
    if baseline.failure == Failure.UNMEASURED:
        return f"the baseline (trial {baseline.number}) is unmeasured: {baseline.detail}"
    cap = baseline.capacity or {}
    if baseline.feasible and cap.get("undersized"):
        return (f"the baseline's (trial {baseline.number}) capacity rests on an undersized probe: {cap.get('samples')} "
                f"measured requests of the {cap.get('required')} its SLO statistics need")
    return None


def refinement_order(incumbent: TrialRecord, base: Mapping[str, Any], moves: Sequence[Mapping[str, Any]],
                     measured: Sequence[TrialRecord],
                     moved: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None],
                     switches: Collection[str] = ()) -> list[Mapping[str, Any]]:
    """``moves`` (one knob's move each from ``base``, the ``incumbent``'s configuration; ``moved`` names a move's
    knob, the space's `SearchSpace.moved_knob`, which knows its layout moves; ``switches``, the space's
    `SearchSpace.switches`) in the order the refinement tries them
    (stable: ties keep the given order, a seeded shuffle):

    1. a numeric move that goes on in the direction the incumbent came from: a measured configuration that differs
       from ``base`` in that knob only, is older than the incumbent and worse (the climb's last step;
       compass search's "keep going while it improves");
    2. then by what the run has seen the same move do elsewhere (`move_evidence`: two measured configurations that
       differ in that knob alone, changed in the move's direction; the latest such pair): a move that gained, then
       one never seen (a switch's before a number's), then one that changed nothing, then one that lost;
    3. then the knobs the fewest measured configurations have moved alone from ``base``: every knob once before
       any twice.

    Why (bench/tune.py moe-vllm, 8 knobs): in a uniform order over *moves*, gpu_memory_utilization (four moves),
    max_num_seqs and prefix caching, all flat there, took four of a seed's seven refinement restarts, and the move
    that gained most (the shared-expert overlap on, +3 %) was never tried; a move that changed nothing tells that
    the top is flat along that knob here.  Measured over 5 seeds at 25 restarts (three-seed figures): moe-vllm's
    worst seed 89.4 -> 93.3 % of the optimum (median 95.9 % both), chat-fixed unchanged (99.5 / 96.6 %).  With 2.:
    once the incumbent moved, its counts (3.) started again from zero and the same flat or losing moves (the
    memory fraction, eager mode) were tried again from the new incumbent, two of a seed's seven; with it moe-vllm
    went from 95.5 / 93.5 % (median / worst seed, nine-seed top figures) to 99.2 / 93.5 %, long-fixed (100 / 100 %)
    and chat-fixed (99.5 / 96.6 %) unchanged.  Switches before numbers among the unseen: one move tells all a
    boolean does, and the switches set how the engine runs (graph mode, the shared-expert stream, the TP layout)
    where a number sets how much; on moe-long (8K-32K prompts, a MoE) the seeds that missed the top had spent the
    refinement on max_num_seqs and the memory fraction and never turned the overlap on or moved to TP 1, where
    the top is (see README, "What changed", for the figures)."""
    def along(name: str) -> list[TrialRecord]:
        return [r for r in measured if r.number != incumbent.number and name in r.config
                and moved(base, r.config) == name]

    def key(move: Mapping[str, Any]) -> tuple[int, int, int, int]:
        name = moved(base, move)
        assert name is not None, "a refinement move changes one knob"
        earlier = along(name)
        value = move[name]
        continues = _numeric(value) and any(
            r.number < incumbent.number and (not r.feasible or (r.objective or 0.0) < (incumbent.objective or 0.0))
            and (value - base[name]) * (base[name] - r.config[name]) > 0 for r in earlier)
        seen = move_evidence(name, base[name], value, pairs)
        rank = {1: 0, None: 1, 0: 2, -1: 3}[seen]
        return (0 if continues else 1, rank, 0 if seen is None and name in switches else 1, len(earlier))

    pairs = one_knob_pairs(measured)
    return sorted(moves, key=key)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _gain(before: TrialRecord, after: TrialRecord) -> int | None:
    """+1 when ``after`` beats ``before`` beyond the noise (or holds where ``before`` failed), -1 the reverse,
    0 neither; None when both failed (nothing learnt about the move)."""
    held_before = before.feasible and before.objective is not None
    held_after = after.feasible and after.objective is not None
    if not held_before and not held_after:
        return None
    if held_before != held_after:
        return 1 if held_after else -1
    if capacity_mod.beats(after.objective, _noise(after), before.objective, _noise(before)):  # type: ignore[arg-type]
        return 1
    if capacity_mod.beats(before.objective, _noise(before), after.objective, _noise(after)):  # type: ignore[arg-type]
        return -1
    return 0


Pairs = Mapping[str, Sequence[tuple[tuple[int, int], TrialRecord, TrialRecord]]]


def one_knob_pairs(measured: Sequence[TrialRecord]) -> Pairs:
    """Every pair of ``measured`` configurations that differ in one knob alone, by that knob, each with its
    positions (i < j) in ``measured``.  Grouped by the rest of the configuration, so the cost is trials x knobs
    plus the pairs themselves, not a comparison of every pair per move: `refinement_order` runs once per
    refinement ask, and at ``--budget 1000`` an all-pairs scan per move was ~8 M comparisons per ask."""
    pairs: dict[str, list[tuple[tuple[int, int], TrialRecord, TrialRecord]]] = {}
    names = sorted({name for record in measured for name in record.config})
    for name in names:
        lines: dict[tuple, list[int]] = {}
        for position, record in enumerate(measured):
            if name in record.config:
                rest = tuple((k, comparable(v)) for k, v in sorted(record.config.items()) if k != name)
                lines.setdefault(rest, []).append(position)
        for line in lines.values():
            for n, i in enumerate(line):
                for j in line[n + 1:]:
                    first, second = measured[i], measured[j]
                    if comparable(first.config[name]) != comparable(second.config[name]):
                        pairs.setdefault(name, []).append(((i, j), first, second))
    return pairs


def move_evidence(name: str, start: Any, end: Any, pairs: Pairs) -> int | None:
    """What moving ``name`` from ``start`` to ``end`` did elsewhere in the run: `_gain` of the latest pair of
    measured configurations that differ in ``name`` alone (``pairs``: `one_knob_pairs`), taken in the move's
    direction (a number: up or down; otherwise from ``start``'s value to ``end``'s); None when no pair moved it
    so.  Of pairs equally late, the one earliest in the measured order."""
    latest: tuple[tuple[int, int, int], int | None] | None = None
    for (i, j), first, second in pairs.get(name, ()):
        a, b = first.config[name], second.config[name]
        if _numeric(end) and _numeric(a) and _numeric(b):
            before, after = (first, second) if (b - a) * (end - start) > 0 else (second, first)
        elif comparable(a) == comparable(start) and comparable(b) == comparable(end):
            before, after = first, second
        elif comparable(b) == comparable(start) and comparable(a) == comparable(end):
            before, after = second, first
        else:
            continue
        order = (-max(first.number, second.number), i, j)
        if latest is None or order < latest[0]:
            latest = (order, _gain(before, after))
    return None if latest is None else latest[1]


def count(records: Sequence[TrialRecord]) -> dict[str, int]:
    """Trials by what happened to them: evaluated (restarts), feasible, each failure class, duplicates."""
    counts = {"evaluated": 0, "feasible": 0, "crashed": 0, "duplicate": 0}
    counts.update({failure.value: 0 for failure in Failure})
    for record in records:
        if record.duplicate_of is not None:
            counts["duplicate"] += 1
            continue
        counts["evaluated"] += record.evaluated
        counts["feasible"] += record.feasible and record.evaluated
        if record.failure is not None:
            counts[record.failure] += 1
            counts["crashed"] += record.failure in CRASHES
    return counts
