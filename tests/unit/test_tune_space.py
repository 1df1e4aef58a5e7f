"""Search spaces: checked against the parameter registry, version-gated, dependencies, --param overrides."""

from __future__ import annotations

import copy

import pytest

from dsctl.core.serving import service
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.optuna_study import distributions
from dsctl.core.tune.space import parse_override, resolve_space
from dsctl.errors import UsageError


@pytest.mark.parametrize("name", space_mod.space_names())
def test_every_shipped_space_resolves_and_its_corners_pass_the_registry(name):
    space = resolve_space(name, vllm_ascend="v0.13.0", npus_per_instance=8)
    assert space.knobs, name
    distributions(space)  # Optuna accepts every knob
    for corner in (0, -1):  # every knob at its low end, then at its high end
        config = {knob.name: (knob.values or (knob.low, knob.high))[corner] for knob in space.knobs}
        params = space.params(config)
        assert service.check_params(space.engine, params, vllm_ascend="v0.13.0") == params, (name, corner)


def test_default_spaces_per_engine():
    assert space_mod.default_space("vllm-ascend") == "vllm-ascend"
    assert space_mod.default_space("mindie") == "mindie"
    assert space_mod.default_space("lab-engine") == "fixed-batch"


def test_field_guide_space_and_lossy_knobs():
    space = resolve_space("fixed-batch")
    assert space.names == ("batch_size", "stream_num", "kv_sparse_threshold")
    assert space.lossy == ("kv_sparse_threshold",)
    assert space.params({"batch_size": 8, "stream_num": 4, "kv_sparse_threshold": 0.15}) == \
        {"batch_size": 8, "stream_num": 4, "max_num_seqs": 32, "kv_sparse_threshold": 0.15}
    added = resolve_space("lab-continuous", overrides=["quantization=ascend"])
    assert added.knob("quantization").lossy  # lossy by its registry name, whichever space it joins


def _spaces_with(knobs: dict) -> dict:
    data = copy.deepcopy(space_mod.spaces_data())
    data["spaces"]["test"] = {"engine": "vllm-ascend", "knobs": knobs}
    return data


def test_version_gated_and_unknown_knobs_are_dropped_with_a_note():
    data = _spaces_with({"max_num_seqs": {"type": "int", "low": 8, "high": 64},
                         "enable_mlapo": {"type": "bool"},
                         "torchair_graph_mode": {"param": "torchair_graph_config", "type": "categorical",
                                                 "choices": [1]},
                         "batch_size": {"type": "int", "low": 1, "high": 8}})
    old = resolve_space("test", vllm_ascend="v0.13.0", spaces=data)
    assert old.names == ("max_num_seqs",)
    notes = "\n".join(old.notes)
    assert "enable_mlapo: needs vllm-ascend v0.21.0rc1 or later" in notes
    assert "torchair_graph_mode: removed in vllm-ascend v0.13.0rc1" in notes
    assert "batch_size: vllm-ascend has no parameter batch_size" in notes
    new = resolve_space("test", vllm_ascend="v0.21.0rc1", spaces=_spaces_with({"enable_mlapo": {"type": "bool"}}))
    assert new.names == ("enable_mlapo",)


def test_a_range_outside_the_registry_is_a_data_bug():
    data = _spaces_with({"gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 1.2}})
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        resolve_space("test", spaces=data)
    data = _spaces_with({"max_num_seqs": {"type": "float", "low": 1, "high": 2}})
    with pytest.raises(ValueError, match="does not match the registry's int"):
        resolve_space("test", spaces=data)


def test_tp_times_dp_equals_the_instance_npus():
    space = resolve_space("vllm-ascend", npus_per_instance=8)
    assert space.knob("tensor_parallel_size").choices == (1, 2, 4, 8)
    assert space.fields({"tensor_parallel_size": 2}) == {"tensor_parallel_size": 2, "data_parallel_size": 4}
    constraint = next(c for c in space.constraints if c.kind == "product")
    assert constraint.violation({"tensor_parallel_size": 2, "data_parallel_size": 2, "npus_per_instance": 8})
    assert constraint.violation({"tensor_parallel_size": 2, "data_parallel_size": 4, "npus_per_instance": 8}) is None
    lab = resolve_space("lab-continuous", npus_per_instance=4)
    assert "tensor_parallel_size" not in lab.names  # no data parallelism: tp is the NPU count, nothing to search
    with pytest.raises(UsageError, match="does not divide the instance's 8 NPUs"):
        resolve_space("vllm-ascend", npus_per_instance=8, overrides=["tensor_parallel_size=3"])


def test_every_fixed_batch_candidate_is_valid_and_prefill_batch_at_most_batch():
    fixed = resolve_space("fixed-batch")
    for batch in (1, 6, 64):  # batch_size is per stream: any batch with any stream count is a valid candidate
        for streams in (1, 3, 8):
            config = {"batch_size": batch, "stream_num": streams, "kv_sparse_threshold": 0.0}
            assert fixed.violations(config) == []
            assert fixed.params(config)["max_num_seqs"] == batch * streams
    mindie = resolve_space("mindie")
    config = {"maxBatchSize": 200, "maxPrefillBatchSize": 0.25}
    assert mindie.params(config)["maxPrefillBatchSize"] == 50 and mindie.violations(config) == []
    absolute = resolve_space("mindie", overrides=["maxPrefillBatchSize=10:400"])
    problems = absolute.violations({"maxBatchSize": 100, "maxPrefillBatchSize": 300})
    assert problems == ["maxPrefillBatchSize 300 > maxBatchSize 100: MindIE needs maxPrefillBatchSize <= maxBatchSize"]
    # a name outside the space comes from the service's current params
    pinned = resolve_space("mindie", params={"maxPreemptCount": 500})
    assert any("maxPreemptCount 500 > maxBatchSize 100" in p
               for p in pinned.violations({"maxBatchSize": 100, "maxPrefillBatchSize": 0.5}))


def test_overrides_narrow_extend_pin_and_add():
    space = resolve_space("vllm-ascend", overrides=[
        "max_num_seqs=16:256:log", "gpu_memory_utilization=0.85:0.95", "enable_chunked_prefill=true",
        "max_num_batched_tokens=2048,4096,8192", "block_size=64,128"])
    assert space.knob("max_num_seqs").text == "16:256:log"
    assert space.knob("gpu_memory_utilization").low == 0.85 and space.knob("gpu_memory_utilization").step == 0.01
    assert space.knob("enable_chunked_prefill").choices == (True,)
    assert space.knob("max_num_batched_tokens").choices == (2048, 4096, 8192)
    assert space.knob("block_size").choices == (64, 128)
    narrowed = resolve_space("fixed-batch", overrides=["batch_size=2:16", "stream_num=1"])
    assert narrowed.knob("batch_size").high == 16 and narrowed.knob("stream_num").choices == (1,)
    assert narrowed.params({"batch_size": 4, "stream_num": 1, "kv_sparse_threshold": 0.0})["stream_num"] == 1
    with pytest.raises(UsageError, match="max_num_seqs follows batch_size x stream_num in space fixed-batch"):
        resolve_space("fixed-batch", overrides=["max_num_seqs=2:16"])


@pytest.mark.parametrize(("override", "message"), [
    ("max_num_seq=1:8", "'max_num_seq' is not a vllm-ascend knob; did you mean max_num_seqs?"),
    ("gpu_memory_utilisation=0.8:0.9", "did you mean gpu_memory_utilization?"),
    ("gpu_memory_utilization=0.5:1.2", "1.2 is not allowed for gpu_memory_utilization: expected a number > 0.0"),
    ("max_num_seqs=64:16", "the low end 64 is above the high end 16"),
    ("max_num_seqs=1.5:16", "max_num_seqs takes integers"),
    ("max_num_seqs=0:16:log", "a log scale needs a positive low end"),
    ("enable_chunked_prefill=yes", "enable_chunked_prefill is true or false"),
    ("block_size=1:128", "block_size takes a set of values, not a range"),
    ("block_size=100", "100 is not allowed for block_size"),
    ("compilation_config=1", "compilation_config is a JSON parameter"),
    ("max_num_seqs", "expected name=lo:hi[:log] or name=a,b,c"),
    ("max_num_seqs=1:2:3", "a range is lo:hi or lo:hi:log"),
    ("stream_num=1,,2", "an empty value between commas"),
    ("max_num_seqs=8,8", "a value is listed twice"),
])
def test_override_errors_are_one_line(override, message):
    with pytest.raises(UsageError) as caught:
        resolve_space("vllm-ascend", npus_per_instance=4, overrides=[override])
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"--param {override!r}")


def test_gated_override_is_refused_with_the_gate():
    with pytest.raises(UsageError, match="needs vllm-ascend v0.21.0rc1 or later"):
        resolve_space("vllm-ascend", vllm_ascend="v0.13.0", overrides=["enable_mlapo=true,false"])


def test_unknown_space_gets_did_you_mean():
    with pytest.raises(UsageError, match="did you mean fixed-batch"):
        resolve_space("fixed_batch")


def test_parse_override_shapes():
    assert parse_override("a=1:2:log").log
    assert parse_override("a=1,2").values == ("1", "2")


def test_baseline_from_current_params_and_containment():
    space = resolve_space("mindie", npus_per_instance=4)
    base = space.baseline({"maxBatchSize": 200, "maxPrefillBatchSize": 50}, {"tensor_parallel_size": 4})
    assert base["maxPrefillBatchSize"] == 0.25 and base["tensor_parallel_size"] == 4
    assert base["maxQueueDelayMicroseconds"] == 5000  # MindIE's registry default
    outside = space.violations({**base, "maxBatchSize": 5})
    assert outside == ["maxBatchSize: 5 outside 10:1000:log"]


def test_baseline_of_flags_left_out_is_the_engines_own_value():
    space = resolve_space("fixed-batch")
    # a service that sets neither batch_size nor stream_num runs continuous batching: no fixed-batch baseline
    assert space.baseline({"max_num_seqs": 16}) == {"kv_sparse_threshold": 0.0}
    assert space.baseline({"batch_size": 4, "stream_num": 1}) == \
        {"batch_size": 4, "stream_num": 1, "kv_sparse_threshold": 0.0}


def test_the_registrys_own_rules_apply_to_candidates():
    space = resolve_space("mindie", params={"maxSeqLen": 4096}, overrides=["maxIterTimes=1000:8000"])
    config = {**space.baseline({"maxSeqLen": 4096}), "maxIterTimes": 5000}
    assert space.violations(config) == ["params.maxIterTimes: 5000 is more than maxSeqLen (4096); "
                                        "the output cap must fit the context"]
    assert space.violations({**config, "maxIterTimes": 4000}) == []


def test_stream_num_one_is_rendered_as_an_explicit_flag():
    from dsctl.core.serving import service

    space = resolve_space("fixed-batch")
    params = space.params({"batch_size": 4, "stream_num": 1, "kv_sparse_threshold": 0.0})
    service.check_params("lab-engine", params)  # the registry's rules hold (stream_num <= max_num_seqs)
    assert params["stream_num"] == 1 and params["max_num_seqs"] == 4


def test_a_tensor_parallel_move_keeps_each_npus_share_of_a_step():
    """A layout move scales the per-rank step budget (max_num_batched_tokens) by the new TP degree over the old,
    on the knob's grid and within its range; `moved_knob` names such a move by its parallel knob, and nothing
    else that changes two knobs."""
    space = resolve_space("vllm-ascend", npus_per_instance=8)
    base = {"max_num_seqs": 128, "max_num_batched_tokens": 1418, "gpu_memory_utilization": 0.9,
            "enable_chunked_prefill": True, "enable_prefix_caching": False, "enforce_eager": False,
            "multistream_overlap_shared_expert": False, "tensor_parallel_size": 2}
    base = {k: v for k, v in base.items() if k in space.names}
    layout = [m for m in space.neighbours(base) if m["tensor_parallel_size"] != 2]
    assert [(m["tensor_parallel_size"], m["max_num_batched_tokens"]) for m in layout] == [(1, 709), (4, 2836)]
    assert all(m["max_num_seqs"] == 128 for m in layout)  # a cap, not a step's work: it stays
    assert all(space.moved_knob(base, m) == "tensor_parallel_size" for m in layout)
    assert space.moved_knob(base, {**base, "max_num_batched_tokens": 709}) == "max_num_batched_tokens"
    assert space.moved_knob(base, {**base, "tensor_parallel_size": 1, "max_num_batched_tokens": 800}) is None
    assert space.moved_knob(base, {**base, "tensor_parallel_size": 1, "max_num_seqs": 64}) is None
    low = {**base, "max_num_batched_tokens": 600}  # 300 is below the knob's range: the move stops at its low end
    assert [m["max_num_batched_tokens"] for m in space.neighbours(low) if m["tensor_parallel_size"] == 1] == [512]
    assert space.moved_knob(low, {**low, "tensor_parallel_size": 1, "max_num_batched_tokens": 512}) == (
        "tensor_parallel_size")
    narrowed = resolve_space("vllm-ascend", npus_per_instance=8, overrides=["max_num_batched_tokens=512:4096"])
    assert narrowed.knob("max_num_batched_tokens").per_tp_group  # a narrowed range is still a per-rank budget


def test_the_services_own_configuration_is_a_point_of_the_space_it_is_tuned_in():
    """The live tune's first trial is the inventory's configuration: a value outside the shipped range widens the
    knob (noted), on a stepped knob only when it is on the grid; a knob the user narrowed keeps its range (noted)."""
    space = space_mod.resolve_space("vllm-ascend", npus_per_instance=1, params={})
    current = {"max_num_seqs": 2, "max_num_batched_tokens": 65536, "gpu_memory_utilization": 0.555}
    baseline = space.baseline(current, {"tensor_parallel_size": 1})
    assert not space.knob("max_num_seqs").contains(2)

    wider = space_mod.including_baseline(space, baseline)
    assert wider.knob("max_num_seqs").contains(2) and wider.knob("max_num_seqs").high == 512
    assert wider.knob("max_num_seqs").log is True
    assert wider.knob("max_num_batched_tokens").contains(65536)
    assert wider.baseline(current, {"tensor_parallel_size": 1})["max_num_seqs"] == 2
    assert "max_num_seqs: searched over 2:512:log, widened from 8:512:log to hold the service's 2 (the baseline)" \
        in wider.notes
    # 0.555 is off the 0.01 grid: the knob keeps its range and the note says the first trial is not the service's
    assert wider.knob("gpu_memory_utilization") == space.knob("gpu_memory_utilization")
    assert any(note.startswith("gpu_memory_utilization: the service's 0.555 is outside") for note in wider.notes)

    narrowed = space_mod.including_baseline(space, baseline, ["max_num_seqs"])
    assert narrowed.knob("max_num_seqs") == space.knob("max_num_seqs")
    assert any(note.startswith("max_num_seqs: the service's 2 is outside the searched 8:512:log (--param)")
               for note in narrowed.notes)
    inside = space.baseline({"max_num_seqs": 64}, {"tensor_parallel_size": 1})
    assert space_mod.including_baseline(space, inside) == space  # nothing to widen, nothing noted
