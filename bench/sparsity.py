"""What kv_sparse_threshold can buy a decode step in the engine model, at its most, and how that depends on the
one guess that makes a loose threshold cost anything (`perfmodel.KV_RECALL_SHARE`).

Issue 21 asks for a long-context landscape whose best threshold is neither 0 nor the loosest the agreement floor
passes (0.15 in the fixed-batch space's 0.05 steps).  Whatever else a threshold changes (KV slots, activation room for
a long prefill) favours the looser one; only a decode step can be faster at an interior threshold: reads fall as the
dropped share d, host recalls (`perfmodel.kv_recall_bytes`) grow as d^2.  This prints how much faster, per model, for
the recall share the engine uses and for others (a sensitivity sweep: the share is a guess, no public source measures
the field guide's scheme), where the KV reads are the whole step (a limit no deployment reaches) and at the fixed-batch
engine's long-context batches (48K-token contexts, batch 1-4: a larger batch's one-step prefill of such prompts runs
out of activation memory).  "depth" = min(step at 0, step at 0.15) / the best interior step - 1: how much the best
interior threshold beats both ends by; the simulated rate search brackets a capacity to 2 % (services/tune.py
RATE_TOLERANCE), and long-fixed's top varies by a 4.5 % standard error over its nine workload draws (README).  No I/O,
under a second:

    PYTHONPATH=cli python bench/sparsity.py [--shares 0.05,0.1,0.15,0.2]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dsctl.core.perf import perfmodel

MODELS = ("deepseek-r1-distill-qwen-7b", "deepseek-v2-lite")
CHIP = "910B3"
ENDS = (0.0, 0.15)          # unsparsified, and the loosest the agreement floor passes (fixed-batch space, 0.05 steps)
INTERIOR = (0.05, 0.1)
LIMIT = (256, 131072)       # batch x context where the KV reads dwarf the weights: the limit of what sparsity buys
LONG_BATCHES = (1, 2, 4)    # the fixed-batch engine's long-context batches
LONG_CONTEXT = 49152


def step_ms(model: str, threshold: float, batch: int, context: int) -> float:
    d = perfmodel.Deployment(chip=perfmodel.chip_by_name(CHIP), model=perfmodel.model_by_name(model), chips=1,
                             kv_keep_fraction=perfmodel.kv_keep_fraction(threshold))
    return perfmodel.decode_step_seconds(d, batch, batch * context) * 1e3


def depth(model: str, batch: int, context: int) -> tuple[float, float, float]:
    """(best interior threshold, its depth against both ends, its advantage over the loosest end alone)."""
    steps = {t: step_ms(model, t, batch, context) for t in ENDS + INTERIOR}
    best = min(INTERIOR, key=steps.__getitem__)
    return best, min(steps[t] for t in ENDS) / steps[best] - 1, steps[ENDS[1]] / steps[best] - 1


def sweep(shares: Sequence[float]) -> list[dict]:
    """Per recall share and model: the depth at the limit and at the long-context batches.  The share is restored
    whatever happens (it is a module constant the engine reads)."""
    rows = []
    original = perfmodel.KV_RECALL_SHARE
    try:
        for share in shares:
            perfmodel.KV_RECALL_SHARE = share
            for model in MODELS:
                limit = depth(model, *LIMIT)
                long = [depth(model, batch, LONG_CONTEXT) for batch in LONG_BATCHES]
                rows.append({"share": share, "model": model, "limit": limit, "long": long})
    finally:
        perfmodel.KV_RECALL_SHARE = original
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="0.025,0.05,0.075,0.1,0.125,0.15,0.2",
                        help="KV_RECALL_SHARE values to try (the engine's own is marked *)")
    shares = [float(s) for s in parser.parse_args(argv).shares.split(",")]
    print(f"{'recall share':>12}  {'model':<28} {'256 x 128K: best, depth, over 0.15':<36} "
          f"48K contexts, batch {' / '.join(map(str, LONG_BATCHES))}: depth")
    for row in sweep(shares):
        mark = "*" if row["share"] == perfmodel.KV_RECALL_SHARE else " "
        best, deep, over_loose = row["limit"]
        long = " / ".join(f"{d * 100:+.1f} %" for _, d, _ in row["long"])
        print(f"{row['share']:>11g}{mark}  {row['model']:<28} {best:<5g} {deep * 100:+6.1f} % "
              f"{over_loose * 100:+7.1f} %{'':<11} {long}")
    print("depth > 0: the best interior threshold decodes faster than both 0 and 0.15 by that much (a decode step, "
          "not a capacity)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
