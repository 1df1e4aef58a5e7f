"""Capacity under an SLO: how a probe is sized, when a rate counts as sustained, the rate search's ceiling, and when
one trial beats another beyond the noise (pure, no I/O).

A trial's capacity is the highest offered rate (req/s, Poisson) the instance *sustains* while meeting every SLO.
Each probe at rate r is judged on a measured window that follows a warm-up at the same rate:

Sample-size rule (`probe_size`).  The SLO's percentile must rest on at least `TAIL_SAMPLES` (10) requests beyond
it in the measured window: ``measured >= 10 / (1 - q)``, so p99 needs 1000 measured requests, p95 200, p90 100;
a mean or a median needs `CENTRAL_SAMPLES` (50); ``error_rate=b`` needs 10 / b (10 failures at the bound), at most
1000.  The warm-up is 10 % of the measured requests, at least 10, sent at the same rate and kept out of every
statistic (the queue and the batch fill up in it).  The window must also last `SIM_WINDOW_S` (300 s of virtual
time in simulation, where time costs only the evaluator's CPU) or `LIVE_WINDOW_S` (10 s of the engine's modelled
time live, where it is wall time divided by the lab engine's time scale), so that at high rates it is a load, not
a burst: ``measured = max(percentile rule, ceil(r x window))``; ``--window`` sets either.  Why these windows
(measured on the simulator, not from a source): near capacity a queue settles slowly, and a fixed-batch engine
finishes its requests a batch at a time, so a short window both sees the queue still building and counts few
completions.  R1-Distill-Qwen-7B on one 910B3 (bench/landscape.py chat-fixed), capacity over six workload seeds:
batch 59 x 2 streams 5.3-6.8 req/s (sd 9 %) at 100 s, 6.65-7.34 (sd 3 %) at 300 s; batch 32 x 3 streams sd 5.3 %
at 100 s, 1.5 % at 300 s; at 20 s one configuration spanned 1.4-4.4 req/s.  A 300-s window costs about 2.5x the
CPU of a 100-s one.  10 s keeps a live trial of ~8 probes near two minutes, and its verdicts are the noisier for
it (the repeat and the interval say how much).
``--requests`` is a floor on the measured requests: a value below the rule for the SLOs' statistics is refused
(one line, exit 2) rather than reported as if it meant the percentile.

Sustained rule (`steady_state`).  Over the measured window: the achieved throughput is within `THROUGHPUT_SLACK`
(5 %) of the offered one, both taken between the 10th and 90th percentile of the measured requests' arrival and
finish times (order statistics, so one slow request at either end does not move them; a failed request counts as
not achieved); and the queue is not growing: the mean number of requests in flight (sent, not yet finished,
warm-up included) seen by the window's second half of arrivals is at most `GROWTH_FACTOR` (1.25) x the first
half's + `GROWTH_SLACK_REQUESTS` (2) + two standard deviations of a Poisson count of the first half's mean
(2 x sqrt(first)).  The thresholds are inferred (a guess at what separates the noise of a stable queue, whose
count in flight is about Poisson, from an overload over these windows), stated here and in the report; without the
sqrt term a burst at a quarter of capacity (2.6 -> 7.5 in flight, bench/landscape.py chat-fixed seed 303) failed
every rate of a trial.  Why requests in flight and not TTFT: a static
batching engine (the fixed-batch server) gives a request a TTFT that depends on where the running batch is, so the
halves' median TTFT differed by 1.5-10x at a third of capacity (bench/landscape.py chat-fixed, 45 of 60 probes at
0.5-2 req/s called "growing"), while the count in flight only grows when arrivals outrun completions.  A probe that
is not sustained is a miss, whatever its SLO statistics: the rate is above capacity and its latencies only
describe how far a queue had grown when the window ended.

Ceiling (`rate_ceiling`).  The rate search's upper end is `CEILING_FACTOR` (2) x estimate's throughput bound
(requests/s of a full batch on the roofline, for the workload's shortest requests).  A trial whose search held
at the ceiling reports "≥ ceiling (not measured above)", never a measured capacity.

Floor (`rate_floor`).  The lower end is the engine's fixed floor (simulated 0.05 req/s, live 0.1) or the ceiling /
`FLOOR_SPAN` (32: a sixteenth of the throughput bound), whichever is lower.  Why: on 32K-64K prompts with 512-1024-
token answers (bench/landscape.py long-fixed) the bound is 0.19 req/s and the best configurations sustain 0.04-0.06
under the SLO; with the fixed floor their capacity straddled it, and a draw that held only below it ended "even
0.05 req/s misses the SLO": the top configuration of that landscape failed at two of nine workload seeds.

Noise (`relative_noise`, `beats`).  A capacity verdict's noise is the larger of the search's resolution (the
bracket ``highest held .. lowest missed``, relative) and the spread of the repeats at the winning rate (their
achieved throughput, (max - min) / mean).  A candidate replaces the incumbent only when its capacity exceeds the
incumbent's by more than the larger of their two noises; otherwise they tie and the incumbent (the earlier
trial; live, the baseline is the first) stays.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dsctl.core.load import probe_metrics
from dsctl.core.load.probe_metrics import RequestRecord
from dsctl.core.tune import slo as slo_mod
from dsctl.errors import UsageError

TAIL_SAMPLES = 10  # requests beyond the SLO's percentile in the measured window
CENTRAL_SAMPLES = 50  # a mean or a median
MAX_ERROR_RATE_SAMPLES = 1000  # error_rate=b asks 10 / b, capped here (as p99)
WARMUP_SHARE, MIN_WARMUP = 0.10, 10
SIM_WINDOW_S = 300.0  # virtual seconds: the simulator's time costs only its CPU
LIVE_WINDOW_S = 10.0  # modelled seconds of a live probe
MAX_WINDOW_S = 3600.0  # --window's bound: an hour of (virtual or modelled) time per probe
THROUGHPUT_SLACK = 0.05  # achieved within 5 % of offered
GROWTH_FACTOR, GROWTH_SLACK_REQUESTS = 1.25, 2.0  # second half's mean in flight <= 1.25 x first + 2 + 2 sqrt(first)
CEILING_FACTOR = 2.0
FLOOR_SPAN = 32.0  # the rate search's floor reaches down to ceiling / FLOOR_SPAN (see "Floor")
STEADY = "steady_state"  # the key of a probe's sustained verdict in its metrics


def required_samples(slos: Sequence[slo_mod.Slo]) -> int:
    """The fewest measured requests the SLOs' statistics rest on (the sample-size rule)."""
    need = CENTRAL_SAMPLES
    for slo in slos:
        if slo.metric == slo_mod.ERROR_RATE:
            if slo.bound > 0:
                need = max(need, min(MAX_ERROR_RATE_SAMPLES, math.ceil(TAIL_SAMPLES / slo.bound - 1e-9)))
            continue
        q = _quantile(slo.statistic)
        if q is not None and q > 0.5:
            need = max(need, math.ceil(TAIL_SAMPLES / (1.0 - q) - 1e-9))
    return need


def _quantile(statistic: str | None) -> float | None:
    if statistic is None or statistic == "mean":
        return None
    return float(statistic.removeprefix("p").replace("_", ".")) / 100.0


def warmup_for(measured: int) -> int:
    return max(MIN_WARMUP, math.ceil(WARMUP_SHARE * measured))


@dataclass(frozen=True)
class ProbeSize:
    rate: float  # offered, req/s
    warmup: int  # requests at the same rate before the window, kept out of every statistic
    measured: int  # requests in the window
    min_window_s: float
    rule: int  # what the sample-size rule alone asks

    @property
    def requests(self) -> int:
        return self.warmup + self.measured

    @property
    def window_s(self) -> float:
        return self.measured / self.rate


def check_floor(slos: Sequence[slo_mod.Slo], requests: int | None) -> None:
    """``--requests`` is a floor: below the sample-size rule of the SLOs' statistics it is refused."""
    if requests is None:
        return
    need = required_samples(slos)
    if requests < need:
        stats = ", ".join(s.label for s in slos)
        raise UsageError(f"--requests {requests}: {stats} needs at least {need} measured requests per probe "
                         f"({TAIL_SAMPLES} beyond the percentile; a mean or median {CENTRAL_SAMPLES}); leave "
                         "--requests out, or bind a lower statistic (e.g. ttft:median=...)")


def check_window(window_s: float) -> None:
    """``--window`` must be a positive number of seconds, at most `MAX_WINDOW_S`."""
    if not 0 < window_s <= MAX_WINDOW_S:
        raise UsageError(f"--window must be in (0, {MAX_WINDOW_S:g}] s, got {window_s:g}")


def probe_size(slos: Sequence[slo_mod.Slo], rate: float, *, min_window_s: float, floor: int | None = None,
               max_requests: int | None = None) -> ProbeSize:
    """How many requests a probe at ``rate`` sends: the warm-up, then ``max(rule, floor, rate x window)``
    measured ones (``max_requests`` caps warm-up + measured; a capped probe is undersized, see `steady_state`)."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be positive and finite, got {rate}")
    rule = required_samples(slos)
    measured = max(rule, floor or 0, math.ceil(rate * min_window_s - 1e-9))
    warmup = warmup_for(measured)
    if max_requests is not None and warmup + measured > max_requests:
        measured = max(1, math.floor(max_requests / (1 + WARMUP_SHARE)))
        warmup = max(0, min(warmup_for(measured), max_requests - measured))
    return ProbeSize(rate, warmup, measured, min_window_s, rule)


# --------------------------------------------------------------------------- the sustained verdict


@dataclass(frozen=True)
class SteadyState:
    sustained: bool
    reason: str  # why not (empty when sustained)
    offered_rate: float | None  # req/s over the window's arrivals
    achieved_rate: float | None  # req/s over its successful completions (failures count as not achieved)
    window_s: float  # the measured window: first to last arrival
    samples: int  # measured requests
    warmup: int
    required: int  # what the sample-size rule asks
    in_flight_first_half: float | None  # mean requests in flight at the arrivals of the window's first half
    in_flight_second_half: float | None

    @property
    def undersized(self) -> bool:
        return self.samples < self.required

    @property
    def shortfall(self) -> float:
        """1 - achieved / offered (0 when achieved is at least offered; 1 when nothing completed)."""
        if not self.offered_rate:
            return 0.0
        return max(0.0, 1.0 - (self.achieved_rate or 0.0) / self.offered_rate)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "undersized": self.undersized}


def steady_state(records: Sequence[RequestRecord], warmup: int, *, required: int) -> SteadyState:
    """The sustained verdict of a probe's records (in send order; the first ``warmup`` are the warm-up)."""
    measured = list(records[warmup:])
    n = len(measured)
    arrivals = sorted(r.scheduled for r in measured)
    ok = [r for r in measured if r.success]
    finishes = sorted(r.chunk_times[-1] for r in ok)
    offered, _ = probe_metrics.inner_rate(arrivals, n)
    achieved, _ = probe_metrics.inner_rate(finishes, n)
    window = arrivals[-1] - arrivals[0] if n >= 2 else 0.0
    first, second = _in_flight_halves(records, arrivals)
    reasons = []
    if n == 0 or not ok:
        reasons.append("no measured request completed")
    elif short_of_offered(offered, achieved):
        reasons.append(f"achieved {achieved:.3g} req/s of {offered:.3g} offered (more than "
                       f"{THROUGHPUT_SLACK:.0%} short)")
    if first is not None and second is not None and second > growth_limit(first):
        reasons.append(f"queue growing: {first:.3g} requests in flight on average in the window's first half, "
                       f"{second:.3g} in its second")
    return SteadyState(not reasons, "; ".join(reasons), offered, achieved, window, n, warmup, required, first, second)


def short_of_offered(offered: float | None, achieved: float | None) -> bool:
    """The sustained rule's throughput test: the window completed more than `THROUGHPUT_SLACK` less than offered."""
    return bool(offered) and achieved is not None and achieved < (1.0 - THROUGHPUT_SLACK) * offered


def growth_limit(first_half: float) -> float:
    """The most requests in flight the window's second half may see on average, given the first half's."""
    return GROWTH_FACTOR * first_half + GROWTH_SLACK_REQUESTS + 2.0 * math.sqrt(max(0.0, first_half))


def _in_flight_halves(records: Sequence[RequestRecord], arrivals: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean requests in flight (released, not yet ended; every record, the warm-up's too) seen at the measured
    arrivals ``arrivals`` (sorted) of the window's first and second half; a request with no end never ends."""
    if len(arrivals) < 2:
        return None, None
    released = sorted(r.scheduled for r in records)
    ended = sorted(_end(r) for r in records)
    counts = [bisect.bisect_right(released, t) - bisect.bisect_right(ended, t) for t in arrivals]
    half = len(counts) // 2
    return sum(counts[:half]) / half, sum(counts[half:]) / (len(counts) - half)


def _end(record: RequestRecord) -> float:
    if not math.isnan(record.end):
        return record.end
    return record.chunk_times[-1] if record.chunk_times else math.inf


def window_metrics(records: Sequence[RequestRecord], warmup: int, *, required: int,
                   goodput_ms: Mapping[str, float] | None = None) -> dict[str, Any]:
    """`probe_metrics.calculate_metrics` over the measured window (the warm-up left out), with its sustained
    verdict under `STEADY`."""
    measured = list(records[warmup:])
    sent = [r.sent for r in measured if not math.isnan(r.sent)]
    ends = [r.end for r in measured if not math.isnan(r.end)]
    duration = (max(ends) - min(sent)) if sent and ends else 0.0
    metrics = probe_metrics.calculate_metrics(measured, duration, goodput_ms)
    metrics[STEADY] = steady_state(records, warmup, required=required).to_dict()
    return metrics


@dataclass(frozen=True)
class ProbeVerdict:
    met: bool
    margin: float  # relative, <= 0 holds (an unsustained probe's is positive)
    binding: str  # the binding SLO's key, or "sustained"
    detail: str


def judge_probe(slos: Sequence[slo_mod.Slo], metrics: Mapping[str, Any]) -> ProbeVerdict:
    """The SLO verdict, and a miss when the probe's window was not sustained (metrics without a `STEADY`
    verdict are judged on the SLOs alone, as before)."""
    verdict = slo_mod.judge(slos, metrics)
    steady = metrics.get(STEADY)
    if steady is None or steady.get("sustained", True):
        return ProbeVerdict(verdict.met, verdict.margin, verdict.binding.slo.key, verdict.line)
    offered = steady.get("offered_rate") or 0.0
    shortfall = max(0.0, 1.0 - (steady.get("achieved_rate") or 0.0) / offered) if offered else 0.0
    margin = max(verdict.margin, shortfall, THROUGHPUT_SLACK)
    return ProbeVerdict(False, margin, "sustained", f"not sustained: {steady.get('reason')}")


# --------------------------------------------------------------------------- the ceiling


def throughput_bound(*, chip: str, model: str, prompt_tokens: int, output_tokens: int, npus: int,
                     weight_bytes: float = 2.0, nodes: int = 1, tensor_parallel: int = 0,
                     expert_parallel: bool = False, moe: bool | None = None) -> float | None:
    """Estimate's roofline throughput (req/s) of one instance with its KV cache full of these requests; None when
    the model does not fit (nothing to bound).

    A layout over ``nodes`` hosts with ``tensor_parallel`` < ``npus``: a MoE model (``moe``) runs its DP groups as one
    instance of all the NPUs (estimate's ``tensor_parallel``, ``expert_parallel``, ``nodes``); a dense model's DP
    groups are npus / tensor_parallel replicas of one TP group, each inside a host."""
    from dsctl.core.load import limits
    from dsctl.core.perf import estimate

    if tensor_parallel and tensor_parallel < npus and not moe:
        one = throughput_bound(chip=chip, model=model, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               npus=tensor_parallel, weight_bytes=weight_bytes)
        return None if one is None else one * (npus // tensor_parallel)
    layout: dict[str, Any] = {}
    if weight_bytes != 2.0:
        layout["weight_bytes"] = weight_bytes
    if nodes > 1 or tensor_parallel or expert_parallel:
        layout.update(nodes=nodes, tensor_parallel=tensor_parallel, expert_parallel=bool(expert_parallel and moe))
    first = estimate.estimate(chip, model, prompt_tokens=prompt_tokens, output_tokens=output_tokens, chips=npus,
                              **layout)
    if not first.fits or first.max_concurrency < 1:
        return None
    full = estimate.estimate(chip, model, prompt_tokens=prompt_tokens, output_tokens=output_tokens, chips=npus,
                             concurrency=min(first.max_concurrency, limits.MAX_CONCURRENCY), **layout)
    return full.output_tokens_per_s / output_tokens


def rate_floor(ceiling: float, *, floor: float, span: float = FLOOR_SPAN) -> float:
    """The rate search's lower end: ``floor``, or ``ceiling / span`` when that is lower (see "Floor")."""
    return min(floor, ceiling / span)


def rate_ceiling(bound: float | None, *, fallback: float, factor: float = CEILING_FACTOR) -> float:
    """The rate search's upper end: ``factor`` x estimate's bound, or ``fallback`` without one."""
    if bound is None or not bound > 0 or not math.isfinite(bound):
        return fallback
    return factor * bound


# --------------------------------------------------------------------------- noise


def relative_noise(lo: float | None, hi: float | None, repeat_rates: Sequence[float]) -> float:
    """A capacity verdict's relative noise: the bracket's width (hi / lo - 1; 0 at the ceiling, where nothing
    missed) and the repeats' spread of achieved throughput ((max - min) / mean), whichever is larger."""
    bracket = (hi / lo - 1.0) if lo and hi and hi > lo else 0.0
    values = [v for v in repeat_rates if v is not None and math.isfinite(v)]
    spread = 0.0
    if len(values) >= 2 and sum(values) > 0:
        spread = (max(values) - min(values)) / (sum(values) / len(values))
    return max(bracket, spread)


def beats(candidate: float, candidate_noise: float, incumbent: float, incumbent_noise: float) -> bool:
    """Whether ``candidate`` exceeds ``incumbent`` beyond the larger of the two verdicts' noise."""
    return candidate > incumbent * (1.0 + max(candidate_noise or 0.0, incumbent_noise or 0.0))
