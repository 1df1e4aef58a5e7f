"""The estimate verb (`dsctl estimate`): roofline TTFT / TPOT / throughput for a chip x model x workload, judged
against SLOs.  dsctl.core.perf.estimate does the arithmetic; the verb takes the names and texts a user gives
(profiles, weight format, --slo) and returns the estimate with the chip profile it used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsctl.core.perf.estimate import WEIGHT_FORMATS, Estimate, duration_text, parse_slo
from dsctl.core.perf.estimate import estimate as predict
from dsctl.core.perf.perfmodel import Chip, chip_by_name, model_by_name
from dsctl.errors import ExitStatus, UsageError

__all__ = ["Chip", "Estimate", "EstimateResult", "duration_text", "estimate", "weight_bytes"]


def weight_bytes(weights: str) -> float:
    """Bytes per parameter of the weight format ``weights`` (``--weights``: bf16, or int8 for W8A8 checkpoints)."""
    if weights.lower() not in WEIGHT_FORMATS:
        raise UsageError(f"--weights: unknown format {weights!r}; known: {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[weights.lower()]


@dataclass(frozen=True)
class EstimateResult:
    estimate: Estimate
    chip: Chip  # the chip profile the estimate used (its links, for the table)

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if self.estimate.feasible else ExitStatus.SLO_NOT_MET

    @property
    def errors(self) -> list[str]:
        return [verdict.line for verdict in self.estimate.verdicts if not verdict.feasible]

    def to_dict(self) -> dict[str, Any]:
        return self.estimate.to_dict()


def estimate(chip: str, model: str, *, prompt_tokens: int, output_tokens: int, concurrency: int, chips: int,
             nodes: int, expert_parallel: bool, weights: str, slo: str | None) -> EstimateResult:
    """Predict the workload on ``chips`` NPUs of ``chip`` (over ``nodes`` hosts) and judge it against ``slo``
    (dsctl's SLO grammar); UsageError for an unknown profile, weight format or SLO."""
    bytes_per_parameter = weight_bytes(weights)
    targets = parse_slo(slo) if slo is not None else ()
    profile = chip_by_name(chip)
    result = predict(profile, model_by_name(model), prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                     concurrency=concurrency, chips=chips, weight_bytes=bytes_per_parameter, slo=targets, nodes=nodes,
                     expert_parallel=expert_parallel)
    return EstimateResult(estimate=result, chip=profile)
