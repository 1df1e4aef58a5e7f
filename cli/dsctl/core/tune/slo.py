"""`dsctl tune --slo`: the SLO grammar, and whether a probe's metrics meet it (pure, no I/O).

Grammar (one ``--slo`` option per SLO, or several comma-separated in one; they all must hold)::

    ttft=200ms            TTFT p99 <= 200 ms (the default statistic is p99, as vLLM's benchmarks/auto_tune
                          binds P99 E2EL; AIPerf defaults to p95 for TTFT, so say ttft:p95=... to match it)
    ttft:p95=200ms        an explicit statistic: mean, median (= p50), p50, p90, p95, p99
    tpot:mean=50ms        TPOT, ITL and E2EL likewise (ms or s; a bare number is ms, as in vLLM's --goodput)
    e2el=2s
    error_rate=1%         failed / (completed + failed) requests; a percentage or a fraction (0.01)

Metric definitions are `vllm bench serve`'s (dsctl.core.load.probe_metrics; serving-and-tuning.md section 2):
statistics are over successful requests, failed ones count only in ``error_rate``.  The statistics offered are
the ones ``dsctl probe`` reports (probe_metrics.PERCENTILES and the mean).

`judge` compares a metrics summary (the dict `probe_metrics.calculate_metrics` returns) with the SLOs.  Each
SLO's margin is relative, ``(value - bound) / bound`` (0.25 = 25 % over), so SLOs in different units compare and
Optuna can take them as constraints (<= 0 feasible); ``error_rate=0`` has no scale, its margin is the error
rate itself.  The binding SLO is the one with the largest margin: the one that fails first, or, when all hold,
the one with the least headroom.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsctl.core.load.probe_metrics import GOODPUT_METRICS, PERCENTILES
from dsctl.errors import UsageError

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
ERROR_RATE = "error_rate"
METRICS = (*LATENCY_METRICS, ERROR_RATE)
DEFAULT_STATISTIC = "p99"
STATISTICS = ("mean", *(f"p{p:g}" for p in PERCENTILES))
_STAT_ALIASES = {"median": "p50", "avg": "mean", "average": "mean"}
EXAMPLE = "e.g. ttft=200ms, ttft:p95=200ms, tpot=50ms, e2el=2s or error_rate=1%"

_TOKEN_RE = re.compile(r"(?P<metric>[a-z_0-9]+)(?::(?P<stat>[a-z0-9_.]+))?=(?P<number>[0-9]*\.?[0-9]+)"
                       r"(?P<unit>ms|s|%)?")


@dataclass(frozen=True)
class Slo:
    """``metric`` at ``statistic`` <= ``bound`` (ms for latencies, a fraction for error_rate)."""

    metric: str
    statistic: str | None  # None for error_rate
    bound: float

    @property
    def key(self) -> str:
        """``ttft:p99``, ``error_rate``: the name of its constraint and of its value in results."""
        return self.metric if self.statistic is None else f"{self.metric}:{self.statistic}"

    @property
    def label(self) -> str:
        if self.metric == ERROR_RATE:
            return f"{ERROR_RATE}={self.bound * 100:g}%"
        return f"{self.key}={self.bound:g}ms"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "statistic": self.statistic, "bound": self.bound, "label": self.label}


@dataclass(frozen=True)
class Check:
    """One SLO against one measurement."""

    slo: Slo
    value: float  # inf when nothing was measured (no successful request)
    margin: float  # (value - bound) / bound; <= 0 holds

    @property
    def ok(self) -> bool:
        return self.margin <= 0

    @property
    def line(self) -> str:
        unit = "%" if self.slo.metric == ERROR_RATE else " ms"
        shown = self.value * 100 if self.slo.metric == ERROR_RATE else self.value
        bound = self.slo.bound * 100 if self.slo.metric == ERROR_RATE else self.slo.bound
        word = "ok" if self.ok else f"missed by {_percent(self.margin)}"
        return f"{self.slo.key} {_num(shown)}{unit} (SLO {bound:g}{unit}): {word}"


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def met(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def binding(self) -> Check:
        """The check with the largest margin: the first to fail, or the tightest that holds."""
        return max(self.checks, key=lambda check: check.margin)

    @property
    def margin(self) -> float:
        return self.binding.margin

    def margins(self) -> dict[str, float]:
        """SLO key -> margin: Optuna constraint values (<= 0 feasible)."""
        return {check.slo.key: check.margin for check in self.checks}

    def values(self) -> dict[str, float]:
        return {check.slo.key: check.value for check in self.checks}

    @property
    def line(self) -> str:
        head = "SLO met" if self.met else f"SLO missed: {self.binding.slo.key} binds"
        return f"{head}; " + "; ".join(check.line for check in self.checks)


def _num(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


def _percent(margin: float) -> str:
    return "an unbounded amount" if math.isinf(margin) else f"{margin * 100:.1f} %"


def _fail(token: str, why: str) -> UsageError:
    return UsageError(f"--slo {token!r}: {why}")


def parse_slo_token(token: str) -> Slo:
    """One ``metric[:statistic]=value[unit]`` token -> `Slo`; `UsageError` naming the token and the fix."""
    text = token.strip().lower()
    match = _TOKEN_RE.fullmatch(text)
    if match is None:
        raise _fail(token, f"expected metric[:statistic]=value[ms|s|%], {EXAMPLE}")
    metric, stat, unit = match["metric"], match["stat"], match["unit"]
    if metric not in METRICS:
        raise _fail(token, f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    number = float(match["number"])
    if metric == ERROR_RATE:
        if stat is not None:
            raise _fail(token, "error_rate takes no statistic; write error_rate=1%")
        if unit in ("ms", "s"):
            raise _fail(token, "error_rate is a share of requests, not a time; write error_rate=1% or 0.01")
        bound = number / 100.0 if unit == "%" else number
        if bound > 1:
            raise _fail(token, "error_rate above 100 % means nothing; write a percentage such as error_rate=1%")
        return Slo(ERROR_RATE, None, bound)
    if unit == "%":
        raise _fail(token, f"{metric} is a time; write it in ms or s, e.g. {metric}=200ms")
    statistic = DEFAULT_STATISTIC if stat is None else _STAT_ALIASES.get(stat, stat)
    if statistic not in STATISTICS:
        raise _fail(token, f"unknown statistic {stat!r}; use one of {', '.join(STATISTICS)} (or median)")
    bound = number * 1000.0 if unit == "s" else number
    if not bound > 0:
        raise _fail(token, f"a latency bound must be positive; write e.g. {metric}=200ms")
    return Slo(metric, statistic, bound)


def parse_slos(values: Iterable[str]) -> tuple[Slo, ...]:
    """Every ``--slo`` value (each may hold several comma-separated tokens) -> the SLOs, in the order given.

    The same metric may be bound at two statistics (``ttft:p50=100ms,ttft:p99=300ms``); the same metric and
    statistic twice is refused."""
    slos: list[Slo] = []
    seen: dict[str, str] = {}
    for value in values:
        tokens = [part.strip() for part in str(value).split(",")]
        if not any(tokens):
            raise UsageError(f"--slo {value!r}: empty; {EXAMPLE}")
        for token in tokens:
            if not token:
                raise _fail(value, "an empty item between commas; remove the extra comma")
            slo = parse_slo_token(token)
            if slo.key in seen:
                raise _fail(token, f"{slo.key} is already bound by {seen[slo.key]!r}; keep one of them")
            seen[slo.key] = token
            slos.append(slo)
    if not slos:
        raise UsageError(f"--slo is required; {EXAMPLE}")
    return tuple(slos)


def goodput_bounds_ms(slos: Sequence[Slo]) -> dict[str, float]:
    """The per-request bounds a probe's goodput counts (vLLM's --goodput keys ttft, tpot, e2el): for each metric
    the tightest bound over its statistics.  ITL and error_rate have no per-request form."""
    bounds: dict[str, float] = {}
    for slo in slos:
        if slo.metric in GOODPUT_METRICS:
            bounds[slo.metric] = min(bounds.get(slo.metric, math.inf), slo.bound)
    return bounds


def measured(metrics: Mapping[str, Any], slo: Slo) -> float:
    """The value ``slo`` binds, from a `probe_metrics.calculate_metrics` summary.

    Nothing served (no successful request) is an infinitely bad latency.  A run whose requests all produced one
    token has no TPOT or ITL samples: vLLM counts such requests as TPOT 0, so the value is 0."""
    completed = int(metrics.get("completed") or 0)
    failed = int(metrics.get("failed") or 0)
    if slo.metric == ERROR_RATE:
        total = completed + failed
        return 1.0 if total == 0 else failed / total
    if completed == 0:
        return math.inf
    value = (metrics.get(f"{slo.metric}_ms") or {}).get(slo.statistic)
    if value is None:
        return 0.0 if slo.metric in ("tpot", "itl") else math.inf
    return float(value)


def margin(slo: Slo, value: float) -> float:
    if slo.bound == 0:
        return value
    if math.isinf(value):
        return math.inf
    return (value - slo.bound) / slo.bound


def judge(slos: Sequence[Slo], metrics: Mapping[str, Any]) -> Verdict:
    """Whether ``metrics`` meets every SLO, which one binds and by how much."""
    if not slos:
        raise ValueError("judge needs at least one SLO")
    checks = []
    for slo in slos:
        value = measured(metrics, slo)
        checks.append(Check(slo, value, margin(slo, value)))
    return Verdict(tuple(checks))
