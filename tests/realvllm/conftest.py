"""Real vLLM (the CPU build of 0.32.0) and its tiny model, as .ci/setup installs them (dsctl.lab.real_vllm).

The tests here hold dsctl's engine-facing half against vLLM's own code.  They need the venv and the model
where ``python -m dsctl.lab.real_vllm`` puts them (``$DSCTL_REAL_VLLM_VENV`` and ``$DSCTL_REAL_VLLM_MODEL`` elsewhere):
without them they fail, saying how to make them, unless DSCTL_SKIP_REAL_VLLM=1 asks to leave them out (a machine
that cannot install vLLM; CI always has it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dsctl.lab import real_vllm

VENV = Path(os.environ.get("DSCTL_REAL_VLLM_VENV") or real_vllm.DEFAULT_VENV)
MODEL = Path(os.environ.get("DSCTL_REAL_VLLM_MODEL") or real_vllm.DEFAULT_MODEL)


def require_real_vllm() -> None:
    """Fail (or skip, with DSCTL_SKIP_REAL_VLLM=1) when real vLLM or its model is not installed."""
    if os.environ.get("DSCTL_SKIP_REAL_VLLM") == "1":
        pytest.skip("DSCTL_SKIP_REAL_VLLM=1: the real-vLLM tests are left out")
    if not (VENV / "bin" / "vllm").exists() or not real_vllm.model_complete(MODEL):
        pytest.fail(f"no real vLLM at {VENV} (or no model at {MODEL}): run .ci/setup, or python -m "
                    f"dsctl.lab.real_vllm --venv {VENV} --model {MODEL} (DSCTL_SKIP_REAL_VLLM=1 leaves these tests "
                    "out)", pytrace=False)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    require_real_vllm()
    return VENV / "bin" / "python"


def parse_with_vllm(python: Path, argvs: list[list[str]]) -> dict:
    """vLLM's own parser over each command line (tests/realvllm/vllm_argparse.py)."""
    done = subprocess.run([str(python), str(Path(__file__).with_name("vllm_argparse.py"))],
                          input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
                          env=real_vllm.environment(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
