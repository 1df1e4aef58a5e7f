"""`dsctl tune` live on lab instances: a tune that finds the capacity under TTFT median <= 200 ms (modelled),
records and rolls back a candidate that cannot start, writes the winner back and leaves every instance serving it;
Ctrl-C during a tune restores every instance.  A 2-host lab of its own (provisioned once), so it runs beside
test_deploy.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import LAB_ROOT, address, dsctl, provisioned_lab, requires_lab
from .test_deploy import deploy, inventory, statuses

pytestmark = [pytest.mark.lab, requires_lab]


@pytest.fixture(scope="module")
def served_lab(tmp_path_factory):
    yield from provisioned_lab(2, tmp_path_factory, "tune")



TUNE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 2, "port": 8100, "health_timeout_s": 120,
        "allow_unauthenticated": True, "params": {"max_num_seqs": 64, "max_num_batched_tokens": 8192}}
# A median SLO: 50 measured requests (the sample-size rule's least) over a window of at least 10 modelled seconds
# per probe, after a warm-up of 10 at the same rate; p99 would need 1000 per probe. Prefill-heavy (2048 in, 16 out):
# the capacity is ~18 req/s of ~17 SSE messages each, not ~63 of 33 as with 256/32; at 256/32 the final verification
# of four instances at once (~8k messages/s) outran the 2-core CI machine's client, not the instances (CI, stop 25:
# "achieved 57 req/s of 62.6 offered" on all four, while the same test alone passed).
TUNE_ARGS = ("--slo", "ttft:median=200ms", "--prompt-tokens", "2048", "--output-tokens", "16", "--warmup", "2")


def tune_inventory(lab, directory: Path) -> Path:
    (directory / "tune").mkdir(exist_ok=True)
    path = inventory(lab, directory / "tune", [TUNE])
    # Time scale 1: the emulated engine's Python overheads count 1/scale times in modelled time, and under the
    # suite's four workers on two cores a 0.5 scale pushed one instance's confirming probe past 200 ms (CI, stop 23:
    # 205.6 ms). The story is about tune's mechanics, not the lab's speed; probes are a small part of its time.
    data = yaml.safe_load(path.read_text())
    data["all"]["children"]["npu_nodes"]["vars"]["dsctl_ascend_env"] = {"DSCTL_ENGINE_TIME_SCALE": "1"}
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_live_tune_meets_the_slo_writes_the_winner_back_and_every_instance_serves_it(served_lab):
    lab, directory = served_lab
    path = tune_inventory(lab, directory)
    code, report = deploy(path)
    assert code == 0, report["errors"]
    # 0.05 leaves no memory for the KV cache: such a candidate fails its start, is recorded and rolled back
    # (--screen none: the roofline's memory check and the model screen would not start it at all)
    # A state directory of its own: the run directory (plot, trials) is read after the tune exits, and the other
    # workers' dsctl runs prune all but the newest 20 runs of a shared one (seen with five workers).
    result = dsctl("tune", str(path), *TUNE_ARGS, "--budget", "6", "--seed", "2", "--param",
                   "gpu_memory_utilization=0.05,0.9", "--screen", "none", "--write-back", "--json", check=False,
                   timeout=900, env={"XDG_STATE_HOME": str(directory / "state")})
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)["data"]
    best = data["best"]
    assert best["feasible"] and best["slo_values"]["ttft:p50"] <= 200 and best["rate"] > 0
    assert data["objective"] == "capacity" and best["objective"] == best["rate"]
    # every measured trial reports its sustained rate, the window and sample count it rests on, per NPU; a
    # rate search that held at its ceiling says so instead of claiming a capacity
    for trial in data["trials"]:
        cap = trial["capacity"]
        if trial["failure"] not in (None, "slo_miss", "quality"):
            continue
        assert cap is not None and cap["ceiling"] > 0, trial
        if cap["sustained_rate"] is not None:
            assert cap["window_s"] >= 9.0 and cap["samples"] >= 50 and cap["per_npu"] == cap["sustained_rate"] / 4
            if cap["at_ceiling"]:
                assert cap["interval"][1] is None
            else:
                assert cap["interval"][1] > cap["sustained_rate"]
    assert data["capacity"]["winner"]["trial"] == best["number"]
    assert data["capacity"]["baseline"] is None or data["capacity"]["baseline"]["trial"] == 0
    assert len(data["slots"]) == 4 and data["counts"]["evaluated"] == 6
    oom = [t for t in data["trials"] if t["failure"] == "out_of_memory"]
    assert oom, [(t["number"], t["failure"], t["config"]) for t in data["trials"]]
    assert "No available memory for the cache blocks" in oom[0]["detail"]
    # the winner is in the inventory now, every instance runs it (a deploy restarts nothing), and each one was
    # confirmed by a probe at the rate tune reported
    written = yaml.safe_load(path.read_text())["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"][0]
    if data["deployed"] == "winner":
        assert data["written"] == [str(path)]
        assert all(written["params"][key] == value for key, value in best["params"].items())
    else:  # the inventory's own configuration won: nothing to write
        assert data["deployed"] == "baseline" and data["written"] == [] and written == TUNE
    assert len(data["verification"]) == 4 and all(v["met"] for v in data["verification"])
    code, report = deploy(path)
    assert code == 0 and set(statuses(report).values()) == {"unchanged"}, report
    confirm = dsctl("probe", f"http://{address('lab-02')}:8101", "--rate", f"{best['rate']:g}", "--requests", "60",
                    "--prompt-tokens", "2048", "--output-tokens", "16", "--goodput", "ttft:200", "--slo-stat", "median",
                    "--json", check=False)
    assert confirm.returncode == 0, confirm.stdout + confirm.stderr
    assert json.loads(confirm.stdout)["data"]["slo"]["met"]
    assert Path(data["plot_path"]).stat().st_size > 0 and Path(data["trials_path"]).read_text().count("\n") >= 6


def test_ctrl_c_during_a_live_tune_restores_every_instance(served_lab):
    lab, directory = served_lab
    path = tune_inventory(lab, directory)  # the baseline again (the test above wrote its winner into the file)
    code, report = deploy(path)
    assert code == 0, report["errors"]
    err = directory / "tune-interrupted.err"
    # A state directory of its own, as above: another run's pruning of a shared one removed this study's journal
    # lock under it (FileNotFoundError on study.journal.lock..., seen with other engineers' runs beside it).
    env = {**os.environ, "DSCTL_LAB_ROOT": str(LAB_ROOT), "COLUMNS": "200",
           "XDG_STATE_HOME": str(directory / "state-interrupted")}
    with err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "dsctl", "tune", str(path), *TUNE_ARGS, "--budget", "12"],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env, text=True)
        deadline = time.monotonic() + 300
        while "\ntrial " not in err.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGINT)  # a trial has finished, others are running
        assert proc.wait(timeout=300) == 130, err.read_text()
    text = err.read_text()
    assert "every instance of chat restored to the inventory's configuration" in text, text
    assert "dsctl tune --resume" in text
    code, report = deploy(path)
    assert code == 0 and set(statuses(report).values()) == {"unchanged"}, report
