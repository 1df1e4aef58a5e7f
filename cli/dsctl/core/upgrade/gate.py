"""The probe gate of an upgrade (pure): the new stack's probe metrics against the pre-upgrade baseline.

``--max-regression ttft=10%,throughput=5%`` allows TTFT to grow by at most 10 % and output throughput to drop by
at most 5 %.  "It starts" is not enough: vllm-ascend#3269 reports TTFT 174 -> 440 ms on the same workload between
two releases (issue 11).  A term may name the statistic: ``ttft:p90=15%`` (default: the median for latencies;
``ttft.p90=15%`` is the older spelling).  The terms are dsctl's one SLO grammar (`dsctl.core.load.slo_spec`).

``--slo ttft=500ms,e2el:p90=4s`` adds absolute bounds in the same grammar: the new stack's gate probe must meet
them (`dsctl.core.tune.slo.judge`; a term without a statistic binds p99, as in ``dsctl tune``), whatever the
baseline did.

Metrics are `dsctl.core.load.probe_metrics.calculate_metrics` dicts (what ``dsctl probe --json`` prints under
``data.metrics``).  Any failed request of the gate probe fails the gate, whatever the limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dsctl.core.load import slo_spec
from dsctl.core.load.limits import number as check_number
from dsctl.core.tune import slo as slo_verdict
from dsctl.errors import UsageError

# term -> (metrics key, True when higher is worse); latencies are summaries (median, pNN), throughputs numbers
TERMS: dict[str, tuple[str, bool]] = {
    "ttft": ("ttft_ms", True),
    "tpot": ("tpot_ms", True),
    "itl": ("itl_ms", True),
    "e2el": ("e2el_ms", True),
    "throughput": ("output_throughput", False),
    "request_throughput": ("request_throughput", False),
}
DEFAULT = "ttft=10%,throughput=5%"
# A throughput can drop by all of itself at most; a latency allowed to grow a hundredfold is gated by nothing.
MAX_DROP_PERCENT = 100
MAX_GROWTH_PERCENT = 10_000


@dataclass(frozen=True)
class Limit:
    term: str
    statistic: str | None  # None for throughputs
    percent: float

    @property
    def label(self) -> str:
        return f"{self.term}:{self.statistic}" if self.statistic and self.statistic != "median" else self.term


def parse_slos(text: str | None, option: str = "--slo") -> tuple[slo_spec.Slo, ...]:
    """``--slo`` of the upgrade: absolute bounds the gate probe must meet (none when not given)."""
    return () if not text else slo_spec.parse_slos([text], option)


def parse_max_regression(text: str, option: str = "--max-regression") -> tuple[Limit, ...]:
    """``ttft=10%,throughput=5%,ttft:p90=15%`` -> limits; UsageError naming the bad term.

    The terms are dsctl's one SLO grammar (`dsctl.core.load.slo_spec`, ``metric[:stat]=value``) with a
    percentage for a value; ``ttft.p90=15%`` (a dot) is the older spelling of ``ttft:p90=15%``."""
    limits: list[Limit] = []
    for raw in (part.strip() for part in str(text).split(",")):
        if not raw:
            continue
        term = slo_spec.lex(raw, option) if slo_spec.is_term(raw) else None  # an unknown statistic: lex says so
        if term is None or term.unit != "%":
            raise UsageError(f"{option} {raw!r}: expected TERM[:STAT]=P% such as ttft=10%, ttft:p90=15% or "
                             f"throughput=5% (terms: {', '.join(TERMS)})")
        if term.metric not in TERMS:
            raise UsageError(f"{option} {raw!r}: unknown term {term.metric!r}; use one of {', '.join(TERMS)}")
        _, worse_up = TERMS[term.metric]
        statistic = term.statistic
        if worse_up:  # probe summaries name p50 "median"
            statistic = "median" if statistic in (None, "p50") else statistic
        elif statistic is not None:
            raise UsageError(f"{option} {raw!r}: {term.metric} is one number, it takes no statistic")
        try:  # the one number rule (dsctl.core.load.limits): finite, within what the term can move
            if worse_up:
                check_number(f"{option} {term.metric}", term.number, 0, MAX_GROWTH_PERCENT, "% of growth")
            else:
                check_number(f"{option} {term.metric}", term.number, 0, MAX_DROP_PERCENT, "% of drop",
                             " (a throughput cannot fall by more than all of it)")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if any(limit.term == term.metric and limit.statistic == statistic for limit in limits):
            raise UsageError(f"{option} {raw!r}: {term.metric} is given twice")
        limits.append(Limit(term.metric, statistic, term.number))
    if not limits:
        raise UsageError(f"{option}: empty; give at least one term such as {DEFAULT}")
    return tuple(limits)


def metric_value(metrics: Mapping[str, Any], limit: Limit) -> float | None:
    key, _ = TERMS[limit.term]
    value = metrics.get(key)
    if isinstance(value, Mapping):
        value = value.get(limit.statistic or "median")
    return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Check:
    term: str
    baseline: float | None
    current: float | None
    change_percent: float | None  # + = worse for latencies, - = worse for throughputs (as measured)
    limit_percent: float
    passed: bool

    def line(self) -> str:
        unit = " ms" if TERMS[self.term.split(":")[0]][1] else " tok/s"
        if self.baseline is None or self.current is None:
            return f"{self.term}: not measured (baseline {_num(self.baseline)}, now {_num(self.current)})"
        worse = "max +" if TERMS[self.term.split(":")[0]][1] else "max -"
        verdict = "ok" if self.passed else "REGRESSED"
        return (f"{self.term} {self.baseline:.1f} -> {self.current:.1f}{unit} ({self.change_percent:+.1f}%, "
                f"{worse}{self.limit_percent:g}%) {verdict}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GateResult:
    passed: bool
    checks: tuple[Check, ...]
    failed_requests: int
    completed: int
    slo_checks: tuple[slo_verdict.Check, ...] = ()  # --slo: absolute bounds on the gate probe

    def reason(self) -> str:
        """One line: the regressions with their numbers, the missed SLOs, or the failed requests."""
        parts = []
        if self.failed_requests or not self.completed:
            parts.append(f"{self.failed_requests} of {self.failed_requests + self.completed} gate requests failed")
        parts += [check.line() for check in self.checks if not check.passed]
        parts += [check.line for check in self.slo_checks if not check.ok]
        return "; ".join(parts) if parts else self.summary()

    def summary(self) -> str:
        return "; ".join([check.line() for check in self.checks] + [check.line for check in self.slo_checks])

    def delta(self) -> str:
        """The changes alone, for a table: "ttft +3.2%, throughput -1.0%"."""
        return ", ".join(f"{c.term} {c.change_percent:+.1f}%" if c.change_percent is not None else f"{c.term} -"
                         for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks],
                "slo": [{"slo": c.slo.label, "value": _finite(c.value), "ok": c.ok} for c in self.slo_checks],
                "failed_requests": self.failed_requests, "completed": self.completed}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any], limits: tuple[Limit, ...],
            slos: Sequence[slo_spec.Slo] = ()) -> GateResult:
    """Pass when every limited metric is within its limit of the baseline, ``current`` meets every SLO and no
    gate request failed."""
    checks = []
    for limit in limits:
        before, now = metric_value(baseline, limit), metric_value(current, limit)
        worse_up = TERMS[limit.term][1]
        if before is None or now is None or before <= 0:
            # Nothing to compare against: judged only by the failed requests below.
            change = None
            passed = now is not None or before is None
        else:
            change = (now - before) / before * 100.0
            passed = change <= limit.percent if worse_up else -change <= limit.percent
        checks.append(Check(limit.label, before, now, change, limit.percent, passed))
    failed = int(current.get("failed") or 0)
    completed = int(current.get("completed") or 0)
    slo_checks = slo_verdict.judge(slos, current).checks if slos else ()
    passed = all(check.passed for check in checks) and all(c.ok for c in slo_checks) and failed == 0 \
        and completed > 0
    return GateResult(passed=passed, checks=tuple(checks), failed_requests=failed, completed=completed,
                      slo_checks=slo_checks)
