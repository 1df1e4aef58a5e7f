"""Probe metrics against hand-computed values: a recorded SSE stream parsed by the client, vLLM's formulas,
percentiles, and the early-stop rule."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from dsctl.adapters import probe_client
from dsctl.core.load import probe_metrics
from dsctl.core.load.probe_metrics import (
    ErrorClass,
    RequestRecord,
    SloWatch,
    calculate_metrics,
    error_rate,
    percentile,
    prompt_count_check,
    summarize,
)

# -- a recorded stream, replayed through the client's protocol with a fake clock ----------------------------


def _chunk(text: str, finish: str | None = None) -> bytes:
    """A completions message as vLLM streams it; the choice's last one carries its finish_reason."""
    reason = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (b'data: {"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":"' + text.encode() + b'","logprobs":null,"finish_reason":' + reason + b',"stop_reason":null}],'
            b'"usage":null}\n\n')


USAGE = (b'data: {"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[],'
         b'"usage":{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4}}\n\n')


def _http_chunked(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


class FakeTransport:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True

    def is_closing(self):
        return self.closed


def replay(reads: list[tuple[float, bytes]], monkeypatch, stream: bool = True, conn_out: list | None = None
           ) -> RequestRecord:
    """Feed (time, bytes) reads to the protocol, as the event loop would, with perf_counter pinned to each time."""
    loop = asyncio.new_event_loop()
    try:
        rec = RequestRecord("a", scheduled=0.0, sent=0.0)
        client = probe_client.ProbeClient(probe_client.Target.parse("http://127.0.0.1:1"))
        conn = probe_client._Conn(client)
        conn.connection_made(FakeTransport())
        conn.begin(rec, loop.create_future(), stream)
        for t, data in reads:
            monkeypatch.setattr(probe_client.time, "perf_counter", lambda t=t: t)
            conn.data_received(data)
        if conn_out is not None:
            conn_out.append(conn)
        elif not conn.finished:
            conn.connection_lost(None)
        return rec
    finally:
        loop.close()


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def test_recorded_chunked_stream_gives_vllm_ttft_itl_e2el_tpot(monkeypatch):
    # Headers at 50 ms; tokens at 100, 120, 150 ms; the 4th token arrives at 170 ms in the same read as the usage
    # chunk and [DONE]; an HTTP chunk boundary splits the 3rd SSE message in two reads.
    third = _http_chunked(_chunk(" c"))
    reads = [
        (0.050, HEAD),
        (0.100, _http_chunked(_chunk("a"))),
        (0.120, _http_chunked(_chunk(" b"))),
        (0.150 - 1e-9, third[:40]),
        (0.150, third[40:]),
        (0.170, _http_chunked(_chunk(" d", "length")) + _http_chunked(USAGE) + _http_chunked(b"data: [DONE]\n\n")
         + b"0\r\n\r\n"),
    ]
    rec = replay(reads, monkeypatch)
    assert rec.success, rec.error_detail
    assert rec.chunk_times == [0.100, 0.120, 0.150, 0.170]
    assert rec.output_tokens == 4 and rec.prompt_tokens == 10
    assert rec.ttft == pytest.approx(0.100)
    assert rec.e2el == pytest.approx(0.170)
    assert rec.tpot == pytest.approx(0.070 / 3)


def test_usage_chunk_counts_tokens_when_one_message_carries_several(monkeypatch):
    usage5 = USAGE.replace(b'"completion_tokens":4', b'"completion_tokens":5')
    body = _chunk("ab") + _chunk("cd", "length") + usage5 + b"data: [DONE]\n\n"
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    rec = replay([(0.01, head + body)], monkeypatch)
    assert rec.success and rec.output_len == 5 and len(rec.chunk_times) == 2


def test_role_only_chat_chunk_is_the_first_token_as_in_vllm(monkeypatch):
    role = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",'
            b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n')
    end = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"logprobs":null,'
           b'"finish_reason":"length"}]}\n\n')
    rec = replay([(0.01, HEAD), (0.02, _http_chunked(role)), (0.03, _http_chunked(end + b"data: [DONE]\n\n"))],
                 monkeypatch)
    assert rec.chunk_times == [0.02, 0.03] and rec.success and rec.ttft == pytest.approx(0.02)
    assert rec.token_messages == 0 and rec.output_len == 0 and rec.output_method == "chunks"  # no token in it
    assert rec.response_id == "c"


def test_without_usage_messages_with_and_without_text_count_and_the_empty_closing_one_does_not(monkeypatch):
    # llama.cpp's server: one message per token, empty text while a token's text is held back, and a last
    # message with finish_reason and no text
    body = (_chunk("") + _chunk("a") + _chunk("") + _chunk('\\"b') + b": keep-alive\n\n" + _chunk("", "length")
            + b"data: [DONE]\n\n")
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    rec = replay([(0.01, head + body)], monkeypatch)
    assert rec.success and len(rec.chunk_times) == 5
    assert rec.token_messages == 4 and rec.output_len == 4 and rec.output_method == "chunks"
    assert rec.response_id == "cmpl-a"


def test_a_tokenizer_recount_is_kept_only_when_it_is_not_below_the_message_count():
    rec = RequestRecord("r", scheduled=0.0, sent=0.0, chunk_times=[0.1, 0.2, 0.3], token_messages=3, status=200)
    rec.tokenized_output = 2  # text re-tokenised merges what was generated apart: the messages count more
    assert (rec.output_method, rec.output_len) == ("chunks", 3)
    rec.tokenized_output = 3
    assert (rec.output_method, rec.output_len) == ("tokenizer", 3)


@pytest.mark.parametrize(("tokenizer", "server", "agrees"), [
    (100, 101, True), (100, 102, True), (100, 103, False),  # 2 tokens below 100
    (500, 510, True), (500, 511, False), (520, 510, True),  # 2 % of the server's count above 100
    (100, 500, False)])
def test_the_tokenizer_check_tolerates_the_larger_of_2_tokens_and_2_percent(tokenizer, server, agrees):
    check = prompt_count_check(tokenizer, server)
    assert check["agrees"] is agrees and check["server_tokens"] == server
    if agrees:
        assert check["warning"] is None
    else:
        assert f"counts {tokenizer} tokens" in check["warning"] and f"as {server} (usage" in check["warning"]


def test_the_tokenizer_check_says_when_it_could_not_be_made():
    check = prompt_count_check(40, None, "the server's answer has no usage.prompt_tokens")
    assert check["agrees"] is None and check["tolerance_tokens"] is None
    assert check["warning"].startswith("--tokenizer could not be checked against the server: the server's answer")
    assert "counts 40 tokens" in check["warning"]


@pytest.mark.parametrize("reads, cls", [
    ([(0.01, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 40\r\n\r\n"
             b'{"object":"error","message":"overload!"}')], ErrorClass.HTTP_5XX),
    ([(0.01, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}")], ErrorClass.HTTP_4XX),
    ([(0.01, HEAD), (0.02, _http_chunked(_chunk("a"))[:20])], ErrorClass.CONNECTION),  # cut mid-stream
    ([(0.01, b"garbage\r\n\r\n")], ErrorClass.PROTOCOL),
    ([(0.01, HEAD), (0.02, _http_chunked(b'data: {"error":{"message":"boom","code":500}}\n\n'))],
     ErrorClass.HTTP_5XX),
    ([(0.01, HEAD), (0.02, _http_chunked(b"data: [DONE]\n\n"))], ErrorClass.PROTOCOL),  # 200, no token
    ([(0.01, HEAD), (0.02, _http_chunked(_chunk("a")) + b"0\r\n\r\n")], ErrorClass.TRUNCATED),  # no [DONE]
    # [DONE] before the choice's finish_reason: cut short upstream (a worker restarted behind a proxy)
    ([(0.01, HEAD), (0.02, _http_chunked(_chunk("a") + b"data: [DONE]\n\n") + b"0\r\n\r\n")],
     ErrorClass.TRUNCATED),
    ([(0.01, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(_chunk("a")) + _chunk("a"))],
     ErrorClass.TRUNCATED),
    ([(0.01, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + _chunk("a"))], ErrorClass.TRUNCATED),  # then EOF
    ([(0.01, b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"ok\": true}")], ErrorClass.PROTOCOL),  # no stream
])
def test_failures_are_classified(monkeypatch, reads, cls):
    rec = replay(reads, monkeypatch)
    assert not rec.success
    assert rec.error == cls
    if cls is ErrorClass.HTTP_5XX and b"overload" in reads[0][1]:
        assert "overload!" in rec.error_detail


def test_connection_is_reused_only_after_the_whole_body(monkeypatch):
    conns: list = []
    body = _http_chunked(_chunk("a", "length")) + _http_chunked(b"data: [DONE]\n\n")
    rec = replay([(0.01, HEAD), (0.02, body)], monkeypatch, conn_out=conns)
    conn = conns[0]
    assert rec.success and rec.end == 0.02
    assert conn.state == "draining" and conn not in conn.client._idle  # [DONE] seen, "0\r\n\r\n" not yet
    monkeypatch.setattr(probe_client.time, "perf_counter", lambda: 0.03)
    conn.data_received(b"0\r\n")
    assert conn.state == "draining"
    conn.data_received(b"\r\n")
    assert conn.state == "idle" and conn.client._idle == [conn]

    conns.clear()
    closing = HEAD.replace(b"chunked\r\n", b"chunked\r\nconnection: close\r\n")
    rec = replay([(0.01, closing), (0.02, body + b"0\r\n\r\n")], monkeypatch, conn_out=conns)
    assert rec.success and conns[0].state == "closed" and not conns[0].client._idle


# -- vLLM's formulas on hand-made records ---------------------------------------------------------------------


def _records() -> list[RequestRecord]:
    a = RequestRecord("a", scheduled=0.0, sent=0.0, chunk_times=[0.100, 0.120, 0.150, 0.170], output_tokens=4,
                      prompt_tokens=10, status=200, end=0.171)
    b = RequestRecord("b", scheduled=0.5, sent=0.5, chunk_times=[0.700], output_tokens=1, prompt_tokens=20,
                      status=200, end=0.701)  # a 1-token request: no TPOT sample, no ITL
    c = RequestRecord("c", scheduled=0.99, sent=1.0, chunk_times=[1.05, 1.09, 1.19], output_tokens=5,
                      prompt_tokens=30, status=200, end=1.2)  # 5 tokens in 3 messages (speculative decoding)
    d = RequestRecord("d", scheduled=1.2, sent=1.2, prompt_tokens=40, status=503, error=ErrorClass.HTTP_5XX,
                      end=1.25)
    e = RequestRecord("e", scheduled=1.3, sent=1.3, chunk_times=[1.4], prompt_tokens=50, status=200,
                      error=ErrorClass.TIMEOUT, end=1.9)  # a token, then it timed out: still a failure
    return [a, b, c, d, e]


def test_metrics_match_hand_computed_values():
    m = calculate_metrics(_records(), duration=2.0, goodput_ms={"ttft": 150, "tpot": 30})
    assert m["completed"] == 3 and m["failed"] == 2
    assert m["failures"] == {"timeout": 1, "http_4xx": 0, "http_5xx": 1, "connection": 0, "protocol": 0,
                             "truncated": 0}
    assert m["output_tokens_counted_by"] == {"usage": 3, "tokenizer": 0, "chunks": 0}
    assert m["output_tokens_count"] == "exact"
    errors = m["errors"]  # 2 of 5 failed: far above the default 5 %
    assert errors["failed"] == 2 and errors["finished"] == 5 and errors["error_rate"] == pytest.approx(0.4)
    assert errors["exceeded"] is True and errors["max_error_rate"] == 0.05
    assert errors["by_class"]["timeout"] == 1 and errors["by_class"]["http_5xx"] == 1
    assert m["total_input_tokens"] == 60 and m["total_output_tokens"] == 10
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(5.0)
    assert m["total_token_throughput"] == pytest.approx(35.0)
    # good: a (ttft 100, tpot 23.3); not b (ttft 200) nor c (tpot 35)
    assert m["good_requests"] == 1 and m["request_goodput"] == pytest.approx(0.5)

    ttft = m["ttft_ms"]  # [100, 200, 50]
    assert ttft["n"] == 3
    assert ttft["mean"] == pytest.approx(350 / 3)
    assert ttft["median"] == pytest.approx(100)
    assert ttft["std"] == pytest.approx(math.sqrt(((100 - 350 / 3) ** 2 + (200 - 350 / 3) ** 2
                                                   + (50 - 350 / 3) ** 2) / 3))
    assert ttft["p90"] == pytest.approx(180) and ttft["p95"] == pytest.approx(190) and ttft["p99"] == pytest.approx(198)

    tpot = m["tpot_ms"]  # [70/3, 140/4]; b has one token
    assert tpot["n"] == 2
    assert tpot["mean"] == pytest.approx((70 / 3 + 35) / 2)
    assert tpot["p90"] == pytest.approx(70 / 3 + 0.9 * (35 - 70 / 3))

    itl = m["itl_ms"]  # [20, 30, 20, 40, 100] flattened
    assert itl["n"] == 5
    assert itl["mean"] == pytest.approx(42)
    assert itl["median"] == pytest.approx(30)
    assert itl["p90"] == pytest.approx(76)
    assert itl["p99"] == pytest.approx(97.6)

    e2el = m["e2el_ms"]  # [170, 200, 190]
    assert e2el["mean"] == pytest.approx(560 / 3)
    assert e2el["median"] == pytest.approx(190)
    assert e2el["p99"] == pytest.approx(199.8)

    queue = m["client_queue_ms"]  # every sent request: a 0, b 0, c 10, d 0, e 0
    assert queue["n"] == 5 and queue["max"] == pytest.approx(10) and queue["median"] == pytest.approx(0)
    assert m["max_concurrent_requests"] == 1


def test_peak_tokens_per_second_counts_messages_per_1s_bucket():
    m = calculate_metrics(_records(), duration=2.0)
    assert m["max_output_tokens_per_s"] == 5.0  # a's 4 + b's 1 in [0, 1); c's 3 in [1, 2)
    assert m["request_goodput"] is None and m["good_requests"] is None


def test_goodput_uses_tpot_zero_for_single_token_requests_and_e2el():
    m = calculate_metrics(_records(), duration=2.0, goodput_ms={"tpot": 30, "e2el": 195})
    # a: tpot 23.3, e2el 170 -> good; b: tpot counts as 0, e2el 200 -> bad; c: tpot 35 -> bad
    assert m["good_requests"] == 1
    m = calculate_metrics(_records(), duration=2.0, goodput_ms={"tpot": 10})
    assert m["good_requests"] == 1  # only b (1 token, TPOT 0)


def test_error_rate_counts_finished_requests_and_is_exceeded_only_above_the_limit():
    records = [ok(10) for _ in range(19)] + [failed()]
    errors = error_rate(records)  # 1 of 20 = exactly 5 %: at the limit, not above it
    assert errors["error_rate"] == pytest.approx(0.05) and errors["exceeded"] is False
    assert errors["by_class"]["connection"] == 1 and errors["examples"] == {"connection": ""}
    cancelled = RequestRecord("x", scheduled=0.0, cancelled=True)
    assert error_rate(records[:-2] + [failed(), cancelled])["finished"] == 19  # cancelled: neither
    assert error_rate(records + [failed()])["exceeded"] is True
    assert error_rate(records, max_error_rate=0.0)["exceeded"] is True
    empty = error_rate([cancelled])
    assert empty["error_rate"] is None and empty["exceeded"] is False and empty["finished"] == 0
    for bad in (-0.1, 1.5, math.nan, "0.05"):
        with pytest.raises(ValueError, match="max_error_rate"):
            error_rate(records, max_error_rate=bad)


def test_failed_requests_stay_out_of_latencies():
    only_failed = [r for r in _records() if r.error]
    m = calculate_metrics(only_failed, duration=1.0)
    assert m["completed"] == 0 and m["failed"] == 2
    assert m["ttft_ms"]["mean"] is None and m["itl_ms"]["n"] == 0
    assert m["request_throughput"] == 0


def test_percentiles_interpolate_linearly_like_numpy():
    data = [1.0, 2.0, 3.0, 4.0]
    assert percentile(data, 0) == 1.0 and percentile(data, 100) == 4.0
    assert percentile(data, 25) == pytest.approx(1.75)
    assert percentile(data, 50) == pytest.approx(2.5)
    assert percentile(data, 90) == pytest.approx(3.7)
    assert percentile(data, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    # np.percentile(range(11), [10, 33, 66.6]) = [1.0, 3.3, 6.66]
    assert [percentile(list(map(float, range(11))), q) for q in (10, 33, 66.6)] == pytest.approx([1.0, 3.3, 6.66])
    with pytest.raises(ValueError):
        percentile([], 50)
    s = summarize([3.0, 1.0, 2.0], scale=1000)
    assert s["median"] == 2000 and s["min"] == 1000 and s["std"] == pytest.approx(math.sqrt(2 / 3) * 1000)


# -- early stop ---------------------------------------------------------------------------------------------


def ok(ttft_ms: float, tokens: int = 10, tpot_ms: float = 10.0) -> RequestRecord:
    t0 = ttft_ms / 1e3
    times = [t0 + i * tpot_ms / 1e3 for i in range(tokens)]
    return RequestRecord("r", scheduled=0.0, sent=0.0, chunk_times=times, output_tokens=tokens, status=200)


def failed() -> RequestRecord:
    return RequestRecord("f", scheduled=0.0, sent=0.0, status=None, error=ErrorClass.CONNECTION)


def test_p90_early_stop_fires_exactly_when_certain():
    # N = 10, p90 = x[8] + 0.1 (x[9] - x[8]). One 200 ms request: best case 9 zeros + 200 -> 20 ms, not certain.
    # A second one: x[8] = 200 ms whatever the rest does -> certain.
    watch = SloWatch({"ttft": 100}, "p90", total_planned=10)
    watch.add(ok(200))
    assert watch.certainly_missed() is None
    watch.add(ok(50))
    assert watch.certainly_missed() is None
    watch.add(ok(200))
    assert watch.certainly_missed() is not None
    assert "ttft p90" in watch.certainly_missed()


def test_each_bound_is_judged_at_its_own_statistic():
    """--goodput ttft:p50=100ms e2el=... with --slo-stat p90: ttft binds p50, e2el p90."""
    watch = SloWatch({"ttft": 100, "e2el": 10_000}, "p90", total_planned=3, statistics={"ttft": "median"})
    assert watch.statistics == {"ttft": "p50", "e2el": "p90"}
    watch.add(ok(200))
    assert watch.certainly_missed() is None  # p50 of 200, 0, 0 is 0
    watch.add(ok(200))
    assert watch.certainly_missed().startswith("ttft p50 is at least 200.00 ms")
    assert watch.missed() == ["ttft p50 200.00 ms > 100 ms"]


def test_early_stop_boundary_is_exact_under_interpolation():
    at_bound = SloWatch({"ttft": 100}, "p90", total_planned=10)
    at_bound.add(ok(1000))  # best case 0 + 0.1 * 1000 = 100 ms: still meets "<= 100"
    assert at_bound.certainly_missed() is None
    over = SloWatch({"ttft": 100}, "p90", total_planned=10)
    over.add(ok(1000.5))  # best case 100.05 ms: certain
    assert over.certainly_missed() is not None


def test_median_and_mean_and_failures():
    med = SloWatch({"e2el": 100}, "median", total_planned=5)  # median of 5 = x[2]: needs 3 misses
    for i in range(3):
        assert med.certainly_missed() is None
        med.add(ok(500))
        assert (med.certainly_missed() is not None) == (i == 2)

    mean = SloWatch({"ttft": 100}, "mean", total_planned=4)  # 250 / 4 = 62.5 then 500 / 4 = 125
    mean.add(ok(250))
    assert mean.certainly_missed() is None
    mean.add(ok(250))
    assert mean.certainly_missed() is not None

    fails = SloWatch({"ttft": 100}, "p50", total_planned=3)  # failures count as infinitely late
    fails.add(failed())
    assert fails.certainly_missed() is None
    fails.add(failed())
    assert fails.certainly_missed() is not None
    assert fails.values()["ttft"] == math.inf


def test_tpot_bound_ignores_single_token_requests():
    watch = SloWatch({"tpot": 20}, "p50", total_planned=4)
    watch.add(ok(10, tokens=1))  # no TPOT sample
    watch.add(ok(10, tokens=5, tpot_ms=50))
    assert watch.certainly_missed() is None  # best case [0, 0, 50]: median 0
    watch.add(ok(10, tokens=5, tpot_ms=50))
    assert watch.certainly_missed() is not None  # best case [0, 50, 50]: median 50


def test_an_early_stop_never_counts_the_requests_the_verdict_leaves_out():
    """tune's capacity window leaves out its first requests (the warm-up); slow ones among them must not end a
    probe whose measured requests can still meet the SLO.  N = 12, the first 2 left out: p90 over the last 10."""
    watch = SloWatch({"ttft": 100}, "p90", total_planned=12, excluded=2)
    for _ in range(2):  # the warm-up, as slow as can be
        watch.add(ok(5000))
    watch.add(ok(200))
    # over all 12 it would be certain (9 zeros and 3 slow ones: p90 = x[9] + 0.9 (x[10] - x[9]) > 100 ms); the
    # measured 10 can still be 9 zeros and one 200 ms: p90 = 0 + 0.1 x 200 = 20 ms
    assert watch.certainly_missed() is None
    whole = SloWatch({"ttft": 100}, "p90", total_planned=12)
    for value in (5000, 5000, 200):
        whole.add(ok(value))
    assert whole.certainly_missed() is not None
    watch.add(ok(200))
    assert watch.certainly_missed() is not None  # 2 slow among any 10 measured: p90 = x[8] = 200 ms
    # a live probe cut short by its time bound can plan fewer requests than the window's warm-up: nothing is judged,
    # so nothing is ever certain (and the probe is not refused)
    short = SloWatch({"ttft": 100}, "p90", total_planned=30, excluded=110)
    for _ in range(30):
        short.add(ok(5000))
    assert short.certainly_missed() is None
    with pytest.raises(ValueError):
        SloWatch({"ttft": 100}, "p90", total_planned=10, excluded=-1)


def test_never_fires_without_a_planned_total():
    watch = SloWatch({"ttft": 1}, "p50", total_planned=None)
    for _ in range(50):
        watch.add(ok(1000))
    assert watch.certainly_missed() is None
    assert watch.missed()


@pytest.mark.parametrize("seed", range(30))
def test_early_stop_agrees_with_every_completion(seed):
    """Randomised: when it fires, a perfect finish still misses; before it fires, a perfect finish meets it."""
    rng = random.Random(seed)
    n = rng.randint(3, 40)
    stat = rng.choice(["p50", "p90", "p95", "p99", "mean"])
    bound = rng.uniform(50, 150)
    watch = SloWatch({"ttft": bound}, stat, total_planned=n)
    seen: list[RequestRecord] = []
    for _ in range(n):
        rec = ok(rng.uniform(0, 300)) if rng.random() > 0.1 else failed()
        watch.add(rec)
        seen.append(rec)
        perfect = SloWatch({"ttft": bound}, stat, total_planned=n)
        for r in seen + [ok(0.0)] * (n - len(seen)):
            perfect.add(r)
        certain = watch.certainly_missed() is not None
        assert certain == bool(perfect.missed())
        if certain:
            worst = SloWatch({"ttft": bound}, stat, total_planned=n)
            for r in seen + [ok(rng.uniform(0, 300)) for _ in range(n - len(seen))]:
                worst.add(r)
            assert worst.missed()
            break


# -- --percentiles, per-request rows ------------------------------------------------------------------------


def test_percentiles_parse_sorted_and_are_reported_under_their_keys():
    assert probe_metrics.parse_percentiles("99.9,50, 90,p99,90") == (50.0, 90.0, 99.0, 99.9)
    assert probe_metrics.parse_percentiles("100") == (100.0,)
    stats = probe_metrics.summarize([1.0, 2.0, 3.0, 4.0], percentiles=(50.0, 99.9))
    assert set(stats) == {"n", "mean", "median", "std", "min", "max", "p50", "p99_9"}
    assert stats["p99_9"] == pytest.approx(3.997)


@pytest.mark.parametrize("text, needle", [("0", "above 0"), ("101", "at most 100"), ("-5", "above 0"),
                                          ("fast", "not a number"), ("", "comma-separated"), ("nan", "above 0"),
                                          (",".join(str(i) for i in range(1, 14)), "at most 12")])
def test_bad_percentiles_are_one_line(text, needle):
    with pytest.raises(ValueError, match=needle) as info:
        probe_metrics.parse_percentiles(text)
    assert "\n" not in str(info.value)


def test_the_tokenizer_count_is_used_only_without_usage():
    rec = RequestRecord("r", scheduled=0.0, sent=0.0, chunk_times=[0.1, 0.2, 0.3], token_messages=3, status=200)
    assert (rec.output_method, rec.output_len) == ("chunks", 3)
    rec.tokenized_output = 5
    assert (rec.output_method, rec.output_len) == ("tokenizer", 5)
    assert rec.tpot == pytest.approx(0.2 / 4)
    rec.output_tokens = 4
    assert (rec.output_method, rec.output_len) == ("usage", 4)


def test_a_request_row_has_the_csv_fields_and_the_text_only_when_asked():
    ok = RequestRecord("a", scheduled=1.0, sent=1.0, chunk_times=[1.1, 1.3], token_messages=2, status=200,
                       prompt_tokens=7, text_parts=[" x", " y"])
    bad = RequestRecord("b", scheduled=2.0, sent=2.0, status=503, error=probe_metrics.ErrorClass.HTTP_5XX,
                        error_detail="HTTP 503", end=2.5)
    row = probe_metrics.request_row(ok, 100.0, text=True)
    assert set(probe_metrics.CSV_FIELDS) <= set(row) and row["text"] == " x y"
    assert row["sent"] == 101.0 and row["ttft_ms"] == pytest.approx(100) and row["tpot_ms"] == pytest.approx(200)
    assert row["output_tokens"] == 2 and row["output_counted_by"] == "chunks"
    failed = probe_metrics.request_row(bad, 100.0)
    assert "text" not in failed and failed["ttft_ms"] is None and failed["output_tokens"] is None
    assert failed["error"] == "http_5xx" and failed["finish_time"] == 102.5
