"""The latency-throughput plot of `dsctl probe --sweep` (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plot(rows: Sequence[Mapping[str, Any]], knee: Mapping[str, Any], path: Path, *, title: str,
         tail: tuple[str, str] = ("p99", "p99")) -> Path:
    """Median and the ``tail`` percentile (its key in the rows, its label) of E2EL and median TTFT against request
    throughput, one point per level, labelled with the level; the knee circled."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=110)
    axes = figure.add_subplot()
    points = [(r, r["request_throughput"]) for r in rows if r["request_throughput"] and r["completed"]]
    x = [t for _, t in points]
    series = [("e2el_ms", "median", "E2EL median", "tab:blue", "o-"),
              ("e2el_ms", tail[0], f"E2EL {tail[1]}", "tab:blue", "x--"),
              ("ttft_ms", "median", "TTFT median", "tab:orange", "o-")]
    for key, stat, label, color, style in series:
        y = [r[key].get(stat) for r, _ in points]
        if y and all(v is not None for v in y):
            axes.plot(x, y, style, color=color, label=label, linewidth=1.2, markersize=4)
    for r, t in points:
        axes.annotate(f"{r['level']:g}", (t, r["e2el_ms"]["median"]), textcoords="offset points", xytext=(4, 4),
                      fontsize=7)
    if knee.get("index") is not None:
        r = rows[knee["index"]]
        if r["request_throughput"] and r["e2el_ms"]["median"] is not None:
            axes.scatter([r["request_throughput"]], [r["e2el_ms"]["median"]], s=220, facecolors="none",
                         edgecolors="tab:red", linewidths=2, label=f"knee ({r['kind']} {r['level']:g})", zorder=4)
    axes.set_xlabel("request throughput (req/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, linewidth=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
