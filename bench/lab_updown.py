"""Time `dsctl lab up` and `dsctl lab down` for 1, 8 and 32 hosts (root, Linux). Prints one line per size.

Usage: .venv/bin/python bench/lab_updown.py [SIZES...]      e.g.  bench/lab_updown.py 1 8 32
The goal (issue 2): a 32-host lab comes up in well under a minute on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = "/run/dsctl/bench-lab"


def timed(*args: str) -> float:
    env = {**os.environ, "DSCTL_LAB_ROOT": ROOT}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsctl", "lab", *args], env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main(sizes: list[int]) -> None:
    timed("down")
    print(f"{'hosts':>5}  {'up (bare) s':>11}  {'down s':>7}  {'up (HDK preinstalled) s':>23}  {'down s':>7}")
    for size in sizes:
        bare_up = timed("up", "--hosts", str(size))
        bare_down = timed("down")
        installed_up = timed("up", "--hosts", str(size), "--driver", "24.1.rc3", "--firmware", "7.5.0.1.129")
        installed_down = timed("down")
        print(f"{size:>5}  {bare_up:>11.2f}  {bare_down:>7.2f}  {installed_up:>23.2f}  {installed_down:>7.2f}")


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [1, 8, 32])
