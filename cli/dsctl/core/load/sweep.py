"""`dsctl probe --sweep`: the load levels of a sweep, one row per level, and its knee (pure).

Levels: ``rate=LO:HI:N`` or ``concurrency=LO:HI:N`` is N levels from LO to HI, both included, spaced
geometrically (1:32:6 is 1, 2, 4, 8, 16, 32): latency-throughput curves span orders of magnitude of load, and
even spacing would spend most levels past the saturation point. Concurrency levels are rounded to whole streams
and repeats dropped. ``rate=1,4,8`` (a list) gives the levels as they are. At most ``MAX_LEVELS`` levels: each
level is a full probe (its --requests or --duration), so a sweep is bounded by MAX_LEVELS times one probe.

GuideLLM's ``--rate-type sweep`` (vllm-project/guidellm, ``src/guidellm/benchmark/profiles.py::SweepProfile``: a
synchronous run, a throughput run, then ``sweep_size - 2`` constant rates from ``np.linspace`` between the two
measured rates) measures the same curve; dsctl takes the levels from the user instead, so a sweep is reproducible
without its two calibration runs. GuideLLM reports the curve and leaves reading it to the user; the knee below is
dsctl's own definition.

The knee: the level after which latency first rises faster than throughput. For consecutive levels i, i+1 with
measured request throughput T and median E2EL L (the whole request: queueing, prefill and decode), the step's
latency growth is L[i+1] / L[i] - 1 and its throughput growth T[i+1] / T[i] - 1; the knee is level i of the first
step whose latency growth exceeds its throughput growth (the elasticity d ln L / d ln T is above 1: past it, each
further request per second costs proportionally more latency than it adds throughput). A level where no request
succeeded has infinite latency. No such step: no knee inside the swept range (``knee`` None), throughput still
scales.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("rate", "concurrency")
MAX_LEVELS = 12
KNEE_LATENCY = "e2el_ms"  # the latency the knee is judged on (its median)


@dataclass(frozen=True)
class SweepSpec:
    kind: str  # rate | concurrency
    levels: tuple[float, ...]  # ascending

    def __str__(self) -> str:
        return f"{self.kind}=" + ",".join(f"{v:g}" for v in self.levels)


def parse(text: str) -> SweepSpec:
    """``rate=1:32:8``, ``concurrency=1:64:4`` or ``rate=1,2,4``; ValueError (one line) otherwise."""
    kind, sep, body = text.strip().partition("=")
    kind = kind.strip().lower()
    if not sep or kind not in KINDS:
        raise ValueError(f"{text!r}: expected rate=LO:HI:N or concurrency=LO:HI:N (N levels, geometric), or "
                         "rate=A,B,C")
    try:
        if ":" in body:
            parts = body.split(":")
            if len(parts) != 3:
                raise ValueError
            lo, hi, n = float(parts[0]), float(parts[1]), int(parts[2])
            if not (0 < lo <= hi and math.isfinite(hi)):
                raise ValueError(f"{text!r}: needs 0 < LO <= HI")
            if not 1 <= n <= MAX_LEVELS:
                raise ValueError(f"{text!r}: N must be between 1 and {MAX_LEVELS} levels")
            values = [lo] if n == 1 else [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
            values[-1] = hi
        else:
            values = [float(v) for v in body.split(",") if v.strip()]
            if not values or not all(0 < v and math.isfinite(v) for v in values):
                raise ValueError(f"{text!r}: each level must be a positive number")
    except ValueError as exc:
        if str(exc).startswith(repr(text)):
            raise
        raise ValueError(f"{text!r}: expected {kind}=LO:HI:N or {kind}=A,B,C with numbers") from None
    if kind == "concurrency":
        values = [float(max(1, round(v))) for v in values]
    else:
        values = [round(v, 6) for v in values]
    levels = tuple(sorted(set(values)))
    if len(levels) > MAX_LEVELS:
        raise ValueError(f"{text!r}: {len(levels)} levels, at most {MAX_LEVELS}")
    return SweepSpec(kind, levels)


def row(level: float, kind: str, metrics: Mapping[str, Any], percentiles: Sequence[str]) -> dict[str, Any]:
    """One level's row: the offered load, what was achieved, latency medians and the given percentile keys."""
    out: dict[str, Any] = {
        "level": level, "kind": kind,
        "completed": metrics["completed"], "failed": metrics["failed"],
        "error_rate": metrics["errors"]["error_rate"],
        "request_throughput": metrics["request_throughput"],
        "output_throughput": metrics["output_throughput"],
        "request_goodput": metrics["request_goodput"],
        "max_concurrent_requests": metrics["max_concurrent_requests"],
    }
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        stats = metrics[key]
        out[key] = {"median": stats["median"], **{p: stats.get(p) for p in percentiles}}
    return out


def knee(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The knee of rows in ascending level order (see the module doc): ``level`` (None when there is none inside
    the range), ``index`` and the step's growths."""
    def latency(r: Mapping[str, Any]) -> float:
        value = r[KNEE_LATENCY]["median"]
        return math.inf if value is None or not r["completed"] else float(value)

    def throughput(r: Mapping[str, Any]) -> float:
        return float(r["request_throughput"] or 0.0)

    rule = (f"the level after which {KNEE_LATENCY.removesuffix('_ms')} median grows faster (relatively) than "
            "request throughput")
    for i in range(len(rows) - 1):
        a, b = rows[i], rows[i + 1]
        la, lb, ta, tb = latency(a), latency(b), throughput(a), throughput(b)
        lat_growth = _growth(la, lb)
        thr_growth = _growth(ta, tb)
        if lat_growth > thr_growth:
            return {"level": a["level"], "index": i, "latency_growth": _finite(lat_growth),
                    "throughput_growth": _finite(thr_growth), "rule": rule}
    return {"level": None, "index": None, "latency_growth": None, "throughput_growth": None, "rule": rule}


def _growth(a: float, b: float) -> float:
    if math.isinf(a):
        return 0.0 if math.isinf(b) else -1.0
    if a <= 0:
        return math.inf if b > 0 else 0.0
    return b / a - 1.0  # inf when b is inf


def _finite(value: float) -> float | str:
    return "inf" if math.isinf(value) else value
