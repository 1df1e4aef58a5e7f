"""Clients of a gateway: `dsctl probe` runs back to back, in a thread, until stopped (test_upgrade.py, test_gateway.py).

A single probe of fixed length ends when its requests are spent, whatever the steps under test still have to do, and
on a busy 2-core machine those steps take two to three times as long as alone.  Back-to-back probes keep the gateway
loaded until the test says stop; each run's start and end are kept so a test can show that a load was on when a step
happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from .conftest import LAB_ROOT

PROBE_TIMEOUT = 300.0


class GatewayLoad:
    def __init__(self, url: str, *probe_args: str, max_runs: int = 200):
        self.argv = [sys.executable, "-m", "dsctl", "probe", url, "--json", *probe_args]
        self.max_runs = max_runs  # a bound: a test that forgets to stop gets a clear error, not an endless load
        self.runs: list[dict] = []
        self.spans: list[tuple[float, float]] = []  # monotonic (start, end) of each finished run
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        env = {**os.environ, "DSCTL_LAB_ROOT": str(LAB_ROOT)}
        while not self._stop.is_set():
            if len(self.spans) >= self.max_runs:
                self.problems.append(f"the load ran {self.max_runs} probes without being stopped")
                return
            began = time.monotonic()
            result = subprocess.run(self.argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env)
            self.spans.append((began, time.monotonic()))
            try:
                self.runs.append(json.loads(result.stdout)["data"]["metrics"])
            except (ValueError, KeyError, TypeError):
                self.problems.append(f"probe exited {result.returncode}: {result.stderr[-500:]}")

    def __enter__(self) -> GatewayLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=PROBE_TIMEOUT + 60)

    def covered(self, moment: float) -> bool:
        """Whether a finished probe run was sending at ``moment`` (time.monotonic())."""
        return any(start <= moment <= end for start, end in self.spans)

    def wait_for_run_after(self, moment: float, timeout: float = PROBE_TIMEOUT) -> None:
        """Until a probe run that started after ``moment`` has finished (bounded by ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not any(start > moment for start, _ in self.spans):
            assert time.monotonic() < deadline, f"no probe run started after the moment and ended in {timeout:g} s"
            assert self._thread.is_alive(), f"the load stopped: {self.problems}"
            time.sleep(0.5)

    @property
    def failed(self) -> int:
        return sum(run["failed"] for run in self.runs)

    @property
    def completed(self) -> int:
        return sum(run["completed"] for run in self.runs)
