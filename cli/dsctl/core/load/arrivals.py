"""When each request of a probe is released (pure, seeded).

Open-loop processes follow `vllm bench serve` (``get_request``; serving-and-tuning.md section 3): inter-arrival
gaps are Gamma(shape = b, scale = 1 / (rate * b)) with b the burstiness. b = 1 is Poisson (exponential gaps),
b < 1 burstier, b > 1 more regular, b = inf a constant 1 / rate. Like vLLM, the first request also waits one gap,
and a fixed-rate schedule bounded by a request count is rescaled so that its last request leaves at N / rate
(that removes the 1-2 % drift between seeds). ``rate = inf`` releases every request at t = 0.

Every process is a unit-rate renewal process (gaps with mean 1) mapped through the inverse of the cumulative
intensity Lambda(t) = integral of rate(s) ds. For a fixed rate that is t = s / rate. For a ramp from rate a to
rate b over a horizon T (linear in time, then b beyond T) it is the time-rescaling construction of a
non-homogeneous process: Poisson gaps give an exact inhomogeneous Poisson process, constant gaps a deterministic
schedule whose instantaneous rate follows the ramp. Without a duration the ramp horizon is the time at which
N requests are released at the ramp's mean rate, T = 2N / (a + b), so the rate reaches b at the last request.

The schedule is lazy (`release_times`): the probe draws each release time as it sends, from the seed, so a
schedule of N requests costs no list of N floats; one pass ahead counts it and finds vLLM's rescaling factor.
Counts are capped (`dsctl.core.load.limits`).

A closed loop (fixed concurrency) has no schedule: each of C workers sends its next request when its previous one
ends; the client code handles that case (``closed_loop``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dsctl.core.load import limits

PROCESSES = ("constant", "poisson", "gamma", "ramp")


@dataclass(frozen=True)
class ArrivalSpec:
    process: str = "poisson"  # constant | poisson | gamma | ramp
    rate: float = math.inf  # requests/s (the ramp's start rate)
    burstiness: float = 1.0  # gamma shape; poisson = 1, constant = inf; a ramp's gap shape too
    ramp_to: float | None = None  # the ramp's end rate

    def validate(self) -> None:
        if self.process not in PROCESSES:
            raise ValueError(f"arrival {self.process!r}: expected one of {', '.join(PROCESSES)}")
        if not self.rate > 0:
            raise ValueError(f"rate {self.rate:g}: must be a positive number of requests/s (or inf)")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness {self.burstiness:g}: must be positive (1 = Poisson, inf = constant)")
        if self.process == "ramp":
            if self.ramp_to is None or not 0 < self.ramp_to < math.inf or math.isinf(self.rate):
                raise ValueError("a ramp needs a finite start rate and a finite positive end rate (--ramp-to)")
        elif self.ramp_to is not None:
            raise ValueError("an end rate (--ramp-to) only applies to the ramp arrival process")

    @property
    def shape(self) -> float:
        """Gamma shape of the unit gaps: inf means constant gaps."""
        if self.process == "constant":
            return math.inf
        if self.process == "poisson":
            return 1.0
        return self.burstiness


def unit_gaps(n: int, shape: float, rng: random.Random) -> list[float]:
    """n inter-arrival gaps with mean 1: Gamma(shape, 1/shape); shape 1 = exponential, inf = all 1."""
    return list(itertools.islice(_unit_gap_stream(shape, rng), n))


def gaps(n: int, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """vLLM's raw gaps at a fixed rate: Gamma(shape = burstiness, scale = 1 / (rate * burstiness))."""
    return [g / rate for g in unit_gaps(n, burstiness, random.Random(seed))]


def _ramp_inverse(a: float, b: float, horizon: float):
    """t = Lambda^-1(s) for rate(t) = a + (b - a) t / T on [0, T], then b."""
    c = (b - a) / (2.0 * horizon)
    at_horizon = (a + b) * horizon / 2.0

    def inverse(s: float) -> float:
        if s >= at_horizon:
            return horizon + (s - at_horizon) / b
        # c t^2 + a t - s = 0, in the form that stays stable when c is 0 or negative
        return 2.0 * s / (a + math.sqrt(max(0.0, a * a + 4.0 * c * s)))

    return inverse


@dataclass(frozen=True)
class Schedule:
    """Release times generated on demand: iterating draws them again from the seed (O(1) memory, the same times
    on every pass). ``count`` and ``last`` (the last release) come from one pass when the schedule is made."""

    spec: ArrivalSpec
    requests: int | None
    duration: float | None
    seed: int | None
    factor: float  # vLLM's N / rate rescaling, in unit time (1.0: none)
    horizon: float  # a ramp's horizon (unused for a fixed rate)
    count: int
    last: float  # the last release time (0.0 for an empty schedule)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[float]:
        spec = self.spec
        if math.isinf(spec.rate):
            yield from itertools.repeat(0.0, self.count)
            return
        to_time = self._to_time()
        cumulative = 0.0
        for sent, gap in enumerate(_unit_gap_stream(spec.shape, random.Random(self.seed))):
            if self.requests is not None and sent >= self.requests:
                return
            if sent >= limits.MAX_REQUESTS:  # a duration-bounded schedule stops at the cap, like a request count
                return
            cumulative += gap
            t = to_time(cumulative * self.factor)
            if self.duration is not None and t > self.duration:
                return
            yield t

    def _to_time(self) -> Callable[[float], float]:
        spec = self.spec
        if spec.process == "ramp":
            assert spec.ramp_to is not None
            return _ramp_inverse(spec.rate, spec.ramp_to, self.horizon)
        rate = spec.rate
        return lambda s: s / rate


def _unit_gap_stream(shape: float, rng: random.Random) -> Iterator[float]:
    """`unit_gaps` one at a time, without end (the same draws from the same generator)."""
    if math.isinf(shape):
        return itertools.repeat(1.0)
    if shape == 1.0:
        return (rng.expovariate(1.0) for _ in itertools.count())
    scale = 1.0 / shape
    return (rng.gammavariate(shape, scale) for _ in itertools.count())


def release_times(spec: ArrivalSpec, requests: int | None = None, duration: float | None = None,
                  seed: int | None = 0, rescale: bool = True) -> Schedule:
    """The lazy release times (seconds from the start of the probe, ascending).

    Bounded by ``requests`` and/or ``duration`` (at least one): requests whose release time is after
    ``duration`` are not sent, and never more than `limits.MAX_REQUESTS`. ``rescale`` applies vLLM's N / rate
    rescaling (fixed rate, request-bounded). Costs one pass over the gaps (no list), to count and to rescale.
    """
    spec.validate()
    if requests is None and duration is None:
        raise ValueError("an arrival schedule needs a request count or a duration")
    if requests is not None and requests < 0:
        raise ValueError("request count must not be negative")
    if requests is not None:
        limits.check("--requests", requests, limits.MAX_REQUESTS, "requests of one probe")
    if math.isinf(spec.rate):
        if requests is None:
            raise ValueError("an infinite rate (a burst) needs a request count")
        return Schedule(spec, requests, duration, seed, 1.0, 0.0, requests, 0.0)
    if requests is None:  # a duration alone: refuse what would plan more than the cap before drawing a gap
        mean_rate = spec.rate if spec.process != "ramp" else (spec.rate + spec.ramp_to) / 2  # type: ignore[operator]
        expected = mean_rate * duration  # type: ignore[operator]
        if expected > limits.MAX_REQUESTS:
            raise ValueError(f"--rate x --duration plans about {expected:.0f} requests, more than the "
                             f"{limits.MAX_REQUESTS} requests of one probe dsctl allows; lower --rate or --duration")
    horizon = 0.0
    if spec.process == "ramp":
        horizon = duration if duration is not None else 2.0 * requests / (spec.rate + spec.ramp_to)  # type: ignore[operator]
    factor = 1.0
    if requests is not None and rescale and spec.process != "ramp" and requests > 0:
        total = _running_sum(spec.shape, seed, requests)
        if total > 0:
            factor = requests / total  # in unit time: the last request at N, i.e. at N / rate
    draft = Schedule(spec, requests, duration, seed, factor, horizon, 0, 0.0)
    count, last = 0, 0.0
    for t in draft:
        count, last = count + 1, t
    return Schedule(spec, requests, duration, seed, factor, horizon, count, last)


def _running_sum(shape: float, seed: int | None, n: int) -> float:
    """The unit time of the n-th release, summed in order as the schedule sums it."""
    cumulative = 0.0
    for gap in itertools.islice(_unit_gap_stream(shape, random.Random(seed)), n):
        cumulative += gap
    return cumulative


def schedule(spec: ArrivalSpec, requests: int | None = None, duration: float | None = None,
             seed: int | None = 0, rescale: bool = True) -> list[float]:
    """`release_times` as a list (the offline evaluator and tests, with a few hundred requests)."""
    return list(release_times(spec, requests, duration, seed, rescale))


def rate_at(spec: ArrivalSpec, t: float, horizon: float) -> float:
    """The intended instantaneous rate at time t (for reports and tests)."""
    if spec.process != "ramp" or spec.ramp_to is None:
        return spec.rate
    if t >= horizon:
        return spec.ramp_to
    return spec.rate + (spec.ramp_to - spec.rate) * t / horizon
