"""What the lab benches share: running `python -m dsctl` against a lab of their own (``DSCTL_LAB_ROOT``), and
stopping with the command's own words when it fails.  Imported by the bench scripts (bench/ is their sys.path[0])."""

from __future__ import annotations

import os
import subprocess
import sys


def dsctl(root: str, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DSCTL_LAB_ROOT": root}
    return subprocess.run([sys.executable, "-m", "dsctl", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise SystemExit(f"dsctl {' '.join(result.args[3:5])} exited {result.returncode}:\n"
                         f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result
