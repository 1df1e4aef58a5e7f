"""Roofline performance model of one serving deployment (pure; profiles from dsctl/data/profiles.yaml).

Used by ``dsctl estimate`` and by the lab's emulated engine, so both predict the same times from the same
numbers. Every time is a roofline: the larger of "bytes moved / HBM bandwidth" and "FLOPs / compute",
scaled by the efficiency factors, plus fixed per-step overheads. Units: seconds, bytes, FLOPs.

Formulas (N = new tokens, P = tokens already in the context, L = layers, A = ``Model.attn_dim``):

* FLOPs of a forward pass = 2 x active params x tokens (every token runs the active weights once)
  + attention: prefill 4 x L x A x (N x P + N(N+1)/2) (causal: token i attends to P + i tokens),
  decode 4 x L x A x KV tokens read (x the KV keep fraction). ``A = heads x (d_qk + d_v) / 2`` because
  QK^T and AV cost 2 x heads x d_qk + 2 x heads x d_v FLOPs per attended pair; for MLA prefill this is the
  un-absorbed form vLLM uses (d_qk = 192, d_v = 128). At 128K tokens this term dominates DeepSeek-V3's prefill:
  4.3e16 FLOPs of attention against 9.7e15 for the weights. Cross-check: 3 x (2 x 37e9 + attention at 4K)
  = 253 GFLOP per training token, DeepSeek quotes 250 (arXiv 2505.09343).
* Bytes of a step, per chip = the weights the step's tokens touch / chips + the KV it reads / KV shards.
  Dense models touch all weights. A MoE token touches the always-active weights and k of E routed experts,
  so a batch of B tokens touches 1 - (1 - k/E)^B of the routed weights (expected union): batch 1 reads the
  "active" parameters, a large batch reads nearly all of them.
* KV cache: MLA keeps one latent per token and layer that cannot be split over tensor-parallel ranks (every
  rank stores all of it), GQA splits over at most ``kv_heads`` ranks; hence ``kv_shards = min(chips, kv_heads)``.
* Memory per chip: HBM x utilisation = weights / chips + workspace + KV. What is left for KV decides the
  capacity; vLLM's start-up checks decide the failure and its wording (`check_fits`).

* Hosts (``Deployment.nodes``): within one host the collectives cost a fixed latency per layer (chips > 1) and no
  bandwidth -- HCCS moves a decode step's activations in microseconds.  What crosses hosts goes over each NPU's own
  RoCE port, 8x slower than HCCS, and is charged by bytes and messages (``cross_host_seconds``): a tensor-parallel
  group that spans hosts all-reduces over RoCE, and with expert parallelism every MoE layer's dispatch and combine
  send the share of tokens routed to experts on other hosts over RoCE.  One host (``nodes=1``) adds exactly nothing,
  so single-host numbers are the same as without the term.

* Data-parallel attention groups of a MoE model (``Deployment.data_parallel`` > 1, vllm-ascend's Multi-Node-DP
  layout): every DP group holds and reads its own copy of the always-active weights over its TP chips, the routed
  experts are split over all chips, and a request's KV lives in its own group (``kv_shards`` grows with DP: MLA's
  latent, which TP replicates, is split by DP).  The instance's ranks step together (MoE), their work taken as
  balanced.  One DP group gives exactly the plain numbers.

Not modelled: communication bandwidth inside a host (a long prefill's all-to-all over HCCS), overlap of
communication with compute (DeepSeek's two-micro-batch overlap), the imbalance of DP ranks that step together (a
long prefill on one rank holds the others' step; the model spreads every step's work evenly), chunking of long
prefills into several steps (one step overhead per prefill), prefix caching, speculative decoding, pipeline
parallelism.
Tensor parallelism is assumed to scale perfectly inside a host, so chip counts derived from it are lower bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from dsctl import data
from dsctl.errors import UsageError

GB = 1e9
GIB = float(1 << 30)
MIB = float(1 << 20)
KV_DTYPE_BYTES = 2  # the default KV cache dtype is bf16; Model.kv_bytes_per_token is at this dtype

# kv_keep_fraction(): share of KV pairs that always survive sparsification (attention sinks and the recent
# window that sparse-attention schemes keep unconditionally). Inferred; no public tool tunes this knob
# (serving-and-tuning.md s.9.5), so the shape is a model, not a measurement.
KV_KEEP_FLOOR = 0.05
KV_KEEP_SCALE = 0.15 / math.log((1 - KV_KEEP_FLOOR) / (0.60 - KV_KEEP_FLOOR))  # keep(0.15) = 0.60, the guide's anchor
DIVERGENCE_SCALE = 0.5
# kv_recall_bytes(): share of the dropped pairs' attention mass that a decode step has to read back from the host
# copy (guess, see kv_recall_bytes), and the host link it crosses.  HOST_LINK_GBS: PCIe 4.0 x16 is 32 GB/s per
# direction (PCI-SIG); a 910B card's achieved host-to-device copy rate is taken as about that (inferred).
KV_RECALL_SHARE = 0.05
HOST_LINK_GBS = 32.0

# Fixed-batch multi-stream occupancy (engine_sched): a stream alone leaves part of the chip idle when its step has
# few rows (tokens); other streams' steps can use it.  stream_occupancy(rows) = STREAM_OCCUPANCY_MIN + (1 -
# STREAM_OCCUPANCY_MIN) x rows / (rows + STREAM_OCCUPANCY_HALF_ROWS).  Each further stream in its device part slows
# all of them by STREAM_CONTENTION (HBM and cache interference, the runtime switching between streams' tasks);
# every stream holds STREAM_WORKSPACE_GB of its own workspace (a guess: its task resources -- AscendCL's
# aclrtCreateStreamWithConfig fast-launch streams pre-allocate them "at a memory cost" -- and its own operator
# workspace; the field guide's ASCEND_WORKSPACE_SIZE is 1 GB for a whole process).  Sources in stream_occupancy().
STREAM_OCCUPANCY_MIN = 0.6
STREAM_OCCUPANCY_HALF_ROWS = 8.0
STREAM_CONTENTION = 0.05
STREAM_WORKSPACE_GB = 0.25
# torch_npu.npu_fusion_attention with sparse_mode 2/3 (causal) takes "the optimised compressed lower-triangular
# matrix (2048*2048)" as atten_mask (hiascend.com torch_npu API reference, npu_fusion_attention), BOOL: 1 byte each,
# whatever the sequence length.  A fused (flash) attention kernel never materialises the S x S mask.
FUSED_ATTENTION_MASK_BYTES = 2048.0 * 2048.0
# cross_host_seconds(): bytes per element of what collectives move between ranks -- hidden states in the serving
# dtype, bf16 (vLLM's default for DeepSeek; W8A8 checkpoints still exchange bf16 activations).  Proposed: DeepSeek's
# own DeepEP dispatches FP8 and combines BF16 (deepseek-ai/DeepEP README; arXiv 2412.19437 s.3.3), which would
# halve the dispatch bytes; vllm-ascend's default dispatcher is not documented to do so.
ACTIVATION_BYTES = 2.0


@dataclass(frozen=True)
class Chip:
    name: str
    hbm_gb: float
    hbm_bandwidth_gbs: float
    fp16_tflops: float
    source: str
    vendor: str = "ascend"   # "ascend" or "cuda": whose out-of-memory wording a failed load prints
    int8_tops: float = 0.0   # dense INT8 peak for W8A8 weights; 0 = use the FP16 peak
    npus_per_host: int = 0   # chips one server holds (Atlas 800T A2: 8); 0 = unknown
    intra_host_gbs: float = 0.0  # per chip and direction inside a host (HCCS, NVLink); 0 = unknown
    inter_host_gbs: float = 0.0  # per chip and direction between hosts (its own RoCE / IB port); 0 = unknown


@dataclass(frozen=True)
class Model:
    name: str
    total_params_b: float
    active_params_b: float
    layers: int
    attn_dim: int
    kv_bytes_per_token: int  # at the default KV dtype (bf16), summed over all layers
    max_model_len: int
    source: str
    kv_heads: int | None = None  # ranks the KV cache splits over; None = any group size (MLA: 1)
    experts: int = 0             # routed experts per MoE layer; 0 = dense
    experts_per_token: int = 0
    num_heads: int = 0           # attention heads (vLLM: must divide by the tensor-parallel size)
    gqa_kv_heads: int | None = None  # GQA key/value heads (None for MLA, whose latent has no heads)
    hidden_size: int = 0
    ffn_intermediate: int = 0    # MLP width one token runs (MoE: (k + shared) x expert width)
    vocab_size: int = 0
    shared_experts: int = 0
    moe_layers: int = 0          # layers with routed experts (DeepSeek: the first_k_dense_replace layers are dense)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.experts_per_token > 0

    @property
    def moe_layer_count(self) -> int:
        """Layers that dispatch tokens to experts: the profile's ``moe_layers``, else every layer of a MoE model."""
        if not self.is_moe:
            return 0
        return self.moe_layers or self.layers

    @property
    def always_active_params_b(self) -> float:
        """Parameters every token uses (attention, dense layers, shared experts, embeddings).

        Derived from total = always + routed and active = always + routed x k/E, because the profiles give
        only total and active counts, as the model cards do.
        """
        if not self.is_moe:
            return self.active_params_b
        share = self.experts_per_token / self.experts
        return (self.active_params_b - self.total_params_b * share) / (1 - share)


@dataclass(frozen=True)
class Efficiency:
    compute: float        # achieved / peak FLOP/s in prefill
    bandwidth: float      # achieved / peak HBM bandwidth in decode
    workspace_gb: float   # per chip, besides weights and KV
    load_gbs: float       # weight loading at start-up, aggregate
    init_s: float = 0.0             # fixed start-up work besides loading
    step_overhead_ms: float = 0.0   # per engine step
    comm_ms_per_layer: float = 0.0  # per layer and step, only when chips > 1
    reserved_gb: float = 1.0        # the engine's arithmetic: neither weights, KV nor activations (graph pools, HCCL)
    eager_reserved_gb: float = 0.5  # the same with --enforce-eager (no graph pool)
    eager_ms_per_layer: float = 0.0  # --enforce-eager: per layer and step, operators launched one by one
    capture_s: float = 0.0          # part of init_s spent capturing graphs (skipped with --enforce-eager)
    host_ms_per_seq: float = 0.0    # fixed-batch engine: host work per sequence and step, on the critical path
    inter_host_latency_us: float = 0.0  # per collective step that crosses hosts (cross_host_seconds)


def _efficiency(raw: dict[str, Any]) -> Efficiency:
    return Efficiency(
        compute=float(raw["compute"]), bandwidth=float(raw["bandwidth"]), workspace_gb=float(raw["workspace_gb"]),
        load_gbs=float(raw["load_gbs"]), init_s=float(raw.get("init_s", 0.0)),
        step_overhead_ms=float(raw.get("step_overhead_ms", 0.0)),
        comm_ms_per_layer=float(raw.get("comm_ms_per_layer", 0.0)),
        reserved_gb=float(raw.get("reserved_gb", 1.0)), eager_reserved_gb=float(raw.get("eager_reserved_gb", 0.5)),
        eager_ms_per_layer=float(raw.get("eager_ms_per_layer", 0.0)), capture_s=float(raw.get("capture_s", 0.0)),
        host_ms_per_seq=float(raw.get("host_ms_per_seq", 0.0)),
        inter_host_latency_us=float(raw.get("inter_host_latency_us", 0.0)),
    )


DEFAULT_EFFICIENCY = _efficiency(data.load("profiles")["efficiency"])


@dataclass(frozen=True)
class Deployment:
    """One serving instance: ``chips`` NPUs of one kind spread evenly over ``nodes`` hosts.

    Without ``expert_parallel`` the chips are one tensor-parallel group (``tensor_parallel`` 0 or ``chips``).  With it
    (a MoE model; vllm-ascend ``--enable-expert-parallel``, experts sharded over all chips), attention runs in
    data-parallel groups of ``tensor_parallel`` chips (0: the largest divisor of ``chips`` that fits in one host,
    vllm-ascend's Multi-Node-DP layout with TP inside a node).  A MoE model's DP groups without expert parallel
    (``tensor_parallel`` < ``chips``) are vLLM's other MoE layout: the experts' weights tensor-parallel over all DP x TP
    chips (vLLM ``FusedMoEParallelConfig.make``, "flatten_tp_across_dp"), hidden states all-gathered over the DP
    ranks before each MoE layer and reduce-scattered after.  Either way the DP ranks of a MoE model step together.

    Data parallel groups (``data_parallel`` > 1; a dense model's DP ranks are separate replicas, not one
    Deployment): the routed experts are split over all chips, what every token runs (attention, dense layers, shared
    experts, embeddings: ``Model.always_active_params_b``) is held by every DP group over its TP chips, and a request's
    KV cache lives in one DP group only (``kv_shards``).  The scheduler's figures are the instance's (its DP ranks'
    together), taken as balanced over the ranks.  With one DP group (every single-host layout of one TP group) all of
    this is the plain TP arithmetic, to the bit.  ``nodes`` only adds the cross-host term (``cross_host_seconds``).
    """

    chip: Chip
    model: Model
    chips: int = 1                      # NPUs of the instance (the tensor-parallel group without expert parallel)
    memory_utilization: float = 0.9     # --gpu-memory-utilization
    weight_bytes: float = 2.0           # per parameter
    kv_keep_fraction: float = 1.0       # from kv_sparse_threshold, see kv_keep_fraction()
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    nodes: int = 1                      # hosts the chips span, chips / nodes each
    expert_parallel: bool = False       # experts sharded over all chips, tokens dispatched to them (MoE only)
    tensor_parallel: int = 0            # TP group of the attention with expert parallel; 0 = the default above

    def __post_init__(self) -> None:
        if self.chips < 1:
            raise UsageError(f"chips must be at least 1, got {self.chips}")
        if not 1 <= self.nodes <= self.chips:
            raise UsageError(f"nodes must be between 1 and chips ({self.chips}), got {self.nodes}")
        if self.tensor_parallel:
            if self.tensor_parallel < 1 or self.chips % self.tensor_parallel:
                raise UsageError(f"tensor_parallel ({self.tensor_parallel}) must divide chips ({self.chips})")
            if self.tensor_parallel != self.chips and not self.model.is_moe:
                raise UsageError(f"tensor_parallel ({self.tensor_parallel}) must equal chips ({self.chips}) for a "
                                 f"dense model: its chips are one tensor-parallel group (its data-parallel ranks "
                                 f"are separate replicas)")
        if not 0 < self.memory_utilization <= 1:
            raise UsageError(f"gpu_memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.weight_bytes <= 0:
            raise UsageError(f"weight bytes per parameter must be positive, got {self.weight_bytes}")
        if not 0 < self.kv_keep_fraction <= 1:
            raise UsageError(f"kv_keep_fraction must be in (0, 1], got {self.kv_keep_fraction}")

    @property
    def experts_sharded(self) -> bool:
        """Expert parallel in effect: asked for, and the model has routed experts (vLLM ignores it otherwise)."""
        return self.expert_parallel and self.model.is_moe

    @property
    def chips_per_node(self) -> float:
        """NPUs on each host (an uneven split counts as its average; estimate refuses one)."""
        return self.chips / self.nodes

    @property
    def tensor_parallel_size(self) -> int:
        """The attention's tensor-parallel group: all chips without expert parallel; with it ``tensor_parallel``, or
        the largest divisor of chips that fits on one host."""
        if self.tensor_parallel:
            return self.tensor_parallel
        if not self.experts_sharded:
            return self.chips
        per_node = max(1, math.floor(self.chips_per_node))
        if per_node >= self.chips:
            return self.chips
        return max(t for t in range(1, per_node + 1) if self.chips % t == 0)

    @property
    def data_parallel(self) -> int:
        """DP groups of the attention (1: the chips are one TP group)."""
        return self.chips // self.tensor_parallel_size

    @property
    def experts_flattened(self) -> bool:
        """A MoE model in DP groups without expert parallel: its experts tensor-parallel over every chip."""
        return self.model.is_moe and not self.experts_sharded and self.data_parallel > 1

    @property
    def tensor_parallel_nodes(self) -> int:
        """Hosts one tensor-parallel group spans (groups are laid out host by host, as the rank table numbers them)."""
        return max(1, math.ceil(self.tensor_parallel_size / self.chips_per_node - 1e-9))


class DoesNotFit(Exception):
    """The deployment cannot start; the message is what the real engine prints.

    ``reason``: "weights" (loading runs out of HBM: torch_npu / torch OOM), "no_cache_memory" (weights and
    workspace leave nothing for KV) or "max_model_len" (KV holds fewer tokens than one full-length request).
    ``capacity_tokens``: KV capacity the engine computed (0 when it never got that far).
    """

    def __init__(self, message: str, *, reason: str, capacity_tokens: int = 0):
        super().__init__(message)
        self.reason = reason
        self.capacity_tokens = capacity_tokens


# --------------------------------------------------------------------------- profiles


def _chip(name: str, raw: dict[str, Any]) -> Chip:
    return Chip(name=name, hbm_gb=float(raw["hbm_gb"]), hbm_bandwidth_gbs=float(raw["hbm_bandwidth_gbs"]),
                fp16_tflops=float(raw["fp16_tflops"]), source=str(raw["source"]).strip(),
                vendor=str(raw.get("vendor", "ascend")), int8_tops=float(raw.get("int8_tops", 0.0)),
                npus_per_host=int(raw.get("npus_per_host", 0)), intra_host_gbs=float(raw.get("intra_host_gbs", 0.0)),
                inter_host_gbs=float(raw.get("inter_host_gbs", 0.0)))


def _model(name: str, raw: dict[str, Any]) -> Model:
    layers = int(raw["layers"])
    attn_dim = int(raw["num_heads"]) * (int(raw["qk_head_dim"]) + int(raw["v_head_dim"])) // 2
    kv = raw["kv"]
    if kv["kind"] == "gqa":   # separate K and V per KV head
        kv_heads = int(kv["kv_heads"])
        kv_bytes = 2 * layers * kv_heads * int(kv["head_dim"]) * KV_DTYPE_BYTES
    elif kv["kind"] == "mla":  # one compressed latent plus the decoupled RoPE key, shared by K and V
        kv_heads = 1
        kv_bytes = layers * (int(kv["kv_lora_rank"]) + int(kv["qk_rope_head_dim"])) * KV_DTYPE_BYTES
    else:
        raise ValueError(f"profiles.yaml: model {name}: unknown kv kind {kv['kind']!r}")
    return Model(name=name, total_params_b=float(raw["total_params_b"]), active_params_b=float(raw["active_params_b"]),
                 layers=layers, attn_dim=attn_dim, kv_bytes_per_token=kv_bytes, max_model_len=int(raw["max_model_len"]),
                 source=str(raw["source"]).strip(), kv_heads=kv_heads, experts=int(raw.get("experts", 0)),
                 experts_per_token=int(raw.get("experts_per_token", 0)), num_heads=int(raw["num_heads"]),
                 gqa_kv_heads=kv_heads if kv["kind"] == "gqa" else None, hidden_size=int(raw.get("hidden_size", 0)),
                 ffn_intermediate=int(raw.get("ffn_intermediate", 0)), vocab_size=int(raw.get("vocab_size", 0)),
                 shared_experts=int(raw.get("shared_experts", 0)), moe_layers=int(raw.get("moe_layers", 0)))


@cache
def _profiles() -> tuple[dict[str, Chip], dict[str, Model], Efficiency]:
    raw = data.load("profiles")
    chips = {name.lower(): _chip(name, spec) for name, spec in raw["chips"].items()}
    models = {name.lower(): _model(name, spec) for name, spec in raw["models"].items()}
    return chips, models, _efficiency(raw["efficiency"])


def load_profiles() -> tuple[dict[str, Chip], dict[str, Model], Efficiency]:
    """Chips and models keyed by lower-case canonical name, and the default efficiency factors."""
    chips, models, efficiency = _profiles()
    return dict(chips), dict(models), efficiency


def _lookup(kind: str, name: str, table: dict[str, Any], section: dict[str, Any]) -> Any:
    key = name.strip().lower()
    if key in table:
        return table[key]
    for canonical, spec in section.items():
        if key in (alias.lower() for alias in spec.get("aliases", ())):
            return table[canonical.lower()]
    raise UsageError(f"unknown {kind} {name!r}; known {kind}s: {', '.join(section)} "
                     f"(aliases in dsctl/data/profiles.yaml)")


def chip_by_name(name: str) -> Chip:
    return _lookup("chip", name, _profiles()[0], data.load("profiles")["chips"])


def model_by_name(name: str) -> Model:
    return _lookup("model", name, _profiles()[1], data.load("profiles")["models"])


# --------------------------------------------------------------------------- memory


def weights_bytes(d: Deployment) -> float:
    """All weights of the model, once (each chip holds 1/chips of them in one TP group)."""
    return d.model.total_params_b * GB * d.weight_bytes


def weights_bytes_per_chip(d: Deployment) -> float:
    """The weights each chip holds: 1/chips of them in one TP group; in DP groups the routed experts / chips plus
    every DP group's own copy of the always-active weights / TP (Deployment's docstring)."""
    if d.data_parallel == 1:
        return weights_bytes(d) / d.chips
    always = d.model.always_active_params_b * GB * d.weight_bytes
    return always / d.tensor_parallel_size + (weights_bytes(d) - always) / d.chips


def kv_shards(d: Deployment) -> int:
    """How many ways the KV cache splits over the group (the rest of the ranks hold copies).  In DP groups a
    request's KV lives in its group only, split as over a TP group of that size: DP x that, on average per chip."""
    if d.data_parallel == 1:
        return d.chips if d.model.kv_heads is None else max(1, min(d.chips, d.model.kv_heads))
    tp = d.tensor_parallel_size
    return d.data_parallel * (tp if d.model.kv_heads is None else max(1, min(tp, d.model.kv_heads)))


def rank_kv_bytes_per_token_per_chip(d: Deployment) -> float:
    """KV bytes a token of one request takes on each chip of its own DP group (all of them in one TP group)."""
    per_chip = kv_bytes_per_token_per_chip(d)
    return per_chip if d.data_parallel == 1 else per_chip * d.data_parallel


def rank_capacity_tokens(d: Deployment, capacity: int) -> int:
    """Of an instance's KV capacity (tokens), what one DP group holds: the longest request it can serve."""
    return capacity if d.data_parallel == 1 else capacity // d.data_parallel


def kv_bytes_per_token_per_chip(d: Deployment) -> float:
    return d.model.kv_bytes_per_token * d.kv_keep_fraction / kv_shards(d)


def kv_budget_bytes_per_chip(d: Deployment) -> float:
    """HBM each chip has left for KV after weights and workspace; <= 0 means nothing."""
    return (d.chip.hbm_gb * GB * d.memory_utilization - weights_bytes_per_chip(d)
            - d.efficiency.workspace_gb * GB)


def kv_capacity_tokens(d: Deployment) -> int:
    """Tokens the KV cache holds; <= 0 means it does not fit.

    (HBM x util - weights / chips - workspace) per chip / KV bytes per token per chip. When the KV cache
    splits over every rank this is (HBM x chips x util - weights - workspace x chips) / (KV bytes x keep).
    """
    return math.floor(kv_budget_bytes_per_chip(d) / kv_bytes_per_token_per_chip(d))


def _oom_message(d: Deployment) -> str:
    # Loading fills HBM layer by layer; the allocation that fails is the next layer's shard.
    per_chip = weights_bytes_per_chip(d)
    capacity = d.chip.hbm_gb * GB
    shard = per_chip / d.model.layers
    allocated = math.floor(capacity / shard) * shard if shard < capacity else 0.0
    free = capacity - allocated
    if d.chip.vendor == "cuda":
        return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {shard / GIB:.2f} GiB. GPU 0 has a "
                f"total capacity of {capacity / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. Of the allocated "
                f"memory {allocated / GIB:.2f} GiB is allocated by PyTorch")
    # torch_npu's wording (vllm-project/vllm-ascend#1127, #19)
    return (f"RuntimeError: NPU out of memory. Tried to allocate {shard / GIB:.2f} GiB (NPU 0; {capacity / GIB:.2f} "
            f"GiB total capacity; {allocated / GIB:.2f} GiB already allocated; {allocated / GIB:.2f} GiB current "
            f"active; {free / MIB:.2f} MiB free; {allocated / GIB:.2f} GiB reserved in total by PyTorch) If reserved "
            f"memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


# vLLM V1's start-up checks (vllm/v1/core/kv_cache_utils.py; the wording in vllm-project/vllm#2248, #14574 and
# the V1 "To serve at least one request" reports). V0 said instead "The model's max seq len (X) is larger than
# the maximum number of tokens that can be stored in KV cache (Y)"; vllm-ascend is V1-only now.
NO_CACHE_MEMORY = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                   "when initializing the engine.")


def check_fits(d: Deployment, max_model_len: int | None = None) -> int:
    """KV capacity in tokens, or DoesNotFit in the engine's words when the engine would refuse to start."""
    needed_len = d.model.max_model_len if max_model_len is None else max_model_len
    if weights_bytes_per_chip(d) > d.chip.hbm_gb * GB:
        raise DoesNotFit(_oom_message(d), reason="weights")
    budget = kv_budget_bytes_per_chip(d)
    if budget <= 0:
        raise DoesNotFit(NO_CACHE_MEMORY, reason="no_cache_memory")
    capacity = kv_capacity_tokens(d)
    if rank_capacity_tokens(d, capacity) < needed_len:
        needed = needed_len * rank_kv_bytes_per_token_per_chip(d)
        raise DoesNotFit(
            f"ValueError: To serve at least one request with the model's max seq len ({needed_len}), "
            f"{needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget / GIB:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{rank_capacity_tokens(d, capacity)}. Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.",
            reason="max_model_len", capacity_tokens=capacity)
    return capacity


def min_chips_to_fit(d: Deployment, max_model_len: int | None = None, limit: int = 4096) -> int | None:
    """Smallest group size whose KV holds one ``max_model_len`` request (None: not even ``limit`` chips)."""
    def fits(chips: int) -> bool:
        try:
            check_fits(_with_chips(d, chips), max_model_len)
        except DoesNotFit:
            return False
        return True

    # Fitting is monotone in chips: the per-chip weight share shrinks and the KV shards never decrease.
    if not fits(limit):
        return None
    low, high = 1, limit
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _with_chips(d: Deployment, chips: int) -> Deployment:
    # Memory only: where the chips sit and how they are grouped does not change what each one holds.
    return Deployment(chip=d.chip, model=d.model, chips=chips, memory_utilization=d.memory_utilization,
                      weight_bytes=d.weight_bytes, kv_keep_fraction=d.kv_keep_fraction, efficiency=d.efficiency,
                      expert_parallel=d.expert_parallel)


# --------------------------------------------------------------------------- time


def peak_flops(d: Deployment) -> float:
    """Peak FLOP/s of one chip for this weight format: INT8 matmuls for 1-byte (W8A8) weights."""
    if d.weight_bytes <= 1 and d.chip.int8_tops > 0:
        return d.chip.int8_tops * 1e12
    return d.chip.fp16_tflops * 1e12


def touched_params(model: Model, tokens: int) -> float:
    """Parameters (not billions) a forward pass over ``tokens`` tokens reads from HBM."""
    if tokens <= 0:
        return 0.0
    if not model.is_moe:
        return model.active_params_b * GB
    always = model.always_active_params_b
    routed_total = model.total_params_b - always
    touched_share = 1 - (1 - model.experts_per_token / model.experts) ** tokens
    return (always + routed_total * touched_share) * GB


def touched_weight_bytes_per_chip(d: Deployment, tokens: int) -> float:
    """Weight bytes each chip reads in a step over ``tokens`` tokens: the touched weights / chips; in DP groups each
    group reads its own copy of the always-active weights over its TP chips (the routed experts stay / chips)."""
    if d.data_parallel == 1 or tokens <= 0:
        return touched_params(d.model, tokens) * d.weight_bytes / d.chips
    always = d.model.always_active_params_b * GB
    return (always / d.tensor_parallel_size + (touched_params(d.model, tokens) - always) / d.chips) * d.weight_bytes


def prefill_flops(model: Model, new_tokens: int, context_tokens: int = 0) -> float:
    attended_pairs = new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2
    return 2 * model.active_params_b * GB * new_tokens + 4 * model.layers * model.attn_dim * attended_pairs


def decode_flops(model: Model, batch: int, kv_tokens: int, kv_keep: float = 1.0) -> float:
    return 2 * model.active_params_b * GB * batch + 4 * model.layers * model.attn_dim * kv_tokens * kv_keep


def kv_recall_bytes(d: Deployment, kv_tokens: int) -> float:
    """Bytes per chip a decode step over ``kv_tokens`` context tokens reads back from the host for dropped pairs.

    Guess (no public source describes the field guide's server): a threshold on a *dynamic* score can only free
    HBM ("128K-scenario KV cache compressed to 12 GB", field-practice.md) without losing pairs for good if dropped
    pairs stay in host memory and come back when their score rises again, as query-aware sparsity finds it does
    (Quest, arXiv 2406.10774: "the criticality of tokens highly depends on the query").  The share recalled per
    step follows the attention mass the dropped pairs carry, which grows as dropped^2 (the same shape as
    ``divergence_probability``): KV_RECALL_SHARE x (1 - keep)^2 of the full context.  The host link is ~40x
    slower than HBM, so a loose threshold loses in recalls what it saved in reads: the threshold that decodes
    fastest is interior (decode reads fall as dropped, recalls grow as dropped^2).
    """
    dropped = 1.0 - d.kv_keep_fraction
    if dropped <= 0 or kv_tokens <= 0:
        return 0.0
    return KV_RECALL_SHARE * dropped * dropped * kv_tokens * d.model.kv_bytes_per_token / kv_shards(d)


def stream_occupancy(rows: int) -> float:
    """Share of the chip one fixed-batch stream's step of ``rows`` tokens keeps busy when it runs alone.

    Streams of one device run their tasks concurrently ("different streams execute their tasks concurrently",
    CANN 8.0 AscendCL guide, Stream Management); the gain is what one stream leaves idle.  NVIDIA MPS measurements
    on LLM serving find the same two sources -- kernel overlap "when individual engines leave compute or memory
    bandwidth underutilized" and the host overhead split across engines -- and gains only for small models and
    small batches (Databricks, "Scaling small LLMs with NVIDIA MPS", 2025); a shared A100 costs TPOT +19.5 %
    (gopebble MPS vs dedicated, Qwen3-4B).  The curve is a guess with that shape: STREAM_OCCUPANCY_MIN + (1 -
    MIN) x rows / (rows + HALF_ROWS): a decode of batch 1 keeps 64 % busy (a small-batch GEMV leaves HBM below
    the ~89 % a plain copy reaches, profiles.yaml), batch 4 73 %, batch 64 96 %, a prefill of 1000+ tokens ~100 %.
    """
    rows = max(0, rows)
    return STREAM_OCCUPANCY_MIN + (1 - STREAM_OCCUPANCY_MIN) * rows / (rows + STREAM_OCCUPANCY_HALF_ROWS)


def stream_rates(occupancies: list[float]) -> float:
    """Speed (share of its lone speed) of every stream in its device part when these streams share the chip.

    The chip serves them together while their occupancies sum to at most 1, then shares it in proportion
    (processor sharing); each further stream costs STREAM_CONTENTION (guess).  One stream runs at 1.
    """
    k = len(occupancies)
    if k <= 1:
        return 1.0
    return min(1.0, 1.0 / sum(occupancies)) / (1.0 + STREAM_CONTENTION * (k - 1))


@dataclass(frozen=True)
class CrossHost:
    """What one step's traffic between hosts costs, in seconds: tensor-parallel all-reduces of a group that spans
    hosts, and the expert-parallel dispatch + combine all-to-alls.  All zero within one host."""

    all_reduce_s: float = 0.0
    all_to_all_s: float = 0.0     # the MoE layers' exchange: all-to-all (EP) or all-gather + reduce-scatter (DP)
    bytes_per_chip: float = 0.0   # sent over each chip's own inter-host port in the step (one direction)

    @property
    def total_s(self) -> float:
        return self.all_reduce_s + self.all_to_all_s


NO_CROSS_HOST = CrossHost()


def cross_host_seconds(d: Deployment, tokens: int) -> CrossHost:
    """The cost of spanning hosts for one step over ``tokens`` tokens (prefill chunk + decodes), per chip.

    Links (profiles.yaml, per chip and direction): inside an Atlas 800T A2 host HCCS (``Chip.intra_host_gbs``,
    196 GB/s), between hosts each NPU's own 200GE RoCE port (``Chip.inter_host_gbs``, 25 GB/s).  Only the second is
    charged: in-host collectives stay the fixed per-layer latency of ``overhead_seconds`` (see the module
    docstring), so ``nodes == 1`` returns zero and the step time is exactly the single-host one.  Each collective step
    that crosses hosts also costs ``Efficiency.inter_host_latency_us`` (a guess).  Nothing is overlapped with compute
    (vllm-ascend's default; a guess for its multistream options).  H = hidden size, b = ACTIVATION_BYTES,
    n = nodes, c = chips per node, L = layers, M = MoE layers:

    * Expert all-to-all (expert parallel, MoE): every MoE layer dispatches each token to its k experts and combines
      the k results back.  Each chip sends its own tokens (tokens / chips of the step; a guess: vllm-ascend splits a
      DP rank's tokens over its TP ranks before dispatch).  Experts are spread evenly over all chips and routing is
      taken as uniform, so (n - 1) / n of the copies go to other hosts:
          bytes = tokens / chips x H x b x k x 2 (dispatch + combine) x (n - 1) / n      per chip and MoE layer
          time  = M x (bytes / RoCE + 2 x latency)
      Copies to several experts on one rank count k times (an upper bound: DeepEP sends a token once per rank).
    * MoE all-gather + reduce-scatter (DP groups without expert parallel, ``Deployment.experts_flattened``): vLLM's
      naive dispatch all-gathers every DP rank's hidden states before each MoE layer and reduce-scatters the result
      after it, over the DP group of each TP rank (vLLM ``FusedMoEParallelConfig``: all2all backends "naive",
      "allgather_reducescatter").  Each chip receives the tokens of the DP ranks on other hosts and sends its own
      sums back; taken as (n - 1) / n of the step's tokens each way:
          bytes = tokens x H x b x 2 x (n - 1) / n                                        per chip and MoE layer
          time  = M x (bytes / RoCE + 2 (n - 1) x latency)
    * Tensor-parallel all-reduce, only when a TP group spans hosts (TP > c; vLLM: one after attention and one after
      the MLP per layer; with expert parallel the MoE layers' second one is the all-to-all instead).  HCCL is
      hierarchical: an intra-server stage, then an inter-server algorithm (ring / RHD) between servers (CANN HCCL
      user guide, "Collective Communication Algorithms"; HCCL_ALGO level0 / level1), so each chip carries 1 / c of
      the message across hosts, the ring's 2 (n_tp - 1) / n_tp of it:
          message = tokens / DP x H x b;   bytes = 2 (n_tp - 1) / n_tp x message / c   per chip and all-reduce
          time    = all-reduces x (bytes / RoCE + 2 (n_tp - 1) x latency)
    """
    if d.nodes <= 1 or tokens <= 0:
        return NO_CROSS_HOST
    link = d.chip.inter_host_gbs * GB
    if link <= 0:
        raise UsageError(f"chip {d.chip.name} has no inter-host bandwidth in dsctl/data/profiles.yaml "
                         f"(inter_host_gbs), so an instance over {d.nodes} hosts cannot be modelled; add it")
    m = d.model
    latency = d.efficiency.inter_host_latency_us / 1e6
    hidden = m.hidden_size * ACTIVATION_BYTES
    all_to_all = all_reduce = moved = 0.0
    if d.experts_sharded:
        remote = (d.nodes - 1) / d.nodes
        per_layer = tokens / d.chips * hidden * m.experts_per_token * 2 * remote
        all_to_all = m.moe_layer_count * (per_layer / link + 2 * latency)
        moved += m.moe_layer_count * per_layer
    elif d.experts_flattened:
        remote = (d.nodes - 1) / d.nodes
        per_layer = tokens * hidden * 2 * remote
        all_to_all = m.moe_layer_count * (per_layer / link + 2 * (d.nodes - 1) * latency)
        moved += m.moe_layer_count * per_layer
    tp_nodes = d.tensor_parallel_nodes
    if tp_nodes > 1:
        data_parallel = d.chips // d.tensor_parallel_size
        message = tokens / data_parallel * hidden
        per_reduce = 2 * (tp_nodes - 1) / tp_nodes * message / min(d.tensor_parallel_size, d.chips_per_node)
        dense_layers = m.layers - m.moe_layer_count
        reduces = 2 * dense_layers + (1 if d.experts_sharded or d.experts_flattened else 2) * m.moe_layer_count
        all_reduce = reduces * (per_reduce / link + 2 * (tp_nodes - 1) * latency)
        moved += reduces * per_reduce
    return CrossHost(all_reduce_s=all_reduce, all_to_all_s=all_to_all, bytes_per_chip=moved)


def overhead_seconds(d: Deployment) -> float:
    """Fixed cost of one engine step: scheduling and launch, plus collectives when the group spans chips."""
    comm = d.model.layers * d.efficiency.comm_ms_per_layer if d.chips > 1 else 0.0
    return (d.efficiency.step_overhead_ms + comm) / 1e3


def step_seconds(d: Deployment, prefill_tokens: int, prefill_context: int, decode_batch: int,
                 decode_kv_tokens: int, *, kv_factor: float = 1.0, extra_overhead_s: float = 0.0) -> float:
    """One engine step mixing a prefill chunk with the running decodes (chunked prefill).

    The weights the step's tokens touch are read once, the decodes read their KV and the chunk reads its
    context's KV; compute is the chunk's prefill FLOPs plus the decodes'. Time is the slower of the two at the
    efficiency-scaled peaks, plus the step overhead, plus the traffic between hosts when the deployment spans
    several (``cross_host_seconds``; nothing for one host). An empty step takes no time.
    ``kv_factor`` scales the time of the KV reads (the attention kernel's efficiency: block size, FIA vs PA,
    see engine_sched); ``extra_overhead_s`` is added to the fixed part (eager launches).
    """
    if min(prefill_tokens, prefill_context, decode_batch, decode_kv_tokens) < 0:
        raise ValueError("token counts must not be negative")
    tokens = prefill_tokens + decode_batch
    if tokens == 0:
        return 0.0
    flops = (prefill_flops(d.model, prefill_tokens, prefill_context) if prefill_tokens else 0.0) \
        + (decode_flops(d.model, decode_batch, decode_kv_tokens, d.kv_keep_fraction) if decode_batch else 0.0)
    bytes_per_chip = (touched_weight_bytes_per_chip(d, tokens)
                      + (prefill_context + decode_kv_tokens) * kv_bytes_per_token_per_chip(d) * kv_factor)
    compute_s = flops / (d.chips * peak_flops(d) * d.efficiency.compute)
    memory_s = bytes_per_chip / (d.chip.hbm_bandwidth_gbs * GB * d.efficiency.bandwidth)
    recall_s = kv_recall_bytes(d, decode_kv_tokens) / (HOST_LINK_GBS * GB) if decode_batch else 0.0
    cross_host_s = cross_host_seconds(d, tokens).total_s if d.nodes > 1 else 0.0
    return max(compute_s, memory_s) + recall_s + overhead_seconds(d) + extra_overhead_s + cross_host_s


def prefill_seconds(d: Deployment, new_tokens: int, context_tokens: int = 0) -> float:
    """Prefill of ``new_tokens`` after ``context_tokens`` already cached, alone in one step.

    Compute-bound for any real prompt: FLOPs / (chips x peak x compute efficiency); short prompts are bounded
    by reading the weights once instead.
    """
    return step_seconds(d, new_tokens, context_tokens, 0, 0)


def decode_step_seconds(d: Deployment, batch: int, kv_tokens: int) -> float:
    """One decode step of ``batch`` running requests whose contexts hold ``kv_tokens`` tokens in total.

    Memory-bound in practice: (touched weights / chips + KV bytes per chip) / (bandwidth x efficiency).
    """
    return step_seconds(d, 0, 0, batch, kv_tokens)


def startup_seconds(d: Deployment, enforce_eager: bool = False) -> float:
    """Engine start-up: loading every weight byte at the load bandwidth, plus the fixed initialisation
    (without graph capture under --enforce-eager)."""
    init = d.efficiency.init_s - (d.efficiency.capture_s if enforce_eager else 0.0)
    return weights_bytes(d) / (d.efficiency.load_gbs * GB) + max(init, 0.0)


def kv_keep_fraction(threshold: float) -> float:
    """Fraction of KV pairs kept at ``--kv-sparse-threshold`` ``threshold`` in [0, 1).

    Shape: FLOOR + (1 - FLOOR) x exp(-threshold / KV_KEEP_SCALE), 1.0 at 0, strictly decreasing. Attention mass
    concentrates on few tokens, so raising the threshold drops pairs fast at first; sinks and the recent window
    always stay, hence the floor (KV_KEEP_FLOOR). Anchor (field-practice.md, the field guide): threshold 0.15
    "compressed the 128K-scenario KV cache to 12 GB" from "over 20 GB", i.e. keeps at most 12/20 = 0.60;
    KV_KEEP_SCALE is chosen so that keep(0.15) = 0.60. The rest of the curve is Proposed. Scales KV bytes
    (capacity and decode reads) and decode attention FLOPs; prefill still scores every pair.
    What it costs: output agreement (``divergence_probability``) and, in decode, recalls of dropped pairs from
    the host (``kv_recall_bytes``, a guess), which make a loose threshold slower than a moderate one.
    """
    if not 0 <= threshold < 1:
        raise UsageError(f"kv_sparse_threshold must be in [0, 1), got {threshold}")
    return KV_KEEP_FLOOR + (1 - KV_KEEP_FLOOR) * math.exp(-threshold / KV_KEEP_SCALE)


def divergence_probability(kv_keep_fraction: float) -> float:
    """Chance that an output token differs from the unsparsified (threshold 0) output at this KV keep fraction.

    Proposed: DIVERGENCE_SCALE x (1 - keep)^2 -- dropping the few lowest-scored pairs changes little (the
    attention mass they carry is small), dropping most of them changes a lot. 0 at keep 1; at the guide's
    threshold 0.15 (keep 0.60) 8 % of tokens differ, at 0.5 about 31 %, at 0.9 about 40 %. No public
    measurement exists (field-practice.md: "quality must be checked against an unsparsified baseline").
    """
    dropped = min(1.0, max(0.0, 1.0 - kv_keep_fraction))
    return DIVERGENCE_SCALE * dropped * dropped


# --------------------------------------------------------------------------- the engine's start-up arithmetic
#
# vLLM profiles memory at start-up (vllm/v1/worker/gpu_worker.py determine_available_memory; vllm-ascend's
# worker does the same on NPU): it runs one forward pass of max_num_batched_tokens dummy tokens (max_num_seqs
# sequences), measures the activation peak, and gives the KV cache what is left:
#     KV = HBM x gpu_memory_utilization - weights - peak activation - non-torch / graph memory
# and stops with "No available memory for the cache blocks" when that is not positive.


def activation_bytes_per_token(d: Deployment) -> float:
    """Activation bytes one token of a forward pass holds at its peak, per chip (Proposed).

    2 bytes x (3 x MLP width / chips (gate, up and the activated product are alive together; column-parallel
    over the group) + 8 x hidden (residual, norms, q/k/v, attention output; replicated)). For Llama-3-8B this
    gives 151 KB/token, 1.24 GB at 8192 tokens: near the ~2 GiB peak minus logits and non-torch memory that
    vllm-project/vllm#10517 logs.
    """
    m = d.model
    return 2.0 * (3.0 * m.ffn_intermediate / d.chips + 8.0 * m.hidden_size)


def logits_bytes(d: Deployment, sequences: int) -> float:
    """The sampler's fp32 logits of one step: one row of the vocabulary per sequence."""
    return 4.0 * d.model.vocab_size * sequences


def attention_mask_bytes(new_tokens: int, sequence_len: int) -> float:
    """The fp16 causal mask rows a prefill chunk of ``new_tokens`` builds over its sequence (Proposed: vllm-ascend's
    AttentionMaskBuilder materialises masks, up to the longest sequence of the step)."""
    return 2.0 * new_tokens * sequence_len


def activation_peak_bytes(d: Deployment, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> float:
    """The profiling run's activation peak per chip: a full token budget, one full-length chunk's mask, logits."""
    tokens = max(1, max_num_batched_tokens)
    return (tokens * activation_bytes_per_token(d) + attention_mask_bytes(min(tokens, max_model_len), min(tokens,
                                                                                                            max_model_len))
            + logits_bytes(d, min(max_num_seqs, tokens)))


def reserved_bytes(d: Deployment, enforce_eager: bool = False) -> float:
    return (d.efficiency.eager_reserved_gb if enforce_eager else d.efficiency.reserved_gb) * GB


def profiled_kv_budget_bytes_per_chip(d: Deployment, activation_peak: float, enforce_eager: bool = False) -> float:
    """KV = HBM x utilisation - weights / chips - activation peak - reserved (per chip); <= 0: nothing."""
    return (d.chip.hbm_gb * GB * d.memory_utilization - weights_bytes_per_chip(d) - activation_peak
            - reserved_bytes(d, enforce_eager))


def check_profiled(d: Deployment, max_model_len: int, activation_peak: float, enforce_eager: bool = False) -> int:
    """KV capacity in tokens after vLLM's profiling arithmetic, or DoesNotFit in vLLM's words."""
    if weights_bytes_per_chip(d) > d.chip.hbm_gb * GB:
        raise DoesNotFit(_oom_message(d), reason="weights")
    budget = profiled_kv_budget_bytes_per_chip(d, activation_peak, enforce_eager)
    if budget <= 0:
        raise DoesNotFit(NO_CACHE_MEMORY, reason="no_cache_memory")
    capacity = math.floor(budget / kv_bytes_per_token_per_chip(d))
    if rank_capacity_tokens(d, capacity) < max_model_len:
        needed = max_model_len * rank_kv_bytes_per_token_per_chip(d)
        raise DoesNotFit(
            f"ValueError: To serve at least one request with the model's max seq len ({max_model_len}), "
            f"{needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget / GIB:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{rank_capacity_tokens(d, capacity)}. Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.",
            reason="max_model_len", capacity_tokens=capacity)
    return capacity


# Under load (Proposed): the caching allocator hands a step's activations out of the memory the profiling run
# reserved plus whatever HBM vLLM's budget left over (HBM x (1 - utilisation)). With
# PYTORCH_NPU_ALLOC_CONF=expandable_segments:True segments grow in place and all of it is usable (vllm-ascend
# FAQ #12, serving-and-tuning.md s.9.6); without, after a mix of step sizes the largest free block is only
# FRAGMENTED_SHARE of it, and a step needing more fails with aclrtMalloc (field-practice.md, pitfall no. 1).
# max_split_size_mb (the documented alternative) keeps big blocks whole: MAX_SPLIT_SHARE.
FRAGMENTED_SHARE = 0.5
MAX_SPLIT_SHARE = 0.75


def allocator_share(alloc_conf: str) -> float:
    """Share of the activation memory one allocation can get, from PYTORCH_NPU_ALLOC_CONF's text."""
    options = {}
    for item in alloc_conf.split(","):
        key, _, value = item.partition(":")
        options[key.strip()] = value.strip()
    if options.get("expandable_segments", "").lower() == "true":
        return 1.0
    if "max_split_size_mb" in options:
        return MAX_SPLIT_SHARE
    return FRAGMENTED_SHARE


def activation_limit_bytes(d: Deployment, activation_peak: float, share: float) -> float:
    """The largest step activation the allocator can hand out under load, per chip."""
    headroom = d.chip.hbm_gb * GB * (1.0 - d.memory_utilization)
    return share * (activation_peak + headroom)


def step_activation_bytes(d: Deployment, step_tokens: int, sequences: int, longest_chunk: int,
                          longest_sequence: int, *, fused_mask: bool = False) -> float:
    """What one step allocates for activations per chip: its tokens, its longest prefill chunk's mask, logits.

    ``fused_mask``: the engine's prefill runs a fused attention kernel with the compressed causal mask
    (FUSED_ATTENTION_MASK_BYTES, whatever the length) instead of materialising chunk x sequence rows."""
    mask = FUSED_ATTENTION_MASK_BYTES if fused_mask and longest_chunk else \
        attention_mask_bytes(longest_chunk, longest_sequence)
    if d.data_parallel > 1:  # each chip runs its own DP group's share of the step (balanced)
        step_tokens, sequences = -(-step_tokens // d.data_parallel), -(-sequences // d.data_parallel)
    return step_tokens * activation_bytes_per_token(d) + mask + logits_bytes(d, sequences)


def malloc_failure(d: Deployment, need: float, limit: float) -> str:
    """The log lines of an allocation failure under load (CANN runtime, then torch_npu)."""
    capacity = d.chip.hbm_gb * GB
    # The runtime's code for ACL_ERROR_RT_MEMORY_ALLOCATION is 207001; the guide quotes "aclrtMalloc failed" and
    # ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED (field-practice.md). The exact line layout is inferred.
    return (f"[ERROR] RUNTIME: aclrtMalloc failed, size={int(need)}, error code is 207001 "
            f"(ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED)\n"
            f"RuntimeError: NPU out of memory. Tried to allocate {need / GIB:.2f} GiB (NPU 0; {capacity / GIB:.2f} "
            f"GiB total capacity; {limit / GIB:.2f} GiB largest free block) If reserved memory is >> allocated "
            f"memory try setting max_split_size_mb to avoid fragmentation.")


# --------------------------------------------------------------------------- parallelism rules


def parallel_problem(model: Model, tensor_parallel: int, data_parallel: int = 1, expert_parallel: bool = False,
                     visible: int | None = None, nodes: int = 1) -> str | None:
    """vLLM's refusal of a parallel layout, in its words, or None.

    * heads % tp: vllm/config ModelConfig.verify_with_parallel_config "Total number of attention heads (28)
      must be divisible by tensor parallel size (8)." (quoted in dsctl issue 9);
    * GQA KV heads: QKVParallelLinear splits them (tp < kv heads) or replicates them (tp >= kv heads) with
      vllm.distributed.utils.divide, whose assert reads "{a} is not divisible by {b}";
    * experts % ep with --enable-expert-parallel (ep = tp x dp): inferred from vllm-ascend's expert map, which
      gives each rank experts / ep; the wording is Proposed;
    * world size: "please ensure that world_size (N) is less than than max local gpu count (M)" (vLLM, typo
      included); over ``nodes`` hosts each node runs TP x DP / nodes ranks on its own ``visible`` NPUs (vllm-ascend
      Multi-Node-DP: ``--data-parallel-size-local``), so that is what must fit.
    """
    if model.num_heads and model.num_heads % tensor_parallel:
        return (f"ValueError: Total number of attention heads ({model.num_heads}) must be divisible by tensor "
                f"parallel size ({tensor_parallel}).")
    kv = model.gqa_kv_heads
    if kv:
        if tensor_parallel < kv and kv % tensor_parallel:
            return f"AssertionError: {kv} is not divisible by {tensor_parallel}"
        if tensor_parallel >= kv and tensor_parallel % kv:
            return f"AssertionError: {tensor_parallel} is not divisible by {kv}"
    if expert_parallel:
        ep = tensor_parallel * data_parallel
        if not model.is_moe:
            return None  # vLLM ignores the flag on a dense model
        if model.experts % ep:
            return (f"AssertionError: Number of experts ({model.experts}) must be divisible by expert parallel "
                    f"size ({ep}).")
    world = tensor_parallel * data_parallel // max(1, nodes)
    if visible is not None and world > visible:
        return (f"RuntimeError: please ensure that world_size ({world}) is less than than max local gpu count "
                f"({visible})")
    return None
