"""A rolling CANN upgrade of a lab fleet behind the gateway under steady probe load through the gateway.

Usage: .venv/bin/python bench/upgrade.py [--hosts 4] [--rate 4]
Root and Linux only (it brings up a lab under /run/dsctl/bench-lab; no other lab may be up: take the lab lock).

The lab: N serving hosts (HDK 25.3.rc1, CANN 8.3.RC2 + vllm-ascend v0.11.0, one TP4 instance each) and one gateway
host. A probe through the gateway (open loop at --rate, in this process) runs from 30 s before the upgrade until it
ends. Printed:

* failed client requests during the whole run (target 0);
* the lowest 5-second-window output throughput as a share of the pre-upgrade mean (target >= (N-1)/N: one host
  of N is out of the gateway at a time);
* the time of `dsctl upgrade --cann 8.5.0 --vllm-ascend v0.13.0`, then (after `dsctl upgrade --rollback`) the time
  of the same upgrade done host by host with plain `dsctl provision --limit HOST` + `dsctl deploy --limit HOST
  --restart` runs (no drain, no probe gate: what the upgrade adds costs this much).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from dsctl.adapters.probe_client import RunResult
from dsctl.core.load.workload import encode_body, request_body
from dsctl.services.probe import ProbeConfig, make_plan
from dsctl.services.runtime import HttpProber

ROOT = "/run/dsctl/bench-lab"
DRIVER, FIRMWARE = "25.3.rc1", "7.8.0.2.212"
SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
           "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": 8000,
           "health_timeout_s": 120, "params": {"max_num_seqs": 32}, "allow_unauthenticated": True}
WINDOW_S = 5.0
LEAD_S = 30.0


def dsctl(*args: str) -> float:
    env = {**os.environ, "DSCTL_LAB_ROOT": ROOT}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dsctl", *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"dsctl {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
    return time.perf_counter() - started


def lab(hosts: int, directory: Path) -> tuple[Path, str, list[str]]:
    """The lab's inventory with the last host moved into the gateway group; (inventory, gateway URL, fleet)."""
    subprocess.run([sys.executable, "-m", "dsctl", "lab", "down"], env={**os.environ, "DSCTL_LAB_ROOT": ROOT},
                   capture_output=True)
    env = {**os.environ, "DSCTL_LAB_ROOT": ROOT}
    out = subprocess.run([sys.executable, "-m", "dsctl", "lab", "up", "--hosts", str(hosts + 1), "--driver", DRIVER,
                          "--firmware", FIRMWARE, "--cann", "8.3.RC2"], env=env, capture_output=True, text=True,
                         check=True).stdout
    data = yaml.safe_load(Path(out.strip().splitlines()[-1]).read_text())
    nodes = data["all"]["children"]["npu_nodes"]
    name = sorted(nodes["hosts"])[-1]
    gateway_host = nodes["hosts"].pop(name)
    connection = {key: value for key, value in nodes["vars"].items() if key.startswith("ansible_")}
    nodes["vars"].update(dsctl_driver_version=DRIVER, dsctl_firmware_version=FIRMWARE, dsctl_cann_version="8.3.RC2",
                         dsctl_vllm_ascend_version="v0.11.0", dsctl_services=[SERVICE])
    data["all"]["children"]["gateway"] = {"hosts": {name: gateway_host}, "vars": {
        **connection, "dsctl_gateway": {"services": [{"service": "chat", "port": 8080}]}}}
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, f"http://{gateway_host['ansible_host']}:8080", sorted(nodes["hosts"])


class Load:
    """An open-loop probe through the gateway, in a thread, stopped by `stop()` (its in-flight requests end)."""

    def __init__(self, url: str, rate: float):
        cfg = ProbeConfig(url=url, rate=rate, duration=7200.0, prompt_tokens="32", output_tokens="32",
                          timeout=300.0)
        self.plan = make_plan(cfg)
        self.done = threading.Event()
        self.result: RunResult | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = math.nan

    def _run(self) -> None:
        plan = self.plan

        def body(model: str, index: int) -> tuple[bytes, int]:
            planned = plan.workload.request(abs(index))
            return encode_body(request_body("completions", model, planned, ignore_eos=True)), planned.prompt_tokens

        self.started = time.perf_counter()
        _, self.result = HttpProber().probe(
            plan.target, path=plan.path, model=None, api_key=None, request_id_header="x-request-id",
            timeouts=plan.timeouts, load=plan.load, warmup=0, body=body, backstop=7300.0, on_model=lambda _: None,
            on_finish=lambda _rec: "upgrade finished" if self.done.is_set() else None)

    def start(self) -> Load:
        self.thread.start()
        return self

    def stop(self) -> RunResult:
        self.done.set()
        self.thread.join(timeout=600)
        assert self.result is not None, "the load probe did not finish"
        return self.result


def windows(result: RunResult, began: float, upgrade_at: float) -> tuple[float, float]:
    """(pre-upgrade mean, lowest window during the upgrade) of output tokens/s in WINDOW_S windows."""
    buckets: dict[int, int] = {}
    for rec in result.records:
        if rec.success:
            index = int((rec.end - began) // WINDOW_S)
            buckets[index] = buckets.get(index, 0) + rec.output_len
    last = max(buckets) if buckets else 0
    lead = int((upgrade_at - began) // WINDOW_S)
    before = [buckets.get(i, 0) / WINDOW_S for i in range(1, lead)]  # the first window is the ramp-up
    during = [buckets.get(i, 0) / WINDOW_S for i in range(lead, last)]  # the last one is cut by the stop
    return (sum(before) / len(before) if before else math.nan), (min(during) if during else math.nan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        inventory, gateway, fleet = lab(args.hosts, Path(scratch))
        try:
            dsctl("provision", str(inventory))
            dsctl("deploy", str(inventory))
            load = Load(gateway, args.rate).start()
            time.sleep(LEAD_S)
            upgrade_at = time.perf_counter()
            rolling = dsctl("upgrade", str(inventory), "--cann", "8.5.0", "--vllm-ascend", "v0.13.0",
                            "--max-regression", "ttft=100%,throughput=50%")
            result = load.stop()
            before, lowest = windows(result, load.started, upgrade_at)
            failed = sum(1 for rec in result.records if not rec.success and not rec.cancelled)
            dsctl("upgrade", str(inventory), "--rollback")
            target = Path(scratch) / "inventory-8.5.0.yml"
            data = yaml.safe_load(inventory.read_text())
            data["all"]["children"]["npu_nodes"]["vars"].update(dsctl_cann_version="8.5.0",
                                                                 dsctl_vllm_ascend_version="v0.13.0")
            target.write_text(yaml.safe_dump(data, sort_keys=False))
            plain = sum(dsctl("provision", str(target), "--limit", host) + dsctl(
                "deploy", str(target), "--limit", host, "--restart") for host in fleet)
        finally:
            subprocess.run([sys.executable, "-m", "dsctl", "lab", "down"],
                           env={**os.environ, "DSCTL_LAB_ROOT": ROOT}, capture_output=True)
    n = args.hosts
    print(f"hosts: {n} behind the gateway, load {args.rate:g} req/s through it, {len(result.records)} requests")
    print(f"failed client requests: {failed} (target 0)")
    print(f"lowest {WINDOW_S:g}-s window throughput: {lowest:.1f} tok/s = {lowest / before:.0%} of the pre-upgrade "
          f"{before:.1f} tok/s (target >= {(n - 1) / n:.0%})")
    print(f"dsctl upgrade: {rolling:.0f} s; host by host with plain provision + deploy: {plain:.0f} s")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
