"""The probe verb: load an OpenAI-compatible endpoint and measure it as `vllm bench serve` does.

Exit statuses (``ProbeResult.exit_status``): 0 the probe ran (failed requests are counted, not hidden); 6 an SLO
given with ``goodput`` was missed, or ``early_stop`` ended the probe because the miss was certain; 1 every measured
request failed (7 when every one timed out); 9 more than ``max_error_rate`` of the requests failed. The server
being unusable raises DsctlError (exit 1), bad inputs UsageError (exit 2).

A sweep (``sweep``, `dsctl.core.load.sweep`) runs one probe per load level in one process and reports one row per
level, the knee and a PNG plot in ``run_dir``. Its exit status is that of the first level that did not exit 0,
leaving out SLO misses (past the knee an SLO is expected to be missed: each row says whether its level met it).

With --tokenizer, one non-streamed request of one output token goes first, and the server's usage.prompt_tokens
for its prompt is compared with the tokenizer's count (`check_tokenizer`): the result's ``tokenizer_check``, and a
line in ``warnings`` when they disagree or the server gave no count.

Every probe also says whether its own side was the limit (`dsctl.core.load.generator_limit`: its send lags, the
rate it offered against the one planned, its process's CPU, the machine's busy CPUs): the result's ``limited_by``
("load generator", or None), the figures under ``load_generator``, and a line in ``warnings`` with the planned and
the offered rate when it was.  Such a probe's figures describe the controller, not the server.

Progress records: ``dsctl_note`` (``msg``: what is probed), ``dsctl_probe_start`` (``total``: requests planned, or
None; once per sweep level), ``dsctl_probe_request`` (``success``) per measured request.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsctl.adapters import output_paths, sweep_plot
from dsctl.adapters.ansible_run import new_artifacts_dir
from dsctl.adapters.probe_client import Load, Preflight, RunResult, Target, Timeouts, header_value_problem
from dsctl.adapters.tokenizer import LocalTokenizer
from dsctl.core.load import arrivals, dataset, generator_limit, limits, probe_metrics, prompt_lengths, slo_spec, sweep
from dsctl.core.load.probe_metrics import GOODPUT_METRICS, RequestRecord, SloWatch, percentile_key
from dsctl.core.load.slo_spec import Slo
from dsctl.core.load.workload import ENDPOINTS, LengthSpec, Workload, encode_body, engine_tokens, request_body
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services.ports import Prober, ProgressSink, no_progress

DEFINITIONS = ("vllm bench serve (vllm/benchmarks/serve.py::calculate_metrics): TTFT = first choice-bearing SSE "
               "message - send; ITL = all inter-message gaps; E2EL = last message - send; TPOT = (E2EL - TTFT) / "
               "(output tokens - 1) for requests with > 1 token; percentiles interpolate linearly; failed requests "
               "excluded from latencies; client queue time kept apart")
DEFAULT_REQUESTS = 100
REQUEST_ID_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an RFC 9110 token
WARMUP_BASE = 1_000_000_000  # workload indices of warm-up requests, so they never share a measured prompt
PROMPT_CHECK_INDEX = WARMUP_BASE - 1  # the --tokenizer check's prompt: neither a measured nor a warm-up one


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
    goodput: tuple[Slo, ...] = ()  # per-request bounds (ttft, tpot, e2el), each judged at its own statistic
    slo_stat: str = "p90"  # the statistic the command's terms without one were given (slo_spec.parse_slos)
    early_stop: bool = False
    # the first N requests the caller's verdict leaves out (tune's capacity window: its warm-up): an early stop does
    # not count them (probe_metrics.SloWatch ``excluded``)
    early_stop_excluded: int = 0
    timeout: float = 300.0
    api_key: str | None = field(default=None, repr=False)  # never printed
    seed: int = 0
    ignore_eos: bool = True
    record: Path | None = None
    max_error_rate: float = probe_metrics.DEFAULT_MAX_ERROR_RATE
    request_id_header: str | None = "x-request-id"  # None: send no request id
    percentiles: str | None = None  # "50,90,99,99.9"; None: probe_metrics.PERCENTILES
    csv: Path | None = None  # one row per measured request
    save_text: bool = False  # keep each request's generated text (the --record lines, the result's "requests")
    tokenizer: Path | None = None  # a local Hugging Face tokenizer (directory or tokenizer.json)
    dataset: Path | None = None  # ShareGPT JSON or JSONL (optional timestamps: a trace to replay)
    sweep: str | None = None  # "rate=1:32:8" | "concurrency=1:64:4"
    run_dir: Path | None = None  # where a sweep writes sweep.json and sweep.png; None: a new run directory
    # Wall seconds per modelled second of a time-scaled engine (the lab's); None: ask the engine (its /version),
    # 1 for any server that does not say.  Rates, durations and every reported time are then modelled ones.
    time_scale: float | None = None


MAX_TIME_SCALE = 100.0


@dataclass(frozen=True)
class Plan:
    target: Target
    path: str
    spec: arrivals.ArrivalSpec | None  # None: closed loop
    load: Load
    workload: Workload
    bounds_ms: dict[str, float]
    statistics: dict[str, str]  # metric -> the statistic its bound binds in the verdict
    timeouts: Timeouts
    total_planned: int | None
    percentiles: tuple[float, ...] = probe_metrics.PERCENTILES
    tokenizer: LocalTokenizer | None = None
    # how planned prompt lengths were counted: "engine rule" | "tokenizer" | "server /tokenize"
    prompt_counting: str = "engine rule"
    replay: bool = False  # the schedule is a dataset's timestamps
    dataset_info: dict[str, Any] | None = None
    last_release: float | None = None  # an open loop's last release (seconds from the start)


@dataclass(frozen=True)
class ProbeResult:
    data: dict[str, Any]
    exit_status: ExitStatus
    errors: tuple[str, ...]
    result: RunResult = field(repr=False)  # every request's record (bench/probe.py, the tuner); a sweep's last level
    levels: tuple[RunResult, ...] = field(default=(), repr=False)  # a sweep: each level's records

    def to_dict(self) -> dict[str, Any]:
        return self.data


def load_tokenizer(path: Path) -> LocalTokenizer:
    try:
        return LocalTokenizer(path)
    except ValueError as exc:
        raise UsageError(f"--tokenizer {exc}") from None


def read_dataset(path: Path, count: Callable[[str], int], what: str = "--dataset") -> dataset.Dataset:
    """Read a dataset file within its size cap (`dsctl.core.load.dataset.MAX_BYTES`) and parse it."""
    try:
        size = path.stat().st_size
        if size > dataset.MAX_BYTES:
            raise UsageError(f"{what} {path}: {size / 2**20:.0f} MiB, more than the {dataset.MAX_BYTES >> 20} MiB a "
                             "probe reads; cut it (the probe cycles through the entries anyway)")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path}: not UTF-8 text") from None
    try:
        sharegpt = False if what == "--prompts" else (True if path.suffix.lower() == ".json" else None)
        return dataset.parse(text, f"{what} {path}", count, sharegpt=sharegpt)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def target_and_goodput(target: Sequence[str], goodput: Sequence[str] | None, slo_stat: str
                       ) -> tuple[str, tuple[Slo, ...], str]:
    """The command line's URL, its ``--goodput`` bounds and the ``--slo-stat`` they bind: terms such as ``tpot:50``
    after ``--goodput ttft:200`` are more goodput terms, as vLLM allows, not URLs.  UsageError, one line."""
    terms = list(goodput or [])
    urls = []
    for item in target:
        key = re.split(r"[:.=]", item, maxsplit=1)[0].lower()
        if terms and key in slo_spec.METRICS and "//" not in item:
            terms.append(item)
        else:
            urls.append(item)
    if len(urls) != 1:
        raise UsageError(f"expected one URL, got {len(urls)}: {' '.join(urls) or '(none)'}")
    try:
        stat = probe_metrics.parse_statistic(slo_stat)
    except ValueError as exc:
        raise UsageError(f"--slo-stat: {exc}") from None
    # the one SLO grammar: a term without a statistic (vLLM's ttft:200, or ttft=200ms) binds --slo-stat
    return urls[0], slo_spec.parse_slos(terms, "--goodput", default_statistic=stat, required=False), stat


def goodput_bounds(slos: tuple[Slo, ...]) -> tuple[dict[str, float], dict[str, str]]:
    """--goodput's SLOs -> the per-request bounds (metric -> ms) and the statistic each binds in the verdict.

    A goodput bound is per request, as vLLM's: a request is good when each bound holds for it, so a metric is
    bound once (two statistics of one metric would be two bounds for the same request), and only metrics a single
    request has: ttft, tpot, e2el (itl is per token, error_rate per run: ``dsctl tune --slo`` judges those)."""
    bounds: dict[str, float] = {}
    statistics: dict[str, str] = {}
    for slo in slos:
        if slo.metric not in GOODPUT_METRICS:
            raise UsageError(f"--goodput {slo.written!r}: a goodput bound is per request; it takes "
                             f"{', '.join(GOODPUT_METRICS)}, not {slo.metric} (dsctl tune --slo judges {slo.metric})")
        if slo.metric in bounds:
            raise UsageError(f"--goodput {slo.written!r}: {slo.metric} is already bound "
                             f"({slo.metric}:{statistics[slo.metric]}={bounds[slo.metric]:g}ms); a request has one "
                             "bound per metric, keep one of them")
        bounds[slo.metric] = slo.bound
        statistics[slo.metric] = probe_metrics.parse_statistic(slo.statistic or "p90")
    return bounds, statistics


def make_plan(cfg: ProbeConfig, tokenizer: LocalTokenizer | None = None) -> Plan:
    """Validate every option (UsageError, one line) and build what the run needs; no I/O except reading
    --prompts / --dataset and --tokenizer (``tokenizer``: one already loaded from ``cfg.tokenizer``)."""
    try:
        target = Target.parse(cfg.url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if cfg.endpoint not in ENDPOINTS:
        raise UsageError(f"--endpoint {cfg.endpoint!r}: expected completions or chat")
    # Every header value the client sends, checked by the client's one rule before any connection (RFC 9110 5.5).
    host_problem = header_value_problem(target.host_header)
    if host_problem is not None:
        raise UsageError(f"URL {cfg.url!r}: its host {host_problem}; give http://HOST:PORT with a plain host name "
                         "or address")
    if cfg.api_key:  # empty: no key, as before (an unset DSCTL_API_KEY exported empty)
        key_problem = header_value_problem(cfg.api_key)
        if key_problem is not None:  # the key itself is never printed
            raise UsageError(f"--api-key: the key {key_problem}; an HTTP header value is one line of printable "
                             "ASCII (RFC 9110 5.5): pass the key alone, without line breaks or control characters")
    try:
        probe_metrics.check_max_error_rate(cfg.max_error_rate)
    except ValueError as exc:
        raise UsageError(f"--max-error-rate: {exc}") from None
    if cfg.request_id_header is not None and not REQUEST_ID_HEADER.fullmatch(cfg.request_id_header):
        raise UsageError(f"--request-id-header {cfg.request_id_header!r}: expected an HTTP header name such as "
                         "x-request-id, or none to send no request id")
    if cfg.concurrency is not None and cfg.concurrency < 1:
        raise UsageError(f"--concurrency {cfg.concurrency}: must be at least 1")
    if cfg.requests is not None and cfg.requests < 1:
        raise UsageError(f"--requests {cfg.requests}: must be at least 1")
    try:  # before anything is built from them (`dsctl.core.load.limits`)
        if cfg.concurrency is not None:
            limits.check("--concurrency", cfg.concurrency, limits.MAX_CONCURRENCY, "requests in flight")
        for option, count in (("--requests", cfg.requests), ("--warmup", cfg.warmup)):
            if count is not None:
                limits.check(option, count, limits.MAX_REQUESTS, "requests of one probe")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if cfg.duration is not None and not cfg.duration > 0:
        raise UsageError(f"--duration {cfg.duration:g}: must be a positive number of seconds")
    if cfg.warmup < 0:
        raise UsageError(f"--warmup {cfg.warmup}: must not be negative")
    if cfg.burstiness is not None and not cfg.burstiness > 0:  # refused, never read as the default 1
        raise UsageError(f"--burstiness {cfg.burstiness:g}: must be greater than 0 (1 = Poisson, below 1 burstier, "
                         "above 1 more regular, inf = constant)")
    if not cfg.timeout > 0:
        raise UsageError(f"--timeout {cfg.timeout:g}: must be a positive number of seconds")
    if cfg.time_scale is not None and not 0 < cfg.time_scale <= MAX_TIME_SCALE:
        raise UsageError(f"--time-scale {cfg.time_scale:g}: must be above 0 and at most {MAX_TIME_SCALE:g} (wall "
                         "seconds per modelled second; 1 is real time)")
    if not 0.0 <= cfg.shared_prefix <= 1.0:
        raise UsageError(f"--shared-prefix {cfg.shared_prefix:g}: must be between 0.0 and 1.0")
    try:
        percentiles = probe_metrics.PERCENTILES if cfg.percentiles is None else \
            probe_metrics.parse_percentiles(cfg.percentiles)
    except ValueError as exc:
        raise UsageError(f"--percentiles {exc}") from None
    if cfg.prompts is not None and cfg.dataset is not None:
        raise UsageError("--prompts and --dataset both give the prompts: keep one")
    if tokenizer is None and cfg.tokenizer is not None:
        tokenizer = load_tokenizer(cfg.tokenizer)
    count = tokenizer.count if tokenizer is not None else engine_tokens
    data: dataset.Dataset | None = None
    source = cfg.dataset or cfg.prompts
    if source is not None:
        data = read_dataset(source, count, "--dataset" if cfg.dataset is not None else "--prompts")
    replay = data is not None and data.timestamps is not None and cfg.rate is None
    if cfg.rate is None and cfg.concurrency is None and not replay:
        raise UsageError("give --rate R (requests/s, or inf) or --concurrency C (a closed loop of C streams)")
    requests = cfg.requests if cfg.requests is not None or cfg.duration is not None else DEFAULT_REQUESTS
    if replay and cfg.requests is None:
        requests = len(data.timestamps)  # type: ignore[union-attr,arg-type]

    bounds, statistics = goodput_bounds(cfg.goodput)
    if cfg.early_stop and not bounds:
        raise UsageError("--early-stop needs SLO bounds: add --goodput ttft:MS [tpot:MS] [e2el:MS]")

    try:
        prompt_len = LengthSpec.parse(cfg.prompt_tokens, "--prompt-tokens")
        output_len = LengthSpec.parse(cfg.output_tokens, "--output-tokens")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    prompts = data.items if data is not None else None
    if prompts and cfg.endpoint == "completions" and any("prompt" not in p for p in prompts):
        flag = "--dataset" if cfg.dataset is not None else "--prompts"
        raise UsageError(f"{flag} {source}: chat \"messages\" entries need --endpoint chat")
    workload = Workload(prompt_len, output_len, shared_prefix=cfg.shared_prefix, prompts=prompts, seed=cfg.seed,
                        counter=tokenizer.count if tokenizer is not None else None)

    spec: arrivals.ArrivalSpec | None = None
    last_release: float | None = None  # an open loop's last release time (the backstop)
    if replay:  # the dataset's timestamps are the schedule; --concurrency, when given, caps what is in flight
        if cfg.arrival is not None or cfg.burstiness is not None or cfg.ramp_to is not None:
            raise UsageError("--arrival/--burstiness/--ramp-to shape a --rate; a dataset with timestamps replays "
                             "its own arrivals (give --rate to ignore them)")
        stamps = data.timestamps[:requests]  # type: ignore[union-attr,index]
        if cfg.duration is not None:
            stamps = [t for t in stamps if t < cfg.duration]
        if not stamps:
            raise UsageError(f"no timestamp of --dataset {cfg.dataset} falls inside --duration {cfg.duration:g} s")
        load = Load(schedule=list(stamps), concurrency=cfg.concurrency, requests=len(stamps), duration=cfg.duration)
        total = len(stamps)
        last_release = stamps[-1]
    elif cfg.rate is None:  # closed loop
        if cfg.arrival is not None or cfg.burstiness is not None or cfg.ramp_to is not None:
            raise UsageError("--arrival/--burstiness/--ramp-to shape an open loop: they need --rate")
        load = Load(schedule=None, concurrency=cfg.concurrency, requests=requests, duration=cfg.duration)
        total = requests
    else:
        process = cfg.arrival or ("ramp" if cfg.ramp_to is not None else
                                  "gamma" if cfg.burstiness is not None else "poisson")
        if cfg.burstiness is not None and process in ("constant", "poisson"):
            raise UsageError(f"--burstiness applies to --arrival gamma or ramp, not {process}")
        spec = arrivals.ArrivalSpec(process=process, rate=cfg.rate, ramp_to=cfg.ramp_to,
                                    burstiness=1.0 if cfg.burstiness is None else cfg.burstiness)
        try:
            spec.validate()
            schedule = arrivals.release_times(spec, requests=requests, duration=cfg.duration, seed=cfg.seed)
        except ValueError as exc:
            raise UsageError(str(exc).replace("ramp_to", "--ramp-to")) from None
        if not schedule.count:
            raise UsageError(f"no request falls inside --duration {cfg.duration:g} s at --rate {cfg.rate:g}")
        load = Load(schedule=schedule, concurrency=cfg.concurrency, requests=schedule.count, duration=cfg.duration)
        total = schedule.count
        last_release = schedule.last
    timeouts = Timeouts(total=cfg.timeout, connect=min(10.0, cfg.timeout), idle=min(60.0, cfg.timeout))
    info = None if data is None else {"file": str(source), "format": data.kind, "entries": len(data.items),
                                      "skipped": data.skipped, "timestamps": data.timestamps is not None,
                                      "replayed": replay}
    return Plan(target=target, path=ENDPOINTS[cfg.endpoint], spec=spec, load=load, workload=workload,
                bounds_ms=bounds, statistics=statistics, timeouts=timeouts, total_planned=total,
                percentiles=percentiles,
                tokenizer=tokenizer, prompt_counting="tokenizer" if tokenizer is not None else "engine rule",
                replay=replay, dataset_info=info, last_release=last_release)


def _backstop(plan: Plan, scale: float = 1.0) -> float:
    """An upper bound on the measured phase in wall seconds: every request is bounded by the total timeout (wall
    seconds); the schedule and the duration are modelled ones, ``scale`` wall seconds each."""
    t = plan.timeouts.total
    load = plan.load
    if load.schedule is not None:
        waves = math.ceil((plan.total_planned or 0) / load.concurrency) if load.concurrency else 1
        return (plan.last_release or 0.0) * scale + waves * t + 10.0
    if load.requests is not None:
        bound = math.ceil(load.requests / (load.concurrency or 1)) * t + 10.0
        return bound if load.duration is None else min(bound, load.duration * scale + t + 10.0)
    return (load.duration or 0.0) * scale + t + 10.0


def describe(plan: Plan, model: str) -> str:
    load = plan.load
    if plan.replay:
        how = "replaying the dataset's timestamps" + (f", at most {load.concurrency} in flight"
                                                       if load.concurrency else "")
    elif plan.spec is None:
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
    if plan.tokenizer is not None:
        recount(result, plan.tokenizer.count)
    metrics = probe_metrics.calculate_metrics(result.records, result.duration, plan.bounds_ms or None,
                                              percentiles=plan.percentiles, max_error_rate=cfg.max_error_rate)
    errors: list[str] = []
    slo: dict[str, Any] | None = None
    code = ExitStatus.OK
    if watch is not None:
        missed = watch.missed()
        met = not missed and result.stopped is None
        values = {k: ("inf" if v is not None and math.isinf(v) else v) for k, v in watch.values().items()}
        shared = set(watch.statistics.values())
        slo = {"bounds_ms": plan.bounds_ms, "statistics": watch.statistics,
               "statistic": shared.pop() if len(shared) == 1 else None, "values_ms": values,
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
        "tokenizer_check": None,  # `check_tokenizer`, with --tokenizer
        "warnings": [],  # what the numbers above may be wrong by, one sentence each
    }
    if cfg.save_text:
        data["requests"] = [{"id": r.request_id, "success": r.success, "output_tokens": r.output_len,
                             "output_counted_by": r.output_method, "text": r.text} for r in result.records]
    return ProbeResult(data=data, exit_status=code, errors=tuple(errors), result=result)


def recount(result: RunResult, count: Callable[[str], int]) -> None:
    """Re-tokenise the kept text of every successful request the server sent no usage for (vLLM does the same)."""
    for r in result.records:
        if r.output_tokens is None and r.text_parts is not None and r.success:
            r.tokenized_output = count(r.text or "")


def prompt_check_request(cfg: ProbeConfig, plan: Plan, model: str) -> tuple[bytes, int]:
    """The --tokenizer check's one request and the tokenizer's count of its prompt: a prompt of the workload that the
    load does not send, not streamed, one output token (the server counts the prompt; nothing else matters)."""
    assert plan.tokenizer is not None
    planned = plan.workload.request(PROMPT_CHECK_INDEX)
    body = request_body(cfg.endpoint, model, planned, ignore_eos=cfg.ignore_eos)
    body.pop("stream_options", None)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    text = planned.prompt if planned.prompt is not None else " ".join(  # chat: the contents, as the workload counts
        str(m.get("content", "")) for m in planned.messages or () if isinstance(m, dict))
    return encode_body(body), plan.tokenizer.count(text)


def check_tokenizer(answer: Preflight | None, tokenizer_tokens: int) -> dict[str, Any]:
    """The server's usage.prompt_tokens from the check's answer against the tokenizer's count
    (`probe_metrics.prompt_count_check`)."""
    server: int | None = None
    if answer is None:
        detail = "the check request was not sent"
    elif answer.status is None:
        detail = answer.error
    elif answer.status != 200:
        detail = f"its request was answered HTTP {answer.status}"
    else:
        usage = answer.document.get("usage") if isinstance(answer.document, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        server = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0 else None
        detail = "the server's answer has no usage.prompt_tokens"
    return probe_metrics.prompt_count_check(tokenizer_tokens, server, detail)


def config_dict(cfg: ProbeConfig, plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    return {  # never the API key
        "load": "open_loop" if spec is not None or plan.replay else "closed_loop",
        "arrival": "trace" if plan.replay else None if spec is None else spec.process,
        "rate": None if spec is None else _num(spec.rate),
        "burstiness": None if spec is None or spec.process in ("constant", "poisson") else _num(spec.burstiness),
        "ramp_to": None if spec is None else spec.ramp_to,
        "concurrency": plan.load.concurrency,
        "requests_planned": plan.total_planned,
        "duration_limit_s": cfg.duration,
        "warmup": cfg.warmup,
        "prompt_tokens": str(plan.workload.prompt_len) if plan.workload.prompts is None else None,
        "output_tokens": str(plan.workload.output_len),
        "prompts_file": None if cfg.prompts is None else str(cfg.prompts),
        "dataset": plan.dataset_info,
        "prompt_tokens_counted_by": plan.prompt_counting,
        "tokenizer": None if plan.tokenizer is None else str(plan.tokenizer.path),
        "percentiles": list(plan.percentiles),
        "save_text": cfg.save_text,
        "shared_prefix": cfg.shared_prefix,
        "ignore_eos": cfg.ignore_eos,
        "seed": cfg.seed,
        "timeout_s": cfg.timeout,
        "api_key_set": bool(cfg.api_key),
    }


def _num(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def _rows(runs: list[tuple[float | None, RunResult]], text: bool) -> list[dict[str, Any]]:
    rows = []
    for level, result in runs:
        for r in result.records:
            row = probe_metrics.request_row(r, result.perf_to_wall, text=text)
            rows.append(row if level is None else {"level": level, **row})
    return rows


def write_record(path: Path, runs: RunResult | list[tuple[float | None, RunResult]], *, text: bool = False) -> None:
    """One JSON line per measured request (`probe_metrics.request_row`; a sweep's lines carry their ``level``)."""
    runs = [(None, runs)] if isinstance(runs, RunResult) else runs
    lines = [json.dumps(row) for row in _rows(runs, text)]
    try:
        path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    except OSError as exc:
        raise DsctlError(f"--record {path}: {exc.strerror or exc}") from None


def write_csv(path: Path, runs: list[tuple[float | None, RunResult]], *, text: bool = False) -> None:
    """One CSV row per measured request: `probe_metrics.CSV_FIELDS` (send time in wall-clock seconds, latencies in
    ms, empty where a failed request has none), a sweep's ``level`` first, the ``text`` last with --save-text."""
    fields = list(probe_metrics.CSV_FIELDS)
    if any(level is not None for level, _ in runs):
        fields.insert(0, "level")
    if text:
        fields.append("text")
    try:
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for row in _rows(runs, text):
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
    except OSError as exc:
        raise DsctlError(f"--csv {path}: {exc.strerror or exc}") from None


def check_outputs(cfg: ProbeConfig) -> None:
    """Every file the probe writes at its end can be written, checked before the first request."""
    for option, path in (("--record", cfg.record), ("--csv", cfg.csv)):
        if path is not None:
            output_paths.check_file(option, path)
    if cfg.sweep is not None and cfg.run_dir is not None:
        output_paths.check_dir("--run-dir", cfg.run_dir)


def probe(prober: Prober, cfg: ProbeConfig, progress: ProgressSink = no_progress, *,
          lag_samples: list[float] | None = None) -> ProbeResult:
    """Validate ``cfg``, run the probe (or the sweep) end to end and summarize it. ``lag_samples``
    (bench/probe.py) collects how late the event loop handled each read after the kernel got it."""
    check_outputs(cfg)
    if cfg.sweep is not None:
        return run_sweep(prober, cfg, progress)
    plan = make_plan(cfg)
    result = _run(prober, cfg, plan, progress, lag_samples)
    if cfg.record is not None:
        write_record(cfg.record, result.result, text=cfg.save_text)
    if cfg.csv is not None:
        write_csv(cfg.csv, [(None, result.result)], text=cfg.save_text)
    return result


def time_scale(prober: Prober, cfg: ProbeConfig, plan: Plan) -> float:
    """The probe's time scale: --time-scale, else what the engine says of itself, else 1 (real time)."""
    if cfg.time_scale is not None:
        return cfg.time_scale
    return prober.engine_time_scale(plan.target, api_key=cfg.api_key, timeouts=plan.timeouts) or 1.0


def wall_load(load: Load, scale: float) -> Load:
    """The modelled schedule and duration in wall seconds (scale: wall seconds per modelled second)."""
    if scale == 1.0:
        return load
    schedule = None if load.schedule is None else (t * scale for t in load.schedule)
    return Load(schedule=schedule, concurrency=load.concurrency, requests=load.requests,
                duration=None if load.duration is None else load.duration * scale)


def modelled_record(rec: RequestRecord, origin: float, scale: float) -> RequestRecord:
    """``rec`` in modelled time.  The release time maps as origin + (t - origin) / scale (the schedule is modelled).
    With the engine's own stamps on every message (`dsctl.engine.openai.ENGINE_ELAPSED_KEY`), only the engine's part
    of each interval is scaled: a message's modelled time is the modelled send + its engine elapsed / scale + the
    rest of the wall interval (the client's send lag, the network, the server's front, the client's read) as it was,
    so the controller's own delays count once, not 1 / scale times.  Without stamps every instant maps as the release
    does (a probe of such an engine then reads the controller's delays 1 / scale times over)."""
    if scale == 1.0:
        return rec

    def to_model(t: float) -> float:
        return origin + (t - origin) / scale

    stamps = rec.engine_elapsed
    if stamps is None or not probe_metrics.fully_stamped(rec):
        return dataclasses.replace(rec, scheduled=to_model(rec.scheduled), sent=to_model(rec.sent),
                                   end=to_model(rec.end), chunk_times=[to_model(t) for t in rec.chunk_times])
    scheduled = to_model(rec.scheduled)
    sent = scheduled + (rec.sent - rec.scheduled)
    chunks = [sent + (t - rec.sent - e) + e / scale for t, e in zip(rec.chunk_times, stamps, strict=True)]
    end = rec.end if math.isnan(rec.end) else chunks[-1] + (rec.end - rec.chunk_times[-1])
    return dataclasses.replace(rec, scheduled=scheduled, sent=sent, end=end, chunk_times=chunks)


def modelled_result(result: RunResult, origin: float, scale: float) -> RunResult:
    if scale == 1.0:
        return result
    return dataclasses.replace(result, records=[modelled_record(r, origin, scale) for r in result.records],
                               warmup=[modelled_record(r, origin, scale) for r in result.warmup],
                               duration=result.duration / scale,
                               extra={**result.extra, "time_scale": scale})


def _run(prober: Prober, cfg: ProbeConfig, plan: Plan, progress: ProgressSink,
         lag_samples: list[float] | None = None, *, tokenizer_check: bool = True) -> ProbeResult:
    """One probe; ``tokenizer_check``: with --tokenizer, check it against the server's prompt count first."""
    excluded = cfg.early_stop_excluded if plan.total_planned is not None else 0
    watch = SloWatch(plan.bounds_ms, cfg.slo_stat, plan.total_planned, plan.statistics,
                     excluded=excluded) if plan.bounds_ms else None
    scale = time_scale(prober, cfg, plan)
    plan, calibration = calibrate_prompts(prober, cfg, plan, progress)
    origin = time.perf_counter()  # any fixed instant: modelled and wall differences agree from it

    def on_model(model: str) -> None:
        progress({"event": "dsctl_note", "msg": describe(plan, model)})
        if scale != 1.0:
            progress({"event": "dsctl_note", "msg": f"the engine runs at time scale {scale:g} (a modelled second "
                                                    f"takes {scale:g} s): rates, durations and latencies below "
                                                    "are modelled"})
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
        watch.add(modelled_record(rec, origin, scale))
        return watch.certainly_missed() if cfg.early_stop else None

    counted: list[int] = []  # the tokenizer's count of the check's prompt, once it is built

    def prompt_check(model: str) -> bytes:
        request, tokens = prompt_check_request(cfg, plan, model)
        counted.append(tokens)
        return request

    check = prompt_check if tokenizer_check and plan.tokenizer is not None else None
    model, result = prober.probe(plan.target, path=plan.path, model=cfg.model, api_key=cfg.api_key,
                                 request_id_header=cfg.request_id_header,
                                 timeouts=plan.timeouts, load=wall_load(plan.load, scale), warmup=cfg.warmup,
                                 body=body, backstop=_backstop(plan, scale),
                                 on_model=on_model, on_finish=on_finish,
                                 lag_samples=lag_samples, keep_text=cfg.save_text or plan.tokenizer is not None,
                                 preflight=check)
    outcome = summarize(cfg, plan, model, modelled_result(result, origin, scale), watch)
    outcome.data["config"]["time_scale"] = scale
    # a time-scaled emulated engine's stamps: the wall overhead added to the modelled figures once (None: none)
    outcome.data["engine_stamps"] = probe_metrics.stamped_overhead(result.records) if scale != 1.0 else None
    limit = generator_verdict(plan, result, scale)
    outcome.data["limited_by"] = generator_limit.LIMITED_BY if limit.limited else None
    outcome.data[generator_limit.KEY] = limit.to_dict()
    if limit.limited:
        outcome.data["warnings"].append(limit.warning())
    if check is not None and counted:
        verdict = check_tokenizer(result.preflight, counted[0])
        outcome.data["tokenizer_check"] = verdict
        if verdict["warning"]:
            outcome.data["warnings"].append(verdict["warning"])
    sent = prompt_lengths.sent_check((r.planned_prompt_tokens, r.server_prompt_tokens)
                                     for r in result.records if r.success)
    outcome.data["prompt_lengths"] = {**(calibration.to_dict() if calibration is not None else
                                         {"counted_by": plan.prompt_counting}), "sent": sent}
    if sent["warning"]:
        outcome.data["warnings"].append(sent["warning"])
    return outcome


def calibrate_prompts(prober: Prober, cfg: ProbeConfig, plan: Plan,
                      progress: ProgressSink) -> tuple[Plan, prompt_lengths.Calibration | None]:
    """Synthetic prompts without --tokenizer, fitted to the server's tokens where it counts them
    (`dsctl.core.load.prompt_lengths`): the plan to run and what was learnt (None: nothing to calibrate)."""
    workload = plan.workload
    if plan.tokenizer is not None or workload.prompts is not None:
        return plan, None

    def counts(candidate: Workload) -> tuple[list[int], list[int] | None, str]:
        planned = [candidate.request(PROMPT_CHECK_INDEX - k) for k in range(prompt_lengths.CALIBRATION_PROMPTS)]
        bodies = [encode_body({"prompt": p.prompt} if cfg.endpoint == "completions" else
                              {"messages": p.messages or [{"role": "user", "content": p.prompt}]}) for p in planned]
        server, why = prober.prompt_token_counts(plan.target, api_key=cfg.api_key, timeouts=plan.timeouts,
                                                 bodies=bodies)
        return [p.prompt_tokens for p in planned], server, why

    planned, server, why = counts(workload)
    if server is None:
        return plan, prompt_lengths.Calibration("none", reason=f"the server did not count tokens: {why}")
    mean = sum(planned) / len(planned)
    server_mean = sum(server) / len(server)
    factor = prompt_lengths.scale(planned, server)
    if factor is None:
        return plan, prompt_lengths.Calibration("server", mean, server_mean)
    refitted = workload.rescaled(factor)
    _, new_server, _ = counts(refitted)
    refitted_mean = None if new_server is None else sum(new_server) / len(new_server)
    progress({"event": "dsctl_note", "msg": (
        f"the server counts {server_mean:.0f} tokens in prompts planned as {mean:.0f} (its /tokenize): prompts are "
        f"fitted to its tokens ({factor:.2f} per word)" + ("" if refitted_mean is None else
                                                           f", now {refitted_mean:.0f} by its count"))})
    return replace(plan, workload=refitted, prompt_counting="server /tokenize"), prompt_lengths.Calibration(
        "server", mean, server_mean, factor, refitted_mean)


def generator_verdict(plan: Plan, result: RunResult, scale: float) -> generator_limit.GeneratorLimit:
    """Whether the probe's own side was the limit (`dsctl.core.load.generator_limit`), judged on the wall-clock
    records: send lags count only for an open loop without a --concurrency cap (a capped loop's wait for a free
    slot is planned client queue time)."""
    lags = plan.load.schedule is not None and not plan.load.concurrency
    return generator_limit.judge(generator_limit.measure(
        result.records, lags=lags, client_cpu_s=result.client_cpu_s, machine_busy=result.machine_busy,
        window_s=result.duration, time_scale=scale))


# -- sweeps -------------------------------------------------------------------------------------------------

SWEEP_JSON = "sweep.json"
SWEEP_PLOT = "sweep.png"


def _sweep_plan(cfg: ProbeConfig) -> sweep.SweepSpec:
    try:
        spec = sweep.parse(cfg.sweep or "")
    except ValueError as exc:
        raise UsageError(f"--sweep {exc}") from None
    if spec.kind == "rate" and cfg.rate is not None:
        raise UsageError("--sweep rate=... sets the rate of each level: leave out --rate")
    if spec.kind == "concurrency" and (cfg.rate is not None or cfg.concurrency is not None):
        raise UsageError("--sweep concurrency=... runs closed loops of each level's streams: leave out --rate and "
                         "--concurrency")
    if cfg.early_stop:
        raise UsageError("--early-stop ends one probe; a sweep runs past the knee on purpose: leave it out")
    return spec


def _level_cfg(cfg: ProbeConfig, kind: str, level: float, first: bool) -> ProbeConfig:
    load = {"rate": level} if kind == "rate" else {"concurrency": int(level)}
    return replace(cfg, sweep=None, record=None, csv=None, warmup=cfg.warmup if first else 0, **load)


def run_sweep(prober: Prober, cfg: ProbeConfig, progress: ProgressSink = no_progress) -> ProbeResult:
    """One probe per level of ``cfg.sweep``, in ascending order; the rows, the knee and the plot."""
    spec = _sweep_plan(cfg)
    plans = []  # every level validated before the first request is sent
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer is not None else None
    for i, level in enumerate(spec.levels):
        level_cfg = _level_cfg(cfg, spec.kind, level, i == 0)
        plans.append((level, level_cfg, make_plan(level_cfg, tokenizer)))
    progress({"event": "dsctl_note", "msg": f"sweep of {len(plans)} levels: {spec}"})
    results: list[ProbeResult] = []
    for i, (level, level_cfg, plan) in enumerate(plans, 1):
        progress({"event": "dsctl_note", "msg": f"sweep level {i}/{len(plans)}: {spec.kind} {level:g}"})
        results.append(_run(prober, level_cfg, plan, progress, tokenizer_check=i == 1))  # once per sweep
    keys = [percentile_key(p) for p in plans[0][2].percentiles]
    rows = []
    for (level, _, _), outcome in zip(plans, results, strict=True):
        row = sweep.row(level, spec.kind, outcome.data["metrics"], keys)
        row["exit_status"] = int(outcome.exit_status)
        row["slo_met"] = None if outcome.data["slo"] is None else outcome.data["slo"]["met"]
        rows.append(row)
    knee = sweep.knee(rows)
    run_dir = cfg.run_dir or new_artifacts_dir("probe-sweep")  # once every level is valid
    first = results[0].data
    data: dict[str, Any] = {
        "target": first["target"], "config": {**first["config"], "sweep": str(spec)},
        "definitions": DEFINITIONS,
        "sweep": {"kind": spec.kind, "levels": list(spec.levels), "rows": rows, "knee": knee,
                  "run_dir": str(run_dir), "plot": str(run_dir / SWEEP_PLOT), "json": str(run_dir / SWEEP_JSON)},
        "levels": [{"level": level, **{k: o.data[k] for k in ("metrics", "slo", "warmup", "failure_examples",
                                                                 "limited_by", generator_limit.KEY)}}
                   for (level, _, _), o in zip(plans, results, strict=True)],
        "tokenizer_check": results[0].data["tokenizer_check"],
        "warnings": [w for o in results for w in o.data["warnings"]],
    }
    runs = [(level, o.result) for (level, _, _), o in zip(plans, results, strict=True)]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SWEEP_JSON).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        top = plans[0][2].percentiles[-1]
        sweep_plot.plot(rows, knee, run_dir / SWEEP_PLOT, tail=(keys[-1], f"p{top:g}"),
                        title=f"dsctl probe {first['target']['url']} ({first['target']['model']}): {spec}")
    except OSError as exc:
        raise DsctlError(f"--run-dir {run_dir}: {exc.strerror or exc}") from None
    if cfg.record is not None:
        write_record(cfg.record, runs, text=cfg.save_text)
    if cfg.csv is not None:
        write_csv(cfg.csv, runs, text=cfg.save_text)
    code, errors = ExitStatus.OK, []
    for (level, _, _), outcome in zip(plans, results, strict=True):
        if outcome.exit_status not in (ExitStatus.OK, ExitStatus.SLO_NOT_MET):
            code = outcome.exit_status
            errors = [f"{spec.kind} {level:g}: {e}" for e in outcome.errors]
            break
    return ProbeResult(data=data, exit_status=code, errors=tuple(errors), result=results[-1].result,
                       levels=tuple(o.result for o in results))
