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
