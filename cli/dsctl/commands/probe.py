"""`dsctl probe URL`: load an OpenAI-compatible endpoint and report `vllm bench serve` metrics.

Exit statuses: 0 the probe ran (some requests may have failed; they are counted, not hidden); 6 an SLO given with
--goodput was missed, or --early-stop ended the probe because the miss was certain; 1 the server cannot be
reached or every measured request failed (7 when every one of them timed out); 9 more than --max-error-rate of the
requests failed; 2 bad options. A sweep (--sweep) exits with the status of its first level that did not exit 0,
SLO misses left out.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.cli_options import app_context, bounded
from dsctl.errors import UsageError
from dsctl.services.inputs import IN_FLIGHT, REQUESTS, SECONDS, SEED, SHARE, Bound
from dsctl.services.probe import DEFAULT_REQUESTS, ProbeConfig, percentile_key, probe, target_and_goodput
from dsctl.ui_progress import ProbeProgress


def parse_time_scale(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--time-scale {text!r}: expected auto or a number of wall seconds per modelled "
                         "second (1 = real time)") from None


_SECONDS = bounded(SECONDS)
_SHARE = bounded(SHARE)
MAX_BURSTINESS = 10_000  # a gamma shape k has a coefficient of variation of 1/sqrt(k): 1 % at 10 000


def parse_rate(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--rate {text!r}: expected requests per second (a number, or inf)") from None
    if not value > 0 or math.isnan(value):
        raise UsageError(f"--rate {text!r}: must be positive (or inf)")
    if math.isinf(value) and text.strip().lower() not in ("inf", "+inf", "infinity", "+infinity"):
        # only the word means "all at once": a number too large for a float (1e400, 400 digits) is a typo
        raise UsageError(f"--rate {text!r}: too large to be a rate; give requests per second, or the word inf "
                         "to send all at once")
    return value


# -- rendering ----------------------------------------------------------------------------------------------


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pcts(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, column label) of the reported percentiles: ("p99_9", "p99.9")."""
    return [(percentile_key(p), f"p{p:g}") for p in data["config"]["percentiles"]]


def render(data: dict[str, Any]) -> None:
    if "sweep" in data:
        render_sweep(data)
        return
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
    counted = ", ".join(f"{k} {v}" for k, v in m["output_tokens_counted_by"].items() if v)
    if counted:
        exactness = (" (approximate: the server did not send usage for every request)"
                     if m.get("output_tokens_count") == "approximate" else "")
        rows.append(["Output tokens counted by", counted + exactness])
    check = data.get("tokenizer_check")
    if check is not None:
        rows.append(["Tokenizer check (prompt tokens)", _tokenizer_check(check)])
    ui.print_table("============ Serving Benchmark Result ============", ["metric", "value"], rows)
    names = [("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)"),
             ("client_queue_ms", "Client queue (ms)")]
    pcts = _pcts(data)
    lat_rows = [[label, _f(m[key]["mean"]), _f(m[key]["median"]), _f(m[key]["std"]),
                 *(_f(m[key][p]) for p, _ in pcts), m[key]["n"]] for key, label in names]
    ui.print_table("Latency (vllm bench serve definitions; failed requests excluded)",
                   ["metric", "mean", "median", "std", *(label for _, label in pcts), "n"], lat_rows)
    slo = data["slo"]
    if slo is not None:
        verdict = "met" if slo["met"] else ("missed (early stop)" if slo["early_stopped"] else "missed")
        slo_rows = []
        shared = slo["statistic"]  # None when the bounds bind different statistics
        for key, bound in slo["bounds_ms"].items():
            value = slo["values_ms"].get(key)
            ok = value is None or (value != "inf" and value <= bound)
            name = key if shared else f"{key}:{slo['statistics'][key]}"
            slo_rows.append([name, f"{bound:g}", _f(value), "ok" if ok else "missed"])
        failed = m["failed"]
        note = f" ({failed} failed request(s) count as misses)" if failed else ""
        ui.print_table(f"SLO {shared}: {verdict}{note}" if shared else f"SLO: {verdict}{note}",
                       ["metric", "bound (ms)", f"{shared or 'statistic'} (ms)", "verdict"], slo_rows)
    if data["failure_examples"]:
        ui.print_table("Failed requests (first 5)", ["id", "class", "detail"],
                       [[e["id"], e["class"], e["detail"]] for e in data["failure_examples"]])
    _warnings(data)


def _tokenizer_check(check: dict[str, Any]) -> str:
    both = f"tokenizer {check['tokenizer_tokens']}, server {_f(check['server_tokens'])}"
    if check["agrees"] is None:
        return f"not made ({both})"
    return f"{'agrees' if check['agrees'] else 'WARNING: disagrees'} ({both}, tolerance {check['tolerance_tokens']:g})"


def _warnings(data: dict[str, Any]) -> None:
    for line in data.get("warnings") or ():
        print(f"dsctl: warning: {line}", file=sys.stderr)


def render_sweep(data: dict[str, Any]) -> None:
    sw = data["sweep"]
    top = _pcts(data)[-1]
    headers = [sw["kind"], "ok", "failed", "req/s", "out tok/s", "TTFT median", f"TTFT {top[1]}", "TPOT median",
               "E2EL median", f"E2EL {top[1]}"]
    rows = [[f"{r['level']:g}", r["completed"], r["failed"], _f(r["request_throughput"]),
             _f(r["output_throughput"], 1), _f(r["ttft_ms"]["median"]), _f(r["ttft_ms"][top[0]]),
             _f(r["tpot_ms"]["median"]), _f(r["e2el_ms"]["median"]), _f(r["e2el_ms"][top[0]])] for r in sw["rows"]]
    target = data["target"]
    ui.print_table(f"Sweep of {target['url']}{target['endpoint']} ({target['model']}), latencies in ms",
                   headers, rows)
    knee = sw["knee"]
    if knee["level"] is None:
        print("knee: none inside the swept range (latency never grew faster than throughput)")
    else:
        print(f"knee: {sw['kind']} {knee['level']:g} ({knee['rule']}; next step: latency "
              f"{_growth(knee['latency_growth'])}, throughput {_growth(knee['throughput_growth'])})")
    print(f"plot: {sw['plot']}")
    _warnings(data)


def _growth(value: Any) -> str:
    return "+inf" if value == "inf" else f"{value:+.0%}"


# -- the command ----------------------------------------------------------------------------------------------


def run(
    ctx: typer.Context,
    target: Annotated[list[str], typer.Argument(
        metavar="URL", help="Server base URL, e.g. http://HOST:8000 (a trailing /v1 is fine). Terms such as "
                            "tpot:50 after --goodput ttft:200 are read as more --goodput terms, as vLLM allows.")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions (/v1/completions) or chat.")] = "completions",
    model: Annotated[str | None, typer.Option("--model", help="Model name; default: the first of /v1/models.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Open loop: requests/s (float, or inf = all at once).")
                    ] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", help="Alone: a closed loop of C streams. With --rate: a cap on in-flight requests.",
        callback=bounded(IN_FLIGHT))] = None,
    arrival: Annotated[str | None, typer.Option(
        "--arrival", help="constant | poisson (default) | gamma | ramp.")] = None,
    burstiness: Annotated[float | None, typer.Option(
        "--burstiness", help="Gamma shape as in vLLM: 1 Poisson, <1 burstier, >1 more regular.",
        callback=bounded(Bound(None, MAX_BURSTINESS, "",
                               " (a gamma shape beyond it is a constant rate: --arrival constant)")))
    ] = None,
    ramp_to: Annotated[float | None, typer.Option(
        "--ramp-to", help="Ramp: the rate goes linearly from --rate to this over the duration.",
        callback=bounded(Bound(None, None, "requests per second")))] = None,
    requests: Annotated[int | None, typer.Option(
        "--requests", help=f"Measured requests (default {DEFAULT_REQUESTS} unless --duration).",
        callback=bounded(REQUESTS))] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop sending after S seconds.",
                                                   callback=_SECONDS)] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Requests sent first and left out of every metric.",
                                        callback=bounded(REQUESTS))] = 0,
    prompt_tokens: Annotated[str, typer.Option(
        "--prompt-tokens", help="N, uniform:LO:HI or normal:MEAN:STD: exact by the engine's rule, or by --tokenizer.")
    ] = "512",
    output_tokens: Annotated[str, typer.Option(
        "--output-tokens", help="max_tokens: N, uniform:LO:HI or normal:MEAN:STD.")] = "128",
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", help="JSONL of {\"prompt\": ...} or {\"messages\": [...]}, optional output_tokens.")] = None,
    shared_prefix: Annotated[float, typer.Option(
        "--shared-prefix", help="Share (0.0-1.0) of each prompt that is a prefix common to all requests.",
        callback=_SHARE)] = 0.0,
    goodput: Annotated[list[str] | None, typer.Option(
        "--goodput", help="Per-request SLO bounds (keys ttft, tpot, e2el): vLLM's ttft:200 tpot:50 (ms), or "
                          "ttft=200ms, or ttft:p95=200ms to judge that bound at p95 instead of --slo-stat.")
    ] = None,
    slo_stat: Annotated[str, typer.Option(
        "--slo-stat", help="Statistic the --goodput bounds without one bind for the verdict: "
                           "p50|median|p90|p95|p99|mean.")
    ] = "p90",
    early_stop: Annotated[bool, typer.Option(
        "--early-stop", help="End the probe as soon as the SLO is certainly missed (exit 6).")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds per request (connect 10 s and idle 60 s at most, within it).",
        callback=_SECONDS)] = 300.0,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="DSCTL_API_KEY", show_envvar=True, show_default=False,
        help="Bearer token for the server (never printed).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for arrivals and prompts.",
                                      callback=bounded(SEED.but(why=" (numpy's seed range, as tune)")))] = 0,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Ask the server to generate exactly max_tokens (vLLM ignore_eos).")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON result object.")] = False,
    record: Annotated[Path | None, typer.Option(
        "--record", help="Write one JSON line per measured request to this file.")] = None,
    max_error_rate: Annotated[float, typer.Option(
        "--max-error-rate", help="Largest share of failed requests that still counts as a valid run (exit 9 above it).",
        callback=_SHARE)] = ProbeConfig.max_error_rate,  # (its default)
    request_id_header: Annotated[str, typer.Option(
        "--request-id-header", help="Header carrying each request's UUID (none: send no request id).")
    ] = "x-request-id",
    percentiles: Annotated[str | None, typer.Option(
        "--percentiles", help="Percentiles reported for TTFT/TPOT/ITL/E2EL, e.g. 50,90,99,99.9 (default 50,90,95,99).")
    ] = None,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="Write one CSV row per measured request (id, send time, ttft, e2el, tpot, tokens, status).")
    ] = None,
    save_text: Annotated[bool, typer.Option(
        "--save-text", help="Keep each request's generated text (in --record, --csv and the --json result).")
    ] = False,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="Local Hugging Face tokenizer dir (tokenizer.json): exact prompt lengths, and output "
                            "re-counted from the text when the server sends no usage; checked once against the "
                            "server's own prompt count (a warning when they disagree).")] = None,
    dataset: Annotated[Path | None, typer.Option(
        "--dataset", help="ShareGPT .json, or .jsonl of prompts (optional \"timestamp\" seconds: replay the trace).")
    ] = None,
    sweep: Annotated[str | None, typer.Option(
        "--sweep", help="rate=LO:HI:N or concurrency=LO:HI:N: N geometric load levels in one run, with the knee.")
    ] = None,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Where --sweep writes sweep.json and sweep.png (default: a new run directory).")] = None,
    time_scale: Annotated[str, typer.Option(
        "--time-scale", help="Wall seconds per modelled second of a time-scaled engine (dsctl's emulated one): "
                             "rates, durations and latencies are then modelled; auto: what the engine's /version "
                             "says (1 for any real server).")] = "auto",
) -> None:
    """Load an OpenAI-compatible endpoint and report vllm-bench-serve metrics (TTFT, TPOT, ITL, E2EL, goodput)."""
    url, bounds, stat = target_and_goodput(target, goodput, slo_stat)
    cfg = ProbeConfig(
        url=url, endpoint=endpoint, model=model, rate=parse_rate(rate), concurrency=concurrency,
        arrival=arrival, burstiness=burstiness, ramp_to=ramp_to, requests=requests, duration=duration,
        warmup=warmup, prompt_tokens=prompt_tokens, output_tokens=output_tokens, prompts=prompts,
        shared_prefix=shared_prefix, goodput=bounds, slo_stat=stat, early_stop=early_stop, timeout=timeout,
        api_key=api_key, seed=seed, ignore_eos=ignore_eos, record=record, max_error_rate=max_error_rate,
        request_id_header=None if request_id_header.lower() == "none" else request_id_header,
        percentiles=percentiles, csv=csv_path, save_text=save_text, tokenizer=tokenizer, dataset=dataset,
        sweep=sweep, run_dir=run_dir, time_scale=parse_time_scale(time_scale),
    )
    started = time.perf_counter()
    with ProbeProgress(notes=not as_json) as progress:
        result = probe(app_context(ctx).prober, cfg, progress)
    if as_json:
        ui.emit_json(["probe"], result.to_dict(), exit_code=int(result.exit_status), errors=result.errors)
    else:
        render(result.data)
        for line in result.errors:
            print(f"dsctl: {line}", file=sys.stderr)
        ui.progress(f"probe finished in {time.perf_counter() - started:.1f} s")
    if result.exit_status:
        raise typer.Exit(int(result.exit_status))
