"""Layouts of an instance over several hosts in the offline engine and `dsctl tune --simulate --nodes` (issue 22).

A MoE model's DP ranks run as one instance of all TP x DP NPUs (experts over all of them, attention in DP groups of
TP, the ranks in lockstep); a dense model's as independent replicas; one TP group on one host exactly as before.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dsctl.core.load.arrivals import ArrivalSpec
from dsctl.core.load.workload import LengthSpec, Workload
from dsctl.core.perf import perfmodel as pm
from dsctl.core.perf.engine_config import FIXED_BATCH, EngineConfig, StartupFailure, plan, scheduler
from dsctl.core.perf.evaluate import evaluate
from dsctl.core.tune.search import Candidate
from dsctl.errors import ExitStatus, UsageError
from dsctl.services import tune

WORKLOAD = Workload(LengthSpec.parse("uniform:64:1024"), LengthSpec.parse("uniform:16:128"), seed=3)

# Computed with the code before the layouts existed (git stash of this change, the same calls): one TP group on one
# host must give these numbers to the bit.  (plan: capacity tokens, KV budget, activation peak, start-up;
# evaluate of 80 Poisson requests at 3 req/s, seed 1: duration s, ttft p99, tpot mean, itl p90, e2el median ms.)
SINGLE_HOST = {
    "r1-7b fixed-batch 4x2": (
        EngineConfig("r1-7b", mode=FIXED_BATCH, batch_size=4, stream_num=2, max_model_len=4096),
        (32768, 1879048192.0, 38980951808.0, 67.62),
        (28.465452515941266, 3746.4923427560097, 22.710453760701498, 26.771883455083636, 3315.956897826555)),
    "r1-7b vllm tp4": (
        EngineConfig("r1-7b", tensor_parallel_size=4, max_model_len=4096, max_num_seqs=64),
        (3666786, 52567046528.0, 222953472.0, 67.62),
        (26.95010360289575, 35.81621670508239, 9.203454898678116, 9.011305919999657, 608.0207306637276)),
    "v2-lite tp2 ep": (
        EngineConfig("deepseek-v2-lite", tensor_parallel_size=2, enable_expert_parallel=True, max_model_len=8192),
        (1306919, 40650438912.0, 249561088.0, 75.7),
        (26.91675676319999, 35.517385086488815, 9.818255485651935, 11.387413923646506, 685.5625919977363)),
    "v3 w8a8 tp16 ep one host": (
        EngineConfig("deepseek-v3", tensor_parallel_size=16, enable_expert_parallel=True, weight_bytes=1.0,
                     max_model_len=8192, visible_npus=16),
        (203106, 14272691872.0, 389808128.0, 395.5),
        (27.04221993825071, 80.64022319957515, 15.75356052990502, 18.729446781012626, 1107.1430417869738)),
    "v3 w8a8 tp16 one host": (
        EngineConfig("deepseek-v3", tensor_parallel_size=16, weight_bytes=1.0, max_model_len=8192, visible_npus=16,
                     max_num_seqs=128),
        (204048, 14338883232.0, 323616768.0, 395.5),
        (27.04221993825071, 80.64022319957515, 15.75356052990502, 18.729446781012626, 1107.1430417869738)),
}
# The same, for two small single-host tunes (budget 3): every trial's (number, failure, objective).  (Refreshed when
# the rate search began to resolve throughput-bound tops at the server's completion rate: rate_search.py.)
SINGLE_HOST_TUNES = {
    "r1-7b vllm-ascend 1 npu": (
        {"model": "r1-7b", "npus_per_instance": 1},
        [(0, "screened", None), (1, "screened", None), (2, None, 36.93210391120725), (3, None, 34.3578306280526),
         (4, None, 36.24505053075838)]),
    "v2-lite vllm-ascend 2 npus tp2": (
        {"model": "deepseek-v2-lite", "npus_per_instance": 2, "params": ("tensor_parallel_size=2",)},
        [(0, "screened", None), (1, None, 55.52404105916339), (2, None, 72.77572260615518),
         (3, None, 105.40282784744358)]),
}


@pytest.mark.parametrize("name", list(SINGLE_HOST))
def test_one_tp_group_on_one_host_gives_exactly_the_numbers_it_gave_before(name):
    config, planned, measured = SINGLE_HOST[name]
    p = plan(config)
    assert (p.capacity_tokens, p.kv_budget_bytes, p.activation_peak, p.startup_s) == planned
    assert p.replicas == 1 and p.data_parallel == 1
    e = evaluate(config, WORKLOAD, ArrivalSpec(rate=3.0), 80, seed=1)
    m = e.metrics
    assert e.ok and (m["duration_s"], m["ttft_ms"]["p99"], m["tpot_ms"]["mean"], m["itl_ms"]["p90"],
                     m["e2el_ms"]["median"]) == measured


@pytest.mark.parametrize("name", list(SINGLE_HOST_TUNES))
def test_single_host_tunes_search_and_score_as_before(tmp_path, name):
    changes, trials = SINGLE_HOST_TUNES[name]
    inputs = tune.TuneInputs(chip="910B3", slos=("ttft:median=2s",), run_dir=tmp_path / "run", engine="vllm-ascend",
                             prompt_tokens="uniform:64:512", output_tokens="uniform:16:64", window_s=5.0,
                             max_model_len=4096, budget=3, alloc_conf="", **changes)  # the allocator as before
    result = tune.run(inputs)
    assert [(t.number, t.failure, t.objective) for t in result.trials] == trials
    assert "enable_expert_parallel" not in result.space.names  # no layout knob on one host


def _v3(**changes) -> EngineConfig:
    base = dict(tensor_parallel_size=4, data_parallel_size=4, enable_expert_parallel=True, nodes=2, weight_bytes=1.0,
                max_model_len=8192, visible_npus=8, max_num_seqs=64, max_num_batched_tokens=4096)
    return EngineConfig("deepseek-v3", **{**base, **changes})


def test_a_moe_instance_over_two_hosts_is_one_lockstep_deployment_of_all_its_npus():
    p = plan(_v3())
    d = p.deployment
    assert (d.chips, d.nodes, d.tensor_parallel_size, d.data_parallel, d.experts_sharded) == (16, 2, 4, 4, True)
    assert p.replicas == 1 and p.data_parallel == 4
    # every DP group keeps its own always-active weights over its 4 TP chips; the routed experts over all 16
    always = pm.model_by_name("deepseek-v3").always_active_params_b * pm.GB  # 1 byte each (int8)
    assert pm.weights_bytes_per_chip(d) == pytest.approx(always / 4 + (671e9 - always) / 16)
    assert pm.weights_bytes_per_chip(d) > pm.weights_bytes(d) / 16
    # one request must fit in its own DP group: the engine's max-model-len check is per group
    with pytest.raises(pm.DoesNotFit) as caught:  # the instance holds 4 x 136038 tokens, a group 136038
        pm.check_fits(pm.Deployment(d.chip, d.model, chips=16, weight_bytes=1.0, nodes=2, expert_parallel=True,
                                    tensor_parallel=4), 163840)
    assert caught.value.reason == "max_model_len" and "estimated maximum model length is 136038" in str(caught.value)
    assert caught.value.capacity_tokens // 4 == 136038
    # MLA's latent is replicated over a TP group but each request lives in one DP group: KV splits 4 ways
    assert pm.kv_shards(d) == 4
    # vLLM schedules per DP rank: the instance admits 4 x max_num_seqs and 4 x the token budget
    s = scheduler(p)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (4 * 64, 4 * 4096)
    # without expert parallel the experts are tensor-parallel over all 16 (vLLM flattens TP across DP): same chips,
    # an all-gather + reduce-scatter between the hosts instead of the all-to-all
    flat = plan(_v3(enable_expert_parallel=False)).deployment
    assert flat.chips == 16 and flat.experts_flattened and not flat.experts_sharded
    ep, ag = pm.cross_host_seconds(d, 64), pm.cross_host_seconds(flat, 64)
    assert ep.all_reduce_s == ag.all_reduce_s == 0.0 and ag.all_to_all_s > ep.all_to_all_s > 0


def test_multi_node_layouts_vllm_ascend_cannot_start_are_refused_in_its_words():
    with pytest.raises(StartupFailure, match=r"data_parallel_size \(3\) does not spread over 2 nodes"):
        plan(_v3(data_parallel_size=3, tensor_parallel_size=4))
    with pytest.raises(StartupFailure, match=r"world_size \(16\) is less than than max local gpu count \(8\)"):
        plan(_v3(tensor_parallel_size=8, data_parallel_size=4))  # 8 x 2 local ranks on an 8-NPU node
    with pytest.raises(StartupFailure, match=r"must be divisible by expert parallel size \(24\)"):
        plan(_v3(tensor_parallel_size=4, data_parallel_size=6, nodes=3))


def test_a_dense_models_dp_ranks_are_independent_replicas():
    one = EngineConfig("r1-7b", tensor_parallel_size=1, max_model_len=4096, max_num_seqs=8)  # saturated at 12/s
    two = one.with_(data_parallel_size=2)
    p = plan(two)
    assert p.replicas == 2 and p.deployment.chips == 1 and p.data_parallel == 1
    busy = ArrivalSpec(rate=12.0)
    alone, pair = evaluate(one, WORKLOAD, busy, 200), evaluate(two, WORKLOAD, busy, 200)
    assert alone.ok and pair.ok and pair.kv_capacity_tokens == 2 * alone.kv_capacity_tokens
    assert pair.metrics["completed"] == 200
    assert pair.metrics["request_throughput"] > 1.8 * alone.metrics["request_throughput"]
    assert pair.value("ttft", "p99") < alone.value("ttft", "p99")


def v3_inputs(tmp_path: Path, **changes) -> tune.TuneInputs:
    base = dict(model="deepseek-v3", chip="910B3", slos=("tpot:median=50ms",), run_dir=tmp_path / "run",
                engine="vllm-ascend", budget=3, prompt_tokens="uniform:256:1024", output_tokens="uniform:32:128",
                nodes=2, npus_per_instance=16, weight_bytes=1.0, window_s=5.0, max_model_len=8192)
    return tune.TuneInputs(**{**base, **changes})


def test_a_two_node_deepseek_v3_tune_searches_layouts_and_reports_the_best(tmp_path):
    began = time.process_time()
    result = tune.run(v3_inputs(tmp_path))
    assert time.process_time() - began < 10
    assert result.exit_status == ExitStatus.OK and result.best is not None and result.best.feasible
    space = result.space
    assert {"tensor_parallel_size", "enable_expert_parallel"} <= set(space.names)
    assert space.knob("tensor_parallel_size").choices == (1, 2, 4, 8)  # TP inside a host of 8
    layout = result.to_dict()["layout"]
    tp, dp = layout["tensor_parallel_size"], layout["data_parallel_size"]
    assert tp * dp == 16 and 8 % tp == 0 and layout["data_parallel_size_local"] == dp // 2
    assert layout["nodes"] == 2 and layout["npus_per_node"] == 8 and isinstance(layout["enable_expert_parallel"], bool)
    assert layout["enable_expert_parallel"] == result.best.params["enable_expert_parallel"]
    text = tune.layout_text(layout)
    assert text.startswith(f"TP {tp} x DP {dp} ({dp // 2} per host) over 2 hosts x 8 NPUs")
    # capacity per NPU divides by all 16
    assert result.best.capacity["per_npu"] == pytest.approx(result.best.capacity["sustained_rate"] / 16)
    for trial in result.trials:
        if trial.fields:
            assert trial.fields["tensor_parallel_size"] * trial.fields["data_parallel_size"] == 16


def test_the_ceiling_over_several_hosts_bounds_every_layout():
    inputs = v3_inputs(Path("."))
    slos, space, workload = tune.resolve(inputs)
    assert sorted(tune.layouts(inputs, space)) == [(t, e) for t in (1, 2, 4, 8) for e in (False, True)]
    ceiling = tune.rate_ceiling(inputs, workload, space)
    widest = tune.capacity.throughput_bound(chip="910B3", model="deepseek-v3", prompt_tokens=256, output_tokens=32,
                                            npus=16, weight_bytes=1.0, nodes=2, tensor_parallel=8,
                                            expert_parallel=True, moe=True)
    assert widest is not None and ceiling >= 2 * widest


def test_expert_parallel_is_searched_only_for_a_moe_model_over_several_hosts(tmp_path):
    dense = tune.resolve(v3_inputs(tmp_path, model="r1-7b"))[1]
    assert "enable_expert_parallel" not in dense.names and "tensor_parallel_size" in dense.names
    assert "enable_expert_parallel: a dense model has no experts to shard; not searched" in dense.notes
    with pytest.raises(UsageError, match=r"^--param enable_expert_parallel=true: r1-7b is a dense model"):
        tune.resolve(v3_inputs(tmp_path, model="r1-7b", params=("enable_expert_parallel=true",)))
    one_host = tune.resolve(v3_inputs(tmp_path, nodes=1, npus_per_instance=8))[1]
    assert "enable_expert_parallel" not in one_host.names
    assert any(note.startswith("enable_expert_parallel: no modelled effect inside one host") for note in
               one_host.notes)
    # a dense model's candidate over two hosts: DP replicas, never expert parallel
    i = v3_inputs(tmp_path, model="r1-7b")
    config = {"tensor_parallel_size": 4}
    engine = tune.engine_config_for(i, dense, Candidate(0, config, dense.params(config), dense.fields(config), False))
    assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.nodes, engine.enable_expert_parallel) == \
        (4, 4, 2, False)
    assert plan(engine).replicas == 4


@pytest.mark.parametrize(("changes", "message"), [
    ({"nodes": 0}, "--nodes must be at least 1, got 0"),
    ({"nodes": 3}, "--nodes 3: the instance's 16 NPUs do not split evenly over 3 hosts"),
    ({"nodes": 2, "npus_per_instance": 32}, "--nodes 2: 16 NPUs per host, but a 910B3 host holds 8"),
    ({"engine": "lab-engine", "params": ()}, "--nodes 2: lab-engine has no data parallelism"),
    ({"weight_bytes": 4.0}, "--weights: 4 bytes per parameter is not one of bf16, int8"),
    ({"params": ("tensor_parallel_size=16",)}, "tensor_parallel_size 16 does not divide one node's 8 NPUs"),
])
def test_bad_layouts_are_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        tune.resolve(v3_inputs(tmp_path, **changes))
    assert "\n" not in str(refused.value)


def test_the_cli_arithmetic_of_an_instances_npus():
    assert tune.instance_npus(nodes=1, npus=None, npus_per_node=None, chip="910B3") == 1
    assert tune.instance_npus(nodes=1, npus=4, npus_per_node=None, chip="910B3") == 4
    assert tune.instance_npus(nodes=2, npus=None, npus_per_node=None, chip="910B3") == 16
    assert tune.instance_npus(nodes=4, npus=None, npus_per_node=4, chip="910B3") == 16
    assert tune.instance_npus(nodes=2, npus=8, npus_per_node=None, chip="910B3") == 8
    for kwargs, words in (({"nodes": 0, "npus": None, "npus_per_node": None}, "--nodes must be at least 1"),
                          ({"nodes": 3, "npus": 16, "npus_per_node": None}, "16 NPUs do not split evenly over 3"),
                          ({"nodes": 2, "npus": 16, "npus_per_node": 4}, "--npus 16 is not --nodes 2 x "
                                                                         "--npus-per-node 4"),
                          ({"nodes": 2, "npus": None, "npus_per_node": 0}, "--npus-per-node must be at least 1")):
        with pytest.raises(UsageError, match=words):
            tune.instance_npus(chip="910B3", **kwargs)
