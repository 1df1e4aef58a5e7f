"""`dsctl estimate`: roofline TTFT / TPOT / throughput for a chip x model x workload, and an SLO verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from dsctl import ui
from dsctl.cli_options import bounded
from dsctl.services.estimate import Chip, Estimate, duration_text, estimate
from dsctl.services.inputs import HOSTS, IN_FLIGHT, INSTANCE_NPUS, TOKENS

COLUMNS = ["quantity", "value", "how"]
_TOKENS = bounded(TOKENS.but(low=1))


def show(
    chip: Annotated[str, typer.Option("--chip", help="Chip profile, e.g. 910B3, 910B4, H100-SXM.")],
    model: Annotated[str, typer.Option("--model", help="Model profile, e.g. deepseek-v3, r1, v2-lite, r1-7b.")],
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="Input tokens per request.",
                                                     callback=_TOKENS)],
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="Output tokens per request.",
                                                     callback=_TOKENS)] = 256,
    chips: Annotated[int, typer.Option("--chips", min=1, help="NPUs of the instance (the tensor-parallel group "
                                                              "without --expert-parallel).",
                                        callback=bounded(INSTANCE_NPUS))] = 1,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Hosts the chips span, chips / nodes each (must "
                                                              "divide --chips); adds the traffic between hosts.",
                                        callback=bounded(HOSTS))] = 1,
    expert_parallel: Annotated[bool, typer.Option(
        "--expert-parallel", help="Shard a MoE model's experts over all chips (vllm-ascend --enable-expert-parallel): "
                                  "attention in TP groups inside a host, expert all-to-all per MoE layer.")] = False,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", min=1, help="Requests in flight.",
        callback=bounded(IN_FLIGHT.but(low=1)))] = 1,
    weights: Annotated[str, typer.Option("--weights", help="Weight format: bf16 or int8 (W8A8).")] = "bf16",
    slo: Annotated[str | None, typer.Option(
        "--slo", help="SLOs: ttft=200ms,tpot=50ms,e2el=10s, ttft:mean=150ms (a percentile binds the burst's worst "
                      "TTFT); vLLM's ttft:200 (ms) also works.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
) -> None:
    """Predict TTFT, TPOT and throughput from the chip and model profiles; exit 6 if an SLO cannot be met."""
    result = estimate(chip, model, prompt_tokens=prompt_tokens, output_tokens=output_tokens, concurrency=concurrency,
                      chips=chips, nodes=nodes, expert_parallel=expert_parallel, weights=weights, slo=slo)
    exit_code = int(result.exit_status)
    if as_json:
        ui.emit_json(["estimate"], result.to_dict(), exit_code=exit_code, errors=result.errors)
    else:
        _print(result.estimate, result.chip)
    if exit_code:
        raise typer.Exit(code=exit_code)


def _print(e: Estimate, chip: Chip) -> None:
    eff = e.efficiency
    per_chip = e.weights_per_chip_gb or e.weights_gb / e.chips
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
    if e.nodes > 1 or e.expert_parallel:
        rows.insert(0, ["layout", _layout(e), _links(e, chip)])
    chips = f"one {e.chip}" if e.chips == 1 else f"{e.chips} x {e.chip}"
    if e.nodes > 1:
        chips += f" ({e.nodes} hosts x {e.chips_per_node})"
    ui.print_table(f"Roofline estimate: {e.model} on {chips}, {e.prompt_tokens} in / {e.output_tokens} "
                   f"out, concurrency {e.concurrency}", COLUMNS, rows)
    console = ui.stdout_console()
    footer = ("Profiles and efficiency factors: dsctl/data/profiles.yaml. Bounds use peak compute and "
              "bandwidth; chip counts assume perfect tensor-parallel scaling")
    if e.nodes > 1:
        footer += (f" inside a host; between hosts {chip.inter_host_gbs:g} GB/s per NPU + "
                   f"{eff['inter_host_latency_us']:g} us per message (a guess), not overlapped with compute")
    console.print(footer + ".", markup=False, soft_wrap=True)
    for line in _cross_host_lines(e):  # one line each, unwrapped, so scripts can grep them
        console.print(line, markup=False, soft_wrap=True)
    for verdict in e.verdicts:
        console.print(verdict.line, markup=False, soft_wrap=True)


def _layout(e: Estimate) -> str:
    hosts = f"{e.nodes} hosts x {e.chips_per_node}" if e.nodes > 1 else f"one host of {e.chips}"
    if not e.expert_parallel:
        return f"{hosts}, one TP group of {e.chips}"
    return f"{hosts}, TP {e.tensor_parallel} x DP {e.chips // e.tensor_parallel}, experts over {e.chips}"


def _links(e: Estimate, chip: Chip) -> str:
    if e.nodes == 1:
        return "HCCS inside the host: per-layer latency only"
    return (f"HCCS inside a host (latency only); RoCE {chip.inter_host_gbs:g} GB/s per NPU between hosts, "
            f"{e.cross_host_bytes_per_chip_decode / 1e6:.2f} MB per NPU per decode step")


def _cross_host_lines(e: Estimate) -> list[str]:
    """What spanning hosts costs, or a note when one host is asked to hold more chips than a real one has."""
    if e.nodes == 1:
        if e.npus_per_host and e.chips > e.npus_per_host:
            return [f"note: one host with {e.chips} {e.chip} is hypothetical (a host holds {e.npus_per_host}); "
                    f"--nodes {-(-e.chips // e.npus_per_host)} adds the traffic between hosts"]
        return []
    lines = []
    for name, decode in (("all-to-all", e.cross_host_all_to_all_decode_s),
                         ("all-reduce", e.cross_host_all_reduce_decode_s)):
        if decode > 0:
            share = decode / e.decode_step_s if e.decode_step_s > 0 else 0.0
            lines.append(f"cross-host {name}: {decode * 1e3:.1f} ms per decode step ({share:.1%} of the "
                         f"{duration_text(e.decode_step_s)} step at batch {e.running_batch})")
    lines.append(f"cross-host total: {e.cross_host_decode_s * 1e3:.1f} ms per decode step ({e.cross_host_share:.1%}), "
                 f"{duration_text(e.cross_host_prefill_s)} of the {duration_text(e.ttft_s)} single-request prefill")
    return lines
