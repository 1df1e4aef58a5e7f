"""What ordering one refinement ask's moves costs as a tune's measured trials grow (`analysis.refinement_order`).

`refinement_order` runs once per refinement ask and needs, per move, the latest pair of measured configurations that
differ in that knob alone.  It groups the one-knob pairs once per call (`analysis.one_knob_pairs`: trials x knobs);
the baseline measured in the same run is the scan it replaced, every pair of trials compared per move.  A walk of
single-knob moves over the vllm-ascend space stands in for a long tune's history (`--budget 1000`).

    PYTHONPATH=cli python bench/refinement.py [--trials 100,400,1000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dsctl.core.tune import analysis
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.space import SearchSpace, lone_difference, resolve_space

NPUS = 2
# The walk starts at the service as it runs with no params set (the space's baseline); max_num_batched_tokens has no
# registry default, so it starts at vLLM's chunked-prefill default of 2048 tokens.
START_PARAMS = {"max_num_batched_tokens": 2048}


def history(trials: int, seed: int = 3) -> list[TrialRecord]:
    """Measured trials of a walk of one knob's moves, restarting now and then from an earlier trial; a configuration
    already measured is not measured again (the search settles a duplicate without evaluating it)."""
    space = resolve_space("vllm-ascend", npus_per_instance=NPUS)
    base = space.baseline(START_PARAMS, {"tensor_parallel_size": NPUS})
    assert set(base) == set(space.names) and not space.violations(base), f"the walk's start {base} is not in the space"
    rng = random.Random(seed)
    records: list[TrialRecord] = []
    seen: set[tuple] = set()
    current = base
    for _ in range(100 * trials):  # bounded: the space has far more configurations than any trials asked for
        if len(records) == trials:
            break
        key = tuple(sorted(current.items()))
        if key not in seen:
            seen.add(key)
            records.append(TrialRecord(number=len(records), controller="c", config=dict(current), params={},
                                       fields={}, evaluated=True, feasible=True, objective=rng.random()))
        current = rng.choice(space.neighbours(current)) if rng.random() < 0.8 else rng.choice(records).config
    return records


def all_pairs(measured: Sequence[TrialRecord], name: str) -> list[tuple[tuple[int, int], TrialRecord, TrialRecord]]:
    """The baseline: every pair of trials compared, for one move's knob."""
    return [((i, j), first, measured[j]) for i, first in enumerate(measured) for j in range(i + 1, len(measured))
            if lone_difference(first.config, measured[j].config) == name]


def baseline_order(space: SearchSpace, incumbent: TrialRecord, moves: Sequence[Mapping[str, Any]],
                   measured: Sequence[TrialRecord]) -> list[int | None]:
    """Each move's evidence found by the all-pairs scan (what `refinement_order` did per move before grouping)."""
    base = incumbent.config
    verdicts = []
    for move in moves:
        name = space.moved_knob(base, move)
        assert name is not None
        verdicts.append(analysis.move_evidence(name, base[name], move[name], {name: all_pairs(measured, name)}))
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", default="100,400,1000")
    args = parser.parse_args(argv)
    print(f"{'trials':>7} {'moves':>6} {'grouped s':>10} {'all-pairs s':>12} {'ratio':>7}")
    for trials in (int(n) for n in args.trials.split(",")):
        measured = history(trials)
        incumbent = measured[-1]
        space = resolve_space("vllm-ascend", npus_per_instance=NPUS)
        moves = space.neighbours(incumbent.config)
        # Timed: one whole ask as the search makes it (grouping, every move's evidence, the ordering itself)
        # against the baseline's evidence alone, so the ratio, if anything, understates the gain.
        began = time.perf_counter()
        analysis.refinement_order(incumbent, incumbent.config, moves, measured, space.moved_knob, space.switches)
        fast = time.perf_counter() - began
        began = time.perf_counter()
        slow_verdicts = baseline_order(space, incumbent, moves, measured)
        slow = time.perf_counter() - began
        pairs = analysis.one_knob_pairs(measured)  # the agreement check, outside both timers
        grouped = [analysis.move_evidence(n, incumbent.config[n], m[n], pairs)
                   for m in moves if (n := space.moved_knob(incumbent.config, m)) is not None]
        assert grouped == slow_verdicts, "the grouped pairs and the all-pairs scan disagree"
        print(f"{trials:>7} {len(moves):>6} {fast:>10.3f} {slow:>12.3f} {slow / fast:>6.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
