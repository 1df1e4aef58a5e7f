"""`dsctl probe --sweep`: level parsing and the knee (dsctl.core.load.sweep)."""

from __future__ import annotations

import pytest

from dsctl.core.load import sweep


def test_levels_are_geometric_inclusive_and_concurrency_is_whole_streams():
    spec = sweep.parse("rate=1:32:6")
    assert spec.kind == "rate" and spec.levels == pytest.approx((1, 2, 4, 8, 16, 32))
    assert sweep.parse("concurrency=1:64:4").levels == (1, 4, 16, 64)
    assert sweep.parse("concurrency=1:4:8").levels == (1, 2, 3, 4)  # rounded, repeats dropped
    assert sweep.parse("rate=8,1,4").levels == (1, 4, 8)
    assert sweep.parse("rate=5:5:1").levels == (5,)
    levels = sweep.parse("rate=1:32:8").levels
    assert len(levels) == 8 and levels[0] == 1 and levels[-1] == 32
    assert all(b / a == pytest.approx(32 ** (1 / 7)) for a, b in zip(levels, levels[1:], strict=False))


@pytest.mark.parametrize("text, needle", [
    ("rate", "rate=LO:HI:N"), ("load=1:2:2", "rate=LO:HI:N"), ("rate=1:2", "rate=LO:HI:N"),
    ("rate=0:8:3", "0 < LO <= HI"), ("rate=8:1:3", "0 < LO <= HI"), ("rate=1:8:0", "between 1 and 12"),
    (f"rate=1:8:{sweep.MAX_LEVELS + 1}", "between 1 and 12"), ("rate=a:b:c", "with numbers"),
    ("rate=1,-2", "positive"), ("rate=" + ",".join(str(i) for i in range(1, 15)), "at most 12"),
])
def test_bad_sweeps_are_refused_in_one_line(text, needle):
    with pytest.raises(ValueError, match=needle) as info:
        sweep.parse(text)
    assert "\n" not in str(info.value)


def _row(level, throughput, e2el, completed=10):
    return {"level": level, "completed": completed, "request_throughput": throughput,
            "e2el_ms": {"median": e2el}}


def test_the_knee_is_the_level_after_which_latency_grows_faster_than_throughput():
    rows = [_row(1, 1.0, 100), _row(2, 2.0, 105), _row(4, 3.9, 120), _row(8, 4.5, 400), _row(16, 4.6, 1500)]
    knee = sweep.knee(rows)
    assert knee["level"] == 4 and knee["index"] == 2  # 4 -> 8: latency +233 %, throughput +15 %
    assert knee["latency_growth"] == pytest.approx(400 / 120 - 1)
    assert knee["throughput_growth"] == pytest.approx(4.5 / 3.9 - 1)


def test_no_knee_while_throughput_scales_and_a_failed_level_is_infinitely_slow():
    assert sweep.knee([_row(1, 1.0, 100), _row(2, 2.0, 110), _row(4, 4.0, 130)])["level"] is None
    knee = sweep.knee([_row(1, 1.0, 100), _row(2, 0.0, None, completed=0)])
    assert knee["level"] == 1 and knee["latency_growth"] == "inf"


def test_a_row_keeps_the_chosen_percentiles():
    stats = {"median": 1.0, "p50": 1.0, "p99_9": 9.0, "n": 3}
    metrics = {"completed": 3, "failed": 1, "errors": {"error_rate": 0.25}, "request_throughput": 2.0,
               "output_throughput": 20.0, "request_goodput": None, "max_concurrent_requests": 2,
               "ttft_ms": stats, "tpot_ms": stats, "itl_ms": stats, "e2el_ms": stats}
    row = sweep.row(4.0, "rate", metrics, ["p50", "p99_9"])
    assert row["level"] == 4.0 and row["e2el_ms"] == {"median": 1.0, "p50": 1.0, "p99_9": 9.0}
    assert row["error_rate"] == 0.25
