"""Trial records (one JSON line each), the Pareto front, and its plot.

`TrialRecord` is what a tune keeps of every trial: the configuration, the engine parameters and service fields it
deployed, what happened (feasible, or its failure class and the reason), the objective, the SLO values and
margins, the probe's metrics, the quality agreement, and the context (versions, env) it ran in.  ``to_json_line``
gives the run directory's ``trials.jsonl`` line; ``from_dict`` reads it back.

The Pareto front is over evaluated trials that produced metrics: maximise goodput (the objective) per NPU, minimise
the SLO statistic (the binding SLO's value; by default the first SLO's).  `figure` draws it (a matplotlib Figure, in
memory): feasible trials as dots, infeasible ones as crosses, the front as a line, the winner ringed.  Pure: the
files (``trials.jsonl``, the PNG) are written by `dsctl.adapters.tune_artifacts`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

RECORD_VERSION = 1


@dataclass
class TrialRecord:
    number: int
    controller: str
    config: dict[str, Any]
    params: dict[str, Any]
    fields: dict[str, Any]
    evaluated: bool  # an instance was restarted and probed (it spent budget)
    feasible: bool
    failure: str | None = None  # a search.Failure value
    detail: str = ""
    objective_name: str = "goodput"
    objective: float | None = None  # per instance
    margin: float | None = None  # the binding SLO's relative margin (<= 0 holds)
    binding: str | None = None  # the binding SLO's key, e.g. "ttft:p99"
    slo_values: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    rate: float | None = None  # request rate the metrics were measured at
    agreement: float | None = None
    npus: int = 1  # NPUs of the instance that ran it
    slot: int = -1
    duration_s: float | None = None
    duplicate_of: int | None = None
    # capacity objective: sustained_rate, at_ceiling, ceiling, interval, noise, window_s, samples, warmup, per_npu
    capacity: dict[str, Any] | None = None
    context: dict[str, Any] = field(default_factory=dict)  # versions, env, log tail

    @property
    def objective_per_npu(self) -> float | None:
        return None if self.objective is None else self.objective / max(1, self.npus)

    def slo_value(self, key: str | None = None) -> float | None:
        if not self.slo_values:
            return None
        return self.slo_values.get(key) if key is not None else next(iter(self.slo_values.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"record_version": RECORD_VERSION, **_finite(asdict(self))}

    def to_json_line(self) -> str:
        """One line of JSON (no NaN or Infinity: non-finite numbers become strings "inf" / "-inf" / "nan")."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialRecord:
        known = {f.name for f in fields(cls)}
        values = {key: _unfinite(value) if key in ("margin", "objective") else value
                  for key, value in raw.items() if key in known}
        values["slo_values"] = {k: _unfinite(v) for k, v in (raw.get("slo_values") or {}).items()}
        return cls(**values)

    @classmethod
    def from_json_line(cls, line: str) -> TrialRecord:
        return cls.from_dict(json.loads(line))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _unfinite(value: Any) -> Any:
    return float(value) if value in ("inf", "-inf", "nan") else value


# --------------------------------------------------------------------------- the front


def _point(record: TrialRecord, slo_key: str | None) -> tuple[float, float] | None:
    per_npu, latency = record.objective_per_npu, record.slo_value(slo_key)
    if per_npu is None or latency is None or not math.isfinite(latency) or not record.evaluated:
        return None
    return per_npu, latency


def pareto_front(records: Sequence[TrialRecord], *, slo_key: str | None = None,
                 feasible_only: bool = False) -> list[TrialRecord]:
    """Trials no other trial beats on both goodput per NPU (higher) and the SLO statistic (lower), sorted by the
    statistic.  ``feasible_only`` keeps only trials that met every constraint."""
    points = [(r, p) for r in records if (p := _point(r, slo_key)) is not None and (r.feasible or not feasible_only)]
    front = []
    for record, (good, lat) in points:
        dominated = any(g >= good and la <= lat and (g > good or la < lat) for _, (g, la) in points)
        if not dominated:
            front.append(record)
    return sorted(front, key=lambda r: (_point(r, slo_key)[1], r.number))


def figure(records: Sequence[TrialRecord], *, winner: TrialRecord | None = None, slo_key: str | None = None,
           slo_bound: float | None = None, title: str = "dsctl tune") -> Any:
    """The Pareto plot, a matplotlib Figure: goodput per NPU against the SLO statistic."""
    from matplotlib.figure import Figure

    key = slo_key or next((k for r in records for k in r.slo_values), None)
    drawn = Figure(figsize=(7, 4.5), dpi=110)
    axes = drawn.add_subplot()
    feasible = [p for r in records if r.feasible and (p := _point(r, key)) is not None]
    infeasible = [p for r in records if not r.feasible and (p := _point(r, key)) is not None]
    if feasible:
        axes.scatter([p[1] for p in feasible], [p[0] for p in feasible], marker="o", color="tab:green",
                     label=f"feasible ({len(feasible)})", zorder=3)
    if infeasible:
        axes.scatter([p[1] for p in infeasible], [p[0] for p in infeasible], marker="x", color="tab:red",
                     label=f"infeasible ({len(infeasible)})", zorder=2)
    front = [_point(r, key) for r in pareto_front(records, slo_key=key)]
    if len(front) > 1:
        axes.plot([p[1] for p in front], [p[0] for p in front], color="tab:gray", linestyle="--", linewidth=1,
                  label="Pareto front", zorder=1)
    if slo_bound is not None:
        axes.axvline(slo_bound, color="tab:orange", linewidth=1, label=f"SLO {key} = {slo_bound:g} ms")
    win = _point(winner, key) if winner is not None else None
    if win is not None:
        axes.scatter([win[1]], [win[0]], s=220, facecolors="none", edgecolors="tab:blue", linewidths=2,
                     label=f"winner (trial {winner.number})", zorder=4)
    crashed = sum(1 for r in records if r.evaluated and _point(r, key) is None)
    objective = next((r.objective_name for r in records), "goodput")
    axes.set_xlabel(f"{key or 'SLO statistic'} (ms)")
    axes.set_ylabel(f"{objective} per NPU (req/s)")
    axes.set_title(f"{title}: {len(records)} trials" + (f", {crashed} without metrics (crashed)" if crashed else ""))
    axes.grid(True, alpha=0.3)
    if feasible or infeasible:
        axes.legend(loc="best", fontsize="small")
    drawn.tight_layout()
    return drawn
