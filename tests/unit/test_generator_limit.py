"""Whether the load generator was a probe's limit (`dsctl.core.load.generator_limit`): its send lags, offered rate
and CPU figures in, the verdict out, every threshold on both sides of its edge."""

from __future__ import annotations

import pytest

from dsctl.adapters.probe_client import machine_busy, machine_cpu_times
from dsctl.core.load import generator_limit as gl
from dsctl.core.load.probe_metrics import RequestRecord


def verdict(**figures) -> gl.GeneratorLimit:
    return gl.judge(gl.ClientLoad(**figures))


def test_a_client_that_kept_up_is_not_the_limit():
    quiet = verdict(lags_s=[0.0002] * 100, mean_gap_s=0.1, planned_rate=10.0, offered_rate=10.0, achieved_rate=9.9,
                    client_cpu=0.2, machine_busy=0.5, window_s=10.0)
    assert not quiet.limited and quiet.reason == ""
    assert quiet.send_lag_p50_ms == pytest.approx(0.2) and quiet.client_cpu_percent == 20.0
    assert quiet.machine_busy_percent == 50.0


@pytest.mark.parametrize(("offered", "limited"), [(9.51, False), (9.49, True)])
def test_offered_more_than_five_percent_below_planned(offered, limited):
    result = verdict(planned_rate=10.0, offered_rate=offered)
    assert result.limited is limited
    assert ("offered 9.49 req/s of the 10 planned" in result.reason) is limited


@pytest.mark.parametrize(("lag", "limited"), [(0.0049, False), (0.0051, True)])
def test_a_median_send_lag_above_five_ms(lag, limited):
    # a long gap (1 s) keeps the tail rule out of it: only the median rule is at its edge
    result = verdict(lags_s=[lag] * 50, mean_gap_s=1.0)
    assert result.limited is limited
    assert ("half its requests were sent" in result.reason) is limited


@pytest.mark.parametrize(("gap", "late", "limited"), [
    (0.1, 0.049, False), (0.1, 0.051, True),  # half of a 100 ms gap
    (0.001, 0.0019, False), (0.001, 0.0021, True),  # 1000 req/s: the 2 ms floor, not half a 1 ms gap
])
def test_a_p90_send_lag_above_half_the_mean_gap(gap, late, limited):
    lags = [0.0] * 80 + [late] * 20  # the median is 0, the p90 is ``late``
    result = verdict(lags_s=lags, mean_gap_s=gap)
    assert result.send_lag_p50_ms == 0.0 and result.send_lag_p90_ms == pytest.approx(late * 1e3)
    assert result.limited is limited
    assert ("one request in ten" in result.reason) is limited


@pytest.mark.parametrize(("cpu", "window", "limited"), [(0.89, 5.0, False), (0.9, 5.0, True), (1.0, 0.24, False),
                                                         (1.0, 0.25, True)])
def test_the_probes_process_near_one_core(cpu, window, limited):
    # a closed loop: no lags, no rates; only the CPU, and only over a phase of a quarter second or more
    result = verdict(client_cpu=cpu, window_s=window)
    assert result.limited is limited and result.send_lag_p50_ms is None
    assert ("of a core" in result.reason) is limited


@pytest.mark.parametrize(("cpu", "late", "limited"), [(0.95, 0.0019, False), (0.95, 0.0021, True),
                                                       (0.89, 0.0021, False)])
def test_in_an_open_loop_the_cpu_counts_when_the_releases_show_it(cpu, late, limited):
    # a 100 ms gap keeps the tail rule silent (its bound is 50 ms): the 2 ms of ``late`` only corroborate the CPU
    result = verdict(lags_s=[0.0] * 80 + [late] * 20, mean_gap_s=0.1, client_cpu=cpu, window_s=5.0)
    assert result.limited is limited
    assert result.reason == ("the probe's process used 95% of a core (at least 90%: no time left for its event "
                             "loop)" if limited else "")


@pytest.mark.parametrize(("busy", "achieved", "late"), [
    (0.95, 9.6, 0.003),  # saturated and late, the instance completed what was offered
    (1.00, 3.3, 0.003),  # a fresh-clone CI run's lab tune: 100 % busy, 10.5 of 31.8 req/s completed, offered in full
    (0.95, 5.0, 0.001),  # saturated and short, the client sent on time
])
def test_a_saturated_machine_alone_never_marks_the_probe(busy, achieved, late):
    # The instance may share the machine's CPUs (the lab's engines do; so does a controller on a serving host): a
    # busy machine and a shortfall are then the instance's own; what says the client kept up is what it offered.
    result = verdict(lags_s=[0.0] * 80 + [late] * 20, mean_gap_s=0.1, planned_rate=10.0, offered_rate=10.0,
                     achieved_rate=achieved, machine_busy=busy, window_s=5.0)
    assert not result.limited and result.reason == ""
    assert result.machine_busy_percent == round(busy * 100, 1)  # reported all the same


def test_every_rule_that_fired_is_in_the_one_line_and_the_warning_has_both_rates():
    # four rules (offered, median lag, p90 lag, the client's CPU); the machine's share is only reported
    result = verdict(lags_s=[0.03] * 100, mean_gap_s=0.025, planned_rate=4.0, offered_rate=3.22, achieved_rate=3.0,
                     client_cpu=0.98, machine_busy=0.97, window_s=25.0)
    assert result.limited and len(result.reason.split("; ")) == 4 and "\n" not in result.reason
    line = result.warning()
    assert line.startswith("the load generator was the limit: planned 4 req/s, offered 3.22 (send lag p50 30 ms, "
                           "p99 30 ms; probe CPU 98 % of a core; machine 97 % busy): it offered 3.22")


def records(lags: list[float], gap: float) -> list[RequestRecord]:
    out = []
    for i, lag in enumerate(lags):
        rec = RequestRecord(f"r{i}", scheduled=100.0 + i * gap, sent=100.0 + i * gap + lag, status=200)
        rec.chunk_times = [rec.sent + 0.01, rec.sent + 0.02]
        out.append(rec)
    return out


def test_measure_takes_lags_and_rates_from_the_records_and_rates_in_the_probes_units():
    # a client falling behind: each request 2 ms later than the one before, on a 10 ms schedule (100 req/s wall)
    recs = records([0.002 * i for i in range(100)], 0.01)
    load = gl.measure(recs, lags=True, client_cpu_s=1.5, machine_busy=0.4, window_s=2.0, time_scale=0.05)
    assert load.mean_gap_s == pytest.approx(0.01)
    assert load.planned_rate == pytest.approx(100 * 0.05)  # 100 wall req/s are 5 modelled req/s at scale 0.05
    assert load.offered_rate == pytest.approx(100 / 1.2 * 0.05)  # sends 12 ms apart
    assert load.client_cpu == pytest.approx(0.75) and max(load.lags_s) == pytest.approx(0.198)
    result = gl.judge(load)
    assert result.limited and "offered 4.17 req/s of the 5 planned" in result.reason


def test_measure_without_lags_keeps_a_capped_or_closed_loop_out_of_the_lag_rules():
    recs = records([0.05] * 100, 0.01)  # waits for a free slot under a --concurrency cap: planned queue time
    load = gl.measure(recs, lags=False, client_cpu_s=0.1, machine_busy=None, window_s=2.0)
    assert load.lags_s == () and load.planned_rate is None and load.offered_rate is None
    assert not gl.judge(load).limited


def test_proc_stat_busy_share(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    before = machine_cpu_times(str(stat))
    assert before == (150, 1000)  # idle and iowait are not busy
    stat.write_text("cpu  190 0 90 860 60 0 0 0 0 0\n")
    after = machine_cpu_times(str(stat))
    assert machine_busy(before, after) == pytest.approx(130 / 200)
    assert machine_busy(before, before) is None and machine_busy(None, after) is None
    assert machine_cpu_times(str(tmp_path / "missing")) is None
    stat.write_text("intr 1 2 3\n")
    assert machine_cpu_times(str(stat)) is None
