"""The live tune's pick against an exhaustive grid, on real vLLM (the CPU build of 0.32.0, the lab's tiny model).

One lab host serves the tiny model with real vLLM (`dsctl.lab.real_vllm.service_entry`: the service field ``venv``),
and every measurement below is the same one, the live tune's: deploy a configuration to the instance through
deploy's health gate, then search the highest Poisson rate it sustains while meeting the SLO (`dsctl tune`'s rate
search, its probes, windows and sample rule).  In the same run, on the same engine:

1. **the grid**: every point of a small space (``--space``: by default max_num_seqs x prefix caching, the other
   vLLM knobs pinned) measured once, each as a one-restart tune whose baseline is that point;
2. **the tune**: ``dsctl tune --budget B`` over the same space (``--param`` narrows its knobs to the grid's values
   and pins the rest), from the inventory's configuration, as a user runs it;
3. **the noise**: the grid's best point and the tune's pick measured ``--repeats`` more times each, so that "the
   tune's pick is as good as the grid's best" is judged against how much one configuration's capacity moves
   between measurements (the spread of its repeats), not against a single number.

Printed: the grid (capacity per point, req/s), the tune's trials, the repeats of both, and the verdict: the pick's
mean capacity against the grid best's mean, with the noise (the larger spread, max - min, of the two points'
repeats).  Capacity here is a 2-core CPU's, with the load generator on the same cores (the probe says when it was
the limit, and this bench prints it): the shape of the landscape is vLLM's, the numbers are this machine's.

Run as root (the lab) on an otherwise idle machine, with real vLLM installed (.ci/setup, or python -m
dsctl.lab.real_vllm): about 35 minutes with the defaults (2,115 s here).

Usage: .venv/bin/python bench/tune_real.py [--budget 4] [--repeats 2] [--slo ttft:p90=100ms]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import labcli
import yaml

from dsctl.lab import real_vllm

ROOT = "/run/dsctl/bench-real"
SUBNET = "10.78.90.0/24"
SERVICE = "real"
# The searched knobs and their grid; every other knob of the vllm-ascend space is pinned (the inventory's value for
# the grid's points, --param for the tune).  Eager mode stays on: a CPU graph compile costs 1-2 minutes per start.
GRID = {"max_num_seqs": [2, 8, 32], "enable_prefix_caching": [False, True]}
PINNED = {"max_num_batched_tokens": 2048, "enable_chunked_prefill": True, "gpu_memory_utilization": 0.9,
          "enforce_eager": True, "multistream_overlap_shared_expert": False}
BASELINE = {"max_num_seqs": 8, "enable_prefix_caching": False}  # the tune starts here (a grid point)
UNMEASURED_RETRIES = 2


def dsctl(*args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    return labcli.dsctl(ROOT, *args, timeout=timeout)


def flag(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def label(point: dict) -> str:
    return " ".join(f"{k}={flag(v)}" for k, v in point.items())


class Bench:
    def __init__(self, lab_inventory: Path, directory: Path, workload: tuple[str, ...]):
        self.lab_inventory = lab_inventory
        self.directory = directory
        self.workload = workload

    def inventory(self, point: dict) -> Path:
        """The lab's inventory with the real-vLLM service at ``point`` (the pinned knobs as they are)."""
        data = yaml.safe_load(self.lab_inventory.read_text())
        service = real_vllm.service_entry(SERVICE, **PINNED, **point)
        data["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"] = [service]
        path = self.directory / "inventory.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def tune(self, point: dict, *extra: str) -> dict:
        """One `dsctl tune` from ``point`` (the inventory's configuration); its result.json.  A tune that measured
        nothing because the load generator was the limit (exit 8: the machine was busy) is run again, twice at
        most."""
        for _ in range(UNMEASURED_RETRIES + 1):
            result = dsctl("tune", str(self.inventory(point)), *self.workload, *extra)
            if result.returncode not in (0, 6, 8):  # 6: no configuration met the SLO (a result like any other)
                labcli.ok(result)
            if result.returncode != 8:
                break
            print(f"      {label(point)}: unmeasured (the load generator was the limit); again", flush=True)
        trials = next(line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("trials: "))
        return json.loads((Path(trials).parent / "result.json").read_text())

    def capacity(self, point: dict) -> float | None:
        """``point``'s capacity as the live tune measures a trial (a one-restart tune: its baseline only); 0 when
        it meets the SLO at no rate, None when it could not be measured."""
        data = self.tune(point, "--budget", "1")
        if data["best"]:
            return float(data["best"]["capacity"]["sustained_rate"])
        return None if data["counts"].get("unmeasured") else 0.0


def shown(value: float | None) -> str:
    return "unmeasured (the load generator was the limit)" if value is None else f"{value:7.2f} req/s"


def spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=4, help="the tune's restarts (the grid has 6 points)")
    parser.add_argument("--repeats", type=int, default=2, help="extra measurements of the grid's best and the pick")
    parser.add_argument("--slo", default="ttft:p90=100ms")
    parser.add_argument("--prompt-tokens", default="256")
    parser.add_argument("--output-tokens", default="16")
    args = parser.parse_args(argv)
    if not real_vllm.model_complete(real_vllm.DEFAULT_MODEL):
        raise SystemExit("no real vLLM: run python -m dsctl.lab.real_vllm (or .ci/setup)")
    workload = ("--slo", args.slo, "--prompt-tokens", args.prompt_tokens, "--output-tokens", args.output_tokens)
    points = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    dsctl("lab", "down")
    started = time.monotonic()
    lab = labcli.ok(dsctl("lab", "up", "--hosts", "1", "--driver", "25.5.0", "--firmware", "7.8.0.5.216",
                          "--cann", "8.5.0", "--subnet", SUBNET))
    directory = Path(ROOT) / "bench-tune-real"
    directory.mkdir(parents=True, exist_ok=True)
    bench = Bench(Path(lab.stdout.strip().splitlines()[-1]), directory, workload)
    try:
        labcli.ok(dsctl("provision", str(bench.inventory(BASELINE))))
        labcli.ok(dsctl("deploy", str(bench.inventory(BASELINE))))
        print(f"real vLLM {real_vllm.ALIAS_VERSION}, tiny model, one lab host; SLO {args.slo}, "
              f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens; pinned: {label(PINNED)}\n",
              flush=True)

        grid: dict[str, list[float]] = {}
        for point in points:
            value = bench.capacity(point)
            grid[label(point)] = [] if value is None else [value]
            print(f"grid  {label(point):<48} {shown(value)}", flush=True)

        params = [f"--param={k}={','.join(flag(v) for v in values)}" for k, values in GRID.items()]
        params += [f"--param={k}={flag(v)}" for k, v in PINNED.items()]
        tuned = bench.tune(BASELINE, "--budget", str(args.budget), *params)
        measured = {key: list(values) for key, values in grid.items()}  # every measurement of each point
        for trial in tuned["trials"]:
            key = label({k: trial["config"][k] for k in GRID})
            sustained = (trial.get("capacity") or {}).get("sustained_rate")
            if trial.get("evaluated") and not trial.get("duplicate_of") and trial.get("failure") != "unmeasured":
                measured[key].append(float(sustained or 0.0))
            print(f"tune  trial {trial['number']}: {key:<40} {shown(sustained)} {trial.get('failure') or ''}",
                  flush=True)
        pick = {k: tuned["best"]["config"][k] for k in GRID} if tuned["best"] else BASELINE

        best_label = max(grid, key=lambda key: max(grid[key], default=-1.0))
        for key in dict.fromkeys([best_label, label(pick)]):
            point = next(p for p in points if label(p) == key)
            for _ in range(args.repeats):
                value = bench.capacity(point)
                measured[key] += [] if value is None else [value]
                print(f"again {key:<48} {shown(value)}", flush=True)

        print(f"\n{'configuration':<48} {'capacity req/s (each measurement)':<36} {'mean':>7} {'spread':>7}")
        for key in [label(p) for p in points]:
            values = measured[key]
            marks = (" <- grid best" if key == best_label else "") + (" <- tune's pick" if key == label(pick) else "")
            each = ", ".join(f"{v:.2f}" for v in values) or "unmeasured"
            mean = f"{statistics.fmean(values):7.2f}" if values else f"{'-':>7}"
            print(f"{key:<48} {each:<36} {mean} {spread(values):7.2f}{marks}")
        best_mean = statistics.fmean(measured[best_label] or [0.0])
        pick_mean = statistics.fmean(measured[label(pick)] or [0.0])
        noise = max(spread(measured[best_label]), spread(measured[label(pick)]))
        kept = " (it kept the baseline: no trial beat it beyond the noise of its measurement)" \
            if tuned.get("deployed") == "baseline" else ""
        print(f"\ntune: {tuned['counts']['evaluated']} restarts of a {len(points)}-point space "
              f"({tuned['counts'].get('duplicate', 0)} asks were repeats, answered from the study); "
              f"its pick: {label(pick)}{kept}")
        print(f"grid best {best_label}: mean {best_mean:.2f} req/s over {len(measured[best_label])} measurements; "
              f"the pick: mean {pick_mean:.2f} over {len(measured[label(pick)])}")
        print(f"noise (largest spread of one configuration's repeats): {noise:.2f} req/s "
              f"({100 * noise / best_mean if best_mean else 0:.0f} % of the best)")
        verdict = "within" if best_mean - pick_mean <= noise else "NOT within"
        print(f"the pick is {verdict} the measured noise of the grid's best "
              f"({pick_mean:.2f} vs {best_mean:.2f}: {100 * pick_mean / best_mean if best_mean else 0:.0f} %)")
        print(f"\nbench wall time {time.monotonic() - started:.0f} s")
    finally:
        dsctl("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
