"""The --slo grammar, its errors, and the verdict on a metrics summary (vLLM's definitions via probe_metrics)."""

from __future__ import annotations

import math

import pytest

from dsctl.core.load.probe_metrics import RequestRecord, calculate_metrics
from dsctl.core.tune.slo import Slo, goodput_bounds_ms, judge, parse_slos
from dsctl.errors import ExitStatus, UsageError


def test_default_statistic_is_p99_and_units():
    assert parse_slos(["ttft=200ms"]) == (Slo("ttft", "p99", 200.0),)
    assert parse_slos(["e2el=2s"]) == (Slo("e2el", "p99", 2000.0),)
    assert parse_slos(["tpot=50"]) == (Slo("tpot", "p99", 50.0),)  # a bare number is ms, as in vLLM's --goodput
    assert parse_slos(["itl:mean=0.5s"]) == (Slo("itl", "mean", 500.0),)


def test_explicit_statistics_and_combinations():
    slos = parse_slos(["ttft:p95=200ms,tpot:median=40ms", "error_rate=1%", "TTFT:P50=80ms"])
    assert [s.key for s in slos] == ["ttft:p95", "tpot:p50", "error_rate", "ttft:p50"]
    assert slos[2].bound == pytest.approx(0.01)
    assert parse_slos(["error_rate=0.02"])[0].bound == pytest.approx(0.02)
    assert slos[0].label == "ttft:p95=200ms" and slos[2].label == "error_rate=1%"


@pytest.mark.parametrize(("value", "message"), [
    ("ttfb=200ms", "'ttfb=200ms': unknown metric 'ttfb'; use one of ttft, tpot, itl, e2el, error_rate"),
    ("ttft:p98=200ms", "unknown statistic 'p98'; use one of mean, p50, p90, p95, p99"),
    ("ttft=200us", "expected metric[:stat]=value[ms|s|%] or vLLM's metric:ms"),
    ("ttft<200ms", "expected metric[:stat]=value[ms|s|%] or vLLM's metric:ms"),
    ("ttft=0ms", "a latency bound must be positive"),
    ("ttft=5%", "ttft is a time; write it in ms or s"),
    ("error_rate=2ms", "error_rate is a share of requests"),
    ("error_rate:p99=1%", "error_rate takes no statistic"),
    ("error_rate=150%", "error_rate above 100 %"),
    ("ttft=200ms,,tpot=50ms", "an empty item between commas"),
    ("ttft=200ms,ttft:p99=300ms", "'ttft:p99=300ms': ttft:p99 is already bound by 'ttft=200ms'"),
])
def test_errors_name_the_token_and_the_fix(value, message):
    with pytest.raises(UsageError) as caught:
        parse_slos([value])
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith("--slo ")
    assert caught.value.exit_status == ExitStatus.USAGE


def test_missing_slo_is_refused():
    with pytest.raises(UsageError, match="--slo is required"):
        parse_slos([])


def _records(ttfts_ms, *, failed=0):
    out = []
    for i, ttft in enumerate(ttfts_ms):
        sent = float(i)
        out.append(RequestRecord(request_id=str(i), scheduled=sent, sent=sent, status=200,
                                 chunk_times=[sent + ttft / 1e3, sent + ttft / 1e3 + 0.02, sent + ttft / 1e3 + 0.04]))
    out += [RequestRecord(request_id=f"f{i}", scheduled=0.0, sent=0.0, status=500) for i in range(failed)]
    return out


def test_verdict_margin_and_binding_constraint():
    records = _records([100.0] * 98 + [300.0, 400.0], failed=1)
    summary = calculate_metrics(records, duration=100.0)
    slos = parse_slos(["ttft=200ms,ttft:p50=150ms,error_rate=2%"])
    verdict = judge(slos, summary)
    p99 = summary["ttft_ms"]["p99"]
    assert not verdict.met
    assert verdict.binding.slo.key == "ttft:p99"
    assert verdict.margin == pytest.approx((p99 - 200) / 200)
    assert verdict.margins()["ttft:p50"] == pytest.approx((100 - 150) / 150)
    assert verdict.values()["error_rate"] == pytest.approx(1 / 101)
    assert "ttft:p99 binds" in verdict.line

    relaxed = judge(parse_slos(["ttft=500ms", "error_rate=2%"]), summary)
    assert relaxed.met and relaxed.margin <= 0
    assert relaxed.binding.slo.key in ("ttft:p99", "error_rate")


def test_nothing_served_is_infinitely_bad_and_zero_error_rate_slo():
    summary = calculate_metrics(_records([], failed=3), duration=10.0)
    verdict = judge(parse_slos(["ttft=200ms", "error_rate=0"]), summary)
    assert math.isinf(verdict.values()["ttft:p99"]) and math.isinf(verdict.margin)
    assert verdict.margins()["error_rate"] == 1.0  # no scale: the margin is the rate itself


def test_goodput_bounds_take_the_tightest_per_metric():
    slos = parse_slos(["ttft:p50=100ms,ttft=300ms,tpot=50ms,itl=40ms,error_rate=1%"])
    assert goodput_bounds_ms(slos) == {"ttft": 100.0, "tpot": 50.0}
