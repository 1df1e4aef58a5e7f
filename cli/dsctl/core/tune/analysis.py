"""`dsctl tune`'s trials read as a whole, during the run and after it: the counts by what happened, the noise-aware
best (`best_trial`), the standing progress shows after each trial, why no winner may be declared over the baseline
(`baseline_doubt`), and the order the refinement tries an incumbent's neighbours in (`refinement_order`, from what
the same one-knob moves did elsewhere in the run).  Pure: records in, figures out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dsctl.core.tune import capacity as capacity_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import CRASHES, Failure
from dsctl.core.tune.space import comparable


def _noise(record: TrialRecord) -> float:
    return float((record.capacity or {}).get("noise") or 0.0)


def standing(records: Sequence[TrialRecord]) -> tuple[dict[str, int], TrialRecord | None]:
    """A run so far, as its progress shows it after each trial: the counts and the incumbent the result will name
    (`best_trial`: with noisy verdicts a later trial wins only beyond the noise, so not simply the top figure)."""
    return count(records), best_trial(records)


def best_trial(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The highest objective among feasible evaluated trials; with noisy verdicts a later trial replaces the
    incumbent only beyond the noise; without, ties go to the lower binding margin, then the earlier trial."""
    feasible = [r for r in records if r.feasible and r.evaluated and r.objective is not None]
    if not feasible:
        return None
    if any(_noise(r) > 0 for r in feasible):
        incumbent = None
        for record in sorted(feasible, key=lambda r: r.number):
            if incumbent is None or capacity_mod.beats(record.objective, _noise(record), incumbent.objective,
                                                       _noise(incumbent)):
                incumbent = record
        return incumbent
    top = max(r.objective for r in feasible)
    tied = [r for r in feasible if math.isclose(r.objective, top, rel_tol=1e-9, abs_tol=1e-12)]
    return min(tied, key=lambda r: (r.margin if r.margin is not None else 0.0, r.number))


def baseline_doubt(baseline: TrialRecord | None) -> str | None:
    """Why no winner may be declared over ``baseline`` (the inventory's own configuration, the trial the winner
    is measured against), or None: its trial is unmeasured (the load generator was the limit of its probes), or
    the probe its capacity rests on was undersized (fewer measured requests than the sample-size rule asks,
    `capacity.SteadyState.undersized`): a candidate "beating" such a figure beats the controller's, not the
    instance's (issue 42: a winner declared at 3.67 req/s over a baseline probe of 809 of 1,000 samples, 3.08)."""
    if baseline is None:
        return None
    if baseline.failure == Failure.UNMEASURED:
        return f"the baseline (trial {baseline.number}) is unmeasured: {baseline.detail}"
    cap = baseline.capacity or {}
    if baseline.feasible and cap.get("undersized"):
        return (f"the baseline's (trial {baseline.number}) capacity rests on an undersized probe: {cap.get('samples')} "
                f"measured requests of the {cap.get('required')} its SLO statistics need")
    return None


def refinement_order(incumbent: TrialRecord, base: Mapping[str, Any], moves: Sequence[Mapping[str, Any]],
                     measured: Sequence[TrialRecord],
                     moved: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None],
                     switches: Collection[str] = ()) -> list[Mapping[str, Any]]:
    """``moves`` (one knob's move each from ``base``, the ``incumbent``'s configuration; ``moved`` names a move's
    knob, the space's `SearchSpace.moved_knob`, which knows its layout moves; ``switches``, the space's
    `SearchSpace.switches`) in the order the refinement tries them
    (stable: ties keep the given order, a seeded shuffle):

    1. a numeric move that goes on in the direction the incumbent came from: a measured configuration that differs
       from ``base`` in that knob only, is older than the incumbent and worse (the climb's last step;
       compass search's "keep going while it improves");
    2. then by what the run has seen the same move do elsewhere (`move_evidence`: two measured configurations that
       differ in that knob alone, changed in the move's direction; the latest such pair): a move that gained, then
       one never seen (a switch's before a number's), then one that changed nothing, then one that lost;
    3. then the knobs the fewest measured configurations have moved alone from ``base``: every knob once before
       any twice.

    Why (bench/tune.py moe-vllm, 8 knobs): in a uniform order over *moves*, gpu_memory_utilization (four moves),
    max_num_seqs and prefix caching, all flat there, took four of a seed's seven refinement restarts, and the move
    that gained most (the shared-expert overlap on, +3 %) was never tried; a move that changed nothing tells that
    the top is flat along that knob here.  Measured over 5 seeds at 25 restarts (three-seed figures): moe-vllm's
    worst seed 89.4 -> 93.3 % of the optimum (median 95.9 % both), chat-fixed unchanged (99.5 / 96.6 %).  With 2.:
    once the incumbent moved, its counts (3.) started again from zero and the same flat or losing moves (the
    memory fraction, eager mode) were tried again from the new incumbent, two of a seed's seven; with it moe-vllm
    went from 95.5 / 93.5 % (median / worst seed, nine-seed top figures) to 99.2 / 93.5 %, long-fixed (100 / 100 %)
    and chat-fixed (99.5 / 96.6 %) unchanged.  Switches before numbers among the unseen: one move tells all a
    boolean does, and the switches set how the engine runs (graph mode, the shared-expert stream, the TP layout)
    where a number sets how much; on moe-long (8K-32K prompts, a MoE) the seeds that missed the top had spent the
    refinement on max_num_seqs and the memory fraction and never turned the overlap on or moved to TP 1, where
    the top is (see docs/tune-bench.md, "What changed", for the figures)."""
    def along(name: str) -> list[TrialRecord]:
        return [r for r in measured if r.number != incumbent.number and name in r.config
                and moved(base, r.config) == name]

    def key(move: Mapping[str, Any]) -> tuple[int, int, int, int]:
        name = moved(base, move)
        assert name is not None, "a refinement move changes one knob"
        earlier = along(name)
        value = move[name]
        continues = _numeric(value) and any(
            r.number < incumbent.number and (not r.feasible or (r.objective or 0.0) < (incumbent.objective or 0.0))
            and (value - base[name]) * (base[name] - r.config[name]) > 0 for r in earlier)
        seen = move_evidence(name, base[name], value, pairs)
        rank = {1: 0, None: 1, 0: 2, -1: 3}[seen]
        return (0 if continues else 1, rank, 0 if seen is None and name in switches else 1, len(earlier))

    pairs = one_knob_pairs(measured)
    return sorted(moves, key=key)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _gain(before: TrialRecord, after: TrialRecord) -> int | None:
    """+1 when ``after`` beats ``before`` beyond the noise (or holds where ``before`` failed), -1 the reverse,
    0 neither; None when both failed (nothing learnt about the move)."""
    held_before = before.feasible and before.objective is not None
    held_after = after.feasible and after.objective is not None
    if not held_before and not held_after:
        return None
    if held_before != held_after:
        return 1 if held_after else -1
    if capacity_mod.beats(after.objective, _noise(after), before.objective, _noise(before)):  # type: ignore[arg-type]
        return 1
    if capacity_mod.beats(before.objective, _noise(before), after.objective, _noise(after)):  # type: ignore[arg-type]
        return -1
    return 0


Pairs = Mapping[str, Sequence[tuple[tuple[int, int], TrialRecord, TrialRecord]]]


def one_knob_pairs(measured: Sequence[TrialRecord]) -> Pairs:
    """Every pair of ``measured`` configurations that differ in one knob alone, by that knob, each with its
    positions (i < j) in ``measured``.  Grouped by the rest of the configuration, so the cost is trials x knobs
    plus the pairs themselves, not a comparison of every pair per move: `refinement_order` runs once per
    refinement ask, and at ``--budget 1000`` an all-pairs scan per move was ~8 M comparisons per ask."""
    pairs: dict[str, list[tuple[tuple[int, int], TrialRecord, TrialRecord]]] = {}
    names = sorted({name for record in measured for name in record.config})
    for name in names:
        lines: dict[tuple, list[int]] = {}
        for position, record in enumerate(measured):
            if name in record.config:
                rest = tuple((k, comparable(v)) for k, v in sorted(record.config.items()) if k != name)
                lines.setdefault(rest, []).append(position)
        for line in lines.values():
            for n, i in enumerate(line):
                for j in line[n + 1:]:
                    first, second = measured[i], measured[j]
                    if comparable(first.config[name]) != comparable(second.config[name]):
                        pairs.setdefault(name, []).append(((i, j), first, second))
    return pairs


def move_evidence(name: str, start: Any, end: Any, pairs: Pairs) -> int | None:
    """What moving ``name`` from ``start`` to ``end`` did elsewhere in the run: `_gain` of the latest pair of
    measured configurations that differ in ``name`` alone (``pairs``: `one_knob_pairs`), taken in the move's
    direction (a number: up or down; otherwise from ``start``'s value to ``end``'s); None when no pair moved it
    so.  Of pairs equally late, the one earliest in the measured order."""
    latest: tuple[tuple[int, int, int], int | None] | None = None
    for (i, j), first, second in pairs.get(name, ()):
        a, b = first.config[name], second.config[name]
        if _numeric(end) and _numeric(a) and _numeric(b):
            before, after = (first, second) if (b - a) * (end - start) > 0 else (second, first)
        elif comparable(a) == comparable(start) and comparable(b) == comparable(end):
            before, after = first, second
        elif comparable(b) == comparable(start) and comparable(a) == comparable(end):
            before, after = second, first
        else:
            continue
        order = (-max(first.number, second.number), i, j)
        if latest is None or order < latest[0]:
            latest = (order, _gain(before, after))
    return None if latest is None else latest[1]


def count(records: Sequence[TrialRecord]) -> dict[str, int]:
    """Trials by what happened to them: evaluated (restarts), feasible, each failure class, duplicates."""
    counts = {"evaluated": 0, "feasible": 0, "crashed": 0, "duplicate": 0}
    counts.update({failure.value: 0 for failure in Failure})
    for record in records:
        if record.duplicate_of is not None:
            counts["duplicate"] += 1
            continue
        counts["evaluated"] += record.evaluated
        counts["feasible"] += record.feasible and record.evaluated
        if record.failure is not None:
            counts[record.failure] += 1
            counts["crashed"] += record.failure in CRASHES
    return counts
