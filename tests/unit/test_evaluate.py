"""The offline evaluator: the engine's start-up plan and scheduler in virtual time, measured as `dsctl probe` does."""

from __future__ import annotations

import itertools
import time

import pytest

from dsctl.core.load.arrivals import ArrivalSpec
from dsctl.core.load.workload import LengthSpec, Workload
from dsctl.core.perf import perfmodel as pm
from dsctl.core.perf.engine_config import CONTINUOUS, FIXED_BATCH, EngineConfig
from dsctl.core.perf.evaluate import FAILED_TO_START, FAILED_UNDER_LOAD, Target, best, evaluate, run_target

MODEL = "deepseek-r1-distill-qwen-7b"
WORKLOAD = Workload(LengthSpec.parse("uniform:64:1024"), LengthSpec.parse("uniform:16:192"), seed=0)
FIXED = EngineConfig(MODEL, mode=FIXED_BATCH, max_model_len=4096)
# The three SLO/load pairs of engine_sched's docstring table.
TARGETS = (Target("itl p99 <= 20 ms at 1 req/s", 1.0, {"itl": 20.0}),
           Target("e2el p99 <= 15 s at 1 req/s", 1.0, {"e2el": 15000.0}),
           Target("tpot p99 <= 60 ms at 4 req/s", 4.0, {"tpot": 60.0}))
GRID = {"batch_size": (1, 4, 16, 64), "stream_num": (1, 2, 8), "kv_sparse_threshold": (0.0, 0.15, 0.5)}


def test_a_few_hundred_requests_take_well_under_a_second():
    workload = Workload(LengthSpec.parse("uniform:64:1024"), LengthSpec.parse("uniform:16:128"), seed=1)
    began = time.process_time()
    result = evaluate(EngineConfig(MODEL, max_model_len=4096), workload, ArrivalSpec(rate=4), 300,
                      goodput_ms={"ttft": 200})
    assert time.process_time() - began < 0.6
    assert result.ok and result.metrics["completed"] == 300
    assert 0 < result.metrics["request_goodput"] <= result.metrics["request_throughput"]
    assert result.value("ttft", "median") < result.value("ttft", "p99")


def test_configurations_fail_to_start_and_under_load_in_the_engines_words():
    too_many_slots = evaluate(FIXED.with_(batch_size=64, stream_num=8), WORKLOAD, ArrivalSpec(rate=1), 10)
    assert too_many_slots.status == FAILED_TO_START and "NPU out of memory" in too_many_slots.message
    profiling = evaluate(EngineConfig(MODEL, max_model_len=4096, gpu_memory_utilization=0.25), WORKLOAD,
                         ArrivalSpec(rate=1), 10)
    assert profiling.status == FAILED_TO_START and "No available memory for the cache blocks" in profiling.message
    heads = evaluate(EngineConfig(MODEL, tensor_parallel_size=8), WORKLOAD, ArrivalSpec(rate=1), 10)
    assert heads.status == FAILED_TO_START and "divisible by tensor parallel size (8)" in heads.message
    # a batch of long prompts is prefilled in one step: past the allocator's largest block it fails (the guide's
    # pitfall no. 1); dsctl's provisioned PYTORCH_NPU_ALLOC_CONF (expandable segments) gives it the room
    long_prompts = Workload(LengthSpec.parse("uniform:1024:3000"), LengthSpec.parse("uniform:16:64"), seed=0)
    big_batch = FIXED.with_(batch_size=64, stream_num=1)
    fragmenting = evaluate(big_batch, long_prompts, ArrivalSpec(rate=8), 100)
    assert fragmenting.status == FAILED_UNDER_LOAD and "aclrtMalloc failed" in fragmenting.message
    assert fragmenting.metrics["failed"] > 0
    assert evaluate(big_batch.with_(alloc_conf="expandable_segments:True"), long_prompts, ArrivalSpec(rate=8), 100).ok
    # sparsity is what lets 64 x 8 slots start at all
    assert evaluate(FIXED.with_(batch_size=64, stream_num=8, kv_sparse_threshold=0.5), WORKLOAD, ArrivalSpec(rate=1),
                    10).ok


def test_sparsity_trades_memory_for_agreement_with_the_guides_anchor():
    # the guide: 0.15 compresses a 128K-token KV cache of "over 20 GB" to 12 GB
    assert 20 * pm.kv_keep_fraction(0.15) == pytest.approx(12.0)
    agreements = [evaluate(FIXED.with_(batch_size=4, kv_sparse_threshold=t), WORKLOAD, ArrivalSpec(rate=1),
                           5).agreement for t in (0.0, 0.05, 0.15, 0.5, 0.9)]
    assert agreements[0] == 1.0 and agreements == sorted(agreements, reverse=True)
    assert agreements[2] == pytest.approx(0.92)


def test_no_single_corner_wins():
    """engine_sched's docstring: the best fixed-batch configuration for three SLO/load pairs."""
    names = list(GRID)
    configs = [FIXED.with_(**dict(zip(names, values, strict=True))) for values in itertools.product(*GRID.values())]
    winners = []
    for target in TARGETS:
        top = best([run_target(config, target, WORKLOAD, 100) for config in configs], target)
        assert top is not None, target.name
        winners.append((top.config.batch_size, top.config.stream_num, top.config.kv_sparse_threshold))
    assert winners == [(4, 1, 0.15), (16, 1, 0.15), (64, 2, 0.15)]
    corners = set(itertools.product(*((values[0], values[-1]) for values in GRID.values())))
    assert not corners & set(winners) and len(set(winners)) == 3


def test_continuous_batching_meets_what_fixed_batches_cannot():
    target = Target("ttft p99 <= 200 ms at 4 req/s", 4.0, {"ttft": 200.0})
    assert target.meets(run_target(EngineConfig(MODEL, mode=CONTINUOUS, max_model_len=4096), target, WORKLOAD, 100))
    assert not any(target.meets(run_target(FIXED.with_(batch_size=b, stream_num=s), target, WORKLOAD, 100))
                   for b, s in ((4, 4), (16, 2), (64, 1)))


def test_streams_pay_where_throughput_binds_not_where_latency_binds():
    """Fixed batch of 8 per stream: a second and third stream fill the chip a batch of 8 leaves idle and hide host
    work; past that, each further stream only adds contention (engine_sched's docstring table)."""
    batch8 = FIXED.with_(batch_size=8)
    throughput_bound = Target("tpot p99 <= 60 ms at 8 req/s", 8.0, {"tpot": 60.0})
    sweep = {s: run_target(batch8.with_(stream_num=s), throughput_bound, WORKLOAD, 200) for s in range(1, 9)}
    throughput = {s: e.metrics["request_throughput"] for s, e in sweep.items()}
    best_streams = max(throughput, key=throughput.get)
    assert 1 < best_streams < 8, throughput  # interior: neither 1 nor the tune space's maximum (8)
    assert throughput[best_streams] > 1.3 * throughput[1] and throughput[best_streams] > 1.15 * throughput[8]
    assert best(list(sweep.values()), throughput_bound).config.stream_num == best_streams
    tpots = [sweep[s].value("tpot") for s in range(1, 9)]
    assert tpots == sorted(tpots)  # every stream added slows every stream's steps
    latency_bound = Target("tpot p99 <= 20 ms at 1 req/s", 1.0, {"tpot": 20.0})
    meeting = [s for s in (1, 2, 3, 8) if latency_bound.meets(run_target(batch8.with_(stream_num=s), latency_bound,
                                                                          WORKLOAD, 100))]
    assert meeting == [1]


def test_long_context_sparsity_is_best_at_a_moderate_threshold():
    """32K-64K prompts: sparsity frees KV (a config that cannot run unsparsified runs) and decode reads, recalls of
    dropped pairs grow faster than the reads saved, and the agreement floor refuses 0.20."""
    long_context = Workload(LengthSpec.parse("uniform:32000:64000"), LengthSpec.parse("uniform:1024:2048"), seed=0)
    config = FIXED.with_(batch_size=2, stream_num=3, max_model_len=68000, alloc_conf="expandable_segments:True")
    target = Target("tpot p99 <= 100 ms, agreement >= 0.9", 2.0, {"tpot": 100.0})
    thresholds = (0.0, 0.05, 0.10, 0.15, 0.20)
    sweep = {t: run_target(config.with_(kv_sparse_threshold=t), target, long_context, 12) for t in thresholds}
    passing = [t for t in thresholds if target.meets(sweep[t])]
    assert passing == [0.0, 0.05, 0.10, 0.15]  # 0.15 is the loosest the agreement floor passes
    winner = best(list(sweep.values()), target).config.kv_sparse_threshold
    assert winner not in (0.0, passing[-1]), {t: target.goodput(e) for t, e in sweep.items()}
    # memory: four streams of two 68K slots need sparsity to run at all
    four_streams = [run_target(config.with_(stream_num=4, kv_sparse_threshold=t), target, long_context, 8).ok
                    for t in (0.0, 0.10)]
    assert four_streams == [False, True]


def test_a_128k_prefill_is_not_blocked_by_a_materialised_mask():
    """The fixed-batch prefill's attention is fused (torch_npu npu_fusion_attention's compressed 2048 x 2048 mask):
    a 128K prompt needs its activations, not a 32 GiB prompt x prompt mask."""
    d = pm.Deployment(pm.chip_by_name("910B3"), pm.model_by_name(MODEL))
    fused = pm.step_activation_bytes(d, 131000, 1, 131000, 131000, fused_mask=True)
    assert fused - 131000 * pm.activation_bytes_per_token(d) - pm.logits_bytes(d, 1) == pm.FUSED_ATTENTION_MASK_BYTES
    prompts = Workload(LengthSpec.parse("uniform:120000:126000"), LengthSpec.parse("uniform:16:64"), seed=0)
    result = evaluate(FIXED.with_(batch_size=1, stream_num=1, max_model_len=131072,
                                  alloc_conf="expandable_segments:True"), prompts, ArrivalSpec(rate=1), 3)
    assert result.ok, result.message
