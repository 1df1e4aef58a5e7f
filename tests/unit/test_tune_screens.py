"""Roofline screens from estimate's model: sound (peak bounds only) and cited."""

from __future__ import annotations

from dsctl.core.tune import screens
from dsctl.core.tune.search import Candidate
from dsctl.core.tune.slo import parse_slos


def test_a_physically_impossible_slo_is_refused_with_the_bound():
    reason = screens.impossible(chip="910B3", model="deepseek-v3", prompt_tokens=131072, output_tokens=256,
                                slos=parse_slos(["ttft=200ms"]), npus_per_instance=8)
    assert reason is not None and reason.startswith("roofline: ttft=200ms: infeasible: prefill of 131072 tokens")
    assert "even at peak compute" in reason


def test_a_reachable_slo_is_not_refused():
    assert screens.impossible(chip="910B3", model="deepseek-r1-distill-qwen-7b", prompt_tokens=1024,
                              output_tokens=256, slos=parse_slos(["ttft=200ms,tpot=50ms"]), npus_per_instance=4) is None


def test_screen_rules_out_configs_that_cannot_start_and_caches():
    screen = screens.roofline_screen(chip="910B3", model="deepseek-r1-distill-qwen-7b", prompt_tokens=1024,
                                     output_tokens=256, slos=parse_slos(["ttft=2s"]), npus_per_instance=1)

    def candidate(utilization):
        return Candidate(number=0, config={}, params={"gpu_memory_utilization": utilization}, fields={},
                         needs_quality=False)

    assert screen(candidate(0.9)) is None
    low = screen(candidate(0.2))  # 64 GB x 0.2 cannot hold 15 GB of weights plus the workspace
    assert low is not None and "does not fit" in low and "The engine stops at start-up" in low


def _candidate(number: int) -> Candidate:
    return Candidate(number=number, config={"x": number}, params={}, fields={}, needs_quality=False)


def _predictor(ttft_ms: dict[int, float]):
    """A model whose TTFT p99 prediction for candidate N is ttft_ms[N] (default 1000 ms)."""
    def predict(candidate: Candidate):
        return None, {"completed": 50, "ttft_ms": {"p99": ttft_ms.get(candidate.number, 1000.0)}}
    return predict


def test_a_model_screen_that_rejects_everything_lets_a_candidate_through_after_a_run_of_rejections():
    screen = screens.ModelScreen(_predictor({}), parse_slos(["ttft=200ms"]), max_rejected_in_a_row=3)
    verdicts = [screen(_candidate(n)) for n in range(8)]
    assert [v is None for v in verdicts] == [False, False, False, True, False, False, False, True]
    assert screen.summary() == {"consulted": 8, "rejected": 6, "overruled": 2, "max_consultations": None,
                                "quality_rejected": 0, "memory_rejected": 0}


def test_a_candidate_the_model_passes_resets_the_run_of_rejections():
    screen = screens.ModelScreen(_predictor({2: 150.0}), parse_slos(["ttft=200ms"]), max_rejected_in_a_row=2)
    verdicts = [screen(_candidate(n)) is None for n in range(6)]
    assert verdicts == [False, False, True, False, False, True]
    assert screen.overruled == 1


def test_model_screen_consultations_are_bounded_per_restart_of_the_budget():
    screen = screens.model_screen(_predictor({}), parse_slos(["ttft=200ms"]), budget=2)
    assert screen.max_consultations == 2 * screens.MODEL_CONSULTATIONS_PER_RESTART
    for n in range(screen.max_consultations + 5):
        screen(_candidate(n))
    assert screen.consulted == screen.max_consultations  # past the bound it is not asked: the measurement decides
    assert screen(_candidate(99)) is None


def _lossy(number: int, agreement: float) -> Candidate:
    return Candidate(number=number, config={"agreement": agreement}, params={}, fields={}, needs_quality=True)


def _agreement_of(candidate: Candidate) -> float:
    return candidate.config["agreement"]


def test_a_lossy_candidate_the_model_predicts_below_the_quality_floor_is_not_started():
    meets = _predictor({0: 100.0})  # every candidate meets the SLO; only its agreement differs
    screen = screens.model_screen(meets, parse_slos(["ttft=200ms"]), min_agreement=0.9, agreement_of=_agreement_of)
    assert screen(_lossy(0, 0.92)) is None
    reason = screen(_lossy(0, 0.88))
    assert reason is not None and "agreement" in reason and "0.88" in reason and "0.9" in reason
    assert screens.model_screen(meets, parse_slos(["ttft=200ms"]), min_agreement=0.85,
                                agreement_of=_agreement_of)(_lossy(0, 0.88)) is None


def test_the_simulated_model_screen_predicts_agreement_from_the_sparsity_threshold():
    from pathlib import Path

    from dsctl.services import tune

    inputs = tune.TuneInputs(model="deepseek-r1-distill-qwen-7b", chip="910B3", slos=("tpot:p90=60ms",),
                             run_dir=Path("."), engine="lab-engine", prompt_tokens="256", output_tokens="32",
                             max_model_len=4096, npus_per_instance=1, budget=4)
    slos, space, workload = tune.resolve(inputs)
    _, model = tune.build_screen(inputs, slos, space, workload)
    assert model is not None

    def candidate(threshold: float) -> Candidate:
        config = {"batch_size": 8, "stream_num": 1, "kv_sparse_threshold": threshold}
        return Candidate(0, config, space.params(config), space.fields(config), threshold > 0)

    assert model.reason(candidate(0.1)) is None  # keeps 71 % of the KV pairs: agreement 0.96 in dsctl's model
    assert "agreement" in (model.reason(candidate(0.5)) or "")  # 0.68


def test_a_quality_verdict_is_never_overruled_and_leaves_the_run_of_rejections_alone():
    # even numbers: lossy below the floor (and meeting the SLO); odd ones: lossless, predicted to miss the SLO
    screen = screens.ModelScreen(_predictor({n: 100.0 for n in range(0, 12, 2)}), parse_slos(["ttft=200ms"]),
                                 max_rejected_in_a_row=2, agreement_of=_agreement_of)
    candidates = [_lossy(n, 0.5) if n % 2 == 0 else _candidate(n) for n in range(12)]
    verdicts = [screen(c) is None for c in candidates]
    # the SLO misses (odd) are overruled every third one; the quality misses (even) never
    assert [v for n, v in enumerate(verdicts) if n % 2 == 0] == [False] * 6
    assert [v for n, v in enumerate(verdicts) if n % 2] == [False, False, True, False, False, True]


def test_a_lossy_candidate_predicted_not_to_start_is_rejected_for_its_quality_and_never_overruled():
    def predict(candidate: Candidate):
        return "RuntimeError: NPU out of memory.", None

    screen = screens.ModelScreen(predict, parse_slos(["ttft=200ms"]), max_rejected_in_a_row=1,
                                 agreement_of=_agreement_of)
    reasons = [screen(_lossy(n, 0.5)) for n in range(4)]
    assert all(reason is not None and "agreement" in reason for reason in reasons)


def test_the_closed_form_agreement_rules_lossy_candidates_out_past_the_consultation_bound():
    screen = screens.model_screen(_predictor({n: 100.0 for n in range(100)}), parse_slos(["ttft=200ms"]), budget=1,
                                  agreement_of=_agreement_of)
    for n in range(screen.max_consultations):  # spend the model's consultations on candidates it passes
        assert screen(_lossy(n, 1.0)) is None
    assert screen(_lossy(98, 0.5)) is not None and screen(_lossy(99, 0.95)) is None
    assert screen.summary()["quality_rejected"] == 1 and screen.consulted == screen.max_consultations


def test_a_memory_verdict_is_ruled_never_overruled_and_no_consultation():
    from dsctl.core.tune.search import CRASH_VIOLATION, Ruled

    def memory(candidate: Candidate):
        if candidate.number % 2:
            return screens.UnderLoad("RuntimeError: NPU out of memory. Tried to allocate 9 GiB", "4 prompts at once")
        return "ValueError: No available memory for the cache blocks."

    screen = screens.model_screen(_predictor({}), parse_slos(["ttft=200ms"]), budget=1, memory_check=memory)
    reasons = [screen(_candidate(n)) for n in range(3 * screens.MODEL_CONSULTATIONS_PER_RESTART)]
    assert all(isinstance(r, Ruled) and r.violation == CRASH_VIOLATION for r in reasons)  # none let through
    assert "under load (4 prompts at once)" in reasons[1] and "would not start" in reasons[0]
    assert screen.consulted == 0 and screen.overruled == 0 and screen.memory_rejected == len(reasons)


def test_the_memory_check_sees_a_step_at_full_concurrency_that_the_lowest_load_never_reaches():
    """bench/tune.py long-fixed: 32K-64K prompts; three sequences per stream start (the KV cache fits) but die when
    both streams prefill at once; two per stream hold under dsctl's memory env (expandable segments), and die under
    the vendor's fragmenting allocator, which the simulated engine gets when the env is not dsctl's."""
    from pathlib import Path

    from dsctl.services import tune

    def checker(alloc_conf: str | None):
        inputs = tune.TuneInputs(model="deepseek-r1-distill-qwen-7b", chip="910B3", slos=("tpot:p90=120ms",),
                                 run_dir=Path("."), engine="lab-engine", prompt_tokens="uniform:32768:65024",
                                 output_tokens="uniform:128:512", max_model_len=65536, npus_per_instance=1, budget=4,
                                 alloc_conf=alloc_conf)
        _slos, space, workload = tune.resolve(inputs)
        check = tune.model_memory(inputs, space, workload)

        def verdict(batch: int, streams: int) -> object:
            config = {"batch_size": batch, "stream_num": streams, "kv_sparse_threshold": 0.0}
            return check(Candidate(0, config, space.params(config), space.fields(config), False))
        return verdict

    deployed, vendor = checker(None), checker("")
    assert deployed(1, 2) is None and deployed(2, 2) is None
    under_load = deployed(3, 2)
    assert isinstance(under_load, screens.UnderLoad) and "aclrtMalloc failed" in under_load.message
    assert under_load.burst == "6 prompts of 65024 tokens at once"  # batch 3 x 2 streams, the longest prompt
    assert isinstance(deployed(32, 8), str)  # the KV cache of 8 x 32 x 64K tokens does not fit at start
    assert vendor(1, 2) is None
    assert isinstance(vendor(2, 2), screens.UnderLoad)


def test_the_quality_floor_narrows_a_lossy_knob_to_the_values_it_lets_through():
    from dsctl.core.tune.space import resolve_space

    space = resolve_space("fixed-batch")
    kv = space.knob("kv_sparse_threshold")

    def agreement_of(candidate: Candidate) -> float:  # 1.0 at 0, falling 0.5 per unit of threshold
        return 1.0 - 0.5 * candidate.config["kv_sparse_threshold"]

    narrowed, notes = screens.quality_narrowed(space, agreement_of, 0.9)
    knob = narrowed.knob("kv_sparse_threshold")
    assert (knob.low, knob.high, knob.step) == (kv.low, 0.2, kv.step)  # 1 - 0.5 x 0.2 = 0.9 passes, 0.25 not
    assert [k.name for k in narrowed.knobs] == [k.name for k in space.knobs]
    assert narrowed.knob("batch_size") == space.knob("batch_size")
    assert len(notes) == 1 and "kv_sparse_threshold" in notes[0] and "0:0.2" in notes[0]
    # a floor every value passes, or a baseline the model itself puts below the floor, leaves the knob alone
    assert screens.quality_narrowed(space, agreement_of, 0.5)[0].knob("kv_sparse_threshold") == kv
    kept, _ = screens.quality_narrowed(space, agreement_of, 0.9, baseline={"kv_sparse_threshold": 0.5})
    assert kept.knob("kv_sparse_threshold") == kv
