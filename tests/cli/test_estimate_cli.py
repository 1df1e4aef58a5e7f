"""`dsctl estimate` as users run it: the verdict lines, exit statuses, the --json envelope."""

from __future__ import annotations

import json
import subprocess
import sys

ACCEPTANCE = ["estimate", "--chip", "910B3", "--model", "deepseek-v3", "--prompt-tokens", "131072",
              "--slo", "ttft=200ms"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsctl", *args], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_v3_128k_prompt_on_one_910b3_is_infeasible_and_says_why():
    result = run_cli(*ACCEPTANCE)
    assert result.returncode == 6, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    ttft = [line for line in lines if line.startswith("ttft=200ms: ")]
    assert len(ttft) == 1, result.stdout
    assert ttft[0].startswith("ttft=200ms: infeasible: prefill of 131072 tokens")
    assert "needs at least 164.5 s on one 910B3 even at peak compute" in ttft[0]
    assert "would need at least 823 chips at peak" in ttft[0]
    memory = [line for line in lines if line.startswith("memory: ")]
    assert len(memory) == 1 and "infeasible" in memory[0] and "at least 30 chips" in memory[0]
    assert "Roofline estimate: deepseek-v3 on one 910B3" in result.stdout
    assert "TTFT, one request" in result.stdout


def test_json_envelope_carries_the_bounds():
    result = run_cli(*ACCEPTANCE, "--json")
    assert result.returncode == 6, result.stderr
    envelope = json.loads(result.stdout)
    assert envelope["command"] == ["estimate"]
    assert envelope["exit_code"] == 6 and envelope["status"] == "partial"
    data = envelope["data"]
    assert data["feasible"] is False and data["fits"] is False and data["min_chips_for_memory"] == 30
    assert (data["chip"], data["model"], data["prompt_tokens"], data["output_tokens"]) == (
        "910B3", "deepseek-v3", 131072, 256)
    ttft = next(v for v in data["verdicts"] if v["metric"] == "ttft")
    assert ttft["feasible"] is False and ttft["target_ms"] == 200
    assert abs(ttft["bound_ms"] - 164451.8) < 1
    assert ttft["min_chips_peak"] == 823 and ttft["min_chips_efficient"] > 823
    assert any(error.startswith("ttft=200ms: infeasible") for error in envelope["errors"])


def test_feasible_estimate_exits_zero():
    result = run_cli("estimate", "--chip", "910b3", "--model", "r1-7b", "--prompt-tokens", "1000",
                     "--output-tokens", "128", "--slo", "ttft:500 tpot:50", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    envelope = json.loads(result.stdout)
    assert envelope["status"] == "success" and envelope["data"]["feasible"] is True
    assert envelope["errors"] == []


def test_unknown_model_is_a_usage_error_on_one_line():
    result = run_cli("estimate", "--chip", "910B3", "--model", "llama-405b", "--prompt-tokens", "10")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("dsctl: error: unknown model 'llama-405b'; known models: ")
    assert "deepseek-v3" in lines[0] and "deepseek-r1-distill-qwen-7b" in lines[0]


def test_bad_slo_and_weights_are_usage_errors():
    bad_slo = run_cli("estimate", "--chip", "910B3", "--model", "v3", "--prompt-tokens", "10", "--slo", "ttft=fast")
    assert bad_slo.returncode == 2 and "--slo 'ttft=fast': expected metric[:stat]=value" in bad_slo.stderr
    bad_weights = run_cli("estimate", "--chip", "910B3", "--model", "v3", "--prompt-tokens", "10", "--weights", "fp4")
    assert bad_weights.returncode == 2 and "known: bf16, int8" in bad_weights.stderr
    missing = run_cli("estimate", "--chip", "910B3", "--model", "v3")
    assert missing.returncode == 2  # --prompt-tokens is required (Typer's own usage error)


def test_estimate_help():
    result = run_cli("estimate", "--help")
    assert result.returncode == 0
    assert "Usage: dsctl estimate" in result.stdout and "--prompt-tokens" in result.stdout


def test_two_hosts_print_the_cross_host_term():
    result = run_cli("estimate", "--chip", "910B3", "--model", "deepseek-v3", "--chips", "16", "--nodes", "2",
                     "--expert-parallel", "--weights", "int8", "--prompt-tokens", "1024", "--concurrency", "32")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    all_to_all = [line for line in lines if line.startswith("cross-host all-to-all: ")]
    assert len(all_to_all) == 1, result.stdout
    assert " ms per decode step (" in all_to_all[0] and "% of the " in all_to_all[0]
    assert any(line.startswith("cross-host total: ") and "single-request prefill" in line for line in lines)
    assert not any(line.startswith("cross-host all-reduce") for line in lines)  # TP 8 stays inside each host
    assert "16 x 910B3 (2 hosts x 8)" in result.stdout and "TP 8 x DP 2, experts over 16" in result.stdout
    one_host = run_cli("estimate", "--chip", "910B3", "--model", "deepseek-v3", "--chips", "16",
                       "--expert-parallel", "--weights", "int8", "--prompt-tokens", "1024", "--concurrency", "32")
    assert one_host.returncode == 0 and "cross-host" not in one_host.stdout
    assert "note: one host with 16 910B3 is hypothetical (a host holds 8); --nodes 2" in one_host.stdout


def test_json_carries_the_cross_host_term():
    result = run_cli("estimate", "--chip", "910B3", "--model", "v3", "--chips", "16", "--nodes", "2",
                     "--expert-parallel", "--weights", "int8", "--prompt-tokens", "1024", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert (data["nodes"], data["expert_parallel"], data["tensor_parallel"]) == (2, True, 8)
    assert data["cross_host_decode_s"] > 0 and data["cross_host_all_reduce_decode_s"] == 0


def test_bad_nodes_and_expert_parallel_for_a_dense_model_are_one_line_usage_errors():
    bad_nodes = run_cli("estimate", "--chip", "910B3", "--model", "v3", "--chips", "16", "--nodes", "3",
                        "--prompt-tokens", "10")
    assert bad_nodes.returncode == 2 and bad_nodes.stdout == ""
    assert bad_nodes.stderr.splitlines() == [
        "dsctl: error: --nodes 3: 16 chips do not split evenly over 3 hosts (chips per node = chips / nodes must be "
        "whole); use a --nodes that divides --chips 16"]
    dense = run_cli("estimate", "--chip", "910B3", "--model", "r1-7b", "--chips", "8", "--expert-parallel",
                    "--prompt-tokens", "10")
    assert dense.returncode == 2 and dense.stdout == ""
    assert len(dense.stderr.splitlines()) == 1
    assert dense.stderr.startswith("dsctl: error: --expert-parallel: deepseek-r1-distill-qwen-7b is a dense model")
