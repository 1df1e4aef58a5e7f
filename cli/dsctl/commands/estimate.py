"""`dsctl estimate`: roofline TTFT / TPOT / throughput for a chip x model x workload, and an SLO verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from dsctl import ui
from dsctl.core.perf.estimate import WEIGHT_FORMATS, Estimate, duration_text, estimate, parse_slo
from dsctl.core.perf.perfmodel import chip_by_name, model_by_name
from dsctl.errors import ExitStatus, UsageError

COLUMNS = ["quantity", "value", "how"]


def show(
    chip: Annotated[str, typer.Option("--chip", help="Chip profile, e.g. 910B3, 910B4, H100-SXM.")],
    model: Annotated[str, typer.Option("--model", help="Model profile, e.g. deepseek-v3, r1, v2-lite, r1-7b.")],
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="Input tokens per request.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="Output tokens per request.")] = 256,
    chips: Annotated[int, typer.Option("--chips", min=1, help="Tensor-parallel group size.")] = 1,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Requests in flight.")] = 1,
    weights: Annotated[str, typer.Option("--weights", help="Weight format: bf16 or int8 (W8A8).")] = "bf16",
    slo: Annotated[str | None, typer.Option(
        "--slo", help="SLOs: ttft=200ms,tpot=50ms,e2el=10s, ttft:mean=150ms (a percentile binds the burst's worst "
                      "TTFT); vLLM's ttft:200 (ms) also works.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
) -> None:
    """Predict TTFT, TPOT and throughput from the chip and model profiles; exit 6 if an SLO cannot be met."""
    if weights.lower() not in WEIGHT_FORMATS:
        raise UsageError(f"--weights: unknown format {weights!r}; known: {', '.join(WEIGHT_FORMATS)}")
    targets = parse_slo(slo) if slo is not None else ()
    result = estimate(chip_by_name(chip), model_by_name(model), prompt_tokens=prompt_tokens,
                      output_tokens=output_tokens, concurrency=concurrency, chips=chips,
                      weight_bytes=WEIGHT_FORMATS[weights.lower()], slo=targets)
    exit_code = int(ExitStatus.OK if result.feasible else ExitStatus.SLO_NOT_MET)
    if as_json:
        ui.emit_json(["estimate"], result.to_dict(), exit_code=exit_code,
                     errors=[verdict.line for verdict in result.verdicts if not verdict.feasible])
    else:
        _print(result)
    if exit_code:
        raise typer.Exit(code=exit_code)


def _print(e: Estimate) -> None:
    eff = e.efficiency
    per_chip = e.weights_gb / e.chips
    kv = (f"{e.kv_capacity_tokens} tokens" if e.fits else "does not fit")
    rows = [
        ["weights", f"{e.weights_gb:.1f} GB ({per_chip:.1f} GB per chip)", f"{e.weight_format}, total parameters"],
        ["KV cache", kv, "HBM x 0.9 - weights - workspace, per chip"],
        ["max concurrency", e.max_concurrency if e.fits else "-", f"KV / {e.prompt_tokens + e.output_tokens} tokens"],
        ["prefill FLOPs", f"{e.prefill_flops:.3g}", "2 x active params x tokens + causal attention"],
        ["TTFT, one request", duration_text(e.ttft_s), f"roofline at {eff['compute']:.0%} compute efficiency"],
        [f"TTFT at concurrency {e.concurrency}", f"mean {duration_text(e.ttft_mean_s)}, worst "
         f"{duration_text(e.ttft_worst_s)}", "prompts arriving together are prefilled one after another"],
        ["TPOT", duration_text(e.tpot_s), f"decode step {duration_text(e.decode_step_s)} at batch "
         f"{e.running_batch}, {eff['bandwidth']:.0%} bandwidth efficiency, + others' prefills"],
        ["E2EL", duration_text(e.e2el_s), "worst TTFT + (output - 1) x TPOT"],
        ["output throughput", f"{e.output_tokens_per_s:.1f} tok/s", "steady state at the running batch"],
        ["total throughput", f"{e.total_tokens_per_s:.1f} tok/s", "input + output tokens"],
        ["start-up", duration_text(e.startup_s), f"weights at {eff['load_gbs']:g} GB/s + {eff['init_s']:g} s init"],
    ]
    chips = f"one {e.chip}" if e.chips == 1 else f"{e.chips} x {e.chip}"
    ui.print_table(f"Roofline estimate: {e.model} on {chips}, {e.prompt_tokens} in / {e.output_tokens} "
                   f"out, concurrency {e.concurrency}", COLUMNS, rows)
    console = ui.stdout_console()
    console.print("Profiles and efficiency factors: dsctl/data/profiles.yaml. Bounds use peak compute and "
                  "bandwidth; chip counts assume perfect tensor-parallel scaling.", markup=False, soft_wrap=True)
    for verdict in e.verdicts:  # one line each, unwrapped, so scripts can grep them
        console.print(verdict.line, markup=False, soft_wrap=True)
