"""The tune verb with the real offline evaluator: small budgets and few requests, so each run takes seconds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsctl.core.perf.engine_config import CONTINUOUS, FIXED_BATCH
from dsctl.core.tune import pareto
from dsctl.core.tune.search import Candidate, Failure
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services import tune

# Median SLOs (50 measured requests per probe, the sample-size rule's least) and a 5 s window keep each run cheap.
SMALL = {"model": "r1-7b", "chip": "910B3", "prompt_tokens": "uniform:64:512", "window_s": 5.0,
         "output_tokens": "uniform:16:64", "max_model_len": 4096, "params": ("kv_sparse_threshold=0",)}


def inputs(tmp_path, **changes) -> tune.TuneInputs:
    base = {**SMALL, "slos": ("ttft:median=2s",), "run_dir": tmp_path / "run", "budget": 4}
    return tune.TuneInputs(**{**base, **changes})


def test_finds_a_feasible_configuration_for_an_easy_slo(tmp_path):
    events = []
    result = tune.run(inputs(tmp_path), progress=events.append)
    assert result.exit_status == ExitStatus.OK and result.errors == ()
    best = result.best
    assert best is not None and best.feasible and best.slo_values["ttft:p50"] <= 2000.0
    feasible = [t for t in result.trials if t.feasible and t.evaluated]
    # capacity: the sustained rate; a later trial wins only beyond the noise, so the best is within it of the top
    top = max(t.objective for t in feasible)
    assert best.objective == best.rate and best.objective * (1 + 0.5) >= top
    assert best.rate is not None and best.rate >= tune.MIN_RATE  # the rate was searched
    cap = best.capacity
    assert cap["sustained_rate"] == best.rate and cap["samples"] >= 50 and cap["window_s"] >= 5.0 * 0.9
    assert cap["per_npu"] == best.rate and cap["ceiling"] > best.rate and cap["noise"] > 0
    assert cap["at_ceiling"] is False  # the search found a rate that missed above it
    # every candidate is the fixed-batch engine, max_num_seqs = batch_size x stream_num
    for trial in result.trials:
        p = trial.params
        assert p["max_num_seqs"] == p["batch_size"] * p["stream_num"]
    assert result.counts["evaluated"] == 4 == result.counts["feasible"] + sum(
        result.counts[f.value] for f in Failure if f not in (Failure.SCREENED, Failure.INVALID))
    # trials.jsonl and the Pareto plot in the run directory
    lines = result.trials_path.read_text().splitlines()
    assert len(lines) == len(result.trials)
    assert {pareto.TrialRecord.from_json_line(line).number for line in lines} == {t.number for t in result.trials}
    assert result.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    told = [e for e in events if e.get("event") == "dsctl_tune_trial" and e["phase"] == "told"]
    assert told[-1]["evaluated"] == 4 and told[-1]["best"] == pytest.approx(best.objective)
    json.dumps(result.to_dict())  # the --json data is JSON


def test_nothing_meets_an_slo_the_load_breaks_and_the_closest_is_named(tmp_path):
    result = tune.run(inputs(tmp_path, slos=("ttft:median=300ms",), rate=40.0, objective="goodput",
                             screen="roofline"))
    assert result.exit_status == ExitStatus.SLO_NOT_MET and result.best is None
    closest = result.closest
    measured = [t for t in result.trials if t.evaluated and t.failure == Failure.SLO_MISS]
    assert closest is not None and closest.margin == min(t.margin for t in measured) and closest.margin > 0
    (line,) = result.errors
    assert f"closest: trial {closest.number} (" in line and "binding " in line
    assert f"batch_size={closest.params['batch_size']} " in line and "at 40 req/s" in line


def test_a_physically_impossible_slo_is_refused_before_any_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(DsctlError) as refused:
        tune.run(tune.TuneInputs(model="deepseek-v3", chip="910B3", slos=("ttft=200ms",), run_dir=run_dir,
                                 prompt_tokens="131072", npus_per_instance=16))
    assert refused.value.exit_status == ExitStatus.SLO_NOT_MET
    message = str(refused.value)
    assert "131072-token prompts" in message and "needs at least 10.3 s on 16 910B3 chips" in message
    assert not run_dir.exists()  # nothing ran, nothing was written


def test_resume_continues_the_study_without_repeating_trials(tmp_path):
    first = tune.run(inputs(tmp_path, budget=2))
    started = []
    resumed = tune.run(inputs(tmp_path, budget=4, resume=True),
                       progress=lambda e: started.append(e) if e.get("phase") == "started" else None)
    assert len(started) == 2  # only the two evaluations the budget still allowed
    assert resumed.counts["evaluated"] == 4
    before = {t.number: t.config for t in first.trials}
    assert {t.number: t.config for t in resumed.trials if t.number in before} == before
    assert not {e["number"] for e in started} & set(before)
    with pytest.raises(UsageError, match="already exists in the journal; pass --resume"):
        tune.run(inputs(tmp_path, budget=4))
    with pytest.raises(UsageError, match="another space, SLO or objective"):
        tune.run(inputs(tmp_path, budget=5, slos=("ttft:median=3s",), resume=True))


def test_start_up_failures_become_crash_classes(tmp_path):
    i = inputs(tmp_path)
    slos, space, workload = tune.resolve(i)
    evaluator = tune.simulator(i, slos, space, workload)
    big = {"batch_size": 64, "stream_num": 8, "kv_sparse_threshold": 0.0}
    candidate = Candidate(0, big, space.params(big), {}, False)
    assert tune.engine_config_for(i, space, candidate).mode == FIXED_BATCH
    oom = evaluator(candidate)
    assert oom.failure == Failure.OUT_OF_MEMORY and "NPU out of memory" in oom.detail
    v = dataclasses.replace(i, engine="vllm-ascend", params=("max_num_batched_tokens=256",))
    slos, space, workload = tune.resolve(v)
    config = {"max_num_seqs": 512, "max_num_batched_tokens": 256, "gpu_memory_utilization": 0.9,
              "enable_chunked_prefill": True, "enable_prefix_caching": False, "enforce_eager": False,
              "multistream_overlap_shared_expert": False}
    candidate = Candidate(0, config, space.params(config), {}, False)
    assert tune.engine_config_for(v, space, candidate).mode == CONTINUOUS
    refused = tune.simulator(v, slos, space, workload)(candidate)
    assert refused.failure == Failure.BAD_FLAG and "must be greater than or equal to max_num_seqs" in refused.detail


@pytest.mark.parametrize(("changes", "message"), [
    ({"engine": "mindie"}, "--simulate models lab-engine or vllm-ascend"),
    ({"space": "vllm-ascend", "params": ()}, "it tunes vllm-ascend, not --engine lab-engine"),
    ({"params": ("seed=1,2",)}, "--param seed: --simulate does not model it"),
    ({"requests": 0}, "--requests must be in 1.."),
    ({"requests": 20, "slos": ("ttft=2s",)}, "--requests 20: ttft:p99=2000ms needs at least 1000 measured requests"),
    ({"rate": 4.0}, "--objective capacity searches the rate: drop --rate"),
    ({"slos": ("ttft=fast",)}, "ttft=fast"),
    ({"prompt_tokens": "uniform:9"}, "--prompt-tokens 'uniform:9'"),
])
def test_bad_inputs_are_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message.replace(".", r"\.").replace("(", r"\(")):
        tune.resolve(inputs(tmp_path, **changes))


def test_the_model_screen_starts_no_candidate_it_predicts_to_miss_by_far(tmp_path):
    """At 40 req/s no fixed-batch configuration holds TTFT p99 <= 300 ms: the model screen rules them out before
    any (simulated) restart, and says why."""
    result = tune.run(inputs(tmp_path, slos=("ttft:median=300ms",), rate=40.0, objective="goodput"))
    screened = [t for t in result.trials if t.failure == Failure.SCREENED]
    assert result.best is None and screened
    assert all(t.detail.startswith(("model: ttft:p50 predicted", "roofline:", "model: the engine would not start"))
               for t in screened)
    assert result.counts["evaluated"] < len([t for t in result.trials if t.duplicate_of is None])
