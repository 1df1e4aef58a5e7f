"""The engine's step scheduler on a virtual clock: batching, chunking, KV pressure, multi-stream mode."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from dsctl.core.perf import perfmodel as pm
from dsctl.core.perf.engine_sched import Request, Scheduler, simulate

MODEL = "deepseek-r1-distill-qwen-7b"


def deployment(**kwargs) -> pm.Deployment:
    return pm.Deployment(pm.chip_by_name("910B3"), pm.model_by_name(MODEL), **kwargs)


D = deployment()
CAPACITY = pm.check_fits(D, 8192)


def scheduler(d: pm.Deployment = D, capacity: int = CAPACITY, **kwargs) -> Scheduler:
    kwargs.setdefault("max_num_batched_tokens", 2048)
    return Scheduler(d, kv_capacity_tokens=capacity, **kwargs)


def poisson(rate: float, n: int, prompt: int = 1024, output: int = 128, seed: int = 1) -> list[Request]:
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate) if rate != math.inf else 0.0
        requests.append(Request(f"r{i}", prompt, output, arrival=t))
    return requests


def ttfts(done: list[Request]) -> list[float]:
    return [r.first_token_at - r.arrival for r in done]


def itls(done: list[Request]) -> list[float]:
    return [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:], strict=False)]


def test_one_request_is_one_prefill_then_one_decode_step_per_token():
    s = scheduler()
    s.add(Request("a", 100, 3))
    duration, events = s.step()
    assert duration == pytest.approx(pm.step_seconds(D, 100, 0, 0, 0))
    assert [(r.id, n) for r, n in events] == [("a", 1)]
    duration, _ = s.step()
    assert duration == pytest.approx(pm.step_seconds(D, 0, 0, 1, 101))
    duration, events = s.step()
    assert duration == pytest.approx(pm.step_seconds(D, 0, 0, 1, 102))
    request = events[0][0]
    assert request.finished and request.output_tokens == 3
    assert s.step() == (0.0, [])
    assert s.free_blocks == s.num_blocks


def test_ttft_rises_with_offered_load():
    means = []
    for rate in (1, 4, 8, 16):
        done = simulate(scheduler(), poisson(rate, 200))
        assert len(done) == 200
        means.append(statistics.mean(ttfts(done)))
    assert means == sorted(means) and means[-1] > 10 * means[0], means


def test_ttft_rises_with_the_running_batch():
    """A new request's prefill shares its step with every running decode: more decodes, slower first token."""
    results = []
    for batch in (1, 32, 128, 255):
        s = scheduler(max_num_seqs=256)
        background = [Request(f"bg{i}", 16, 4000, arrival=0.0) for i in range(batch)]
        probe = Request("probe", 512, 4, arrival=5.0)
        simulate(s, [*background, probe], horizon=8.0)
        results.append(probe.first_token_at - probe.arrival)
    assert results == sorted(results) and results[-1] > 1.2 * results[0], results


def test_max_num_seqs_trades_token_latency_for_throughput():
    stats = []
    for seqs in (16, 64, 256):
        done = simulate(scheduler(max_num_seqs=seqs), poisson(20, 300))
        span = max(r.finished_at for r in done) - min(r.arrival for r in done)
        stats.append((statistics.mean(itls(done)), sum(r.output_tokens for r in done) / span))
    token_latency = [itl for itl, _ in stats]
    throughput = [tput for _, tput in stats]
    assert token_latency == sorted(token_latency), stats
    assert throughput == sorted(throughput), stats


def test_chunked_prefill_bounds_the_tokens_of_every_step():
    s = scheduler(max_num_batched_tokens=512, enable_chunked_prefill=True)
    done = simulate(s, [Request("long", 5000, 2), *(Request(f"s{i}", 300, 20, arrival=0.01 * i) for i in range(8))])
    assert len(done) == 9
    assert max(s.iteration_tokens) <= 512
    long = next(r for r in done if r.id == "long")
    assert long.first_token_at > pm.step_seconds(D, 512, 0, 0, 0) * math.ceil(5000 / 512) * 0.99


def test_without_chunked_prefill_prompts_are_prefilled_whole():
    s = scheduler(max_num_batched_tokens=8192, enable_chunked_prefill=False)
    simulate(s, [Request(f"r{i}", 3000, 2) for i in range(3)])
    prefill_steps = [t for t in s.iteration_tokens if t >= 3000]
    assert prefill_steps and all(t % 3000 == 0 or t > 3000 for t in prefill_steps)
    assert max(s.iteration_tokens) <= 8192
    with pytest.raises(ValueError, match="chunked prefill is off"):
        scheduler(max_num_batched_tokens=1024, enable_chunked_prefill=False).add(Request("x", 2000, 10))


def test_requests_wait_while_the_kv_cache_is_full():
    s = scheduler(capacity=128 * 10, block_size=128)  # 10 blocks
    for i in range(6):
        s.add(Request(f"r{i}", 300, 10))  # 3 blocks each for the prompt, 3 for prompt + output
    most_running = 0
    while s.has_work():
        s.step()
        most_running = max(most_running, s.num_running)
        assert s.free_blocks >= 0 and s.kv_usage <= 1.0
    assert most_running == 3
    assert s.free_blocks == s.num_blocks


def test_preemption_under_kv_pressure_recomputes_and_still_finishes():
    s = scheduler(capacity=128 * 40, max_num_seqs=64)
    requests = [Request(f"r{i}", 200, 600) for i in range(20)]  # 20 x 800 tokens >> 5120 tokens of KV
    done = simulate(s, requests)
    assert len(done) == 20
    assert s.num_preemptions > 0
    assert any(r.preemptions for r in done)
    assert all(r.output_tokens == 600 and len(r.token_times) == 600 for r in done)
    assert s.generation_tokens_total == 20 * 600
    assert s.free_blocks == s.num_blocks
    # the preempted request is the newest running one: the oldest request is never preempted
    assert requests[0].preemptions == 0


def test_kv_pressure_shows_as_token_latency_spikes():
    roomy = simulate(scheduler(max_num_seqs=64), [Request(f"r{i}", 200, 600) for i in range(20)])
    tight = simulate(scheduler(capacity=128 * 40, max_num_seqs=64), [Request(f"r{i}", 200, 600) for i in range(20)])
    assert max(itls(tight)) > 3 * max(itls(roomy))


def test_abort_frees_the_request_at_once():
    s = scheduler()
    a, b = Request("a", 1000, 50), Request("b", 1000, 50)
    s.add(a)
    s.add(b)
    s.step()
    assert s.abort("a") and a.status == "aborted"
    assert not s.abort("a")
    while s.has_work():
        s.step()
    assert b.finished and s.free_blocks == s.num_blocks


def test_add_rejects_what_could_never_run():
    with pytest.raises(ValueError, match="KV blocks"):
        scheduler(capacity=1024).add(Request("x", 1000, 100))
    with pytest.raises(ValueError, match="stream_num"):
        scheduler(max_num_seqs=4, stream_num=8)


def test_multi_stream_mode_runs_fixed_batches_to_completion():
    s = scheduler(max_num_seqs=8, stream_num=2)  # two streams of 4 slots
    assert s.batch_size == 4
    requests = [Request(f"r{i}", 64, 10 + 30 * (i % 2)) for i in range(12)]
    for r in requests:
        s.add(r)
    first_batch: dict[int, set[str]] = {}
    while s.has_work():
        s.poll()
        for stream in s.streams:
            assert len(stream.running) <= 4
            if stream.running:
                first_batch.setdefault(stream.index, {r.id for r in stream.running})
        s.step()
    assert all(r.finished for r in requests)
    # requests 8..11 could only start once a whole batch had drained (its slowest request finished)
    first_drain = min(max(r.finished_at for r in requests if r.id in ids) for ids in first_batch.values())
    assert min(r.scheduled_at for r in requests[8:]) >= first_drain - 1e-9


def test_fixed_batch_streams_trade_first_token_throughput_and_token_latency():
    """More streams drain a batch more often and hide host work (TTFT down, throughput up) but share the device
    (ITL up, and past the host share throughput falls again): the best stream count depends on the load."""
    def run(rate: float, streams: int) -> tuple[float, float, float]:
        done = simulate(scheduler(mode="fixed-batch", batch_size=4, stream_num=streams),
                        poisson(rate, 80, prompt=256, output=64))
        return (statistics.mean(ttfts(done)), statistics.mean(itls(done)),
                sum(r.output_tokens for r in done) / max(r.finished_at for r in done))

    light = {streams: run(1, streams) for streams in (1, 2, 4)}
    heavy = {streams: run(4, streams) for streams in (1, 2, 4)}
    # ITL up by less than the stream count: a batch of 4 leaves part of the chip idle for the others to fill
    assert light[4][0] < light[1][0] / 2 and 1.3 * light[1][1] < light[4][1] < 2 * light[1][1], light
    assert heavy[2][2] > heavy[1][2] * 1.1 and heavy[2][2] > heavy[4][2], heavy
    assert heavy[2][0] < heavy[4][0] < heavy[1][0], heavy  # at load, 2 streams beat both corners on TTFT


def test_fixed_batch_pads_finished_slots_and_runs_host_work_between_device_steps():
    s = scheduler(mode="fixed-batch", batch_size=2, stream_num=1)
    s.add(Request("a", 100, 2))
    s.add(Request("b", 100, 5))
    duration, _ = s.step()  # both prompts at once
    per_seq = D.efficiency.host_ms_per_seq / 1e3
    assert duration == pytest.approx(pm.step_seconds(D, 200, 0, 0, 0) + 2 * per_seq)
    s.step()
    duration, events = s.step()  # "a" is done: its slot still decodes as padding
    assert [r.id for r, _ in events] == ["b"]
    assert duration == pytest.approx(pm.step_seconds(D, 0, 0, 2, 102) + 2 * per_seq)


def test_continuous_batching_has_no_streams():
    with pytest.raises(ValueError, match="fixed-batch knob"):
        scheduler(mode="continuous", stream_num=2)


def test_kv_sparsity_makes_decode_faster_and_the_cache_larger():
    sparse = deployment(kv_keep_fraction=pm.kv_keep_fraction(0.15))  # the guide's threshold
    assert pm.check_fits(sparse, 8192) > CAPACITY
    dense_done = simulate(scheduler(), [Request(f"r{i}", 4000, 200) for i in range(64)])
    sparse_done = simulate(scheduler(sparse, pm.check_fits(sparse, 8192)),
                           [Request(f"r{i}", 4000, 200) for i in range(64)])
    assert statistics.mean(itls(sparse_done)) < statistics.mean(itls(dense_done))


def test_jitter_is_seeded():
    def finish_times(seed: int) -> list[float]:
        return [r.finished_at for r in simulate(scheduler(jitter=0.2, seed=seed), poisson(8, 40))]

    assert finish_times(1) == finish_times(1)
    assert finish_times(1) != finish_times(2)
    assert finish_times(1) != [r.finished_at for r in simulate(scheduler(), poisson(8, 40))]


# --------------------------------------------------------------------------- every tunable knob has an effect


def test_prefix_caching_skips_the_shared_prefix():
    shared = tuple(range(8))  # 8 blocks = 1024 tokens of the same prefix

    def first_token_times(caching: bool) -> list[float]:
        requests = [Request(f"r{i}", 1100, 4, arrival=i * 1.0, block_hashes=shared) for i in range(4)]
        done = simulate(scheduler(enable_prefix_caching=caching), requests)
        return [r.first_token_at - r.arrival for r in sorted(done, key=lambda r: r.arrival)]

    cold, warm = first_token_times(False), first_token_times(True)
    assert warm[0] == pytest.approx(cold[0])  # nothing cached yet
    assert all(w < c / 3 for w, c in zip(warm[1:], cold[1:], strict=True))


def test_enforce_eager_pays_per_layer_launches():
    eager = simulate(scheduler(enforce_eager=True), poisson(2, 20))
    graph = simulate(scheduler(), poisson(2, 20))
    extra = D.model.layers * D.efficiency.eager_ms_per_layer / 1e3
    assert statistics.mean(itls(eager)) == pytest.approx(statistics.mean(itls(graph)) + extra, rel=0.05)


def test_pa_shape_list_and_block_size_change_the_attention_cost():
    def decode_step(**kwargs) -> float:
        s = scheduler(max_num_batched_tokens=65536, **kwargs)
        for i in range(16):
            s.add(Request(f"r{i}", 3000, 3))
        _, events = s.step()  # all 16 prefills in one step
        assert len(events) == 16
        duration, events = s.step()  # one decode step of the 16
        assert len(events) == 16
        return duration

    fia = decode_step()
    assert decode_step(pa_shape_list=[16]) < fia < decode_step(pa_shape_list=[4, 128]) + 1e-12
    assert decode_step(block_size=16) > fia


def test_shared_expert_overlap_hides_collectives_only_for_moe_over_several_chips():
    lite = pm.Deployment(pm.chip_by_name("910B3"), pm.model_by_name("deepseek-v2-lite"), chips=2)
    capacity = pm.check_fits(lite, 8192)

    def mean_itl(d: pm.Deployment, cap: int, on: bool) -> float:
        return statistics.mean(itls(simulate(Scheduler(d, kv_capacity_tokens=cap, multistream_overlap_shared_expert=on),
                                             poisson(2, 10))))

    assert mean_itl(lite, capacity, True) < mean_itl(lite, capacity, False)
    assert mean_itl(D, CAPACITY, True) == mean_itl(D, CAPACITY, False)  # dense 7B: no shared experts


def test_a_step_beyond_the_allocator_limit_raises_out_of_memory():
    from dsctl.core.perf.engine_sched import OutOfMemory

    limit = pm.step_activation_bytes(D, 2048, 1, 2048, 2048) * 1.01
    s = scheduler(activation_limit=limit, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    s.add(Request("short", 2000, 2))
    simulate(s, [])
    s.add(Request("long", 4000, 2))
    with pytest.raises(OutOfMemory, match="aclrtMalloc failed"):
        s.step()


def test_an_instance_over_two_hosts_gets_the_cross_host_cost_and_one_host_nothing():
    # DeepSeek-V3 W8A8 with expert parallel over 16 NPUs: the scheduler's steps are perfmodel.step_seconds, so the
    # RoCE all-to-all shows in every token's latency when the chips span two hosts, and one host changes nothing.
    chip, v3 = pm.chip_by_name("910B3"), pm.model_by_name("deepseek-v3")
    base = pm.Deployment(chip, v3, chips=16, weight_bytes=1.0)
    one_host = pm.Deployment(chip, v3, chips=16, weight_bytes=1.0, nodes=1, expert_parallel=True)
    two_hosts = pm.Deployment(chip, v3, chips=16, weight_bytes=1.0, nodes=2, expert_parallel=True)
    capacity = pm.check_fits(base, 8192)

    def run(d: pm.Deployment) -> list[Request]:
        return simulate(scheduler(d, capacity), poisson(4, 12, prompt=512, output=32))

    same, base_run, spread = run(one_host), run(base), run(two_hosts)
    assert [(r.first_token_at, r.finished_at) for r in same] == [(r.first_token_at, r.finished_at) for r in base_run]
    assert statistics.mean(itls(spread)) > statistics.mean(itls(base_run))
    assert statistics.mean(ttfts(spread)) > statistics.mean(ttfts(base_run))
