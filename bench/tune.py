"""How well `dsctl tune`'s search does on bench/landscape.py's landscapes, against seeded random search (with and
without dsctl's screens), TPE without screens and a coarse grid, with the ground truth from landscape.py's
tables (on other hardware figures than the screens' model: landscape.MODEL_ERROR).

Every method samples the landscape's whole default space (not a pinned grid); a configuration outside the
table is evaluated on demand, so the optimum is the best known over the table and every search.  Methods:

* dsctl: `tune_search.Search` with TPE and its refinement around the incumbent (search.py "Refinement"), the roofline
  screen and the model screen, as `dsctl tune --simulate` runs it
  (the model screen bounded: screens.ModelScreen), over the space its quality model narrows (lossy knobs kept to
  the values whose predicted agreement passes the floor: screens.quality_narrowed);
* random: the same driver, seeded uniform sampling, no screens, no refinement;
* random+screen: seeded uniform sampling with dsctl's screens (the screens' own worth);
* tpe: TPE without screens (the sampler's own worth);
* grid: the coarse grid (low / middle / high of every knob of the table) in a seeded order.

Every search sees one measurement per configuration (workload seed 0, as `dsctl tune --simulate`); what it found is
scored by the configurations' figures (landscape.py: the median over three workload seeds near the top, the mean
over nine at the top itself), so that a single lucky draw neither sets the optimum nor counts as a find.

Each method runs ``--restarts`` evaluations (engine restarts; a screened, invalid or duplicate candidate costs
none) per seed; reported at 10, 25 and 50 restarts (the first N evaluated restarts of the run): the best
feasible figure as % of the optimum, median and worst over the seeds (0 when none was found), the share of
restarts that crashed, missed the SLO or failed the quality guard (each class counted alike for every method, by
the ground truth), and the model screen's consultations (dsctl, random+screen).

Usage: .venv/bin/python bench/tune.py [--landscapes ...] [--restarts 50] [--seeds 5] [--rate R]
                                       [--methods dsctl,random,random+screen,tpe,grid] [--cache DIR]
Most of the time is the tables (bench/landscape.py prints their cost): tens of minutes; a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from landscape import LANDSCAPES, MODEL_ERROR, Truth, describe

from dsctl.core.tune import screens
from dsctl.core.tune.search import Candidate, Outcome, SearchSettings
from dsctl.services import tune
from dsctl.services.tune_search import Search

METHODS = ("dsctl", "random", "random+screen", "tpe", "grid")
CHECKPOINTS = (10, 25, 50)


@dataclasses.dataclass
class Run:
    configs: list[dict[str, Any]]  # per evaluated restart, in order
    failures: list[str | None]  # per evaluated restart: crash / slo / quality / None
    consulted: int = 0

    def best_at(self, truth: Truth, restarts: int) -> float:
        """The best figure (landscape.Truth.figure: robust to the workload's draw) among the first ``restarts``
        evaluated configurations that met the SLO and the quality guard; 0 when none did."""
        figures = (truth.figure(c) for c, failure in zip(self.configs[:restarts], self.failures[:restarts], strict=True)
                   if failure is None)
        return max((f for f in figures if f is not None), default=0.0)

    def bad_at(self, restarts: int) -> float:
        window = self.failures[:restarts]
        return sum(1 for f in window if f is not None) / max(1, len(window))


def truth_evaluator(truth: Truth):
    def evaluate(candidate: Candidate) -> Outcome:
        outcome = truth.outcome(candidate.config)
        if outcome is None:  # the quality guard rules it out: the restart is spent, the agreement is known
            return Outcome(agreement=truth.agreement(candidate.config))
        return outcome
    return evaluate


def dsctl_screen(truth: Truth, budget: int) -> tuple[Any, screens.ModelScreen | None]:
    """The screens `dsctl tune --simulate` builds (tune.build_screen: the roofline, then the model on dsctl's
    profile, consultations bounded by the budget)."""
    inputs = dataclasses.replace(truth.inputs, budget=budget, screen="model")
    return tune.build_screen(inputs, truth.slos, truth.space, truth.workload)


def run_search(truth: Truth, method: str, seed: int, restarts: int) -> Run:
    strategy = "random" if method.startswith("random") else "tpe"
    screen, model = (dsctl_screen(truth, restarts) if method in ("dsctl", "random+screen") else (None, None))
    # dsctl searches the space its quality model narrows (tune.quality_narrowed, as `dsctl tune` does); random+screen
    # samples the whole space and the same screen judges each candidate.
    space = tune.quality_narrowed(truth.inputs, truth.space)[0] if method == "dsctl" else truth.space
    result = Search(space, truth.slos, truth_evaluator(truth),
                    SearchSettings(budget=restarts, seed=seed, strategy=strategy, objective=truth.inputs.objective,
                                   npus_per_instance=truth.inputs.npus_per_instance,
                                   **({} if method == "dsctl" else {"refine_share": 0.0})), screen=screen).run()
    evaluated = [t for t in result.trials if t.evaluated and t.duplicate_of is None]
    return Run([dict(t.config) for t in evaluated], [truth.failure(t.config) for t in evaluated],
               model.consulted if model is not None else 0)


def coarse_grid(truth: Truth) -> list[dict[str, Any]]:
    axes: dict[str, tuple] = {}
    for config in truth.table():
        for name, value in config.items():
            axes.setdefault(name, ())
            if value not in axes[name]:
                axes[name] = (*axes[name], value)
    coarse = {name: tuple(dict.fromkeys((v[0], v[len(v) // 2], v[-1]))) for name, v in axes.items()}
    points = [dict(zip(coarse, values, strict=True)) for values in itertools.product(*coarse.values())]
    return [p for p in points if not truth.space.violations(p)]


def run_grid(truth: Truth, seed: int, restarts: int) -> Run:
    points = coarse_grid(truth)
    chosen = random.Random(seed).sample(points, min(restarts, len(points)))
    return Run([dict(c) for c in chosen], [truth.failure(c) for c in chosen])


def percent(value: float, optimum: float) -> float:
    return 100.0 * value / optimum if optimum > 0 else 0.0


def checkpoints(restarts: int) -> tuple[int, ...]:
    """The CHECKPOINTS a run of ``restarts`` reaches (a run of 25 says nothing about 50), else ``restarts`` alone."""
    return tuple(n for n in CHECKPOINTS if n <= restarts) or (restarts,)


def summary_point(restarts: int) -> int:
    """The checkpoint the summary and the failed-restart share are read at: issue 21's 25, or the last one a shorter
    run reaches."""
    reached = checkpoints(restarts)
    return max((n for n in reached if n <= 25), default=reached[0])


def report(truth: Truth, name: str, runs: list[Run], optimum: float, restarts: int) -> dict[str, Any]:
    row: dict[str, Any] = {"method": name}
    parts = []
    for n in checkpoints(restarts):
        shares = [percent(r.best_at(truth, n), optimum) for r in runs]
        row[n] = (statistics.median(shares), min(shares))
        parts.append(f"{n:2d}: {row[n][0]:5.1f} % (worst {row[n][1]:5.1f} %)")
    at = summary_point(restarts)
    bad = statistics.median(100.0 * r.bad_at(at) for r in runs)
    row["bad"] = bad
    consulted = statistics.median(r.consulted for r in runs)
    print(f"  {name:13s} {'; '.join(parts)}; failed restarts at {at}: {bad:4.1f} %"
          + (f"; model screen consulted {consulted:g}" if consulted else ""))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", default=",".join(LANDSCAPES))
    parser.add_argument("--restarts", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=None, help="goodput at this load instead of capacity")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the evaluated configurations here (landscape.py --cache)")
    args = parser.parse_args(argv)
    objective = "capacity" if args.rate is None else "goodput"
    print(f"ground truth hardware vs dsctl's profile: {', '.join(f'{k} x{v:g}' for k, v in MODEL_ERROR.items())}; "
          f"{args.restarts} restarts per run, {args.seeds} seeds, "
          f"figures at {', '.join(map(str, checkpoints(args.restarts)))} "
          "restarts: median % of the optimum (worst seed)")
    summary: list[tuple[str, Mapping[str, Any]]] = []
    for key in args.landscapes.split(","):
        truth = Truth(LANDSCAPES[key], objective=objective, rate=args.rate, cache=args.cache)
        facts = describe(truth, objective, args.rate)
        truth.save()  # the table is the long part: kept even if a search below fails
        if not facts["optimum"]:
            continue
        runs: dict[str, list[Run]] = {}
        for method in args.methods.split(","):
            for seed in range(args.seeds):  # progress on stderr: a landscape's searches take tens of minutes
                started = time.monotonic()
                run = (run_grid(truth, seed, args.restarts) if method == "grid"
                       else run_search(truth, method, seed, args.restarts))
                runs.setdefault(method, []).append(run)
                truth.save()  # what this search evaluated survives an interrupted run
                print(f"  [{key} {method} seed {seed + 1}/{args.seeds}: {len(run.configs)} restarts in "
                      f"{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)
        optimum, _ = truth.optimum()  # the searches may have found better than the table
        if optimum > facts["optimum"]:
            print(f"  (a search found {optimum:.3g}, above the table's optimum: the figures are against it)")
        rows = {m: report(truth, m, r, optimum, args.restarts) for m, r in runs.items()}
        truth.save()
        summary.append((key, rows))
    at = summary_point(args.restarts)
    print(f"\nsummary at {at} restarts (median % of the optimum / worst seed / failed restarts):")
    for key, rows in summary:
        cells = ", ".join(f"{m} {r[at][0]:.0f}/{r[at][1]:.0f}/{r['bad']:.0f}" for m, r in rows.items())
        print(f"  {key}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
