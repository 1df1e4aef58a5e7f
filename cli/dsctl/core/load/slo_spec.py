"""The one SLO grammar of dsctl (pure): ``estimate --slo``, ``probe --goodput``, ``tune --slo``, ``upgrade --slo``
and, with a percentage for a value, ``upgrade --max-regression``.

Grammar (one term; several are comma-separated, or given as repeated options)::

    metric[:stat]=value[unit]   ttft=200ms, ttft:p95=200ms, tpot:mean=50ms, e2el=2s, error_rate=1%
    metric:value[unit]          vLLM's --goodput form: ttft:200 is ttft=200ms (a bare number is ms, as in vLLM)

* metric: ttft, tpot, itl, e2el (`vllm bench serve`'s definitions, dsctl.core.load.probe_metrics) and
  error_rate (failed / finished requests, a percentage or a fraction).
* stat: mean, median (= p50), p50, p90, p95, p99: the statistics ``dsctl probe`` reports.  ``ttft.p95`` (a dot,
  the upgrade gate's older spelling) means ``ttft:p95``.
* unit: ms or s for latencies (a bare number is ms); % (or a bare fraction) for error_rate.

Which statistic a term without one binds is the command's: ``dsctl tune``, ``dsctl estimate`` and
``dsctl upgrade --slo`` bind p99 (vLLM's benchmarks/auto_tune binds P99 E2EL); ``dsctl probe`` binds its
``--slo-stat`` (default p90).  vLLM's own --goodput is a per-request bound with no statistic; in a verdict it
therefore binds that same default, so ``ttft:200`` and ``ttft=200ms`` mean one thing in every command.  What a
command cannot honour (estimate does not model itl, probe's per-request goodput has no itl or error_rate form) it
refuses in one line naming what it supports -- never silently.

Every error is one line naming the option, the term and the fix (`UsageError`, exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.load import limits
from dsctl.errors import UsageError

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
ERROR_RATE = "error_rate"
METRICS = (*LATENCY_METRICS, ERROR_RATE)
DEFAULT_STATISTIC = "p99"
STATISTICS = ("mean", "p50", "p90", "p95", "p99")  # probe_metrics.PERCENTILES and the mean
STAT_ALIASES = {"median": "p50", "avg": "mean", "average": "mean"}
# A latency bound's range: a microsecond (below any HTTP round trip, so such a bound is always missed) to a day
# (limits.SECONDS_PER_DAY). A 400-digit number is read as inf by float(): the bound refuses it.
MIN_LATENCY_MS = 0.001
MAX_LATENCY_MS = int(limits.SECONDS_PER_DAY * 1000)
EXAMPLE = "e.g. ttft=200ms, ttft:p95=200ms, vLLM's ttft:200, tpot=50ms, e2el=2s or error_rate=1%"

_NUMBER = r"(?P<number>[0-9]*\.?[0-9]+)(?P<unit>ms|s|%)?"
# metric[:stat]=value: the statistic starts with a letter, so that ttft:200 is never read as one
_FULL = re.compile(r"(?P<metric>[a-z_][a-z0-9_]*)(?:[:.](?P<stat>[a-z][a-z0-9_.]*))?=" + _NUMBER)
_VLLM = re.compile(r"(?P<metric>[a-z_][a-z0-9_]*):" + _NUMBER)


@dataclass(frozen=True)
class Term:
    """One lexed term: what was written, before any command gives it a meaning."""

    text: str  # as given, for messages
    metric: str
    statistic: str | None  # canonical (median -> p50); None when not written
    number: float
    unit: str | None  # "ms", "s", "%" or None (bare)


def is_term(token: str) -> bool:
    """Whether ``token`` has the shape of a term (either form), whatever its words mean."""
    text = token.strip().lower()
    return bool(_FULL.fullmatch(text) or _VLLM.fullmatch(text))


def lex(token: str, option: str = "--slo") -> Term:
    """``ttft:p95=200ms`` / ``ttft:200`` -> `Term`; one-line `UsageError` when it is neither form."""
    text = token.strip().lower()
    match = _FULL.fullmatch(text) or _VLLM.fullmatch(text)
    if match is None:
        raise UsageError(f"{option} {token!r}: expected metric[:stat]=value[ms|s|%] or vLLM's metric:ms; {EXAMPLE}")
    stat = match.groupdict().get("stat")
    if stat is not None:
        stat = STAT_ALIASES.get(stat, stat)
        if stat not in STATISTICS:
            raise UsageError(f"{option} {token!r}: unknown statistic {match['stat']!r}; use one of "
                             f"{', '.join(STATISTICS)} (or median)")
    return Term(token.strip(), match["metric"], stat, float(match["number"]), match["unit"])


def terms(values: Iterable[str], option: str = "--slo") -> list[Term]:
    """Every option value (each may hold several terms, comma- or space-separated) -> its terms, in order."""
    out: list[Term] = []
    for value in values:
        parts = [part.strip() for part in str(value).split(",")]
        if not any(parts):
            raise UsageError(f"{option} {value!r}: empty; {EXAMPLE}")
        for part in parts:
            if not part:
                raise UsageError(f"{option} {value!r}: an empty item between commas; remove the extra comma")
            out.extend(lex(word, option) for word in part.split())  # vLLM separates its terms by spaces
    return out


@dataclass(frozen=True)
class Slo:
    """``metric`` at ``statistic`` <= ``bound`` (ms for latencies, a fraction for error_rate)."""

    metric: str
    statistic: str | None  # None for error_rate
    bound: float
    source: str = field(default="", compare=False, repr=False)  # the term as written, for messages

    @property
    def written(self) -> str:
        """What the user wrote (the canonical label for an SLO built in code)."""
        return self.source or self.label

    @property
    def key(self) -> str:
        """``ttft:p99``, ``error_rate``: the name of its constraint and of its value in results."""
        return self.metric if self.statistic is None else f"{self.metric}:{self.statistic}"

    @property
    def label(self) -> str:
        """The canonical term: parsing it gives this `Slo` back (state files store it)."""
        if self.metric == ERROR_RATE:
            return f"{ERROR_RATE}={self.bound * 100:g}%"
        return f"{self.key}={self.bound:g}ms"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "statistic": self.statistic, "bound": self.bound, "label": self.label}


def to_slo(term: Term, option: str = "--slo", default_statistic: str = DEFAULT_STATISTIC) -> Slo:
    """A lexed term as an SLO bound; a term without a statistic binds ``default_statistic``."""
    def fail(why: str) -> UsageError:
        return UsageError(f"{option} {term.text!r}: {why}")

    if term.metric not in METRICS:
        raise fail(f"unknown metric {term.metric!r}; use one of {', '.join(METRICS)}")
    if term.metric == ERROR_RATE:
        if term.statistic is not None:
            raise fail("error_rate takes no statistic; write error_rate=1%")
        if term.unit in ("ms", "s"):
            raise fail("error_rate is a share of requests, not a time; write error_rate=1% or 0.01")
        bound = term.number / 100.0 if term.unit == "%" else term.number
        if bound > 1:
            raise fail("error_rate above 100 % means nothing; write a percentage such as error_rate=1%")
        return Slo(ERROR_RATE, None, bound, term.text)
    if term.unit == "%":
        raise fail(f"{term.metric} is a time; write it in ms or s, e.g. {term.metric}=200ms")
    bound = term.number * 1000.0 if term.unit == "s" else term.number
    if not bound > 0:
        raise fail(f"a latency bound must be positive; write e.g. {term.metric}=200ms")
    try:  # the one number rule (dsctl.core.load.limits): finite, and a latency a request can have
        limits.number(f"{option} {term.metric}", bound, MIN_LATENCY_MS, MAX_LATENCY_MS, "ms", " (a day)")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Slo(term.metric, term.statistic or default_statistic, bound, term.text)


def parse_slos(values: Iterable[str], option: str = "--slo", *, default_statistic: str = DEFAULT_STATISTIC,
               required: bool = True) -> tuple[Slo, ...]:
    """Every option value -> the SLOs, in the order given; all of them must hold.

    The same metric may be bound at two statistics (``ttft:p50=100ms,ttft:p99=300ms``); the same metric and
    statistic twice is refused."""
    slos: list[Slo] = []
    seen: dict[str, str] = {}
    for term in terms(values, option):
        slo = to_slo(term, option, default_statistic)
        if slo.key in seen:
            raise UsageError(f"{option} {term.text!r}: {slo.key} is already bound by {seen[slo.key]!r}; "
                             "keep one of them")
        seen[slo.key] = term.text
        slos.append(slo)
    if required and not slos:
        raise UsageError(f"{option} is required; {EXAMPLE}")
    return tuple(slos)


def refuse_unsupported(slos: Iterable[Slo], supported: Iterable[str], option: str, command: str,
                       why: str = "") -> None:
    """One line naming the first SLO whose metric ``command`` cannot honour, and the metrics it can."""
    allowed = tuple(supported)
    for slo in slos:
        if slo.metric not in allowed:
            raise UsageError(f"{option} {slo.written!r}: {command} takes {', '.join(allowed)}, not "
                             f"{slo.metric}{why}")
