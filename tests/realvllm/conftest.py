"""Real vLLM (the CPU build of 0.32.0) and its tiny model, as .ci/setup installs them (dsctl.lab.real_vllm).

The tests here hold dsctl's engine-facing half against vLLM's own code.  They need the venv and the model
where ``python -m dsctl.lab.real_vllm`` puts them (``$DSCTL_REAL_VLLM_VENV`` and ``$DSCTL_REAL_VLLM_MODEL`` elsewhere):
without them they fail, saying how to make them, unless DSCTL_SKIP_REAL_VLLM=1 asks to leave them out (a machine
that cannot install vLLM; CI always has it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dsctl.lab import real_vllm

VENV = Path(os.environ.get("DSCTL_REAL_VLLM_VENV") or real_vllm.DEFAULT_VENV)
MODEL = Path(os.environ.get("DSCTL_REAL_VLLM_MODEL") or real_vllm.DEFAULT_MODEL)
SERVED_NAME = "tiny"
START_TIMEOUT_S = 400.0  # 45 s alone on two cores; several times that beside three busy test workers


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_with_vllm(python: Path, argvs: list[list[str]]) -> dict:
    """vLLM's own parser over each command line (tests/realvllm/vllm_argparse.py)."""
    done = subprocess.run([str(python), str(Path(__file__).with_name("vllm_argparse.py"))],
                          input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
                          env=real_vllm.environment(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


class Server:
    """One real `vllm serve` of the tiny model on loopback (its own process group; stopped at the end)."""

    def __init__(self, extra: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [str(VENV / "bin" / "vllm"), "serve", str(MODEL), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "2048", *extra]
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=real_vllm.environment())

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"vllm serve exited {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise AssertionError(f"vllm serve not healthy after {timeout:g} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def vllm_server(vllm_python, tmp_path_factory):
    """Real vLLM serving the tiny model (eager: no graph compilation, the fastest start)."""
    server = Server(["--enforce-eager"], tmp_path_factory.mktemp("vllm") / "serve.log")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
