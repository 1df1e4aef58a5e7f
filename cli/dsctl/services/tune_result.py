"""What a tune found: one result type for both evaluators (issue 21: "one tune driver with two evaluators and one
result type").

`dsctl tune --simulate` (services.tune, the offline engine model) and `dsctl tune INVENTORY` (services.tune_live,
the fleet's instances) run the same driver (`services.tune_driver.drive`) and return this: the trials, the noise-aware
winner, the baseline it is measured against (live: the inventory's configuration), the counts and the artifacts.
What only a live run has -- the configuration it left on every instance, the confirming probes, the inventory it
wrote -- is its `Deployment`; a simulated run has none.  The command renders both with one table and one JSON
shape (``to_dict``: the common keys, then the mode's own inputs, then the deployment's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.core.tune import search
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.errors import ExitStatus


def ranked(trials: tuple[TrialRecord, ...], best: TrialRecord | None = None) -> list[TrialRecord]:
    """Evaluated trials, best first: the run's winner (``best``, `analysis.best_trial`: with noisy verdicts a later
    trial replaces the incumbent only beyond the noise, so an equal or slightly higher figure does not rank above
    it), then feasible by objective, then the rest by how near they came."""
    evaluated = [t for t in trials if t.evaluated and t.duplicate_of is None]
    winner = None if best is None else best.number
    return sorted(evaluated, key=lambda t: (t.number != winner, not t.feasible,
                                            -(t.objective or 0.0) if t.feasible else 0.0,
                                            t.failure in search.CRASHES,
                                            t.margin if t.margin is not None else float("inf"), t.number))


def jsonable(record: TrialRecord) -> dict[str, Any]:
    return json.loads(record.to_json_line())  # the trials.jsonl form (no NaN / inf)


def capacity_figure(record: TrialRecord | None) -> dict[str, Any] | None:
    """A trial's capacity for the report: sustained rate, per NPU, whether only a lower bound, window, samples."""
    if record is None or record.capacity is None:
        return None
    cap = record.capacity
    return {"trial": record.number, "sustained_rate": cap.get("sustained_rate"), "per_npu": cap.get("per_npu"),
            "at_ceiling": cap.get("at_ceiling"), "noise": cap.get("noise"), "window_s": cap.get("window_s"),
            "samples": cap.get("samples")}


@dataclass(frozen=True)
class Verification:
    """A confirming probe of one instance at the winner's rate (live)."""

    host: str
    instance: str
    rate: float
    met: bool
    values: dict[str, float]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class Deployment:
    """What a live tune left on the fleet: the configuration every instance of the service runs, its
    confirmation, and the inventory files written (--write-back)."""

    service: str
    deployed: str  # "winner" or "baseline"
    params: dict[str, Any]
    verification: tuple[Verification, ...] = ()
    written: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"deployed": self.deployed, "deployed_params": self.params,
                "verification": [v.to_dict() for v in self.verification], "written": list(self.written)}


@dataclass(frozen=True)
class TuneResult:
    mode: str  # "simulate" or "live"
    subject: str  # what was tuned, on what: the table's heading
    space: space_mod.SearchSpace
    trials: tuple[TrialRecord, ...]
    best: TrialRecord | None
    closest: TrialRecord | None
    counts: dict[str, int]
    stopped: str
    trials_path: Path
    plot_path: Path
    exit_status: ExitStatus
    errors: tuple[str, ...]
    wall_s: float
    baseline: TrialRecord | None = None  # the evaluated trial of the inventory's configuration (live)
    baseline_config: Mapping[str, Any] | None = None  # its knobs and fields: the table shows what differs
    layout: dict[str, Any] | None = None  # the winner's TP x DP x nodes layout, when the space searches one
    deployment: Deployment | None = None  # live only
    inputs: Mapping[str, Any] = field(default_factory=dict)  # the mode's own inputs, echoed by to_dict

    @property
    def deployed(self) -> str | None:
        return None if self.deployment is None else self.deployment.deployed

    @property
    def written(self) -> tuple[str, ...]:
        return () if self.deployment is None else self.deployment.written

    @property
    def verification(self) -> tuple[Verification, ...]:
        return () if self.deployment is None else self.deployment.verification

    def ranked(self) -> list[TrialRecord]:
        return ranked(self.trials, self.best)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, **self.inputs, "space": self.space.name, "counts": self.counts,
            "stopped": self.stopped, "wall_s": round(self.wall_s, 1), "layout": self.layout,
            "capacity": {"winner": capacity_figure(self.best), "baseline": capacity_figure(self.baseline)},
            "trials_path": str(self.trials_path), "plot_path": str(self.plot_path),
            "best": None if self.best is None else jsonable(self.best),
            "closest": None if self.closest is None else jsonable(self.closest),
            "notes": list(self.space.notes), "trials": [jsonable(t) for t in self.ranked()],
            **({} if self.deployment is None else self.deployment.to_dict()),
        }
