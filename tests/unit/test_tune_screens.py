"""Roofline screens from estimate's model: sound (peak bounds only) and cited."""

from __future__ import annotations

from dsctl.core.tune import screens
from dsctl.core.tune.search import Candidate
from dsctl.core.tune.slo import parse_slos


def test_a_physically_impossible_slo_is_refused_with_the_bound():
    reason = screens.impossible(chip="910B3", model="deepseek-v3", prompt_tokens=131072, output_tokens=256,
                                slos=parse_slos(["ttft=200ms"]), npus_per_instance=8)
    assert reason is not None and reason.startswith("roofline: ttft=200ms: infeasible: prefill of 131072 tokens")
    assert "even at peak compute" in reason


def test_a_reachable_slo_is_not_refused():
    assert screens.impossible(chip="910B3", model="deepseek-r1-distill-qwen-7b", prompt_tokens=1024,
                              output_tokens=256, slos=parse_slos(["ttft=200ms,tpot=50ms"]), npus_per_instance=4) is None


def test_screen_rules_out_configs_that_cannot_start_and_caches():
    screen = screens.roofline_screen(chip="910B3", model="deepseek-r1-distill-qwen-7b", prompt_tokens=1024,
                                     output_tokens=256, slos=parse_slos(["ttft=2s"]), npus_per_instance=1)

    def candidate(utilization):
        return Candidate(number=0, config={}, params={"gpu_memory_utilization": utilization}, fields={},
                         needs_quality=False)

    assert screen(candidate(0.9)) is None
    low = screen(candidate(0.2))  # 64 GB x 0.2 cannot hold 15 GB of weights plus the workspace
    assert low is not None and "does not fit" in low and "The engine stops at start-up" in low
