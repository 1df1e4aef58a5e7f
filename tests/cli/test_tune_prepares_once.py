"""One `dsctl tune` prepares once (issue 43): the command parses and calls the verb, the verb prepares (the live one
reads the fleet once and checks --write-back once) and runs the one driver.  Counted on a whole `dsctl tune
--simulate` and on a whole live tune over a fleet of fakes (the playbook runner deploys whatever it is asked to and
the prober serves every request in 50 ms), in process."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from dsctl.adapters import writeback
from dsctl.adapters.ansible_run import HostOutcome, PlaybookRun
from dsctl.adapters.probe_client import RunResult
from dsctl.app import main
from dsctl.core.load.probe_metrics import RequestRecord
from dsctl.services import tune, tune_live
from dsctl.services.context import AppContext

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample"
SIMULATE = ["--simulate", "--model", "r1-7b", "--chip", "910B3", "--prompt-tokens", "uniform:64:512",
            "--output-tokens", "uniform:16:64", "--max-model-len", "4096", "--param", "kv_sparse_threshold=0",
            "--slo", "ttft:median=2s", "--budget", "2", "--window", "5"]
LIVE = ["--slo", "ttft:median=2s", "--objective", "goodput", "--rate", "2", "--budget", "2", "--warmup", "0",
        "--param", "max_num_seqs=32,64,128", "--write-back", "--json"]


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Calls of each mode's prepare, the live tune's fleet reads and --write-back checks; runs under tmp_path."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    calls: Counter[str] = Counter()

    def count(module, name: str, key: str) -> None:
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    count(tune, "prepare", "simulate prepare")
    count(tune_live, "prepare", "live prepare")
    count(tune_live, "load_fleet", "fleet read")
    count(writeback, "check", "write-back check")
    return calls


class Fleet:
    """The ports of a live tune: every deploy succeeds on the hosts it is limited to; every request is answered,
    50 ms to its first token, at the moment it was scheduled."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.playbooks: Counter[str] = Counter()
        self.lock = threading.Lock()

    def run(self, playbook, inventory, *, limit=None, extra_vars=None, artifacts_dir=None, **_options):
        with self.lock:
            self.playbooks[playbook] += 1
        hosts = limit.split(",") if limit else ["atlas-a01", "atlas-a02"]
        outcomes = {host: HostOutcome(host, ok=1, facts={"inference_service_report": {
            "chat-0": "restarted", "chat-1": "restarted"}}) for host in hosts}
        return PlaybookRun(playbook=playbook, rc=0, artifacts=artifacts_dir or self.tmp, hosts=outcomes)

    def engine_time_scale(self, target, **_options):
        return None

    def prompt_token_counts(self, target, **_options):
        return None, "HTTP 404"

    def probe(self, target, *, model, load, warmup, on_model, **_options):
        on_model(model or "deepseek-r1-distill-qwen-7b")
        times = list(itertools.islice(load.schedule, (load.requests or 0) + warmup))

        def answered(index: int, sent: float) -> RequestRecord:
            chunks = [sent + 0.05 + 0.01 * k for k in range(8)]
            return RequestRecord(request_id=str(index), scheduled=sent, sent=sent, chunk_times=chunks,
                                 token_messages=8, output_tokens=8, prompt_tokens=16, status=200, end=chunks[-1])

        records = [answered(i, t) for i, t in enumerate(times)]
        return model, RunResult(records=records[warmup:], warmup=records[:warmup], duration=records[-1].end,
                                started_wall=0.0, perf_to_wall=0.0, perf_to_wall_end=math.nan)


def test_a_simulated_tune_prepares_once(counted, capsys):
    assert main(["tune", *SIMULATE, "--json"]) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["counts"]["evaluated"] == 2
    assert counted == {"simulate prepare": 1}


def test_a_live_tune_reads_the_fleet_and_checks_the_write_back_once(counted, capsys, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(SAMPLE, inventory)
    fleet = Fleet(tmp_path)
    code = main(["tune", str(inventory / "hosts.yml"), *LIVE], context=AppContext(runner=fleet, prober=fleet))
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)["data"]
    assert data["counts"]["evaluated"] == 2 and data["deployed"] in ("winner", "baseline")
    assert len(data["verification"]) == 4 and all(v["met"] for v in data["verification"])
    assert (Path(data["run_dir"]) / "result.json").is_file()
    # the baseline, two trials and the end: the playbooks ran, and the plan was made once, before all of them
    assert fleet.playbooks["deploy.yml"] == 4
    assert counted == {"live prepare": 1, "fleet read": 1, "write-back check": 1}
