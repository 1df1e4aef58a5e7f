"""`dsctl tune --slo` (and the upgrade gate's ``--slo``): whether a probe's metrics meet SLOs (pure, no I/O).

The grammar is dsctl's one SLO grammar, `dsctl.core.load.slo_spec` (re-exported here): one ``--slo`` option per
SLO, or several comma-separated in one, all of which must hold; ``ttft=200ms`` and vLLM's ``ttft:200`` bind the
default statistic p99 (as vLLM's benchmarks/auto_tune binds P99 E2EL; AIPerf defaults to p95 for TTFT, so say
``ttft:p95=...`` to match it); ``error_rate=1%`` is failed / (completed + failed) requests.

Metric definitions are `vllm bench serve`'s (dsctl.core.load.probe_metrics; serving-and-tuning.md section 2):
statistics are over successful requests, failed ones count only in ``error_rate``.

`judge` compares a metrics summary (the dict `probe_metrics.calculate_metrics` returns) with the SLOs.  Each
SLO's margin is relative, ``(value - bound) / bound`` (0.25 = 25 % over), so SLOs in different units compare and
Optuna can take them as constraints (<= 0 feasible); ``error_rate=0`` has no scale, its margin is the error
rate itself.  The binding SLO is the one with the largest margin: the one that fails first, or, when all hold,
the one with the least headroom.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsctl.core.load.probe_metrics import GOODPUT_METRICS
from dsctl.core.load.slo_spec import (  # noqa: F401  (re-exported: the tuner's names for the grammar)
    DEFAULT_STATISTIC,
    ERROR_RATE,
    EXAMPLE,
    LATENCY_METRICS,
    METRICS,
    STATISTICS,
    Slo,
    lex,
    parse_slos,
    to_slo,
)


def parse_slo_token(token: str) -> Slo:
    """One ``metric[:statistic]=value[unit]`` (or ``metric:ms``) token -> `Slo`; `UsageError` naming the fix."""
    return to_slo(lex(token))


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


def goodput_bounds_ms(slos: Sequence[Slo]) -> dict[str, float]:
    """The per-request bounds a probe's goodput counts (vLLM's --goodput keys ttft, tpot, e2el): for each metric
    the tightest bound over its statistics.  ITL and error_rate have no per-request form."""
    bounds: dict[str, float] = {}
    for slo in slos:
        if slo.metric in GOODPUT_METRICS:
            bounds[slo.metric] = min(bounds.get(slo.metric, math.inf), slo.bound)
    return bounds


def goodput_slos(slos: Sequence[Slo]) -> tuple[Slo, ...]:
    """The SLOs a probe takes as per-request goodput bounds (`dsctl.services.probe.ProbeConfig.goodput`): for
    each of ttft, tpot, e2el the SLO with the tightest bound (the bounds of `goodput_bounds_ms`), at its own
    statistic.  Each is one of ``slos``, so a probe that certainly misses one has missed the SLOs: its early
    stop is sound whatever statistics the SLOs bind."""
    tightest: dict[str, Slo] = {}
    for slo in slos:
        if slo.metric in GOODPUT_METRICS and (slo.metric not in tightest or slo.bound < tightest[slo.metric].bound):
            tightest[slo.metric] = slo
    return tuple(tightest.values())


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
