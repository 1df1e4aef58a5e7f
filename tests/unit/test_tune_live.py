"""The live tune's pure parts (how a refused start is read, what counts as the baseline's configuration) and its
end as one transaction, on a fake fleet: the winner deployed and confirmed before --write-back writes it, and the
baseline back on every instance whenever the end fails."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from dsctl.adapters import state_files, tune_artifacts
from dsctl.core.load import generator_limit
from dsctl.core.tune import analysis, search
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import CRASHES, Failure
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services import tune_driver, tune_live, tune_result, tune_search
from tests.unit import test_tune_writeback

# inference_service's failure line (roles/inference_service/tasks/rollout.yml), as deploy returns it.
ROLLED_BACK = ("lab-02: failed at inference_service : Fail with the reason, the rollback's outcome and the failed "
               "configuration's log: chat-1: the new configuration failed: instance exited during start-up: {reason}; "
               "rolled back, the previous configuration serves again | log: INFO: Shutting down")


def test_a_vllm_value_error_at_start_up_is_a_bad_flag_with_vllms_words():
    reason = ("ValueError: max_num_batched_tokens (3475) is smaller than max_model_len (131072). This effectively "
              "limits the maximum sequence length")
    outcome = tune_live.start_failure([ROLLED_BACK.format(reason=reason)], {"host": "lab-02"})
    assert outcome.failure == Failure.BAD_FLAG
    assert outcome.detail == f"instance exited during start-up: {reason}"
    assert outcome.data["host"] == "lab-02"


def test_out_of_memory_and_a_health_timeout_are_classified_from_the_engines_words():
    oom = tune_live.start_failure([ROLLED_BACK.format(
        reason="ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")], {})
    assert oom.failure == Failure.OUT_OF_MEMORY  # the memory words win over the ValueError
    slow = tune_live.start_failure([ROLLED_BACK.format(reason="not ready after 120 s")], {})
    assert slow.failure == Failure.START_TIMEOUT
    other = tune_live.start_failure(["lab-01: unreachable: ssh: connect to host: No route to host"], {})
    assert other.failure == Failure.ERROR and other.detail.startswith("lab-01: unreachable")


def test_the_cann_runtimes_allocation_failure_at_start_is_a_memory_failure():
    # field-practice.md's words; the tuner keeps the allocator's failure apart from vLLM's KV arithmetic
    for reason in ("[ERROR] RUNTIME: aclrtMalloc failed, size=2147483648, error code is 207001",
                   "RuntimeError: ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED"):
        outcome = tune_live.start_failure([ROLLED_BACK.format(reason=reason)], {})
        assert outcome.failure == Failure.ACLRTMALLOC and outcome.failure in CRASHES, reason


def test_same_value_tells_booleans_from_numbers():
    assert tune_live.same_value(0.9, 0.9000000000000001) and not tune_live.same_value(True, 1)
    assert not tune_live.same_value(64, 96) and tune_live.same_value("a", "a")


# --------------------------------------------------------------------------- the end of a tune, one transaction

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample"


class NoPlaybooks:
    """A runner that must not be asked: what is refused, is refused before any instance restarts."""

    def run(self, playbook, *_args, **_kwargs):
        raise AssertionError(f"{playbook} ran before the refusal")


@pytest.fixture(scope="module")
def sample_plan() -> tune_live.LivePlan:
    """The sample inventory's plan (4 instances of chat on 2 hosts), read once: the fleet is never contacted."""
    return tune_live.prepare(tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",),
                                                      run_dir=Path("unused")))


# A copy of the sample inventory per test, and its services file: the write-back tests' own.
inventory = test_tune_writeback.inventory
services_file = test_tune_writeback.services_file


class EndOfTune(tune_live.LiveTune):
    """The fleet as the end of a tune sees it: each deploy is recorded with what the inventory held then, the
    confirming probes are scripted (met, missed or raising)."""

    def __init__(self, inputs, plan, *, met=True, verify_raises=None, final_fails=False):
        self.events: list[tuple[str, Any, str]] = []
        self.notes: list[str] = []
        super().__init__(NoPlaybooks(), None, inputs, plan,
                         lambda event: self.notes.append(event.get("msg", "")))
        self.met, self.verify_raises, self.final_fails = met, verify_raises, final_fails

    def _inventory_text(self) -> str:
        return services_file(self.inputs.inventory).read_text()

    def deploy(self, overrides, *, only=None, artifacts, stop=None):
        self.events.append(("deploy " + artifacts.split("-")[0], None if overrides is None else dict(overrides),
                            self._inventory_text()))
        failed = self.final_fails and artifacts == "final"
        return SimpleNamespace(exit_status=ExitStatus.PLAYBOOK_FAILED if failed else ExitStatus.OK,
                               errors=("atlas-a02: failed at inference_service: chat-1 did not start",)
                               if failed else ())

    def verify(self, rate):
        self.events.append(("verify", rate, self._inventory_text()))
        if self.verify_raises is not None:
            raise self.verify_raises
        return tuple(tune_live.Verification(s.host, s.name, rate, self.met, {"ttft:p99": 120.0 if self.met else
                                                                                 2500.0}, "ttft:p99 ...")
                     for s in self.plan.instances)


def end_of_tune(tmp_path: Path, inventory: Path, plan: tune_live.LivePlan, *, write_back: bool = True, **script
                ) -> tuple[EndOfTune, search.SearchResult, dict[str, Any]]:
    inputs = tune_live.LiveTuneInputs(inventory=inventory, slos=("ttft=2s",), run_dir=tmp_path / "run",
                                      write_back=write_back)
    inputs.run_dir.mkdir()
    config = {**plan.baseline, "max_num_seqs": 128}
    winner = TrialRecord(number=3, controller="controller-0", config=config, params=plan.space.params(config),
                         fields=plan.space.fields(config), evaluated=True, feasible=True, objective=5.0, rate=4.0,
                         slo_values={"ttft:p99": 150.0})
    found = search.SearchResult(trials=[winner], best=winner, counts=analysis.count([winner]), stopped="budget spent",
                                study_name=tune_driver.STUDY)
    return EndOfTune(inputs, plan, **script), found, {**winner.params, **winner.fields}


@pytest.fixture(autouse=True)
def _no_plot(monkeypatch):
    """The Pareto plot is pareto's to test; here it is a file."""
    monkeypatch.setattr(tune_artifacts, "plot", lambda _trials, path, **_kw: path.write_bytes(b"png") and path)


def test_the_winner_is_deployed_and_confirmed_before_it_is_written_back(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan)
    before = services_file(inventory).read_text()
    result = tune_live._finish(tune, found, 0.0)
    # the winner goes out as overrides (as without --write-back) while the inventory still holds the baseline,
    # is confirmed, and only then written
    assert [(kind, arg, text == before) for kind, arg, text in tune.events] == [
        ("deploy final", winner, True), ("verify", 4.0, True)]
    assert result.exit_status == ExitStatus.OK and result.errors == ()
    assert result.deployed == "winner" and result.written == (str(services_file(inventory)),)
    written = yaml.safe_load(services_file(inventory).read_text())["dsctl_services"][0]
    assert written["params"]["max_num_seqs"] == 128 and written["tensor_parallel_size"] == 4
    assert json.loads((tmp_path / "run" / tune_live.RESULT).read_text())["written"] == list(result.written)


def test_a_write_back_that_fails_at_the_end_puts_the_baseline_back(tmp_path, inventory, sample_plan, monkeypatch):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan)
    before = services_file(inventory).read_text()

    replace = state_files.os.replace

    def disk_full(source, destination):  # for the inventory's files only (os is one module: trials.jsonl too)
        if Path(destination).is_relative_to(inventory.parent):
            raise OSError(28, "No space left on device")
        replace(source, destination)

    monkeypatch.setattr(state_files.os, "replace", disk_full)
    result = tune_live._finish(tune, found, 0.0)
    assert [(kind, arg) for kind, arg, _ in tune.events] == [
        ("deploy final", winner), ("verify", 4.0), ("deploy restore", None)]
    assert services_file(inventory).read_text() == before
    assert result.exit_status == ExitStatus.ERROR and result.deployed == "baseline" and result.written == ()
    (line,) = result.errors
    assert line.startswith("--write-back failed after trial 3's configuration was confirmed: [Errno 28] No space "
                           "left on device; every instance of chat restored to the inventory's configuration; its "
                           f"parameters are in {tmp_path / 'run' / tune_live.RESULT}")
    data = json.loads((tmp_path / "run" / tune_live.RESULT).read_text())
    assert data["deployed"] == "baseline" and data["best"]["number"] == 3 and data["written"] == []


def test_a_missed_confirmation_is_not_written_back_and_the_baseline_serves(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, met=False)
    before = services_file(inventory).read_text()
    result = tune_live._finish(tune, found, 0.0)
    assert [(kind, arg) for kind, arg, _ in tune.events] == [
        ("deploy final", winner), ("verify", 4.0), ("deploy restore", None)]
    assert services_file(inventory).read_text() == before
    assert result.exit_status == ExitStatus.SLO_NOT_MET and result.deployed == "baseline"
    assert "missed the SLO on the confirming probe at 4 req/s" in result.errors[0]
    assert result.errors[-1].startswith("--write-back: trial 3's configuration missed its confirmation, so it was "
                                        "not written into the inventory; every instance of chat restored")


def test_without_write_back_a_missed_confirmation_leaves_the_winner_running(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, write_back=False, met=False)
    result = tune_live._finish(tune, found, 0.0)
    assert [(kind, arg) for kind, arg, _ in tune.events] == [("deploy final", winner), ("verify", 4.0)]
    assert result.exit_status == ExitStatus.SLO_NOT_MET and result.deployed == "winner" and result.written == ()


def test_a_winner_that_does_not_deploy_everywhere_is_replaced_by_the_baseline(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, final_fails=True)
    result = tune_live._finish(tune, found, 0.0)
    assert [(kind, arg) for kind, arg, _ in tune.events] == [("deploy final", winner), ("deploy restore", None)]
    assert result.exit_status == ExitStatus.PLAYBOOK_FAILED and result.deployed == "baseline"
    assert result.errors == ("the final deploy failed: atlas-a02: failed at inference_service: chat-1 did not start",
                             "trial 3's configuration did not deploy everywhere; every instance of chat restored to "
                             "the inventory's configuration")
    assert (tmp_path / "run" / tune_live.RESULT).is_file()


def test_an_exception_at_the_end_puts_the_baseline_back_before_it_is_raised(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, verify_raises=RuntimeError("probe bug"))
    before = services_file(inventory).read_text()
    with pytest.raises(RuntimeError, match="probe bug"):
        tune_live._finish(tune, found, 0.0)
    assert [(kind, arg) for kind, arg, _ in tune.events] == [
        ("deploy final", winner), ("verify", 4.0), ("deploy restore", None)]
    assert services_file(inventory).read_text() == before
    assert "every instance of chat restored to the inventory's configuration" in tune.notes


def test_ctrl_c_at_the_end_restores_and_exits_130(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, verify_raises=KeyboardInterrupt())
    try:
        tune_live._finish(tune, found, 0.0)
    except KeyboardInterrupt:  # caught here: escaping, it would end the test session
        pytest.fail("Ctrl-C at the end escaped as KeyboardInterrupt, with nothing restored")
    except DsctlError as exc:
        caught = exc
    else:
        pytest.fail("Ctrl-C at the end was swallowed")
    assert caught.exit_status == ExitStatus.INTERRUPTED
    assert str(caught).startswith("tune interrupted at its end; every instance of chat restored to the "
                                        "inventory's configuration; continue with dsctl tune --resume ")
    assert [kind for kind, _, _ in tune.events] == ["deploy final", "verify", "deploy restore"]


def test_write_back_is_refused_before_any_instance_restarts(tmp_path, inventory):
    path = services_file(inventory)
    text = path.read_text()
    start, end = text.index("    params:\n"), text.index("    # Required")
    path.write_text(text[:start] + '    params: "{{ chat_params }}"\n' + text[end:]
                    + "chat_params: {max_num_seqs: 64, max_num_batched_tokens: 8192}\n")
    inputs = tune_live.LiveTuneInputs(inventory=inventory, slos=("ttft=2s",), run_dir=tmp_path / "run",
                                      write_back=True)
    with pytest.raises(UsageError) as caught:
        tune_live.run(NoPlaybooks(), None, inputs)
    assert str(caught.value).startswith(f"--write-back: {path}: the params of service 'chat' are a template")
    assert caught.value.exit_status == ExitStatus.USAGE and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- pruning a candidate that cannot win


class ScriptedProbes(tune_live.LiveTune):
    """Slot probes answered by a server of a given capacity (TTFT far over the SLO above it); the rates asked."""

    def __init__(self, inputs, plan, capacity: float):
        super().__init__(NoPlaybooks(), None, inputs, plan, lambda _event: None)
        self.capacity, self.rates = capacity, []

    def probe(self, slot, rate, *, warmup, seed):
        self.rates.append(rate)
        result = SimpleNamespace(data={"metrics": {"errors": {"by_class": {}}}, "slo": None})
        ttft = 500.0 if rate <= self.capacity else 50_000.0
        return result, {"completed": 100, "failed": 0, "request_throughput": min(rate, self.capacity),
                        "ttft_ms": {"p99": ttft}, "errors": {}}


def test_a_candidate_is_pruned_at_a_miss_the_incumbent_holds_and_the_baseline_never_is(tmp_path, sample_plan):
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path)
    incumbent = TrialRecord(number=0, controller="controller-0", config=dict(sample_plan.baseline),
                            params=sample_plan.space.params(sample_plan.baseline),
                            fields=sample_plan.space.fields(sample_plan.baseline), evaluated=True, feasible=True,
                            objective=16.0, rate=16.0)

    def measure(config: dict) -> tuple[ScriptedProbes, search.Outcome]:
        tune = ScriptedProbes(inputs, sample_plan, capacity=1.4)
        tune.incumbent = incumbent
        candidate = search.Candidate(number=2, config=config, params=sample_plan.space.params(config),
                                     fields=sample_plan.space.fields(config), needs_quality=False, slot=0)
        return tune, tune._measure(sample_plan.slots[0], candidate)

    other = {**sample_plan.baseline, "max_num_seqs": 7}
    tune, outcome = measure(other)
    assert tune.rates == [tune_live.START_RATE]  # missed at 4 req/s, which the incumbent holds: nothing more
    assert outcome.data["rate_search"]["stopped"].startswith("pruned")
    tune, outcome = measure(dict(sample_plan.baseline))  # the same server as the baseline: measured in full
    assert len(tune.rates) > 3 and outcome.rate is not None and outcome.rate <= 1.4
    assert not outcome.data["rate_search"]["stopped"].startswith("pruned")


class StoppedEarly(ScriptedProbes):
    """Above capacity the probe stops after a few requests (the early stop: the miss is certain), and what its
    short window completed is a fraction of a request per second."""

    def probe(self, slot, rate, *, warmup, seed):
        result, metrics = super().probe(slot, rate, warmup=warmup, seed=seed)
        if rate <= self.capacity:
            return result, metrics
        stopped = SimpleNamespace(data={"metrics": {"errors": {"by_class": {}}}, "slo": {"early_stopped": True}})
        return stopped, {**metrics, "completed": 12, "request_throughput": 0.87}


def test_a_probe_stopped_early_is_no_throughput_to_step_down_to(tmp_path, sample_plan):
    """The baseline (never pruned) first probed above its capacity: the next rate is half, not the 0.87 req/s a
    probe stopped after a few requests completed (seen on the lab: 39 -> 0.87 req/s, its capacity ~16)."""
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path)
    tune = StoppedEarly(inputs, sample_plan, capacity=1.4)
    baseline = dict(sample_plan.baseline)
    candidate = search.Candidate(number=0, config=baseline, params=sample_plan.space.params(baseline),
                                 fields=sample_plan.space.fields(baseline), needs_quality=False, slot=0)
    outcome = tune._measure(sample_plan.slots[0], candidate)
    assert tune.rates[:2] == [tune_live.START_RATE, tune_live.START_RATE / 2]
    assert outcome.rate is not None and 1.4 / 1.15 ** 2 <= outcome.rate <= 1.4


def test_the_model_screen_runs_the_allocator_the_instances_start_with(tmp_path, inventory, sample_plan):
    """The sample fleet's env sets expandable segments (the memory env); a service env that sets the vendor's
    fragmenting allocator back is what the screen's model of that service runs."""
    assert sample_plan.alloc_conf == "expandable_segments:True"
    path = services_file(inventory)
    path.write_text(path.read_text().replace("    params:\n", "    env:\n      PYTORCH_NPU_ALLOC_CONF: "
                                             "\"expandable_segments:False\"\n    params:\n", 1))
    plan = tune_live.prepare(tune_live.LiveTuneInputs(inventory=inventory, slos=("ttft=2s",), run_dir=tmp_path))
    assert plan.alloc_conf == "expandable_segments:False"


def test_hosts_that_start_the_service_with_different_allocators_are_refused(tmp_path, inventory):
    """One model screen models every slot: a host whose env sets another allocator is a different service."""
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir()
    (host_vars / "atlas-a02.yml").write_text(
        "dsctl_ascend_env:\n  PYTORCH_NPU_ALLOC_CONF: \"expandable_segments:False\"\n")
    with pytest.raises(UsageError) as refused:
        tune_live.prepare(tune_live.LiveTuneInputs(inventory=inventory, slos=("ttft=2s",), run_dir=tmp_path))
    assert str(refused.value).startswith("--service chat: host atlas-a02 defines it differently from atlas-a01 ")
    assert "PYTORCH_NPU_ALLOC_CONF" in str(refused.value) and "--limit" in str(refused.value)


# --------------------------------------------------------------------------- the load generator as the limit


class ControllerLimited(ScriptedProbes):
    """A controller that cannot offer more than ``offers`` req/s: a probe above it carries the probe's verdict that
    the load generator was the limit (`generator_limit`), while the instance looks as if it held what it was sent.
    ``hiccups``: rates whose first probe only is limited (a passing stall of the controller)."""

    def __init__(self, inputs, plan, capacity: float, offers: float, hiccups: dict[float, int] | None = None):
        super().__init__(inputs, plan, capacity)
        self.offers, self.hiccups = offers, dict(hiccups or {})

    def probe(self, slot, rate, *, warmup, seed):
        result, metrics = super().probe(slot, rate, warmup=warmup, seed=seed)
        limited = rate > self.offers or self.hiccups.get(rate, 0) > 0
        if rate in self.hiccups:
            self.hiccups[rate] -= 1
        verdict = {"limited": limited, "planned_rate": rate, "offered_rate": min(rate, self.offers),
                   "send_lag_p50_ms": 31.0 if limited else 0.2, "send_lag_p99_ms": 80.0 if limited else 0.9,
                   "client_cpu_percent": 98.0 if limited else 20.0, "machine_busy_percent": None,
                   "reason": "half its requests were sent more than 31 ms late (above 5 ms)" if limited else ""}
        return result, {**metrics, generator_limit.KEY: verdict}


def _candidate(plan: tune_live.LivePlan, config: dict, number: int = 2) -> search.Candidate:
    return search.Candidate(number=number, config=config, params=plan.space.params(config),
                            fields=plan.space.fields(config), needs_quality=False, slot=0)


def test_a_probe_the_load_generator_limited_twice_leaves_the_trial_unmeasured(tmp_path, sample_plan):
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path)
    tune = ControllerLimited(inputs, sample_plan, capacity=20.0, offers=6.0)
    outcome = tune._measure(sample_plan.slots[0], _candidate(sample_plan, dict(sample_plan.baseline)))
    assert tune.rates == [4.0, 8.0, 8.0]  # held at 4; at 8 the controller was the limit, and again on the repeat
    assert outcome.failure == Failure.UNMEASURED and outcome.metrics is None and outcome.rate is None
    assert outcome.detail.startswith("the load generator was the limit at 8 req/s (twice): planned 8 req/s, "
                                     "offered 6 (send lag p50 31 ms, p99 80 ms; probe CPU 98 % of a core): half")
    assert outcome.data["capacity"]["sustained_rate"] is None  # no capacity, not even the 4 that held


def test_a_passing_stall_is_repeated_and_the_search_goes_on(tmp_path, sample_plan):
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path)
    tune = ControllerLimited(inputs, sample_plan, capacity=20.0, offers=float("inf"), hiccups={8.0: 1})
    outcome = tune._measure(sample_plan.slots[0], _candidate(sample_plan, dict(sample_plan.baseline)))
    assert tune.rates[:4] == [4.0, 8.0, 8.0, 16.0]
    assert outcome.failure is None and 16.0 <= outcome.rate <= 20.0


def test_with_a_fixed_rate_a_limited_probe_and_its_repeat_are_no_verdict(tmp_path, sample_plan):
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path,
                                      objective="goodput", rate=8.0)
    tune = ControllerLimited(inputs, sample_plan, capacity=20.0, offers=6.0)
    outcome = tune._measure(sample_plan.slots[0], _candidate(sample_plan, dict(sample_plan.baseline)))
    assert tune.rates == [8.0, 8.0] and outcome.failure == Failure.UNMEASURED and outcome.metrics is None


def test_the_search_never_ranks_a_trial_on_a_probe_the_load_generator_limited(tmp_path, sample_plan):
    """The baseline (capacity 3) is measured below what the controller offers (6 req/s); every other configuration
    (capacity 20) held at 4 and reached the controller's limit at 8: unmeasured, hidden from ranking, so the baseline
    stays the best instead of a candidate "beating" it on the controller's figures."""
    inputs = tune_live.LiveTuneInputs(inventory=SAMPLE / "hosts.yml", slos=("ttft=2s",), run_dir=tmp_path)
    tune = ControllerLimited(inputs, sample_plan, capacity=0.0, offers=6.0)
    base = tune.baseline_config

    def evaluate(candidate: search.Candidate) -> search.Outcome:
        tune.capacity = 3.0 if tune_live._same_config({**candidate.params, **candidate.fields}, base) else 20.0
        return tune._measure(sample_plan.slots[0], candidate)

    found = tune_search.Search(sample_plan.space, sample_plan.slos, evaluate, search.SearchSettings(budget=3, seed=0),
                               baseline=sample_plan.baseline).run()
    evaluated = [t for t in found.trials if t.evaluated and t.duplicate_of is None]
    others = [t for t in evaluated if not tune_live._same_config({**t.params, **t.fields}, base)]
    assert len(evaluated) == 3 and len(others) == 2
    assert found.best is not None and found.best.number == evaluated[0].number  # the baseline, first
    assert 3.0 / 1.15 <= found.best.rate <= 3.0
    for trial in others:
        assert trial.failure == Failure.UNMEASURED and not trial.feasible and trial.objective is None
        assert trial.detail.startswith("the load generator was the limit at 8 req/s (twice)")
        assert trial.capacity["sustained_rate"] is None
    assert tune_result.ranked(tuple(found.trials), found.best)[0].number == found.best.number
    assert found.counts["unmeasured"] == 2


def _baseline_record(plan: tune_live.LivePlan, **record) -> TrialRecord:
    config = dict(plan.baseline)
    return TrialRecord(number=0, controller="controller-0", config=config, params=plan.space.params(config),
                       fields=plan.space.fields(config), evaluated=True, **record)


UNMEASURED = dict(feasible=False, failure="unmeasured", detail="the load generator was the limit at 4 req/s "
                  "(twice): planned 4 req/s, offered 3.22 (send lag p50 31 ms, p99 80 ms): it offered 3.22")
UNDERSIZED = dict(feasible=True, objective=3.08, rate=3.08,
                  capacity={"sustained_rate": 3.08, "undersized": True, "samples": 809, "required": 1000})
MEASURED = dict(feasible=True, objective=3.08, rate=3.08,
                capacity={"sustained_rate": 3.08, "undersized": False, "samples": 1000, "required": 1000})


@pytest.mark.parametrize(("baseline", "status", "why"), [
    (UNMEASURED, ExitStatus.ENVIRONMENT, "the baseline (trial 0) is unmeasured: the load generator was the limit "
                                         "at 4 req/s"),
    (UNDERSIZED, ExitStatus.ERROR, "the baseline's (trial 0) capacity rests on an undersized probe: 809 measured "
                                   "requests of the 1000"),
])
def test_no_winner_is_declared_over_a_baseline_the_controller_measured(tmp_path, inventory, sample_plan, baseline,
                                                                       status, why):
    tune, found, _winner = end_of_tune(tmp_path, inventory, sample_plan)
    base = _baseline_record(sample_plan, **baseline)
    found = dataclasses.replace(found, trials=[base, *found.trials])
    before = services_file(inventory).read_text()
    result = tune_live._finish(tune, found, 0.0)
    assert result.best is None and result.deployed == "baseline" and result.written == ()
    # the baseline stays: nothing confirmed, nothing written
    assert [(kind, arg, text == before) for kind, arg, text in tune.events] == [("deploy final", None, True)]
    assert services_file(inventory).read_text() == before
    assert result.exit_status == status
    assert result.errors[0].startswith("no winner declared: trial 3 (") and why in result.errors[0]
    assert result.baseline is not None and result.baseline.number == 0


def test_a_winner_over_a_baseline_measured_in_full_is_declared(tmp_path, inventory, sample_plan):
    tune, found, winner = end_of_tune(tmp_path, inventory, sample_plan, write_back=False)
    found = dataclasses.replace(found, trials=[_baseline_record(sample_plan, **MEASURED), *found.trials])
    result = tune_live._finish(tune, found, 0.0)
    assert result.best is not None and result.best.number == 3 and result.deployed == "winner"
    assert result.exit_status == ExitStatus.OK and result.errors == ()
