"""`dsctl tune`: search a service's engine parameters for the highest goodput that meets SLOs, live on the fleet's
instances (each one a trial slot) and leave the winner deployed; or ``--simulate`` on dsctl's offline engine model.

Exit statuses: 0 a configuration met the SLO (live: every instance serves it and a probe confirmed it); 6 none did
(the closest configuration and its binding constraint are named; live: every instance runs the inventory's
configuration again), a confirming probe missed, or the SLO is physically impossible (refused before any restart,
with the bound); 2 bad options, or a --write-back that could not succeed (refused before any restart); 1 the
--write-back failed at the end (every instance runs the inventory's configuration again); 130 interrupted (live:
every instance restored first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.cli_options import AskVaultOption, LimitOption, VaultFileOption, app_context, bounded
from dsctl.errors import UsageError
from dsctl.services import tune as tune_verb
from dsctl.services import tune_driver, tune_live
from dsctl.services.estimate import weight_bytes
from dsctl.services.inputs import (
    HOSTS,
    IN_FLIGHT,
    INSTANCE_NPUS,
    REQUESTS,
    RUN_SECONDS,
    SEED,
    SHARE,
    TOKENS,
    Bound,
    vault_options,
)
from dsctl.services.tune_result import TrialRecord, TuneResult, capacity_figure
from dsctl.ui_tune import TuneProgress

TABLE_ROWS = 10
STATUS_CHARS = 48  # the full reason is in trials.jsonl and --json
COLUMNS = ["rank", "trial", "parameters", "sustained req/s", "per NPU", "window s", "samples", "objective",
           "SLO statistics", "status"]


def _progress(event: dict[str, Any]) -> None:
    if event.get("event") == "dsctl_note":
        ui.progress(str(event["msg"]))
        return
    if event.get("event") != "dsctl_tune_trial" or event.get("phase") != "told":
        return
    best = event.get("best")
    status = event["status"]
    if status == "feasible" and event.get("objective") is not None:
        status = f"feasible, {event['objective']:.3g} req/s"
    ui.progress(f"trial {event['number']}: {status} | {event['evaluated']}/{event['budget']} evaluated, "
                f"{event['crashed']} crashed, best so far "
                f"{'-' if best is None else f'{best:.3g} req/s'}")


def _slo_cell(record: TrialRecord) -> str:
    return ", ".join(f"{key} {value:.4g} ms" if key != "error_rate" else f"{key} {value:.2%}"
                     for key, value in record.slo_values.items()) or "-"


def _status_cell(record: TrialRecord, best: TrialRecord | None) -> str:
    if record.feasible:
        if best is not None and record.number != best.number and record.objective is not None \
                and best.objective is not None and record.objective >= best.objective:
            # ranked below the winner with an equal or higher figure: within the noise of the two verdicts
            return "feasible; not beyond the winner's noise"
        return "feasible"
    detail = record.detail.splitlines()[0] if record.detail else ""
    return f"{record.failure}: {detail[:STATUS_CHARS]}" if detail else str(record.failure)


def _params_cell(result: TuneResult, record: TrialRecord) -> str:
    """Against a baseline (live: the service's own configuration), only what differs, so the row stays readable."""
    if result.baseline_config is None:
        return tune_driver.config_text(record)
    baseline = result.baseline_config
    changed = {k: v for k, v in {**record.params, **record.fields}.items()
               if k not in baseline or not tune_live.same_value(v, baseline[k])}
    return " ".join(f"{k}={tune_driver.format_value(v)}" for k, v in changed.items()) or "(baseline)"


def _sustained_cell(record: TrialRecord) -> str:
    """The sustained rate; "≥ R (not measured above)" when no higher rate missed (the ceiling held)."""
    cap = record.capacity or {}
    rate = cap.get("sustained_rate", record.rate) if cap else record.rate
    if rate is None:
        return "-"
    return f"≥ {rate:.3g} (not measured above)" if cap.get("at_ceiling") else f"{rate:.3g}"


def _cap_cell(record: TrialRecord, key: str, fmt: str) -> str:
    value = (record.capacity or {}).get(key)
    return "-" if value is None else format(value, fmt)


def render(result: TuneResult) -> None:
    rows = []
    for rank, record in enumerate(result.ranked()[:TABLE_ROWS], start=1):
        rows.append([rank, record.number, _params_cell(result, record), _sustained_cell(record),
                     _cap_cell(record, "per_npu", ".3g"), _cap_cell(record, "window_s", ".0f"),
                     _cap_cell(record, "samples", "d"),
                     "-" if record.objective is None else f"{record.objective_name} {record.objective:.3g}",
                     _slo_cell(record), _status_cell(record, result.best)])
    c = result.counts
    live = result.mode == "live"
    title = (f"dsctl tune{'' if live else ' --simulate'}: {result.subject}, {c['evaluated']} "
             f"{'restarts' if live else 'evaluated'}, {c['feasible']} feasible, {c['crashed']} crashed, "
             f"{c['screened']} screened out, {result.wall_s:.0f} s")
    ui.print_table(title, COLUMNS, rows, wrap=("parameters", "status"))
    console = ui.stdout_console()
    for note in result.space.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if result.best is not None:
        console.print(f"best: trial {result.best.number}: {tune_driver.config_text(result.best)}"
                      + (f" at {result.best.rate:.3g} req/s" if result.best.rate is not None else ""), markup=False,
                      soft_wrap=True)
    line = tune_verb.capacity_line(result.best, result.baseline)
    if line:
        console.print(line, markup=False, soft_wrap=True)
    if result.layout is not None:
        figure = capacity_figure(result.best)
        console.print(f"layout: {tune_verb.layout_text(result.layout)}"
                      + (f": {tune_verb.rate_text(figure)}" if figure else ""), markup=False, soft_wrap=True)
    deployment = result.deployment
    if deployment is not None:
        what = "the winner" if deployment.deployed == "winner" else "the baseline (the inventory's configuration)"
        console.print(f"deployed: {what} on every instance of {deployment.service}", markup=False, soft_wrap=True)
        for v in deployment.verification:
            values = ", ".join(f"{k} {x:.4g}" for k, x in v.values.items())
            console.print(f"confirmed: {v.instance} on {v.host} at {v.rate:.3g} req/s: "
                          f"{'meets' if v.met else 'MISSES'} the SLO ({values})", markup=False, soft_wrap=True)
        for path in deployment.written:
            console.print(f"written back: {path}", markup=False, soft_wrap=True)
        if deployment.deployed == "winner" and not deployment.written:
            console.print("note: the inventory still holds the old parameters (a later dsctl deploy puts them "
                          "back); add --write-back to keep the winner", markup=False, soft_wrap=True)
    console.print(f"trials: {result.trials_path}", markup=False, soft_wrap=True)
    console.print(f"Pareto plot: {result.plot_path}", markup=False, soft_wrap=True)
    for line in result.errors:  # one line each, unwrapped, so scripts can grep them
        console.print(line, markup=False, soft_wrap=True)


def run(
    ctx: typer.Context,
    inventory: Annotated[Path | None, typer.Argument(
        help="Inventory of the fleet: the service's instances are the trial slots (not with --simulate).")] = None,
    simulate: Annotated[bool, typer.Option(
        "--simulate", help="Evaluate candidates on dsctl's offline engine model instead of the fleet.")] = False,
    service: Annotated[str | None, typer.Option(
        "--service", help="The dsctl_services entry to tune (default: the inventory's only one).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="--simulate: model profile, e.g. r1-7b.")] = None,
    chip: Annotated[str, typer.Option("--chip", help="Chip profile, e.g. 910B3, 910B4 (the roofline screen).")
                    ] = "910B3",
    engine: Annotated[str | None, typer.Option(
        "--engine", help="--simulate: lab-engine (fixed-batch space; the default on one host) or vllm-ascend (the "
                         "default with --nodes > 1).")] = None,
    space: Annotated[str | None, typer.Option("--space", help="Search space of tune_spaces.yaml (default: the "
                                                              "engine's).")] = None,
    slo: Annotated[list[str] | None, typer.Option(
        "--slo", help="SLO, repeatable or comma-separated: ttft=200ms (p99), ttft:p95=200ms, tpot=50ms, e2el=2s, "
                      "error_rate=1%; vLLM's ttft:200 (ms, p99) also works.")] = None,
    objective: Annotated[str | None, typer.Option(
        "--objective", help="capacity (default): the highest offered rate sustained while meeting every SLO, per "
                            "instance and per NPU; goodput or throughput: at --rate (the default with --rate) or at "
                            "the highest rate that held.")] = None,
    budget: Annotated[int | None, typer.Option(
        "--budget", help="Restarts (live; default 16) or evaluations (--simulate; default 20) in the study.",
        callback=bounded(Bound(None, tune_verb.MAX_BUDGET, "evaluations")))] = None,
    slots: Annotated[int | None, typer.Option(
        "--slots", help="Evaluations at once: --simulate's (default 1); live, at most this many of the service's "
                        "instances are trial slots (default: all).",
        callback=bounded(IN_FLIGHT.but(low=1, what="evaluations at once")))] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the sampler and the requests.",
                                      callback=bounded(SEED))] = 0,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="Request rate (req/s, Poisson); default: search each candidate's highest SLO-holding rate.",
        callback=bounded(Bound(None, None, "requests per second")))] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Narrow, pin or add a knob: name=lo:hi[:log] or name=a,b,c (repeatable).")] = None,
    prompt_tokens: Annotated[str, typer.Option(
        "--prompt-tokens", help="Prompt lengths: N, uniform:LO:HI or normal:MEAN:STD (as dsctl probe).")] = "512",
    output_tokens: Annotated[str, typer.Option(
        "--output-tokens", help="Output lengths: N, uniform:LO:HI or normal:MEAN:STD.")] = "128",
    requests: Annotated[int | None, typer.Option(
        "--requests", help="Floor on a probe's measured requests. By default each probe has 10 requests beyond the "
                           "SLO's percentile (p99: 1000, p95: 200, p90: 100, mean/median: 50), plus a warm-up at "
                           "the same rate (10 %, at least 10) outside the statistics, and a window of at least "
                           "--window: requests = max(rule, rate x window). A value below the rule is refused.",
        callback=bounded(REQUESTS))] = None,
    window: Annotated[float | None, typer.Option(
        "--window", help="A probe's least measured window, seconds: --simulate's virtual time (default 300) or, "
                         "live, the engine's modelled time (default 10). Longer windows give steadier capacity "
                         "verdicts and cost proportionally more.",
        callback=bounded(Bound(None, None, "seconds")))] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Live: requests before each trial's first probe.",
                                        callback=bounded(REQUESTS.but(low=0)))] = 4,
    min_agreement: Annotated[float, typer.Option(
        "--min-agreement", help="Lossy knobs: the least share of greedy output equal to the baseline's.",
        callback=bounded(SHARE.but(why=" (a share of the output)")))] = tune_live.LiveTuneInputs.min_agreement,
    max_time: Annotated[float | None, typer.Option(
        "--max-time", help="Live: start no trial after this many seconds.",
        callback=bounded(RUN_SECONDS))] = None,
    screen: Annotated[str, typer.Option(
        "--screen", help="model: the roofline bound, then dsctl's engine model (no restart for a candidate it "
                         "predicts to fail its start or miss by over 25 %); roofline: the bound only; none: start "
                         "every candidate.")] = "model",
    write_back: Annotated[bool, typer.Option(
        "--write-back", help="Live: once the winner is deployed and confirmed, write its parameters into the "
                             "inventory (comments kept; checked before the first restart).")] = False,
    npus: Annotated[int | None, typer.Option(
        "--npus", help="--simulate: NPUs of one instance, over all its hosts (default 1; with --nodes N: N x "
                       "--npus-per-node).", callback=bounded(INSTANCE_NPUS.but(why="")))] = None,
    nodes: Annotated[int, typer.Option(
        "--nodes", help="--simulate: hosts one instance spans (vllm-ascend Multi-Node-DP): the layout (TP per DP rank "
                        "inside a host, DP, expert parallel for MoE models) is searched with the other knobs.",
        callback=bounded(HOSTS))] = 1,
    npus_per_node: Annotated[int | None, typer.Option(
        "--npus-per-node", help="--simulate with --nodes: NPUs of each host (default: a host's, 8 on an Atlas 800T "
                                "A2).", callback=bounded(INSTANCE_NPUS.but(what="NPUs of one host", why="")))] = None,
    weights: Annotated[str | None, typer.Option(
        "--weights", help="--simulate: weight format, bf16 (default) or int8 (W8A8), as dsctl estimate.")] = None,
    max_model_len: Annotated[int | None, typer.Option(
        "--max-model-len", help="--simulate: the engine's max_model_len (default: the model's).",
        callback=bounded(TOKENS))] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="Continue the study in this run directory (same space, SLOs and objective).")] = None,
    limit: LimitOption = None,
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
) -> None:
    """Search engine parameters for the highest capacity that meets the SLOs and deploy the winner; exit 6 if none
    does.

    Capacity: the highest offered rate a configuration sustains (achieved throughput within 5 % of offered, the
    requests in flight not growing over the window) while meeting every SLO; a rate search that held at its ceiling
    (twice estimate's throughput bound) says "≥ ceiling (not measured above)"."""
    if objective is None:
        objective = "goodput" if rate is not None else "capacity"
    tune_driver.check_run_dir(resume)
    study = {"slos": tuple(slo or ()), "run_dir": resume, "resume": resume is not None, "space": space,
             "objective": objective, "seed": seed, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
             "requests": requests, "rate": rate, "params": tuple(param or ()), "screen": screen, "chip": chip}
    if simulate:
        result: TuneResult = tune_verb.run(_simulated(
            inventory, study, model=model, engine=engine, budget=budget, slots=slots, npus=npus, nodes=nodes,
            npus_per_node=npus_per_node, weights=weights, max_model_len=max_model_len, window=window),
            progress=_progress)
    else:
        inputs = _live(inventory, study, model=model, npus=npus, nodes=nodes, npus_per_node=npus_per_node,
                       weights=weights, max_model_len=max_model_len, service=service, budget=budget, slots=slots,
                       window=window, min_agreement=min_agreement, warmup=warmup, write_back=write_back, limit=limit,
                       vault=(vault_password_file, ask_vault_pass), max_time=max_time)
        context = app_context(ctx)
        with TuneProgress() as progress:
            result = tune_live.run(context.runner, context.prober, inputs, progress)
    code = int(result.exit_status)
    if as_json:
        ui.emit_json(["tune"], result.to_dict(), exit_code=code, errors=list(result.errors))
    else:
        render(result)
    if code:
        raise typer.Exit(code=code)


def _simulated(inventory: Path | None, study: dict[str, Any], *, model: str | None, engine: str | None,
               budget: int | None, slots: int | None, npus: int | None, nodes: int, npus_per_node: int | None,
               weights: str | None, max_model_len: int | None, window: float | None) -> tune_verb.TuneInputs:
    """--simulate's inputs (``study``: the options both modes take); its refusals, one line each."""
    if inventory is not None:
        raise UsageError("--simulate reads no inventory: drop INVENTORY, or drop --simulate to tune the fleet")
    if model is None:
        raise UsageError("--model is required with --simulate, e.g. --model r1-7b")
    chip = study["chip"]
    return tune_verb.TuneInputs(
        model=model, engine=engine or ("vllm-ascend" if nodes > 1 else "lab-engine"),
        budget=20 if budget is None else budget, slots=1 if slots is None else slots, max_model_len=max_model_len,
        nodes=nodes,
        npus_per_instance=tune_verb.instance_npus(nodes=nodes, npus=npus, npus_per_node=npus_per_node, chip=chip),
        window_s=tune_verb.TuneInputs.window_s if window is None else window,  # (its default)
        weight_bytes=weight_bytes(weights or "bf16"), **study)


def _live(inventory: Path | None, study: dict[str, Any], *, model: str | None, npus: int | None, nodes: int,
          npus_per_node: int | None, weights: str | None, max_model_len: int | None, service: str | None,
          budget: int | None, slots: int | None, window: float | None, min_agreement: float, warmup: int,
          write_back: bool, limit: str | None, vault: tuple[Path | None, bool], max_time: float | None
          ) -> tune_live.LiveTuneInputs:
    """The live tune's inputs (``study``: the options both modes take); its refusals (among them --simulate's
    options, which the live tune reads from the service), one line each."""
    if inventory is None:
        raise UsageError("give the INVENTORY whose service to tune, or --simulate --model M for a what-if study")
    if nodes != 1:
        raise UsageError(f"--nodes {nodes}: the live tune does not tune instances that span hosts yet (a trial "
                         f"would occupy a whole host group); run --simulate --nodes {nodes} for the layout, or "
                         f"drop --nodes")
    if model is not None or npus is not None or max_model_len is not None:
        raise UsageError("--model, --npus and --max-model-len are --simulate's: the live tune reads them from "
                         "the service")
    if weights is not None or npus_per_node is not None:
        raise UsageError("--weights and --npus-per-node are --simulate's: the live tune reads them from the "
                         "service")
    return tune_live.LiveTuneInputs(
        inventory=inventory, service=service, budget=16 if budget is None else budget,
        window_s=tune_live.LiveTuneInputs.window_s if window is None else window,  # (its default)
        min_agreement=min_agreement, warmup=warmup, write_back=write_back, limit=limit,
        vault=vault_options(*vault), max_time_s=max_time, max_slots=slots, **study)
