"""A real engine process on a lab host, probed from the controller over the lab network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import address, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

PORT = 8000
VLLM = "0.13.0+empty"  # the lab builds vllm as vllm-ascend installs it: a source build with a local version


@pytest.fixture(scope="module")
def engine_on_lab_host(bare_lab):
    """The engine installed on lab-01 from the lab's wheelhouse (the stand-in vllm wheel carries it) and
    started over SSH, as a site would start any serving process; the controller's files are not visible there."""
    host = next(h for h in bare_lab.spec.members if h.name == "lab-01")
    wheels = bare_lab.paths.packages / "wheels"
    # The stand-in vllm has dependencies, as the real one does: pip on the controller names the closure.
    with tempfile.TemporaryDirectory() as closure:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-index", "--find-links", str(wheels),
                        "--dest", closure, f"vllm=={VLLM}"], check=True, timeout=120,
                       env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"})
        names = sorted(path.name for path in Path(closure).glob("*.whl"))
    assert any(name.startswith("numpy-") for name in names), names
    bare_lab.sh_ok("lab-01", "mkdir -p /root/wheels")
    for name in names:
        bare_lab.upload("lab-01", f"wheels/{name}")
    bare_lab.sh_ok("lab-01", "python3 -m venv /root/engine-venv && PIP_CONFIG_FILE=/dev/null /root/engine-venv/bin/pip "
                             f"install -q --no-index --find-links /root/wheels 'vllm=={VLLM}'")
    command = (
        "setsid /root/engine-venv/bin/python -m dsctl.engine serve deepseek-r1-distill-qwen-7b "
        f"--port {PORT} "
        "--time-scale 0.05 --startup 0 --seed 7 --record /tmp/engine-record.jsonl "
        "> /tmp/engine.log 2>&1 < /dev/null &"
    )
    bare_lab.sh_ok("lab-01", command)
    url = f"http://{host.address}:{PORT}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    else:
        pytest.fail("engine did not become healthy:\n" + bare_lab.sh("lab-01", "cat /tmp/engine.log").stdout)
    yield url
    bare_lab.sh("lab-01", "pkill -f 'dsctl.engine serve'")


def test_probe_prints_vllm_metrics_and_the_same_numbers_in_json(engine_on_lab_host, bare_lab):
    table = dsctl("probe", engine_on_lab_host, "--rate", "4", "--requests", "40", "--seed", "3")
    for label in ("TTFT", "TPOT", "ITL", "E2EL", "Request throughput"):
        assert label in table.stdout, table.stdout
    result = dsctl("probe", engine_on_lab_host, "--rate", "4", "--requests", "40", "--seed", "3", "--json")
    data = json.loads(result.stdout)["data"]
    text = json.dumps(data)
    assert data and "ttft" in text.lower()
    # the engine recorded the same requests the probe sent (80 in all, both runs)
    records = bare_lab.sh_ok("lab-01", "cat /tmp/engine-record.jsonl").splitlines()
    assert len(records) >= 80


def test_probe_of_an_unreachable_engine_is_a_one_line_error(bare_lab):
    result = dsctl("probe", f"http://{address('lab-02')}:8999", "--rate", "1", "--requests", "2", "--timeout", "5",
                   check=False)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and f"{address('lab-02')}:8999" in result.stderr
