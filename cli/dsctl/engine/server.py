"""The engine's asyncio HTTP/1.1 server and engine loop (standard library only).

HTTP: keep-alive, ``Content-Length`` or chunked request bodies, ``Expect:
100-continue``; JSON responses with ``Content-Length``; SSE streams
(``text/event-stream``) as chunked transfer on HTTP/1.1 and close-delimited on
HTTP/1.0.  Routes: GET /health, /v1/models, /metrics, /version; POST
/v1/completions, /v1/chat/completions.  Unknown paths get FastAPI's 404
``{"detail": "Not Found"}``, wrong methods 405.

Engine loop: the scheduler runs on a virtual clock.  Virtual seconds map to
wall seconds times ``time_scale``, anchored when the engine wakes from idle,
so the loop sleeps until each iteration's modelled end and never accumulates
drift; if the host falls behind it catches up without sleeping.  The engine
loop writes the tokens an iteration emits straight to each stream's
transport, one SSE event per request and iteration, and lets the event loop
run after every ``WRITE_SLICE_SECONDS`` of writing, so that a request that
arrives during a burst of hundreds of writes is read promptly.  A stream
whose transport holds more than ``WRITE_HIGH_WATER`` unsent bytes (a slow
consumer) is left to its handler, which drains and then writes whatever has
accumulated as one event (as vLLM merges outputs a slow consumer has not
read yet).

The record (``--record``) and the TTFT/e2e metrics use wall-clock stamps
taken where vLLM takes them: ``arrival`` when the request's bytes have been
read from the socket (the read that completed it, not the later turn of its
handler on a loop busy writing other streams' tokens; vLLM stamps arrival on
receipt), ``first_token_time`` and ``finish_time`` when the iteration that
produced the token ended, one timestamp per iteration, before any byte is
written (vLLM's ``IterationStats.update_from_output`` uses the engine core
output's ``iteration_timestamp``).  An iteration's first tokens are written
before the other streams' tokens, so a new stream's first byte does not queue
behind hundreds of running streams' events.

Every accepted TCP connection has ``TCP_NODELAY`` set, as vLLM's server has:
it runs under uvloop, whose TCP transport enables ``TCP_NODELAY`` on accepted
sockets (uvloop ``UVTCP.enable_nodelay``).  asyncio's own transport sets it
only when the socket's ``proto`` is ``IPPROTO_TCP``, and a listener made with
``socket.socket(AF_INET, SOCK_STREAM)`` has ``proto`` 0, so without the
explicit option Nagle's algorithm held each stream's second small write until
the client's delayed ACK: about 40 ms on TTFT p99 over kept-alive connections.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.load.tokens import block_hashes, token_units
from dsctl.core.perf.engine_sched import OutOfMemory, Request, Scheduler
from dsctl.engine import cluster as cluster_mod
from dsctl.engine import openai
from dsctl.engine.metrics import EngineMetrics
from dsctl.engine.text import SyntheticText

logger = logging.getLogger("dsctl.engine")

REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 411: "Length Required", 413: "Request Entity Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
# Bounds on what clients can hold (uvicorn's timeout_keep_alive is 5 s; --limit-concurrency answers 503):
IDLE_TIMEOUT_SECONDS = 5.0     # a kept-alive connection with no new request is closed
HEADER_TIMEOUT_SECONDS = 10.0  # a request head must be complete this long after its first byte
BODY_TIMEOUT_SECONDS = 30.0    # and its body this long after the head
MAX_CONNECTIONS = 1000         # more open connections: the longest-idle kept-alive one is closed for the new one, or
                               # (none idle) the new one is answered 503 and closed (fds stay available)
MAX_TRAILER_LINES = 64         # trailer lines after a chunked body; more is 431
MAX_BODY_BYTES_TOTAL = 256 * 1024 * 1024  # request bodies being read at once, over all connections
DISCONNECT_CHECK_SECONDS = 1.0
WRITE_SLICE_SECONDS = 0.0001  # the longest the engine loop writes tokens before it lets the event loop read requests
WRITE_HIGH_WATER = 64 * 1024  # bytes buffered in a transport above which its handler drains and merges events
ROUTES = {"/health": ("GET",), "/v1/models": ("GET",), "/metrics": ("GET",), "/version": ("GET",),
          "/v1/completions": ("POST",), "/v1/chat/completions": ("POST",)}


@dataclass
class ServerConfig:
    served_model_names: list[str]
    model_root: str
    max_model_len: int
    api_key: str | None = None
    time_scale: float = 1.0
    advertised_time_scale: float = 1.0  # the --time-scale asked for (time_scale also carries a CANN slowdown)
    seed: int = 0
    divergence: float = 0.0
    record: str | None = None
    access_log: bool = True
    log_stats_interval: float = 10.0
    version: str = "0.0"
    cann: str | None = None  # the CANN toolkit version the engine found in its environment (None: none)
    cann_toolkit: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class Live:
    """A request in flight: tokens the engine produced and nobody has written yet, and the stream's output side."""

    __slots__ = ("gen", "sreq", "text", "pending", "done", "aborted", "accounted", "recorded", "waiter",
                 "client_id", "arrival_wall", "first_wall", "last_wall", "scheduled_wall", "transport", "chunked",
                 "shaper", "sent")

    def __init__(self, gen: openai.GenerationRequest, sreq: Request, text: SyntheticText, client_id: str,
                 arrival: float | None = None):
        self.gen = gen
        self.sreq = sreq
        self.text = text
        self.pending = 0
        self.done = False  # the scheduler finished it (all tokens produced)
        self.aborted = False
        self.accounted = False  # finished: metrics observed and the record written (when its last token was made)
        self.recorded = False  # finished and answered (a stream: its last event handed to the socket)
        self.waiter: asyncio.Future | None = None
        self.client_id = client_id
        self.arrival_wall = time.time() if arrival is None else arrival
        self.first_wall: float | None = None
        self.last_wall: float | None = None
        self.scheduled_wall: float | None = None
        self.transport: asyncio.WriteTransport | None = None  # a stream whose head has been written
        self.chunked = False
        self.shaper: openai.Shaper | None = None
        self.sent = 0  # tokens written

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        handle = loop.call_later(timeout, self.wake)
        try:
            await self.waiter
        finally:
            handle.cancel()
            self.waiter = None


class Engine:
    def __init__(self, scheduler: Scheduler, config: ServerConfig, metrics: EngineMetrics):
        self.sched = scheduler
        self.config = config
        self.metrics = metrics
        self._wake = asyncio.Event()
        self._anchor_wall = 0.0
        self._anchor_virtual = 0.0
        self._record = open(config.record, "a", buffering=1) if config.record else None  # noqa: SIM115
        self._ids = 0
        self._window_prompt = 0
        self._window_generation = 0
        self.fatal: str | None = None  # the engine core died (out of memory under load): the process exits 1
        self.on_fatal: Any = None
        # A multi-node instance's head (dsctl.engine.cluster.Head): every step needs all its ranks.
        self.cluster: Any = None

    # virtual <-> wall, on the loop's monotonic clock
    def _virtual_to_mono(self, virtual: float) -> float:
        return self._anchor_wall + (virtual - self._anchor_virtual) * self.config.time_scale

    def submit(self, gen: openai.GenerationRequest, client_id: str, arrival: float | None = None) -> Live:
        self._ids += 1
        hashes = block_hashes(token_units(gen.text), self.sched.block_size) \
            if self.sched.enable_prefix_caching and gen.text else ()
        sreq = Request(id=f"{gen.request_id}#{self._ids}", prompt_tokens=gen.prompt_tokens, max_tokens=gen.max_tokens,
                       arrival=self.sched.now, block_hashes=hashes)
        text = SyntheticText(gen.key, seed=self.config.seed, divergence=self.config.divergence)
        live = Live(gen, sreq, text, client_id, arrival)
        sreq.payload = live
        self.sched.add(sreq)
        self._wake.set()
        return live

    def abort(self, live: Live) -> None:
        if live.accounted or live.aborted:
            return
        live.aborted = True
        self.sched.abort(live.sreq.id)
        self.metrics.request_success.inc(1, "abort")
        self._write_record(live, "aborted")
        live.wake()

    async def run(self) -> None:
        try:
            await self._run()
        except (OutOfMemory, cluster_mod.RankLost) as exc:
            # A real engine core dies here (EngineDeadError): every request in flight fails, the server exits.
            self.fatal = str(exc)
            for line in str(exc).splitlines():
                logger.error("%s", line)
            logger.error("EngineCore encountered a fatal error.")
            for request in [r for s in self.sched.streams for r in s.running] + list(self.sched.waiting):
                live = request.payload
                if live is not None and not live.accounted:
                    self.abort(live)
                    if live.transport is not None:
                        live.transport.close()
            if self.on_fatal is not None:
                self.on_fatal()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        multi = self.sched.stream_num > 1
        while True:
            wait = self.sched.poll()
            if wait is None:
                self._wake.clear()
                await self._wake.wait()
                self._anchor_wall = loop.time()
                self._anchor_virtual = self.sched.now
                continue
            if self.cluster is not None:
                lost = self.cluster.lost_ranks()
                if lost:
                    await self._stall(lost)
            end = self.sched.now + wait
            delay = self._virtual_to_mono(end) - loop.time()
            if delay > 0:
                if multi:  # an arrival may let an idle stream start before the next iteration ends
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # behind schedule: catch up, but let the handlers run in between
            virtual_now = self._anchor_virtual + (loop.time() - self._anchor_wall) / scale
            if self.cluster is not None:
                # A rank lost while this step ran (its socket's close reaches the cluster thread a moment after the
                # kill): the step's collective never completed, so none of its tokens may go out.
                lost = self.cluster.lost_ranks()
                if lost:
                    await self._stall(lost)
            events = self.sched.advance(max(0.0, min(end, virtual_now) - self.sched.now))
            await self._deliver(events)

    async def _stall(self, lost: list[int]) -> None:
        """A step that some rank cannot join: the MoE ranks step together (their dispatch/combine is a collective),
        so the step hangs, every request with it, until vLLM's execute_model RPC or HCCL_EXEC_TIMEOUT gives up
        (dsctl.engine.cluster); then the engine core dies.  vLLM logs nothing meanwhile and /health answers 200."""
        timeouts = self.cluster.timeouts
        loop = asyncio.get_running_loop()
        # HCCL_EXEC_TIMEOUT=0 with TP 1: HCCL never gives up, nor does the step.
        scale = self.config.advertised_time_scale
        deadline = None if timeouts.stall_s is None else loop.time() + timeouts.stall_s * scale
        while deadline is None or loop.time() < deadline:
            await asyncio.sleep(0.1 if deadline is None else min(0.1, max(deadline - loop.time(), 0.0)))
            now_lost = self.cluster.lost_ranks()
            if not now_lost:  # a frozen rank that resumed (its heartbeats are back): the collective completes
                return
            lost = now_lost
        raise cluster_mod.RankLost(cluster_mod.stall_report(timeouts, lost, self.cluster.layout.ranks[0]))

    async def _deliver(self, events: list[tuple[Request, int]]) -> None:
        """Hand an iteration's tokens out: streams are written here, one event each; the rest wake their handler."""
        metrics = self.metrics
        for tokens in self.sched.iteration_tokens:
            metrics.iteration_tokens.observe(tokens)
        self.sched.iteration_tokens.clear()
        loop = asyncio.get_running_loop()
        produced = time.time()  # one timestamp for the iteration's outputs, as vLLM's iteration_timestamp
        # first tokens go out first: a stream's TTFT must not wait behind the running streams' events
        events = sorted(events, key=lambda event: event[0].payload.first_wall is not None)
        slice_end = loop.time() + WRITE_SLICE_SECONDS
        for sreq, count in events:
            live: Live = sreq.payload
            if live.aborted:
                continue
            live.pending += count
            self._window_generation += count
            self._stamp(live, produced)
            if sreq.finished:
                live.done = True
                self._finished(live, produced)
            transport = live.transport
            if transport is None:  # not streamed (or its head is not out yet): the handler writes
                if not live.gen.stream and live.done:
                    live.recorded = True
                live.wake()
                continue
            if transport.is_closing():
                self.abort(live)
                continue
            if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                live.wake()  # a slow consumer: its handler drains, then writes what accumulated as one event
                continue
            self.flush(live)
            if loop.time() >= slice_end:
                await asyncio.sleep(0)  # let the loop read requests that arrived during this burst
                slice_end = loop.time() + WRITE_SLICE_SECONDS

    def flush(self, live: Live) -> None:
        """Write a stream's unwritten tokens as one SSE event (the last with the usage chunk, [DONE] and the chunked
        terminator).  Their times were stamped when they were produced (`_deliver`)."""
        count = live.pending
        done = live.done
        transport = live.transport
        if live.recorded or live.aborted or transport is None or (count == 0 and not done):
            return
        live.pending = 0
        shaper: openai.Shaper = live.shaper  # type: ignore[assignment]
        start = live.sent
        live.sent = start + count
        elapsed = None if live.last_wall is None else live.last_wall - live.arrival_wall
        data = shaper.token_chunk(live.text.text(start, count), live.sent, done, elapsed)
        if start == 0 and shaper.chat:
            data = shaper.role_chunk(elapsed) + data
        if done:
            if live.gen.include_usage:
                data += shaper.usage_chunk(live.sent)
            data += shaper.done()
        if live.chunked:
            data = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if done else b"%x\r\n%s\r\n" % (len(data), data)
        transport.write(data)
        if done:
            live.recorded = True
            live.wake()

    def _stamp(self, live: Live, now: float) -> None:
        """Tokens of ``live`` were produced by the iteration that ended at ``now``."""
        metrics = self.metrics
        if live.first_wall is None:
            live.first_wall = now
            sreq = live.sreq
            if sreq.scheduled_at is not None:  # virtual -> loop clock -> wall clock
                ago = asyncio.get_running_loop().time() - self._virtual_to_mono(sreq.scheduled_at)
                live.scheduled_wall = max(live.arrival_wall, now - max(ago, 0.0))
            metrics.ttft.observe(now - live.arrival_wall)
            self._window_prompt += sreq.prompt_tokens
        else:
            metrics.observe_gap(now - (live.last_wall or now))
        live.last_wall = now

    def _finished(self, live: Live, now: float) -> None:
        live.accounted = True
        metrics = self.metrics
        sreq = live.sreq
        first = live.first_wall or now
        scheduled = live.scheduled_wall if live.scheduled_wall is not None else live.arrival_wall
        metrics.request_success.inc(1, "length")
        metrics.e2e.observe(now - live.arrival_wall)
        metrics.queue_time.observe(max(0.0, scheduled - live.arrival_wall))
        metrics.prefill_time.observe(max(0.0, first - scheduled))
        metrics.decode_time.observe(max(0.0, now - first))
        metrics.inference_time.observe(max(0.0, now - scheduled))
        metrics.request_prompt_tokens.observe(sreq.prompt_tokens)
        metrics.request_generation_tokens.observe(sreq.output_tokens)
        metrics.max_tokens_param.observe(sreq.max_tokens)
        self._write_record(live, "finished")

    def _write_record(self, live: Live, status: str) -> None:
        if self._record is None:
            return
        record = {"id": live.client_id, "arrival": live.arrival_wall, "first_token_time": live.first_wall,
                  "finish_time": live.last_wall if status == "finished" else time.time(),
                  "prompt_tokens": live.sreq.prompt_tokens, "output_tokens": live.sreq.output_tokens,
                  "status": status, "request_id": live.gen.request_id, "preemptions": live.sreq.preemptions}
        self._record.write(json.dumps(record) + "\n")

    def render_metrics(self) -> str:
        metrics, sched = self.metrics, self.sched
        metrics.running.set(sched.num_running)
        metrics.waiting.set(sched.num_waiting)
        metrics.kv_cache_usage.set(sched.kv_usage)
        metrics.gpu_cache_usage.set(sched.kv_usage)
        metrics.preemptions.values[""] = float(sched.num_preemptions)
        metrics.prompt_tokens.values[""] = float(sched.prompt_tokens_total)
        metrics.generation_tokens.values[""] = float(sched.generation_tokens_total)
        return metrics.render()

    async def log_stats(self) -> None:
        interval = self.config.log_stats_interval
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            elapsed = max(now - last, 1e-9)
            last = now
            prompt, generation = self._window_prompt / elapsed, self._window_generation / elapsed
            self._window_prompt = self._window_generation = 0
            if not (prompt or generation or self.sched.has_work()):
                continue  # vLLM logs at debug level when idle
            logger.info("Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                        "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: "
                        "0.0%%", prompt, generation, self.sched.num_running, self.sched.num_waiting,
                        self.sched.kv_usage * 100)

    def close(self) -> None:
        if self._record is not None:
            self._record.close()


class HttpError(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


_date_cache: list[Any] = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True)
    return _date_cache[1]


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


class _Reader(asyncio.StreamReader):
    """A StreamReader that remembers when it was last fed (``time.time()`` of the latest socket read)."""

    read_at = 0.0

    def feed_data(self, data: bytes) -> None:
        self.read_at = time.time()
        super().feed_data(data)


async def _first_byte(reader: asyncio.StreamReader) -> None:
    """Wait until the connection has data (or is closed), without consuming it."""
    if not reader._buffer and not reader.at_eof():  # noqa: SLF001 - StreamReader has no public peek
        await reader._wait_for_data("idle")  # noqa: SLF001


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    """TCP_NODELAY on an accepted TCP connection (uvloop's default, which vLLM's server runs under; see the module
    docstring for why asyncio's own check misses it)."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer is already gone: the handler finds out on its first read
            pass


class HttpServer:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.ready = False
        self.connections: set[asyncio.StreamWriter] = set()
        # kept-alive connections waiting for their next request, oldest first (dicts keep insertion order)
        self.idle: dict[asyncio.StreamWriter, None] = {}
        self.body_bytes_in_flight = 0

    # -- connection ---------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= MAX_CONNECTIONS and self.idle:
            # Room for the new connection at the cost of the longest-idle one (as servers reclaim kept-alive
            # sockets): a client holding a thousand idle connections can no longer make /health answer 503.
            oldest = next(iter(self.idle))
            self.idle.pop(oldest)
            self.connections.discard(oldest)
            oldest.close()
        if len(self.connections) >= MAX_CONNECTIONS:
            self._simple(writer, 503, {"detail": "Service Unavailable"}, False)
            writer.close()
            return
        self.connections.add(writer)
        _set_nodelay(writer)
        peer = writer.get_extra_info("peername") or ("-", 0)
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        try:
            while True:
                self.idle[writer] = None
                try:
                    await asyncio.wait_for(_first_byte(reader), IDLE_TIMEOUT_SECONDS)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    break
                finally:
                    self.idle.pop(writer, None)
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT_SECONDS)
                except (asyncio.IncompleteReadError, TimeoutError):
                    break
                except asyncio.LimitOverrunError:
                    self._simple(writer, 431, {"detail": "Request Header Fields Too Large"}, False)
                    break
                try:
                    method, target, version, headers = self._parse_head(head)
                    keep_alive = self._keep_alive(version, headers)
                    body = await asyncio.wait_for(self._read_body(reader, writer, version, headers),
                                                  BODY_TIMEOUT_SECONDS)
                except TimeoutError:
                    break
                except HttpError as exc:
                    self._simple(writer, exc.status, {"detail": REASONS.get(exc.status, "Bad Request")}, False)
                    break
                # arrival: when the server read the request's last bytes from the socket (vLLM's API server stamps
                # it on receipt), not when this handler got its turn on a loop busy writing other streams' tokens
                arrival = getattr(reader, "read_at", 0.0) or time.time()
                keep_alive = await self.dispatch(reader, writer, method, target, version, headers, body, keep_alive,
                                                 client, arrival)
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections.discard(writer)
            self.idle.pop(writer, None)
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the peer is gone either way
                pass

    @staticmethod
    def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            raise HttpError(400) from None
        if not version.startswith("HTTP/1."):
            raise HttpError(400)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(400)
            headers[name.strip().lower()] = value.strip()
        return method.upper(), target, version, headers

    @staticmethod
    def _keep_alive(version: str, headers: dict[str, str]) -> bool:
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection

    async def _read_body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: str,
                         headers: dict[str, str]) -> bytes:
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length_text = headers.get("content-length")
        if not chunked and not length_text:
            return b""
        announced = 0
        if not chunked:
            try:
                announced = int(length_text or "0")
            except ValueError:
                raise HttpError(400) from None
            if announced < 0:
                raise HttpError(400)
            if announced > MAX_BODY_BYTES:
                raise HttpError(413)
            if self.body_bytes_in_flight + announced > MAX_BODY_BYTES_TOTAL:
                raise HttpError(503)
        if headers.get("expect", "").lower() == "100-continue" and version == "HTTP/1.1":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not chunked:
            self.body_bytes_in_flight += announced
            try:
                return await reader.readexactly(announced)
            finally:
                self.body_bytes_in_flight -= announced
        parts: list[bytes] = []
        total = 0
        try:
            while True:
                try:
                    size_line = await reader.readuntil(b"\r\n")
                except asyncio.LimitOverrunError:  # a chunk-size line longer than the reader's 64 KiB
                    raise HttpError(400) from None
                digits = size_line.split(b";", 1)[0].strip()
                try:
                    size = int(digits, 16)
                except ValueError:
                    raise HttpError(400) from None
                if size < 0 or digits.startswith((b"-", b"+")):  # int() takes a sign; HTTP's chunk-size does not
                    raise HttpError(400)
                if size == 0:
                    for _ in range(MAX_TRAILER_LINES + 1):
                        try:
                            if await reader.readuntil(b"\r\n") == b"\r\n":
                                return b"".join(parts)
                        except asyncio.LimitOverrunError:
                            raise HttpError(431) from None
                    raise HttpError(431)
                if total + size > MAX_BODY_BYTES:
                    raise HttpError(413)
                if self.body_bytes_in_flight + size > MAX_BODY_BYTES_TOTAL:
                    raise HttpError(503)
                total += size
                self.body_bytes_in_flight += size
                parts.append(await reader.readexactly(size))
                if await reader.readexactly(2) != b"\r\n":
                    raise HttpError(400)
        finally:
            self.body_bytes_in_flight -= total

    # -- responses ----------------------------------------------------------

    def _head(self, status: int, content_type: str | None, length: int | None, keep_alive: bool,
              extra: list[tuple[str, str]] | None = None, chunked: bool = False) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}", f"date: {_http_date()}", "server: uvicorn"]
        if length is not None:
            lines.append(f"content-length: {length}")
        if content_type:
            lines.append(f"content-type: {content_type}")
        for name, value in extra or []:
            lines.append(f"{name}: {value}")
        if chunked:
            lines.append("transfer-encoding: chunked")
        if not keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str | None,
              keep_alive: bool, extra: list[tuple[str, str]] | None = None) -> None:
        writer.write(self._head(status, content_type, len(body), keep_alive, extra) + body)

    def _simple(self, writer: asyncio.StreamWriter, status: int, data: Any, keep_alive: bool,
                extra: list[tuple[str, str]] | None = None) -> None:
        self._send(writer, status, _json_bytes(data), "application/json", keep_alive, extra)

    def _access(self, client: str, method: str, target: str, version: str, status: int) -> None:
        if self.config.access_log:
            sys.stdout.write(f'INFO:     {client} - "{method} {target} {version}" {status} '
                             f'{REASONS.get(status, "")}\n')

    # -- routing ------------------------------------------------------------

    async def dispatch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, target: str,
                       version: str, headers: dict[str, str], body: bytes, keep_alive: bool, client: str,
                       arrival: float | None = None) -> bool:
        path = target.split("?", 1)[0]
        status = 200
        try:
            if path.startswith("/v1") and method != "OPTIONS" and not openai.authorized(headers,
                                                                                          self.config.api_key):
                status = 401
                self._simple(writer, 401, openai.UNAUTHORIZED, keep_alive)
                return keep_alive
            allowed = ROUTES.get(path)
            if allowed is None:
                status = 404
                self._simple(writer, 404, {"detail": "Not Found"}, keep_alive)
                return keep_alive
            if method not in allowed:
                status = 405
                self._simple(writer, 405, {"detail": "Method Not Allowed"}, keep_alive, [("allow", ", ".join(allowed))])
                return keep_alive
            if path == "/health":
                status = 200 if self.ready else 503
                self._send(writer, status, b"", None, keep_alive)
            elif path == "/metrics":
                self._send(writer, 200, self.engine.render_metrics().encode(),
                           "text/plain; version=0.0.4; charset=utf-8", keep_alive)
            elif path == "/v1/models":
                self._simple(writer, 200, openai.models_body(self.config.served_model_names, self.config.model_root,
                                                             self.config.max_model_len, self.config.created),
                             keep_alive)
            elif path == "/version":
                # vLLM's {"version"}, plus what the emulation adds: the CANN it loaded and its time scale (wall
                # seconds per modelled second, without a regressed release's slowdown), so that a probe judges
                # modelled time (dsctl.services.probe).
                self._simple(writer, 200, {"version": self.config.version, "cann": self.config.cann,
                                           "cann_toolkit": self.config.cann_toolkit,
                                           "emulated_time_scale": self.config.advertised_time_scale}, keep_alive)
            else:
                parse = openai.parse_chat if path == "/v1/chat/completions" else openai.parse_completion
                client_id = headers.get("x-request-id") or None
                try:
                    gen = parse(body, self.config.served_model_names, self.config.max_model_len, client_id)
                except openai.ApiError as exc:
                    status = exc.status
                    self._simple(writer, exc.status, exc.body(), keep_alive)
                    return keep_alive
                try:
                    live = self.engine.submit(gen, client_id or gen.request_id, arrival)
                except ValueError as exc:
                    status = 400
                    self._simple(writer, 400, openai.error_body(str(exc), "BadRequestError", 400), keep_alive)
                    return keep_alive
                extra = [("x-request-id", client_id)] if client_id else None
                self._access(client, method, target, version, 200)
                if gen.stream:
                    return await self._stream(reader, writer, live, version, keep_alive, extra)
                return await self._complete(reader, writer, live, keep_alive, extra)
            return keep_alive
        finally:
            if path not in ("/v1/completions", "/v1/chat/completions") or status != 200:
                self._access(client, method, target, version, status)

    async def _complete(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, live: Live,
                        keep_alive: bool, extra: list[tuple[str, str]] | None) -> bool:
        while not live.done:
            await live.wait(DISCONNECT_CHECK_SECONDS)
            if not live.done and (reader.at_eof() or writer.is_closing()):
                self.engine.abort(live)
                return False
        shaper = openai.Shaper(live.gen)
        output = live.sreq.output_tokens
        self._simple(writer, 200, shaper.response(live.text.text(0, output), output), keep_alive, extra)
        return keep_alive

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, live: Live, version: str,
                      keep_alive: bool, extra: list[tuple[str, str]] | None) -> bool:
        """Write the head, then leave the events to the engine loop (``Engine.flush``); step in for a slow consumer
        (drain, then write what accumulated) and watch for a client that went away."""
        chunked = version == "HTTP/1.1"
        keep_alive = keep_alive and chunked
        writer.write(self._head(200, "text/event-stream; charset=utf-8", None, keep_alive, extra, chunked=chunked))
        live.chunked = chunked
        live.shaper = openai.Shaper(live.gen, stamps=self.config.advertised_time_scale != 1.0)
        live.transport = writer.transport  # type: ignore[assignment]
        engine = self.engine
        try:
            while True:
                if live.pending or (live.done and not live.recorded):
                    await writer.drain()
                    engine.flush(live)
                if live.recorded:
                    return keep_alive
                if live.aborted:
                    return False
                if reader.at_eof() or writer.is_closing():
                    engine.abort(live)
                    return False
                await live.wait(DISCONNECT_CHECK_SECONDS)
        except (ConnectionError, RuntimeError):
            engine.abort(live)
            return False
        finally:
            live.transport = None


async def serve(engine: Engine, server: HttpServer, sock: Any, host: str, port: int, stop: asyncio.Event,
                on_ready: Any = None) -> None:
    """Accept connections on an already bound socket until ``stop`` is set."""
    def dead() -> None:  # EngineDeadError: /health answers 503 until the server has stopped
        server.ready = False
        stop.set()

    engine.on_fatal = dead
    loop_task = asyncio.create_task(engine.run())
    stats_task = asyncio.create_task(engine.log_stats()) if engine.config.log_stats_interval > 0 else None
    loop = asyncio.get_running_loop()

    def protocol() -> asyncio.StreamReaderProtocol:  # asyncio.start_server's, with a reader that stamps its reads
        return asyncio.StreamReaderProtocol(_Reader(limit=MAX_HEADER_BYTES, loop=loop), server.handle, loop=loop)

    aserver = await loop.create_server(protocol, sock=sock, backlog=4096)
    server.ready = True
    if on_ready:
        on_ready()
    try:
        await stop.wait()
    finally:
        aserver.close()
        for writer in list(server.connections):
            writer.close()
        loop_task.cancel()
        if stats_task:
            stats_task.cancel()
        engine.close()


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                           datefmt="%m-%d %H:%M:%S"))
    root = logging.getLogger("dsctl.engine")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        pass
