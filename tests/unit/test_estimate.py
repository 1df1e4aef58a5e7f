"""`dsctl estimate`'s predictions and SLO verdicts (dsctl.core.perf.estimate)."""

from __future__ import annotations

import math

import pytest

from dsctl.core.load.slo_spec import Slo
from dsctl.core.perf.estimate import estimate, parse_slo
from dsctl.core.perf.perfmodel import (
    DEFAULT_EFFICIENCY,
    Deployment,
    chip_by_name,
    decode_step_seconds,
    model_by_name,
    prefill_seconds,
)
from dsctl.errors import UsageError

B3 = chip_by_name("910B3")
V3 = model_by_name("deepseek-v3")
QWEN7B = model_by_name("r1-7b")


def verdict(result, metric):
    return next(v for v in result.verdicts if v.metric == metric)


# --------------------------------------------------------------------------- the acceptance case


def test_128k_prefill_of_v3_on_one_910b3_cannot_meet_200ms():
    result = estimate(B3, V3, prompt_tokens=131072, output_tokens=256, slo=parse_slo("ttft=200"))
    assert not result.feasible
    ttft = verdict(result, "ttft")
    assert not ttft.feasible

    # Hand roofline at peak: 2 x 37e9 x 131072 = 9.70e15 FLOPs for the weights (30.3 s), plus causal attention
    # 4 x 61 layers x 20480 x 131072^2/2 = 4.29e16 (134 s): attention dominates at 128K.
    linear = 2 * 37e9 * 131072
    attention = 4 * 61 * 20480 * (131072 * 131073 / 2)
    assert linear / 320e12 == pytest.approx(30.31, abs=0.01)
    bound_s = (linear + attention) / 320e12
    assert bound_s == pytest.approx(164.45, abs=0.01)
    assert ttft.bound_ms == pytest.approx(bound_s * 1e3)
    assert ttft.min_chips_peak == math.ceil(bound_s / 0.2) == 823
    eff = DEFAULT_EFFICIENCY
    overheads = (eff.step_overhead_ms + 61 * eff.comm_ms_per_layer) / 1e3  # chips > 1
    per_chip_s = (linear + attention) / (320e12 * eff.compute)
    assert ttft.min_chips_efficient == math.ceil(per_chip_s / (0.2 - overheads))

    assert "prefill of 131072 tokens" in ttft.reason
    assert "needs at least 164.5 s on one 910B3 even at peak compute" in ttft.reason
    assert "ttft=200ms would need at least 823 chips at peak" in ttft.reason
    assert f"({ttft.min_chips_efficient} chips at 55% compute efficiency" in ttft.reason
    assert ttft.line.startswith("ttft=200ms: infeasible: ")


def test_v3_in_bf16_needs_thirty_chips_of_memory():
    result = estimate(B3, V3, prompt_tokens=131072, output_tokens=256)
    memory = verdict(result, "memory")
    assert not result.fits and not memory.feasible
    assert result.min_chips_for_memory == 30
    assert "at least 30 chips are needed" in memory.reason
    assert "RuntimeError: NPU out of memory" in memory.reason  # the engine's own words
    assert result.weights_gb == pytest.approx(1342)


# --------------------------------------------------------------------------- feasible and loaded cases


def test_a_small_dense_model_meets_a_loose_slo():
    result = estimate(B3, QWEN7B, prompt_tokens=1000, output_tokens=128, slo=parse_slo("ttft=500ms,tpot=50ms"))
    assert result.feasible, [v.line for v in result.verdicts]
    d = Deployment(B3, QWEN7B)
    assert result.ttft_s == result.ttft_worst_s == pytest.approx(prefill_seconds(d, 1000))
    assert result.tpot_s == pytest.approx(decode_step_seconds(d, 1, 1000 + 64))
    assert result.e2el_s == pytest.approx(result.ttft_s + 127 * result.tpot_s)
    assert result.output_tokens_per_s == pytest.approx(128 / (result.ttft_s + 127 * result.tpot_s))
    assert [v.metric for v in result.verdicts] == ["memory", "ttft", "tpot"]
    assert verdict(result, "tpot").line.startswith("tpot=50ms: feasible: predicted TPOT")


def test_concurrency_queues_prefills_and_slows_decoding():
    single = estimate(B3, QWEN7B, prompt_tokens=4000, output_tokens=256)
    loaded = estimate(B3, QWEN7B, prompt_tokens=4000, output_tokens=256, concurrency=8,
                      slo=parse_slo("ttft=1000,tpot=30"))
    prefill = single.ttft_s
    assert loaded.ttft_worst_s == pytest.approx(8 * prefill)
    assert loaded.ttft_mean_s == pytest.approx(4.5 * prefill)
    decode = decode_step_seconds(Deployment(B3, QWEN7B), 8, 8 * 4128)
    assert loaded.tpot_s == pytest.approx(decode + 7 * prefill / 255)
    assert loaded.output_tokens_per_s > single.output_tokens_per_s
    ttft = verdict(loaded, "ttft")
    assert not ttft.feasible and "at concurrency 8" in ttft.reason
    assert f"concurrency <= {int(1.0 // prefill)}" in ttft.reason


def test_more_requests_than_the_cache_holds_wait_for_space():
    result = estimate(chip_by_name("910B4"), QWEN7B, prompt_tokens=30000, output_tokens=1000, concurrency=16)
    assert result.fits and 0 < result.max_concurrency < 16 == result.concurrency
    assert result.running_batch == result.max_concurrency
    assert "wait for KV space" in verdict(result, "memory").reason
    assert result.ttft_worst_s > 16 * result.ttft_s  # the later waves wait for whole request lifetimes


def test_tpot_bound_names_the_bytes_moved():
    result = estimate(B3, QWEN7B, prompt_tokens=1000, output_tokens=100, slo=parse_slo("tpot=5"))
    tpot = verdict(result, "tpot")
    assert not tpot.feasible
    assert tpot.bound_ms == pytest.approx((7.62e9 * 2 + 1050 * 57344) / 1.6e12 * 1e3)
    assert "even at peak bandwidth" in tpot.reason and tpot.min_chips_peak == 2


def test_w8a8_v3_fits_on_two_atlas_nodes():
    result = estimate(B3, V3, prompt_tokens=2000, output_tokens=256, chips=16, weight_bytes=1.0,
                      slo=parse_slo("ttft=2000,tpot=100,e2el=30000"))
    assert result.fits and result.weight_format == "int8"
    assert result.feasible, [v.line for v in result.verdicts]


def test_e2el_bound_adds_prefill_and_decode():
    result = estimate(B3, QWEN7B, prompt_tokens=1000, output_tokens=1000, slo=parse_slo("e2el=1000"))
    e2el = verdict(result, "e2el")
    assert not e2el.feasible and "even at peak compute and bandwidth" in e2el.reason
    assert e2el.min_chips_peak is not None and e2el.min_chips_peak > 1


def test_estimate_accepts_names_and_rejects_bad_input():
    assert estimate("910b3", "v3", prompt_tokens=10, output_tokens=1).model == "deepseek-v3"
    with pytest.raises(UsageError, match="unknown model"):
        estimate("910B3", "gpt-5", prompt_tokens=10, output_tokens=1)
    with pytest.raises(UsageError, match="prompt tokens"):
        estimate(B3, QWEN7B, prompt_tokens=0, output_tokens=1)
    with pytest.raises(UsageError, match="estimate takes ttft, tpot, e2el, not itl"):
        estimate(B3, QWEN7B, prompt_tokens=10, output_tokens=1, slo=(Slo("itl", "p99", 5.0),))


def test_to_dict_is_plain_data():
    data = estimate(B3, V3, prompt_tokens=131072, output_tokens=256, slo=parse_slo("ttft=200")).to_dict()
    assert data["feasible"] is False and data["fits"] is False
    assert [v["metric"] for v in data["verdicts"]] == ["memory", "ttft"]
    assert data["verdicts"][1]["min_chips_peak"] == 823
    assert data["verdicts"][1]["line"].startswith("ttft=200ms: infeasible")


# --------------------------------------------------------------------------- parse_slo


@pytest.mark.parametrize("text, expected", [
    ("ttft=200ms,tpot=50ms", [("ttft", 200.0), ("tpot", 50.0)]),
    ("ttft:200 tpot:50", [("ttft", 200.0), ("tpot", 50.0)]),        # vLLM --goodput style, ms
    ("ttft=0.5s, e2el=2s", [("ttft", 500.0), ("e2el", 2000.0)]),
    ("TTFT=200", [("ttft", 200.0)]),
    ("tpot=.5s", [("tpot", 500.0)]),
])
def test_parse_slo(text, expected):
    assert parse_slo(text) == tuple(Slo(metric, "p99", ms) for metric, ms in expected)


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("ttft", "expected metric"), ("ttft=fast", "expected metric"), ("ttft=200us", "expected metric"),
    ("itl=20ms", "'itl=20ms': estimate takes ttft, tpot, e2el, not itl"), ("ttft=1s,ttft=2s", "already bound"),
    ("ttft=0ms", "positive"), ("error_rate=1%", "estimate takes ttft, tpot, e2el, not error_rate"),
])
def test_parse_slo_rejects(text, message):
    with pytest.raises(UsageError, match=message) as caught:
        parse_slo(text)
    assert "\n" not in str(caught.value)


def test_a_statistic_is_judged_mean_on_the_burst_mean_a_percentile_on_its_worst():
    """ttft:mean binds the burst's mean TTFT, a percentile its worst (an upper bound on every percentile)."""
    result = estimate(B3, QWEN7B, prompt_tokens=1000, output_tokens=128, concurrency=8,
                      slo=parse_slo("ttft:mean=10s,ttft:p90=10s,e2el:mean=60s"))
    mean, p90, e2el = result.verdicts[1:]
    assert mean.predicted_ms == pytest.approx(result.ttft_mean_s * 1e3) and mean.label == "ttft:mean=10000ms"
    assert p90.predicted_ms == pytest.approx(result.ttft_worst_s * 1e3) and p90.label == "ttft:p90=10000ms"
    assert e2el.predicted_ms == pytest.approx((result.ttft_mean_s + 127 * result.tpot_s) * 1e3)
    assert result.ttft_mean_s < result.ttft_worst_s
