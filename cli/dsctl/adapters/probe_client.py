"""Streaming OpenAI client and load driver for `dsctl probe`: raw asyncio, kept-alive connections, no aiohttp.

Fidelity (the goal: client TTFT within 2 ms of the engine's own record at 256 concurrent streams on 2 cores) is
about what happens between a byte reaching the machine and its timestamp:

* On Linux plain-TCP connections are read with ``recvmsg`` and ``SO_TIMESTAMPNS``: every read is stamped with the
  kernel's receive time, so a busy event loop (256 streams, other processes on 2 cores) delays the processing of
  a message but not its timestamp. Elsewhere, and for https, an ``asyncio.Protocol`` stamps
  ``time.perf_counter()`` first thing in ``data_received``.
* Per message the client only de-chunks and splits SSE events with ``bytes.find``, recognises choice-bearing
  messages with one regular expression and which of them carry a token with a few more (the output length
  when the server sends no usage, `_Conn._events`); JSON is parsed only for the usage chunk (or an error
  event). Reads go into one preallocated buffer (a fresh 256 KiB buffer per read costs more than the parsing).
* Connections are kept alive and reused, as aiohttp's pool does for `vllm bench serve`; a request's clock starts
  just before a connection is taken from the pool (or opened), as vLLM's starts just before ``session.post``.

Request ids: a fresh UUID4 per request, sent as ``x-request-id`` (the header vLLM's and our engine's servers
echo and log; some OpenAI-compatible servers reject a value that is not a UUID with HTTP 400). The header can be
renamed or left out (``request_id_header``); the first message's ``id`` is kept too, so a request can be matched
to a server record that was keyed by the server's own id.

Generated text is kept only when asked (``keep_text``: ``--save-text``, ``--tokenizer``): the hot path then keeps
a reference to each text-bearing message's bytes, and the text is parsed out of them once the run has ended
(`ProbeRun.run`), so keeping it costs the measurement no JSON parsing.

A stream that ends without ``data: [DONE]``, or says ``[DONE]`` before any choice carried a ``finish_reason``, is a
failure (``truncated``), not a success: what was cut off is unknown.

Timeouts at every level: connect (``wait_for``), first response byte, idle gap between bytes, total per request
(one watchdog task checks every in-flight request a few times a second, so the hot path only stores a float),
the preflight GET, and a backstop for the whole run. Nothing awaits without a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import platform
import re
import socket
import ssl
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.http_url import parse_http_url
from dsctl.core.load import limits
from dsctl.core.load.probe_metrics import ErrorClass, RequestRecord

_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*(\]?)')
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
# A non-empty generated string inside the choices: completions' "text", chat's "delta.content", reasoning models'
# "reasoning_content" (vLLM) or "reasoning". Searched from the end of the "choices" match, so the keys of the
# envelope before it never count. An empty string, null or a role-only delta does not match.
_TEXT = re.compile(rb'"(?:text|content|reasoning_content|reasoning)"\s*:\s*"(?!")')
# A chat delta that opens the stream with the role (vLLM's and llama.cpp's first message): no token in it.
_ROLE = re.compile(rb'"role"\s*:')
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
# A choice that ends: "finish_reason" with a string ("stop", "length", ...), not null.
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
# What a time-scaled emulated engine adds to each event (dsctl.engine.openai.ENGINE_ELAPSED_KEY); no real server does.
_ENGINE_ELAPSED_KEY = b'"dsctl_engine_elapsed_s"'
_ENGINE_ELAPSED = re.compile(rb'"dsctl_engine_elapsed_s"\s*:\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)')
# RFC 9110 field-name token characters: a request id header name cannot smuggle CR/LF or a colon.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
DEFAULT_REQUEST_ID_HEADER = "x-request-id"
# RFC 9110 5.5 field values: visible ASCII with spaces or tabs inside, none at either end (a parser trims them).
# No CR or LF (a second header or a body smuggled into the request), no other control character, nothing
# outside ASCII (obs-text is obsolete, and the request is encoded as latin-1: a wider character cannot be sent).
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")
_MAX_HEADER = 64 * 1024
_MAX_ERROR_BODY = 4096
_MAX_DOCUMENT = 1 << 20
# One server-sent event (its "data:" lines up to the blank line). vLLM's largest are a chunk with logprobs or the
# final usage chunk, a few KiB; 1 MiB leaves room for top-logprobs of long chunks and still bounds a peer that never
# sends the blank line (unbounded, such a stream grew the buffer to ~250 MB in 40 s and was rescanned on every read).
_MAX_SSE_EVENT = 1 << 20
_MAX_CHUNK_LINE = 4096  # an HTTP/1.1 chunk-size line: hex digits and extensions (RFC 9112 7.1)


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an HTTP header value (one phrase that never repeats the value, which may be
    a secret), or None: the one rule for every header value the client sends (RFC 9110 5.5)."""
    if _HEADER_VALUE.fullmatch(value):
        return None
    if not value.strip():
        return "is empty"
    if any(c in value for c in "\r\n"):
        return "holds a line break (CR or LF), which would end the header and start another"
    if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
        return "holds a control character"
    if any(ord(c) > 0x7E for c in value):
        return "holds a character outside printable ASCII"
    return "starts or ends with a space or tab, which a server trims"


class ProbeError(Exception):
    """The target cannot be used at all (unreachable, not an OpenAI server, bad URL)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    base_path: str  # "" or "/prefix", without a trailing /v1

    @classmethod
    def parse(cls, url: str) -> Target:
        try:
            parsed = parse_http_url(url, default_scheme="http")  # the one URL parser (port 0 refused, not 80)
        except ValueError as invalid:
            raise ValueError(f"URL {url!r}: {invalid}") from None
        base = parsed.path.rstrip("/")
        base = base.removesuffix("/v1")
        return cls(parsed.scheme, parsed.host, parsed.port, base)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``total`` bounds one request; the others default to fractions of it."""

    total: float = 300.0
    connect: float = 10.0
    first_byte: float | None = None  # default: total (server queueing can be long)
    idle: float = 60.0

    def effective(self) -> Timeouts:
        return Timeouts(total=self.total, connect=min(self.connect, self.total),
                        first_byte=min(self.first_byte or self.total, self.total), idle=min(self.idle, self.total))


def _ssl_context(target: Target) -> ssl.SSLContext | None:
    return ssl.create_default_context() if target.scheme == "https" else None


# Kernel receive timestamps (Linux SO_TIMESTAMPNS; the generic value, used by x86-64, arm64 and riscv64): every
# read carries the time its last packet reached the socket, so a busy event loop does not delay the client's clock.
_SO_TIMESTAMPNS = 35 if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "riscv64") else None
_TIMESPEC = struct.Struct("qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_READ_SIZE = 256 * 1024


class _ReadBuffer(threading.local):
    """One read buffer per thread: no large allocation per read, and probes running at once in several threads
    (tune's trial slots, each with its own event loop) never read into each other's bytes."""

    def __init__(self) -> None:
        self.buffer = bytearray(_READ_SIZE)
        self.view = memoryview(self.buffer)
        self.buffers = [self.buffer]


_READ = _ReadBuffer()


class _SocketTransport:
    """A plain-TCP transport for _Conn that reads with recvmsg to get the kernel's receive timestamp."""

    __slots__ = ("loop", "sock", "fd", "conn", "closing", "pending", "stamped", "lags", "buffers", "view")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: _Conn):
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.conn = conn
        self.closing = False
        self.pending = b""
        self.stamped = 0  # reads that carried a kernel timestamp
        self.lags = conn.client.lag_samples  # when measuring: how late the loop got to each read (seconds)
        self.buffers, self.view = _READ.buffers, _READ.view  # created in the loop's thread: that thread's buffer
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            size, ancillary, _, _ = self.sock.recvmsg_into(self.buffers, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._shutdown(exc)
            return
        now = time.perf_counter()
        if not size:
            self._shutdown(None)
            return
        data = self.view[:size].tobytes()  # this thread's buffer (one event loop per thread)
        for level, kind, cdata in ancillary:
            if kind == _SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(cdata) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                age = time.time() - (sec + nsec * 1e-9)
                if 0.0 <= age < 30.0:  # else a clock step: keep the loop's own time
                    now -= age
                    self.stamped += 1
                    if self.lags is not None:
                        self.lags.append(age)
        self.conn.received(data, now)

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        if self.pending:
            self.pending += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._shutdown(exc)
            return
        if sent < len(data):
            self.pending = data[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._shutdown(exc)
            return
        self.pending = self.pending[sent:]
        if not self.pending:
            self.loop.remove_writer(self.fd)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self._shutdown(None)

    def abort(self) -> None:
        self._shutdown(None)

    def _shutdown(self, exc: Exception | None) -> None:
        if self.closing:
            return
        self.closing = True
        self.loop.remove_reader(self.fd)
        if self.pending:
            self.loop.remove_writer(self.fd)
            self.pending = b""
        self.sock.close()
        self.loop.call_soon(self.conn.connection_lost, exc)


class _Conn(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection and its current exchange, which fills a RequestRecord.

    The hot path is data_received -> _dechunk -> _events. States: "active" (an exchange whose record is open),
    "draining" (the record ended at ``data: [DONE]``; the rest of the body is read so that the connection can be
    reused), "idle" (in the client's pool), "closed".
    """

    __slots__ = ("client", "transport", "state", "reused", "idle_since", "retry", "rec", "done", "stream", "last",
                 "got_byte", "headers_done", "head", "chunked", "length", "keep_alive", "raw", "chunk_left", "skip",
                 "complete", "done_seen", "finish_seen", "sse", "body", "body_cap", "finished")

    def __init__(self, client: ProbeClient):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.state = "new"
        self.reused = False
        self.idle_since = 0.0
        self.retry = False
        self.rec: RequestRecord | None = None
        self.done: asyncio.Future | None = None
        self.stream = True
        self.finished = True

    def begin(self, rec: RequestRecord, done: asyncio.Future, stream: bool) -> None:
        self.rec = rec
        self.done = done
        self.stream = stream
        self.state = "active"
        self.retry = False
        self.last = 0.0
        self.got_byte = False
        self.headers_done = False
        self.head = b""
        self.chunked = False
        self.length: int | None = None
        self.keep_alive = False
        self.raw = b""
        self.chunk_left = 0
        self.skip = 0
        self.complete = False
        self.done_seen = False
        self.finish_seen = False
        self.sse = b""
        self.body = bytearray()
        self.body_cap = _MAX_ERROR_BODY if stream else _MAX_DOCUMENT
        self.finished = False
        if self.client.keep_text and stream:
            rec.text_parts = []

    # -- asyncio callbacks --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received(data, time.perf_counter())

    def received(self, data: bytes, now: float) -> None:
        """Bytes that arrived at ``now`` (perf_counter; the kernel's receive time on the plain-TCP path)."""
        self.last = now
        if self.state != "active":
            if self.state == "draining":
                self._drain(data, now)
            else:
                self._close()  # bytes nobody asked for: the connection is no longer in a known state
            return
        self.got_byte = True
        if not self.headers_done:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > _MAX_HEADER:
                    self.fail(ErrorClass.PROTOCOL, "response headers too large", now)
                return
            data = self.head[end + 4:]
            if not self._parse_head(self.head[:end], now):
                return
            self.head = b""
            if not data:
                if self.length == 0:
                    self.complete = True
                    self._body_complete(now)
                return
        if self.chunked:
            data = self._dechunk(data, now)
            if data is None:
                return
        elif self.length is not None:
            self.length -= len(data)
            if self.length <= 0:
                self.complete = True
        if data:
            if self.stream and self.rec.status == 200:  # type: ignore[union-attr]
                self._events(data, now)
            else:
                self.body += data[: max(0, self.body_cap - len(self.body))]
        if self.complete and not self.finished:
            self._body_complete(now)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost finishes the request

    def connection_lost(self, exc: Exception | None) -> None:
        state = self.state
        self.state = "closed"
        if state != "active" or self.finished:
            return
        now = time.perf_counter()
        if not self.headers_done:
            if self.reused and not self.got_byte:
                self.retry = True  # the server had closed this kept-alive connection: try a fresh one
            detail = f"connection closed before a response ({exc})" if exc else "connection closed before a response"
            self.fail(ErrorClass.CONNECTION, detail, now)
        elif exc is not None or self.chunked or (self.length is not None and self.length > 0):
            self.fail(ErrorClass.CONNECTION, f"connection lost mid-response ({exc or 'incomplete body'})", now)
        else:
            self.complete = True
            self._body_complete(now)  # close-delimited body

    # -- parsing --------------------------------------------------------------------------------------------

    def _parse_head(self, head: bytes, now: float) -> bool:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(None, 2)
        try:
            if not status_line[0].startswith(b"HTTP/"):
                raise ValueError
            status = int(status_line[1])
        except (IndexError, ValueError):
            self.fail(ErrorClass.PROTOCOL, f"not an HTTP response: {lines[0][:60]!r}", now)
            return False
        self.rec.status = status  # type: ignore[union-attr]
        keep_alive = status_line[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"content-length":
                try:
                    self.length = int(value.strip())
                except ValueError:
                    self.fail(ErrorClass.PROTOCOL, "bad Content-Length", now)
                    return False
            elif name == b"connection":
                keep_alive = b"close" not in value.lower() and (keep_alive or b"keep-alive" in value.lower())
        if self.chunked:
            self.length = None
        self.keep_alive = keep_alive and (self.chunked or self.length is not None)
        self.headers_done = True
        return True

    def _dechunk(self, data: bytes, now: float) -> bytes | None:
        raw = self.raw + data if self.raw else data
        out: list[bytes] = []
        pos = 0
        size_raw = len(raw)
        while pos < size_raw:
            if self.chunk_left:
                take = min(self.chunk_left, size_raw - pos)
                out.append(raw[pos:pos + take])
                pos += take
                self.chunk_left -= take
                if not self.chunk_left:
                    self.skip = 2
                continue
            if self.skip:
                take = min(self.skip, size_raw - pos)
                pos += take
                self.skip -= take
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                if size_raw - pos > _MAX_CHUNK_LINE:
                    self.fail(ErrorClass.PROTOCOL, f"a chunk-size line over {_MAX_CHUNK_LINE} bytes", now)
                    return None
                break
            try:
                size = int(raw[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self.fail(ErrorClass.PROTOCOL, "bad chunked encoding", now)
                return None
            if size == 0:  # the last chunk: optional trailer lines, then an empty line
                if raw.find(b"\r\n\r\n", eol) < 0:
                    break  # keep "0\r\n..." until the rest arrives
                self.complete = True
                pos = size_raw
                break
            pos = eol + 2
            self.chunk_left = size
        self.raw = raw[pos:] if pos < size_raw else b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _drain(self, data: bytes, now: float) -> None:
        if self.chunked:
            if self._dechunk(data, now) is None:
                return
        elif self.length is not None:
            self.length -= len(data)
            self.complete = self.length <= 0
        if self.complete:
            self._release(now)

    def _events(self, data: bytes, now: float) -> None:
        held = len(self.sse)
        sse = self.sse + data if held else data
        if b"\r" in data or self.sse.endswith(b"\r"):  # the held part is already normalised
            sse = sse.replace(b"\r\n", b"\n")
        start = 0
        # The held part has no blank line in it: look for the first one only where the new bytes begin (two back, for
        # a "\n" or "\r\n" split across reads), not from the start of a long pending event on every read.
        scan = max(0, held - 2)
        while True:
            end = sse.find(b"\n\n", scan)
            scan = end + 2
            if end < 0:
                break
            event = sse[start:end]
            start = end + 2
            if event.startswith(b"data: ") and b"\n" not in event:
                payload = event[6:]
            else:
                payload = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
                if not payload:
                    continue  # comment / keep-alive / other fields
            match = _CHOICES.search(payload)
            if match is not None and not match.group(1):
                rec = self.rec
                times = rec.chunk_times  # type: ignore[union-attr]
                if not times:
                    found = _ID.search(payload)
                    if found is not None:
                        rec.response_id = found.group(1).decode("utf-8", "replace")  # type: ignore[union-attr]
                times.append(now)
                if _ENGINE_ELAPSED_KEY in payload:
                    self._engine_stamp(payload, len(times))
                # Which messages carry a token (the output length without usage). llama.cpp's server sends one
                # message per generated token, with empty text while a token's text is held back (a stop string may
                # be starting), then a last message with finish_reason and no text ("in stream mode, content and
                # tokens are already in last partial chunk"): ggml-org/llama.cpp tools/server/server-context.cpp
                # process_token, send_partial_response, send_final_response; tools/server/server-task.cpp
                # server_task_result_cmpl_partial::to_json_oaicompat. So a message with text, or an empty one that
                # neither opens a chat (role) nor closes the choice (finish_reason), is one token. Still a guess
                # per message: llama.cpp sends no message for a token that ends inside a UTF-8 character, nor for a
                # chat token that changes no delta, and vLLM merges tokens into one message for a slow reader.
                if _TEXT.search(payload, match.end()) is not None:
                    rec.token_messages += 1  # type: ignore[union-attr]
                    if rec.text_parts is not None:  # type: ignore[union-attr]
                        rec.text_parts.append(payload)  # type: ignore[union-attr]  # bytes until the run ends
                    if not self.finish_seen and _FINISH.search(payload, match.end()) is not None:
                        self.finish_seen = True
                elif _FINISH.search(payload, match.end()) is not None:
                    self.finish_seen = True
                elif _ROLE.search(payload, match.end()) is None:
                    rec.token_messages += 1  # type: ignore[union-attr]
                if _USAGE_OBJECT.search(payload) is not None:
                    self._usage(payload, now)
            elif payload.strip() == b"[DONE]":
                self.sse = b""
                self.done_seen = True
                if self.rec.chunk_times and not self.finish_seen:  # type: ignore[union-attr]
                    # vLLM, OpenAI and llama.cpp's server end a completed choice with its finish_reason; a stream
                    # that says [DONE] without one was cut short upstream (a worker restarted behind a proxy)
                    self.fail(ErrorClass.TRUNCATED, "the stream ended without a finish_reason", now, reusable=True)
                    return
                self._finish(now)
                return
            else:
                self._other(payload, now)
            if self.finished:
                return
        if len(sse) - start > _MAX_SSE_EVENT:
            self.sse = b""
            self.fail(ErrorClass.PROTOCOL, f"a server-sent event over {_MAX_SSE_EVENT >> 20} MiB without the blank "
                      "line that ends it", now)
            return
        self.sse = sse[start:] if start < len(sse) else b""

    def _engine_stamp(self, payload: bytes, count: int) -> None:
        """The emulated engine's elapsed seconds for the message just timed (the ``count``-th), aligned with
        chunk_times (nan for earlier messages without one)."""
        found = _ENGINE_ELAPSED.search(payload)
        if found is None:
            return
        rec = self.rec
        stamps = rec.engine_elapsed  # type: ignore[union-attr]
        if stamps is None:
            stamps = rec.engine_elapsed = []  # type: ignore[union-attr]
        stamps.extend([math.nan] * (count - 1 - len(stamps)))
        stamps.append(float(found.group(1)))

    def _usage(self, payload: bytes, now: float) -> None:
        try:
            usage = json.loads(payload).get("usage")
        except (ValueError, AttributeError):
            self.fail(ErrorClass.PROTOCOL, "malformed JSON in the stream", now)
            return
        if isinstance(usage, dict):
            completion = usage.get("completion_tokens")
            prompt = usage.get("prompt_tokens")
            if isinstance(completion, int):
                self.rec.output_tokens = completion  # type: ignore[union-attr]
            if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0:
                self.rec.prompt_tokens = prompt  # type: ignore[union-attr]
                self.rec.server_prompt_tokens = prompt  # type: ignore[union-attr]

    def _other(self, payload: bytes, now: float) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            self.fail(ErrorClass.PROTOCOL, f"malformed SSE message: {payload[:80]!r}", now)
            return
        if not isinstance(obj, dict):
            self.fail(ErrorClass.PROTOCOL, f"unexpected SSE message: {payload[:80]!r}", now)
            return
        error = obj.get("error")
        if error is not None or obj.get("object") == "error":
            info = error if isinstance(error, dict) else obj
            code = info.get("code")
            message = str(info.get("message") or error)[:200]
            cls = ErrorClass.PROTOCOL
            if isinstance(code, int) and 400 <= code < 500:
                cls = ErrorClass.HTTP_4XX
            elif isinstance(code, int) and code >= 500:
                cls = ErrorClass.HTTP_5XX
            self.fail(cls, f"error in stream: {message}", now)
            return
        if isinstance(obj.get("usage"), dict):
            self._usage(payload, now)

    # -- endings --------------------------------------------------------------------------------------------

    def _body_complete(self, now: float) -> None:
        status = self.rec.status or 0  # type: ignore[union-attr]
        if status != 200:
            self.fail(ErrorClass.HTTP_4XX if 400 <= status < 500 else
                      ErrorClass.HTTP_5XX if status >= 500 else ErrorClass.PROTOCOL,
                      f"HTTP {status}: {_error_message(bytes(self.body))}", now, reusable=True)
            return
        if self.stream and self.sse.strip():
            self._events(b"\n\n", now)  # a last event without its blank line
            if self.finished:
                return
        if self.stream and not self.done_seen and self.rec.chunk_times:  # type: ignore[union-attr]
            # vLLM, OpenAI and our engine end every stream with [DONE]; a body that ends before it was cut short
            # (a proxy's timeout, a crashed worker behind a gateway), so its counts and E2EL are not the request's.
            self.fail(ErrorClass.TRUNCATED, "the stream ended without data: [DONE]", now, reusable=True)
            return
        self._finish(now)

    def _end(self, now: float, reusable: bool) -> None:
        self.finished = True
        self.rec.end = now  # type: ignore[union-attr]
        done = self.done
        if reusable and self.keep_alive and self.state == "active":
            if self.complete:
                self._release(now)
            else:
                self.state = "draining"
                self.idle_since = now
                self.client._draining.add(self)
        else:
            self._abort()
        if done is not None and not done.done():
            done.set_result(None)

    def _finish(self, now: float) -> None:
        if self.finished:
            return
        rec = self.rec
        if self.stream and rec.status == 200 and not rec.chunk_times:  # type: ignore[union-attr]
            rec.error = ErrorClass.PROTOCOL  # type: ignore[union-attr]  # vLLM: "Never received a valid chunk"
            rec.error_detail = "the stream ended without a choice-bearing message"  # type: ignore[union-attr]
        self._end(now, True)

    def fail(self, cls: ErrorClass, detail: str, now: float | None = None, reusable: bool = False) -> None:
        if self.finished:
            return
        self.rec.error = cls  # type: ignore[union-attr]
        self.rec.error_detail = detail  # type: ignore[union-attr]
        self._end(time.perf_counter() if now is None else now, reusable)

    def cancel(self) -> None:
        if self.finished:
            return
        self.rec.cancelled = True  # type: ignore[union-attr]
        self._end(time.perf_counter(), False)

    def _release(self, now: float) -> None:
        self.client._draining.discard(self)
        if self.transport is None or self.transport.is_closing():
            self._abort()
            return
        self.state = "idle"
        self.idle_since = now
        self.rec = None
        self.done = None
        self.client._idle.append(self)

    def _close(self) -> None:
        self.client._draining.discard(self)
        self.state = "closed"
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self.client._draining.discard(self)
        self.state = "closed"
        if self.transport is not None:
            self.transport.abort()


def _generated_text(payload: bytes) -> str:
    """The text a choice-bearing message adds: completions' ``text``, chat's ``delta.content`` and reasoning."""
    try:
        choices = json.loads(payload).get("choices") or ()
    except (ValueError, AttributeError):
        return ""
    parts = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        source = delta if isinstance(delta, dict) else choice
        for key in ("reasoning_content", "reasoning", "text", "content"):
            value = source.get(key)
            if isinstance(value, str):
                parts.append(value)
    return "".join(parts)


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            inner = obj.get("error", obj)
            if isinstance(inner, dict):
                text = str(inner.get("message") or inner.get("detail") or inner)
            else:
                text = str(obj.get("message") or obj.get("detail") or inner)
    except ValueError:
        pass
    return " ".join(text.split())[:200] or "(empty body)"


class ProbeClient:
    """Sends requests to one target over a pool of kept-alive connections (as aiohttp does for vLLM's bench), and
    owns the watchdog that enforces the per-request timeouts.

    A connection idle for more than ``max_idle`` seconds is closed rather than reused (uvicorn, which serves vLLM,
    closes idle connections after 5 s); should the server still have closed a reused connection before answering,
    the request is sent once more on a fresh connection with its clock restarted.
    """

    def __init__(self, target: Target, *, api_key: str | None = None, timeouts: Timeouts = Timeouts(),
                 max_idle: float = 2.0, kernel_timestamps: bool = True, lag_samples: list[float] | None = None,
                 request_id_header: str | None = DEFAULT_REQUEST_ID_HEADER, keep_text: bool = False):
        """``request_id_header``: the header that carries each request's id (None: send none). ``keep_text``: keep
        each request's generated text in ``RequestRecord.text_parts``."""
        if request_id_header is not None and not _HEADER_NAME.fullmatch(request_id_header):
            raise ValueError(f"request id header {request_id_header!r}: expected an HTTP header name such as "
                             "x-request-id (letters, digits, '-')")
        self.target = target
        self.keep_text = keep_text
        self._request_id_prefix = f"{request_id_header}: ".encode("latin-1") if request_id_header else None
        self.timeouts = timeouts.effective()
        self.max_idle = max_idle
        self._ssl = _ssl_context(target)
        self._inflight: set[_Conn] = set()
        self._draining: set[_Conn] = set()
        self._idle: list[_Conn] = []
        self._watchdog: asyncio.Task | None = None
        self._addresses: list[Any] | None = None
        self.lag_samples = lag_samples
        self.kernel_timestamps = _SO_TIMESTAMPNS is not None and _ANC_SIZE > 0 and kernel_timestamps
        for header, value in (("Host", target.host_header), ("Authorization", f"Bearer {api_key}" if api_key else "")):
            problem = header_value_problem(value) if value else None
            if problem is not None:  # make_plan refuses it first, naming the option; this is the edge's own guard
                raise ValueError(f"{header} header value {problem}")
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._common = f"Host: {target.host_header}\r\nUser-Agent: dsctl-probe\r\n{auth}".encode("latin-1")

    async def __aenter__(self) -> ProbeClient:
        tick = max(0.02, min(0.25, min(self.timeouts.idle, self.timeouts.first_byte or 1.0) / 10))
        self._watchdog = asyncio.get_running_loop().create_task(self._watch(tick))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel_all()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        for conn in self._idle + list(self._draining):
            conn._abort()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close

    async def _watch(self, tick: float) -> None:
        t = self.timeouts
        while True:
            await asyncio.sleep(tick)
            now = time.perf_counter()
            for conn in list(self._inflight):
                if conn.finished:
                    continue
                sent = conn.rec.sent  # type: ignore[union-attr]
                if now - sent > t.total:
                    conn.fail(ErrorClass.TIMEOUT, f"request exceeded the {t.total:g} s total timeout", now)
                elif not conn.got_byte:
                    if now - sent > t.first_byte:  # type: ignore[operator]
                        conn.fail(ErrorClass.TIMEOUT, f"no response within {t.first_byte:g} s", now)
                elif now - conn.last > t.idle:
                    conn.fail(ErrorClass.TIMEOUT, f"stream idle for {t.idle:g} s", now)
            for conn in list(self._draining):
                if now - max(conn.idle_since, conn.last) > min(t.idle, 5.0):
                    conn._abort()
            if self._idle and now - self._idle[0].idle_since > self.max_idle:
                keep = [c for c in self._idle if now - c.idle_since <= self.max_idle and c.state == "idle"]
                for conn in self._idle:
                    if conn not in keep:
                        conn._close()
                self._idle[:] = keep

    def cancel_all(self) -> None:
        for conn in list(self._inflight):
            conn.cancel()

    def _request_bytes(self, method: str, path: str, body: bytes | None, request_id: str | None) -> bytes:
        head = f"{method} {self.target.base_path}{path} HTTP/1.1\r\n".encode("latin-1") + self._common
        if request_id and self._request_id_prefix is not None:
            head += self._request_id_prefix + request_id.encode("latin-1") + b"\r\n"
        if body is None:
            return head + b"Accept: application/json\r\n\r\n"
        return (head + b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body)

    async def _connection(self, fresh: bool) -> _Conn:
        now = time.perf_counter()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.state == "idle" and now - conn.idle_since <= self.max_idle and conn.transport is not None \
                    and not conn.transport.is_closing():
                conn.reused = True
                return conn
            conn._close()
        loop = asyncio.get_running_loop()
        conn = _Conn(self)
        if self._ssl is not None or not self.kernel_timestamps:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, self.target.host, self.target.port, ssl=self._ssl),
                self.timeouts.connect)
        else:
            await asyncio.wait_for(self._open_socket(loop, conn), self.timeouts.connect)
        return conn

    async def _open_socket(self, loop: asyncio.AbstractEventLoop, conn: _Conn) -> None:
        if self._addresses is None:
            self._addresses = await loop.getaddrinfo(self.target.host, self.target.port, type=socket.SOCK_STREAM)
        error: OSError | None = None
        for family, kind, proto, _, address in self._addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)  # type: ignore[arg-type]
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            conn.connection_made(_SocketTransport(loop, sock, conn))  # type: ignore[arg-type]
            return
        raise error or OSError(f"no address for {self.target.host}")

    async def send(self, rec: RequestRecord, path: str, body: bytes | None, *, stream: bool = True,
                   method: str = "POST") -> bytes | None:
        """Run one request to completion (or failure); the record carries the outcome. Never raises on I/O.
        Returns the response body of a non-streaming request (up to 1 MiB)."""
        loop = asyncio.get_running_loop()
        payload = self._request_bytes(method, path, body, rec.request_id)
        rec.sent = time.perf_counter()
        for attempt in (0, 1):
            try:
                conn = await self._connection(fresh=attempt > 0)
            except TimeoutError:
                rec.error, rec.error_detail = ErrorClass.TIMEOUT, f"connect timed out after {self.timeouts.connect:g} s"
                rec.end = time.perf_counter()
                return None
            except OSError as exc:
                rec.error, rec.error_detail = ErrorClass.CONNECTION, _os_error(exc)
                rec.end = time.perf_counter()
                return None
            done: asyncio.Future = loop.create_future()
            conn.begin(rec, done, stream)
            self._inflight.add(conn)
            try:
                conn.transport.write(payload)  # type: ignore[union-attr]
                await done
            except asyncio.CancelledError:
                conn.cancel()
                raise
            finally:
                self._inflight.discard(conn)
            if conn.retry and attempt == 0 and not rec.cancelled:
                rec.error, rec.error_detail, rec.status, rec.end = None, "", None, math.nan
                rec.chunk_times.clear()
                rec.token_messages, rec.output_tokens, rec.response_id, rec.text_parts = 0, None, None, None
                rec.engine_elapsed = None
                rec.sent = time.perf_counter()
                continue
            return None if stream else bytes(conn.body)
        return None

    async def get_json(self, path: str, timeout: float | None = None) -> tuple[int, Any]:
        """GET a small JSON document. Raises ProbeError on connection trouble or timeout."""
        return await self._document("GET", path, None, min(timeout or self.timeouts.connect, self.timeouts.total))

    async def post_json(self, path: str, body: bytes) -> tuple[int, Any]:
        """POST one non-streamed request (``body`` without ``"stream": true``) and parse its JSON answer (up to
        1 MiB), within the total timeout of a request. Raises ProbeError on connection trouble or timeout."""
        return await self._document("POST", path, body, self.timeouts.total)

    async def _document(self, method: str, path: str, body: bytes | None, limit: float) -> tuple[int, Any]:
        rec = RequestRecord(request_id=new_request_id() if body is not None else "", scheduled=time.perf_counter())
        try:
            answer = await asyncio.wait_for(self.send(rec, path, body, stream=False, method=method), limit + 1.0)
        except TimeoutError:
            raise ProbeError(f"{self.target.url}{path}: no answer within {limit:g} s") from None
        if rec.error in (ErrorClass.CONNECTION, ErrorClass.TIMEOUT) or rec.status is None:
            raise ProbeError(f"cannot reach {self.target.url}: {rec.error_detail}")
        try:
            return rec.status, json.loads(answer) if answer else None
        except ValueError:
            return rec.status, None


def new_request_id() -> str:
    """A fresh request id: a random UUID4 in its canonical form (what servers that validate ids accept)."""
    return str(uuid.uuid4())


def _os_error(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return (exc.strerror or str(exc) or type(exc).__name__).strip()


# -- the load driver ----------------------------------------------------------------------------------------


@dataclass
class Load:
    """How requests are released. ``schedule`` (seconds from start) for an open loop, else a closed loop of
    ``concurrency`` workers. ``concurrency`` also caps an open loop (a semaphore; waiting is client queue time)."""

    schedule: Iterable[float] | None  # iterated once, lazily (`dsctl.core.load.arrivals.Schedule`)
    concurrency: int | None
    requests: int | None
    duration: float | None


@dataclass
class RunResult:
    records: list[RequestRecord]
    warmup: list[RequestRecord]
    duration: float  # measured phase: start -> last response ended (or the stop)
    started_wall: float  # time.time() at the measured start
    perf_to_wall: float  # add to a perf_counter() value to get time.time() (at the start)
    perf_to_wall_end: float = math.nan  # the same offset at the end (the two clocks may drift apart)
    stopped: str | None = None  # early-stop reason
    backstop_hit: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    preflight: Preflight | None = None  # the one request sent before the load, when one was asked for
    # The client's side of the measured phase (`dsctl.core.load.generator_limit`): CPU seconds of this process
    # (every thread), and the share of the machine's CPU time that was busy (None where /proc/stat is not read).
    client_cpu_s: float | None = None
    machine_busy: float | None = None


@dataclass(frozen=True)
class Preflight:
    """The answer to one non-streamed request sent before the load (the --tokenizer check): the HTTP status and
    JSON document, or why there is none (``error``)."""

    status: int | None
    document: Any
    error: str = ""


# body(index) -> (body bytes, planned prompt tokens); index < 0 marks warm-up requests.
BodyFactory = Callable[[int], tuple[bytes, int]]


class ProbeRun:
    """Drives one probe: optional warm-up, then the measured phase. ``on_finish(record)`` is called for each
    measured request that ends; call ``stop(reason)`` (e.g. from it) to end the probe early."""

    def __init__(self, client: ProbeClient, path: str, body: BodyFactory, load: Load, *, warmup: int = 0,
                 on_finish: Callable[[RequestRecord], None] | None = None):
        self.client = client
        self.path = path
        self.body = body
        self.load = load
        self.warmup = warmup
        self.on_finish = on_finish
        self.stopped: str | None = None
        self._stop = asyncio.Event()
        self._waiter: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            self._stop.set()
            if self._waiter is not None:
                _resolve(self._waiter)
            self.client.cancel_all()

    async def _wait_until(self, due: float) -> bool:
        """Sleep until ``due`` (perf_counter) or a stop; False on stop. The selector's timeouts have a 1 ms
        granularity, so the last millisecond is spent yielding to the loop instead of sleeping."""
        loop = asyncio.get_running_loop()
        while True:
            delay = due - time.perf_counter()
            if self._stop.is_set():
                return False
            if delay <= 0:
                return True
            if delay <= _SPIN:
                await asyncio.sleep(0)
                continue
            waiter = loop.create_future()
            self._waiter = waiter
            handle = loop.call_later(delay - _SPIN, _resolve, waiter)
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None

    async def _one(self, rec: RequestRecord, body: bytes, sem: asyncio.Semaphore | None, measured: bool) -> None:
        if sem is not None:
            async with sem:
                if self._stop.is_set():
                    rec.cancelled = True
                    return
                await self.client.send(rec, self.path, body)
        else:
            await self.client.send(rec, self.path, body)
        if measured and self.on_finish is not None and not rec.cancelled:
            self.on_finish(rec)

    async def _warmup(self) -> list[RequestRecord]:
        if self.warmup <= 0:
            return []
        width = max(1, min(self.warmup, self.load.concurrency or self.warmup))
        records: list[RequestRecord] = []
        counter = iter(range(self.warmup))

        async def worker() -> None:
            for i in counter:
                body, planned = self.body(-1 - i)
                rec = RequestRecord(new_request_id(), scheduled=time.perf_counter(), prompt_tokens=planned)
                records.append(rec)
                await self.client.send(rec, self.path, body)

        await asyncio.gather(*(worker() for _ in range(width)))
        return records

    async def run(self, backstop: float | None = None) -> RunResult:
        warm = await self._warmup()
        records: list[RequestRecord] = []
        loop = asyncio.get_running_loop()
        cpu0, machine0 = _process_cpu_s(), machine_cpu_times()
        perf0 = time.perf_counter()
        wall0 = time.time()
        start = perf0
        load = self.load
        backstop_hit = False

        async def open_loop() -> None:
            assert load.schedule is not None
            sem = asyncio.Semaphore(load.concurrency) if load.concurrency else None
            for i, offset in enumerate(load.schedule):
                if self._stop.is_set():
                    break
                body, planned = self.body(i)  # built before the wait, off the critical path
                due = start + offset
                if not await self._wait_until(due):
                    break
                rec = RequestRecord(new_request_id(), scheduled=due, prompt_tokens=planned)
                records.append(rec)
                task = loop.create_task(self._one(rec, body, sem, True))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

        async def closed_loop() -> None:
            deadline = start + load.duration if load.duration is not None else math.inf
            # a closed loop bounded only by --duration still sends at most the cap (its records stay in memory)
            counter = iter(range(load.requests if load.requests is not None else limits.MAX_REQUESTS))

            async def worker() -> None:
                for i in counter:
                    if self._stop.is_set():
                        return
                    body, planned = self.body(i)
                    now = time.perf_counter()
                    if now > deadline:
                        return
                    rec = RequestRecord(new_request_id(), scheduled=now, prompt_tokens=planned)
                    records.append(rec)
                    await self._one(rec, body, None, True)

            await asyncio.gather(*(worker() for _ in range(load.concurrency or 1)))

        main = open_loop() if load.schedule is not None else closed_loop()
        try:
            if backstop is not None:
                await asyncio.wait_for(main, backstop)
            else:
                await main
        except TimeoutError:
            backstop_hit = True
            self.client.cancel_all()
            now = time.perf_counter()
            for rec in records:  # what the backstop cut short timed out; it was not the probe's own choice
                if rec.error is None and (rec.cancelled or math.isnan(rec.end)) and self.stopped is None:
                    rec.cancelled = False
                    rec.error = ErrorClass.TIMEOUT
                    rec.error_detail = "the probe's overall time limit ended the request"
                    rec.end = now
        ended = [r.end for r in records if not math.isnan(r.end)]
        cpu_s, machine = _process_cpu_s() - cpu0, machine_busy(machine0, machine_cpu_times())
        end = time.perf_counter() if self.stopped or backstop_hit or not ended else max(ended)
        for rec in (*warm, *records):  # the kept messages' bytes -> their text, off the measurement
            if rec.text_parts:
                rec.text_parts = [_generated_text(p) if isinstance(p, bytes) else p for p in rec.text_parts]
        # vLLM's duration runs from the start of the schedule to the end of the last request
        return RunResult(records=records, warmup=warm, duration=max(0.0, end - start), started_wall=wall0,
                         perf_to_wall=wall0 - perf0, perf_to_wall_end=time.time() - time.perf_counter(),
                         stopped=self.stopped, backstop_hit=backstop_hit, client_cpu_s=cpu_s, machine_busy=machine)


_SPIN = 0.0015  # seconds before a release time when the dispatcher stops sleeping and yields instead


def _process_cpu_s() -> float:
    """CPU seconds (user + system) of this process, all its threads (the probe's event loops share one
    interpreter lock, so it is the process that runs out of CPU, not one loop). time.process_time reads
    CLOCK_PROCESS_CPUTIME_ID (clock_gettime(2)): nanoseconds, where os.times counts 10-ms clock ticks."""
    return time.process_time()


_PROC_STAT = "/proc/stat"


def machine_cpu_times(path: str = _PROC_STAT) -> tuple[int, int] | None:
    """(busy, total) clock ticks of all the machine's CPUs since boot, from the first line of /proc/stat (proc(5):
    user nice system idle iowait irq softirq steal; guest time is already inside user), or None where there is
    none (not Linux, unreadable)."""
    try:
        with open(path, encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(v) for v in fields[1:9]]
    except ValueError:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait: a CPU waiting on I/O runs nothing
    total = sum(ticks)
    return total - idle, total


def machine_busy(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The busy share of the machine's CPU time between two `machine_cpu_times` readings (None: no reading, or no
    tick passed)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return min(1.0, max(0.0, (after[0] - before[0]) / (after[1] - before[1])))


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
