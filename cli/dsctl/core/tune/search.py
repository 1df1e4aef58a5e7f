"""`dsctl tune`'s search: Optuna's ask/tell over trial slots, with screening, crash classes and resume.

Shape (style.md section 5.7, optuna's seams): the strategy is Optuna's seeded TPE sampler with constraints; the
evaluation is injected (``evaluator(candidate) -> Outcome``: the live tune restarts one instance through deploy's
health gate and probes it, ``--simulate`` and the tests run an offline model); the driver owns the loop
(`dsctl.services.tune_search.Search`)::

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

Where it lives: this module is the search's vocabulary (the failure classes and their log signatures, a
`Candidate`, an `Outcome`, the settings and the result); `dsctl.core.tune.optuna_study` is the Optuna plumbing
(the knobs as distributions, the seeded samplers, a trial's constraint values, the study's fingerprint);
`dsctl.core.tune.study` decides each trial (ask, settle without evaluating, record, tell, refine) with no clock,
thread or file; `dsctl.core.tune.analysis` reads the trials (the counts, the noise-aware best, the baseline's
doubt, the refinement's order); `dsctl.services.tune_search` is the loop (the worker threads, the wall clock);
`dsctl.adapters.study_journal` the journal file and its signal handling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dsctl.core.tune import quality as quality_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.errors import UsageError

CRASH_VIOLATION = 100.0
MAX_SLO_VIOLATION = 10.0  # an SLO missed 10x over is as bad as it gets for steering; a crash is worse
OBJECTIVES = ("capacity", "goodput", "throughput")
STRATEGIES = ("tpe", "random")


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

