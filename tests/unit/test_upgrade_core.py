"""The pure part of `dsctl upgrade` (dsctl.core.upgrade): plan, batches, refusals, the probe gate, the run state."""

from __future__ import annotations

import pytest

from dsctl import data
from dsctl.core.upgrade import gate
from dsctl.core.upgrade.plan import BatchSize, Versions, current_versions, make_batches, plan_upgrade
from dsctl.core.upgrade.state import ROLLED_BACK, StateError, UpgradeState
from dsctl.errors import ExitStatus, UsageError

HDK = {"driver": "25.3.rc1", "firmware": "7.8.0.2.212"}
OLD = Versions(cann="8.3.RC2", vllm_ascend="v0.11.0", **HDK)
NEW = Versions(cann="8.5.0", vllm_ascend="v0.13.0")
HOSTS = ["lab-01", "lab-02", "lab-03"]
ARCH = "x86_64"


@pytest.fixture(scope="module")
def releases() -> dict:
    return data.load("releases")


def source_with_everything(releases) -> dict[str, str]:
    """A package source holding every package the releases name."""
    from dsctl.lab.packages import package_specs

    return {spec.name: "0" * 64 for spec in package_specs(releases, ARCH)}


def plan(releases, overrides=NEW, *, current=None, desired=None, sums=None, batch="1", canary=None, free=None,
         together=()):
    current = current or {host: OLD for host in HOSTS}
    return plan_upgrade(releases, HOSTS, current=current, desired=desired or {host: OLD for host in HOSTS},
                        overrides=overrides, arch={host: ARCH for host in HOSTS},
                        package_sums=source_with_everything(releases) if sums is None else sums,
                        batch=BatchSize.parse(batch), canary=canary, disk_free_mb=free, together=together)


# ----------------------------------------------------------------------------------------------------- batches


@pytest.mark.parametrize(("text", "size", "expected"), [
    ("1", 10, 1), ("3", 10, 3), ("30", 10, 10), ("25%", 10, 3), ("100%", 4, 4), ("1%", 4, 1), ("50%", 3, 2)])
def test_batch_sizes(text, size, expected):
    assert BatchSize.parse(text).of(size) == expected


@pytest.mark.parametrize("text", ["0", "-1", "0%", "150%", "two", "1.5", ""])
def test_bad_batch_sizes_are_one_line_usage_errors(text):
    with pytest.raises(UsageError, match=r"^--batch "):
        BatchSize.parse(text)


def test_batches_start_with_the_canary():
    hosts = [f"h{i}" for i in range(1, 8)]
    assert make_batches(hosts, BatchSize.parse("1")) == [[h] for h in hosts]
    assert make_batches(hosts, BatchSize.parse("3")) == [["h1", "h2", "h3"], ["h4", "h5", "h6"], ["h7"]]
    assert make_batches(hosts, BatchSize.parse("3"), canary=1) == [["h1"], ["h2", "h3", "h4"], ["h5", "h6", "h7"]]
    assert make_batches(hosts, BatchSize.parse("50%"), canary=2) == [["h1", "h2"], ["h3", "h4", "h5", "h6"], ["h7"]]
    assert make_batches(hosts, BatchSize.parse("2"), canary=0) == [["h1", "h2"], ["h3", "h4"], ["h5", "h6"], ["h7"]]
    assert make_batches([], BatchSize.parse("1")) == []


def test_the_hosts_of_a_multi_host_instance_go_in_one_batch():
    """Issue 22: an instance's ranks run one stack, so its hosts are upgraded (and rolled back) together."""
    hosts = [f"h{i}" for i in range(1, 8)]
    pairs = [("h1", "h2"), ("h4", "h3")]
    assert make_batches(hosts, BatchSize.parse("1"), together=pairs) == [["h1", "h2"], ["h3", "h4"], ["h5"],
                                                                          ["h6"], ["h7"]]
    assert make_batches(hosts, BatchSize.parse("3"), together=pairs) == [["h1", "h2"], ["h3", "h4", "h5"],
                                                                          ["h6", "h7"]]
    # the canary is the first whole unit even when it is larger than --canary
    assert make_batches(hosts, BatchSize.parse("2"), canary=1, together=pairs)[0] == ["h1", "h2"]
    # hosts that share an instance through a third are one unit; hosts already upgraded are not added back
    assert make_batches(["h1", "h2", "h3", "h5"], BatchSize.parse("1"),
                        together=[("h1", "h4"), ("h4", "h3")]) == [["h1", "h3"], ["h2"], ["h5"]]
    batches = make_batches(hosts, BatchSize.parse("2"), canary=0, together=[("h2", "h6"), ("h6", "h7")])
    assert sorted(host for batch in batches for host in batch) == sorted(hosts)
    assert ["h2", "h6", "h7"] in batches


def test_an_instance_whose_hosts_would_end_on_two_stacks_is_refused(releases):
    desired = {"lab-01": OLD, "lab-02": Versions(cann="8.5.0", vllm_ascend="v0.13.0", **HDK), "lab-03": OLD}
    result = plan(releases, Versions(), desired=desired, together=[("lab-01", "lab-02")])
    assert len(result.problems) == 1
    assert result.problems[0].startswith("lab-01, lab-02 serve one instance but their targets differ (lab-01: ")
    assert result.problems[0].endswith("give them the same dsctl_*_version variables")
    same = plan(releases, together=[("lab-01", "lab-02")])
    assert same.problems == () and same.batches == (("lab-01", "lab-02"), ("lab-03",))


# ----------------------------------------------------------------------------------------------------- plan


def test_plan_takes_the_command_line_over_the_inventory(releases):
    result = plan(releases)
    assert result.problems == ()
    assert result.batches == (("lab-01",), ("lab-02",), ("lab-03",))
    item = result.host("lab-02")
    assert item.source == OLD
    assert item.target == Versions(cann="8.5.0", vllm_ascend="v0.13.0", **HDK)
    assert item.changes == ("cann", "vllm_ascend") and not item.hdk_changes
    assert item.stack.kernels_package == "910b-ops"


def test_plan_defaults_to_the_inventory_desired_versions(releases):
    desired = {"lab-01": OLD, "lab-02": Versions(cann="8.5.0", vllm_ascend="v0.13.0", **HDK), "lab-03": OLD}
    result = plan(releases, Versions(), desired=desired)
    assert result.problems == ()
    assert result.batches == (("lab-02",),)
    assert result.unchanged == ("lab-01", "lab-03")


def test_a_target_the_matrix_refuses_is_one_line_per_host(releases):
    result = plan(releases, Versions(cann="8.5.0", vllm_ascend="v0.11.0"))
    assert len(result.problems) == 3
    assert result.problems[0].startswith("lab-01: target CANN 8.5.0, vllm-ascend v0.11.0, driver 25.3.rc1")
    assert "dsctl_vllm_ascend_version" in result.problems[0]


def test_a_missing_target_package_is_refused(releases):
    sums = source_with_everything(releases)
    sums.pop(f"Ascend-cann-910b-ops_8.5.0_linux-{ARCH}.run")
    result = plan(releases, sums=sums)
    assert len(result.problems) == 3
    assert f"lab-01: Ascend-cann-910b-ops_8.5.0_linux-{ARCH}.run (for CANN 8.5.0" in result.problems[0]


def test_a_driver_change_without_the_previous_driver_package_is_refused(releases):
    old = Versions(driver="24.1.rc3", firmware="7.5.0.1.129", cann="8.0.0", vllm_ascend="v0.8.4rc2")
    new = Versions(driver="25.5.0", firmware="7.8.0.5.216", cann="8.5.0", vllm_ascend="v0.13.0")
    current = {host: old for host in HOSTS}
    assert plan(releases, new, current=current, desired=current).problems == ()
    sums = source_with_everything(releases)
    sums.pop(f"Ascend-hdk-910b-npu-driver_24.1.rc3_linux-{ARCH}.run")
    result = plan(releases, new, current=current, desired=current, sums=sums)
    assert len(result.problems) == 3
    assert ("lab-01: the driver/firmware change driver 24.1.rc3 -> 25.5.0, firmware 7.5.0.1.129 -> 7.8.0.5.216 is "
            "refused: the previous package Ascend-hdk-910b-npu-driver_24.1.rc3_linux-x86_64.run is not in the "
            "package source") in result.problems[0]


def test_too_little_disk_for_a_side_by_side_cann_is_refused(releases):
    result = plan(releases, free={"lab-01": 100000, "lab-02": 512, "lab-03": None})
    assert len(result.problems) == 1 and result.problems[0].startswith("lab-02: 512 MB free")


def test_current_versions_come_from_the_check_report(releases):
    report = {"versions": {"driver": {"installed": "25.3.rc1", "running": "25.3.rc1"},
                           "firmware": {"installed": "7.8.0.2.212"}, "cann": {"active": "8.3.RC2"},
                           "vllm_ascend": "0.11.0"}}
    assert current_versions(releases, report) == OLD


# ----------------------------------------------------------------------------------------------------- gate


def metrics(ttft: float, throughput: float, failed: int = 0, completed: int = 20) -> dict:
    return {"ttft_ms": {"mean": ttft, "median": ttft, "p90": ttft * 1.5}, "output_throughput": throughput,
            "completed": completed, "failed": failed}


def test_max_regression_parses():
    limits = gate.parse_max_regression("ttft=10%,throughput=5%, ttft.p90=20%, e2el:p99=15%, tpot:10%")
    assert [(lim.term, lim.statistic, lim.percent) for lim in limits] == [
        ("ttft", "median", 10.0), ("throughput", None, 5.0), ("ttft", "p90", 20.0), ("e2el", "p99", 15.0),
        ("tpot", "median", 10.0)]
    assert [lim.label for lim in limits] == ["ttft", "throughput", "ttft:p90", "e2el:p99", "tpot"]


def test_the_gate_judges_slos_on_the_new_stack_alone():
    slos = gate.parse_slos("ttft:p90=160ms")
    passed = gate.compare(metrics(100, 500), metrics(100, 500), gate.parse_max_regression("ttft=10%"), slos)
    assert passed.passed and "ttft:p90 150 ms (SLO 160 ms): ok" in passed.summary()
    missed = gate.compare(metrics(90, 500), metrics(100, 500), gate.parse_max_regression("ttft=20%"),
                          gate.parse_slos("ttft:p90=120ms"))
    assert not missed.passed and missed.reason() == "ttft:p90 150 ms (SLO 120 ms): missed by 25.0 %"
    assert missed.to_dict()["slo"] == [{"slo": "ttft:p90=120ms", "value": 150.0, "ok": False}]
    assert gate.parse_slos(None) == () and gate.parse_slos("") == ()


@pytest.mark.parametrize(("text", "message"), [
    ("ttft=10", r"expected TERM\[:STAT\]=P%"), ("ttft=10ms", r"expected TERM\[:STAT\]=P%"),
    ("speed=5%", "unknown term 'speed'"), ("ttft.p77=5%", "unknown statistic"), ("ttft:p77=5%", "unknown statistic"),
    ("throughput.p90=5%", "takes no statistic"), ("ttft=5%,ttft=6%", "given twice"), ("", "empty"),
    # issue 41: a throughput falls by 100 % at most; a percentage is finite
    ("throughput=150%", "more than the 100 % of drop"), ("ttft=" + "9" * 400 + "%", "not a finite number"),
    ("ttft=20000%", "more than the 10000 % of growth")])
def test_bad_max_regression_is_a_usage_error(text, message):
    with pytest.raises(UsageError, match=message) as caught:
        gate.parse_max_regression(text)
    assert caught.value.exit_status == ExitStatus.USAGE
    assert str(caught.value).startswith("--max-regression")


def test_the_gate_passes_within_the_limits_and_names_the_numbers_when_not():
    limits = gate.parse_max_regression("ttft=10%,throughput=5%")
    ok = gate.compare(metrics(100, 500), metrics(109, 480), limits)
    assert ok.passed
    bad = gate.compare(metrics(174, 500), metrics(440, 300), limits)
    assert not bad.passed
    assert bad.reason() == ("ttft 174.0 -> 440.0 ms (+152.9%, max +10%) REGRESSED; "
                            "throughput 500.0 -> 300.0 tok/s (-40.0%, max -5%) REGRESSED")
    faster = gate.compare(metrics(174, 500), metrics(100, 900), limits)
    assert faster.passed


def test_a_failed_gate_request_fails_the_gate():
    limits = gate.parse_max_regression("ttft=10%")
    result = gate.compare(metrics(100, 500), metrics(100, 500, failed=1, completed=19), limits)
    assert not result.passed and result.reason() == "1 of 20 gate requests failed"


# ----------------------------------------------------------------------------------------------------- state


def new_state(releases, batch="1") -> UpgradeState:
    return UpgradeState.new(plan(releases, batch=batch), inventory="/inv.yml", max_regression="ttft=10%",
                            now="t0")


UPGRADE = ("drained", "installed", "switched", "restarted", "gated", "undrained")


def test_stages_go_in_order_only(releases):
    state = new_state(releases)
    with pytest.raises(StateError, match="cannot go from pending to installed"):
        state.advance("lab-01", "installed", "t1")
    for stage in UPGRADE:
        state.advance("lab-01", stage, "t1")
    assert state.hosts["lab-01"].status == "upgraded"
    assert state.next_batch() == (1, ["lab-02"])
    with pytest.raises(StateError, match="not part of this upgrade"):
        state.advance("lab-09", "drained", "t1")


def test_the_state_round_trips_through_json(releases):
    state = new_state(releases)
    for stage in UPGRADE[:3]:
        state.advance("lab-01", stage, "t1")
    state.baseline["lab-01/chat-0"] = metrics(100, 500)
    again = UpgradeState.from_json(state.to_json())
    assert again.to_dict() == state.to_dict()
    assert again.batch_stage(["lab-01"]) == "switched"


@pytest.mark.parametrize(("text", "message"), [("{", "not JSON"), ('{"version": 9}', "not a version 1"),
                                                ('{"version": 1}', "missing or malformed")])
def test_a_bad_state_file_is_refused(text, message):
    with pytest.raises(StateError, match=message):
        UpgradeState.from_json(text, "state.json")


def test_a_failure_halts_and_resume_retries_the_rolled_back_batch(releases):
    state = new_state(releases)
    for stage in UPGRADE:
        state.advance("lab-01", stage, "t1")
    for stage in UPGRADE[:4]:
        state.advance("lab-02", stage, "t2")
    state.fail("lab-02", "gated", "ttft 100 -> 300 ms", "t3")
    assert state.halted == {"host": "lab-02", "stage": "gated", "reason": "ttft 100 -> 300 ms"}
    state.rolling_back("lab-02", "t3")
    state.rolled_back("lab-02", "t4")
    assert state.hosts["lab-02"].status == "rolled back (gated)"
    assert state.hosts["lab-03"].stage == "pending"  # never reached
    assert [run.host for run in state.to_undo()] == ["lab-01"]
    assert state.next_batch() == (1, ["lab-02"])
    state.restart_batch(["lab-02"], "t5")
    assert state.hosts["lab-02"].stage == "pending" and state.halted is None


def test_rollback_undoes_every_touched_host(releases):
    state = new_state(releases, batch="3")
    for stage in UPGRADE[:2]:
        for host in HOSTS:
            state.advance(host, stage, "t1")
    assert state.batch_stage(HOSTS) == "installed"
    assert [run.host for run in state.to_undo()] == HOSTS
    assert all(run.past_drain for run in state.to_undo())
    state.rolling_back("lab-01", "t2")
    with pytest.raises(StateError, match="cannot go from rolling-back"):
        state.advance("lab-01", "switched", "t2")
    state.rolled_back("lab-01", "t3")
    assert state.hosts["lab-01"].stage == ROLLED_BACK
    with pytest.raises(StateError, match="already rolled back"):
        state.rolling_back("lab-01", "t4")
