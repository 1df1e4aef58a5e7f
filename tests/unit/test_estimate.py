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


# --------------------------------------------------------------------------- hosts: --nodes, --expert-parallel


def _same_numbers(a, b):
    fields = ("ttft_s", "ttft_mean_s", "ttft_worst_s", "tpot_s", "e2el_s", "decode_step_s", "output_tokens_per_s",
              "kv_capacity_tokens", "min_chips_for_memory")
    return all(getattr(a, name) == getattr(b, name) for name in fields) and \
        [v.line for v in a.verdicts] == [v.line for v in b.verdicts]


def test_estimate_on_one_node_is_unchanged():
    kwargs = dict(prompt_tokens=2000, output_tokens=256, chips=16, weight_bytes=1.0, concurrency=8,
                  slo=parse_slo("ttft=2000,tpot=100,e2el=30000"))
    before = estimate(B3, V3, **kwargs)
    for expert_parallel in (False, True):
        after = estimate(B3, V3, nodes=1, expert_parallel=expert_parallel, **kwargs)
        assert _same_numbers(before, after)
        assert after.cross_host_decode_s == after.cross_host_prefill_s == 0.0 and after.nodes == 1
    dense = estimate(B3, QWEN7B, prompt_tokens=1000, output_tokens=128, chips=8, nodes=1)
    assert dense.cross_host_decode_s == 0.0 and dense.tensor_parallel == 8 and not dense.expert_parallel


def test_sixteen_chips_over_two_hosts_are_not_one_host_of_sixteen():
    kwargs = dict(prompt_tokens=1024, output_tokens=256, chips=16, weight_bytes=1.0, concurrency=32,
                  expert_parallel=True)
    # the same layout (TP 8 x DP 2) in one hypothetical host: only the traffic between hosts differs
    one, two = estimate(B3, V3, tensor_parallel=8, **kwargs), estimate(B3, V3, nodes=2, **kwargs)
    assert (two.nodes, two.chips_per_node, two.tensor_parallel, two.npus_per_host) == (2, 8, 8, 8)
    assert two.fits and two.running_batch == 32
    assert two.cross_host_all_to_all_decode_s == two.cross_host_decode_s > 0
    assert two.cross_host_all_reduce_decode_s == 0.0  # TP 8 inside each host
    assert two.decode_step_s == pytest.approx(one.decode_step_s + two.cross_host_decode_s)
    assert two.ttft_s == pytest.approx(one.ttft_s + two.cross_host_prefill_s)
    assert two.tpot_s > one.tpot_s and two.output_tokens_per_s < one.output_tokens_per_s
    assert 0.05 < two.cross_host_share < 0.5
    # twice the chips of one host (8, which V3 W8A8 does not fit) is not twice the throughput
    eight = estimate(B3, V3, prompt_tokens=1024, output_tokens=256, chips=8, weight_bytes=1.0, concurrency=32,
                     expert_parallel=True)
    assert two.output_tokens_per_s < 2 * eight.output_tokens_per_s
    data = two.to_dict()
    assert data["nodes"] == 2 and data["cross_host_decode_s"] == pytest.approx(two.cross_host_decode_s)
    assert "over 2 hosts" in verdict(two, "memory").reason


def test_a_tp_group_over_two_hosts_pays_all_reduces():
    result = estimate(B3, V3, prompt_tokens=1024, output_tokens=256, chips=16, weight_bytes=1.0, nodes=2)
    assert result.tensor_parallel == 16 and not result.expert_parallel
    assert result.cross_host_all_reduce_decode_s > 0 and result.cross_host_all_to_all_decode_s == 0.0


def test_bad_nodes_and_expert_parallel_are_refused_in_one_line():
    with pytest.raises(UsageError, match=r"^--nodes 3: 16 chips do not split evenly over 3 hosts") as caught:
        estimate(B3, V3, prompt_tokens=10, output_tokens=1, chips=16, nodes=3)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match=r"^--nodes 32: 16 chips"):
        estimate(B3, V3, prompt_tokens=10, output_tokens=1, chips=16, nodes=32)
    with pytest.raises(UsageError, match="nodes must be at least 1"):
        estimate(B3, V3, prompt_tokens=10, output_tokens=1, chips=16, nodes=0)
    with pytest.raises(UsageError, match=r"^--expert-parallel: deepseek-r1-distill-qwen-7b is a dense model"):
        estimate(B3, QWEN7B, prompt_tokens=10, output_tokens=1, chips=8, expert_parallel=True)
    with pytest.raises(UsageError, match=r"^--expert-parallel: deepseek-v3's 256 routed experts do not divide over 24"):
        estimate(B3, V3, prompt_tokens=10, output_tokens=1, chips=24, nodes=3, expert_parallel=True)


def test_a_target_only_the_cross_host_traffic_misses_says_fewer_hosts():
    kwargs = dict(prompt_tokens=1024, output_tokens=256, chips=16, weight_bytes=1.0, expert_parallel=True,
                  slo=parse_slo("tpot=14ms,ttft=50ms"))
    one, two = estimate(B3, V3, tensor_parallel=8, **kwargs), estimate(B3, V3, nodes=2, **kwargs)
    assert one.feasible and not two.feasible
    assert two.one_host_s["tpot"] == pytest.approx(one.tpot_s) and two.one_host_s["ttft_worst"] == one.ttft_worst_s
    tpot, ttft = verdict(two, "tpot"), verdict(two, "ttft")
    assert "needs fewer hosts (3.5 ms of it is traffic between the 2 hosts; the same chips in one host would take " \
           "11.9 ms)" in tpot.reason
    assert "or fewer hosts (20.5 ms of it is traffic between the 2 hosts" in ttft.reason
    assert one.one_host_s == {}


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
