"""Was the load generator the limit of a probe? (pure, no I/O: the adapter measures, this judges).

A probe measures the instance only while the client offers the load it planned.  On a busy controller (issue 42:
the lab's live tune while the machine was busy, a baseline that "could not offer more than 3.22 of a planned 4
req/s") the client's event loop releases its requests late, and every figure after that -- the offered rate, the
achieved one, the sustained verdict, a capacity -- describes the controller, not the instance.  So every probe says
whether its own side was the limit, from what it can see of itself:

* the send lag of each measured request (``sent - scheduled``; an open loop only, and only without a
  ``--concurrency`` cap, whose waits for a free slot are planned client queue time, not lag);
* the offered rate (from the sends) against the planned one (from the release times of the same draw, so the
  Poisson draw's own noise cancels out);
* the probe process's CPU over the measured phase (``time.process_time``: every thread of it, since probes in
  threads share one interpreter lock: several of tune's trial slots at once can saturate it together), as a share
  of one core;
* the whole machine's busy share over the same phase (``/proc/stat``, read by the adapter): reported with the
  verdict, not a rule of it (see the note above MIN_CPU_WINDOW_S).

Each threshold below says why; the ones marked "guess" are not measured or sourced, they are the line drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dsctl.core.load.probe_metrics import RequestRecord, inner_rate, percentile

LIMITED_BY = "load generator"  # the probe result's ``limited_by`` when this verdict holds
KEY = "load_generator"  # where a probe's verdict is kept (its result; a tune probe's metrics)

# The offered rate may fall this short of the planned one: the capacity rule's own slack (core/tune/capacity.py
# THROUGHPUT_SLACK, 5 %): a client offering more than that less would fail an instance that kept up with all of it.
OFFER_SLACK = 0.05
# A median send lag above 5 ms: the dispatcher spins through the last 1.5 ms before each release
# (adapters/probe_client.py _SPIN), so an idle client releases within a fraction of a millisecond; half its
# requests 5 ms late means the event loop was busy at most releases (guess).
LAG_MEDIAN_S = 0.005
# The p90 send lag above half the schedule's mean gap (and above 2 ms): one request in ten released half a gap
# late merges with its successor, so the arrivals the server saw are burstier than the planned process (guess;
# the 2 ms floor keeps the selector's 1 ms timer granularity from judging rates of several hundred req/s).
LAG_TAIL_SHARE = 0.5
LAG_TAIL_FLOOR_S = 0.002
# The probe's process at 90 % of one core or more: its event loops share one interpreter lock, so near a full core
# it has no time left for a burst of releases or reads (guess).  In an open loop only when its releases show it
# too (p90 send lag above LAG_TAIL_FLOOR_S): a client that still sent on time measured the server, since every read
# is stamped with the kernel's receive time (adapters/probe_client.py), not the loop's; measured: one probe at 64
# modelled req/s against the emulated engine at time scale 0.05 used 95 % of a core with a p90 lag of 0.44 ms and
# offered its planned rate.  A closed or capped loop has no lag to show it: the CPU alone says it.
CLIENT_CPU_SHARE = 0.9
# The machine's busy share is reported, never a verdict: the instance may share the machine's CPUs (the lab's
# engines do, and so does a controller on a serving host), and then a saturated machine with a shortfall is the
# instance's own.  Measured: a fresh-clone CI run's lab tune saw 100 % busy while its probe offered 31.8 of a
# planned 31.8 req/s (p50 send lag 0.7 ms) and the instance completed 10.5; a rule "busy, short and late" called
# that the controller's and left the tune without a baseline.  Telling a starved client from a starved instance
# there needs the engine's own queue (vllm:num_requests_waiting on /metrics), which the probe does not read yet.
# CPU shares are judged only over a measured phase of at least a quarter second: /proc/stat counts in clock ticks
# (USER_HZ, 100 a second on the usual kernels, proc(5)), so a quarter second is 25 ticks a CPU and the machine's
# share is within 4 %; shorter, one tick moves it too far (the process's own CPU is read in nanoseconds).  A lab
# probe's window is short in wall time (10 modelled s at time scale 0.05 are half a second), so the bound is not
# higher.
MIN_CPU_WINDOW_S = 0.25


@dataclass(frozen=True)
class ClientLoad:
    """What a probe saw of its own side (rates per second of the probe's time: modelled on a time-scaled engine;
    lags, CPU and the window in wall seconds: they are the client's own)."""

    lags_s: Sequence[float] = ()  # send lags of the measured requests (empty: a closed or capped loop)
    mean_gap_s: float | None = None  # the schedule's mean inter-arrival gap, wall seconds
    planned_rate: float | None = None  # req/s from the release times (the draw)
    offered_rate: float | None = None  # req/s from the sends
    achieved_rate: float | None = None  # req/s from the successful completions (failures count as not achieved)
    client_cpu: float | None = None  # the probe process's CPU seconds per wall second (1.0: one core)
    machine_busy: float | None = None  # share of all the machine's CPU time that was busy (0..1)
    window_s: float = 0.0  # the measured phase, wall seconds


@dataclass(frozen=True)
class GeneratorLimit:
    limited: bool
    reason: str  # one line: every rule that fired ("" when not limited)
    planned_rate: float | None
    offered_rate: float | None
    achieved_rate: float | None
    send_lag_p50_ms: float | None
    send_lag_p90_ms: float | None
    send_lag_p99_ms: float | None
    client_cpu_percent: float | None  # of one core
    machine_busy_percent: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def warning(self) -> str:
        """The probe's one-line warning: planned against offered, the lag and the CPU figures, why."""
        return f"the load generator was the limit: {figures(self.to_dict())}: {self.reason}"


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def figures(verdict: dict[str, object]) -> str:
    """``planned 4 req/s, offered 3.22 (send lag p50 12 ms, p99 80 ms; probe CPU 98 % of a core; machine 97 %
    busy)`` from a verdict's dict (a probe result's or a tune probe's metrics)."""
    parts = []
    if verdict.get("send_lag_p50_ms") is not None:
        parts.append(f"send lag p50 {verdict['send_lag_p50_ms']:.3g} ms, p99 {verdict['send_lag_p99_ms']:.3g} ms")
    if verdict.get("client_cpu_percent") is not None:
        parts.append(f"probe CPU {verdict['client_cpu_percent']:.0f} % of a core")
    if verdict.get("machine_busy_percent") is not None:
        parts.append(f"machine {verdict['machine_busy_percent']:.0f} % busy")
    planned, offered = verdict.get("planned_rate"), verdict.get("offered_rate")
    text = f"planned {_rate(planned)} req/s, offered {_rate(offered)}"  # type: ignore[arg-type]
    return text + (f" ({'; '.join(parts)})" if parts else "")


def measure(records: Sequence[RequestRecord], *, lags: bool, client_cpu_s: float | None,
            machine_busy: float | None, window_s: float, time_scale: float = 1.0) -> ClientLoad:
    """A probe's `ClientLoad` from its measured records (wall-clock stamps, in send order) and the adapter's CPU
    figures; ``lags``: the send lags mean something (an open loop without a concurrency cap); ``time_scale``: wall
    seconds per modelled second, so that rates come out in the probe's own units."""
    n = len(records)
    released = sorted(r.scheduled for r in records)
    sent = sorted(r.sent for r in records if not math.isnan(r.sent))
    finished = sorted(r.chunk_times[-1] for r in records if r.success)
    per = time_scale  # a wall rate r is r x time_scale per modelled second

    def rate(times: list[float]) -> float | None:
        value, _ = inner_rate(times, n)
        return None if value is None or not math.isfinite(value) else value * per

    gaps = (released[-1] - released[0]) / (n - 1) if lags and n >= 2 else None
    return ClientLoad(
        lags_s=[max(0.0, r.sent - r.scheduled) for r in records if not math.isnan(r.sent)] if lags else (),
        mean_gap_s=gaps, planned_rate=rate(released) if lags else None, offered_rate=rate(sent) if lags else None,
        achieved_rate=rate(finished),
        client_cpu=None if client_cpu_s is None or window_s <= 0 else client_cpu_s / window_s,
        machine_busy=machine_busy, window_s=window_s)


def judge(load: ClientLoad) -> GeneratorLimit:
    """Whether the load generator was the limit of a probe, with its figures and one line of why."""
    lags = sorted(load.lags_s)
    p50, p90, p99 = ((percentile(lags, q) for q in (50.0, 90.0, 99.0)) if lags else (None, None, None))
    reasons = []
    planned, offered, achieved = load.planned_rate, load.offered_rate, load.achieved_rate
    if planned and offered is not None and offered < (1.0 - OFFER_SLACK) * planned:
        reasons.append(f"it offered {offered:.3g} req/s of the {planned:.3g} planned (more than {OFFER_SLACK:.0%} "
                       "short)")
    if p50 is not None and p50 > LAG_MEDIAN_S:
        reasons.append(f"half its requests were sent more than {p50 * 1e3:.3g} ms late (above "
                       f"{LAG_MEDIAN_S * 1e3:g} ms)")
    if p90 is not None and load.mean_gap_s is not None:
        bound = max(LAG_TAIL_SHARE * load.mean_gap_s, LAG_TAIL_FLOOR_S)
        if p90 > bound:
            reasons.append(f"one request in ten was sent {p90 * 1e3:.3g} ms late or more, above half the mean gap "
                           f"between releases ({bound * 1e3:.3g} ms)")
    timed = load.window_s >= MIN_CPU_WINDOW_S
    late = p90 is not None and p90 > LAG_TAIL_FLOOR_S  # the releases show the client's delay
    if timed and load.client_cpu is not None and load.client_cpu >= CLIENT_CPU_SHARE and (late or not lags):
        reasons.append(f"the probe's process used {load.client_cpu:.0%} of a core (at least "
                       f"{CLIENT_CPU_SHARE:.0%}: no time left for its event loop)")

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1e3, 3)

    def percent(value: float | None) -> float | None:
        return None if value is None else round(value * 100.0, 1)

    return GeneratorLimit(bool(reasons), "; ".join(reasons), planned, offered, achieved, ms(p50), ms(p90), ms(p99),
                          percent(load.client_cpu), percent(load.machine_busy))
