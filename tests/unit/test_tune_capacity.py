"""capacity.py: the sample-size rule, the sustained verdict, the ceiling and the noise rule (pure, no I/O)."""

from __future__ import annotations

import pytest

from dsctl.core.load.probe_metrics import RequestRecord
from dsctl.core.tune import capacity, rate_search
from dsctl.core.tune.slo import parse_slos
from dsctl.errors import UsageError


@pytest.mark.parametrize(("slo", "need"), [("ttft=200ms", 1000), ("ttft:p95=200ms", 200), ("ttft:p90=1s", 100),
                                           ("ttft:median=1s", 50), ("tpot:mean=50ms", 50),
                                           ("ttft:median=1s,e2el:p95=2s", 200), ("error_rate=1%", 1000)])
def test_the_sample_size_rule_puts_ten_requests_beyond_the_percentile(slo, need):
    assert capacity.required_samples(parse_slos([slo])) == need


def test_a_probe_is_sized_by_the_rule_the_window_and_the_warmup():
    p99 = parse_slos(["ttft=200ms"])
    low = capacity.probe_size(p99, 2.0, min_window_s=20.0)
    assert (low.measured, low.warmup) == (1000, 100) and low.window_s == 500.0
    # 24 requests at 256 req/s arrive in 0.1 s: at a high rate the window, not the rule, sets the size
    high = capacity.probe_size(parse_slos(["ttft:median=200ms"]), 256.0, min_window_s=20.0)
    assert high.measured == 5120 and high.warmup == 512 and high.window_s == pytest.approx(20.0)
    assert capacity.probe_size(parse_slos(["ttft:median=1s"]), 0.5, min_window_s=10.0).warmup == 10
    capped = capacity.probe_size(p99, 100.0, min_window_s=20.0, max_requests=1100)
    assert capped.requests <= 1100


def test_requests_below_the_rule_are_refused_in_one_line():
    with pytest.raises(UsageError, match=r"--requests 24: ttft:p99=200ms needs at least 1000 measured requests"):
        capacity.check_floor(parse_slos(["ttft=200ms"]), 24)
    capacity.check_floor(parse_slos(["ttft:median=200ms"]), 50)
    capacity.check_floor(parse_slos(["ttft=200ms"]), None)


def _records(rate: float, n: int, *, service_rate: float | None = None, ttft: float = 0.05) -> list[RequestRecord]:
    """n requests arriving at ``rate``; a single server finishing one every 1 / service_rate s (None: never
    queues)."""
    out, free = [], 0.0
    for i in range(n):
        at = i / rate
        start = at if service_rate is None else max(at, free)
        first = start + ttft
        done = first + 0.1 if service_rate is None else max(first, start + 1 / service_rate)
        free = done
        out.append(RequestRecord(f"r{i}", scheduled=at, sent=at, chunk_times=[first, done], token_messages=2,
                                 status=200, end=done))
    return out


def test_a_rate_the_instance_keeps_up_with_is_sustained():
    steady = capacity.steady_state(_records(10.0, 220), 20, required=50)
    assert steady.sustained and steady.samples == 200 and steady.window_s == pytest.approx(19.9)
    assert steady.achieved_rate == pytest.approx(10.0, rel=0.01) and not steady.undersized


def test_an_overloaded_rate_is_not_sustained_whatever_its_statistics():
    steady = capacity.steady_state(_records(10.0, 220, service_rate=8.0), 20, required=50)
    assert not steady.sustained and "achieved" in steady.reason and "queue growing" in steady.reason
    metrics = capacity.window_metrics(_records(10.0, 220, service_rate=8.0), 20, required=50)
    verdict = capacity.judge_probe(parse_slos(["ttft:median=60s"]), metrics)  # the SLO alone would hold
    assert not verdict.met and verdict.binding == "sustained" and verdict.margin > 0


def test_a_first_token_that_waits_on_the_running_batch_is_not_a_growing_queue():
    # A static-batching engine: a request's first token waits for the running batch, so TTFT jumps with the batch's
    # phase while every request still ends 1 s after it arrives (the count in flight stays at rate x 1 s).
    records = []
    for i in range(220):
        at = i / 10.0
        ttft = 0.05 if i < 120 else 0.6
        records.append(RequestRecord(f"r{i}", scheduled=at, sent=at, chunk_times=[at + ttft, at + 1.0],
                                     token_messages=2, status=200, end=at + 1.0))
    steady = capacity.steady_state(records, 20, required=50)
    assert steady.sustained, steady.reason
    assert steady.in_flight_first_half == pytest.approx(10.0, abs=1.0) == steady.in_flight_second_half


def test_the_ceiling_is_twice_estimates_bound_and_a_search_that_holds_there_says_so():
    bound = capacity.throughput_bound(chip="910B3", model="r1-7b", prompt_tokens=512, output_tokens=128, npus=1)
    assert bound == pytest.approx(16.9, rel=0.05)
    assert capacity.rate_ceiling(bound, fallback=256.0) == pytest.approx(2 * bound)
    assert capacity.rate_ceiling(None, fallback=256.0) == 256.0
    found = rate_search.search_rate(lambda rate: {"completed": 10, "failed": 0, "ttft_ms": {"p99": 1.0}},
                                    parse_slos(["ttft=200ms"]), start=1.0, min_rate=0.1, max_rate=8.0)
    assert found.rate == 8.0 and found.at_ceiling
    summary = rate_search.capacity_summary(found)
    assert summary["at_ceiling"] and summary["interval"] == [8.0, None]


def test_the_floor_reaches_below_the_fixed_one_where_the_bound_is_low():
    """Long prompts with long answers: estimate's bound is a fraction of a request per second and the top's
    capacities straddle the fixed floor; the floor follows the ceiling down, and a search finds a capacity
    there instead of "even 0.05 req/s misses"."""
    bound = capacity.throughput_bound(chip="910B3", model="r1-7b", prompt_tokens=32768, output_tokens=512, npus=1)
    ceiling = capacity.rate_ceiling(bound, fallback=256.0)
    floor = capacity.rate_floor(ceiling, floor=0.05)
    assert floor == pytest.approx(ceiling / capacity.FLOOR_SPAN) and floor < 0.05
    assert capacity.rate_floor(117.6, floor=0.05) == 0.05  # chat lengths: the fixed floor, as before

    def held_below(rate: float) -> dict:  # holds at 0.03 req/s and below
        return {"completed": 200, "failed": 0, "ttft_ms": {"p99": 100.0 if rate <= 0.03 else 900.0}}
    slos = parse_slos(["ttft=200ms"])
    fixed = rate_search.search_rate(held_below, slos, start=0.2, min_rate=0.05, max_rate=ceiling)
    assert fixed.rate is None and "misses" in fixed.stopped
    found = rate_search.search_rate(held_below, slos, start=0.2, min_rate=floor, max_rate=ceiling, max_probes=16)
    assert found.rate is not None and 0.025 < found.rate <= 0.03


def test_a_candidate_replaces_the_incumbent_only_beyond_the_noise():
    assert capacity.relative_noise(10.0, 11.0, [9.9, 10.1]) == pytest.approx(0.1)
    assert capacity.relative_noise(10.0, None, [9.0, 11.0]) == pytest.approx(0.2)
    assert not capacity.beats(10.5, 0.1, 10.0, 0.05)  # within 10 %: a tie, the incumbent stays
    assert capacity.beats(11.5, 0.1, 10.0, 0.05)
