"""`dsctl tune`'s search, the decisions of one controller of a study (`Study`): ask the sampler (reseeded per ask,
so a resumed study asks what an uninterrupted one would), settle a candidate without an evaluation (invalid, a
duplicate of a configuration measured, screened out), record an outcome (the SLO verdict, the objective, the
constraint values) and tell it, refine around the incumbent in the last share of the budget, reclaim the trials a
killed controller left running.  The design is `dsctl.core.tune.search`'s docstring; the loop that evaluates the
candidates (worker threads, the wall clock) is `dsctl.services.tune_search.Search`.

No clock, thread, signal or file here: the storage is handed in (`dsctl.adapters.study_journal` for a journal
file; None: in memory) and a trial's duration is the loop's.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dsctl.core.tune import capacity as capacity_mod
from dsctl.core.tune import optuna_study
from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.analysis import best_trial, count, refinement_order
from dsctl.core.tune.optuna_study import ATTR, HAS_SET_CONSTRAINT
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import (
    CRASH_VIOLATION,
    CRASHES,
    MAX_SLO_VIOLATION,
    Candidate,
    Failure,
    Outcome,
    Ruled,
    Screen,
    SearchResult,
    SearchSettings,
)
from dsctl.core.tune.space import SearchSpace, comparable, differing
from dsctl.errors import UsageError


class Study:
    """One controller of a study, every decision of it: what to ask, what to settle without an evaluation, how an
    outcome is recorded and told, when to refine.  The loop that runs the evaluations (worker threads, the wall
    clock) is `dsctl.services.tune_search.Search`, which drives one of these."""

    def __init__(self, space: SearchSpace, slos: Sequence[slo_mod.Slo], settings: SearchSettings,
                 *, storage: optuna.storages.BaseStorage | None = None, study_name: str = "dsctl-tune",
                 resume: bool = False, screen: Screen | None = None, controller: str = "controller-0",
                 baseline: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                 on_event: Callable[[str, TrialRecord], None] | None = None):
        settings.check()
        if not space.knobs:
            raise UsageError(f"tune space {space.name} has no knob to search; add one with --param name=lo:hi")
        if not slos:
            raise UsageError("tune needs at least one --slo")
        self.space, self.slos, self.settings = space, tuple(slos), settings
        self.screen, self.controller, self.on_event = screen, controller, on_event
        self.context = dict(context or {})  # versions, env: recorded with every trial
        self.baseline = {k: v for k, v in (baseline or {}).items()
                         if k in space.names and space.knob(k).contains(v)}
        self.dists = optuna_study.distributions(space)
        self.n_startup = settings.n_startup_trials or max(4, min(10, settings.budget // 3))
        self.max_asks = settings.max_asks or 20 * settings.budget + 100
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        fingerprint = optuna_study.fingerprint(space, slos, settings.objective)
        existing = optuna.study.get_all_study_names(storage) if storage is not None else []
        if study_name in existing and not resume:
            raise UsageError(f"study {study_name!r} already exists in the journal; pass --resume to continue it "
                             "or use another run directory")
        if resume and study_name not in existing:
            raise UsageError(f"--resume: no study {study_name!r} in the journal; start a new tune without --resume")
        self.study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                         load_if_exists=resume,
                                         sampler=optuna_study.sampler(settings.seed, self.n_startup, settings.strategy))
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
            raw = trial.user_attrs.get(ATTR)
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
                spent += bool((trial.user_attrs.get(ATTR) or {}).get("evaluated"))
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
        self.study.sampler = optuna_study.sampler(seed, self.n_startup, self.settings.strategy)
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
            record = trial.user_attrs.get(ATTR)
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
                outcome: Outcome | None = None, duration_s: float | None = None) -> TrialRecord:
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
        return TrialRecord(
            number=candidate.number, controller=self.controller, config=candidate.config, params=candidate.params,
            fields=candidate.fields, evaluated=evaluated, feasible=failure is None, failure=failure.value if failure
            else None, detail=detail, objective_name=self.settings.objective, objective=objective,
            margin=margin,
            binding=verdict.binding.slo.key if verdict is not None else None,
            slo_values=verdict.values() if verdict is not None else {}, constraints=constraints, metrics=metrics,
            rate=outcome.rate if outcome is not None else None, agreement=agreement,
            npus=self.settings.npus_per_instance, slot=candidate.slot,
            capacity=capacity_summary(outcome, self.settings.npus_per_instance),
            duration_s=duration_s,
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
        trial.set_user_attr(ATTR, record.to_dict())
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
            if HAS_SET_CONSTRAINT:
                for key, value in record.constraints.items():
                    trial.set_constraint(key, value)
            self.study.tell(trial, values=record.objective if record.objective is not None else 0.0)
        if self.on_event is not None:
            self.on_event("told", record)

    def _told_copy(self, trial: optuna.trial.Trial, candidate: Candidate, original: FrozenTrial) -> None:
        raw = dict(original.user_attrs[ATTR])
        record = TrialRecord.from_dict({**raw, "number": candidate.number, "controller": self.controller,
                                        "config": candidate.config, "evaluated": False, "duplicate_of":
                                        original.number, "slot": -1, "duration_s": 0.0})
        self._tell(trial, record)

    # ------------------------------------------------------------------ what the loop asks of it

    def wants_more(self) -> bool:
        """Whether the loop may ask another candidate: budget left (the evaluations of every controller) and asks."""
        return self._spent() < self.settings.budget and self.asks < self.max_asks

    def out_of_asks(self) -> str | None:
        """Why the loop stops short of its budget when the sampler keeps proposing what is settled, or None."""
        if self.asks >= self.max_asks and self._spent() < self.settings.budget:
            return (f"{self.asks} candidates asked and the sampler keeps proposing configurations already measured "
                    "or ruled out")
        return None

    def propose(self) -> tuple[optuna.trial.Trial, Candidate] | None:
        """The next candidate to evaluate (in the refinement share, a neighbour of the incumbent first), or None
        when the one asked was settled without an evaluation (invalid, a duplicate, screened out: told at once)."""
        if self._refining():
            self._enqueue_neighbour()
        trial, candidate = self._ask()
        return None if self._settle_without_evaluating(trial, candidate) else (trial, candidate)

    def start(self, trial: optuna.trial.Trial, candidate: Candidate) -> None:
        """``candidate`` is being evaluated on its slot: it spends budget, and a duplicate of it is not started."""
        trial.set_user_attr("dsctl_evaluating", True)
        trial.set_user_attr("dsctl_deploys", {**candidate.params, **candidate.fields})
        if self.on_event is not None:
            self.on_event("started", self._record(candidate, evaluated=False, failure=None, detail="running"))

    def finish(self, trial: optuna.trial.Trial, candidate: Candidate, outcome: Outcome, duration_s: float) -> None:
        """Record and tell what the evaluation of ``candidate`` found."""
        self._tell(trial, self._record(candidate, evaluated=True, failure=outcome.failure, detail=outcome.detail,
                                       outcome=outcome, duration_s=duration_s))

    def abandon(self, trial: optuna.trial.Trial, candidate: Candidate, duration_s: float) -> None:
        """An evaluation that did not return within the loop's deadline: a start timeout."""
        self._tell(trial, self._record(candidate, evaluated=True, failure=Failure.START_TIMEOUT,
                                       detail="the evaluation did not return before the deadline",
                                       duration_s=duration_s))

    def interrupt(self, trials: Iterable[optuna.trial.Trial]) -> None:
        """Ctrl-C: the running trials fail, marked so that a resume evaluates their configurations again."""
        for trial in trials:
            trial.set_user_attr("dsctl_interrupted", True)
            self.study.tell(trial, state=TrialState.FAIL)

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


def capacity_summary(outcome: Outcome | None, npus: int) -> dict[str, Any] | None:
    """The rate search's capacity summary (`rate_search.capacity_summary`) with the rate per NPU."""
    raw = (outcome.data.get("capacity") if outcome is not None else None) or None
    if raw is None:
        return None
    rate = raw.get("sustained_rate")
    return {**raw, "npus": npus, "per_npu": None if rate is None else rate / max(1, npus)}
