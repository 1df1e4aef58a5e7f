"""The quality guard: position-wise agreement of greedy outputs with the baseline's."""

from __future__ import annotations

import random

import pytest

from dsctl.core.tune.quality import DEFAULT_MIN_AGREEMENT, PROMPTS, agreement, check


def perturbed(tokens: list[str], share: float, seed: int) -> list[str]:
    """The lab engine's way of diverging: tokens replaced in place with probability ``share``."""
    rng = random.Random(seed)
    return [f"x{t}" if rng.random() < share else t for t in tokens]


def test_identical_outputs_agree_fully():
    base = [["a", "b", "c"], ["d"], []]
    result = agreement(base, [list(x) for x in base])
    assert result.value == 1.0 and result.first_divergence == (None, None, None)


def test_token_level_share_is_micro_averaged():
    base = [["a", "b", "c", "d"], ["e", "f"]]
    cand = [["a", "x", "c", "d"], ["e", "f", "g", "h"]]  # one substitution; a longer answer loses two positions
    result = agreement(base, cand)
    assert result.matches == 5 and result.compared == 8 and result.value == pytest.approx(5 / 8)
    assert result.per_prompt == (0.75, 0.5) and result.first_divergence == (1, 2)


def test_character_level():
    result = agreement(["hello world"], ["hello there"], unit="char")
    assert result.unit == "char" and result.first_divergence == (6,)
    assert result.value == pytest.approx(sum(a == b for a, b in zip("hello world", "hello there", strict=True)) / 11)
    with pytest.raises(TypeError):
        agreement(["abc"], ["abc"], unit="token")


def test_guard_passes_the_field_guides_threshold_and_refuses_a_lossy_one():
    base = [[f"t{i}" for i in range(400)] for _ in PROMPTS]
    mild = [perturbed(tokens, 0.08, seed) for seed, tokens in enumerate(base)]  # ~ threshold 0.15 on the lab curve
    heavy = [perturbed(tokens, 0.31, seed) for seed, tokens in enumerate(base)]  # ~ threshold 0.5
    assert check(base, mild) is None
    reason = check(base, heavy)
    assert reason is not None and f"below --min-agreement {DEFAULT_MIN_AGREEMENT:g}" in reason
    assert check(base, heavy, min_agreement=0.6) is None


def test_mismatched_prompt_sets_are_refused():
    with pytest.raises(ValueError):
        agreement([["a"]], [])
    with pytest.raises(ValueError):
        agreement([], [])
