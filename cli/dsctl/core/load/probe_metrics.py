"""Serving metrics exactly as `vllm bench serve` defines them, computed from per-request records (pure, no I/O).

Definitions (vllm-project/vllm `vllm/benchmarks/lib/endpoint_request_func.py`,
`vllm/benchmarks/serve.py::calculate_metrics`; serving-and-tuning.md section 2):

* The clock of a request starts immediately before it is written to the socket (``sent``).
* TTFT  = arrival of the first SSE message whose ``choices`` array is non-empty (its text may be empty) - sent.
* ITL   = every gap between consecutive choice-bearing messages; statistics are over the flattened list of the
          gaps of all successful requests.
* E2EL  = last choice-bearing message - sent (the trailing usage-only chunk does not extend it).
* Output length = ``usage.completion_tokens`` when the server returned it (method "usage", exact: the probe
          asks for it with ``stream_options.include_usage``), otherwise the number of token-carrying messages
          (method "chunks"): every choice-bearing message with text, and every one with empty text that neither
          opens a chat stream (its role-only first delta) nor closes the choice (an empty message with
          finish_reason), since llama.cpp's server streams tokens whose text it holds back with empty text (the
          client's `_Conn._events` cites the source); with ``--tokenizer`` the generated text re-tokenised (method
          "tokenizer", as vLLM re-tokenises) when that is more. Both are lower bounds of a kind, not counts: a
          server may put several tokens in one message (vLLM does for a slow reader, as does speculative
          decoding) or send none for a token (llama.cpp, inside a UTF-8 character), and re-tokenising text
          merges what was generated apart; so without usage the count is "approximate". The probe does not ask for
          logprobs or token ids, the per-token signals that would make it exact: they add work to every decode
          step of the server being measured (inferred).
* TPOT  = (E2EL - TTFT) / (output_len - 1), only for requests with output_len > 1; for goodput such requests
          count as TPOT = 0.
* Success = HTTP 200, at least one choice-bearing message and the stream's closing ``data: [DONE]``.  A stream
          whose body ends without ``[DONE]`` is a failure of class ``truncated`` (what was cut off is unknown: its
          token count and E2EL would be wrong).  Failed requests are counted by class and kept out of every latency
          statistic and every throughput numerator.
* Error rate = failed / (completed + failed) (cancelled requests are neither); it exceeds ``max_error_rate``
          (default 0.05, as a tuner needs runs whose latencies describe the server, not its failures) when
          strictly above it.  GuideLLM offers the same kind of limit (``--max-error-rate``).
* request_throughput = completed / duration, output_throughput = sum(output_len) / duration,
  total_token_throughput = (sum(input_len) + sum(output_len)) / duration, request_goodput = good / duration where a
  request is good when every given ``--goodput`` bound (ms; ttft, tpot, e2el) holds with ``<=``.
* mean, median, std (population, like ``np.std``) and percentiles with linear interpolation (``np.percentile``'s
  default method).
* Client queue time (scheduled send time -> actual send) is reported on its own and never enters TTFT.

Input length: ``usage.prompt_tokens`` when returned, else the workload's planned prompt length (vLLM uses the
dataset's tokenised length; both agree when the prompt was built for that many tokens).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PERCENTILES = (50.0, 90.0, 95.0, 99.0)
DEFAULT_MAX_ERROR_RATE = 0.05  # failed / finished above this is reported as exceeded
OUTPUT_METHODS = ("usage", "tokenizer", "chunks")
MAX_PERCENTILES = 12  # --percentiles: more columns than this is not a summary
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # the keys vLLM's --goodput accepts


class ErrorClass(StrEnum):
    TIMEOUT = "timeout"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    CONNECTION = "connection"
    PROTOCOL = "protocol"
    TRUNCATED = "truncated"  # the stream's body ended (cleanly) without data: [DONE]


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times are ``time.perf_counter()`` seconds on one clock."""

    request_id: str
    scheduled: float  # when the arrival process released the request
    sent: float = math.nan  # immediately before the request bytes were written (vLLM's ``st``)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each choice-bearing SSE message
    token_messages: int = 0  # choice-bearing messages that carry a token (the "chunks" count; see the module)
    output_tokens: int | None = None  # usage.completion_tokens, when returned
    prompt_tokens: int = 0  # usage.prompt_tokens when returned, else the planned prompt length
    planned_prompt_tokens: int = 0  # the planned prompt length (set from prompt_tokens when the record is made)
    server_prompt_tokens: int | None = None  # usage.prompt_tokens, when returned
    status: int | None = None  # HTTP status
    error: ErrorClass | None = None
    error_detail: str = ""
    end: float = math.nan  # when the response ended (stream closed, [DONE], or failure)
    cancelled: bool = False  # stopped by the probe itself (early stop); neither success nor failure
    response_id: str | None = None  # the "id" of the first choice-bearing message (cmpl-..., chatcmpl-...)
    # the generated text, piece by piece, when the client was asked to keep it (the client holds each message's raw
    # bytes while the run lasts and turns them into text when it ends)
    text_parts: list[str] | None = None
    tokenized_output: int | None = None  # the generated text re-tokenised (``--tokenizer``), when there was no usage
    # per chunk_times entry, the wall seconds a time-scaled emulated engine says passed between the request's arrival
    # and the iteration that produced the message's latest token (nan where a message had none); None: no stamps
    engine_elapsed: list[float] | None = None

    def __post_init__(self) -> None:
        if not self.planned_prompt_tokens:
            self.planned_prompt_tokens = self.prompt_tokens

    @property
    def success(self) -> bool:
        return self.error is None and not self.cancelled and self.status == 200 and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def e2el(self) -> float:
        return self.chunk_times[-1] - self.sent

    @property
    def output_method(self) -> str:
        """How ``output_len`` was counted: "usage" (the server's completion_tokens), "tokenizer" (the generated text
        re-tokenised, when that is at least the message count) or "chunks" (token-carrying messages)."""
        if self.output_tokens is not None:
            return "usage"
        if self.tokenized_output is not None and self.tokenized_output >= self.token_messages:
            return "tokenizer"
        return "chunks"

    @property
    def output_len(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        if self.tokenized_output is not None:
            return max(self.tokenized_output, self.token_messages)
        return self.token_messages

    @property
    def text(self) -> str | None:
        return None if self.text_parts is None else "".join(self.text_parts)

    @property
    def tpot(self) -> float | None:
        """vLLM's per-request TPOT, or None when the request produced at most one token."""
        n = self.output_len
        return (self.e2el - self.ttft) / (n - 1) if n > 1 else None

    @property
    def queue_time(self) -> float:
        return self.sent - self.scheduled


# -- statistics ---------------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """``np.percentile(values, q)`` (method "linear") of an ascending sequence; q in [0, 100]."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    frac = h - lo
    low = sorted_values[lo]
    if frac == 0.0 or lo + 1 >= n:
        return low
    high = sorted_values[lo + 1]
    if high == low:
        return low
    return low + frac * (high - low)  # inf - finite stays inf: a failed request counted as a miss


def summarize(values: Iterable[float], scale: float = 1.0, percentiles: Sequence[float] = PERCENTILES
              ) -> dict[str, Any]:
    """n, mean, median, std (population), min, max and pNN; None for every statistic of an empty list."""
    data = sorted(v * scale for v in values)
    n = len(data)
    out: dict[str, Any] = {"n": n}
    if n == 0:
        out.update({"mean": None, "median": None, "std": None, "min": None, "max": None})
        out.update({percentile_key(p): None for p in percentiles})
        return out
    mean = math.fsum(data) / n
    out["mean"] = mean
    out["median"] = percentile(data, 50.0)
    out["std"] = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / n)
    out["min"] = data[0]
    out["max"] = data[-1]
    out.update({percentile_key(p): percentile(data, p) for p in percentiles})
    return out


def inner_rate(times: Sequence[float], total: int) -> tuple[float | None, float]:
    """Events per second between the 10th and 90th percentile event of ``times`` (sorted), scaled by
    len(times) / total (events that never happened count as not achieved), and the span between those events
    (order statistics: one late event at either end does not move the rate)."""
    n = len(times)
    if n < 2:
        return (0.0 if total else None), 0.0
    lo, hi = int(0.1 * (n - 1)), math.ceil(0.9 * (n - 1))
    if hi <= lo:
        lo, hi = 0, n - 1
    span = times[hi] - times[lo]
    if span <= 0:
        return math.inf, 0.0
    return (hi - lo) / span * (n / total), span


def fully_stamped(r: RequestRecord) -> bool:
    """Whether every message of ``r`` carries the emulated engine's elapsed seconds (and it was sent)."""
    stamps = r.engine_elapsed
    return (bool(stamps) and len(stamps) == len(r.chunk_times) and not any(math.isnan(e) for e in stamps)
            and not math.isnan(r.sent))


def stamped_overhead(records: Iterable[RequestRecord]) -> dict[str, Any] | None:
    """What a time-scaled emulated engine's stamps leave of each successful request's wall TTFT: first message
    received - sent - the engine's own elapsed seconds to that message (the client, the network, the server's
    front; `dsctl.services.probe.modelled_record` adds it to the modelled figures unscaled).  None when no request
    carried stamps (a real server, an engine at time scale 1)."""
    overheads = sorted((r.chunk_times[0] - r.sent - r.engine_elapsed[0]) * 1e3  # type: ignore[index]
                       for r in records if r.success and fully_stamped(r))
    if not overheads:
        return None
    return {"requests": len(overheads), "wall_overhead_ms_median": round(percentile(overheads, 50), 3),
            "wall_overhead_ms_p90": round(percentile(overheads, 90), 3)}


def percentile_key(p: float) -> str:
    """The key a percentile has in `summarize`'s result: 90 -> "p90", 99.9 -> "p99_9"."""
    return f"p{p:g}".replace(".", "_")


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99,99.9"`` -> (50.0, 90.0, 99.0, 99.9): ascending, without duplicates, each in (0, 100]."""
    values: set[float] = set()
    for term in (t.strip() for t in text.replace(" ", ",").split(",")):
        if not term:
            continue
        try:
            value = float(term.removeprefix("p"))
        except ValueError:
            raise ValueError(f"percentile {term!r} is not a number (expected e.g. 50,90,99,99.9)") from None
        if math.isnan(value) or not 0.0 < value <= 100.0:
            raise ValueError(f"percentile {term!r}: each must be above 0 and at most 100")
        values.add(value)
    if not values:
        raise ValueError(f"{text!r}: expected a comma-separated list such as 50,90,99,99.9")
    if len(values) > MAX_PERCENTILES:
        raise ValueError(f"{len(values)} percentiles: at most {MAX_PERCENTILES}")
    return tuple(sorted(values))


# -- goodput / SLO bounds -----------------------------------------------------------------------------------


def request_values_ms(record: RequestRecord) -> dict[str, float]:
    """The per-request goodput metrics of a successful request in ms (TPOT 0 for <= 1 token, as vLLM does)."""
    tpot = record.tpot
    return {"ttft": record.ttft * 1e3, "tpot": 0.0 if tpot is None else tpot * 1e3, "e2el": record.e2el * 1e3}


def is_good(record: RequestRecord, bounds_ms: Mapping[str, float]) -> bool:
    if not record.success:
        return False
    values = request_values_ms(record)
    return all(values[key] <= bound for key, bound in bounds_ms.items())


# -- the metric set -----------------------------------------------------------------------------------------


def check_max_error_rate(value: float) -> float:
    """``value`` when it is a share in [0, 1], else ValueError naming the setting."""
    if not isinstance(value, int | float) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"max_error_rate {value!r}: expected a share of requests between 0 and 1 (e.g. 0.05)")
    return float(value)


def error_rate(records: Sequence[RequestRecord], max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> dict[str, Any]:
    """Failed / finished measured requests against ``max_error_rate``, with the failures counted by class and one
    example detail per class (the first), so a caller can say how many failed and why."""
    limit = check_max_error_rate(max_error_rate)
    failed = [r for r in records if not r.success and not r.cancelled]
    finished = sum(1 for r in records if not r.cancelled)
    by_class = {c.value: 0 for c in ErrorClass}
    examples: dict[str, str] = {}
    for r in failed:
        kind = (r.error or ErrorClass.PROTOCOL).value
        by_class[kind] += 1
        examples.setdefault(kind, r.error_detail)
    rate = len(failed) / finished if finished else None
    return {"max_error_rate": limit, "error_rate": rate, "exceeded": rate is not None and rate > limit,
            "failed": len(failed), "finished": finished, "by_class": by_class, "examples": examples}


def calculate_metrics(records: Sequence[RequestRecord], duration: float,
                      goodput_ms: Mapping[str, float] | None = None,
                      percentiles: Sequence[float] = PERCENTILES,
                      max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> dict[str, Any]:
    """vLLM's ``calculate_metrics`` over measured records (warm-up already removed); ``duration`` in seconds.

    Beyond vLLM's set: ``errors`` (`error_rate` against ``max_error_rate``), ``output_tokens_counted_by``
    (how many successful requests were counted by each method of `RequestRecord.output_method`) and
    ``output_tokens_count``: "exact" when the server's usage counted every successful request, else "approximate"
    (token-carrying messages miss the tokens of a server that merges several into one message or sends none for
    some; a tokenizer re-count is only as good as its match with the server's), None without a success."""
    errors = error_rate(records, max_error_rate)
    ok = [r for r in records if r.success]
    failed = [r for r in records if not r.success and not r.cancelled]
    failures = dict(errors["by_class"])
    counted_by = dict.fromkeys(OUTPUT_METHODS, 0)
    for r in ok:
        counted_by[r.output_method] += 1
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_len for r in ok)
    itls = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    dur = duration if duration > 0 else math.nan

    def per_s(x: float) -> float | None:
        return None if math.isnan(dur) else x / dur

    good = sum(1 for r in ok if is_good(r, goodput_ms)) if goodput_ms else None
    sent = [r for r in records if not math.isnan(r.sent)]
    return {
        "completed": len(ok),
        "failed": len(failed),
        "cancelled": sum(1 for r in records if r.cancelled),
        "failures": failures,
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(len(ok)),
        "request_goodput": None if good is None else per_s(good),
        "good_requests": good,
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "max_output_tokens_per_s": max_output_tokens_per_s(ok),
        "max_concurrent_requests": max_concurrent_requests(ok),
        "ttft_ms": summarize((r.ttft for r in ok), 1e3, percentiles),
        "tpot_ms": summarize(tpots, 1e3, percentiles),
        "itl_ms": summarize(itls, 1e3, percentiles),
        "e2el_ms": summarize((r.e2el for r in ok), 1e3, percentiles),
        "client_queue_ms": summarize((r.queue_time for r in sent), 1e3, percentiles),
        "output_tokens_counted_by": counted_by,
        "output_tokens_count": None if not ok else "exact" if counted_by["usage"] == len(ok) else "approximate",
        "errors": errors,
    }


# -- --tokenizer against the server's own prompt count -------------------------------------------------------

# How far the server's usage.prompt_tokens may be from the tokenizer's count of the same prompt text and still
# agree: the tokenizer counts the text alone, while the server adds a BOS token and, for chat, its template's role
# markers (a few tokens). max(2 tokens, 2 % of the server's count) is inferred, not sourced: a wrong tokenizer
# (another model family) is off by far more (5x measured in issue 21), a matching one by the BOS and template only.
PROMPT_CHECK_TOKENS = 2
PROMPT_CHECK_SHARE = 0.02


def prompt_count_check(tokenizer_tokens: int, server_tokens: int | None, detail: str = "") -> dict[str, Any]:
    """Compare the tokenizer's count of one prompt with the server's (None: the server gave none, ``detail`` says
    why). ``agrees`` is None when the check could not be made; ``warning`` is a sentence naming both numbers when
    they disagree or when the check could not be made, else None."""
    out: dict[str, Any] = {"tokenizer_tokens": tokenizer_tokens, "server_tokens": server_tokens,
                           "tolerance_tokens": None, "agrees": None, "warning": None}
    if server_tokens is None:
        out["warning"] = (f"--tokenizer could not be checked against the server: {detail or 'no usage.prompt_tokens'}"
                          f" (the tokenizer counts {tokenizer_tokens} tokens in the check's prompt)")
        return out
    tolerance = max(float(PROMPT_CHECK_TOKENS), PROMPT_CHECK_SHARE * server_tokens)
    out["tolerance_tokens"] = tolerance
    out["agrees"] = abs(server_tokens - tokenizer_tokens) <= tolerance
    if not out["agrees"]:
        out["warning"] = (f"--tokenizer counts {tokenizer_tokens} tokens in a prompt the server counts as "
                          f"{server_tokens} (usage.prompt_tokens), more than the {tolerance:g} tokens (the larger of "
                          f"{PROMPT_CHECK_TOKENS} and {PROMPT_CHECK_SHARE:.0%}) a BOS token and a chat template add: "
                          "it is likely not the served model's tokenizer, so prompt lengths and output counts made "
                          "with it are off")
    return out


CSV_FIELDS = ("id", "sent", "ttft_ms", "e2el_ms", "tpot_ms", "prompt_tokens", "output_tokens", "output_counted_by",
              "status", "success", "error", "error_detail")


def request_row(r: RequestRecord, perf_to_wall: float, *, text: bool = False) -> dict[str, Any]:
    """One measured request as the --record line and the --csv row hold it: wall-clock times (``time.time()``
    seconds; ``perf_to_wall`` turns the records' perf_counter clock into it) and ms latencies, None where a failed
    request has none; ``text`` adds the generated text (None when it was not kept)."""
    ok = r.success
    tpot = r.tpot if ok else None
    row: dict[str, Any] = {
        "id": r.request_id, "scheduled": r.scheduled + perf_to_wall,
        "sent": None if math.isnan(r.sent) else r.sent + perf_to_wall,
        "first_token_time": r.chunk_times[0] + perf_to_wall if r.chunk_times else None,
        "finish_time": None if math.isnan(r.end) else r.end + perf_to_wall,
        "ttft_ms": r.ttft * 1e3 if ok else None, "e2el_ms": r.e2el * 1e3 if ok else None,
        "tpot_ms": None if tpot is None else tpot * 1e3,
        "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_len if ok else None,
        "output_counted_by": r.output_method if ok else None,
        "messages": len(r.chunk_times), "status": r.status, "success": ok,
        "error": None if r.error is None else str(r.error), "error_detail": r.error_detail or None,
        "cancelled": r.cancelled,
    }
    if text:
        row["text"] = r.text
    return row


def max_output_tokens_per_s(ok: Sequence[RequestRecord]) -> float:
    """Peak of choice-bearing messages per 1-second bucket from the first send (vLLM counts messages too)."""
    if not ok:
        return 0.0
    start = min(r.sent for r in ok)
    buckets: dict[int, int] = {}
    for r in ok:
        for t in r.chunk_times:
            b = int(t - start)
            buckets[b] = buckets.get(b, 0) + 1
    return float(max(buckets.values()))


def max_concurrent_requests(ok: Sequence[RequestRecord]) -> int:
    """Sweep line over [sent, last message) of successful requests."""
    events = sorted([(r.sent, 1) for r in ok] + [(r.chunk_times[-1], -1) for r in ok])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


# -- early stop ---------------------------------------------------------------------------------------------


STATISTICS = {"mean": None, "median": 50.0, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def parse_statistic(text: str) -> str:
    key = text.strip().lower()
    if key not in STATISTICS:
        raise ValueError(f"statistic {text!r}: expected one of {', '.join(STATISTICS)}")
    return "p50" if key == "median" else key


class SloWatch:
    """Decides whether a probe meets per-metric SLOs, and whether it has *certainly* missed them already.

    The SLO: for every bound ``metric <= bound_ms`` (ttft, tpot, e2el, as in ``--goodput``), the chosen statistic
    (a percentile, default p90, or the mean) of that metric over the measured requests is at or below the bound.
    A failed request counts as an infinitely late one here (it did not meet any SLO); the reported latency
    statistics still exclude it. TPOT only has values for requests with more than one output token (vLLM).

    Early-stop rule (order statistics): with ``total_planned`` = N requests in the probe and k of them finished,
    the most favourable completion is that all N - k remaining requests succeed with latency 0 (and produce more
    than one token). Adding a value no larger than every other value never raises a linearly interpolated
    percentile or a mean, so the final statistic is bounded below by the statistic of the observed values plus
    N - k zeros. If that lower bound already exceeds the SLO bound, no outcome of the remaining requests can meet
    the SLO: the probe has certainly missed it, and can stop. The check is exact; it fires at the first finished
    request that makes the miss certain and never earlier. With N unknown (a closed loop bounded only by time)
    nothing is ever certain, so it never fires.

    ``excluded``: the first E requests sent are left out of the caller's verdict (tune's capacity window leaves out
    its warm-up, `capacity.window_metrics`). Requests finish out of order, so which finished ones those are is not
    known here; the bound leaves out the E largest observed values instead, over N - E requests. Any E of the
    observed values could be the excluded ones, and leaving out the largest gives the lowest statistic, so the bound
    still holds for the verdict's requests: an early stop never ends a probe the verdict would have passed.
    """

    def __init__(self, bounds_ms: Mapping[str, float], statistic: str = "p90", total_planned: int | None = None,
                 statistics: Mapping[str, str] | None = None, excluded: int = 0):
        unknown = set(bounds_ms) - set(GOODPUT_METRICS)
        if unknown:
            raise ValueError(f"unknown SLO metric(s): {', '.join(sorted(unknown))}")
        if not bounds_ms:
            raise ValueError("an SLO needs at least one bound")
        self.bounds_ms = dict(bounds_ms)
        self.statistic = parse_statistic(statistic)  # the statistic of a bound ``statistics`` does not name
        # per metric: ``--goodput ttft:p95=200ms`` binds p95 for ttft whatever --slo-stat says
        self.statistics = {m: parse_statistic((statistics or {}).get(m, self.statistic)) for m in self.bounds_ms}
        self._q = {m: STATISTICS[stat] for m, stat in self.statistics.items()}
        if excluded < 0:  # at or above the planned total it leaves nothing to judge: never certain
            raise ValueError(f"excluded ({excluded}) must not be negative")
        self.total_planned = total_planned
        self.excluded = excluded
        self.finished = 0
        self._sorted: dict[str, list[float]] = {m: [] for m in self.bounds_ms}
        self._sums: dict[str, float] = dict.fromkeys(self.bounds_ms, 0.0)

    def add(self, record: RequestRecord) -> None:
        """Account one finished (successful or failed) request; cancelled ones are ignored."""
        if record.cancelled:
            return
        self.finished += 1
        values = request_values_ms(record) if record.success else None
        for metric in self.bounds_ms:
            if values is None:
                value = math.inf
            elif metric == "tpot" and record.tpot is None:
                continue  # no TPOT sample, as in vLLM's statistics
            else:
                value = values[metric]
            bisect.insort(self._sorted[metric], value)
            self._sums[metric] += value

    def _statistic(self, metric: str, zeros: int, leave_out: int = 0) -> float | None:
        data = self._sorted[metric]
        if leave_out:
            data = data[:max(0, len(data) - leave_out)]
        n = len(data) + zeros
        if n == 0:
            return None
        q = self._q[metric]
        if q is None:
            return self._sums[metric] / n
        h = (n - 1) * q / 100.0
        lo = math.floor(h)
        frac = h - lo

        def at(i: int) -> float:  # the i-th smallest of ``zeros`` zeros followed by the observed values
            return 0.0 if i < zeros else data[i - zeros]

        low = at(lo)
        if frac == 0.0 or lo + 1 >= n:
            return low
        high = at(lo + 1)
        return low if high == low else low + frac * (high - low)

    def values(self) -> dict[str, float | None]:
        """The statistic of each bound metric over what has been observed so far."""
        return {m: self._statistic(m, 0) for m in self.bounds_ms}

    def remaining(self) -> int | None:
        return None if self.total_planned is None else max(0, self.total_planned - self.finished)

    def certainly_missed(self) -> str | None:
        """A one-line reason when no outcome of the remaining requests can meet the SLO, else None."""
        remaining = self.remaining()
        if remaining is None:
            return None
        for metric, bound in self.bounds_ms.items():
            best = self._statistic(metric, remaining, self.excluded)
            if best is not None and best > bound:
                return (f"{metric} {self.statistics[metric]} is at least {_fmt_ms(best)} ms even if the "
                        f"{remaining} remaining request(s) are instant; SLO {bound:g} ms")
        return None

    def missed(self) -> list[str]:
        """The bounds the observed statistic misses (the verdict once every planned request has finished)."""
        out = []
        for metric, bound in self.bounds_ms.items():
            value = self._statistic(metric, 0)
            if value is not None and value > bound:
                out.append(f"{metric} {self.statistics[metric]} {_fmt_ms(value)} ms > {bound:g} ms")
        return out


def _fmt_ms(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"
