"""The load side of a tune: for one configuration, the highest request rate whose SLO holds (pure; the probe is
injected).

Feasibility is taken as monotone in the rate (higher load never lowers the latency statistics; AIPerf's
``monotonic`` search makes the same assumption, serving-and-tuning.md 5), so the search keeps a bracket: the
highest rate that held (``lo``) and the lowest that missed (``hi``).

1. Probe ``start``.  If it holds, multiply the rate by ``growth`` until one misses or ``max_rate`` holds; if it
   misses, divide until one holds or ``min_rate`` misses.  Stepping down, the rate the overloaded probe actually
   completed (its request_throughput) is used when it is lower: a server that completed 1.2 req/s while offered
   10 (vllm-ascend#3112) is not probed at 5 next.  Not after a probe stopped early (`STOPPED_EARLY`): a window
   of a few dozen requests while a queue built up completed nothing that measures the server.
2. Bisect the bracket geometrically (rates span orders of magnitude) until ``hi / lo - 1 <= rel_tol``.
3. Repeat the winning rate ``repeats`` times (single-run verdicts flip under noise: AIPerf's caveat, vLLM's 3
   runs).  If a repeat misses, that rate becomes ``hi`` and the search continues below it.

Throughput-bound tops.  A probe that misses because the server completed more than `capacity.THROUGHPUT_SLACK`
less than it was offered measured what the overloaded server completes.  Every offered rate up to that rate /
(1 - slack) passes the slack test, so in that band the verdict flips with the draw and bisecting it measures the
draw, not the configuration (bench/tune.py moe-vllm: one configuration held at 45.3 req/s, missed its repeats
there and at 45.75, and with the probes spent fell back to 32, while the server completed 43.4 at every rate
above; its workload seeds measured 32.0, 43.3 and 46.2).  So once some probe missed on throughput, the server's
throughput is taken as the best window's achieved rate (`_throughput`), the bisection probes that rate next when
it lies inside the bracket, and the bracket is resolved once the held ``lo`` is within ``rel_tol`` of it: the
capacity of a throughput-bound configuration is the rate its server completes (the slack test would pass up to
5 % more), and its noise is the gap between ``lo`` and that rate, not the bracket's width.  After a repeat that
missed on throughput, rates that held above that throughput (a lucky draw in the band) are not taken as ``lo``.

``prune_at`` (the incumbent's capacity, asked before each probe) spares probes that cannot change the answer:
once a rate at or below it missed, this configuration cannot beat the incumbent (its capacity is below that
rate), so its exact capacity is not worth measuring (Optuna's pruners stop unpromising trials for the same
reason).  Live every probe costs a window of wall time, and at low rates the sample-size rule makes windows long
(60 requests at 0.5 req/s are two minutes): a lab trial of capacity 1.4 req/s ran seven probes for 307 s beside a
baseline that held 16 req/s; pruned, it stops at the first probe after the baseline's verdict.

A probe's verdict is `capacity.judge_probe`'s: the SLOs, and a miss when the metrics carry a steady-state verdict
that says the window was not sustained.  A search that held at ``max_rate`` (the ceiling) says so
(``at_ceiling``): its rate is a lower bound, not a measured capacity.

A probe whose load generator was the limit (`dsctl.core.load.generator_limit`: the client sent late, ran out of
CPU, or the controller's CPUs were saturated while throughput fell short) says nothing about the instance: it is
neither a held nor a missed verdict.  It is repeated once (`measured`; a passing hiccup of the controller), and when
the repeat is limited too the search ends with no capacity (``unmeasured``: "the load generator was the limit at X
req/s: why"), so the trial is never ranked on what the controller could do.  The repeat is not counted against
``max_probes``: it is not a verdict.

Rates are floats throughout (vllm-project/vllm#47651: integer anchors broke below 1 req/s).  Every probe counts
against ``max_probes`` (repeats included; the repeats are reserved up front), so the search always ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsctl.core.load import generator_limit
from dsctl.core.tune import capacity
from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.search import Failure, Outcome

Probe = Callable[[float], Mapping[str, Any]]  # rate (req/s) -> probe_metrics.calculate_metrics summary
# A probe's metrics carry this (true) when the probe stopped as soon as its miss was certain (live tune's early
# stop): its window lasted a few dozen requests while a queue built up, so what it completed says nothing about the
# server's throughput (a lab tune halved from 39 req/s straight to the 0.87 such a window "completed")
STOPPED_EARLY = "stopped_early"


class GeneratorLimited(Exception):
    """A probe and its repeat were both limited by the load generator: the rate is unmeasured (the message says
    at what rate and why)."""


def limited(metrics: Mapping[str, Any]) -> str | None:
    """Why the load generator was the limit of the probe with these metrics (its `generator_limit.KEY` verdict),
    or None when it was not (or the metrics carry no verdict: a simulated probe)."""
    verdict = metrics.get(generator_limit.KEY) or {}
    if not verdict.get("limited"):
        return None
    return f"{generator_limit.figures(verdict)}: {verdict.get('reason')}"


def measured(probe: Probe) -> Probe:
    """``probe``, repeated once when the load generator was its limit; raises `GeneratorLimited` when the repeat
    was limited too (see the module's docstring)."""

    def run(rate: float) -> Mapping[str, Any]:
        metrics = probe(rate)
        if limited(metrics) is None:
            return metrics
        metrics = probe(rate)
        why = limited(metrics)
        if why is None:
            return metrics
        raise GeneratorLimited(f"the load generator was the limit at {rate:.3g} req/s (twice): {why}")

    return run


@dataclass(frozen=True)
class RateProbe:
    rate: float
    met: bool
    margin: float
    binding: str
    metrics: Mapping[str, Any]
    repeat: bool = False


@dataclass(frozen=True)
class RateSearchResult:
    rate: float | None  # the highest rate that held (and held again on every repeat); None: even min_rate missed
    lowest_missing: float | None  # the lowest rate that missed; None: max_rate held
    probes: tuple[RateProbe, ...]
    stopped: str
    confirmed: bool = True  # False: the probe budget ran out before ``rate`` could be repeated
    ceiling: float | None = None  # the search's max_rate
    completed: float | None = None  # throughput-bound: the most the server completed in a window (`_throughput`)
    unmeasured: str = ""  # why no capacity was measured: the load generator was the limit (`measured`)

    @property
    def at_ceiling(self) -> bool:
        """No rate above ``rate`` missed (the ceiling held, or the probes ran out climbing): capacity is at least
        ``rate``, and nothing above it was measured."""
        return self.rate is not None and self.lowest_missing is None

    @property
    def noise(self) -> float:
        """`capacity.relative_noise` of the verdict: the bracket's width, the repeats' spread at ``rate``."""
        if self.rate is None:
            return 0.0
        achieved = [(p.metrics.get(capacity.STEADY) or {}).get("achieved_rate") for p in self.probes
                    if p.rate == self.rate and p.met]
        upper = self.lowest_missing
        if self.completed is not None and upper is not None:  # throughput-bound: the gap to what the server completed
            upper = min(upper, max(self.rate, self.completed))
        return capacity.relative_noise(self.rate, upper, [a for a in achieved if a is not None])

    @property
    def metrics(self) -> Mapping[str, Any] | None:
        """The metrics of the last probe at the reported rate."""
        if self.rate is None:
            return None
        return next(p.metrics for p in reversed(self.probes) if p.rate == self.rate and p.met)

    @property
    def closest(self) -> RateProbe | None:
        """With no rate holding: the missed probe nearest to the SLO (for "the binding constraint" in the report).
        Only a miss: a probe that held where its repeat missed (no rate held) would hand the search metrics that meet
        the SLO, and the trial would count as feasible at a rate that did not hold (seen on a long-context vllm-ascend
        landscape, bench/landscape.py)."""
        missed = [p for p in self.probes if not p.met]
        return min(missed or self.probes, key=lambda p: p.margin) if self.probes else None


def capacity_summary(result: RateSearchResult) -> dict[str, Any]:
    """What the report shows of a trial's capacity: the sustained rate (None: none held), whether it is only the
    ceiling's lower bound, the window and samples of its probe, the interval and noise of the verdict."""
    steady = dict((result.metrics or {}).get(capacity.STEADY) or {}) if result.rate is not None else {}
    return {"sustained_rate": result.rate, "at_ceiling": result.at_ceiling, "ceiling": result.ceiling,
            "interval": [result.rate, result.lowest_missing], "noise": result.noise,
            "window_s": steady.get("window_s"), "samples": steady.get("samples"), "warmup": steady.get("warmup"),
            "required": steady.get("required"), "undersized": steady.get("undersized"),
            "offered_rate": steady.get("offered_rate"), "achieved_rate": steady.get("achieved_rate")}


def to_outcome(result: RateSearchResult, **data: Any) -> Outcome:
    """The search driver's `Outcome` for a rate search: the metrics at the highest rate that held (the objective
    then comes from them: goodput or throughput at that rate), or, when none held, the probe nearest to the SLO
    (recorded as an SLO miss with its binding constraint); a search the load generator limited is unmeasured, with
    no metrics to rank it on."""
    if result.unmeasured:
        return Outcome(failure=Failure.UNMEASURED, detail=result.unmeasured,
                       data={"rate_search": _summary(result), "capacity": capacity_summary(result), **data})
    if result.rate is not None:
        return Outcome(metrics=result.metrics, rate=result.rate,
                       data={"rate_search": _summary(result), "capacity": capacity_summary(result), **data})
    closest = result.closest
    return Outcome(metrics=None if closest is None else closest.metrics,
                   rate=None if closest is None else closest.rate, detail=result.stopped,
                   data={"rate_search": _summary(result), "capacity": capacity_summary(result), **data})


def _summary(result: RateSearchResult) -> dict[str, Any]:
    return {"rate": result.rate, "lowest_missing": result.lowest_missing, "stopped": result.stopped,
            "confirmed": result.confirmed, "ceiling": result.ceiling, "at_ceiling": result.at_ceiling,
            "completed": result.completed, "unmeasured": result.unmeasured or None,
            "probes": [{"rate": p.rate, "met": p.met, "margin": p.margin, "binding": p.binding, "repeat": p.repeat,
                        **_window(p)} for p in result.probes]}


def _window(p: RateProbe) -> dict[str, Any]:
    steady = p.metrics.get(capacity.STEADY)
    if not steady:
        return {}
    return {"sustained": steady.get("sustained"), "window_s": steady.get("window_s"),
            "samples": steady.get("samples"), "achieved_rate": steady.get("achieved_rate")}


def search_rate(probe: Probe, slos: Sequence[slo_mod.Slo], *, start: float, min_rate: float, max_rate: float,
                max_probes: int = 10, rel_tol: float = 0.05, repeats: int = 1, growth: float = 2.0,
                prune_at: Callable[[], float | None] | None = None) -> RateSearchResult:
    """The highest rate in [min_rate, max_rate] at which ``probe``'s metrics meet ``slos`` (``prune_at``: the
    rate to beat, see the module's docstring); none, ``unmeasured``, when the load generator was the limit."""
    probes: list[RateProbe] = []
    try:
        return _search_rate(measured(probe), slos, probes, start=start, min_rate=min_rate, max_rate=max_rate,
                            max_probes=max_probes, rel_tol=rel_tol, repeats=repeats, growth=growth, prune_at=prune_at)
    except GeneratorLimited as limit:
        return RateSearchResult(None, None, tuple(probes), str(limit), ceiling=max_rate, unmeasured=str(limit))


def _search_rate(probe: Probe, slos: Sequence[slo_mod.Slo], probes: list[RateProbe], *, start: float,
                 min_rate: float, max_rate: float, max_probes: int, rel_tol: float, repeats: int, growth: float,
                 prune_at: Callable[[], float | None] | None) -> RateSearchResult:
    if not 0 < min_rate <= max_rate or not math.isfinite(max_rate):
        raise ValueError(f"need 0 < min_rate <= max_rate < inf, got {min_rate}, {max_rate}")
    if max_probes < 1 + repeats or repeats < 0:
        raise ValueError(f"max_probes ({max_probes}) must leave room for the {repeats} repeat(s) and one probe")
    if growth <= 1 or rel_tol <= 0:
        raise ValueError("growth must exceed 1 and rel_tol must be positive")

    def run(rate: float, repeat: bool = False) -> RateProbe:
        metrics = probe(rate)
        verdict = capacity.judge_probe(slos, metrics)
        result = RateProbe(rate, verdict.met, verdict.margin, verdict.binding, metrics, repeat)
        probes.append(result)
        return result

    def searching_left() -> int:  # probes left for the search, the repeats kept aside
        return max_probes - repeats - len(probes)

    def pruned() -> RateSearchResult | None:
        incumbent = prune_at() if prune_at is not None and hi is not None else None
        if incumbent is None or hi > incumbent:
            return None
        return RateSearchResult(lo, hi, tuple(probes), f"pruned: missed at {hi:.3g} req/s, not above the best "
                                f"capacity so far ({incumbent:.3g} req/s)", ceiling=max_rate,
                                confirmed=lo is None)  # a rate that held was not repeated: it cannot win

    lo: float | None = None
    hi: float | None = None
    rate = min(max(start, min_rate), max_rate)
    first = run(rate)
    lo, hi = (rate, None) if first.met else (None, rate)
    last = first
    # 1. bracket
    while searching_left() > 0 and (lo is None or hi is None):
        if (stop := pruned()) is not None:
            return stop
        if lo is not None:
            if lo >= max_rate:
                break
            rate = min(lo * growth, max_rate)
        else:
            if hi <= min_rate:
                break
            rate = hi / growth
            completed = None if last.metrics.get(STOPPED_EARLY) else last.metrics.get("request_throughput")
            if completed is not None and 0 < completed < rate:
                rate = completed
            rate = max(rate, min_rate)
        last = run(rate)
        if last.met:
            lo = rate
        else:
            hi = rate
    def resolved_at() -> float | None:
        """The server's throughput when the held ``lo`` is within rel_tol of it (see "Throughput-bound tops")."""
        completed = _throughput(probes)
        return completed if completed is not None and lo is not None and completed <= lo * (1 + rel_tol) else None

    while True:
        # 2. bisect (see "Throughput-bound tops")
        while searching_left() > 0 and lo is not None and hi is not None and hi / lo - 1 > rel_tol:
            if (stop := pruned()) is not None:
                return stop
            if resolved_at() is not None:
                break
            rate = math.sqrt(lo * hi)
            completed = _throughput(probes)
            if completed is not None and lo < completed < hi and not any(p.rate == completed for p in probes):
                rate = completed
            if run(rate).met:
                lo = rate
            else:
                hi = rate
        resolved = resolved_at() if hi is not None else None
        if lo is None:
            return RateSearchResult(None, hi, tuple(probes), f"even {min_rate:g} req/s misses the SLO"
                                    if hi is not None and hi <= min_rate else "no rate held within the probe budget",
                                    ceiling=max_rate)
        # 3. confirm
        confirmed, missed = True, False
        for _ in range(repeats):
            if len(probes) >= max_probes:
                confirmed = False
                break
            if not run(lo, repeat=True).met:
                missed = True
                break
        if not confirmed:
            # out of probes before the repeat: fall back to the highest rate that was repeated and held, if any
            safe = [p.rate for p in probes if p.repeat and p.met and p.rate < lo and not _missed_at(probes, p.rate)]
            if safe:
                return RateSearchResult(max(safe), hi, tuple(probes), "probe budget spent; reporting the highest "
                                        "rate that held on a repeat", ceiling=max_rate)
            return RateSearchResult(lo, hi, tuple(probes), "probe budget spent before a repeat", confirmed=False,
                                    ceiling=max_rate, completed=resolved)
        if not missed:
            if hi is None:
                stopped = f"max_rate {max_rate:g} req/s holds" if lo >= max_rate else "probe budget spent"
            elif resolved is not None:
                stopped = (f"throughput-bound: the server completes at most {resolved:.3g} req/s (its best window; "
                           f"{hi:.3g} offered missed); {lo:.3g} held")
            elif hi / lo - 1 <= rel_tol:
                stopped = f"bracketed within {rel_tol:.0%}"
            else:
                stopped = "probe budget spent"
            return RateSearchResult(lo, hi, tuple(probes), stopped, ceiling=max_rate, completed=resolved)
        # the repeat missed: that rate is not safe; continue below it with the rates that held there, but not
        # above what the server completed in that repeat when it missed on throughput (a lucky draw in the band)
        hi = lo
        below = _throughput(probes)
        held_below = [p.rate for p in probes if p.rate < hi and p.met and not _missed_at(probes, p.rate)
                      and (below is None or p.rate <= below * (1 + rel_tol))]
        lo = max(held_below) if held_below else None
        if lo is None and searching_left() > 0:
            rate = max(hi / growth, min_rate)
            if rate < hi and run(rate).met:
                lo = rate
        # each pass through this loop used at least one probe (the repeat that missed), so it ends


def _throughput(probes: Sequence[RateProbe]) -> float | None:
    """What the server completes at most, once some probe missed on throughput (its window's achieved rate more
    than `capacity.THROUGHPUT_SLACK` short of the offered one; not a growing queue, whose achieved rate says
    nothing): the highest achieved rate of those misses and of the probes that held (each a lower bound: one
    window at a heavy overload can complete less than the server's best, lab tune with 5-s windows: 31.7 req/s at
    64 offered, 34.9 at 32).  None when no probe missed on throughput."""
    shortfall, held = [], []
    for probe in probes:
        if probe.metrics.get(STOPPED_EARLY):
            continue
        steady = probe.metrics.get(capacity.STEADY) or {}
        achieved, offered = steady.get("achieved_rate"), steady.get("offered_rate")
        if achieved is None or not math.isfinite(achieved) or achieved <= 0:
            continue
        if probe.met:
            held.append(float(achieved))
        elif probe.binding == "sustained" and capacity.short_of_offered(offered, achieved):
            shortfall.append(float(achieved))
    return max(shortfall + held) if shortfall else None


def _missed_at(probes: Sequence[RateProbe], rate: float) -> bool:
    return any(p.rate == rate and not p.met for p in probes)
