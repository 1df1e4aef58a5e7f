"""`dsctl deploy` of real vLLM (the CPU build of 0.32.0 serving the lab's tiny model) on a lab host, behind the gateway.

Until this story every instance deploy ever started was dsctl's own emulated engine.  Here the service runs from a
venv of its own (the service field ``venv``, as a site that builds its vLLM itself sets it; .ci/setup installs real
vLLM there with dsctl.lab.real_vllm), so the launch line deploy renders, its health gate (/health, /v1/models, a
first completion), its rollback and the gateway in front meet vLLM's own server.  One host (lab-01) is both the
fleet and the gateway; the engine's processes run as the service account on the CPU.  The deployed instance is also
where dsctl probe's figures are held against vLLM's own counts (its usage, /tokenize and /metrics) and the emulated
engine's /metrics against vLLM's: one real vLLM for all of it (a start is most of a real-vLLM test's cost).

Costs about 3-5 minutes: real vLLM starts in 21 s alone and several times that beside three busy test workers, and
the story starts it three times (deploy, the refused configuration, the rollback).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dsctl.engine.metrics import EngineMetrics
from dsctl.lab import real_vllm
from tests.realvllm.conftest import MODEL, VENV, require_real_vllm

from .conftest import address, bring_up, default_hdk_and_cann, dsctl, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

GATEWAY_PORT = 8080
START_S = 600  # the health gate's bound: real vLLM's start on a crowded two-core machine


def real_service(**params) -> dict:
    return real_vllm.service_entry("real", VENV, MODEL, health_timeout_s=START_S, **params)


def write_inventory(lab, directory: Path, service: dict) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    nodes = data["all"]["children"]["npu_nodes"]
    nodes["vars"]["dsctl_services"] = [service]
    data["all"]["children"]["gateway"] = {
        "hosts": {"lab-01": dict(nodes["hosts"]["lab-01"])},
        "vars": {"dsctl_gateway": {"services": [{"service": "real", "port": GATEWAY_PORT}],
                                   "drain_timeout_s": 120, "health_timeout_s": START_S}}}
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def real_lab(tmp_path_factory):
    require_real_vllm()
    # HDK and CANN as the lab installs them, and no `dsctl provision`: the service brings its own vLLM (`venv`), so
    # the serving stack provision would build is not what it runs (a provision was a tenth of this story's CPU).
    lab = bring_up("--hosts", "1", *default_hdk_and_cann())
    try:
        yield lab, tmp_path_factory.mktemp("real-vllm")
    finally:
        dsctl("lab", "down")


def deploy(path: Path) -> tuple[int, dict]:
    result = dsctl("deploy", str(path), "--json", check=False, timeout=3 * START_S)
    return result.returncode, json.loads(result.stdout)


def probe(url: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "dsctl", "probe", url, "--json", *args], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["data"]


# Families the emulated engine serves that vLLM 0.32 no longer does: older vLLM releases (the ones vllm-ascend's
# releases pin, up to 0.13 at least) still served them beside their replacements, and dsctl reads neither.
OLDER_VLLM_ONLY = {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"}


def metrics(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def total(families: dict, name: str) -> float:
    return sum(sample.value for sample in families[name].samples if sample.name == f"{name}_total")


def instance_url() -> str:
    """The instance itself, not the gateway: vLLM's own /tokenize and /metrics."""
    return f"http://{address('lab-01')}:8000"


def engine_pid(lab) -> str:
    return lab.sh_ok("lab-01", "supervisorctl pid dsctl-real-0").strip()


def test_real_vllm_is_deployed_gated_served_through_the_gateway_and_left_alone_when_unchanged(real_lab):
    lab, directory = real_lab
    path = write_inventory(lab, directory, real_service())
    code, report = deploy(path)
    assert code == 0, report["errors"]
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "restarted")]
    launch = lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh")
    assert f"exec {VENV}/bin/vllm serve {MODEL}" in launch and "--enforce-eager" in launch
    pid = engine_pid(lab)
    assert lab.sh_ok("lab-01", f"ps -o user= -p {pid}").strip() != "root"
    assert "vllm" in lab.sh_ok("lab-01", f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    # through the gateway, with the prompt lengths the server counts (its /tokenize, passed through nginx)
    data = probe(f"http://{address('lab-01')}:{GATEWAY_PORT}", "--rate", "4", "--requests", "24",
                 "--prompt-tokens", "64", "--output-tokens", "16")
    metrics = data["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (24, 0), data
    assert metrics["output_tokens_counted_by"]["usage"] == 24 and metrics["total_output_tokens"] == 24 * 16
    assert data["prompt_lengths"]["counted_by"] == "server" and data["prompt_lengths"]["sent"]["agrees"] is True

    code, report = deploy(path)
    assert code == 0, report["errors"]
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "unchanged")]
    assert engine_pid(lab) == pid


def test_a_probe_without_a_tokenizer_sends_the_prompt_length_asked_in_the_servers_tokens(real_lab):
    url = instance_url()
    before = metrics(url)
    data = probe(url, "--rate", "8", "--requests", "40", "--warmup", "0", "--prompt-tokens", "128",
                 "--output-tokens", "16", "--seed", "7")
    after = metrics(url)
    lengths = data["prompt_lengths"]
    # the tiny model's BPE splits the probe's words: the server counted more than planned, the probe refitted
    assert lengths["counted_by"] == "server" and lengths["scale"] is not None and lengths["scale"] > 1.03, lengths
    assert lengths["server_mean"] > 128 * 1.03, lengths
    sent = lengths["sent"]
    assert sent["requests_counted"] == 40 and abs(sent["server_mean"] - 128) <= 0.03 * 128, sent
    # no warning but, on a crowded machine, the load generator's own (CI: send lag p99 316 ms beside three workers)
    others = [w for w in data["warnings"] if not w.startswith("the load generator was the limit")]
    assert sent["warning"] is None and not others, data["warnings"]
    m = data["metrics"]
    assert (m["completed"], m["failed"]) == (40, 0)
    # every token figure is vLLM's own count: per request (usage) and in its /metrics counters
    assert m["output_tokens_counted_by"] == {"usage": 40, "tokenizer": 0, "chunks": 0}
    assert m["total_output_tokens"] == 40 * 16
    assert total(after, "vllm:generation_tokens") - total(before, "vllm:generation_tokens") == m["total_output_tokens"]
    assert total(after, "vllm:prompt_tokens") - total(before, "vllm:prompt_tokens") == m["total_input_tokens"]
    assert total(after, "vllm:request_success") - total(before, "vllm:request_success") == 40


def test_the_emulated_engines_metrics_are_real_vllms_families_types_labels_and_buckets(real_lab):
    url = instance_url()
    probe(url, "--rate", "inf", "--requests", "4", "--warmup", "0", "--prompt-tokens", "16",
          "--output-tokens", "4")  # every histogram has samples
    real = metrics(url)
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


def test_a_configuration_real_vllm_refuses_is_rolled_back_in_its_own_words(real_lab):
    lab, directory = real_lab
    before = lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh")
    # dsctl cannot know this checkpoint's positions (4096); vLLM reads its config.json and refuses at start
    code, report = deploy(write_inventory(lab, directory, real_service(max_model_len=65536)))
    assert code == 4, report
    assert [(r["instance"], r["status"]) for r in report["data"]["instances"]] == [("real-0", "rolled back")]
    errors = " ".join(report["errors"])
    assert "real-0: the new configuration failed" in errors and "rolled back" in errors
    assert "max_model_len" in errors and "65536" in errors, errors  # vLLM's own sentence, from its log
    assert lab.sh_ok("lab-01", "cat /etc/dsctl/services/real-0/launch.sh") == before
    data = probe(f"http://{address('lab-01')}:{GATEWAY_PORT}", "--rate", "inf", "--requests", "4",
                 "--prompt-tokens", "32", "--output-tokens", "8")
    assert (data["metrics"]["completed"], data["metrics"]["failed"]) == (4, 0)
