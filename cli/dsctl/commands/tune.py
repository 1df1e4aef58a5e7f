"""`dsctl tune --simulate`: search an engine's parameters for the highest goodput under SLOs, offline.

Exit statuses: 0 a configuration met the SLO; 6 none did (the closest configuration and its binding constraint
are named), or the SLO is physically impossible (refused before any evaluation, with the bound); 2 bad options,
or live tuning (without --simulate), which is not available yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.adapters.ansible_run import new_artifacts_dir
from dsctl.core.tune.pareto import TrialRecord
from dsctl.errors import UsageError
from dsctl.services import tune as tune_verb

TABLE_ROWS = 10
STATUS_CHARS = 48  # the full reason is in trials.jsonl and --json
COLUMNS = ["rank", "trial", "parameters", "rate req/s", "goodput req/s", "SLO statistics", "status"]


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


def _status_cell(record: TrialRecord) -> str:
    if record.feasible:
        return "feasible"
    detail = record.detail.splitlines()[0] if record.detail else ""
    return f"{record.failure}: {detail[:STATUS_CHARS]}" if detail else str(record.failure)


def render(result: tune_verb.TuneResult) -> None:
    rows = []
    for rank, record in enumerate(result.ranked()[:TABLE_ROWS], start=1):
        rows.append([rank, record.number, tune_verb.config_text(record),
                     "-" if record.rate is None else f"{record.rate:.3g}",
                     "-" if record.objective is None else f"{record.objective:.3g}", _slo_cell(record),
                     _status_cell(record)])
    i = result.inputs
    c = result.counts
    ui.print_table(f"dsctl tune --simulate: {i.model} on {i.chip} ({i.engine}, space {result.space.name}), "
                   f"{c['evaluated']} evaluated, {c['feasible']} feasible, {c['crashed']} crashed", COLUMNS, rows)
    console = ui.stdout_console()
    for note in result.space.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if result.best is not None:
        console.print(f"best: trial {result.best.number}: {tune_verb.config_text(result.best)}", markup=False,
                      soft_wrap=True)
    console.print(f"trials: {result.trials_path}", markup=False, soft_wrap=True)
    console.print(f"Pareto plot: {result.plot_path}", markup=False, soft_wrap=True)
    for line in result.errors:  # one line each, unwrapped, so scripts can grep them
        console.print(line, markup=False, soft_wrap=True)


def run(
    inventory: Annotated[Path | None, typer.Argument(
        help="Inventory of the fleet to tune live (not available yet; --simulate reads none).")] = None,
    simulate: Annotated[bool, typer.Option(
        "--simulate", help="Evaluate candidates on dsctl's offline engine model instead of the fleet.")] = False,
    model: Annotated[str | None, typer.Option("--model", help="Model profile, e.g. r1-7b, deepseek-v3.")] = None,
    chip: Annotated[str, typer.Option("--chip", help="Chip profile, e.g. 910B3, 910B4.")] = "910B3",
    engine: Annotated[str, typer.Option("--engine", help="lab-engine (fixed-batch space) or vllm-ascend.")
                      ] = "lab-engine",
    space: Annotated[str | None, typer.Option("--space", help="Search space of tune_spaces.yaml (default: the "
                                                              "engine's).")] = None,
    slo: Annotated[list[str] | None, typer.Option(
        "--slo", help="SLO, repeatable or comma-separated: ttft=200ms, ttft:p95=200ms, tpot=50ms, e2el=2s.")] = None,
    objective: Annotated[str, typer.Option("--objective", help="goodput or throughput.")] = "goodput",
    budget: Annotated[int, typer.Option("--budget", help="Evaluations in the study.")] = 20,
    slots: Annotated[int, typer.Option("--slots", help="Evaluations at once.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the sampler and the requests.")] = 0,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="Request rate (req/s, Poisson); default: search each candidate's highest SLO-holding rate."
    )] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Narrow, pin or add a knob: name=lo:hi[:log] or name=a,b,c (repeatable).")] = None,
    prompt_tokens: Annotated[str, typer.Option(
        "--prompt-tokens", help="Prompt lengths: N, uniform:LO:HI or normal:MEAN:STD (as dsctl probe).")] = "512",
    output_tokens: Annotated[str, typer.Option(
        "--output-tokens", help="Output lengths: N, uniform:LO:HI or normal:MEAN:STD.")] = "128",
    requests: Annotated[int, typer.Option("--requests", help="Requests per evaluation.")] = 100,
    npus: Annotated[int, typer.Option("--npus", help="NPUs of one instance.")] = 1,
    max_model_len: Annotated[int | None, typer.Option(
        "--max-model-len", help="The engine's max_model_len (default: the model's).")] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="Continue the study in this run directory (same space, SLOs and objective).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
) -> None:
    """Search engine parameters for the highest goodput that meets the SLOs; exit 6 if none does."""
    if not simulate:
        raise UsageError("live tuning on the fleet is not available yet; use --simulate to tune on dsctl's "
                         "offline engine model")
    if model is None:
        raise UsageError("--model is required, e.g. --model r1-7b")
    if resume is not None and not resume.is_dir():
        raise UsageError(f"--resume {resume}: no such run directory; give the directory an earlier tune printed")
    inputs = tune_verb.TuneInputs(
        model=model, chip=chip, slos=tuple(slo or ()), run_dir=Path("."), engine=engine, space=space,
        objective=objective, budget=budget, slots=slots, seed=seed, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, requests=requests, rate=rate, params=tuple(param or ()),
        npus_per_instance=npus, max_model_len=max_model_len, resume=resume is not None)
    tune_verb.prepare(inputs)  # bad options and impossible SLOs refused before a run directory is made
    run_dir = resume if resume is not None else new_artifacts_dir("tune")
    result = tune_verb.run(tune_verb.TuneInputs(**{**vars(inputs), "run_dir": run_dir}), progress=_progress)
    code = int(result.exit_status)
    if as_json:
        ui.emit_json(["tune"], result.to_dict(), exit_code=code, errors=list(result.errors))
    else:
        render(result)
    if code:
        raise typer.Exit(code=code)
