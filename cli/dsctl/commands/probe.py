"""`dsctl probe URL`: load an OpenAI-compatible endpoint and report `vllm bench serve` metrics.

Exit statuses: 0 the probe ran (some requests may have failed; they are counted, not hidden); 6 an SLO given with
--goodput was missed, or --early-stop ended the probe because the miss was certain; 1 the server cannot be
reached or every measured request failed (7 when every one of them timed out); 2 bad options.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.adapters.probe_client import Load, ProbeClient, ProbeError, ProbeRun, RunResult, Target, Timeouts
from dsctl.core.load import arrivals, probe_metrics
from dsctl.core.load.probe_metrics import RequestRecord, SloWatch
from dsctl.core.load.workload import ENDPOINTS, LengthSpec, Workload, encode_body, load_prompts, request_body
from dsctl.errors import DsctlError, ExitStatus, UsageError

DEFINITIONS = ("vllm bench serve (vllm/benchmarks/serve.py::calculate_metrics): TTFT = first choice-bearing SSE "
               "message - send; ITL = all inter-message gaps; E2EL = last message - send; TPOT = (E2EL - TTFT) / "
               "(output tokens - 1) for requests with > 1 token; percentiles interpolate linearly; failed requests "
               "excluded from latencies; client queue time kept apart")
DEFAULT_REQUESTS = 100
WARMUP_BASE = 1_000_000_000  # workload indices of warm-up requests, so they never share a measured prompt


@dataclass
class ProbeConfig:
    url: str
    endpoint: str = "completions"
    model: str | None = None
    rate: float | None = None
    concurrency: int | None = None
    arrival: str | None = None
    burstiness: float | None = None
    ramp_to: float | None = None
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    prompt_tokens: str = "512"
    output_tokens: str = "128"
    prompts: Path | None = None
    shared_prefix: float = 0.0
    goodput: list[str] = field(default_factory=list)
    slo_stat: str = "p90"
    early_stop: bool = False
    timeout: float = 300.0
    api_key: str | None = None
    seed: int = 0
    ignore_eos: bool = True
    record: Path | None = None


@dataclass
class Plan:
    target: Target
    path: str
    spec: arrivals.ArrivalSpec | None  # None: closed loop
    load: Load
    workload: Workload
    bounds_ms: dict[str, float]
    timeouts: Timeouts
    total_planned: int | None


@dataclass
class Outcome:
    data: dict[str, Any]
    exit_code: ExitStatus
    errors: list[str]
    result: RunResult


def _usage(message: str) -> UsageError:
    return UsageError(message)


def parse_rate(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise _usage(f"--rate {text!r}: expected requests per second (a number, or inf)") from None
    if not value > 0 or math.isnan(value):
        raise _usage(f"--rate {text!r}: must be positive (or inf)")
    return value


def make_plan(cfg: ProbeConfig) -> Plan:
    """Validate every option (UsageError, one line) and build what the run needs; no I/O except --prompts."""
    try:
        target = Target.parse(cfg.url)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if cfg.endpoint not in ENDPOINTS:
        raise _usage(f"--endpoint {cfg.endpoint!r}: expected completions or chat")
    if cfg.rate is None and cfg.concurrency is None:
        raise _usage("give --rate R (requests/s, or inf) or --concurrency C (a closed loop of C streams)")
    if cfg.concurrency is not None and cfg.concurrency < 1:
        raise _usage(f"--concurrency {cfg.concurrency}: must be at least 1")
    if cfg.requests is not None and cfg.requests < 1:
        raise _usage(f"--requests {cfg.requests}: must be at least 1")
    if cfg.duration is not None and not cfg.duration > 0:
        raise _usage(f"--duration {cfg.duration:g}: must be a positive number of seconds")
    if cfg.warmup < 0:
        raise _usage(f"--warmup {cfg.warmup}: must not be negative")
    if not cfg.timeout > 0:
        raise _usage(f"--timeout {cfg.timeout:g}: must be a positive number of seconds")
    if not 0.0 <= cfg.shared_prefix <= 1.0:
        raise _usage(f"--shared-prefix {cfg.shared_prefix:g}: must be between 0.0 and 1.0")
    requests = cfg.requests if cfg.requests is not None or cfg.duration is not None else DEFAULT_REQUESTS

    try:
        bounds = probe_metrics.parse_goodput(cfg.goodput)
        probe_metrics.parse_statistic(cfg.slo_stat)
    except ValueError as exc:
        raise _usage(f"--goodput: {exc}" if "goodput" in str(exc) else f"--slo-stat: {exc}") from None
    if cfg.early_stop and not bounds:
        raise _usage("--early-stop needs SLO bounds: add --goodput ttft:MS [tpot:MS] [e2el:MS]")

    try:
        prompt_len = LengthSpec.parse(cfg.prompt_tokens, "--prompt-tokens")
        output_len = LengthSpec.parse(cfg.output_tokens, "--output-tokens")
        prompts = load_prompts(cfg.prompts) if cfg.prompts is not None else None
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if prompts and cfg.endpoint == "completions" and any("prompt" not in p for p in prompts):
        raise _usage(f"--prompts {cfg.prompts}: chat \"messages\" entries need --endpoint chat")
    workload = Workload(prompt_len, output_len, shared_prefix=cfg.shared_prefix, prompts=prompts, seed=cfg.seed)

    spec: arrivals.ArrivalSpec | None = None
    if cfg.rate is None:  # closed loop
        if cfg.arrival is not None or cfg.burstiness is not None or cfg.ramp_to is not None:
            raise _usage("--arrival/--burstiness/--ramp-to shape an open loop: they need --rate")
        load = Load(schedule=None, concurrency=cfg.concurrency, requests=requests, duration=cfg.duration)
        total = requests
    else:
        process = cfg.arrival or ("ramp" if cfg.ramp_to is not None else
                                  "gamma" if cfg.burstiness is not None else "poisson")
        if cfg.burstiness is not None and process in ("constant", "poisson"):
            raise _usage(f"--burstiness applies to --arrival gamma or ramp, not {process}")
        spec = arrivals.ArrivalSpec(process=process, rate=cfg.rate, burstiness=cfg.burstiness or 1.0,
                                    ramp_to=cfg.ramp_to)
        try:
            spec.validate()
            schedule = arrivals.schedule(spec, requests=requests, duration=cfg.duration, seed=cfg.seed)
        except ValueError as exc:
            raise _usage(str(exc).replace("ramp_to", "--ramp-to")) from None
        if not schedule:
            raise _usage(f"no request falls inside --duration {cfg.duration:g} s at --rate {cfg.rate:g}")
        load = Load(schedule=schedule, concurrency=cfg.concurrency, requests=len(schedule), duration=cfg.duration)
        total = len(schedule)
    timeouts = Timeouts(total=cfg.timeout, connect=min(10.0, cfg.timeout), idle=min(60.0, cfg.timeout))
    return Plan(target=target, path=ENDPOINTS[cfg.endpoint], spec=spec, load=load, workload=workload,
                bounds_ms=bounds, timeouts=timeouts, total_planned=total)


def _backstop(plan: Plan) -> float:
    """An upper bound on the measured phase: every request is bounded by the total timeout."""
    t = plan.timeouts.total
    load = plan.load
    if load.schedule is not None:
        waves = math.ceil(len(load.schedule) / load.concurrency) if load.concurrency else 1
        return load.schedule[-1] + waves * t + 10.0
    if load.requests is not None:
        bound = math.ceil(load.requests / (load.concurrency or 1)) * t + 10.0
        return bound if load.duration is None else min(bound, load.duration + t + 10.0)
    return (load.duration or 0.0) + t + 10.0


async def _resolve_model(client: ProbeClient, model: str | None) -> str:
    try:
        status, doc = await client.get_json("/v1/models", timeout=min(10.0, client.timeouts.total))
    except ProbeError as exc:
        raise DsctlError(str(exc)) from None
    if model:
        return model
    models = doc.get("data") if isinstance(doc, dict) else None
    if status != 200 or not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise DsctlError(f"{client.target.url}/v1/models answered HTTP {status} without a model list; "
                         "pass --model NAME")
    return str(models[0].get("id"))


class _Progress:
    """A rich progress bar on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.bar = None
        self.failed = 0
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("probe"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                            console=ui.stderr_console(), transient=True, refresh_per_second=4)
        self.task = self.bar.add_task("probe", total=total, failed=0)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, rec: RequestRecord) -> None:
        if self.bar is None:
            return
        if not rec.success:
            self.failed += 1
        self.bar.update(self.task, advance=1, failed=self.failed)


def describe(plan: Plan, model: str) -> str:
    load = plan.load
    if plan.spec is None:
        how = f"closed loop of {load.concurrency} streams"
    else:
        how = f"{plan.spec.process} arrivals at {_num(plan.spec.rate)} req/s"
        if plan.spec.ramp_to is not None:
            how += f" ramping to {plan.spec.ramp_to:g}"
        if load.concurrency:
            how += f", at most {load.concurrency} in flight"
    bound = f"{plan.total_planned} requests" if plan.total_planned is not None else f"{load.duration:g} s"
    return f"probing {plan.target.url}{plan.path} (model {model}): {how}, {bound}"


def execute(cfg: ProbeConfig, *, show_progress: bool | None = None,
            announce: Callable[[str], None] | None = None, lag_samples: list[float] | None = None) -> Outcome:
    """Run a probe end to end and return its JSON data and exit status (raises DsctlError when unreachable).
    ``lag_samples`` (bench/probe.py) collects how late the event loop handled each read after the kernel got it."""
    plan = make_plan(cfg)
    watch = SloWatch(plan.bounds_ms, cfg.slo_stat, plan.total_planned) if plan.bounds_ms else None
    if show_progress is None:
        show_progress = ui.stderr_console().is_terminal

    async def main() -> tuple[str, RunResult]:
        async with ProbeClient(plan.target, api_key=cfg.api_key, timeouts=plan.timeouts,
                               lag_samples=lag_samples) as client:
            model = await _resolve_model(client, cfg.model)
            if announce is not None:
                announce(describe(plan, model))
                if cfg.early_stop and plan.total_planned is None:
                    announce("note: a closed loop bounded only by --duration has no planned request count, so "
                             "--early-stop can never be certain; add --requests")

            def body(index: int) -> tuple[bytes, int]:
                planned = plan.workload.request(index if index >= 0 else WARMUP_BASE - 1 - index)
                return encode_body(request_body(cfg.endpoint, model, planned, ignore_eos=cfg.ignore_eos)), \
                    planned.prompt_tokens

            with _Progress(plan.total_planned, show_progress) as bar:
                def on_finish(rec: RequestRecord) -> None:
                    bar.advance(rec)
                    if watch is not None:
                        watch.add(rec)
                        if cfg.early_stop:
                            reason = watch.certainly_missed()
                            if reason:
                                run.stop(reason)

                run = ProbeRun(client, plan.path, body, plan.load, warmup=cfg.warmup, on_finish=on_finish)
                result = await run.run(backstop=_backstop(plan))
            return model, result

    model, result = asyncio.run(main())
    if cfg.record is not None:
        write_record(cfg.record, result)
    return summarize(cfg, plan, model, result, watch)


def summarize(cfg: ProbeConfig, plan: Plan, model: str, result: RunResult, watch: SloWatch | None) -> Outcome:
    metrics = probe_metrics.calculate_metrics(result.records, result.duration, plan.bounds_ms or None)
    errors: list[str] = []
    slo: dict[str, Any] | None = None
    code = ExitStatus.OK
    if watch is not None:
        missed = watch.missed()
        met = not missed and result.stopped is None
        values = {k: ("inf" if v is not None and math.isinf(v) else v) for k, v in watch.values().items()}
        slo = {"bounds_ms": plan.bounds_ms, "statistic": watch.statistic, "values_ms": values,
               "met": met, "missed": missed, "early_stop": cfg.early_stop,
               "early_stopped": result.stopped is not None, "reason": result.stopped,
               "failed_requests_count_as_misses": True}
        if not met:
            code = ExitStatus.SLO_NOT_MET
            errors.append("SLO missed: " + (result.stopped or "; ".join(missed)))
    if result.backstop_hit and code == ExitStatus.OK:
        code = ExitStatus.TIMEOUT
        errors.append("the probe hit its overall time limit; unfinished requests counted as timeouts")
    failed = [r for r in result.records if not r.success and not r.cancelled]
    if metrics["completed"] == 0 and failed:
        all_timeouts = all(r.error == probe_metrics.ErrorClass.TIMEOUT for r in failed)
        code = ExitStatus.TIMEOUT if all_timeouts else ExitStatus.ERROR
        first = failed[0]
        errors.insert(0, f"every request to {plan.target.url} failed ({first.error}: {first.error_detail})")
    warm_failed = sum(1 for r in result.warmup if not r.success)
    data = {
        "target": {"url": plan.target.url, "endpoint": plan.path, "model": model},
        "config": config_dict(cfg, plan),
        "definitions": DEFINITIONS,
        "metrics": metrics,
        "slo": slo,
        "warmup": {"requests": len(result.warmup), "failed": warm_failed},
        "failure_examples": [{"id": r.request_id, "class": str(r.error), "detail": r.error_detail}
                             for r in failed[:5]],
    }
    return Outcome(data=data, exit_code=code, errors=errors, result=result)


def config_dict(cfg: ProbeConfig, plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    return {  # never the API key
        "load": "closed_loop" if spec is None else "open_loop",
        "arrival": None if spec is None else spec.process,
        "rate": None if spec is None else _num(spec.rate),
        "burstiness": None if spec is None or spec.process in ("constant", "poisson") else _num(spec.burstiness),
        "ramp_to": None if spec is None else spec.ramp_to,
        "concurrency": plan.load.concurrency,
        "requests_planned": plan.total_planned,
        "duration_limit_s": cfg.duration,
        "warmup": cfg.warmup,
        "prompt_tokens": str(plan.workload.prompt_len) if cfg.prompts is None else None,
        "output_tokens": str(plan.workload.output_len),
        "prompts_file": None if cfg.prompts is None else str(cfg.prompts),
        "shared_prefix": cfg.shared_prefix,
        "ignore_eos": cfg.ignore_eos,
        "seed": cfg.seed,
        "timeout_s": cfg.timeout,
        "api_key_set": bool(cfg.api_key),
    }


def _num(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def write_record(path: Path, result: RunResult) -> None:
    """One JSON line per measured request, times in wall-clock seconds (time.time()) and ms offsets."""
    off = result.perf_to_wall
    lines = []
    for r in result.records:
        sent = None if math.isnan(r.sent) else r.sent + off
        lines.append(json.dumps({
            "id": r.request_id, "scheduled": r.scheduled + off, "sent": sent,
            "first_token_time": r.chunk_times[0] + off if r.chunk_times else None,
            "finish_time": None if math.isnan(r.end) else r.end + off,
            "ttft_ms": r.ttft * 1e3 if r.success else None, "e2el_ms": r.e2el * 1e3 if r.success else None,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_len if r.success else None,
            "messages": len(r.chunk_times), "status": r.status, "success": r.success,
            "error": None if r.error is None else str(r.error), "error_detail": r.error_detail or None,
            "cancelled": r.cancelled,
        }))
    try:
        path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    except OSError as exc:
        raise DsctlError(f"--record {path}: {exc.strerror or exc}") from None


# -- rendering ----------------------------------------------------------------------------------------------


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render(data: dict[str, Any]) -> None:
    m = data["metrics"]
    failures = ", ".join(f"{k} {v}" for k, v in m["failures"].items() if v)
    target = data["target"]
    rows: list[list[Any]] = [
        ["Endpoint", f"{target['url']}{target['endpoint']}"],
        ["Model", target["model"]],
        ["Successful requests", m["completed"]],
        ["Failed requests", f"{m['failed']}" + (f" ({failures})" if failures else "")],
    ]
    if m["cancelled"]:
        rows.append(["Cancelled by early stop", m["cancelled"]])
    rows += [
        ["Benchmark duration (s)", _f(m["duration_s"])],
        ["Total input tokens", m["total_input_tokens"]],
        ["Total generated tokens", m["total_output_tokens"]],
        ["Request throughput (req/s)", _f(m["request_throughput"])],
    ]
    if m["request_goodput"] is not None:
        rows.append(["Request goodput (req/s)", _f(m["request_goodput"])])
    rows += [
        ["Output token throughput (tok/s)", _f(m["output_throughput"])],
        ["Peak output token throughput (tok/s)", _f(m["max_output_tokens_per_s"])],
        ["Peak concurrent requests", m["max_concurrent_requests"]],
        ["Total Token throughput (tok/s)", _f(m["total_token_throughput"])],
    ]
    ui.print_table("============ Serving Benchmark Result ============", ["metric", "value"], rows)
    names = [("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)"),
             ("client_queue_ms", "Client queue (ms)")]
    lat_rows = [[label, _f(m[key]["mean"]), _f(m[key]["median"]), _f(m[key]["std"]), _f(m[key]["p90"]),
                 _f(m[key]["p95"]), _f(m[key]["p99"]), m[key]["n"]] for key, label in names]
    ui.print_table("Latency (vllm bench serve definitions; failed requests excluded)",
                   ["metric", "mean", "median", "std", "p90", "p95", "p99", "n"], lat_rows)
    slo = data["slo"]
    if slo is not None:
        verdict = "met" if slo["met"] else ("missed (early stop)" if slo["early_stopped"] else "missed")
        slo_rows = []
        for key, bound in slo["bounds_ms"].items():
            value = slo["values_ms"].get(key)
            ok = value is None or (value != "inf" and value <= bound)
            slo_rows.append([key, f"{bound:g}", _f(value), "ok" if ok else "missed"])
        failed = m["failed"]
        note = f" ({failed} failed request(s) count as misses)" if failed else ""
        ui.print_table(f"SLO {slo['statistic']}: {verdict}{note}",
                       ["metric", "bound (ms)", f"{slo['statistic']} (ms)", "verdict"], slo_rows)
    if data["failure_examples"]:
        ui.print_table("Failed requests (first 5)", ["id", "class", "detail"],
                       [[e["id"], e["class"], e["detail"]] for e in data["failure_examples"]])


# -- the command ----------------------------------------------------------------------------------------------


def run(
    target: Annotated[list[str], typer.Argument(
        metavar="URL", help="Server base URL, e.g. http://HOST:8000 (a trailing /v1 is fine). Terms such as "
                            "tpot:50 after --goodput ttft:200 are read as more --goodput terms, as vLLM allows.")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions (/v1/completions) or chat.")] = "completions",
    model: Annotated[str | None, typer.Option("--model", help="Model name; default: the first of /v1/models.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Open loop: requests/s (float, or inf = all at once).")
                    ] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", help="Alone: a closed loop of C streams. With --rate: a cap on in-flight requests.")] = None,
    arrival: Annotated[str | None, typer.Option(
        "--arrival", help="constant | poisson (default) | gamma | ramp.")] = None,
    burstiness: Annotated[float | None, typer.Option(
        "--burstiness", help="Gamma shape as in vLLM: 1 Poisson, <1 burstier, >1 more regular.")] = None,
    ramp_to: Annotated[float | None, typer.Option(
        "--ramp-to", help="Ramp: the rate goes linearly from --rate to this over the duration.")] = None,
    requests: Annotated[int | None, typer.Option(
        "--requests", help=f"Measured requests (default {DEFAULT_REQUESTS} unless --duration).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop sending after S seconds.")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Requests sent first and left out of every metric.")] = 0,
    prompt_tokens: Annotated[str, typer.Option(
        "--prompt-tokens", help="N, uniform:LO:HI or normal:MEAN:STD (about one token per word).")] = "512",
    output_tokens: Annotated[str, typer.Option(
        "--output-tokens", help="max_tokens: N, uniform:LO:HI or normal:MEAN:STD.")] = "128",
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", help="JSONL of {\"prompt\": ...} or {\"messages\": [...]}, optional output_tokens.")] = None,
    shared_prefix: Annotated[float, typer.Option(
        "--shared-prefix", help="Share (0.0-1.0) of each prompt that is a prefix common to all requests.")] = 0.0,
    goodput: Annotated[list[str] | None, typer.Option(
        "--goodput", help="Per-request SLO bounds in ms, e.g. --goodput ttft:200 tpot:50 (keys ttft, tpot, e2el).")
    ] = None,
    slo_stat: Annotated[str, typer.Option(
        "--slo-stat", help="Statistic the --goodput bounds bind for the verdict: p50|median|p90|p95|p99|mean.")
    ] = "p90",
    early_stop: Annotated[bool, typer.Option(
        "--early-stop", help="End the probe as soon as the SLO is certainly missed (exit 6).")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds per request (connect 10 s and idle 60 s at most, within it).")] = 300.0,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="DSCTL_API_KEY", show_envvar=True, show_default=False,
        help="Bearer token for the server (never printed).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for arrivals and prompts.")] = 0,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Ask the server to generate exactly max_tokens (vLLM ignore_eos).")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
    record: Annotated[Path | None, typer.Option(
        "--record", help="Write one JSON line per measured request to this file.")] = None,
) -> None:
    """Load an OpenAI-compatible endpoint and report vllm-bench-serve metrics (TTFT, TPOT, ITL, E2EL, goodput)."""
    terms = list(goodput or [])
    urls = []
    for item in target:
        key = item.split(":", 1)[0].lower()
        if terms and key in probe_metrics.GOODPUT_METRICS and "//" not in item:
            terms.append(item)
        else:
            urls.append(item)
    if len(urls) != 1:
        raise UsageError(f"expected one URL, got {len(urls)}: {' '.join(urls) or '(none)'}")
    cfg = ProbeConfig(
        url=urls[0], endpoint=endpoint, model=model, rate=parse_rate(rate), concurrency=concurrency,
        arrival=arrival, burstiness=burstiness, ramp_to=ramp_to, requests=requests, duration=duration,
        warmup=warmup, prompt_tokens=prompt_tokens, output_tokens=output_tokens, prompts=prompts,
        shared_prefix=shared_prefix, goodput=terms, slo_stat=slo_stat, early_stop=early_stop, timeout=timeout,
        api_key=api_key, seed=seed, ignore_eos=ignore_eos, record=record,
    )
    started = time.perf_counter()
    outcome = execute(cfg, announce=None if as_json else ui.progress)
    if as_json:
        ui.emit_json(["probe"], outcome.data, exit_code=int(outcome.exit_code), errors=outcome.errors)
    else:
        render(outcome.data)
        for line in outcome.errors:
            print(f"dsctl: {line}", file=sys.stderr)
        ui.progress(f"probe finished in {time.perf_counter() - started:.1f} s")
    if outcome.exit_code:
        raise typer.Exit(int(outcome.exit_code))
