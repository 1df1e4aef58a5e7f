"""`dsctl tune` as users run it (a real `python -m dsctl` process): the table, --json, exit statuses, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Median SLOs: 50 measured requests per probe (the sample-size rule's least), so each run takes seconds.
SMALL = ["--model", "r1-7b", "--chip", "910B3", "--prompt-tokens", "uniform:64:512",
         "--output-tokens", "uniform:16:64", "--max-model-len", "4096", "--param", "kv_sparse_threshold=0"]


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"COLUMNS": "250", "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path / "state")}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "dsctl", "tune", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_simulate_prints_the_ranked_table_progress_and_the_artifacts(tmp_path):
    # --window 60: the plumbing, not the figures (the default 300-s window is the bench's and docs/tune.md's)
    result = run_cli(tmp_path, "--simulate", *SMALL, "--slo", "ttft:median=2s", "--budget", "3", "--window", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dsctl tune --simulate: r1-7b on 910B3 (lab-engine, space fixed-batch), 3 evaluated" in out
    for column in ("rank", "parameters", "sustained req/s", "per NPU", "window s", "samples", "SLO statistics",
                   "status"):
        assert column in out
    assert "│ 1    │" in out and "feasible" in out and "ttft:p50 " in out and "capacity " in out
    capacity = next(line for line in out.splitlines() if line.startswith("capacity: trial "))
    assert " sustains " in capacity and "per NPU" in capacity
    best = next(line for line in out.splitlines() if line.startswith("best: trial "))
    assert "stream_num=" in best and "max_num_seqs=" in best
    trials = Path(next(line for line in out.splitlines() if line.startswith("trials: "))[8:])
    plot = Path(next(line for line in out.splitlines() if line.startswith("Pareto plot: "))[13:])
    assert trials.parent == plot.parent and trials.parent.parent == tmp_path / "state" / "dsctl" / "runs"
    assert len(trials.read_text().splitlines()) >= 3 and plot.stat().st_size > 0
    assert "trial 0: " in result.stderr and "3/3 evaluated" in result.stderr and "best so far" in result.stderr


def test_json_envelope_and_exit_6_naming_the_closest(tmp_path):
    result = run_cli(tmp_path, "--simulate", *SMALL, "--screen", "roofline", "--slo", "ttft:median=300ms",
                     "--rate", "40", "--budget", "3", "--json")
    assert result.returncode == 6, result.stderr
    envelope = json.loads(result.stdout)
    assert envelope["command"] == ["tune"] and envelope["exit_code"] == 6 and envelope["status"] == "partial"
    data = envelope["data"]
    assert data["best"] is None and data["counts"]["evaluated"] == 3 and data["rate"] == 40.0
    closest = data["closest"]
    (error,) = envelope["errors"]
    assert error.startswith(f"no configuration met the SLO; closest: trial {closest['number']} (")
    assert "binding ttft:p50" in error and data["objective"] == "goodput"  # --rate: goodput at that load
    assert Path(data["trials_path"]).is_file() and Path(data["plot_path"]).is_file()


def test_resume_through_the_cli(tmp_path):
    first = run_cli(tmp_path, "--simulate", *SMALL, "--screen", "roofline", "--slo", "ttft:median=2s", "--budget", "2",
                    "--json", "--window", "60")
    assert first.returncode == 0, first.stderr
    run_dir = json.loads(first.stdout)["data"]["run_dir"]
    again = run_cli(tmp_path, "--simulate", *SMALL, "--screen", "roofline", "--slo", "ttft:median=2s", "--budget", "3",
                    "--json", "--window", "60", "--resume", run_dir)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)["data"]
    assert data["run_dir"] == run_dir and data["counts"]["evaluated"] == 3
    assert again.stderr.count(" evaluated, ") == 1 + (data["counts"]["duplicate"] or 0) + sum(
        data["counts"][k] for k in ("screened", "invalid"))


def test_refusals_are_one_line_with_their_exit_status(tmp_path):
    live = run_cli(tmp_path, "--model", "r1-7b", "--slo", "ttft=200ms")
    assert live.returncode == 2 and live.stdout == ""
    assert live.stderr.splitlines() == ["dsctl: error: give the INVENTORY whose service to tune, or --simulate "
                                        "--model M for a what-if study"]
    impossible = run_cli(tmp_path, "--simulate", "--model", "deepseek-v3", "--chip", "910B3", "--slo", "ttft=200ms",
                         "--prompt-tokens", "131072", "--npus", "16")
    assert impossible.returncode == 6 and impossible.stdout == ""
    (line,) = impossible.stderr.splitlines()
    assert line.startswith("dsctl: error: no configuration of deepseek-v3 on 16 x 910B3 can meet ttft:p99=200ms")
    assert "needs at least 10.3 s" in line
    assert not (tmp_path / "state" / "dsctl" / "runs").exists()
    bad = run_cli(tmp_path, "--simulate", "--model", "r1-7b", "--slo", "ttft=2s", "--param", "max_num_seqs=2:16")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == ["dsctl: error: --param 'max_num_seqs=2:16': max_num_seqs follows batch_size x "
                                       "stream_num in space fixed-batch; set batch_size or stream_num instead"]
    missing = run_cli(tmp_path, "--simulate", "--model", "r1-7b")
    assert missing.returncode == 2 and "--slo is required" in missing.stderr
    endless = run_cli(tmp_path, "--simulate", "--model", "r1-7b", "--slo", "ttft=2s", "--window", "7200")
    assert endless.returncode == 2 and endless.stderr.splitlines() == [
        "dsctl: error: --window must be in (0, 3600] s, got 7200"]


def fleet_inventory(tmp_path: Path, model: str, npus: int, **service) -> Path:
    """An inventory of one host that is never contacted: what tune refuses, it refuses before any restart."""
    entry = {"name": "chat", "engine": "vllm-ascend", "model": model, "npus_per_instance": npus, "instances": 1,
             "allow_unauthenticated": True, **service}
    inventory = {"all": {"children": {"npu_nodes": {"hosts": {"h1": {"ansible_host": "192.0.2.10"}}, "vars": {
        "dsctl_npu_count": npus, "dsctl_service_manager": "supervisor", "dsctl_package_source": "/srv/packages",
        "dsctl_services": [entry]}}}}}
    path = tmp_path / "inventory.yml"
    path.write_text(json.dumps(inventory))
    return path


def test_live_refusals_come_before_any_host_is_contacted(tmp_path):
    inventory = fleet_inventory(tmp_path, "/models/DeepSeek-V3", 16)
    impossible = run_cli(tmp_path, str(inventory), "--slo", "ttft=200ms", "--prompt-tokens", "131072")
    assert impossible.returncode == 6 and impossible.stdout == "", impossible.stderr
    (line,) = impossible.stderr.splitlines()
    assert line.startswith("dsctl: error: no configuration of deepseek-v3 on 16 x 910B3 can meet ttft:p99=200ms "
                           "for 131072-token prompts: roofline:")
    assert "needs at least 10.3 s" in line
    assert not (tmp_path / "state" / "dsctl" / "runs").exists()  # no run directory, no playbook, no restart
    inventory = fleet_inventory(tmp_path, "/models/DeepSeek-R1-Distill-Qwen-7B", 4)
    for args, words in (
            (["--service", "chta"], "--service chta: no such service in dsctl_services (known: chat)"),
            (["--param", "max_num_seqz=8:64"], "max_num_seqz"),
            (["--model", "r1-7b"], "--model, --npus and --max-model-len are --simulate's"),
            (["--slots", "0"], "--slots must be at least 1, got 0"),
            (["--budget", "0"], "--budget must be in 1..200 restarts, got 0"),
            (["--window", "0"], "--window must be in (0, 3600] s, got 0")):
        bad = run_cli(tmp_path, str(inventory), "--slo", "ttft=2s", *args)
        assert bad.returncode == 2 and bad.stdout == "", bad.stderr
        (line,) = bad.stderr.splitlines()
        assert words in line, line
    with_inventory = run_cli(tmp_path, str(inventory), "--simulate", "--model", "r1-7b", "--slo", "ttft=2s")
    assert with_inventory.returncode == 2 and "--simulate reads no inventory" in with_inventory.stderr


def test_an_itl_only_slo_is_tuned_on_throughput_not_an_internal_error(tmp_path):
    """ITL has no per-request goodput form (vLLM's --goodput takes ttft, tpot, e2el): issue 21 found
    `--slo itl:p99=60ms` exiting 1 with "the metrics have no request_goodput"."""
    result = run_cli(tmp_path, "--simulate", *SMALL, "--slo", "itl:median=200ms", "--budget", "3", "--json",
                     "--window", "60")
    assert result.returncode in (0, 6), result.stderr
    assert "internal error" not in result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["best"] is None or data["best"]["objective"] > 0
    # --window is every probe's least measured window (first to last arrival: a little less than rate x window)
    windows = [t["capacity"]["window_s"] for t in data["trials"] if (t.get("capacity") or {}).get("window_s")]
    assert windows and all(54.0 <= w < 100.0 for w in windows), windows


def test_a_write_back_that_could_not_succeed_is_refused_before_any_restart(tmp_path):
    """--write-back is checked in the plan: a templated params (which the write would replace with the winner's
    keys alone) is one line, exit 2, before a run directory or a playbook."""
    inventory = fleet_inventory(tmp_path, "/models/DeepSeek-R1-Distill-Qwen-7B", 4, params="{{ chat_params }}")
    data = json.loads(inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"]["chat_params"] = {"max_num_seqs": 64}
    inventory.write_text(json.dumps(data))
    refused = run_cli(tmp_path, str(inventory), "--slo", "ttft=2s", "--write-back")
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr.splitlines() == [
        f"dsctl: error: --write-back: {inventory}: the params of service 'chat' are a template "
        "({{ chat_params }}), which write-back would replace with the winner's keys alone; write the params out as "
        "a mapping, or tune without --write-back and write the winner by hand"]
    assert not (tmp_path / "state" / "dsctl" / "runs").exists()


def test_requests_below_the_percentiles_sample_rule_are_refused_in_one_line(tmp_path):
    """Issue 21: 24 requests cannot carry a p99 (its value is their maximum); the rule asks 1000 measured."""
    refused = run_cli(tmp_path, "--simulate", "--model", "r1-7b", "--slo", "ttft=200ms", "--requests", "24")
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    (line,) = refused.stderr.splitlines()
    assert "--requests 24: ttft:p99=200ms needs at least 1000 measured requests" in line
    both = run_cli(tmp_path, "--simulate", "--model", "r1-7b", "--slo", "ttft=200ms", "--objective", "capacity",
                   "--rate", "4")
    assert both.returncode == 2 and "--objective capacity searches the rate" in both.stderr


def test_nodes_refusals_are_one_line_exit_2_before_any_run(tmp_path):
    inventory = fleet_inventory(tmp_path, "/models/DeepSeek-R1-Distill-Qwen-7B", 4)
    for args, words in (
            (["--simulate", "--model", "deepseek-v3", "--nodes", "0"], "--nodes must be at least 1, got 0"),
            (["--simulate", "--model", "deepseek-v3", "--nodes", "3", "--npus", "16"],
             "--nodes 3: the instance's 16 NPUs do not split evenly over 3 hosts"),
            (["--simulate", "--model", "deepseek-v3", "--nodes", "2", "--npus-per-node", "16"],
             "--nodes 2: 16 NPUs per host, but a 910B3 host holds 8"),
            (["--simulate", "--model", "deepseek-v3", "--nodes", "2", "--engine", "lab-engine"],
             "--nodes 2: lab-engine has no data parallelism, so its instance cannot span hosts"),
            (["--simulate", "--model", "r1-7b", "--nodes", "2", "--param", "enable_expert_parallel=true"],
             "r1-7b is a dense model"),
            (["--simulate", "--model", "deepseek-v3", "--weights", "fp4"], "--weights: unknown format 'fp4'"),
            ([str(inventory), "--nodes", "2"], "--nodes 2: the live tune does not tune instances that span hosts "
                                               "yet")):
        bad = run_cli(tmp_path, *args, "--slo", "tpot=50ms")
        assert bad.returncode == 2 and bad.stdout == "", (args, bad.stderr)
        (line,) = bad.stderr.splitlines()
        assert line.startswith("dsctl: error: ") and words in line, line
    assert not (tmp_path / "state" / "dsctl" / "runs").exists()


def test_simulate_over_two_hosts_prints_the_best_layout(tmp_path):
    # DeepSeek-V2-Lite (MoE, 64 experts) over 2 hosts x 2 NPUs at a fixed load: one probe per candidate, seconds
    result = run_cli(tmp_path, "--simulate", "--model", "deepseek-v2-lite", "--nodes", "2", "--npus-per-node", "2",
                     "--slo", "tpot:median=100ms", "--rate", "2", "--budget", "3", "--prompt-tokens", "256",
                     "--output-tokens", "32", "--max-model-len", "4096", "--weights", "int8")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dsctl tune --simulate: deepseek-v2-lite on 4 x 910B3 over 2 hosts (vllm-ascend, space vllm-ascend, int8 " \
           "weights)" in out
    layout = next(line for line in out.splitlines() if line.startswith("layout: "))
    assert " over 2 hosts x 2 NPUs" in layout and ("TP 1 x DP 4 (2 per host)" in layout or
                                                   "TP 2 x DP 2 (1 per host)" in layout)
    best = next(line for line in out.splitlines() if line.startswith("best: trial "))
    assert "tensor_parallel_size=" in best and "data_parallel_size=" in best and "enable_expert_parallel=" in best
    assert "2 hosts x 2 910B3 (one instance of 4 NPUs)" in result.stderr
