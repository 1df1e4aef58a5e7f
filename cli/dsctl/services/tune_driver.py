"""The one tune driver: `dsctl tune` runs its study the same way whatever evaluates a candidate.

The verbs prepare once (``services.tune.prepare``: the model, the space and an SLO's bound, no I/O;
``services.tune_live.prepare``: the fleet read once, the slots laid out, --write-back checked once), then hand
`drive` a `TrialPort`: ``services.tune.SimulatedTrials`` (dsctl's offline engine model) or
``services.tune_live.LiveTune`` (a candidate deployed to one of the service's instances and probed).  The driver::

    the run directory (a new one, or --resume's with its study.journal)  ->  the port's opening notes  ->  its
    space and screen (a lossy knob narrowed to what the model screen lets through)  ->  its beginning (live: the
    baseline deployed)  ->  the study (`tune_search.Search` on the journal, the port evaluating)  ->  Ctrl-C: the
    port's interrupt (live: every instance restored, exit 130)  ->  the port's conclusion, built from the helpers
    here: trials.jsonl and pareto.png, "no configuration met the SLO ..." and one `TuneResult`.

Progress records, both modes: ``dsctl_note`` (``msg``) and ``dsctl_tune_trial`` per trial started or told
(``phase``, ``number``, ``config``, ``status``, ``objective``, ``detail``, ``evaluated``, ``crashed``,
``feasible``, ``budget``, ``best``, and what the port adds: live, ``rate``, ``slot``, ``host`` and ``instance``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dsctl.adapters import output_paths, tune_artifacts
from dsctl.adapters.ansible_run import new_artifacts_dir, runs_dir
from dsctl.adapters.study_journal import journal_storage
from dsctl.core.load.workload import LengthSpec
from dsctl.core.tune import capacity, search, slo
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.analysis import standing
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import Candidate, Failure, Outcome, SearchResult, SearchSettings
from dsctl.errors import ExitStatus, UsageError
from dsctl.services.ports import ProgressSink
from dsctl.services.tune_result import TuneResult
from dsctl.services.tune_search import Search

STUDY = "dsctl-tune"
JOURNAL, TRIALS, PLOT, RESULT = "study.journal", "trials.jsonl", "pareto.png", "result.json"
MAX_REQUESTS = 5000  # per probe (simulated: a run of 1000 requests takes ~0.7 s; live: warm-up + measured)
SCREENS = ("model", "roofline", "none")


@dataclass(frozen=True)
class StudyPlan:
    """What the driver needs of a mode's inputs and plan to run its study."""

    run_dir: Path
    resume: bool
    budget: int
    slos: tuple[slo.Slo, ...]
    settings: SearchSettings
    context: Mapping[str, Any]  # recorded with every trial
    baseline: Mapping[str, Any] | None = None  # the first trial's configuration (live: the inventory's)


class TrialPort(Protocol):
    """The evaluator port of the driver: a candidate's evaluation and what the mode does around the study."""

    @property
    def study(self) -> StudyPlan: ...

    def opening(self) -> Sequence[str]:
        """The notes before the search (the run directory exists)."""
        ...

    def screening(self) -> tuple[space_mod.SearchSpace, search.Screen | None, Sequence[str]]:
        """The space to search, the screen of its candidates, and a note per knob the screen narrowed."""
        ...

    def begin(self) -> None:
        """Before the first trial (live: the baseline deployed to every instance)."""
        ...

    def evaluate(self, candidate: Candidate) -> Outcome:
        """One candidate, on its trial slot ``candidate.slot`` (a worker thread)."""
        ...

    def event_fields(self, record: TrialRecord) -> Mapping[str, Any]:
        """What the mode adds to a trial's progress record."""
        ...

    def told(self, record: TrialRecord, incumbent: TrialRecord | None) -> None:
        """A trial's result was told (its progress record sent); ``incumbent``: the best so far."""
        ...

    def interrupted(self) -> None:
        """Ctrl-C during the beginning or the study: raise the mode's error, or return to let it go on."""
        ...

    def conclude(self, found: SearchResult, started: float) -> TuneResult:
        """The end: the artifacts and the result (live: the winner deployed, confirmed, written back)."""
        ...


def drive(port: TrialPort, progress: ProgressSink) -> TuneResult:
    """Run the study of ``port`` (prepared: its inputs checked, its run directory chosen) and conclude it."""
    started = time.monotonic()
    plan = port.study
    journal = plan.run_dir / JOURNAL
    if plan.resume and not journal.is_file():
        raise UsageError(f"--resume {plan.run_dir}: no {JOURNAL} there; give the run directory of an earlier tune")
    plan.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for msg in port.opening():
        note(progress, msg)
    space, screen, narrowed = port.screening()
    for msg in narrowed:
        note(progress, msg)
    incumbent: TrialRecord | None = None

    def on_event(phase: str, record: TrialRecord) -> None:
        nonlocal incumbent
        counts: dict[str, int] = {}
        if phase == "told":
            counts, incumbent = standing(study.result().trials)
        progress({"event": "dsctl_tune_trial", "phase": phase, "number": record.number, "config": record.config,
                  "status": status(record) if phase == "told" else "running", "objective": record.objective,
                  "detail": record.detail, "evaluated": counts.get("evaluated"), "crashed": counts.get("crashed"),
                  "feasible": counts.get("feasible"), "budget": plan.budget,
                  "best": incumbent.objective if incumbent is not None else None, **port.event_fields(record)})
        if phase == "told":
            port.told(record, incumbent)

    try:
        port.begin()
        study = Search(space, plan.slos, port.evaluate, plan.settings, storage=journal_storage(journal),
                       study_name=STUDY, resume=plan.resume, screen=screen, baseline=plan.baseline,
                       context=plan.context, on_event=on_event)
        found = study.run()
    except KeyboardInterrupt:
        port.interrupted()
        raise
    return port.conclude(found, started)


# --------------------------------------------------------------------------- the run directory


def check_run_dir(resume: Path | None) -> None:
    """The run directory of a tune, simulated or live (``resume``: an earlier one to continue, else a new one under
    $XDG_STATE_HOME/dsctl/runs): it holds the journal, trials.jsonl and pareto.png, so it must be writable before the
    first trial.  UsageError naming the option."""
    if resume is not None and not resume.is_dir():
        raise UsageError(f"--resume {resume}: no such run directory; give the directory an earlier tune printed")
    if resume is not None:
        output_paths.check_dir("--resume", resume)
    else:
        output_paths.check_dir("run directory ($XDG_STATE_HOME/dsctl/runs)", runs_dir())


def run_dir_for(given: Path | None) -> Path:
    """``given`` (the inputs' run directory, --resume's), or a new one; called once the inputs are checked."""
    return given if given is not None else new_artifacts_dir("tune")


# --------------------------------------------------------------------------- the inputs, both modes


def check_inputs(inputs: Any, settings: SearchSettings, *, max_budget: int, unit: str, max_rate: float,
                 slots: int | None) -> None:
    """What both modes check of their inputs (``TuneInputs``, ``LiveTuneInputs``) before any run directory, fleet
    read or host: the budget (in ``unit``, up to ``max_budget``), the probes' size, the rate (up to ``max_rate``)
    against the objective, the window, the slots, the screen, and the search's own ``settings``."""
    if not 1 <= inputs.budget <= max_budget:
        raise UsageError(f"--budget must be in 1..{max_budget}{unit}, got {inputs.budget}")
    if inputs.requests is not None and not 1 <= inputs.requests <= MAX_REQUESTS:
        raise UsageError(f"--requests must be in 1..{MAX_REQUESTS}, got {inputs.requests}")
    if inputs.objective == "capacity" and inputs.rate is not None:
        raise UsageError("--objective capacity searches the rate: drop --rate, or score a fixed load with "
                         "--objective goodput")
    if inputs.rate is not None and not 0 < inputs.rate <= max_rate:
        raise UsageError(f"--rate must be in (0, {max_rate:g}] req/s, got {inputs.rate:g}")
    capacity.check_window(inputs.window_s)
    if slots is not None and slots < 1:
        raise UsageError(f"--slots must be at least 1, got {slots}")
    if inputs.screen not in SCREENS:
        raise UsageError(f"--screen {inputs.screen!r}: use model, roofline or none")
    settings.check()  # the search's own (--objective, --min-agreement): here, before any run directory or host


def length(text: str, option: str) -> LengthSpec:
    try:
        return LengthSpec.parse(text, option)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def shortest(spec: LengthSpec) -> int:
    """The fewest tokens a request of ``spec`` has: the impossibility screen must hold for every request."""
    return int(spec.a) if spec.kind in ("fixed", "uniform") else 1


def sample_rule(slos: tuple[slo.Slo, ...]) -> dict[str, Any]:
    """The sizing rule a run's probes follow, for result.json."""
    return {"measured_at_least": capacity.required_samples(slos), "tail_samples": capacity.TAIL_SAMPLES,
            "warmup_share": capacity.WARMUP_SHARE, "min_warmup": capacity.MIN_WARMUP,
            "throughput_slack": capacity.THROUGHPUT_SLACK, "growth_factor": capacity.GROWTH_FACTOR,
            "growth_slack_requests": capacity.GROWTH_SLACK_REQUESTS}


def echo(inputs: Any, slos: tuple[slo.Slo, ...], own: Mapping[str, Any]) -> dict[str, Any]:
    """A run's inputs for result.json and --json: the mode's ``own`` (what was tuned, on what), then the study's."""
    return {**own, "slos": [s.to_dict() for s in slos], "objective": inputs.objective, "budget": inputs.budget,
            "seed": inputs.seed, "rate": inputs.rate, "prompt_tokens": inputs.prompt_tokens,
            "output_tokens": inputs.output_tokens, "requests": inputs.requests, "window_s": inputs.window_s,
            "sample_rule": sample_rule(slos), "run_dir": str(inputs.run_dir)}


# --------------------------------------------------------------------------- progress and the end, both modes


def note(progress: ProgressSink, msg: str) -> None:
    progress({"event": "dsctl_note", "msg": msg})


def status(record: TrialRecord) -> str:
    return "feasible" if record.feasible else (record.failure or "running")


def artifacts(trials: Sequence[TrialRecord], run_dir: Path, *, winner: TrialRecord | None,
              slos: tuple[slo.Slo, ...], title: str) -> tuple[Path, Path]:
    """``trials.jsonl`` and ``pareto.png`` in the run directory (the plot against the first SLO)."""
    trials_path = tune_artifacts.write_trials(trials, run_dir / TRIALS)
    first = slos[0]
    plot_path = tune_artifacts.plot(trials, run_dir / PLOT, winner=winner, slo_key=first.key,
                                    slo_bound=first.bound if first.statistic is not None else None, title=title)
    return trials_path, plot_path


def nothing_met(found: SearchResult, *, after: str = "") -> str:
    """Why no configuration won, one line: all screened out, none measured (the load generator was the limit),
    all crashed, or the closest and its binding constraint.  ``after``: what the mode adds before the advice (live:
    that the instances run the inventory's configuration again)."""
    closest, counts = found.closest, found.counts
    then = f"; {after}" if after else ""
    if closest is None and not counts["evaluated"] and counts["screened"]:
        first = next(t for t in found.trials if t.failure == Failure.SCREENED)
        return (f"no configuration met the SLO: all {counts['screened']} candidates were screened out before a "
                f"restart (e.g. trial {first.number}: {first.detail}); relax the SLO or the load, or pass --screen "
                f"roofline to measure them anyway{then}")
    if closest is None and counts.get(Failure.UNMEASURED.value):
        first = next(t for t in found.trials if t.failure == Failure.UNMEASURED)
        return (f"no configuration was measured: the load generator was the limit of {counts['unmeasured']} of the "
                f"{counts['evaluated']} evaluated trials (e.g. trial {first.number}: {first.detail}){then}; tune "
                "again on a quieter controller (or fewer --slots)")
    if closest is None:
        crashes = ", ".join(f"{counts[f.value]} {f.value}" for f in search.CRASHES if counts[f.value])
        return (f"no configuration met the SLO: all {counts['evaluated']} evaluated crashed ({crashes or 'none'})"
                f"{then}; narrow the space with --param")
    at = f" at {closest.rate:.3g} req/s" if closest.rate is not None else ""
    return (f"no configuration met the SLO; closest: trial {closest.number} ({config_text(closest)}){at}, "
            f"binding {closest.binding}: {closest.detail}{then}")


def result(found: SearchResult, *, mode: str, subject: str, space: space_mod.SearchSpace, best: TrialRecord | None,
           paths: tuple[Path, Path], exit_status: ExitStatus, errors: Sequence[str], started: float,
           inputs: Mapping[str, Any], **extra: Any) -> TuneResult:
    """The `TuneResult` of a study (``extra``: the mode's own fields: layout, baseline, deployment)."""
    trials_path, plot_path = paths
    return TuneResult(mode=mode, subject=subject, space=space, trials=tuple(found.trials), best=best,
                      closest=found.closest, counts=found.counts, stopped=found.stopped, trials_path=trials_path,
                      plot_path=plot_path, exit_status=exit_status, errors=tuple(errors),
                      wall_s=time.monotonic() - started, inputs=inputs, **extra)


def config_text(record: TrialRecord) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in {**record.params, **record.fields}.items())


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)
