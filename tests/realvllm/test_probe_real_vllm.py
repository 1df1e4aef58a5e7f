"""dsctl probe against a real vLLM server (the CPU build of 0.32.0, the tiny model), and the emulated engine's
/metrics against real vLLM's.

One server for the module (its start is most of the cost).  The probe runs as users run it, `dsctl probe URL`, and
every figure that vLLM also counts is set against vLLM's own count: the server's usage per request and its
/metrics counters, read before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from dsctl.engine.metrics import EngineMetrics

# Families the emulated engine serves that vLLM 0.32 no longer does: older vLLM releases (the ones vllm-ascend's
# releases pin, up to 0.13 at least) still served them beside their replacements, and dsctl reads neither.
OLDER_VLLM_ONLY = {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"}


def metrics(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def total(families: dict, name: str) -> float:
    return sum(sample.value for sample in families[name].samples if sample.name == f"{name}_total")


def probe(url: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "dsctl", "probe", url, "--json", *args], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["data"]


def test_a_probe_without_a_tokenizer_sends_the_prompt_length_asked_in_the_servers_tokens(vllm_server):
    before = metrics(vllm_server.url)
    data = probe(vllm_server.url, "--rate", "8", "--requests", "40", "--warmup", "0", "--prompt-tokens", "128",
                 "--output-tokens", "16", "--seed", "7")
    after = metrics(vllm_server.url)
    lengths = data["prompt_lengths"]
    # the tiny model's BPE splits the probe's words: the server counted more than planned, the probe refitted
    assert lengths["counted_by"] == "server" and lengths["scale"] is not None and lengths["scale"] > 1.03, lengths
    assert lengths["server_mean"] > 128 * 1.03, lengths
    sent = lengths["sent"]
    assert sent["requests_counted"] == 40 and abs(sent["server_mean"] - 128) <= 0.03 * 128, sent
    assert sent["warning"] is None and not data["warnings"], data["warnings"]
    m = data["metrics"]
    assert (m["completed"], m["failed"]) == (40, 0)
    # every token figure is vLLM's own count: per request (usage) and in its /metrics counters
    assert m["output_tokens_counted_by"] == {"usage": 40, "tokenizer": 0, "chunks": 0}
    assert m["total_output_tokens"] == 40 * 16
    assert total(after, "vllm:generation_tokens") - total(before, "vllm:generation_tokens") == m["total_output_tokens"]
    assert total(after, "vllm:prompt_tokens") - total(before, "vllm:prompt_tokens") == m["total_input_tokens"]
    assert total(after, "vllm:request_success") - total(before, "vllm:request_success") == 40


def test_the_emulated_engines_metrics_are_real_vllms_families_types_labels_and_buckets(vllm_server):
    probe(vllm_server.url, "--rate", "inf", "--requests", "4", "--warmup", "0", "--prompt-tokens", "16",
          "--output-tokens", "4")  # every histogram has samples
    real = metrics(vllm_server.url)
    emulated = {f.name: f for f in text_string_to_metric_families(EngineMetrics("tiny", 2048).render())}
    older = {name for name in emulated if name.removesuffix("_created") in OLDER_VLLM_ONLY}
    missing = sorted(set(emulated) - set(real) - older)
    assert missing == [], missing
    for name, family in emulated.items():
        if name in older:
            continue
        twin = real[name]
        assert family.type == twin.type, name
        assert {k for s in family.samples for k in s.labels} <= {k for s in twin.samples for k in s.labels}, name
        if family.type == "histogram" and name not in ("vllm:request_prompt_tokens",
                                                       "vllm:request_generation_tokens",
                                                       "vllm:request_params_max_tokens"):
            bounds = {s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}
            assert bounds == {s.labels["le"] for s in twin.samples if s.name.endswith("_bucket")}, name
    # the token histograms' buckets follow max_model_len (1-2-5 steps up to it) in both
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert {s.labels["le"] for s in emulated[name].samples if s.name.endswith("_bucket")} == \
            {s.labels["le"] for s in real[name].samples if s.name.endswith("_bucket")}, name
