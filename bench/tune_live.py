"""Wall time of a live `dsctl tune` on the lab with every instance as a trial slot against one slot, same budget.

A 2-host lab (8 NPUs each, the lab's demo service: 2 instances of R1-Distill-Qwen-7B per host, so 4 slots) is
brought up, provisioned and deployed; then the same study (seed, SLO, workload, budget) runs twice from the same
baseline, with ``--slots 1`` and with all 4 slots.  Printed: the wall time of each, their ratio, and the best
goodput each found (both searches ask the same first candidates; with 4 slots later asks see fewer results, so
the best may differ).  Run as root (the lab), on an otherwise idle machine: it takes several minutes.

Usage: .venv/bin/python bench/tune_live.py [--budget 8] [--requests N] [--plot bench/figures/tune-pareto-lab.png]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import labcli

from dsctl.adapters import output_paths
from dsctl.errors import UsageError

ROOT = "/run/dsctl/bench-lab"
WORKLOAD = ("--slo", "ttft=200ms", "--prompt-tokens", "256", "--output-tokens", "64", "--warmup", "2")


def dsctl(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return labcli.dsctl(ROOT, *args, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--requests", type=int, default=None, help="floor on a probe's measured requests "
                        "(default: the sample-size rule of the SLO's percentile)")
    parser.add_argument("--plot", type=Path, help="copy the last run's Pareto plot here")
    args = parser.parse_args(argv)
    if args.plot is not None:  # before the lab and the tunes, not after them
        try:
            output_paths.check_file("--plot", args.plot)
        except UsageError as exc:
            raise SystemExit(f"tune_live: {exc}") from None
    dsctl("lab", "down")
    inventory = labcli.ok(dsctl("lab", "up", "--hosts", "2")).stdout.strip().splitlines()[-1]
    try:
        labcli.ok(dsctl("provision", inventory))
        labcli.ok(dsctl("deploy", inventory))
        rows = []
        for slots in (1, 4):
            started = time.monotonic()
            floor = () if args.requests is None else ("--requests", str(args.requests))
            result = labcli.ok(dsctl("tune", inventory, *WORKLOAD, "--budget", str(args.budget), *floor,
                              "--slots", str(slots)))
            wall = time.monotonic() - started
            print(result.stdout)  # tune's own table, as a user sees it
            trials = next(line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("trials: "))
            run_dir = Path(trials).parent
            data = json.loads((run_dir / "result.json").read_text())
            if args.plot is not None:
                shutil.copyfile(run_dir / "pareto.png", args.plot)
            best = data["best"] or {}
            rows.append((slots, wall, best.get("objective"), data["counts"]["evaluated"]))
            labcli.ok(dsctl("deploy", inventory))  # the next run starts from the same baseline (the inventory's)
        print(f"{'slots':>5}  {'wall s':>7}  {'restarts':>8}  {'best goodput req/s':>18}")
        for slots, wall, best, restarts in rows:
            print(f"{slots:>5}  {wall:>7.0f}  {restarts:>8}  {best if best is None else f'{best:.3g}':>18}")
        print(f"4 slots take {rows[1][1] / rows[0][1]:.2f} x the wall time of 1 slot for the same budget")
    finally:
        dsctl("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
