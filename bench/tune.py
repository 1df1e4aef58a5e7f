"""How well `dsctl tune`'s search does on the landscapes of bench/landscape.py, against seeded random search and a
coarse grid, with the ground truth from exhaustive offline evaluation.

For each engine (the fixed-batch engine, vllm-ascend) and each of landscape.py's targets (an SLO at a request
rate), every configuration of landscape.py's grid is evaluated once with the offline evaluator (the same
evaluator `dsctl tune --simulate` uses, services.tune.simulator, at the target's rate): the optimum is the highest
goodput among the configurations that meet the SLO (and the quality guard).  Then each method gets ``--restarts``
evaluations (engine restarts; screened or invalid candidates cost none), over ``--seeds`` seeds:

* dsctl: `search.Search` with its TPE sampler, the roofline screen and the model screen (the offline engine model
  predicting each candidate with requests of another seed than the table's: a prediction, not the measurement),
  as `dsctl tune` runs it;
* random: the same driver with seeded uniform sampling (``strategy="random"``);
* grid: a coarse grid (low / middle / high of every knob), a seeded sample of ``--restarts`` of its points.

All three sample only grid points (the space is pinned to the grid with --param overrides), so every evaluation
is a lookup in the exhaustive table.  Reported per method, median over the seeds: the best feasible goodput found
as % of the optimum (0 when none was found) and the share of its restarts that crashed or missed the SLO.

Usage: .venv/bin/python bench/tune.py [--requests N] [--restarts 25] [--seeds 5] [--engines fixed-batch,vllm-ascend]
                                       [--targets A,B,C]
The exhaustive tables take most of the time (about 700 evaluations per target at 0.05-0.5 s each on the shared
2-core machine): expect tens of minutes with the defaults; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from landscape import FIXED_GRID, MAX_MODEL_LEN, MODEL, PROMPTS, VLLM_GRID

from dsctl.core.tune import quality, screens, slo
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.search import CRASHES, Candidate, Failure, Outcome, Search, SearchSettings
from dsctl.services import tune

OUTPUTS = "uniform:16:192"
# landscape.py's targets, as --slo and --rate
TARGETS = {"A": ("ttft=200ms", 4.0), "B": ("tpot=40ms", 8.0), "C": ("e2el=20s", 1.0)}
# landscape.py's grids over the tune spaces' knobs (fixed-batch's batch_size is per stream, up to 64 in the space)
GRIDS = {
    "fixed-batch": ("lab-engine", {"batch_size": tuple(b for b in FIXED_GRID["batch_size"] if b <= 64),
                                   "stream_num": FIXED_GRID["stream_num"],
                                   "kv_sparse_threshold": FIXED_GRID["kv_sparse_threshold"]}),
    "vllm-ascend": ("vllm-ascend", {**VLLM_GRID, "enable_prefix_caching": (False,), "enforce_eager": (False,),
                                    "multistream_overlap_shared_expert": (False,)}),
}


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else f"{value:g}" \
        if isinstance(value, float) else str(value)


def pinned_space(name: str, engine: str, grid: dict[str, tuple]) -> tuple[tune.TuneInputs, space_mod.SearchSpace]:
    overrides = tuple(f"{knob}={','.join(_text(v) for v in values)}" for knob, values in grid.items())
    inputs = tune.TuneInputs(model=MODEL, chip="910B3", slos=("ttft=1s",), run_dir=Path("."), engine=engine,
                             space=name, prompt_tokens=PROMPTS, output_tokens=OUTPUTS, max_model_len=MAX_MODEL_LEN,
                             params=overrides)
    return inputs, tune.resolve(inputs)[1]


class Table:
    """Every grid configuration evaluated once at the target; the evaluator the searches get looks it up."""

    def __init__(self, inputs: tune.TuneInputs, space: space_mod.SearchSpace, grid: dict[str, tuple]):
        self.slos, _, workload = tune.resolve(inputs)
        self.space = space
        evaluator = tune.simulator(inputs, self.slos, space, workload)
        self.outcomes: dict[tuple, Outcome] = {}
        self.configs = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
        for config in self.configs:
            if space.violations(config):
                continue  # the driver tells these without evaluating
            candidate = Candidate(-1, config, space.params(config), space.fields(config), bool(space.lossy))
            self.outcomes[self.key(config)] = evaluator(candidate)

    @staticmethod
    def key(config: dict[str, Any]) -> tuple:
        return tuple(sorted(config.items()))

    def feasible_goodput(self, config: dict[str, Any]) -> float | None:
        outcome = self.outcomes.get(self.key(config))
        if outcome is None or outcome.failure is not None or outcome.metrics is None:
            return None
        if not slo.judge(self.slos, outcome.metrics).met:
            return None
        if outcome.agreement is not None and outcome.agreement < quality.DEFAULT_MIN_AGREEMENT:
            return None
        return float(outcome.metrics.get("request_goodput") or 0.0)

    def optimum(self) -> float:
        values = [g for c in self.configs if (g := self.feasible_goodput(c)) is not None]
        return max(values, default=0.0)

    def evaluator(self, candidate: Candidate) -> Outcome:
        return self.outcomes[self.key(candidate.config)]


def run_search(table: Table, inputs: tune.TuneInputs, strategy: str, seed: int, restarts: int) -> tuple[float, float]:
    screen = screens.roofline_screen(chip=inputs.chip, model=inputs.model, prompt_tokens=64, output_tokens=16,
                                     slos=table.slos, npus_per_instance=1)
    if strategy == "tpe":  # dsctl's own search also has the model screen (tune --screen model, the default)
        _, space, workload = tune.resolve(inputs)
        screen = screens.combined(screen, screens.model_screen(
            tune.model_predictor(inputs, table.slos, space, workload), table.slos))
    result = Search(table.space, table.slos, table.evaluator,
                    SearchSettings(budget=restarts, seed=seed, strategy=strategy), screen=screen).run()
    evaluated = [t for t in result.trials if t.evaluated and t.duplicate_of is None]
    bad = sum(1 for t in evaluated if t.failure in CRASHES or t.failure == Failure.SLO_MISS)
    found = [table.feasible_goodput(t.config) for t in evaluated]
    return max((g for g in found if g is not None), default=0.0), bad / max(1, len(evaluated))


def run_grid(table: Table, grid: dict[str, tuple], seed: int, restarts: int) -> tuple[float, float]:
    coarse = {k: tuple(dict.fromkeys((v[0], v[len(v) // 2], v[-1]))) for k, v in grid.items()}
    points = [dict(zip(coarse, values, strict=True)) for values in itertools.product(*coarse.values())]
    points = [p for p in points if table.key(p) in table.outcomes]  # invalid ones cost no restart
    chosen = random.Random(seed).sample(points, min(restarts, len(points)))
    bad = 0
    best = 0.0
    for config in chosen:
        goodput = table.feasible_goodput(config)
        outcome = table.outcomes[table.key(config)]
        if goodput is None and (outcome.failure in CRASHES or outcome.failure is None):
            bad += 1  # crashed, or measured and missed the SLO / quality guard
        best = max(best, goodput or 0.0)
    return best, bad / max(1, len(chosen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None,
                        help="floor on a probe's measured requests (default: the SLO's sample-size rule)")
    parser.add_argument("--restarts", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--engines", default="fixed-batch,vllm-ascend")
    parser.add_argument("--targets", default="A,B,C")
    args = parser.parse_args(argv)
    print(f"{MODEL} on one 910B3, prompts {PROMPTS}, outputs {OUTPUTS}, max_model_len {MAX_MODEL_LEN}, "
          f"{args.requests or 'the sample-size rule of'} requests per evaluation; {args.restarts} restarts per "
          f"method, median over {args.seeds} seeds")
    for name in args.engines.split(","):
        engine, grid = GRIDS[name]
        for target in args.targets.split(","):
            slo_text, rate = TARGETS[target]
            inputs, space = pinned_space(name, engine, grid)
            inputs = tune.TuneInputs(**{**vars(inputs), "slos": (slo_text,), "rate": rate, "objective": "goodput",
                                        "requests": args.requests})
            started = time.monotonic()
            table = Table(inputs, space, grid)
            optimum = table.optimum()
            print(f"\n{name}, target {target} ({slo_text} at {rate:g} req/s): {len(table.outcomes)} configurations "
                  f"evaluated in {time.monotonic() - started:.0f} s; optimum goodput {optimum:.3g} req/s")
            if optimum <= 0:
                print("  no configuration meets it: nothing to find")
                continue
            for method in ("dsctl", "random", "grid"):
                runs = []
                for seed in range(args.seeds):
                    if method == "grid":
                        runs.append(run_grid(table, grid, seed, args.restarts))
                    else:
                        runs.append(run_search(table, inputs, "tpe" if method == "dsctl" else "random", seed,
                                               args.restarts))
                share = statistics.median(100.0 * best / optimum for best, _ in runs)
                wasted = statistics.median(100.0 * bad for _, bad in runs)
                print(f"  {method:7s} best feasible {share:5.1f} % of the optimum; {wasted:4.1f} % of restarts "
                      f"crashed or missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
