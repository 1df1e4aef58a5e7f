"""The probe verb: load an OpenAI-compatible endpoint and measure it as `vllm bench serve` does.

Exit statuses (``ProbeResult.exit_status``): 0 the probe ran (failed requests are counted, not hidden); 6 an SLO
given with ``goodput`` was missed, or ``early_stop`` ended the probe because the miss was certain; 1 every measured
request failed (7 when every one timed out). The server being unusable raises DsctlError (exit 1), bad inputs
UsageError (exit 2).

Progress records: ``dsctl_note`` (``msg``: what is probed), ``dsctl_probe_start`` (``total``: requests planned, or
None), ``dsctl_probe_request`` (``success``) per measured request.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters.probe_client import Load, RunResult, Target, Timeouts
from dsctl.core.load import arrivals, probe_metrics
from dsctl.core.load.probe_metrics import RequestRecord, SloWatch
from dsctl.core.load.workload import ENDPOINTS, LengthSpec, Workload, encode_body, load_prompts, request_body
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services.ports import Prober, ProgressSink, no_progress

DEFINITIONS = ("vllm bench serve (vllm/benchmarks/serve.py::calculate_metrics): TTFT = first choice-bearing SSE "
               "message - send; ITL = all inter-message gaps; E2EL = last message - send; TPOT = (E2EL - TTFT) / "
               "(output tokens - 1) for requests with > 1 token; percentiles interpolate linearly; failed requests "
               "excluded from latencies; client queue time kept apart")
DEFAULT_REQUESTS = 100
REQUEST_ID_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an RFC 9110 token
WARMUP_BASE = 1_000_000_000  # workload indices of warm-up requests, so they never share a measured prompt


@dataclass(frozen=True)
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
    goodput: tuple[str, ...] = ()  # SLO terms: "ttft:200", "tpot:50"
    slo_stat: str = "p90"
    early_stop: bool = False
    timeout: float = 300.0
    api_key: str | None = field(default=None, repr=False)  # never printed
    seed: int = 0
    ignore_eos: bool = True
    record: Path | None = None
    max_error_rate: float = probe_metrics.DEFAULT_MAX_ERROR_RATE
    request_id_header: str | None = "x-request-id"  # None: send no request id


@dataclass(frozen=True)
class Plan:
    target: Target
    path: str
    spec: arrivals.ArrivalSpec | None  # None: closed loop
    load: Load
    workload: Workload
    bounds_ms: dict[str, float]
    timeouts: Timeouts
    total_planned: int | None


@dataclass(frozen=True)
class ProbeResult:
    data: dict[str, Any]
    exit_status: ExitStatus
    errors: tuple[str, ...]
    result: RunResult = field(repr=False)  # every request's record (bench/probe.py, the tuner)

    def to_dict(self) -> dict[str, Any]:
        return self.data


def make_plan(cfg: ProbeConfig) -> Plan:
    """Validate every option (UsageError, one line) and build what the run needs; no I/O except --prompts."""
    try:
        target = Target.parse(cfg.url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if cfg.endpoint not in ENDPOINTS:
        raise UsageError(f"--endpoint {cfg.endpoint!r}: expected completions or chat")
    try:
        probe_metrics.check_max_error_rate(cfg.max_error_rate)
    except ValueError as exc:
        raise UsageError(f"--max-error-rate: {exc}") from None
    if cfg.request_id_header is not None and not REQUEST_ID_HEADER.fullmatch(cfg.request_id_header):
        raise UsageError(f"--request-id-header {cfg.request_id_header!r}: expected an HTTP header name such as "
                         "x-request-id, or none to send no request id")
    if cfg.rate is None and cfg.concurrency is None:
        raise UsageError("give --rate R (requests/s, or inf) or --concurrency C (a closed loop of C streams)")
    if cfg.concurrency is not None and cfg.concurrency < 1:
        raise UsageError(f"--concurrency {cfg.concurrency}: must be at least 1")
    if cfg.requests is not None and cfg.requests < 1:
        raise UsageError(f"--requests {cfg.requests}: must be at least 1")
    if cfg.duration is not None and not cfg.duration > 0:
        raise UsageError(f"--duration {cfg.duration:g}: must be a positive number of seconds")
    if cfg.warmup < 0:
        raise UsageError(f"--warmup {cfg.warmup}: must not be negative")
    if not cfg.timeout > 0:
        raise UsageError(f"--timeout {cfg.timeout:g}: must be a positive number of seconds")
    if not 0.0 <= cfg.shared_prefix <= 1.0:
        raise UsageError(f"--shared-prefix {cfg.shared_prefix:g}: must be between 0.0 and 1.0")
    requests = cfg.requests if cfg.requests is not None or cfg.duration is not None else DEFAULT_REQUESTS

    try:
        bounds = probe_metrics.parse_goodput(cfg.goodput)
        probe_metrics.parse_statistic(cfg.slo_stat)
    except ValueError as exc:
        raise UsageError(f"--goodput: {exc}" if "goodput" in str(exc) else f"--slo-stat: {exc}") from None
    if cfg.early_stop and not bounds:
        raise UsageError("--early-stop needs SLO bounds: add --goodput ttft:MS [tpot:MS] [e2el:MS]")

    try:
        prompt_len = LengthSpec.parse(cfg.prompt_tokens, "--prompt-tokens")
        output_len = LengthSpec.parse(cfg.output_tokens, "--output-tokens")
        prompts = load_prompts(cfg.prompts) if cfg.prompts is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if prompts and cfg.endpoint == "completions" and any("prompt" not in p for p in prompts):
        raise UsageError(f"--prompts {cfg.prompts}: chat \"messages\" entries need --endpoint chat")
    workload = Workload(prompt_len, output_len, shared_prefix=cfg.shared_prefix, prompts=prompts, seed=cfg.seed)

    spec: arrivals.ArrivalSpec | None = None
    if cfg.rate is None:  # closed loop
        if cfg.arrival is not None or cfg.burstiness is not None or cfg.ramp_to is not None:
            raise UsageError("--arrival/--burstiness/--ramp-to shape an open loop: they need --rate")
        load = Load(schedule=None, concurrency=cfg.concurrency, requests=requests, duration=cfg.duration)
        total = requests
    else:
        process = cfg.arrival or ("ramp" if cfg.ramp_to is not None else
                                  "gamma" if cfg.burstiness is not None else "poisson")
        if cfg.burstiness is not None and process in ("constant", "poisson"):
            raise UsageError(f"--burstiness applies to --arrival gamma or ramp, not {process}")
        spec = arrivals.ArrivalSpec(process=process, rate=cfg.rate, burstiness=cfg.burstiness or 1.0,
                                    ramp_to=cfg.ramp_to)
        try:
            spec.validate()
            schedule = arrivals.schedule(spec, requests=requests, duration=cfg.duration, seed=cfg.seed)
        except ValueError as exc:
            raise UsageError(str(exc).replace("ramp_to", "--ramp-to")) from None
        if not schedule:
            raise UsageError(f"no request falls inside --duration {cfg.duration:g} s at --rate {cfg.rate:g}")
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


def summarize(cfg: ProbeConfig, plan: Plan, model: str, result: RunResult, watch: SloWatch | None) -> ProbeResult:
    metrics = probe_metrics.calculate_metrics(result.records, result.duration, plan.bounds_ms or None,
                                              max_error_rate=cfg.max_error_rate)
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
    rate = metrics["errors"]
    if rate["exceeded"] and code == ExitStatus.OK:
        code = ExitStatus.ERROR_RATE_EXCEEDED
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(rate["by_class"].items()) if n)
        errors.append(f"{rate['failed']} of {rate['finished']} requests failed ({kinds}): error rate "
                      f"{rate['error_rate']:.1%} is above --max-error-rate {cfg.max_error_rate:g}")
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
    return ProbeResult(data=data, exit_status=code, errors=tuple(errors), result=result)


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


def probe(prober: Prober, cfg: ProbeConfig, progress: ProgressSink = no_progress, *,
          lag_samples: list[float] | None = None) -> ProbeResult:
    """Validate ``cfg``, run the probe end to end and summarize it. ``lag_samples`` (bench/probe.py) collects how
    late the event loop handled each read after the kernel got it."""
    plan = make_plan(cfg)
    watch = SloWatch(plan.bounds_ms, cfg.slo_stat, plan.total_planned) if plan.bounds_ms else None

    def on_model(model: str) -> None:
        progress({"event": "dsctl_note", "msg": describe(plan, model)})
        if cfg.early_stop and plan.total_planned is None:
            progress({"event": "dsctl_note", "msg": "note: a closed loop bounded only by --duration has no planned "
                                                    "request count, so --early-stop can never be certain; add "
                                                    "--requests"})
        progress({"event": "dsctl_probe_start", "total": plan.total_planned})

    def body(model: str, index: int) -> tuple[bytes, int]:
        planned = plan.workload.request(index if index >= 0 else WARMUP_BASE - 1 - index)
        return encode_body(request_body(cfg.endpoint, model, planned, ignore_eos=cfg.ignore_eos)), \
            planned.prompt_tokens

    def on_finish(rec: RequestRecord) -> str | None:
        progress({"event": "dsctl_probe_request", "success": rec.success})
        if watch is None:
            return None
        watch.add(rec)
        return watch.certainly_missed() if cfg.early_stop else None

    model, result = prober.probe(plan.target, path=plan.path, model=cfg.model, api_key=cfg.api_key,
                                 request_id_header=cfg.request_id_header,
                                 timeouts=plan.timeouts, load=plan.load, warmup=cfg.warmup, body=body,
                                 backstop=_backstop(plan), on_model=on_model, on_finish=on_finish,
                                 lag_samples=lag_samples)
    if cfg.record is not None:
        write_record(cfg.record, result)
    return summarize(cfg, plan, model, result, watch)
