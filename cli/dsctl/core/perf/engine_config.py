"""One engine configuration and its start-up arithmetic, shared by the emulated engine and the offline evaluator.

Pure, standard library plus dsctl.core.perf.perfmodel (the engine runs it from a host's system python3).
`plan` does what an engine does before it listens, in order, and raises `StartupFailure` with the real
words where a real one stops:

1. parallelism (``perfmodel.parallel_problem``: heads % tp, KV heads, experts % ep, world size; over several
   ``nodes``: local DP = DP / nodes whole, TP x local DP within a node's NPUs);
2. the configuration's own rules (vLLM's max_num_batched_tokens checks; the fixed-batch engine's slots);
3. memory:
   * continuous batching (vLLM V1, vllm-ascend): vLLM's profiling arithmetic
     ``KV = HBM x utilisation - weights - peak activation - reserved``, the peak growing with
     max_num_batched_tokens and the chunk's sequence (``perfmodel.activation_peak_bytes``); "No available
     memory for the cache blocks" when not positive, the max-seq-len error when it holds less than one
     full-length request;
   * fixed-batch (the CANN 8.0 practice, ``--batch-size B --stream-num S``, Proposed): no profiling run;
     the engine reserves KV for S x B full-length requests at start-up (the guide's
     ``--max_input_len``) and every stream its workspace (``perfmodel.STREAM_WORKSPACE_GB``, a guess:
     per-stream task resources, which AscendCL's fast-launch streams pre-allocate at a memory cost, and
     each stream's own activation workspace), and fails with torch_npu's out-of-memory words when that does
     not fit; what is left serves the activations.
4. the allocator limit under load from PYTORCH_NPU_ALLOC_CONF (``perfmodel.allocator_share``): the
   scheduler raises OutOfMemory when a step needs more.

The layout (tensor_parallel_size, data_parallel_size, enable_expert_parallel, nodes) decides what one plan is:

* one TP group (data_parallel_size 1): ``perfmodel.Deployment(chips=TP)``, as it always was;
* a MoE model in DP groups: one Deployment of all TP x DP chips over ``nodes`` hosts, attention in DP groups of TP
  chips, the experts over all chips (sharded with enable_expert_parallel, else tensor-parallel over all of them:
  vLLM ``FusedMoEParallelConfig.make``).  The DP ranks of a MoE model step together (vLLM's data-parallel
  deployment docs: idle ranks run dummy forward passes; multi-node.md), so the instance is one scheduler whose
  limits are the ranks' together: max_num_seqs and max_num_batched_tokens are per DP rank in vLLM (every DP engine
  core schedules its own), so the instance admits DP x them;
* a dense model in DP groups: DP independent replicas of one TP group each (vLLM: dense DP ranks do not
  synchronise), ``EnginePlan.replicas``; the offline evaluator deals the requests to them (evaluate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

CONTINUOUS = "continuous"
FIXED_BATCH = "fixed-batch"


@dataclass(frozen=True)
class EngineConfig:
    model: str
    chip: str = "910B3"
    mode: str = CONTINUOUS
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    block_size: int = 128
    enable_prefix_caching: bool = False
    enforce_eager: bool = False
    pa_shape_list: tuple[int, ...] = ()
    multistream_overlap_shared_expert: bool = False
    batch_size: int | None = None  # fixed-batch: requests per stream (default max_num_seqs // stream_num)
    stream_num: int = 1
    kv_sparse_threshold: float = 0.0
    weight_bytes: float = 2.0
    alloc_conf: str = ""  # PYTORCH_NPU_ALLOC_CONF the engine runs with ("" = the vendor default)
    visible_npus: int = 8  # NPUs each node shows the engine
    nodes: int = 1  # hosts the instance spans (vllm-ascend Multi-Node-DP: data_parallel_size / nodes ranks on each)
    # The hardware's achieved efficiencies (perfmodel.Efficiency) when they differ from dsctl's profile; None: the
    # profile's.  bench/tune.py runs its ground truth on other figures than the screens' model (a model error).
    efficiency: Any = None

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)


class StartupFailure(Exception):
    """The engine refuses to start: ``message`` as the real engine prints it; ``reason`` its class."""

    def __init__(self, message: str, reason: str = "config"):
        super().__init__(message)
        self.message = message
        self.reason = reason


@dataclass
class EnginePlan:
    config: EngineConfig
    deployment: Any
    keep: float
    max_model_len: int
    batched: int
    batch_size: int | None
    capacity_tokens: int
    kv_budget_bytes: float
    activation_peak: float
    activation_limit: float
    startup_s: float
    log: list[str] = field(default_factory=list)
    replicas: int = 1  # a dense model's DP ranks: independent copies of this plan (the deployment is one of them)

    @property
    def data_parallel(self) -> int:
        """DP ranks the deployment's one scheduler runs together (a MoE model's, stepping in lockstep)."""
        return self.deployment.data_parallel


def plan(config: EngineConfig, perfmodel: Any = None) -> EnginePlan:
    """The started engine's numbers, or StartupFailure."""
    if perfmodel is None:
        from dsctl.core.perf import perfmodel
    from dsctl.errors import DsctlError

    c = config
    if c.mode not in (CONTINUOUS, FIXED_BATCH):
        raise StartupFailure(f"ValueError: unknown scheduling mode {c.mode!r}")
    problem = _layout_problem(c)
    if problem:
        raise StartupFailure(problem, "parallel")
    try:
        chip = perfmodel.chip_by_name(c.chip)
        model = perfmodel.model_by_name(c.model)
        keep = perfmodel.kv_keep_fraction(c.kv_sparse_threshold)
        efficiency = c.efficiency if c.efficiency is not None else perfmodel.load_profiles()[2]
        replicas = 1
        if c.data_parallel_size > 1 and model.is_moe:  # one instance of TP x DP chips, its ranks in lockstep
            d = perfmodel.Deployment(chip=chip, model=model, chips=c.tensor_parallel_size * c.data_parallel_size,
                                     memory_utilization=c.gpu_memory_utilization, weight_bytes=c.weight_bytes,
                                     kv_keep_fraction=keep, efficiency=efficiency, nodes=c.nodes,
                                     expert_parallel=c.enable_expert_parallel, tensor_parallel=c.tensor_parallel_size)
        else:  # one TP group (a dense model's DP ranks: that many of it); a TP group never spans hosts here
            replicas = c.data_parallel_size
            d = perfmodel.Deployment(chip=chip, model=model, chips=c.tensor_parallel_size,
                                     memory_utilization=c.gpu_memory_utilization, weight_bytes=c.weight_bytes,
                                     kv_keep_fraction=keep, efficiency=efficiency)
    except DsctlError as exc:
        raise StartupFailure(f"ValueError: {exc}") from None
    problem = perfmodel.parallel_problem(model, c.tensor_parallel_size, c.data_parallel_size,
                                         c.enable_expert_parallel, c.visible_npus, nodes=c.nodes)
    if problem:
        raise StartupFailure(problem, "parallel")
    max_model_len = c.max_model_len or model.max_model_len
    batched = c.max_num_batched_tokens
    if batched is None:
        batched = 2048 if c.enable_chunked_prefill else max(max_model_len, 2048)
    share = perfmodel.allocator_share(c.alloc_conf)
    startup = perfmodel.startup_seconds(d, c.enforce_eager)
    if c.mode == FIXED_BATCH:
        return _plan_fixed(c, d, keep, max_model_len, batched, share, startup, perfmodel)
    if not c.enable_chunked_prefill and batched < max_model_len:
        raise StartupFailure(
            f"ValueError: max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). This "
            f"effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
            f"sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    if batched < c.max_num_seqs:
        raise StartupFailure(
            f"ValueError: max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
            f"({c.max_num_seqs}).")
    peak = perfmodel.activation_peak_bytes(d, batched, c.max_num_seqs, max_model_len)
    try:
        capacity = perfmodel.check_profiled(d, max_model_len, peak, c.enforce_eager)
    except perfmodel.DoesNotFit as exc:
        raise StartupFailure(str(exc), exc.reason) from None
    budget = perfmodel.profiled_kv_budget_bytes_per_chip(d, peak, c.enforce_eager)
    G = perfmodel.GIB
    total = chip.hbm_gb * perfmodel.GB
    log = [
        "Memory profiling takes 0.50 seconds",
        f"the current vLLM instance can use total_gpu_memory ({total / G:.2f}GiB) x gpu_memory_utilization "
        f"({c.gpu_memory_utilization:.2f}) = {total * c.gpu_memory_utilization / G:.2f}GiB",
        f"model weights take {perfmodel.weights_bytes_per_chip(d) / G:.2f}GiB; non_torch_memory takes "
        f"{perfmodel.reserved_bytes(d, c.enforce_eager) / G:.2f}GiB; PyTorch activation peak memory takes "
        f"{peak / G:.2f}GiB; the rest of the memory reserved for KV Cache is {budget / G:.2f}GiB.",
    ]
    limit = perfmodel.activation_limit_bytes(d, peak, share)
    return EnginePlan(c, d, keep, max_model_len, batched, None, capacity, budget, peak, limit, startup, log,
                      replicas=replicas)


def _plan_fixed(c: EngineConfig, d: Any, keep: float, max_model_len: int, batched: int, share: float,
                startup: float, perfmodel: Any) -> EnginePlan:
    if c.stream_num < 1:
        raise StartupFailure(f"ValueError: --stream-num must be positive, got {c.stream_num}")
    batch = c.batch_size if c.batch_size is not None else c.max_num_seqs // c.stream_num
    if batch < 1:
        raise StartupFailure(f"ValueError: --stream-num ({c.stream_num}) cannot exceed --max-num-seqs "
                             f"({c.max_num_seqs}): each stream runs max_num_seqs/stream_num requests")
    slots = batch * c.stream_num
    blocks_per_slot = math.ceil(max_model_len / c.block_size)
    capacity = slots * blocks_per_slot * c.block_size
    kv_bytes = capacity * perfmodel.kv_bytes_per_token_per_chip(d)
    total = d.chip.hbm_gb * perfmodel.GB
    if perfmodel.weights_bytes_per_chip(d) > total:
        raise StartupFailure(perfmodel._oom_message(d), "weights")
    free = total * c.gpu_memory_utilization - perfmodel.weights_bytes_per_chip(d) - \
        perfmodel.reserved_bytes(d, c.enforce_eager) - c.stream_num * perfmodel.STREAM_WORKSPACE_GB * perfmodel.GB
    G = perfmodel.GIB
    if kv_bytes > free:
        raise StartupFailure(
            f"RuntimeError: NPU out of memory. Tried to allocate {kv_bytes / G:.2f} GiB (NPU 0; {total / G:.2f} GiB "
            f"total capacity; {max(free, 0.0) / G:.2f} GiB free for the KV cache of {c.stream_num} streams x batch "
            f"{batch} x {max_model_len} tokens)", "kv_reserve")
    left = free - kv_bytes
    limit = perfmodel.activation_limit_bytes(d, left, share)
    log = [f"fixed-batch engine: {c.stream_num} streams x batch {batch}, KV reserved for {slots} x {max_model_len} "
           f"tokens ({kv_bytes / G:.2f} GiB), stream workspace {c.stream_num * perfmodel.STREAM_WORKSPACE_GB:.2f} GB, "
           f"{left / G:.2f} GiB left for activations"]
    return EnginePlan(c, d, keep, max_model_len, batched, batch, capacity, kv_bytes, left, limit, startup, log,
                      replicas=1 if d.data_parallel > 1 else c.data_parallel_size)


def scheduler(p: EnginePlan, *, jitter: float = 0.0, seed: int = 0, check_memory: bool = True) -> Any:
    """The engine's scheduler for a started plan."""
    from dsctl.core.perf.engine_sched import Scheduler

    c = p.config
    blocks = p.capacity_tokens // c.block_size
    ranks = p.data_parallel if c.mode == CONTINUOUS else 1  # a MoE model's DP ranks, scheduled as one
    return Scheduler(
        p.deployment, kv_capacity_tokens=blocks * c.block_size, max_num_seqs=c.max_num_seqs * ranks,
        max_num_batched_tokens=p.batched * ranks, enable_chunked_prefill=c.enable_chunked_prefill,
        stream_num=c.stream_num if c.mode == FIXED_BATCH else 1,
        batch_size=p.batch_size, mode=c.mode, block_size=c.block_size,
        enable_prefix_caching=c.enable_prefix_caching, pa_shape_list=c.pa_shape_list,
        enforce_eager=c.enforce_eager, multistream_overlap_shared_expert=c.multistream_overlap_shared_expert,
        activation_limit=p.activation_limit if check_memory else None, jitter=jitter, seed=seed)


def _layout_problem(c: EngineConfig) -> str | None:
    """A multi-node layout vllm-ascend's Multi-Node-DP cannot start, in words close to its own (Proposed), or None.

    One ``vllm serve`` per node with ``--data-parallel-size-local`` = DP / nodes and ``--tensor-parallel-size`` TP:
    the DP ranks spread evenly over the nodes, and TP x local DP NPUs are used on each (multi-node.md; vllm-ascend
    "Multi-Node-DP (DeepSeek)").  A TP group therefore stays inside one node."""
    if c.nodes < 1:
        return f"ValueError: nodes must be at least 1, got {c.nodes}"
    if c.data_parallel_size < 1:
        return f"ValueError: data_parallel_size must be positive, got {c.data_parallel_size}"
    if c.nodes > 1 and c.data_parallel_size % c.nodes:
        return (f"ValueError: data_parallel_size ({c.data_parallel_size}) does not spread over {c.nodes} nodes: "
                f"--data-parallel-size-local is data_parallel_size / nodes on every node")
    return None
