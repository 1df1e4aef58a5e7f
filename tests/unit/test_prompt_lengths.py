"""Prompt lengths in the server's tokens (dsctl.core.load.prompt_lengths) and prompts refitted to a measured scale
(Workload.rescaled).  Against real vLLM: tests/lab/test_real_vllm_deploy.py."""

from __future__ import annotations

import pytest

from dsctl.core.load import prompt_lengths
from dsctl.core.load.workload import LengthSpec, ScaledCount, Workload, engine_tokens


@pytest.mark.parametrize(("planned", "server", "expected"), [
    ([128] * 4, [128] * 4, None),  # the same count
    ([128] * 4, [129, 130, 128, 131], None),  # within 3 %: a BOS token, word-length spread
    ([128] * 4, [189, 186, 190, 187], pytest.approx(752 / 512)),  # the lab's tiny BPE: 47 % more
    ([300, 100], [150, 50], pytest.approx(0.5)),  # a vocabulary with whole phrases as tokens
    ([8] * 4, [10] * 4, None),  # 2 tokens off on 8: within the absolute tolerance
    ([128], [128 * 40], None),  # 40 x: not a tokenizer's difference, left alone (the sent check says so)
    ([], [], None), ([128], [], None), ([0], [5], None),
])
def test_the_scale_is_measured_only_when_the_counts_disagree(planned, server, expected):
    assert prompt_lengths.scale(planned, server) == expected


def test_the_sent_check_names_both_means_when_they_disagree_and_counts_only_what_the_server_counted():
    agreed = prompt_lengths.sent_check([(128, 129), (128, 127), (128, None)])
    assert agreed == {"requests_counted": 2, "planned_mean": 128.0, "server_mean": 128.0, "agrees": True,
                      "warning": None}
    off = prompt_lengths.sent_check([(128, 190), (128, 188)])
    assert off["agrees"] is False and off["server_mean"] == 189.0
    assert off["warning"].startswith("prompts planned as 128.0 tokens on average reached the server as 189.0 "
                                     "(its usage.prompt_tokens over 2 requests, +48%)")
    assert "--tokenizer" in off["warning"]
    assert prompt_lengths.sent_check([(128, None)])["agrees"] is None  # no usage: nothing to say


@pytest.mark.parametrize("scale", [1.47, 0.6, 2.5])
def test_a_rescaled_workload_fits_its_prompts_to_the_scaled_count(scale):
    base = Workload(LengthSpec.parse("uniform:64:512", "--prompt-tokens"), LengthSpec.parse("16", "-o"),
                    shared_prefix=0.25, seed=3)
    refitted = base.rescaled(scale)
    count = ScaledCount(scale)
    for index in range(20):
        asked = base.request(index).prompt_tokens
        planned = refitted.request(index)
        # the length asked, in the server's tokens as the scale predicts them, to within one word (`scale` tokens)
        assert planned.prompt_tokens == count(planned.prompt)
        assert abs(planned.prompt_tokens - asked) <= max(1, round(scale))
        assert abs(engine_tokens(planned.prompt) * scale - asked) <= scale + 1


def test_a_scale_is_refused_with_a_tokenizer_or_out_of_range():
    spec = LengthSpec.parse("8", "-p")
    with pytest.raises(ValueError, match="server scale"):
        Workload(spec, spec, counter=len, server_scale=1.5)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="server scale"):
            Workload(spec, spec, server_scale=bad)
