"""The real engine (`python -m dsctl.engine serve`) as a subprocess on 127.0.0.1, spoken to with raw sockets.

Protocol conformance with vLLM's OpenAI server (SSE framing, usage chunk, chat and completions shapes, 401,
404, 400), /metrics, the request record, start-up failures in the real engine's words, KV-sparsity
divergence, and hundreds of concurrent streams.  Time runs 100x faster (--time-scale 0.01).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsctl
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.load.tokens import count_tokens
from dsctl.engine import server

from .conftest import free_port, install_toolkits

CLI = Path(dsctl.__file__).resolve().parents[1]

MODEL = "deepseek-r1-distill-qwen-7b"
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
READY_LINE = "Uvicorn running on"


class Engine:
    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None, stdlib_only: bool = False,
                 unset: tuple[str, ...] = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")):
        self.port = free_port()
        self.log = tmp / f"engine-{self.port}.log"
        self.err = tmp / f"engine-{self.port}.err"
        argv = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--time-scale", "0.01", *args]
        if stdlib_only:  # as on a lab host's system python3: no site-packages at all (no PyYAML, no typer)
            command = [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(CLI)!r}); "
                       "from dsctl.engine.__main__ import main; sys.exit(main(sys.argv[1:]))", *argv]
        else:
            command = [sys.executable, "-m", "dsctl.engine", *argv]
        environ = {name: value for name, value in os.environ.items() if name not in unset}
        self.proc = subprocess.Popen(command, stdout=self.log.open("w"), stderr=self.err.open("w"),
                                     env={**environ, **(env or {})})

    def wait_ready(self, timeout: float = 20.0) -> Engine:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.log.read_text():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited {self.proc.returncode}: {self.err.read_text()}")
            time.sleep(0.02)
        raise AssertionError("engine did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    served = Engine(tmp, MODEL, "--max-model-len", "4096", "--api-key", KEY, "--served-model-name", MODEL, "alias",
                    "--record", str(tmp / "record.jsonl"), "--seed", "3",
                    env={"VLLM_LOG_STATS_INTERVAL": "0.2"}).wait_ready()
    served.record = tmp / "record.jsonl"
    yield served
    served.stop()


# --------------------------------------------------------------------------- a minimal HTTP client


def dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", rest
            return out
        out += rest[:size]
        assert rest[size:size + 2] == b"\r\n"
        rest = rest[size + 2:]


def request(port: int, method: str, path: str, body: object = None, headers: dict[str, str] | None = None,
            version: str = "HTTP/1.1") -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection (Connection: close); the body de-chunked."""
    payload = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1", "Connection: close",
             f"Content-Length: {len(payload)}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return parse_response(data)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    elif "content-length" in headers:
        assert len(body) == int(headers["content-length"])
    return int(status_line.split()[1]), headers, body


def sse_events(body: bytes) -> list[object]:
    """Every event must be `data: <json>` followed by a blank line; the last one `data: [DONE]`."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    raw_events = body.split(b"\n\n")
    assert raw_events[-1] == b""
    events: list[object] = []
    for raw in raw_events[:-1]:
        assert raw.startswith(b"data: ") and b"\n" not in raw, raw
        payload = raw[len(b"data: "):]
        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def metrics(port: int) -> dict[str, float]:
    status, headers, body = request(port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def series(values: dict[str, float], name: str, **labels: str) -> float:
    want = {"model_name": MODEL, "engine": "0", **labels}
    for key, value in values.items():
        base, _, rest = key.partition("{")
        got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if base == name and got == want:
            return value
    raise KeyError(f"{name}{want}")


# --------------------------------------------------------------------------- protocol


def test_startup_prints_vllm_lines(engine):
    log = engine.log.read_text()
    for line in ("# GPU blocks: ", "GPU KV cache size: ", "Maximum concurrency for 4,096 tokens per request: ",
                 "Application startup complete.", f"Uvicorn running on http://127.0.0.1:{engine.port}"):
        assert line in log
    assert re.search(r"GPU KV cache size: [\d,]+ tokens", log)
    assert re.search(r"Maximum concurrency for 4,096 tokens per request: \d+\.\d\dx", log)


def test_completion_stream_sse_framing_and_usage_chunk(engine):
    body = {"model": MODEL, "prompt": "The quick brown fox jumps", "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}
    status, headers, raw = request(engine.port, "POST", "/v1/completions", body, AUTH)
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["transfer-encoding"] == "chunked"
    events = sse_events(raw)
    *token_events, usage_event = events
    assert usage_event["choices"] == []
    assert usage_event["usage"] == {"prompt_tokens": 5, "total_tokens": 17, "completion_tokens": 12}
    for event in token_events:
        assert event["id"].startswith("cmpl-") and event["object"] == "text_completion"
        assert event["model"] == MODEL and isinstance(event["created"], int)
        assert event["usage"] is None
        [choice] = event["choices"]
        assert set(choice) >= {"index", "text", "logprobs", "finish_reason"}
    assert [e["choices"][0]["finish_reason"] for e in token_events][-1] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in token_events[:-1])
    text = "".join(e["choices"][0]["text"] for e in token_events)
    assert count_tokens(text) == 12
    # a time-scaled engine stamps each token event with its wall seconds since arrival (growing), nothing else
    elapsed = [e["dsctl_engine_elapsed_s"] for e in token_events]
    assert elapsed == sorted(elapsed) and 0 < elapsed[0] < 1 and "dsctl_engine_elapsed_s" not in usage_event
    # the same prompt without streaming gives the same text (seeded, deterministic)
    status, _, plain = request(engine.port, "POST", "/v1/completions", {**body, "stream": False,
                                                                        "stream_options": None}, AUTH)
    assert status == 200 and json.loads(plain)["choices"][0]["text"] == text


def test_at_time_scale_one_the_stream_carries_vllms_keys_only(tmp_path):
    started = Engine(tmp_path, MODEL, "--startup", "0", "--time-scale", "1").wait_ready()
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        for path, body in (("/v1/completions", {"prompt": "hello there", "max_tokens": 3}),
                           ("/v1/chat/completions", chat)):
            status, _, raw = request(started.port, "POST", path, {**body, "stream": True})
            assert status == 200 and b"dsctl_" not in raw, raw
    finally:
        started.stop()


def test_stream_without_include_usage_has_no_usage_chunk(engine):
    body = {"prompt": "hello there", "max_tokens": 4, "stream": True}
    status, _, raw = request(engine.port, "POST", "/v1/completions", body, AUTH)
    events = sse_events(raw)
    assert status == 200 and all(e["choices"] for e in events)


def test_chat_stream_role_chunk_then_content(engine):
    body = {"model": "alias", "messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Say something"}],
            "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    status, _, raw = request(engine.port, "POST", "/v1/chat/completions", body, AUTH)
    assert status == 200
    *chunks, usage = sse_events(raw)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert all(c["model"] == "alias" and "usage" not in c for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6 == count_tokens(content)
    # the template's 3 tokens, then a role marker plus the text per message
    assert usage["usage"]["prompt_tokens"] == 3 + (1 + count_tokens("Be brief.")) + (1 + count_tokens("Say something"))


def test_non_streaming_shapes(engine):
    status, headers, raw = request(engine.port, "POST", "/v1/completions",
                                   {"model": MODEL, "prompt": [1, 2, 3, 4, 5, 6, 7], "max_tokens": 5}, AUTH)
    assert status == 200 and headers["content-type"] == "application/json"
    data = json.loads(raw)
    assert data["id"].startswith("cmpl-") and data["object"] == "text_completion" and data["model"] == MODEL
    assert data["choices"][0]["index"] == 0 and data["choices"][0]["logprobs"] is None
    assert data["choices"][0]["finish_reason"] == "length"
    assert {k: data["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    status, _, raw = request(engine.port, "POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, AUTH)
    chat = json.loads(raw)
    assert status == 200 and chat["id"].startswith("chatcmpl-") and chat["object"] == "chat.completion"
    message = chat["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    # chat without max_tokens runs to the context limit, as vLLM's default does
    assert chat["usage"]["completion_tokens"] == 4096 - chat["usage"]["prompt_tokens"]


def test_models_health_version(engine):
    status, _, raw = request(engine.port, "GET", "/v1/models", headers=AUTH)
    models = json.loads(raw)
    assert status == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL, "alias"]
    assert models["data"][0]["max_model_len"] == 4096 and models["data"][0]["owned_by"] == "vllm"
    assert request(engine.port, "GET", "/health")[:1] == (200,)
    assert request(engine.port, "GET", "/health")[2] == b""
    assert json.loads(request(engine.port, "GET", "/version")[2])["version"]


def test_api_key(engine):
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, _, raw = request(engine.port, "POST", "/v1/completions", body, headers)
        assert (status, json.loads(raw)) == (401, {"error": "Unauthorized"})
    assert request(engine.port, "GET", "/v1/models")[0] == 401
    assert request(engine.port, "POST", "/v1/completions", body, AUTH)[0] == 200
    assert request(engine.port, "GET", "/metrics")[0] == 200  # not under /v1: open, as in vLLM


def test_unknown_model_is_404_in_vllm_words(engine):
    status, _, raw = request(engine.port, "POST", "/v1/completions", {"model": "gpt-4", "prompt": "x"}, AUTH)
    assert status == 404
    assert json.loads(raw) == {"object": "error", "message": "The model `gpt-4` does not exist.",
                               "type": "NotFoundError", "param": None, "code": 404}


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", {"max_tokens": 3}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "word " * 5000}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}),
    ("/v1/chat/completions", {"messages": "hello"}),
    ("/v1/chat/completions", {"messages": []}),
])
def test_bad_requests_are_400(engine, path, body):
    status, _, raw = request(engine.port, "POST", path, body, AUTH)
    data = json.loads(raw)
    assert status == 400, data
    assert data["object"] == "error" and data["type"] == "BadRequestError" and data["code"] == 400
    assert data["message"]


def test_malformed_numbers_and_deep_json_are_400_and_the_engine_lives_on(engine):
    for raw in (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", b"[" * 100000 + b"]" * 100000):
        status, _, body = request(engine.port, "POST", "/v1/completions", raw, AUTH)
        assert status == 400 and json.loads(body)["type"] == "BadRequestError"
    assert request(engine.port, "GET", "/health")[0] == 200


def test_idle_and_half_sent_connections_are_closed(engine):
    from dsctl.engine import server

    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as idle:
        assert idle.recv(1) == b""  # closed by the server after the idle timeout
    assert server.IDLE_TIMEOUT_SECONDS - 0.5 < time.monotonic() - began < server.IDLE_TIMEOUT_SECONDS + 5
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        assert slow.recv(1) == b""


def test_context_length_message(engine):
    _, _, raw = request(engine.port, "POST", "/v1/completions", {"prompt": "x y", "max_tokens": 5000}, AUTH)
    assert json.loads(raw)["message"].startswith("'max_tokens' or 'max_completion_tokens' is too large: 5000. "
                                                 "This model's maximum context length is 4096 tokens")


def test_routes_404_and_405(engine):
    status, _, raw = request(engine.port, "GET", "/nope")
    assert (status, json.loads(raw)) == (404, {"detail": "Not Found"})
    status, headers, raw = request(engine.port, "GET", "/v1/completions", headers=AUTH)
    assert (status, json.loads(raw), headers["allow"]) == (405, {"detail": "Method Not Allowed"}, "POST")


def test_keep_alive_serves_several_requests_on_one_connection(engine):
    stream = json.dumps({"prompt": "a b c", "max_tokens": 3, "stream": True}).encode()
    plain = json.dumps({"prompt": "a b c", "max_tokens": 3}).encode()
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for payload in (stream, plain, stream):
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                         + b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            status_line = reader.readline()
            assert status_line.startswith(b"HTTP/1.1 200")
            headers = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.lower()] = value.strip()
            assert "connection" not in headers
            if headers.get("transfer-encoding") == "chunked":
                body = b""
                while (size := int(reader.readline(), 16)) != 0:
                    body += reader.read(size)
                    reader.read(2)
                reader.read(2)
                assert len(sse_events(body)) == 3
            else:
                assert json.loads(reader.read(int(headers["content-length"])))["usage"]["completion_tokens"] == 3


def test_kept_alive_streams_get_their_first_token_without_a_delayed_ack_wait(engine):
    """Client first byte minus the engine's first-token stamp on one kept-alive connection.  Without TCP_NODELAY the
    stream's first event (a small write after the head) waits for the client's delayed ACK, about 40 ms on Linux;
    vLLM's server (uvloop) sets TCP_NODELAY, so the gap is the write itself."""
    gaps = []
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for i in range(15):
            payload = json.dumps({"prompt": "a b c", "max_tokens": 4, "stream": True}).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                         + f"\r\nX-Request-Id: nodelay-{i}\r\n".encode()
                         + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            assert reader.readline().startswith(b"HTTP/1.1 200")
            while reader.readline() != b"\r\n":
                pass
            first = None
            while (size := int(reader.readline(), 16)) != 0:
                reader.read(size + 2)
                first = first or time.time()
            reader.read(2)
            gaps.append((i, first))
    records = {r["id"]: r for r in map(json.loads, engine.record.read_text().splitlines())}
    lags = sorted(first - records[f"nodelay-{i}"]["first_token_time"] for i, first in gaps)
    assert lags[len(lags) // 2] < 0.015, f"client first byte - engine first token (s): {lags}"


def test_http10_stream_is_close_delimited(engine):
    status, headers, raw = request(engine.port, "POST", "/v1/completions",
                                   {"prompt": "a", "max_tokens": 3, "stream": True}, AUTH, version="HTTP/1.0")
    assert status == 200 and "transfer-encoding" not in headers and headers.get("connection") == "close"
    assert len(sse_events(raw)) == 3


def test_request_id_header_and_engine_record(engine):
    headers = {**AUTH, "X-Request-Id": "probe-42"}
    status, response_headers, raw = request(engine.port, "POST", "/v1/completions",
                                            {"prompt": "one two three", "max_tokens": 7, "stream": True}, headers)
    assert status == 200 and response_headers["x-request-id"] == "probe-42"
    assert sse_events(raw)[0]["id"] == "cmpl-probe-42"
    records = [json.loads(line) for line in engine.record.read_text().splitlines()]
    [record] = [r for r in records if r["id"] == "probe-42"]
    assert record["prompt_tokens"] == 3 and record["output_tokens"] == 7
    assert record["arrival"] <= record["first_token_time"] <= record["finish_time"] <= time.time()
    assert abs(record["arrival"] - time.time()) < 60


def test_metrics_names_and_counts(engine):
    before = metrics(engine.port)
    prompts = ["alpha beta", "gamma delta epsilon", "zeta"]
    for prompt in prompts:
        assert request(engine.port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 9, "stream": True},
                       AUTH)[0] == 200
    after = metrics(engine.port)

    def delta(name: str, **labels: str) -> float:
        return series(after, name, **labels) - series(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:generation_tokens_total") == 27
    assert delta("vllm:prompt_tokens_total") == sum(count_tokens(p) for p in prompts)
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == 3 * 8
    assert delta("vllm:time_per_output_token_seconds_count") == 3 * 8
    assert series(after, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == series(
        after, "vllm:time_to_first_token_seconds_count")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total"):
        assert series(after, name) >= 0
    assert series(after, "vllm:num_requests_running") == 0 and series(after, "vllm:kv_cache_usage_perc") == 0


def test_metrics_parse_with_prometheus_clients_parser(engine):
    from prometheus_client.parser import text_string_to_metric_families

    assert request(engine.port, "POST", "/v1/completions", {"prompt": "count me", "max_tokens": 3}, AUTH)[0] == 200
    families = {f.name: f for f in text_string_to_metric_families(request(engine.port, "GET", "/metrics")[2].decode())}
    for name in ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"):
        family = families[name]
        assert family.type == "counter" and family.samples, name
        assert all(sample.name == f"{name}_total" for sample in family.samples)
    assert sum(s.value for s in families["vllm:generation_tokens"].samples) >= 3
    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram" and any(s.name.endswith("_bucket") for s in ttft.samples)
    assert families["vllm:time_to_first_token_seconds_created"].type == "gauge"
    assert families["vllm:kv_cache_usage_perc"].type == "gauge"


def test_hundreds_of_concurrent_streams(engine):
    count, max_tokens = 500, 16

    async def one(index: int) -> tuple[int, int, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
        payload = json.dumps({"prompt": f"request {index} " + "lorem ipsum " * 30, "max_tokens": max_tokens,
                              "stream": True, "stream_options": {"include_usage": True}}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
                     + KEY.encode() + b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        data = await reader.read()
        writer.close()
        status, _, body = parse_response(data)
        *chunks, usage = sse_events(body)
        return status, usage["usage"]["completion_tokens"], len(chunks)

    async def all_of_them() -> list[tuple[int, int, int]]:
        return await asyncio.gather(*(one(i) for i in range(count)))

    began = time.monotonic()
    results = asyncio.run(all_of_them())
    assert all(status == 200 and tokens == max_tokens and 1 <= chunks <= max_tokens
               for status, tokens, chunks in results)
    assert time.monotonic() - began < 30
    after = metrics(engine.port)
    assert series(after, "vllm:num_requests_running") == 0
    time.sleep(0.3)
    assert re.search(r"Engine 000: Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+ "
                     r"tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%",
                     engine.log.read_text())


def test_a_client_that_goes_away_is_aborted(engine):
    before = metrics(engine.port)
    payload = json.dumps({"prompt": "long story", "max_tokens": 3000, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        assert b"data: {" in sock.recv(65536) + sock.recv(65536)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = metrics(engine.port)
        if series(after, "vllm:request_success_total", finished_reason="abort") > series(
                before, "vllm:request_success_total", finished_reason="abort"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the abandoned request was not aborted")
    assert series(after, "vllm:num_requests_running") == 0 and series(after, "vllm:kv_cache_usage_perc") == 0


def test_multi_stream_engine_serves_concurrent_streams(tmp_path):
    started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0", "--stream-num", "4",
                     "--max-num-seqs", "16", "--jitter", "0.1").wait_ready()
    try:
        async def one(index: int) -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", started.port)
            payload = json.dumps({"prompt": f"stream {index}", "max_tokens": 8 + index % 5, "stream": True}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            data = await reader.read()
            writer.close()
            return sum(count_tokens(e["choices"][0]["text"]) for e in sse_events(parse_response(data)[2]))

        async def all_of_them() -> list[int]:
            return await asyncio.gather(*(one(i) for i in range(60)))

        assert asyncio.run(all_of_them()) == [8 + i % 5 for i in range(60)]
        assert "stream_num=4" in started.log.read_text()
    finally:
        started.stop()


# --------------------------------------------------------------------------- start-up failures


def test_impossible_config_fails_at_start_with_oom_and_never_listens(tmp_path):
    started = Engine(tmp_path, "deepseek-v3", "--tensor-parallel-size", "1")
    refused = 0
    while started.proc.poll() is None:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", started.port)) != 0, "the engine listened"
            refused += 1
        time.sleep(0.02)
    assert started.proc.wait(30) == 1
    err = started.err.read_text()
    assert "NPU out of memory. Tried to allocate" in err
    assert "Engine core initialization failed" in err
    assert READY_LINE not in started.log.read_text()
    assert refused > 0


def test_kv_too_small_for_max_model_len_is_vllms_value_error(tmp_path):
    started = Engine(tmp_path, MODEL, "--gpu-memory-utilization", "0.3")
    assert started.proc.wait(30) == 1
    err = started.err.read_text()
    assert "ValueError: To serve at least one request with the model's max seq len (131072)" in err
    assert "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`" in err


def test_more_tensor_parallel_ranks_than_visible_npus(tmp_path):
    started = Engine(tmp_path, MODEL, "-tp", "2", env={"ASCEND_RT_VISIBLE_DEVICES": "3"})
    assert started.proc.wait(30) == 1
    assert "please ensure that world_size (2) is less than than max local gpu count (1)" in started.err.read_text()


# --------------------------------------------------------------------------- KV sparsity


def test_divergence_grows_with_the_kv_sparse_threshold(tmp_path):
    thresholds = (0.0, 0.1, 0.5)
    engines = [Engine(tmp_path, MODEL, "--max-model-len", "4096", "--seed", "7", "--startup", "0",
                      "--kv-sparse-threshold", str(t), stdlib_only=(t == 0.1)) for t in thresholds]
    try:
        for started in engines:
            started.wait_ready()
        prompts = [f"prompt number {i} about sparse attention" for i in range(6)]
        outputs = {}
        for t, started in zip(thresholds, engines, strict=True):
            outputs[t] = []
            for prompt in prompts:
                _, _, raw = request(started.port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 64})
                outputs[t].append(json.loads(raw)["choices"][0]["text"].split())
    finally:
        for started in engines:
            started.stop()

    def differing(t: float, i: int) -> set[int]:
        return {k for k, (a, b) in enumerate(zip(outputs[0.0][i], outputs[t][i], strict=True)) if a != b}

    shares = [sum(len(differing(t, i)) for i in range(len(prompts))) / (64 * len(prompts)) for t in thresholds]
    assert shares[0] == 0 < shares[1] < shares[2], shares
    for i in range(len(prompts)):  # per prompt, the positions that differ at 0.1 also differ at 0.5
        assert differing(0.1, i) <= differing(0.5, i)


def test_chunked_request_body_and_expect_continue(engine):
    payload = json.dumps({"prompt": "chunked body", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                     b"Transfer-Encoding: chunked\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
        assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        half = len(payload) // 2
        for part in (payload[:half], payload[half:]):
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        sock.sendall(b"0\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status, _, body = parse_response(data)
    assert status == 200 and json.loads(body)["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize("size_line", [b"-5", b"+5", b"5" + b"0" * 70000, b"zz"])
def test_a_bad_chunk_size_line_is_a_400_not_a_traceback(engine, size_line):
    with socket.create_connection(("127.0.0.1", engine.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + size_line + b"\r\nhello\r\n0\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 "), data[:80]
    assert "Traceback" not in engine.err.read_text() + engine.log.read_text()
    assert request(engine.port, "GET", "/health")[0] == 200


def test_a_thousand_idle_connections_do_not_shut_health_out(engine):
    """One client holding every connection the engine allows: the longest-idle one makes room for the next."""
    held = []
    try:
        for _ in range(server.MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", engine.port), timeout=30))
        assert request(engine.port, "GET", "/health")[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_kv_pressure_preempts_and_every_request_still_completes(tmp_path):
    started = Engine(tmp_path, MODEL, "--max-model-len", "2048", "--gpu-memory-utilization", "0.28", "--startup", "0",
                     "--disable-uvicorn-access-log").wait_ready()
    try:
        capacity = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", started.log.read_text()).group(1)
                       .replace(",", ""))
        count, max_tokens = 40, 1500
        assert count * (max_tokens + 10) > 2 * capacity  # far more KV than the cache holds

        async def one(index: int) -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", started.port)
            payload = json.dumps({"prompt": f"pressure {index}", "max_tokens": max_tokens}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            data = await reader.read()
            writer.close()
            return json.loads(parse_response(data)[2])["usage"]["completion_tokens"]

        async def all_of_them() -> list[int]:
            return await asyncio.gather(*(one(i) for i in range(count)))

        assert asyncio.run(all_of_them()) == [max_tokens] * count
        after = metrics(started.port)
        assert series(after, "vllm:num_preemptions_total") > 0
        assert series(after, "vllm:kv_cache_usage_perc") == 0
    finally:
        started.stop()


# --------------------------------------------------------------------------- the CANN it runs on


def sourced(script: Path) -> dict[str, str]:
    """The environment a shell has after ``. script`` (CANN's set_env.sh), as a launch script's exec gets it."""
    out = subprocess.run(["bash", "-c", f". {script} && env -0"], capture_output=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("ASCEND_")}).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def test_engine_reports_the_cann_its_environment_points_at(tmp_path):
    home = install_toolkits(tmp_path / "Ascend", ["8.0.0", "8.3.RC2"], active="8.3.RC2")
    env = sourced(home / "set_env.sh")
    assert env["ASCEND_TOOLKIT_HOME"] == f"{tmp_path}/Ascend/ascend-toolkit/latest"
    started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0", env=env).wait_ready()
    try:
        version = json.loads(request(started.port, "GET", "/version")[2])
        assert version["cann"] == "8.3.RC2" and version["cann_toolkit"] == str(home / "8.3.RC2")
        assert f"CANN version: 8.3.RC2 (toolkit at {home / '8.3.RC2'})" in started.log.read_text()
    finally:
        started.stop()
    install_toolkits(tmp_path / "Ascend2", ["8.0.0", "8.3.RC2"], active="8.0.0")  # another host, switched back
    env = sourced(tmp_path / "Ascend2" / "ascend-toolkit" / "set_env.sh")
    started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0", env=env).wait_ready()
    try:
        assert json.loads(request(started.port, "GET", "/version")[2])["cann"] == "8.0.0"
    finally:
        started.stop()


def test_engine_on_a_lab_regressed_cann_serves_measurably_slower(tmp_path):
    """The toolkit of a releases.yaml lab_regression release holds dsctl-lab-regression.json (the emulated installer
    writes it): the engine serves its slowdown times slower, so the upgrade's probe gate has something to catch."""
    timings = {}
    for name, regression in (("plain", None), ("regressed", {"slowdown": 3.0})):
        home = install_toolkits(tmp_path / name / "Ascend", ["8.3.RC2"], active="8.3.RC2")
        if regression:
            (home / "8.3.RC2" / vf.LAB_REGRESSION_FILE).write_text(json.dumps(regression))
        # time scale 0.1, not the module's 0.01: at 0.01 three requests take ~50 ms of wall time, mostly Python, and
        # four test workers on two cores made the 3x slowdown look like 1.7x
        started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0", "--time-scale", "0.1",
                         env=sourced(home / "set_env.sh")).wait_ready()
        try:
            body = {"model": MODEL, "prompt": "hello " * 64, "max_tokens": 64, "ignore_eos": True}
            began = time.monotonic()
            for _ in range(3):
                assert request(started.port, "POST", "/v1/completions", body)[0] == 200
            timings[name] = time.monotonic() - began
            log = started.log.read_text()
        finally:
            started.stop()
        assert ("lab regression: serving 3x slower" in log) == bool(regression)
    assert timings["regressed"] > 2.0 * timings["plain"], timings


def test_engine_without_a_cann_environment_warns_and_reports_null(tmp_path):
    started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0").wait_ready()
    try:
        version = json.loads(request(started.port, "GET", "/version")[2])
        assert version["cann"] is None and version["version"]
        assert re.search(r"WARNING .*CANN toolkit not found: ASCEND_TOOLKIT_HOME and ASCEND_HOME_PATH are unset",
                         started.log.read_text())
    finally:
        started.stop()


# --------------------------------------------------------------------------- memory that runs out


def test_long_prompt_on_a_fragmenting_allocator_kills_the_engine_with_aclrtmalloc(tmp_path):
    args = (MODEL, "--max-model-len", "32768", "--no-enable-chunked-prefill", "--gpu-memory-utilization", "0.97",
            "--startup", "0")
    long_prompt = {"prompt": "a " * 30000, "max_tokens": 4}
    fragmenting = Engine(tmp_path, *args, unset=("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH",
                                                 "PYTORCH_NPU_ALLOC_CONF")).wait_ready()
    try:
        assert request(fragmenting.port, "POST", "/v1/completions", {"prompt": "a " * 1000, "max_tokens": 4})[0] == 200
        with pytest.raises((ConnectionError, ValueError, IndexError)):
            request(fragmenting.port, "POST", "/v1/completions", long_prompt)
        assert fragmenting.proc.wait(30) == 1
        err = fragmenting.err.read_text()
        assert "aclrtMalloc failed" in fragmenting.log.read_text() and "EngineDeadError" in err
        assert "RuntimeError: NPU out of memory" in err
    finally:
        fragmenting.stop()
    expandable = Engine(tmp_path, *args, env={"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}).wait_ready()
    try:
        status, _, raw = request(expandable.port, "POST", "/v1/completions", long_prompt)
        assert status == 200 and json.loads(raw)["usage"]["prompt_tokens"] == 30000
    finally:
        expandable.stop()


def test_a_token_budget_too_large_for_memory_fails_vllms_profiling_run(tmp_path):
    started = Engine(tmp_path, MODEL, "--max-model-len", "131072", "--no-enable-chunked-prefill", "--startup", "0")
    assert started.proc.wait(30) == 1
    assert "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`" in \
        started.err.read_text()
    small = Engine(tmp_path, MODEL, "--max-model-len", "131072", "--startup", "0").wait_ready()  # chunked: 2048
    small.stop()


def test_tensor_parallel_size_must_divide_the_heads(tmp_path):
    started = Engine(tmp_path, MODEL, "-tp", "8")
    assert started.proc.wait(30) == 1
    assert ("ValueError: Total number of attention heads (28) must be divisible by tensor parallel size (8)."
            in started.err.read_text())
