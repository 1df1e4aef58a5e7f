"""The step scheduler of the emulated serving engine (`dsctl engine serve`).

Pure and clock-free: the caller owns time.  Standard library plus
``dsctl.core.perf.perfmodel`` only (imported lazily), because the engine runs from
a lab host's system python3.

Continuous batching (``mode="continuous"``: vLLM V1, vllm-ascend, MindIE), modelled on vLLM V1's scheduler:

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

Fixed-batch multi-stream mode (``mode="fixed-batch"``: ``--batch-size B --stream-num S``), the CANN 8.0
practice the field guide describes ("the 910B's continuous batching is limited by CANN 8.0's stream
management; only fixed-batch-size multi-stream parallelism is supported", field-practice.md); the rules
below are Proposed (no public source documents the engine's internals):

* S streams each run a batch of up to B requests.  An idle stream forms a batch of up to B waiting
  requests, reserving KV blocks for each one's prompt plus ``max_tokens`` (no preemption), and runs it
  until every request in it has finished before it admits anybody else (a request that arrives meanwhile
  waits for a stream to drain: head-of-line blocking, TTFT up).
* The batch's prompts are prefilled together in one step (no chunking), then it decodes as one fixed
  shape: a finished request's slot stays in the batch as padding, so every decode step costs the formed
  batch size until the longest request ends.  The prefill's attention runs a fused kernel with the
  compressed 2048 x 2048 causal mask (``perfmodel.FUSED_ATTENTION_MASK_BYTES``; torch_npu's
  npu_fusion_attention), not a materialised prompt x prompt mask, so a 128K prompt is limited by its
  activations (prompt tokens x ``perfmodel.activation_bytes_per_token``), not by a 32 GiB mask.
* A stream step is a host part -- the fixed per-step overhead (``perfmodel.overhead_seconds``) plus
  ``host_ms_per_seq`` per sequence (sampling, detokenising, the script's Python), which vLLM V1 overlaps
  with the device but a CANN 8.0 stream runs between its device steps -- followed by a device part (the
  rest of ``step_seconds``, the time the step takes when its stream runs alone).  Host parts of different
  streams run in parallel.  Device parts run concurrently (AscendCL: "different streams execute their tasks
  concurrently"): a step of few rows leaves part of the chip idle (``perfmodel.stream_occupancy``, a guess
  after NVIDIA MPS measurements), which other streams fill; once the occupancies of the streams in their
  device part add up to more than 1 they share the chip in proportion, and every further stream costs a
  contention share (``perfmodel.stream_rates``).  Every stream holds its own workspace
  (``perfmodel.STREAM_WORKSPACE_GB``, engine_config).
* Trade-offs this makes visible: a second and third stream hide host work and fill the cube units a small
  batch leaves idle, and drain a batch more often (throughput and TTFT better), at the price of ITL (each
  stream's step is slower while others run) and memory; past the point where the streams fill the chip,
  each further stream only adds contention and re-reads the weights (throughput falls again).  So the best
  ``stream_num`` for throughput is interior and 1 wins where latency binds: R1-Distill-Qwen-7B on one 910B3,
  batch 8 per stream, prompts uniform 64-1024, outputs 16-192, 200 Poisson requests at 8 req/s, tpot p99
  <= 60 ms (tests/unit/test_evaluate.py::test_streams_pay_where_throughput_binds_not_where_latency_binds):

      stream_num        1     2     3     4     5     6     7     8
      throughput/s   2.22  3.08  3.19  3.08  2.92  2.80  2.65  2.56
      tpot p99 ms      18    27    38    52    65    82    99   117

  and only one stream meets tpot p99 <= 20 ms.  Capacity (the highest of 0.5, 0.75, ... 6 req/s meeting
  tpot p99 <= 60 ms and ttft p99 <= 10 s) by stream_num 1-8: batch 8: 2.25, 3.5, 3.5, 3.25, 1.75, 0.5, 0.5,
  0.5; batch 16: 3.75, 5.5, 6.0, 5.0, 1.5, 0.5, 0.5, 0.5.

Over B in {1, 4, 16, 64} x S in {1, 2, 8} x threshold in {0, 0.15, 0.5} no corner of the grid wins
(tests/unit/test_evaluate.py::test_no_single_corner_wins, prompts 64-1024, 100 Poisson requests): itl p99
<= 20 ms at 1 req/s -> (4, 1, 0.15); e2el p99 <= 15 s at 1 req/s -> (16, 1, 0.15); tpot p99 <= 60 ms at
4 req/s -> (64, 2, 0.15).  No fixed-batch configuration meets ttft p99 <= 200 ms at 4 req/s: a request
waits for a batch to drain.

Knobs with an effect (sources and Proposed rules):

* ``kv_sparse_threshold`` (through ``Deployment.kv_keep_fraction``): less KV reserved per slot (more slots or
  more activation room for long prompts), fewer KV bytes and attention FLOPs per decode step, but recalls of
  dropped pairs from the host (``perfmodel.kv_recall_bytes``, a guess) that grow as dropped^2 and an output
  agreement that falls (``perfmodel.divergence_probability``).  On long contexts the fastest threshold is
  interior; R1-Distill-Qwen-7B, prompts uniform 32K-64K, outputs 1K-2K, batch 2 x 3 streams, 12 requests
  (tests/unit/test_evaluate.py::test_long_context_sparsity_is_best_at_a_moderate_threshold):
  threshold 0 / 0.05 / 0.10 / 0.15 / 0.20 -> 0.04286 / 0.04345 / 0.04356 / 0.04339 / 0.04306 req/s; 0.20 fails
  the 0.9 agreement floor, and batch 2 x 4 streams runs only with sparsity (unsparsified, its long prefills
  run out of activation memory).  The gain is small (~2 %) because such a workload is prefill-bound and
  sparsity shortens only decode; where it matters most is memory.

* ``block_size``: KV allocated in blocks (internal fragmentation); blocks below vllm-ascend's 128 also cost
  attention efficiency: KV reads x (1 + 0.1 x log2(128 / block_size)) (Proposed).
* ``pa_shape_list`` (vllm-ascend FAQ #25: "at some (medium) batch sizes PA is faster" than the default FIA):
  a decode step whose batch size is listed runs PA, whose KV reads take x0.8 for batches 8-64 and x1.3
  outside (Proposed).
* ``enforce_eager``: every step pays ``eager_ms_per_layer`` per layer (no ACLGraph replay); start-up skips
  graph capture and keeps less reserved memory (perfmodel; Proposed).
* ``multistream_overlap_shared_expert``: on a MoE model with shared experts over several chips, half of the
  per-layer collective time hides behind the shared experts (Proposed); no effect on dense models, as in
  vllm-ascend.
* ``enable_prefix_caching``: a request whose leading full blocks (by chained hashes of their tokens) were
  prefilled before skips them (vLLM V1's prefix cache; the cache is bounded by the block count).
* Memory under load: a step whose activations (``perfmodel.step_activation_bytes``) exceed the
  allocator's limit (``perfmodel.activation_limit_bytes``, which reads PYTORCH_NPU_ALLOC_CONF) raises
  `OutOfMemory` with the aclrtMalloc lines: the engine dies, as a real one does.

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
CONTINUOUS = "continuous"
FIXED_BATCH = "fixed-batch"
MODES = (CONTINUOUS, FIXED_BATCH)
# Proposed factors (module docstring)
PA_FAST_BATCHES = (8, 64)
PA_FAST_FACTOR = 0.8
PA_SLOW_FACTOR = 1.3
BLOCK_FACTOR_PER_HALVING = 0.1
SHARED_EXPERT_COMM_HIDDEN = 0.5


class OutOfMemory(Exception):
    """A step could not allocate its activations: the engine dies with these log lines."""

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
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks (prefix caching)
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied at the last admission
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
    device_left: float = 0.0  # seconds of device work left at this stream's lone speed (shared)
    occupancy: float = 1.0  # share of the chip the iteration in flight keeps busy alone (perfmodel.stream_occupancy)
    formed: int = 0  # fixed-batch: requests the running batch was formed with (finished ones stay as padding)

    @property
    def busy(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    """Continuous batching (``mode="continuous"``) or fixed-batch multi-stream (``mode="fixed-batch"``).

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
        batch_size: int | None = None,
        mode: str | None = None,
        block_size: int = 128,
        enable_prefix_caching: bool = False,
        pa_shape_list: Iterable[int] = (),
        enforce_eager: bool = False,
        multistream_overlap_shared_expert: bool = False,
        activation_limit: float | None = None,
        jitter: float = 0.0,
        seed: int = 0,
        step_seconds: Callable[..., float] | None = None,
        overhead_seconds: Callable[[Any], float] | None = None,
    ):
        if mode is None:
            mode = FIXED_BATCH if (stream_num > 1 or batch_size is not None) else CONTINUOUS
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1 or block_size < 1 or stream_num < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens, block_size and stream_num must be positive")
        if mode == CONTINUOUS and stream_num != 1:
            raise ValueError("stream_num is a fixed-batch knob: continuous batching runs one engine loop")
        if mode == FIXED_BATCH:
            if batch_size is None:
                if stream_num > max_num_seqs:
                    raise ValueError(f"stream_num ({stream_num}) must be between 1 and max_num_seqs ({max_num_seqs})")
                batch_size = max_num_seqs // stream_num
            if batch_size < 1:
                raise ValueError(f"batch_size must be positive, got {batch_size}")
            max_num_seqs = batch_size * stream_num
        from dsctl.core.perf import perfmodel

        self._pm = perfmodel
        self.deployment = deployment
        self._step_seconds = step_seconds or perfmodel.step_seconds
        self._overhead_seconds = overhead_seconds or perfmodel.overhead_seconds
        self.mode = mode
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill and mode == CONTINUOUS
        self.stream_num = stream_num
        self.batch_size = batch_size if mode == FIXED_BATCH else max_num_seqs
        self.block_size = block_size
        self.num_blocks = kv_capacity_tokens // block_size
        self.free_blocks = self.num_blocks
        self.enable_prefix_caching = enable_prefix_caching and mode == CONTINUOUS
        self.pa_shapes = frozenset(int(b) for b in pa_shape_list)
        self.enforce_eager = enforce_eager
        self.multistream_overlap_shared_expert = multistream_overlap_shared_expert
        self.activation_limit = activation_limit
        self.jitter = jitter
        self._rng = random.Random(seed)
        self.now = 0.0
        self.waiting: deque[Request] = deque()
        self.streams = [_Stream(i) for i in range(stream_num)]
        self._by_id: dict[str, Request] = {}
        self._prefix_cache: dict[int, None] = {}  # block hash -> (LRU order), at most num_blocks entries
        self._block_factor = 1.0 + BLOCK_FACTOR_PER_HALVING * max(0.0, math.log2(128 / block_size))
        self._extra_overhead = self._fixed_extra_overhead()
        # counters for /metrics
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_iterations = 0
        self.iteration_tokens: list[int] = []  # tokens per completed iteration since the last drain

    def _fixed_extra_overhead(self) -> float:
        d = self.deployment
        efficiency = getattr(d, "efficiency", None)
        model = getattr(d, "model", None)
        if efficiency is None or model is None:
            return 0.0
        extra = model.layers * efficiency.eager_ms_per_layer / 1e3 if self.enforce_eager else 0.0
        if (self.multistream_overlap_shared_expert and model.is_moe and model.shared_experts and d.chips > 1):
            extra -= model.layers * efficiency.comm_ms_per_layer * SHARED_EXPERT_COMM_HIDDEN / 1e3
        return extra

    # -- queue management -------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request.  Raises ValueError if it could never be scheduled."""
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        if self._blocks_for(request.prompt_tokens + request.max_tokens) > self.num_blocks:
            raise ValueError(f"request {request.id} needs more KV blocks than the cache has ({self.num_blocks})")
        if self.mode == FIXED_BATCH and self._blocks_for(request.prompt_tokens + request.max_tokens) > \
                self.num_blocks // self.max_num_seqs:
            raise ValueError(f"request {request.id} is longer than a fixed-batch slot "
                             f"({self.num_blocks // self.max_num_seqs * self.block_size} tokens)")
        if self.mode == CONTINUOUS and not self.enable_chunked_prefill and \
                request.prompt_tokens + request.max_tokens > self.max_num_batched_tokens:
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
        if self.stream_num == 1:  # one stream: no sharing, no phases
            stream = self.streams[0]
            if not stream.scheduled:
                self._start(stream)
            return stream.device_left if stream.scheduled else None
        for stream in self.streams:
            if not stream.scheduled:
                self._start(stream)
        return self._next_event()[0]

    def _next_event(self) -> tuple[float | None, list[_Stream], float]:
        """(seconds to the next phase end or None, busy streams, the device-part streams' speed)."""
        busy = [s for s in self.streams if s.scheduled]
        if not busy:
            return None, busy, 1.0
        rate = self._pm.stream_rates([s.occupancy for s in busy if s.host_left <= 0])
        nxt = math.inf
        for stream in busy:
            value = stream.host_left if stream.host_left > 0 else stream.device_left / rate
            if value < nxt:
                nxt = value
        return nxt, busy, rate

    def advance(self, seconds: float) -> list[tuple[Request, int]]:
        """Let ``seconds`` pass; finish the iterations that end by then.  Returns (request, tokens) events."""
        seconds = max(seconds, 0.0)
        events: list[tuple[Request, int]] = []
        if self.stream_num == 1:
            stream = self.streams[0]
            while stream.scheduled and seconds > _EPS:
                dt = min(seconds, stream.device_left)
                self.now += dt
                seconds -= dt
                stream.device_left -= dt
                if stream.device_left <= _EPS:
                    events.extend(self._complete(stream))
                    break  # the caller polls again before more time passes
            if not stream.scheduled and seconds > _EPS:
                self.now += seconds
            return events
        while True:
            nxt, busy, rate = self._next_event()
            if nxt is None:
                self.now += seconds
                return events
            dt = min(seconds, nxt)
            self.now += dt
            seconds -= dt
            for stream in busy:
                if stream.host_left > 0:
                    stream.host_left -= dt
                    if stream.host_left <= _EPS:
                        stream.host_left = 0.0
                else:
                    stream.device_left -= dt * rate
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

    def _cached_prefix(self, request: Request) -> int:
        """Prompt tokens the prefix cache holds for ``request`` (whole leading blocks, never the last token)."""
        if not self.enable_prefix_caching or not request.block_hashes or request.num_computed:
            return 0
        self.prefix_cache_queries += request.prompt_tokens
        hits = 0
        for block_hash in request.block_hashes:
            if block_hash not in self._prefix_cache:
                break
            hits += 1
        tokens = min(hits * self.block_size, request.prompt_tokens - 1)
        tokens -= tokens % self.block_size
        self.prefix_cache_hits += tokens
        return tokens

    def _remember_prefix(self, request: Request) -> None:
        if not self.enable_prefix_caching:
            return
        cache = self._prefix_cache
        for block_hash in request.block_hashes:
            cache.pop(block_hash, None)
            cache[block_hash] = None
        while len(cache) > self.num_blocks:
            del cache[next(iter(cache))]

    def _kv_factor(self, decode_batch: int) -> float:
        factor = self._block_factor
        if decode_batch and decode_batch in self.pa_shapes:
            low, high = PA_FAST_BATCHES
            factor *= PA_FAST_FACTOR if low <= decode_batch <= high else PA_SLOW_FACTOR
        return factor

    def _start(self, stream: _Stream) -> None:
        if self.mode == FIXED_BATCH:
            if not stream.running:
                self._form_batch(stream)
            scheduled = self._plan_fixed(stream)
        else:
            scheduled = self._plan(stream)
        if not scheduled:
            return
        prefill_tokens = prefill_context = decode_batch = decode_kv = 0
        longest_chunk = longest_sequence = 0
        now = self.now
        for request, tokens in scheduled:
            if request.scheduled_at is None:
                request.scheduled_at = now
            computed = request.num_computed
            if request.output_tokens and request.prompt_tokens + request.output_tokens - computed == 1:  # a decode
                decode_batch += 1
                decode_kv += computed + 1
            else:
                prefill_tokens += tokens
                prefill_context += request.num_computed
                if tokens > longest_chunk:
                    longest_chunk, longest_sequence = tokens, request.num_computed + tokens
        if self.mode == FIXED_BATCH and decode_batch:
            decode_batch = max(decode_batch, stream.formed)  # finished slots still run as padding
        sequences = len(scheduled) if not decode_batch else max(len(scheduled), decode_batch)
        if self.activation_limit is not None:
            need = self._pm.step_activation_bytes(self.deployment, prefill_tokens + decode_batch, sequences,
                                                  longest_chunk, longest_sequence,
                                                  fused_mask=self.mode == FIXED_BATCH)
            if need > self.activation_limit:
                raise OutOfMemory(self._pm.malloc_failure(self.deployment, need, self.activation_limit))
        work = self._step_seconds(self.deployment, prefill_tokens, prefill_context, decode_batch, decode_kv,
                                  kv_factor=self._kv_factor(decode_batch), extra_overhead_s=self._extra_overhead)
        host = 0.0
        if self.mode == FIXED_BATCH:
            efficiency = getattr(self.deployment, "efficiency", None)
            per_seq = efficiency.host_ms_per_seq / 1e3 if efficiency is not None else 0.0
            fixed = min(self._overhead_seconds(self.deployment) + self._extra_overhead, work)
            host = fixed + per_seq * sequences
            work = work - fixed + host
        if self.jitter:
            factor = max(MIN_JITTER_FACTOR, self._rng.gauss(1.0, self.jitter))
            work *= factor
            host *= factor
        work = max(work, 1e-6)
        stream.scheduled = scheduled
        stream.occupancy = self._pm.stream_occupancy(prefill_tokens + decode_batch)
        if self.stream_num == 1:  # one stream: host and device run one after the other, exactly ``work``
            stream.host_left, stream.device_left = 0.0, work
        else:
            stream.host_left, stream.device_left = host, work - host
            if stream.device_left <= _EPS:
                stream.host_left, stream.device_left = 0.0, work

    def _form_batch(self, stream: _Stream) -> None:
        """Fixed-batch mode: an empty stream takes up to B waiting requests, reserving KV for prompt + max_tokens."""
        while self.waiting and len(stream.running) < self.batch_size:
            request = self.waiting[0]
            if not self._allocate(request, request.prompt_tokens + request.max_tokens):
                break
            self._admit(stream, request)
        stream.formed = len(stream.running)

    def _plan_fixed(self, stream: _Stream) -> list[tuple[Request, int]]:
        """The batch's prompts all at once (no chunking), else one decode of every live request."""
        prefills = [(r, r.uncomputed) for r in stream.running if not r.is_decode]
        if prefills:
            return prefills
        return [(r, 1) for r in stream.running]

    def _plan(self, stream: _Stream) -> list[tuple[Request, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        index = 0
        running = stream.running
        block_size = self.block_size
        while index < len(running) and budget > 0:
            request = running[index]
            computed = request.num_computed
            tokens = request.prompt_tokens + request.output_tokens - computed
            if tokens > budget:
                if not self.enable_chunked_prefill:
                    index += 1  # a whole prefill that does not fit this iteration waits for a later one
                    continue
                tokens = budget
            if -(-(computed + tokens) // block_size) <= request.blocks:  # fast path: its blocks suffice
                scheduled.append((request, tokens))
                budget -= tokens
                index += 1
                continue
            while not self._allocate(request, request.num_computed + tokens):
                preempted = True
                if self._preempt(stream) is request:
                    break
            if request.status != RUNNING:
                break
            scheduled.append((request, tokens))
            budget -= tokens
            index += 1
        if preempted:
            return scheduled
        while self.waiting and len(stream.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            cached = self._cached_prefix(request)
            tokens = request.uncomputed - cached
            if tokens > budget:
                if not self.enable_chunked_prefill:
                    break
                tokens = budget
            if not self._allocate(request, request.num_computed + cached + tokens):
                break  # KV full: wait
            request.num_computed += cached
            request.cached_tokens = cached
            self._admit(stream, request)
            scheduled.append((request, tokens))
            budget -= tokens
        return scheduled

    def _complete(self, stream: _Stream) -> list[tuple[Request, int]]:
        events: list[tuple[Request, int]] = []
        total = 0
        now = self.now
        for request, tokens in stream.scheduled:
            total += tokens
            if request.status != RUNNING:
                continue  # aborted while in flight
            request.num_computed += tokens
            if request.num_computed < request.prompt_tokens + request.output_tokens:
                continue  # a chunk of a longer prefill
            if request.first_token_at is None:
                request.first_token_at = now
                self.prompt_tokens_total += request.prompt_tokens
                self._remember_prefix(request)
            request.output_tokens += 1
            request.token_times.append(now)
            self.generation_tokens_total += 1
            if request.output_tokens >= request.max_tokens:
                request.status = FINISHED
                request.finished_at = now
                stream.running.remove(request)
                self._free(request)
                self._by_id.pop(request.id, None)
            events.append((request, 1))
        stream.scheduled = []
        stream.host_left = stream.device_left = 0.0
        if not stream.running:
            stream.formed = 0
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
