"""The quality guard for lossy knobs (kv_sparse_threshold, quantization): do a candidate's greedy outputs agree
with the baseline configuration's? (pure, no I/O)

The live tune sends the same fixed prompt set (`PROMPTS`, or the workload's own) with temperature 0 to the
baseline and to every candidate that changes a lossy knob, and compares the outputs here.

Agreement, defined position by position: for each prompt, the number of positions ``i`` where the candidate's
``i``-th unit equals the baseline's, divided by the longer of the two lengths (an output that is shorter or longer
loses the positions it lacks); over the prompt set, the sum of matches over the sum of those lengths (a micro
average: "the share of output units equal to the baseline's", long answers weigh more).  Units are tokens when
the caller has them (``unit="token"``: the streamed chunks, one token per chunk as vLLM streams unless
speculative decoding is on, or token ids), otherwise characters (``unit="char"``).  Two empty outputs agree.

Position-wise (not an edit distance) on purpose: with greedy decoding one changed token changes every later
context, so a shifted continuation is a different answer, not a near-miss; and the lab engine perturbs tokens in
place (dsctl/engine/text.py), where position-wise agreement is exactly its "share of tokens equal to the
threshold-0 output".

`DEFAULT_MIN_AGREEMENT` = 0.9 (Proposed; no public benchmark sets a threshold): at most one output unit in ten
may differ from the unsparsified baseline.  On the lab engine's divergence curve (dsctl.core.perf.perfmodel) the
field guide's kv_sparse_threshold 0.15 changes about 8 % of tokens and passes; 0.5 changes about 31 % and is
refused.  A site with a task benchmark should set ``--min-agreement`` from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MIN_AGREEMENT = 0.9
UNITS = ("token", "char")

# A fixed, varied prompt set (facts, arithmetic, code, long-form): short prompts, answers of a few hundred tokens.
PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "List the first ten prime numbers and say how you checked each one.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Summarise the causes of the First World War in one paragraph.",
    "Translate into French: The meeting is moved to Thursday at ten because the room is booked.",
    "What is 17 multiplied by 23? Show the steps.",
    "Describe how a hash table handles collisions, with one example.",
    "Give a packing list for a two-day mountain hike in autumn.",
)


@dataclass(frozen=True)
class Agreement:
    value: float  # matches / compared units over the prompt set
    matches: int
    compared: int
    per_prompt: tuple[float, ...]
    first_divergence: tuple[int | None, ...]  # first differing position per prompt (None: identical)
    unit: str

    def passes(self, min_agreement: float = DEFAULT_MIN_AGREEMENT) -> bool:
        return self.value >= min_agreement

    @property
    def worst_prompt(self) -> int:
        return min(range(len(self.per_prompt)), key=lambda i: (self.per_prompt[i], i))


def _units(output: Any, unit: str) -> Sequence[Any]:
    if unit == "char":
        if not isinstance(output, str):
            raise TypeError("character-level agreement compares strings")
        return output
    if isinstance(output, str):
        raise TypeError("token-level agreement compares token sequences (lists); pass unit='char' for text")
    return list(output)


def agreement(baseline: Sequence[Any], candidate: Sequence[Any], *, unit: str = "token") -> Agreement:
    """Agreement of ``candidate``'s outputs with ``baseline``'s, prompt by prompt (same order, same count)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}")
    if len(baseline) != len(candidate):
        raise ValueError(f"{len(baseline)} baseline outputs but {len(candidate)} candidate outputs")
    if not baseline:
        raise ValueError("the quality guard needs at least one prompt")
    matches = compared = 0
    per_prompt: list[float] = []
    first: list[int | None] = []
    for base, cand in zip(baseline, candidate, strict=True):
        a, b = _units(base, unit), _units(cand, unit)
        longest = max(len(a), len(b))
        same = [x == y for x, y in zip(a, b, strict=False)]
        hits = sum(same)
        matches += hits
        compared += longest
        per_prompt.append(1.0 if longest == 0 else hits / longest)
        diverged = next((i for i, ok in enumerate(same) if not ok), None)
        if diverged is None and len(a) != len(b):
            diverged = min(len(a), len(b))
        first.append(diverged)
    value = 1.0 if compared == 0 else matches / compared
    return Agreement(value, matches, compared, tuple(per_prompt), tuple(first), unit)


def check(baseline: Sequence[Any], candidate: Sequence[Any], *, min_agreement: float = DEFAULT_MIN_AGREEMENT,
          unit: str = "token") -> str | None:
    """None when the candidate passes the guard, else the one-line reason it is infeasible."""
    result = agreement(baseline, candidate, unit=unit)
    if result.passes(min_agreement):
        return None
    worst = result.worst_prompt
    return (f"greedy outputs agree {result.value:.3f} with the baseline's ({result.unit} level, "
            f"{result.matches}/{result.compared}), below --min-agreement {min_agreement:g}; prompt {worst} agrees "
            f"{result.per_prompt[worst]:.3f}")
