"""The step scheduler of the emulated serving engine (`dsctl engine serve`).

Pure and clock-free: the caller owns time.  Standard library plus
``dsctl.core.perf.perfmodel`` only (imported lazily), because the engine runs from
a lab host's system python3.

Continuous batching (``stream_num == 1``), modelled on vLLM V1's scheduler:

* One engine iteration at a time.  Its token budget is
  ``max_num_batched_tokens``.  Running requests are served first, in admission
  order: a decode costs one token; a prefill the rest of its prompt (only as
  much as the budget allows when chunked prefill is on; without it a prefill
  that does not fit waits for a later iteration).
* KV is allocated in blocks of ``block_size`` tokens.  When a running request
  needs a block and none is free, the newest running request is preempted
  (recompute: its blocks are freed, it goes to the front of the waiting queue
  and later recomputes prompt + generated tokens).  A step that preempted
  admits nobody.
* Waiting requests are then admitted FIFO while fewer than ``max_num_seqs``
  run, budget is left and their (first chunk of) prompt fits in free blocks;
  otherwise they wait (KV full).
* A request emits a token at the end of the iteration that computed its last
  uncomputed token: the first token when its prefill completes, then one per
  decode iteration.  It finishes after ``max_tokens`` tokens.
* The iteration lasts ``perfmodel.step_seconds(d, prefill_tokens,
  prefill_context, decode_batch, decode_kv_tokens)``.

Fixed-batch multi-stream mode (``stream_num = S > 1``, the CANN 8.0 practice
knob), a Proposed model:

* S streams each run a fixed batch of ``B = max_num_seqs // S`` slots.  An
  idle stream with no requests forms a batch: up to B waiting requests whose
  whole prompt fits in free KV blocks.  It then runs that batch to completion
  (a finished request leaves its slot empty) before admitting anybody else.
  Each stream iteration follows the continuous-batching rules above (budget,
  chunking, blocks, preemption of the stream's newest request) within its
  own batch.
* The streams run concurrently on one chip.  Each stream iteration is its
  own ``step_seconds`` (so every stream reads the weights it touches), made of
  the fixed per-step part ``perfmodel.overhead_seconds`` (scheduling, launch,
  tensor-parallel collectives: host and communication streams, which run in
  parallel across streams) followed by the device part (the rest), which the
  busy streams share equally (processor sharing: with k streams in their
  device part, each progresses at 1/k).  With one stream this is exactly
  continuous batching's ``step_seconds``.
* Trade-offs this makes visible: a new request waits for a whole fixed
  batch to drain (TTFT up, head-of-line blocking), while one stream's
  prefill no longer stalls the other streams' decodes (lower ITL), and one
  stream's overhead and collectives hide behind another's device work.  The
  costs: every stream re-reads the weights, and an emptied slot stays empty
  until its batch ends.  With perfmodel's fixed per-step overhead, S streams
  never beat one continuous batch of S x B on throughput; only a host cost
  that grows with the batch (not in perfmodel) would let them.

Optional seeded jitter multiplies every iteration's work by a factor drawn
from N(1, jitter) (clamped at 0.2).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MIN_JITTER_FACTOR = 0.2
_EPS = 1e-12

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(eq=False)
class Request:
    """One generation request; times are the scheduler's virtual seconds."""

    id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float = 0.0
    # state, owned by the Scheduler
    status: str = WAITING
    num_computed: int = 0
    output_tokens: int = 0
    blocks: int = 0
    stream: int = -1
    preemptions: int = 0
    scheduled_at: float | None = None  # first time any of its tokens was scheduled
    first_token_at: float | None = None
    finished_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    payload: Any = None  # the caller's per-request state (the server's stream object)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decode(self) -> bool:
        return self.output_tokens > 0 and self.uncomputed == 1

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


@dataclass
class _Stream:
    index: int
    running: list[Request] = field(default_factory=list)
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # the iteration in flight
    host_left: float = 0.0  # seconds of per-step overhead left (runs in parallel with other streams)
    device_left: float = 0.0  # seconds of device work left at the whole chip's speed (shared)

    @property
    def busy(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    """Continuous batching (stream_num == 1) or fixed-batch multi-stream (stream_num > 1).

    Drive it with ``add``, then ``step`` (the next iteration's duration and the
    tokens it emitted), or ``poll``/``advance`` when arrivals may interrupt a
    wait (multi-stream mode lets an idle stream start mid-way).
    """

    def __init__(
        self,
        deployment: Any,
        *,
        kv_capacity_tokens: int,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        stream_num: int = 1,
        block_size: int = 128,
        jitter: float = 0.0,
        seed: int = 0,
        step_seconds: Callable[..., float] | None = None,
        overhead_seconds: Callable[[Any], float] | None = None,
    ):
        if max_num_seqs < 1 or max_num_batched_tokens < 1 or block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be positive")
        if not 1 <= stream_num <= max_num_seqs:
            raise ValueError(f"stream_num ({stream_num}) must be between 1 and max_num_seqs ({max_num_seqs})")
        if step_seconds is None or overhead_seconds is None:
            from dsctl.core.perf import perfmodel

            step_seconds = step_seconds or perfmodel.step_seconds
            overhead_seconds = overhead_seconds or perfmodel.overhead_seconds
        self.deployment = deployment
        self._step_seconds = step_seconds
        self._overhead_seconds = overhead_seconds
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.stream_num = stream_num
        self.batch_size = max_num_seqs // stream_num
        self.block_size = block_size
        self.num_blocks = kv_capacity_tokens // block_size
        self.free_blocks = self.num_blocks
        self.jitter = jitter
        self._rng = random.Random(seed)
        self.now = 0.0
        self.waiting: deque[Request] = deque()
        self.streams = [_Stream(i) for i in range(stream_num)]
        self._by_id: dict[str, Request] = {}
        # counters for /metrics
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_iterations = 0
        self.iteration_tokens: list[int] = []  # tokens per completed iteration since the last drain

    # -- queue management -------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request.  Raises ValueError if it could never be scheduled."""
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        if self._blocks_for(request.prompt_tokens + request.max_tokens) > self.num_blocks:
            raise ValueError(f"request {request.id} needs more KV blocks than the cache has ({self.num_blocks})")
        if not self.enable_chunked_prefill and request.prompt_tokens + request.max_tokens > self.max_num_batched_tokens:
            raise ValueError(f"request {request.id} is longer than max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}) and chunked prefill is off")
        if request.id in self._by_id:
            raise ValueError(f"duplicate request id {request.id}")
        request.status = WAITING
        self._by_id[request.id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request (client went away); its blocks are freed at once."""
        request = self._by_id.pop(request_id, None)
        if request is None:
            return False
        if request.status == WAITING:
            self.waiting.remove(request)
        elif request.status == RUNNING:
            self.streams[request.stream].running.remove(request)
        self._free(request)
        request.status = ABORTED
        return True

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s.running or s.busy for s in self.streams)

    # -- stats ------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return sum(len(s.running) for s in self.streams)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return (self.num_blocks - self.free_blocks) / self.num_blocks if self.num_blocks else 0.0

    # -- time -------------------------------------------------------------

    def poll(self) -> float | None:
        """Start an iteration on every idle stream that has work; seconds until the next internal event.

        None when idle.  An event is an iteration ending, or (multi-stream) a stream moving from its
        overhead to its device part; ``advance`` past it returns no tokens in the latter case.
        """
        for stream in self.streams:
            if not stream.busy:
                self._start(stream)
        busy = [s for s in self.streams if s.busy]
        if not busy:
            return None
        sharing = sum(1 for s in busy if s.host_left <= 0) or 1
        return min(s.host_left if s.host_left > 0 else s.device_left * sharing for s in busy)

    def advance(self, seconds: float) -> list[tuple[Request, int]]:
        """Let ``seconds`` pass; finish the iterations that end by then.  Returns (request, tokens) events."""
        seconds = max(seconds, 0.0)
        events: list[tuple[Request, int]] = []
        while True:
            busy = [s for s in self.streams if s.busy]
            if not busy:
                self.now += seconds
                return events
            sharing = sum(1 for s in busy if s.host_left <= 0) or 1
            nxt = min(s.host_left if s.host_left > 0 else s.device_left * sharing for s in busy)
            dt = min(seconds, nxt)
            self.now += dt
            seconds -= dt
            for stream in busy:
                if stream.host_left > 0:
                    stream.host_left -= dt
                    if stream.host_left <= _EPS:
                        stream.host_left = 0.0
                else:
                    stream.device_left -= dt / sharing
                    if stream.device_left <= _EPS:
                        events.extend(self._complete(stream))
            if seconds <= _EPS:
                return events

    def step(self) -> tuple[float, list[tuple[Request, int]]]:
        """Run until at least one iteration ends: (seconds elapsed, events).  (0.0, []) when idle."""
        elapsed = 0.0
        while True:
            wait = self.poll()
            if wait is None:
                return elapsed, []
            elapsed += wait
            events = self.advance(wait)
            if events or not any(s.busy for s in self.streams):
                return elapsed, events

    # -- one iteration ----------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _allocate(self, request: Request, tokens: int) -> bool:
        need = self._blocks_for(tokens) - request.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        request.blocks += need
        return True

    def _free(self, request: Request) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _preempt(self, stream: _Stream) -> Request:
        victim = stream.running.pop()
        self._free(victim)
        victim.num_computed = 0
        victim.status = WAITING
        victim.stream = -1
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _admit(self, stream: _Stream, request: Request) -> None:
        self.waiting.popleft()
        request.status = RUNNING
        request.stream = stream.index
        stream.running.append(request)

    def _start(self, stream: _Stream) -> None:
        if self.stream_num > 1 and not stream.running:
            self._form_batch(stream)
        scheduled = self._plan(stream)
        if not scheduled:
            return
        prefill_tokens = prefill_context = decode_batch = decode_kv = 0
        for request, tokens in scheduled:
            if request.scheduled_at is None:
                request.scheduled_at = self.now
            if request.is_decode:
                decode_batch += 1
                decode_kv += request.num_computed + 1
            else:
                prefill_tokens += tokens
                prefill_context += request.num_computed
        work = self._step_seconds(self.deployment, prefill_tokens, prefill_context, decode_batch, decode_kv)
        if self.jitter:
            work *= max(MIN_JITTER_FACTOR, self._rng.gauss(1.0, self.jitter))
        work = max(work, 1e-6)
        stream.scheduled = scheduled
        if self.stream_num == 1:  # one phase: exactly step_seconds
            stream.host_left, stream.device_left = 0.0, work
        else:
            host = min(self._overhead_seconds(self.deployment), work)
            stream.host_left, stream.device_left = host, work - host
            if stream.device_left <= _EPS:
                stream.host_left, stream.device_left = 0.0, work

    def _form_batch(self, stream: _Stream) -> None:
        """Multi-stream mode: an empty stream takes up to B waiting requests whose prompts fit in free KV."""
        while self.waiting and len(stream.running) < self.batch_size:
            request = self.waiting[0]
            if not self._allocate(request, request.num_tokens):
                break
            self._admit(stream, request)

    def _plan(self, stream: _Stream) -> list[tuple[Request, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        index = 0
        while index < len(stream.running) and budget > 0:
            request = stream.running[index]
            tokens = request.uncomputed
            if tokens > budget:
                if not self.enable_chunked_prefill:
                    index += 1  # a whole prefill that does not fit this iteration waits for a later one
                    continue
                tokens = budget
            while not self._allocate(request, request.num_computed + tokens):
                preempted = True
                if self._preempt(stream) is request:
                    break
            if request.status != RUNNING:
                break
            scheduled.append((request, tokens))
            budget -= tokens
            index += 1
        if self.stream_num > 1 or preempted:
            return scheduled
        while self.waiting and len(stream.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            tokens = request.uncomputed
            if tokens > budget:
                if not self.enable_chunked_prefill:
                    break
                tokens = budget
            if not self._allocate(request, request.num_computed + tokens):
                break  # KV full: wait
            self._admit(stream, request)
            scheduled.append((request, tokens))
            budget -= tokens
        return scheduled

    def _complete(self, stream: _Stream) -> list[tuple[Request, int]]:
        events: list[tuple[Request, int]] = []
        total = 0
        for request, tokens in stream.scheduled:
            total += tokens
            if request.status != RUNNING:
                continue  # aborted while in flight
            request.num_computed += tokens
            if request.num_computed < request.num_tokens:
                continue  # a chunk of a longer prefill
            if request.first_token_at is None:
                request.first_token_at = self.now
                self.prompt_tokens_total += request.prompt_tokens
            request.output_tokens += 1
            request.token_times.append(self.now)
            self.generation_tokens_total += 1
            if request.output_tokens >= request.max_tokens:
                request.status = FINISHED
                request.finished_at = self.now
                stream.running.remove(request)
                self._free(request)
                self._by_id.pop(request.id, None)
            events.append((request, 1))
        stream.scheduled = []
        stream.host_left = stream.device_left = 0.0
        self.num_iterations += 1
        self.iteration_tokens.append(total)
        return events


def simulate(scheduler: Scheduler, requests: Iterable[Request], *, horizon: float = math.inf) -> list[Request]:
    """Offline run on the scheduler's virtual clock: requests join at their ``arrival``; returns them when done.

    Arrivals interrupt waits, so an idle stream in multi-stream mode starts as
    soon as a request arrives.  Stops at ``horizon`` seconds if given.
    """
    pending = sorted(requests, key=lambda r: r.arrival)
    done: list[Request] = []
    position = 0
    while position < len(pending) or scheduler.has_work():
        while position < len(pending) and pending[position].arrival <= scheduler.now + 1e-12:
            scheduler.add(pending[position])
            position += 1
        if scheduler.now >= horizon:
            break
        wait = scheduler.poll()
        next_arrival = pending[position].arrival if position < len(pending) else math.inf
        if wait is None:
            if next_arrival == math.inf:
                break  # nothing can run (should not happen: add() rejects what can never fit)
            scheduler.advance(next_arrival - scheduler.now)
            continue
        for request, _ in scheduler.advance(min(wait, next_arrival - scheduler.now)):
            if request.finished:
                done.append(request)
    return done
