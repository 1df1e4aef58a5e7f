"""Whether the prompts a probe sends are as long as asked, counted in the server's tokens (pure).

Without ``--tokenizer`` the probe writes a prompt of N tokens as N short common words: one token each under the
emulated engine's rule, but no real tokenizer's (the lab's tiny model counted 128 such words as 189 tokens, Qwen's
and DeepSeek's vocabularies fewer).  Two measures keep the lengths the server's:

* before the load, where the server offers a token count (vLLM's ``POST /tokenize``, which counts a completion
  prompt or chat messages with its chat template, exactly as ``usage.prompt_tokens`` will), the probe asks it for a
  few of the workload's own prompts (``CALIBRATION_PROMPTS``, none of them sent as load).  When the server's count
  is off from the planned one by more than the tolerance, the probe fits its prompts to the server's tokens at the
  scale measured (`scale`, `Workload.rescaled`), and checks the new prompts the same way;
* after the load, the server's ``usage.prompt_tokens`` of every request is set against what was planned for it
  (`sent_check`): off by more than the tolerance, the result warns with both numbers.

Tolerance: the larger of ``TOLERANCE_TOKENS`` and ``TOLERANCE_SHARE`` of the planned mean (a BOS token, and the
spread of word lengths a scale cannot remove).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TOLERANCE_SHARE = 0.03
TOLERANCE_TOKENS = 2.0
CALIBRATION_PROMPTS = 4
MIN_SCALE, MAX_SCALE = 0.05, 20.0  # a server count this far from the plan is not a tokenizer's difference


def tolerance(planned_mean: float) -> float:
    return max(TOLERANCE_TOKENS, TOLERANCE_SHARE * planned_mean)


def agrees(planned: float, server: float) -> bool:
    """Whether a server's mean prompt length ``server`` is within the tolerance of the planned mean."""
    return abs(server - planned) <= tolerance(planned)


def scale(planned: Sequence[int], server: Sequence[int]) -> float | None:
    """The server's tokens per planned token over the same prompts, or None when the counts agree already (or
    cannot be used: no prompts, a count of zero, a scale outside [MIN_SCALE, MAX_SCALE])."""
    if not planned or len(planned) != len(server) or min(planned) <= 0 or min(server) <= 0:
        return None
    total_planned, total_server = sum(planned), sum(server)
    if agrees(total_planned / len(planned), total_server / len(server)):
        return None
    ratio = total_server / total_planned
    return ratio if MIN_SCALE <= ratio <= MAX_SCALE else None


@dataclass(frozen=True)
class Calibration:
    """What the probe learnt from the server's token counts before the load."""

    counted_by: str  # "server" (/tokenize answered) | "none" (it did not: ``reason`` says why)
    planned_mean: float | None = None  # the check prompts' planned length, mean
    server_mean: float | None = None  # the server's count of the same prompts, mean
    scale: float | None = None  # server tokens per engine-rule token, when prompts were refitted
    refitted_server_mean: float | None = None  # the server's count of the refitted check prompts, mean
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"counted_by": self.counted_by, "planned_mean": _round(self.planned_mean),
                "server_mean": _round(self.server_mean), "scale": _round(self.scale, 4),
                "refitted_server_mean": _round(self.refitted_server_mean), "reason": self.reason or None}


def sent_check(pairs: Iterable[tuple[int, int | None]]) -> dict[str, Any]:
    """(planned, server's usage.prompt_tokens or None) per successful request -> the comparison of their means over
    the requests the server counted; ``warning`` is a sentence with both numbers when they disagree, else None."""
    counted = [(p, s) for p, s in pairs if s is not None and p > 0]
    out: dict[str, Any] = {"requests_counted": len(counted), "planned_mean": None, "server_mean": None,
                           "agrees": None, "warning": None}
    if not counted:
        return out
    planned = sum(p for p, _ in counted) / len(counted)
    server = sum(s for _, s in counted) / len(counted)
    out.update(planned_mean=round(planned, 2), server_mean=round(server, 2), agrees=agrees(planned, server))
    if not out["agrees"]:
        out["warning"] = (f"prompts planned as {planned:.1f} tokens on average reached the server as {server:.1f} "
                          f"(its usage.prompt_tokens over {len(counted)} requests, {server / planned - 1:+.0%}): "
                          "the figures are for that length; give --tokenizer with the served model's tokenizer "
                          "to send the length asked")
    return out


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
