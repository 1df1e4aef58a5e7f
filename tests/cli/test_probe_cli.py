"""`dsctl probe` as users meet it: option errors, an unreachable server, and a real run against the engine."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from dsctl.app import main
from dsctl.core.load import probe_metrics
from dsctl.core.load.slo_spec import Slo
from dsctl.services.probe import ProbeConfig, probe
from dsctl.services.runtime import HttpProber

ENGINE_MODEL = "deepseek-r1-distill-qwen-7b"
HAVE_ENGINE = importlib.util.find_spec("dsctl.engine.__main__") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dsctl: error: "), err
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["http://127.0.0.1:9"], "--rate"),
    (["http://127.0.0.1:9", "--rate", "0"], "--rate"),
    (["http://127.0.0.1:9", "--rate", "fast"], "--rate"),
    (["http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
    (["http://127.0.0.1:9", "--rate", "2", "--prompt-tokens", "uniform:5"], "--prompt-tokens"),
    (["http://127.0.0.1:9", "--rate", "2", "--output-tokens", "normal:0:3"], "--output-tokens"),
    (["http://127.0.0.1:9", "--rate", "2", "--early-stop"], "--early-stop"),
    (["http://127.0.0.1:9", "--rate", "2", "--goodput", "itl:5"], "goodput"),
    (["http://127.0.0.1:9", "--rate", "2", "--goodput", "ttft:200", "--slo-stat", "p42"], "--slo-stat"),
    (["http://127.0.0.1:9", "--rate", "2", "--arrival", "poisson", "--burstiness", "2"], "--burstiness"),
    (["http://127.0.0.1:9", "--rate", "2", "--arrival", "ramp"], "--ramp-to"),
    (["http://127.0.0.1:9", "--concurrency", "4", "--arrival", "gamma"], "--rate"),
    (["http://127.0.0.1:9", "--rate", "2", "--shared-prefix", "1.5"], "--shared-prefix"),
    (["http://127.0.0.1:9", "--rate", "2", "--endpoint", "embeddings"], "--endpoint"),
    (["http://127.0.0.1:9", "http://127.0.0.1:10", "--rate", "2"], "one URL"),
    (["ftp://127.0.0.1:9", "--rate", "2"], "URL"),
    (["http://127.0.0.1:9", "--rate", "2", "--prompts", "/nonexistent/p.jsonl"], "prompts"),
    (["http://127.0.0.1:9", "--rate", "2", "--percentiles", "0,50"], "--percentiles"),
    (["http://127.0.0.1:9", "--rate", "2", "--percentiles", "50,100.5"], "--percentiles"),
    (["http://127.0.0.1:9", "--rate", "2", "--percentiles", "p-high"], "--percentiles"),
    (["http://127.0.0.1:9", "--sweep", "rate=1:32:100"], "--sweep"),
    (["http://127.0.0.1:9", "--sweep", "speed=1:2:2"], "--sweep"),
    (["http://127.0.0.1:9", "--sweep", "rate=1:8:4", "--rate", "2"], "--rate"),
    (["http://127.0.0.1:9", "--rate", "2", "--dataset", "/nonexistent/d.json"], "--dataset"),
    (["http://127.0.0.1:9", "--rate", "2", "--tokenizer", "/nonexistent/tok"], "--tokenizer"),
])
def test_bad_options_exit_2_with_one_line(capsys, args, needle):
    assert main(["probe", *args]) == 2
    captured = capsys.readouterr()
    assert needle in one_error_line(captured.err)
    assert captured.out == ""


def test_unreachable_server_exits_1_quickly_naming_the_url(capsys):
    port = free_port()  # nothing listens there now
    started = time.monotonic()
    assert main(["probe", f"http://127.0.0.1:{port}", "--rate", "4", "--requests", "200",
                 "--model", "m"]) == 1
    assert time.monotonic() - started < 5
    line = one_error_line(capsys.readouterr().err)
    assert f"127.0.0.1:{port}" in line and "refused" in line


def test_help_lists_the_options():
    result = subprocess.run([sys.executable, "-m", "dsctl", "probe", "--help"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    for option in ("--rate", "--concurrency", "--goodput", "--early-stop", "--api-key", "--json", "--record",
                   "--percentiles", "--csv", "--save-text", "--tokenizer", "--dataset", "--sweep", "--run-dir"):
        assert option in result.stdout


# -- against a scripted server (misbehaviour the engine does not produce) -------------------------------------


class ScriptedServer:
    """A tiny HTTP/1.1 server in a thread; ``mode`` picks the misbehaviour. Records request heads."""

    CHUNK = (b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"t","finish_reason":null}],'
             b'"usage":null}\n\n')

    def __init__(self, mode: str):
        self.mode = mode
        self.heads: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith(b"GET"):
                    doc = b'{"data":[{"id":"scripted"}]}'
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(doc), doc))
                    await writer.drain()
                    continue
                if self.mode == "stall":
                    await asyncio.sleep(3600)
                if self.mode == "error":
                    doc = b'{"object":"error","message":"engine overloaded","code":503}'
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(doc), doc))
                    await writer.drain()
                    continue
                body = self.CHUNK * 2 + self.CHUNK.replace(b'"finish_reason":null', b'"finish_reason":"length"') \
                    + b"data: [DONE]\n\n"
                # "close-after": keep-alive by the headers, but hang up after each response, as an idle-timeout would
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
                if self.mode == "close-after":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        self.thread.join(5)


@pytest.fixture
def scripted():
    servers: list[ScriptedServer] = []

    def make(mode: str) -> ScriptedServer:
        servers.append(ScriptedServer(mode))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_closed_keepalive_connections_are_retried_and_the_key_is_sent_not_shown(scripted, capsys, monkeypatch):
    server = scripted("close-after")
    monkeypatch.setenv("DSCTL_API_KEY", "sekret-key-123")
    code, env = run_json(capsys, f"http://127.0.0.1:{server.port}", "--concurrency", "2", "--requests", "12",
                         "--output-tokens", "3", "--prompt-tokens", "8")
    assert code == 0, env
    m = env["data"]["metrics"]
    assert m["completed"] == 12 and m["failed"] == 0
    assert m["total_output_tokens"] == 36  # no usage chunk: one token per message
    assert env["data"]["target"]["model"] == "scripted"
    assert all(b"Authorization: Bearer sekret-key-123" in head for head in server.heads)
    ids = [line.split(b":", 1)[1].strip().decode() for head in server.heads if head.startswith(b"POST")
           for line in head.split(b"\r\n") if line.lower().startswith(b"x-request-id:")]
    assert len(ids) >= 12 and all(uuid.UUID(value).version == 4 for value in ids)  # one UUID4 per request sent
    assert "sekret" not in json.dumps(env) and env["data"]["config"]["api_key_set"] is True


def test_a_stalled_server_times_out_with_exit_7(scripted, capsys):
    server = scripted("stall")
    started = time.monotonic()
    code, env = run_json(capsys, f"http://127.0.0.1:{server.port}", "--concurrency", "4", "--requests", "4",
                         "--timeout", "0.5", "--goodput", "ttft:100")
    assert code == 7
    assert time.monotonic() - started < 5
    m = env["data"]["metrics"]
    assert m["failures"]["timeout"] == 4 and m["completed"] == 0
    assert "every request" in env["errors"][0]
    assert env["data"]["slo"]["values_ms"] == {"ttft": "inf"} and not env["data"]["slo"]["met"]


def test_http_errors_are_classified_and_all_failed_exits_1(scripted, capsys):
    server = scripted("error")
    code, env = run_json(capsys, f"http://127.0.0.1:{server.port}", "--rate", "inf", "--requests", "5")
    assert code == 1
    data = env["data"]
    assert data["metrics"]["failures"]["http_5xx"] == 5 and data["metrics"]["ttft_ms"]["n"] == 0
    assert "engine overloaded" in data["failure_examples"][0]["detail"]


# -- against the emulated engine ------------------------------------------------------------------------------


@contextlib.contextmanager
def serving_engine(directory: Path, time_scale: str):
    if not HAVE_ENGINE:
        pytest.skip("the emulated engine (python -m dsctl.engine) is not in this tree yet")
    record = directory / "record.jsonl"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsctl.engine", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--model", ENGINE_MODEL, "--time-scale", time_scale, "--startup", "0", "--record", str(record)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"engine exited: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("engine did not become ready in 30 s")
            time.sleep(0.1)
        yield url, record
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with serving_engine(tmp_path_factory.mktemp("engine"), "0.01") as served:
        yield served


def run_json(capsys, *args: str) -> tuple[int, dict]:
    # The engine runs 100x faster than modelled time only so that its requests are cheap: these tests judge wall
    # time, which --time-scale 1 asks for (without it the probe takes the engine's own scale; see the test below).
    if "--time-scale" not in args:
        args = (*args, "--time-scale", "1")
    code = main(["probe", *args, "--json"])
    out = capsys.readouterr().out

    def strict(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return code, json.loads(out, parse_constant=strict)


def test_real_run_json_is_self_consistent(engine, capsys, tmp_path: Path):
    url, engine_record = engine
    record = tmp_path / "probe.jsonl"
    code, env = run_json(capsys, url, "--rate", "40", "--requests", "20", "--prompt-tokens", "uniform:32:128",
                         "--output-tokens", "16", "--warmup", "2", "--record", str(record), "--seed", "3")
    assert code == 0, env
    assert env["status"] == "success" and env["command"] == ["probe"]
    data = env["data"]
    m = data["metrics"]
    assert data["target"]["model"] == ENGINE_MODEL and data["warmup"] == {"requests": 2, "failed": 0}
    assert m["completed"] == 20 and m["failed"] == 0
    assert m["total_output_tokens"] == 20 * 16  # ignore_eos: exactly max_tokens, from the usage chunk
    dur = m["duration_s"]
    assert m["request_throughput"] == pytest.approx(20 / dur)
    assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / dur)
    assert m["total_token_throughput"] == pytest.approx((m["total_input_tokens"] + m["total_output_tokens"]) / dur)
    assert 20 * 32 <= m["total_input_tokens"] <= 20 * 140
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 20 and all(line["success"] for line in lines)
    for key in ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms"):
        s = m[key]
        assert s["min"] <= s["median"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"], key
        # one ITL sample per gap between SSE messages (a message may carry several tokens)
        assert s["n"] == (sum(line["messages"] - 1 for line in lines) if key == "itl_ms" else 20)
    assert m["ttft_ms"]["max"] <= m["e2el_ms"]["max"]
    assert m["tpot_ms"]["mean"] == pytest.approx(
        sum((line["e2el_ms"] - line["ttft_ms"]) / 15 for line in lines) / 20)
    ttfts = sorted(line["ttft_ms"] for line in lines)
    assert m["ttft_ms"]["median"] == pytest.approx((ttfts[9] + ttfts[10]) / 2)  # the same numbers, per request
    # the engine recorded the same request ids (x-request-id)
    ids = {line["id"] for line in lines}
    engine_ids = {json.loads(line)["id"] for line in engine_record.read_text().splitlines()}
    assert ids <= {i.removeprefix("cmpl-") for i in engine_ids} | engine_ids


def test_real_run_table_and_goodput(engine, capsys):
    url, _ = engine
    code = main(["probe", url, "--concurrency", "4", "--requests", "8", "--output-tokens", "8",
                 "--prompt-tokens", "64", "--endpoint", "chat", "--goodput", "ttft:60000", "tpot:60000"])
    out = capsys.readouterr().out
    assert code == 0, out
    for label in ("Serving Benchmark Result", "Successful requests", "Benchmark duration (s)",
                  "Request throughput (req/s)", "Output token throughput (tok/s)", "Total Token throughput (tok/s)",
                  "Request goodput (req/s)", "TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2EL (ms)", "SLO p90: met"):
        assert label in out, label


def test_a_time_scaled_engine_is_judged_in_modelled_time(capsys, tmp_path):
    """Without --time-scale the probe asks the engine (its /version says 0.25): the rate it offers, the duration
    and every latency are modelled, and the run takes a quarter of the modelled time."""
    with serving_engine(tmp_path, "0.25") as (url, _):
        started = time.monotonic()
        code, env = run_json(capsys, url, "--rate", "4", "--arrival", "constant", "--requests", "16",
                             "--output-tokens", "8", "--prompt-tokens", "32", "--time-scale", "auto")
        wall = time.monotonic() - started
    assert code == 0, env["errors"]
    metrics, config = env["data"]["metrics"], env["data"]["config"]
    assert config["time_scale"] == 0.25
    # 16 requests 0.25 modelled seconds apart: 3.75 s modelled plus the last one's latency, in about a quarter
    assert 3.7 < metrics["duration_s"] < 4.6 and metrics["request_throughput"] == pytest.approx(4, rel=0.15)
    assert wall < 2.5
    # a modelled TTFT of a 32-token prompt on one NPU: milliseconds to tens of them, never the wall's ~0.1 ms
    assert 1 < metrics["ttft_ms"]["median"] < 200


def test_a_busy_controller_adds_its_delays_once_not_one_over_the_scale_times(capsys, tmp_path):
    """At the lab's time scale (0.05: a modelled second in 50 wall ms), with two busy processes on the controller's
    cores, the probe's modelled TTFT is the engine's own modelled TTFT (its --record: wall seconds / scale) plus the
    wall milliseconds the controller, the loopback and the engine's front added, once: the engine stamps every event
    with its wall seconds since arrival and only that part is scaled.  Before, each wall millisecond read as 20."""
    scale = 0.05
    hog = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    try:
        with serving_engine(tmp_path, str(scale)) as (url, record):
            code, env = run_json(capsys, url, "--rate", "20", "--requests", "40", "--output-tokens", "8",
                                 "--prompt-tokens", "64", "--time-scale", "auto", "--record",
                                 str(tmp_path / "client.jsonl"))
    finally:
        for process in hogs:
            process.kill()
            process.wait()
    assert code == 0, env["errors"]
    engine_rows = {row["id"]: row for row in map(json.loads, record.read_text().splitlines())}
    client_rows = [json.loads(line) for line in (tmp_path / "client.jsonl").read_text().splitlines()]
    gaps = sorted(row["ttft_ms"] - (engine_rows[row["id"]]["first_token_time"] - engine_rows[row["id"]]["arrival"])
                  / scale * 1e3 for row in client_rows)
    stamps = env["data"]["engine_stamps"]
    assert stamps is not None and stamps["requests"] == 40, stamps
    # the modelled TTFT exceeds the engine's modelled TTFT by the wall overhead the probe measured, counted once
    # (however busy the machine: that overhead is what it is); scaled, the gap would be 20 times the overhead
    assert probe_metrics.percentile(gaps, 50) == pytest.approx(stamps["wall_overhead_ms_median"], abs=0.05)
    assert gaps[0] >= -0.01


def test_early_stop_ends_a_hopeless_probe_with_exit_6(engine, capsys):
    url, _ = engine
    started = time.monotonic()
    code, env = run_json(capsys, url, "--rate", "50", "--requests", "400", "--output-tokens", "8",
                         "--goodput", "ttft:0.001", "--slo-stat", "p99", "--early-stop")
    assert code == 6
    data = env["data"]
    assert env["exit_code"] == 6 and env["status"] != "success"
    assert data["slo"]["early_stopped"] and not data["slo"]["met"] and "ttft p99" in data["slo"]["reason"]
    # p99 of 400 = x[395] + 0.01 (x[396] - x[395]): with 4 misses and 396 perfect requests to come it is already
    # above 0.001 ms, so the probe stops after about 4 of the 400 requests, not after the 8 s schedule
    finished = data["metrics"]["completed"] + data["metrics"]["failed"]
    assert 4 <= finished <= 10
    assert time.monotonic() - started < 4


def test_slo_missed_without_early_stop_exits_6(engine, capsys):
    url, _ = engine
    code, env = run_json(capsys, url, "--concurrency", "4", "--requests", "8", "--output-tokens", "4",
                         "--goodput", "e2el:0.001")
    assert code == 6 and env["data"]["slo"]["missed"] and env["data"]["metrics"]["completed"] == 8


def test_the_probe_verb_called_directly_reports_through_its_sink(scripted):
    """What the tuner does: the verb with the real prober, progress as records, the result as a value."""
    server = scripted("ok")
    seen: list[dict] = []
    result = probe(HttpProber(), ProbeConfig(url=f"http://127.0.0.1:{server.port}", concurrency=2, requests=5,
                                             output_tokens="3", prompt_tokens="8",
                                             goodput=(Slo("ttft", "p90", 60000.0),)),
                   seen.append)
    assert result.exit_status == 0 and result.errors == ()
    assert result.to_dict()["metrics"]["completed"] == 5 and len(result.result.records) == 5
    assert result.to_dict()["slo"]["met"] is True
    kinds = [event["event"] for event in seen]
    assert kinds == ["dsctl_note", "dsctl_probe_start"] + ["dsctl_probe_request"] * 5
    assert seen[0]["msg"].startswith(f"probing http://127.0.0.1:{server.port}/v1/completions (model scripted)")
    assert seen[1]["total"] == 5 and all(event["success"] for event in seen[2:])


def test_a_concurrency_sweep_prints_one_row_per_level_the_knee_and_the_plot(engine, capsys, tmp_path: Path):
    url, _ = engine
    code = main(["probe", url, "--sweep", "concurrency=1:4:2", "--requests", "6", "--output-tokens", "4",
                 "--prompt-tokens", "16", "--percentiles", "50,99.9", "--run-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Sweep of" in out and "TTFT p99.9" in out and "knee:" in out and f"plot: {tmp_path / 'sweep.png'}" in out
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    table = [line for line in out.splitlines() if line.strip().startswith(("1 ", "4 ")) or "│ 1 " in line
             or "│ 4 " in line]
    assert len(table) >= 2, out


@contextlib.contextmanager
def cpu_hog():
    """A thread of this process that holds the interpreter lock 20 ms at a time (as another busy probe in this
    process, or any Python work beside it, would): the probe's event loop waits for it at each of its wake-ups."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.02)
    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(interval)


def test_a_cpu_starved_probe_says_the_load_generator_was_the_limit(scripted, capsys):
    server = scripted("ok")
    args = (f"http://127.0.0.1:{server.port}", "--rate", "40", "--arrival", "constant", "--requests", "40",
            "--output-tokens", "3", "--prompt-tokens", "8", "--time-scale", "1")
    code, env = run_json(capsys, *args)  # a quiet client first: the same probe is no limit
    assert code == 0, env
    quiet = env["data"]
    assert quiet["limited_by"] is None and quiet["load_generator"]["limited"] is False, quiet["load_generator"]
    assert not any("load generator" in line for line in quiet["warnings"])
    with cpu_hog():
        code, env = run_json(capsys, *args)
    assert code == 0, env  # the requests succeeded: a warning, not a failure
    data = env["data"]
    limit = data["load_generator"]
    assert data["limited_by"] == "load generator" and limit["limited"] is True, limit
    assert limit["send_lag_p50_ms"] > 5.0 and limit["planned_rate"] == pytest.approx(40.0)
    assert limit["client_cpu_percent"] is not None and limit["reason"]
    assert any(line.startswith("the load generator was the limit: planned 40 req/s, offered ")
               for line in data["warnings"]), data["warnings"]
    with cpu_hog():
        code = main(["probe", *args])
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "the load generator was the limit" in line]
    assert code == 0 and len(warned) == 1, err
    assert warned[0].startswith("dsctl: warning: the load generator was the limit: planned 40 req/s, offered ")
    assert "send lag p50 " in warned[0] and "% of a core" in warned[0]
