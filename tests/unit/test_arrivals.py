"""Arrival processes: seeded statistics of the gaps, vLLM's rescaling, ramps and bounds."""

from __future__ import annotations

import math
import statistics

import pytest

from dsctl.core.load.arrivals import ArrivalSpec, gaps, rate_at, schedule

N = 20_000


def _diffs(times: list[float]) -> list[float]:
    return [times[0], *(b - a for a, b in zip(times, times[1:], strict=False))]


def test_poisson_gaps_have_mean_one_over_rate_and_variance_one_over_rate_squared():
    rate = 4.0
    g = gaps(N, rate, burstiness=1.0, seed=7)
    assert statistics.fmean(g) == pytest.approx(1 / rate, rel=0.03)  # standard error 0.7 %
    assert statistics.pvariance(g) == pytest.approx(1 / rate**2, rel=0.08)  # standard error 2 %
    # the same through the schedule (without vLLM's rescaling)
    times = schedule(ArrivalSpec("poisson", rate), requests=N, seed=7, rescale=False)
    assert times == pytest.approx([sum(g[: i + 1]) for i in (0, 1, 2)] + times[3:])
    d = _diffs(times)
    assert statistics.fmean(d) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.pvariance(d) == pytest.approx(1 / rate**2, rel=0.08)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 4.0])
def test_gamma_burstiness_keeps_the_mean_and_scales_the_variance(burstiness):
    rate = 4.0
    times = schedule(ArrivalSpec("gamma", rate, burstiness=burstiness), requests=N, seed=3, rescale=False)
    d = _diffs(times)
    # Gamma(shape b, scale 1/(r b)): mean 1/r, variance b * (1/(r b))^2 = 1/(r^2 b)
    assert statistics.fmean(d) == pytest.approx(1 / rate, rel=0.04)
    assert statistics.pvariance(d) == pytest.approx(1 / (rate**2 * burstiness), rel=0.12)


def test_constant_is_exactly_periodic_and_burst_is_all_at_once():
    assert schedule(ArrivalSpec("constant", 2.0), requests=4) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert schedule(ArrivalSpec("poisson", math.inf), requests=3) == [0.0, 0.0, 0.0]


def test_rescaling_puts_the_last_request_at_n_over_rate_like_vllm():
    times = schedule(ArrivalSpec("poisson", 5.0), requests=200, seed=11)
    assert times[-1] == pytest.approx(200 / 5.0)
    assert times == sorted(times)
    raw = schedule(ArrivalSpec("poisson", 5.0), requests=200, seed=11, rescale=False)
    assert raw[-1] != pytest.approx(40.0, abs=1e-6)


def test_seeds_are_reproducible_and_distinct():
    spec = ArrivalSpec("poisson", 3.0)
    assert schedule(spec, requests=50, seed=1) == schedule(spec, requests=50, seed=1)
    assert schedule(spec, requests=50, seed=1) != schedule(spec, requests=50, seed=2)


def test_duration_bounds_the_schedule():
    times = schedule(ArrivalSpec("poisson", 50.0), duration=20.0, seed=5)
    assert all(t <= 20.0 for t in times)
    assert len(times) == pytest.approx(1000, rel=0.1)
    both = schedule(ArrivalSpec("constant", 10.0), requests=1000, duration=5.0)
    assert len(both) == 50  # the duration ends it first


def test_constant_ramp_follows_the_cumulative_intensity():
    spec = ArrivalSpec("ramp", 1.0, burstiness=math.inf, ramp_to=3.0)
    times = schedule(spec, duration=10.0)
    # Lambda(t) = t + 0.1 t^2: 20 requests by t = 10, the k-th at Lambda^-1(k)
    assert len(times) == 20
    for k, t in enumerate(times, 1):
        assert t + 0.1 * t * t == pytest.approx(k)
    assert times[1] - times[0] == pytest.approx(1 / rate_at(spec, times[0], 10.0), rel=0.1)
    assert times[-1] - times[-2] == pytest.approx(1 / 3.0, rel=0.05)
    assert sum(1 for t in times if t <= 5.0) == 7  # Lambda(5) = 7.5


def test_poisson_ramp_counts_match_the_ramp():
    spec = ArrivalSpec("ramp", 10.0, ramp_to=30.0)
    times = schedule(spec, duration=100.0, seed=9)
    first = sum(1 for t in times if t <= 50.0)
    # Lambda(50) = 10*50 + 0.1*50^2 = 750; Lambda(100) = 2000
    assert first == pytest.approx(750, rel=0.06)
    assert len(times) - first == pytest.approx(1250, rel=0.06)


def test_ramp_down_and_ramp_bounded_by_requests():
    down = schedule(ArrivalSpec("ramp", 4.0, burstiness=math.inf, ramp_to=1.0), duration=10.0)
    assert len(down) == 25  # (4 + 1) / 2 * 10
    assert down[1] - down[0] < down[-1] - down[-2]
    # without a duration the ramp ends when the N-th request is due at the mean rate: 2N / (a + b)
    by_count = schedule(ArrivalSpec("ramp", 2.0, burstiness=math.inf, ramp_to=6.0), requests=40)
    assert len(by_count) == 40 and by_count[-1] == pytest.approx(2 * 40 / 8.0)


@pytest.mark.parametrize("spec, kwargs", [
    (ArrivalSpec("poisson", 0.0), {"requests": 1}),
    (ArrivalSpec("poisson", -1.0), {"requests": 1}),
    (ArrivalSpec("gamma", 1.0, burstiness=0.0), {"requests": 1}),
    (ArrivalSpec("ramp", 1.0), {"requests": 1}),
    (ArrivalSpec("poisson", 1.0, ramp_to=2.0), {"requests": 1}),
    (ArrivalSpec("zipf", 1.0), {"requests": 1}),
    (ArrivalSpec("poisson", 1.0), {}),
    (ArrivalSpec("poisson", math.inf), {"duration": 5.0}),
])
def test_invalid_specs_are_refused(spec, kwargs):
    with pytest.raises(ValueError):
        schedule(spec, **kwargs)
