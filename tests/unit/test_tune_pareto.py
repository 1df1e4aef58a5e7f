"""Trial records as JSON lines, the Pareto front, and the PNG plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dsctl.adapters.tune_artifacts import plot, read_trials, write_trials
from dsctl.core.tune.pareto import TrialRecord, pareto_front


def record(number: int, goodput: float | None, ttft: float | None, *, feasible: bool = True, npus: int = 4,
           failure: str | None = None) -> TrialRecord:
    return TrialRecord(number=number, controller="c0", config={"max_num_seqs": 8 * (number + 1)},
                       params={"max_num_seqs": 8 * (number + 1)}, fields={}, evaluated=True, feasible=feasible,
                       failure=failure, objective=goodput, margin=None if ttft is None else ttft / 200 - 1,
                       binding="ttft:p99", slo_values={} if ttft is None else {"ttft:p99": ttft}, npus=npus,
                       context={"vllm_ascend": "v0.13.0", "cann": "8.3.RC2", "env": {"HCCL_OP_EXPANSION_MODE": "AIV"}})


def test_record_is_one_json_line_and_round_trips():
    original = record(3, 12.5, math.inf, feasible=False, failure="slo_miss")
    line = original.to_json_line()
    assert "\n" not in line
    raw = json.loads(line)  # strict JSON: no Infinity
    assert raw["slo_values"]["ttft:p99"] == "inf" and raw["record_version"] == 1
    assert raw["context"]["cann"] == "8.3.RC2" and raw["failure"] == "slo_miss"
    back = TrialRecord.from_json_line(line)
    assert back.slo_values["ttft:p99"] == math.inf and back.params == original.params and back.number == 3


def test_front_keeps_the_non_dominated_trials():
    records = [record(0, 40.0, 150.0), record(1, 30.0, 100.0), record(2, 20.0, 180.0),  # 2 dominated by 1
               record(3, 50.0, 260.0, feasible=False), record(4, None, None, failure="out_of_memory")]
    front = pareto_front(records)
    assert [r.number for r in front] == [1, 0, 3]
    assert [r.number for r in pareto_front(records, feasible_only=True)] == [1, 0]
    assert front[0].objective_per_npu == 7.5


def test_plot_writes_a_png(tmp_path: Path):
    records = [record(0, 40.0, 150.0), record(1, 30.0, 100.0), record(2, 50.0, 260.0, feasible=False),
               record(3, None, None, feasible=False, failure="out_of_memory")]
    out = plot(records, tmp_path / "run" / "pareto.png", winner=records[0], slo_bound=200.0)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_trials_file_round_trips(tmp_path: Path):
    records = [record(1, 30.0, 100.0), record(0, None, None, feasible=False, failure="aclrtmalloc")]
    path = write_trials(records, tmp_path / "run" / "trials.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["number"] == 0
    assert [r.failure for r in read_trials(path)] == ["aclrtmalloc", None]
