"""The roofline model (dsctl.core.perf.perfmodel) against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from dsctl.core.perf import perfmodel as pm
from dsctl.core.perf.perfmodel import (
    DEFAULT_EFFICIENCY,
    NO_CACHE_MEMORY,
    Deployment,
    DoesNotFit,
    Efficiency,
    check_fits,
    chip_by_name,
    decode_step_seconds,
    kv_capacity_tokens,
    kv_keep_fraction,
    load_profiles,
    min_chips_to_fit,
    model_by_name,
    prefill_seconds,
    startup_seconds,
    step_seconds,
    touched_params,
    weights_bytes,
)
from dsctl.errors import UsageError

# Peak everything, no workspace or overheads: times are the bare roofline.
IDEAL = Efficiency(compute=1.0, bandwidth=1.0, workspace_gb=0.0, load_gbs=1.0)
B3 = chip_by_name("910B3")
QWEN7B = model_by_name("deepseek-r1-distill-qwen-7b")
V3 = model_by_name("deepseek-v3")
V2_LITE = model_by_name("deepseek-v2-lite")


# --------------------------------------------------------------------------- profiles


def test_profiles_carry_the_issue_numbers():
    chips, models, efficiency = load_profiles()
    assert set(chips) == {"910b3", "910b4", "910b2", "h100-sxm"}
    assert set(models) == {"deepseek-r1-distill-qwen-7b", "deepseek-v2-lite", "deepseek-v3", "deepseek-r1"}
    assert (B3.hbm_gb, B3.hbm_bandwidth_gbs, B3.fp16_tflops) == (64, 1600, 320)
    assert chips["910b4"].hbm_gb == 32
    h100 = chips["h100-sxm"]
    assert (h100.hbm_gb, h100.hbm_bandwidth_gbs, h100.fp16_tflops, h100.vendor) == (80, 3350, 989, "cuda")
    assert (V3.total_params_b, V3.active_params_b, V3.layers) == (671, 37, 61)
    assert (V2_LITE.total_params_b, V2_LITE.active_params_b, V2_LITE.layers) == (15.7, 2.4, 27)
    assert efficiency == DEFAULT_EFFICIENCY
    assert 0 < efficiency.compute < 1 and 0 < efficiency.bandwidth < 1
    assert all(chip.source for chip in chips.values()) and all(model.source for model in models.values())


def test_derived_attention_and_kv_sizes():
    # GQA: 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 bytes; MLA: layers x (512 + 64) x 2 bytes
    assert QWEN7B.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert V3.kv_bytes_per_token == 61 * 576 * 2 == 70272
    assert V2_LITE.kv_bytes_per_token == 27 * 576 * 2
    # attn_dim = heads x (d_qk + d_v) / 2
    assert QWEN7B.attn_dim == 28 * 128 == 3584
    assert V3.attn_dim == 128 * (192 + 128) // 2 == 20480
    assert (QWEN7B.kv_heads, V3.kv_heads) == (4, 1)
    assert model_by_name("deepseek-r1").kv_bytes_per_token == V3.kv_bytes_per_token


@pytest.mark.parametrize("alias, canonical", [
    ("v3", "deepseek-v3"), ("R1", "deepseek-r1"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("v2-lite", "deepseek-v2-lite"), ("r1-7b", "deepseek-r1-distill-qwen-7b"),
])
def test_model_aliases(alias, canonical):
    assert model_by_name(alias).name == canonical


@pytest.mark.parametrize("alias, canonical", [("910b3", "910B3"), ("Ascend910B4", "910B4"), ("h100", "H100-SXM")])
def test_chip_aliases(alias, canonical):
    assert chip_by_name(alias).name == canonical


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UsageError) as raised:
        model_by_name("llama-3")
    message = str(raised.value)
    assert "unknown model 'llama-3'" in message and "deepseek-v3" in message and "\n" not in message
    with pytest.raises(UsageError, match="known chips: 910B3, 910B4"):
        chip_by_name("MI300X")


# --------------------------------------------------------------------------- time


def test_prefill_of_a_dense_7b_is_flops_over_peak():
    d = Deployment(B3, QWEN7B, efficiency=IDEAL)
    linear = 2 * 7.62e9 * 1000
    attention = 4 * 28 * 3584 * (1000 * 1001 / 2)  # causal: token i attends to i tokens
    assert prefill_seconds(d, 1000) == pytest.approx((linear + attention) / 320e12)
    assert prefill_seconds(d, 1000) == pytest.approx(0.04825, rel=1e-3)


def test_prefill_after_a_cached_context_attends_to_it():
    d = Deployment(B3, QWEN7B, efficiency=IDEAL)
    flops = 2 * 7.62e9 * 500 + 4 * 28 * 3584 * (500 * 4000 + 500 * 501 / 2)
    # compute-bound still (the context's KV read is 4000 x 57344 B = 0.2 GB)
    assert prefill_seconds(d, 500, context_tokens=4000) == pytest.approx(flops / 320e12)


def test_prefill_scales_with_the_group_and_the_efficiency():
    one = prefill_seconds(Deployment(B3, QWEN7B, efficiency=IDEAL), 8000)
    assert prefill_seconds(Deployment(B3, QWEN7B, chips=4, efficiency=IDEAL), 8000) == pytest.approx(one / 4)
    half = Efficiency(compute=0.5, bandwidth=1.0, workspace_gb=0.0, load_gbs=1.0)
    assert prefill_seconds(Deployment(B3, QWEN7B, efficiency=half), 8000) == pytest.approx(one * 2)


def test_decode_step_of_batch_one_reads_the_weights():
    d = Deployment(B3, QWEN7B, efficiency=IDEAL)
    assert decode_step_seconds(d, 1, 0) == pytest.approx(7.62e9 * 2 / 1.6e12)
    kv = 2000 * 57344  # plus the KV of a 2000-token context
    assert decode_step_seconds(d, 1, 2000) == pytest.approx((7.62e9 * 2 + kv) / 1.6e12)
    int8 = Deployment(B3, QWEN7B, weight_bytes=1.0, efficiency=IDEAL)
    assert decode_step_seconds(int8, 1, 0) == pytest.approx(7.62e9 / 1.6e12)


def test_decode_is_memory_bound_and_batching_is_cheap():
    d = Deployment(B3, QWEN7B, efficiency=IDEAL)
    one = decode_step_seconds(d, 1, 1000)
    thirty_two = decode_step_seconds(d, 32, 32 * 1000)
    assert thirty_two < 3 * one            # the weights are read once for the whole batch
    assert thirty_two / 32 < one / 10      # per token, batching is far cheaper


def test_moe_decode_reads_the_active_experts_and_large_batches_touch_all():
    assert touched_params(V3, 1) == pytest.approx(37e9)
    assert touched_params(V3, 100_000) == pytest.approx(671e9)
    assert touched_params(V3, 1) < touched_params(V3, 8) < touched_params(V3, 64) < touched_params(V3, 512)
    d = Deployment(B3, V3, chips=32, efficiency=IDEAL)
    assert decode_step_seconds(d, 1, 0) == pytest.approx(37e9 * 2 / 32 / 1.6e12)


def test_a_mixed_step_reads_the_weights_once():
    d = Deployment(B3, QWEN7B, efficiency=IDEAL)
    mixed = step_seconds(d, prefill_tokens=16, prefill_context=0, decode_batch=8, decode_kv_tokens=8 * 1000)
    assert mixed < prefill_seconds(d, 16) + decode_step_seconds(d, 8, 8 * 1000)
    assert step_seconds(d, 0, 0, 0, 0) == 0.0
    # a long chunk is compute-bound: the decodes ride along almost for free
    big = step_seconds(d, prefill_tokens=4096, prefill_context=0, decode_batch=8, decode_kv_tokens=8 * 1000)
    assert big == pytest.approx(prefill_seconds(d, 4096), rel=0.01)


def test_overheads_add_per_step_and_collectives_only_across_chips():
    overhead = Efficiency(compute=1.0, bandwidth=1.0, workspace_gb=0.0, load_gbs=1.0, step_overhead_ms=3.0,
                          comm_ms_per_layer=0.1)
    bare = decode_step_seconds(Deployment(B3, QWEN7B, efficiency=IDEAL), 1, 0)
    assert decode_step_seconds(Deployment(B3, QWEN7B, efficiency=overhead), 1, 0) == pytest.approx(bare + 0.003)
    two = decode_step_seconds(Deployment(B3, QWEN7B, chips=2, efficiency=overhead), 1, 0)
    assert two == pytest.approx(bare / 2 + 0.003 + 28 * 0.0001)


def test_w8a8_prefill_uses_the_int8_peak():
    bf16 = prefill_seconds(Deployment(B3, QWEN7B, efficiency=IDEAL), 4000)
    int8 = prefill_seconds(Deployment(B3, QWEN7B, weight_bytes=1.0, efficiency=IDEAL), 4000)
    assert int8 == pytest.approx(bf16 * 320 / 640)


# --------------------------------------------------------------------------- memory


def test_kv_capacity_is_what_the_weights_and_workspace_leave():
    d = Deployment(B3, QWEN7B)
    free = 64e9 * 0.9 - 7.62e9 * 2 - DEFAULT_EFFICIENCY.workspace_gb * 1e9
    assert kv_capacity_tokens(d) == math.floor(free / 57344)
    assert check_fits(d) == kv_capacity_tokens(d) > QWEN7B.max_model_len


def test_kv_capacity_over_a_group_matches_the_pooled_formula_when_kv_heads_split():
    d = Deployment(B3, QWEN7B, chips=4)  # 4 KV heads: one per chip
    pooled = (64e9 * 4 * 0.9 - 7.62e9 * 2 - DEFAULT_EFFICIENCY.workspace_gb * 1e9 * 4) / 57344
    assert kv_capacity_tokens(d) == math.floor(pooled)


def test_mla_kv_is_replicated_on_every_rank():
    d = Deployment(B3, V3, chips=32)
    per_chip = 64e9 * 0.9 - 671e9 * 2 / 32 - DEFAULT_EFFICIENCY.workspace_gb * 1e9
    assert kv_capacity_tokens(d) == math.floor(per_chip / 70272)  # not x 32


def test_v3_on_one_chip_runs_out_of_memory_while_loading():
    with pytest.raises(DoesNotFit) as raised:
        check_fits(Deployment(B3, V3))
    assert raised.value.reason == "weights"
    message = str(raised.value)
    assert message.startswith("RuntimeError: NPU out of memory. Tried to allocate ")
    assert "GiB total capacity" in message and "max_split_size_mb" in message
    assert kv_capacity_tokens(Deployment(B3, V3)) <= 0
    with pytest.raises(DoesNotFit, match=r"^torch\.OutOfMemoryError: CUDA out of memory"):
        check_fits(Deployment(chip_by_name("H100-SXM"), V3))


def test_weights_that_fill_the_memory_budget_leave_no_cache_blocks():
    # V2-Lite's 31.4 GB of bf16 weights load into a 32 GB 910B4 but leave nothing under 0.9 utilisation
    with pytest.raises(DoesNotFit) as raised:
        check_fits(Deployment(chip_by_name("910B4"), V2_LITE))
    assert raised.value.reason == "no_cache_memory"
    assert str(raised.value) == ("ValueError: No available memory for the cache blocks. Try increasing "
                                 "`gpu_memory_utilization` when initializing the engine.") == NO_CACHE_MEMORY


def test_a_cache_shorter_than_max_model_len_fails_in_vllm_words():
    d = Deployment(chip_by_name("910B4"), QWEN7B, memory_utilization=0.6)
    with pytest.raises(DoesNotFit) as raised:
        check_fits(d)
    failure = raised.value
    assert failure.reason == "max_model_len" and failure.capacity_tokens == kv_capacity_tokens(d) > 0
    assert str(failure).startswith("ValueError: To serve at least one request with the model's max seq len (131072), ")
    assert f"the estimated maximum model length is {failure.capacity_tokens}." in str(failure)
    assert "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`" in str(failure)
    assert check_fits(d, max_model_len=8192) == failure.capacity_tokens  # a shorter --max-model-len starts


def test_minimum_chips_for_v3():
    bf16 = Deployment(B3, V3)
    assert min_chips_to_fit(bf16, 131328) == 30
    check_fits(Deployment(B3, V3, chips=30), 131328)
    with pytest.raises(DoesNotFit):
        check_fits(Deployment(B3, V3, chips=29), 131328)
    # W8A8: 15, within vllm-ascend's "2 Atlas 800 A2 (64G x 8) nodes" for the 671B W8A8 checkpoints
    assert min_chips_to_fit(Deployment(B3, V3, weight_bytes=1.0), 131328) == 15
    assert min_chips_to_fit(Deployment(B3, V3), 10**9, limit=64) is None


def test_kv_keep_fraction_is_one_at_zero_and_decreasing():
    assert kv_keep_fraction(0.0) == 1.0
    grid = [kv_keep_fraction(i / 100) for i in range(100)]
    assert all(a > b for a, b in zip(grid, grid[1:], strict=False))
    assert 0 < grid[-1] < 0.1
    for bad in (1.0, -0.1):
        with pytest.raises(UsageError, match="kv_sparse_threshold"):
            kv_keep_fraction(bad)


def test_kv_sparsity_shrinks_kv_bytes_and_decode_time():
    keep = kv_keep_fraction(0.5)
    dense, sparse = Deployment(B3, QWEN7B), Deployment(B3, QWEN7B, kv_keep_fraction=keep)
    assert kv_capacity_tokens(sparse) == pytest.approx(kv_capacity_tokens(dense) / keep, rel=1e-4)
    # decode is fastest at a moderate threshold: at 0.5 the recalls of dropped pairs over the host link cost more
    # than the reads they save (perfmodel.kv_recall_bytes)
    guide = Deployment(B3, QWEN7B, kv_keep_fraction=kv_keep_fraction(0.15))
    times = [decode_step_seconds(d, 64, 64 * 8000) for d in (dense, guide, sparse)]
    assert times[1] < times[0] and times[1] < times[2]


def test_startup_loads_every_weight_byte():
    eff = DEFAULT_EFFICIENCY
    d = Deployment(B3, QWEN7B)
    assert startup_seconds(d) == pytest.approx(weights_bytes(d) / (eff.load_gbs * 1e9) + eff.init_s)
    times = [startup_seconds(Deployment(B3, m, chips=32)) for m in (QWEN7B, V2_LITE, V3)]
    assert times == sorted(times) and times[0] < times[-1]
    assert startup_seconds(Deployment(B3, V3, chips=32, weight_bytes=1.0)) < times[-1]


@pytest.mark.parametrize("kwargs", [{"chips": 0}, {"memory_utilization": 0}, {"memory_utilization": 1.5},
                                    {"weight_bytes": 0}, {"kv_keep_fraction": 0}])
def test_deployment_rejects_impossible_settings(kwargs):
    with pytest.raises(UsageError):
        Deployment(B3, QWEN7B, **kwargs)


# --------------------------------------------------------------------------- the engine's start-up arithmetic


def test_parallel_layouts_vllm_refuses_in_its_words():
    qwen, v3 = pm.model_by_name("deepseek-r1-distill-qwen-7b"), pm.model_by_name("deepseek-v3")
    assert pm.parallel_problem(qwen, 8) == ("ValueError: Total number of attention heads (28) must be divisible by "
                                            "tensor parallel size (8).")
    assert pm.parallel_problem(qwen, 3).startswith("ValueError: Total number of attention heads (28)")
    assert pm.parallel_problem(qwen, 4) is None and pm.parallel_problem(qwen, 2) is None
    assert pm.parallel_problem(v3, 8, 2, expert_parallel=True) is None  # 256 experts over 16 ranks
    assert "Number of experts (256) must be divisible by expert parallel size (24)" in pm.parallel_problem(
        v3, 8, 3, expert_parallel=True, visible=64)
    assert pm.parallel_problem(qwen, 4, 2, visible=4) == ("RuntimeError: please ensure that world_size (8) is less "
                                                          "than than max local gpu count (4)")


def test_profiling_gives_kv_what_weights_and_the_activation_peak_leave():
    d = pm.Deployment(pm.chip_by_name("910B3"), pm.model_by_name("deepseek-r1-distill-qwen-7b"))
    small, large = (pm.activation_peak_bytes(d, tokens, 256, 32768) for tokens in (2048, 32768))
    assert large > 10 * small  # grows with max_num_batched_tokens
    assert pm.check_profiled(d, 32768, large) < pm.check_profiled(d, 32768, small)
    budget = pm.profiled_kv_budget_bytes_per_chip(d, small)
    assert budget == pytest.approx(64e9 * 0.9 - 7.62e9 * 2 - small - d.efficiency.reserved_gb * 1e9)
    with pytest.raises(pm.DoesNotFit, match="No available memory for the cache blocks") as raised:
        pm.check_profiled(d, 131072, pm.activation_peak_bytes(d, 131072, 256, 131072))
    assert raised.value.reason == "no_cache_memory"
    assert pm.startup_seconds(d, enforce_eager=True) == pytest.approx(pm.startup_seconds(d) - d.efficiency.capture_s)


def test_the_allocator_reads_pytorch_npu_alloc_conf():
    assert pm.allocator_share("expandable_segments:True") == 1.0
    assert pm.allocator_share("") == pm.FRAGMENTED_SHARE == pm.allocator_share("expandable_segments:False")
    assert pm.allocator_share("max_split_size_mb:250") == pm.MAX_SPLIT_SHARE
    d = pm.Deployment(pm.chip_by_name("910B3"), pm.model_by_name("deepseek-r1-distill-qwen-7b"),
                      memory_utilization=0.98)
    assert pm.activation_limit_bytes(d, 1e9, 1.0) == pytest.approx(1e9 + 64e9 * 0.02)


# --------------------------------------------------------------------------- hosts: the cross-host term (issue 22)


def test_interconnect_and_moe_layers_are_in_the_profiles():
    # Atlas 800T A2: 8 NPUs; HCCS 392 GB/s per chip bidirectional (196 each way); one 200GE RoCE port per NPU
    assert (B3.npus_per_host, B3.intra_host_gbs, B3.inter_host_gbs) == (8, 196, 25)
    assert B3.intra_host_gbs > 7 * B3.inter_host_gbs  # what leaves the host is the slow part
    # DeepSeek-V3 config.json: 61 layers, first_k_dense_replace 3, hidden 7168, 256 routed experts, top-8, 1 shared
    assert (V3.layers, V3.moe_layer_count, V3.hidden_size, V3.experts, V3.experts_per_token, V3.shared_experts) == (
        61, 58, 7168, 256, 8, 1)
    assert V3.kv_heads == 1  # MLA: one latent per token and layer
    assert V2_LITE.moe_layer_count == 26 and QWEN7B.moe_layer_count == 0
    assert DEFAULT_EFFICIENCY.inter_host_latency_us == 30


# The pre-issue-22 model's numbers (git show b61fd79:cli/dsctl/core/perf/perfmodel.py): one host must not move them.
V3_W8A8_16_DECODE_32_S = 0.03386564813094061
V3_W8A8_16_PREFILL_1024_S = 0.044047916666666416
QWEN7B_8_DECODE_32_S = 0.007827901920000001


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_one_node_gives_exactly_the_single_host_numbers(expert_parallel):
    v3 = Deployment(B3, V3, chips=16, weight_bytes=1.0, nodes=1, expert_parallel=expert_parallel)
    assert decode_step_seconds(v3, 32, 32 * 1152) == V3_W8A8_16_DECODE_32_S
    assert prefill_seconds(v3, 1024) == V3_W8A8_16_PREFILL_1024_S
    qwen = Deployment(B3, QWEN7B, chips=8, nodes=1, expert_parallel=expert_parallel)
    assert decode_step_seconds(qwen, 32, 32 * 1152) == QWEN7B_8_DECODE_32_S
    assert pm.cross_host_seconds(v3, 4096) == pm.NO_CROSS_HOST
    assert step_seconds(v3, 256, 1000, 8, 16000) == step_seconds(Deployment(B3, V3, chips=16, weight_bytes=1.0),
                                                                 256, 1000, 8, 16000)


def test_two_hosts_of_eight_are_slower_than_one_host_of_sixteen():
    one = Deployment(B3, V3, chips=16, weight_bytes=1.0, expert_parallel=True, tensor_parallel=8)  # same layout
    two = Deployment(B3, V3, chips=16, weight_bytes=1.0, expert_parallel=True, nodes=2)
    assert (two.chips_per_node, two.tensor_parallel_size, two.tensor_parallel_nodes) == (8, 8, 1)
    for batch in (1, 32, 256):
        cross = pm.cross_host_seconds(two, batch)
        assert cross.all_reduce_s == 0.0  # TP 8 stays inside a host
        # 58 MoE layers x (tokens / 16 chips x 7168 x 2 B x top-8 x (dispatch + combine) x 1/2 on the other host
        # / 25 GB/s + 2 messages x 30 us)
        per_layer = batch / 16 * 7168 * 2 * 8 * 2 * (1 / 2)
        assert cross.bytes_per_chip == pytest.approx(58 * per_layer)
        assert cross.all_to_all_s == pytest.approx(58 * (per_layer / 25e9 + 2 * 30e-6))
        slow, fast = decode_step_seconds(two, batch, batch * 1152), decode_step_seconds(one, batch, batch * 1152)
        assert slow == pytest.approx(fast + cross.total_s)
        assert slow > fast
    # a 4096-token prefill: 1.7 GB per chip over RoCE, 72 ms on top of the chips' own 70 ms (nothing overlapped)
    cross = pm.cross_host_seconds(two, 4096)
    assert cross.bytes_per_chip == pytest.approx(58 * 4096 / 16 * 7168 * 2 * 8)
    assert prefill_seconds(two, 4096) == pytest.approx(prefill_seconds(one, 4096) + cross.total_s)
    # more hosts, more of every token's experts elsewhere
    four = Deployment(B3, V3, chips=16, weight_bytes=1.0, expert_parallel=True, nodes=4)
    assert pm.cross_host_seconds(four, 32).all_to_all_s > pm.cross_host_seconds(two, 32).all_to_all_s


def test_a_tensor_parallel_group_across_hosts_all_reduces_over_roce():
    d = Deployment(B3, V3, chips=16, weight_bytes=1.0, nodes=2)  # no EP: one TP group of 16 over 2 hosts
    assert (d.tensor_parallel_size, d.tensor_parallel_nodes) == (16, 2)
    cross = pm.cross_host_seconds(d, 32)
    assert cross.all_to_all_s == 0.0
    # 2 all-reduces per layer x 61; hierarchical: each chip carries 1/8 of the message, the 2-host ring 2 x 1/2 of it
    per_reduce = 2 * (1 / 2) * (32 * 7168 * 2) / 8
    assert cross.all_reduce_s == pytest.approx(122 * (per_reduce / 25e9 + 2 * 30e-6))
    # a dense model over two hosts pays it too
    dense = pm.cross_host_seconds(Deployment(B3, QWEN7B, chips=16, nodes=2), 32)
    assert dense.all_reduce_s > 0 and dense.all_to_all_s == 0.0


def test_a_dense_model_with_tp_inside_one_host_has_no_cross_host_term():
    for chips in (1, 4, 8):
        d = Deployment(B3, QWEN7B, chips=chips)
        assert pm.cross_host_seconds(d, 2048) == pm.NO_CROSS_HOST
    # expert parallel asked for a dense model: nothing to dispatch (vLLM ignores the flag), TP stays whole
    ignored = Deployment(B3, QWEN7B, chips=8, expert_parallel=True)
    assert not ignored.experts_sharded and ignored.tensor_parallel_size == 8


def test_deployment_refuses_layouts_it_cannot_model():
    with pytest.raises(UsageError, match=r"nodes must be between 1 and chips \(8\), got 16"):
        Deployment(B3, V3, chips=8, nodes=16)
    with pytest.raises(UsageError, match=r"tensor_parallel \(3\) must divide chips \(16\)"):
        Deployment(B3, V3, chips=16, expert_parallel=True, tensor_parallel=3)
    with pytest.raises(UsageError, match="must equal chips .* for a dense model"):
        Deployment(B3, QWEN7B, chips=16, tensor_parallel=8)
    wide = Deployment(B3, V3, chips=16, nodes=2, expert_parallel=True, tensor_parallel=16)  # TP across hosts
    cross = pm.cross_host_seconds(wide, 32)
    assert cross.all_reduce_s > 0 and cross.all_to_all_s > 0
