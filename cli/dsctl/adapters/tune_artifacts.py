"""The files of a tune's run directory: ``trials.jsonl`` (one `TrialRecord` a line, written atomically), the Pareto
plot (PNG, matplotlib's Agg backend: no display) and ``result.json`` (a live tune's result).  The records and the
drawing are `dsctl.core.tune.pareto`'s."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsctl.core.tune import pareto
from dsctl.core.tune.pareto import TrialRecord


def write_trials(records: Sequence[TrialRecord], path: Path) -> Path:
    """``trials.jsonl``: one line per trial, by number, written atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("w", encoding="utf-8") as out:
        for record in sorted(records, key=lambda r: r.number):
            out.write(record.to_json_line() + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    return path


def read_trials(path: Path) -> list[TrialRecord]:
    return [TrialRecord.from_json_line(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def plot(records: Sequence[TrialRecord], path: Path, *, winner: TrialRecord | None = None,
         slo_key: str | None = None, slo_bound: float | None = None, title: str = "dsctl tune") -> Path:
    """Write the Pareto plot (PNG) to ``path``: goodput per NPU against the SLO statistic (`pareto.figure`)."""
    import matplotlib

    matplotlib.use("Agg")
    drawn = pareto.figure(records, winner=winner, slo_key=slo_key, slo_bound=slo_bound, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    drawn.savefig(path, format="png")
    return path


def write_json(path: Path, data: Mapping[str, Any]) -> Path:
    """``result.json``: the result as ``--json`` gives it, indented."""
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path
