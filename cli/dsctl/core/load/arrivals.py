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

A closed loop (fixed concurrency) has no schedule: each of C workers sends its next request when its previous one
ends; the client code handles that case (``closed_loop``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

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
    if math.isinf(shape):
        return [1.0] * n
    if shape == 1.0:
        return [rng.expovariate(1.0) for _ in range(n)]
    scale = 1.0 / shape
    return [rng.gammavariate(shape, scale) for _ in range(n)]


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


def schedule(spec: ArrivalSpec, requests: int | None = None, duration: float | None = None,
             seed: int | None = 0, rescale: bool = True) -> list[float]:
    """Release times in seconds from the start of the probe, ascending.

    Bounded by ``requests`` and/or ``duration`` (at least one): requests whose release time is after
    ``duration`` are not sent. ``rescale`` applies vLLM's N / rate rescaling (fixed rate, request-bounded).
    """
    spec.validate()
    if requests is None and duration is None:
        raise ValueError("an arrival schedule needs a request count or a duration")
    if requests is not None and requests < 0:
        raise ValueError("request count must not be negative")
    if math.isinf(spec.rate):
        if requests is None:
            raise ValueError("an infinite rate (a burst) needs a request count")
        return [0.0] * requests
    rng = random.Random(seed)
    if spec.process == "ramp":
        assert spec.ramp_to is not None
        horizon = duration if duration is not None else 2.0 * requests / (spec.rate + spec.ramp_to)  # type: ignore[operator]
        to_time = _ramp_inverse(spec.rate, spec.ramp_to, horizon)
    else:
        rate = spec.rate

        def to_time(s: float) -> float:
            return s / rate

    times: list[float] = []
    if requests is not None:
        cumulative = 0.0
        for g in unit_gaps(requests, spec.shape, rng):
            cumulative += g
            times.append(cumulative)
        if rescale and spec.process != "ramp" and times and times[-1] > 0:
            factor = requests / times[-1]  # in unit time: the last request at N, i.e. at N / rate
            times = [t * factor for t in times]
        times = [to_time(s) for s in times]
    else:
        cumulative = 0.0
        while True:
            cumulative += unit_gaps(1, spec.shape, rng)[0]
            t = to_time(cumulative)
            if t > duration:  # type: ignore[operator]
                break
            times.append(t)
    if duration is not None:
        times = [t for t in times if t <= duration]
    return times


def rate_at(spec: ArrivalSpec, t: float, horizon: float) -> float:
    """The intended instantaneous rate at time t (for reports and tests)."""
    if spec.process != "ramp" or spec.ramp_to is None:
        return spec.rate
    if t >= horizon:
        return spec.ramp_to
    return spec.rate + (spec.ramp_to - spec.rate) * t / horizon
