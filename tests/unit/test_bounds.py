"""Bounded work: the request, token and concurrency caps, the lazy arrival schedule, YAML alias expansion and
output paths checked before a run (issue 12)."""

from __future__ import annotations

import os
import resource
import time

import pytest
import yaml

from dsctl.adapters import output_paths
from dsctl.adapters.inventory import check_yaml_bounds
from dsctl.core.fleet import yaml_bounds
from dsctl.core.load import arrivals, limits
from dsctl.core.load.workload import LengthSpec
from dsctl.core.perf.estimate import estimate
from dsctl.errors import UsageError
from dsctl.services.probe import ProbeConfig, make_plan


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def billion_laughs(levels: int = 9) -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    previous = "a"
    for name in "bcdefghijklmnop"[:levels - 1]:
        text += f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    return text


# -- caps ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, needle", [
    (ProbeConfig(url="http://127.0.0.1:9", rate=1.0, requests=999_999_999_999), "--requests 999999999999"),
    (ProbeConfig(url="http://127.0.0.1:9", concurrency=1_000_000_000), "--concurrency 1000000000"),
    (ProbeConfig(url="http://127.0.0.1:9", rate=1.0, warmup=10**9), "--warmup"),
    (ProbeConfig(url="http://127.0.0.1:9", rate=1.0, prompt_tokens="99999999999"), "--prompt-tokens"),
    (ProbeConfig(url="http://127.0.0.1:9", rate=1.0, output_tokens="uniform:1:99999999999"), "--output-tokens"),
    (ProbeConfig(url="http://127.0.0.1:9", rate=1e9, duration=1e6), "--rate x --duration"),
])
def test_a_huge_probe_is_refused_in_one_line_before_anything_is_built(cfg, needle):
    before, started = _peak_rss_mb(), time.monotonic()
    with pytest.raises(UsageError) as refused:
        make_plan(cfg)
    assert time.monotonic() - started < 1.0
    assert _peak_rss_mb() - before < 50  # nothing the size of the request was allocated
    message = str(refused.value)
    assert needle in message and "\n" not in message
    assert any(str(limit) in message for limit in (limits.MAX_REQUESTS, limits.MAX_TOKENS, limits.MAX_CONCURRENCY))


def test_the_caps_themselves_are_allowed():
    plan = make_plan(ProbeConfig(url="http://127.0.0.1:9", rate=1.0, requests=limits.MAX_REQUESTS,
                                 concurrency=limits.MAX_CONCURRENCY, prompt_tokens=str(limits.MAX_TOKENS)))
    assert plan.total_planned == limits.MAX_REQUESTS
    assert not isinstance(plan.load.schedule, list)  # generated while the probe runs


def test_a_normal_length_is_capped_at_its_clip_not_its_mean():
    assert LengthSpec.parse("normal:512:64").longest == 768
    with pytest.raises(ValueError, match=f"up to {1000 + 4 * limits.MAX_TOKENS} tokens"):
        LengthSpec.parse(f"normal:1000:{limits.MAX_TOKENS}", "--prompt-tokens")


@pytest.mark.parametrize("kwargs, needle", [
    ({"concurrency": 1_000_000_000}, "--concurrency 1000000000"),
    ({"prompt_tokens": 99_999_999_999}, "--prompt-tokens"),
    ({"output_tokens": 10**8}, "--output-tokens"),
])
def test_estimate_refuses_beyond_the_caps(kwargs, needle):
    started = time.monotonic()
    with pytest.raises(UsageError, match=needle):
        estimate("910B3", "r1-7b", **{"prompt_tokens": 128, "output_tokens": 16, **kwargs})
    assert time.monotonic() - started < 1.0


def test_estimate_burst_ttft_in_closed_form_matches_the_waves():
    e = estimate("910B3", "r1-7b", prompt_tokens=512, output_tokens=64, concurrency=1000)
    batch, cycle = e.running_batch, e.running_batch * e.ttft_s + 63 * e.decode_step_s
    waits = [(i // batch) * cycle + (i % batch + 1) * e.ttft_s for i in range(1000)]
    assert e.ttft_mean_s == pytest.approx(sum(waits) / 1000, rel=1e-9)
    assert e.ttft_worst_s == pytest.approx(max(waits), rel=1e-9)


# -- burstiness ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_burstiness_zero_or_negative_is_refused_not_read_as_one(value):
    with pytest.raises(UsageError, match="--burstiness .*greater than 0"):
        make_plan(ProbeConfig(url="http://127.0.0.1:9", rate=2.0, arrival="gamma", burstiness=value))


def test_burstiness_is_kept_as_given():
    plan = make_plan(ProbeConfig(url="http://127.0.0.1:9", rate=2.0, arrival="gamma", burstiness=0.25))
    assert plan.spec is not None and plan.spec.burstiness == 0.25


# -- the lazy schedule -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, kwargs", [
    (arrivals.ArrivalSpec("poisson", 4.0), {"requests": 500}),
    (arrivals.ArrivalSpec("gamma", 4.0, burstiness=0.5), {"requests": 300, "duration": 40.0}),
    (arrivals.ArrivalSpec("constant", 2.0), {"duration": 30.0}),
    (arrivals.ArrivalSpec("ramp", 1.0, ramp_to=8.0), {"requests": 200}),
    (arrivals.ArrivalSpec("poisson", 3.0), {"duration": 20.0}),
])
def test_the_lazy_schedule_is_the_same_on_every_pass_and_counts_itself(spec, kwargs):
    times = arrivals.release_times(spec, seed=7, **kwargs)
    first, second = list(times), list(times)
    assert first == second and len(first) == times.count and first[-1] == times.last
    assert first == sorted(first)
    if "requests" in kwargs and spec.process != "ramp" and "duration" not in kwargs:
        assert times.last == pytest.approx(kwargs["requests"] / spec.rate)  # vLLM's N / rate rescaling


def test_a_large_schedule_is_not_a_list_and_stays_small():
    before = _peak_rss_mb()
    times = arrivals.release_times(arrivals.ArrivalSpec("poisson", 100.0), requests=limits.MAX_REQUESTS)
    assert times.count == limits.MAX_REQUESTS and times.last == pytest.approx(1000.0)
    assert _peak_rss_mb() - before < 20  # a list of 100 000 floats alone would be several MB


def test_a_schedule_above_the_request_cap_is_refused():
    with pytest.raises(ValueError, match=f"more than the {limits.MAX_REQUESTS}"):
        arrivals.release_times(arrivals.ArrivalSpec("poisson", 1.0), requests=limits.MAX_REQUESTS + 1)


# -- YAML aliases ----------------------------------------------------------------------------------------------

def test_an_alias_bomb_is_refused_quickly():
    started = time.monotonic()
    with pytest.raises(yaml_bounds.TooLarge, match="expand to more than"):
        yaml_bounds.check(billion_laughs(), "hosts.yml")
    assert time.monotonic() - started < 1.0


def test_too_many_aliases_are_refused():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * (yaml_bounds.MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(yaml_bounds.TooLarge, match=f"more than {yaml_bounds.MAX_ALIASES} YAML aliases"):
        yaml_bounds.check(text, "hosts.yml")


def test_a_recursive_alias_is_refused_and_ordinary_aliases_pass():
    with pytest.raises(yaml_bounds.TooLarge):
        yaml_bounds.check("x: &a [1, *a]\n", "hosts.yml")
    text = "base: &base {user: root, port: 22}\nhosts: {a: *base, b: *base}\n"
    assert yaml_bounds.safe_load(text, "hosts.yml")["hosts"]["b"] == {"user": "root", "port": 22}
    assert yaml_bounds.expanded_size(yaml.compose(text), 100) == 21  # root, 2 keys, base (5) and 2 copies


def test_not_yaml_is_left_to_its_reader():
    yaml_bounds.check("a: [unclosed\n", "hosts.yml")  # Ansible reports it with file, line and column


def test_an_inventory_with_a_bomb_in_group_vars_is_refused_before_ansible(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    npu_nodes:\n      hosts:\n        a: {}\n")
    (tmp_path / "group_vars" / "npu_nodes").mkdir(parents=True)
    bomb = tmp_path / "group_vars" / "npu_nodes" / "site.yml"
    bomb.write_text(billion_laughs())
    started = time.monotonic()
    with pytest.raises(UsageError, match=f"inventory: {bomb}: its YAML aliases expand"):
        check_yaml_bounds(tmp_path / "hosts.yml")
    with pytest.raises(UsageError, match="its YAML aliases expand"):
        check_yaml_bounds(tmp_path)  # an inventory directory too
    assert time.monotonic() - started < 1.0


def test_the_sample_inventory_passes():
    sample = os.path.join(os.path.dirname(__file__), "..", "..", "inventories", "sample", "hosts.yml")
    check_yaml_bounds(__import__("pathlib").Path(sample))


# -- output paths ----------------------------------------------------------------------------------------------

def test_output_files_and_directories_are_checked_without_creating_them(tmp_path):
    output_paths.check_file("--record", tmp_path / "r.jsonl")
    output_paths.check_dir("--run-dir", tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match="--record .*does not exist"):
        output_paths.check_file("--record", tmp_path / "missing" / "r.jsonl")
    with pytest.raises(UsageError, match="--csv .*is a directory"):
        output_paths.check_file("--csv", tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="--run-dir .*not a directory"):
        output_paths.check_dir("--run-dir", tmp_path / "f")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(UsageError, match="--record .*not writable"):
        output_paths.check_file("--record", locked / "r.jsonl")


# -- the one number rule (issue 41) ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "low", "high", "needle"), [
    (float("nan"), 0, 1, "--x nan: not a finite number; give a finite value in units, from 0 to 1"),
    (float("inf"), None, 10, "--x inf: not a finite number; give a finite value in units, up to 10"),
    (float("-inf"), None, None, "--x -inf: not a finite number"),
    (float("9" * 400), 0, None, "--x inf: not a finite number"),  # float() reads 400 digits as inf
    (int("9" * 400), 0, 10, "--x (a 400-digit number): more than the 10 units dsctl allows; lower it"),
    (-1, 0, 10, "--x must be at least 0, got -1; raise it"),
    (10.5, 0, 10, "--x 10.5: more than the 10 units dsctl allows; lower it"),
])
def test_the_number_rule_refuses_what_is_not_finite_or_out_of_bounds(value, low, high, needle):
    with pytest.raises(ValueError) as refused:
        limits.number("--x", value, low, high, "units")
    assert needle in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("value", [0, 10, 0.0, 10.0, 5.5])
def test_the_number_rule_takes_its_bounds_themselves(value):
    limits.number("--x", value, 0, 10, "units")


@pytest.mark.parametrize("text", ["normal:1e308:1e308", "normal:nan:1", "normal:inf:1", "normal:1:nan",
                                  f"uniform:1:{'9' * 400}", "9" * 400])
def test_a_length_that_overflows_is_refused_before_any_arithmetic(text):
    with pytest.raises(ValueError, match="--prompt-tokens"):
        LengthSpec.parse(text, "--prompt-tokens")
