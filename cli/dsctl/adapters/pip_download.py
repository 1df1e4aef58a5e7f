"""Run ``pip download`` (the resolver `dsctl wheelhouse build` uses) as a bounded subprocess."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence


def run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    """pip's result; subprocess.TimeoutExpired after ``timeout`` seconds (pip is killed).

    The user's pip.conf must not add indexes or constraints to what they named on the command line."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)
