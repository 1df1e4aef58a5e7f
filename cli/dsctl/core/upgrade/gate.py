"""The probe gate of an upgrade (pure): the new stack's probe metrics against the pre-upgrade baseline.

``--max-regression ttft=10%,throughput=5%`` allows TTFT to grow by at most 10 % and output throughput to drop by
at most 5 %.  "It starts" is not enough: vllm-ascend#3269 reports TTFT 174 -> 440 ms on the same workload between
two releases (issue 11).  A term may name the statistic: ``ttft.p90=15%`` (default: the median for latencies).

Metrics are `dsctl.core.load.probe_metrics.calculate_metrics` dicts (what ``dsctl probe --json`` prints under
``data.metrics``).  Any failed request of the gate probe fails the gate, whatever the limits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

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
LATENCY_STATS = ("mean", "median", "p50", "p90", "p95", "p99")
DEFAULT = "ttft=10%,throughput=5%"
_TERM = re.compile(r"^([a-z_]+)(?:\.([a-z0-9]+))?=(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class Limit:
    term: str
    statistic: str | None  # None for throughputs
    percent: float

    @property
    def label(self) -> str:
        return f"{self.term}.{self.statistic}" if self.statistic and self.statistic != "median" else self.term


def parse_max_regression(text: str, option: str = "--max-regression") -> tuple[Limit, ...]:
    """``ttft=10%,throughput=5%`` -> limits; UsageError naming the bad term."""
    limits: list[Limit] = []
    for raw in (part.strip() for part in str(text).split(",")):
        if not raw:
            continue
        match = _TERM.match(raw)
        if not match:
            raise UsageError(f"{option} {raw!r}: expected TERM=P% such as ttft=10% or throughput=5% "
                             f"(terms: {', '.join(TERMS)})")
        term, statistic, percent = match.group(1), match.group(2), float(match.group(3))
        if term not in TERMS:
            raise UsageError(f"{option} {raw!r}: unknown term {term!r}; use one of {', '.join(TERMS)}")
        key, worse_up = TERMS[term]
        if worse_up:
            statistic = "median" if statistic in (None, "p50") else statistic
            if statistic not in LATENCY_STATS:
                raise UsageError(f"{option} {raw!r}: unknown statistic {statistic!r}; use one of "
                                 f"{', '.join(LATENCY_STATS)}")
        elif statistic is not None:
            raise UsageError(f"{option} {raw!r}: {term} is one number, it takes no statistic")
        if any(limit.term == term and limit.statistic == statistic for limit in limits):
            raise UsageError(f"{option} {raw!r}: {term} is given twice")
        limits.append(Limit(term, statistic, percent))
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
        unit = " ms" if TERMS[self.term.split(".")[0]][1] else " tok/s"
        if self.baseline is None or self.current is None:
            return f"{self.term}: not measured (baseline {_num(self.baseline)}, now {_num(self.current)})"
        worse = "max +" if TERMS[self.term.split(".")[0]][1] else "max -"
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

    def reason(self) -> str:
        """One line: the regressions with their numbers, or the failed requests."""
        parts = []
        if self.failed_requests or not self.completed:
            parts.append(f"{self.failed_requests} of {self.failed_requests + self.completed} gate requests failed")
        parts += [check.line() for check in self.checks if not check.passed]
        return "; ".join(parts) if parts else "; ".join(check.line() for check in self.checks)

    def summary(self) -> str:
        return "; ".join(check.line() for check in self.checks)

    def delta(self) -> str:
        """The changes alone, for a table: "ttft +3.2%, throughput -1.0%"."""
        return ", ".join(f"{c.term} {c.change_percent:+.1f}%" if c.change_percent is not None else f"{c.term} -"
                         for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks],
                "failed_requests": self.failed_requests, "completed": self.completed}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any], limits: tuple[Limit, ...]) -> GateResult:
    """Pass when every limited metric is within its limit of the baseline and no gate request failed."""
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
    passed = all(check.passed for check in checks) and failed == 0 and completed > 0
    return GateResult(passed=passed, checks=tuple(checks), failed_requests=failed, completed=completed)
