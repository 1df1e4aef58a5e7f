"""`dsctl upgrade`: a rolling, probe-gated upgrade of CANN (its serving stack, the HDK when asked) behind the
gateway, with automatic rollback of a failed batch; --resume, --rollback, --check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.cli_options import (
    AskVaultOption,
    CheckOption,
    InventoryArg,
    JsonOption,
    VaultFileOption,
    VerboseOption,
    app_context,
    bounded,
    report,
)
from dsctl.services.inputs import HOSTS, IN_FLIGHT, REQUESTS, vault_options
from dsctl.services.upgrade import GateWorkload, UpgradeInputs, UpgradeResult, parse_slos, upgrade
from dsctl.ui_progress import PlaybookProgress

COLUMNS = ["batch", "host", "from", "to", "probe (gate vs baseline)", "status"]


class _Progress:
    """The verb's records as one stderr line each (batch, host, stage, elapsed); playbook tasks with -v."""

    def __init__(self, verbose: bool):
        self.console = ui.stderr_console()
        self.tasks = PlaybookProgress(self.console) if verbose else None

    def __call__(self, event: Mapping[str, Any]) -> None:
        if event.get("event") == "dsctl_upgrade":
            where = "preflight" if not event.get("batch") else (
                f"{'canary' if event.get('canary') else 'batch'} {event['batch']}/{event['batches']}")
            host = f" {event['host']}" if event.get("host") else ""
            self.console.print(f"[dim]{event.get('elapsed_s', 0):>7.1f}s[/dim] [bold]{where}[/bold]{host}: "
                               f"{event.get('msg')}", highlight=False, soft_wrap=True)
        elif self.tasks is not None:
            self.tasks(event)


def run(
    ctx: typer.Context,
    inventory: InventoryArg,
    cann: Annotated[str | None, typer.Option("--cann", help="Target CANN (default: the inventory's).")] = None,
    driver: Annotated[str | None, typer.Option("--driver", help="Target NPU driver (HDK); reinstalled on rollback.")]
    = None,
    firmware: Annotated[str | None, typer.Option("--firmware", help="Target NPU firmware (with --driver).")] = None,
    vllm_ascend: Annotated[str | None, typer.Option("--vllm-ascend", help="Target vllm-ascend release (its row "
                                                                         "of the matrix pairs it with a CANN).")]
    = None,
    batch: Annotated[str, typer.Option("--batch", help="Hosts per batch: N, or P% of the fleet.")] = "1",
    canary: Annotated[int | None, typer.Option("--canary", min=0, help="Hosts of the first batch (default: one "
                                                                       "batch).",
                                                    callback=bounded(HOSTS.but(low=0)))] = None,
    max_regression: Annotated[str, typer.Option("--max-regression", help="Allowed probe regression against the "
                                                                          "baseline, e.g. ttft=10%,throughput=5%,"
                                                                          "ttft:p90=15% (latencies: the median "
                                                                          "unless a statistic is named).")]
    = UpgradeInputs.max_regression,  # (its default)
    slo: Annotated[str | None, typer.Option("--slo", help="Absolute bounds the gate probe must also meet, in tune's "
                                                         "grammar: ttft=500ms (p99), e2el:p90=4s, vLLM's ttft:500.")]
    = None,
    check: CheckOption = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the halted or interrupted upgrade.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Return every host the upgrade touched to its "
                                                              "previous stack.")] = False,
    probe_requests: Annotated[int, typer.Option("--probe-requests", min=1, help="Requests of each instance's "
                                                                                "baseline and gate probe.",
                                                            callback=bounded(REQUESTS.but(low=1)))] = 24,
    probe_concurrency: Annotated[int, typer.Option("--probe-concurrency", min=1, help="Streams of that probe.",
                                                               callback=bounded(IN_FLIGHT.but(low=1)))] = 4,
    probe_prompt_tokens: Annotated[str, typer.Option("--probe-prompt-tokens", help="Prompt length of that probe.")]
    = "128",
    probe_output_tokens: Annotated[str, typer.Option("--probe-output-tokens", help="Output length of that probe.")]
    = "32",
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Upgrade the fleet batch by batch behind the gateway: drain, install side by side, switch, restart, probe
    gate, undrain; a failed batch is rolled back to its previous stack and the rollout halts."""
    inputs = UpgradeInputs(
        inventory=inventory, cann=cann, driver=driver, firmware=firmware, vllm_ascend=vllm_ascend, batch=batch,
        canary=canary, max_regression=max_regression, slos=parse_slos(slo), check=check, resume=resume,
        rollback=rollback,
        workload=GateWorkload(requests=probe_requests, concurrency=probe_concurrency,
                              prompt_tokens=probe_prompt_tokens, output_tokens=probe_output_tokens),
        vault=vault_options(vault_password_file, ask_vault_pass))
    context = app_context(ctx)
    result = upgrade(context.runner, context.prober, inputs, _Progress(verbose))
    report("upgrade", result, as_json=as_json, render=lambda: _render(result))


def _render(result: UpgradeResult) -> None:
    mode = " --check" if result.check_mode else ""
    ui.print_table(f"dsctl upgrade{mode}: {len(result.hosts)} hosts", COLUMNS,
                   [[row.batch or "-", row.host, row.source, row.target, row.probe, row.status]
                    for row in result.hosts])
    console = ui.stderr_console()
    for line in result.errors:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    for line in result.inventory:
        verb = "would write" if result.check_mode else "wrote"
        console.print(f"inventory: {verb} {line}", highlight=False, soft_wrap=True, markup=False)
    if result.state_file:
        console.print(f"upgrade state: {result.state_file}", markup=False, style="dim", soft_wrap=True)
