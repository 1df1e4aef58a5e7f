"""Issue 41, class 7 (service and network plans): a layout the engine refuses for a known model, an engine
parameter beyond the engine's or physics' bound, and an NPU subnet no other host can reach are refused before any
host is contacted, exit 2 or 3, one line naming the field (tests/cli/battery.py)."""

from __future__ import annotations

import pytest
import yaml

from dsctl.app import main
from dsctl.core.serving.service import registry

from .battery import REPO, assert_names, refusal, site

CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",  # 28 heads, 4 KV
        "npus_per_instance": 4, "instances": 2, "port": 8000, "allow_unauthenticated": True}
MINDIE = {"name": "mi", "engine": "mindie", "model": "/models/DeepSeek-R1-Distill-Qwen-7B", "npus_per_instance": 4,
          "port": 9000, "allow_unauthenticated": True}
DEEPSEEK = yaml.safe_load((REPO / "inventories" / "examples" / "deepseek-v3-2x2.yml").read_text())["dsctl_services"][0]

# (case, services, words the line names)
SERVICE_CASES = [
    ("3 NPUs per instance, 28 heads", [{**CHAT, "npus_per_instance": 3}],
     ("dsctl_services[0].npus_per_instance", "tensor_parallel_size", "1, 2, 4")),
    ("6 NPUs per instance", [{**CHAT, "npus_per_instance": 6, "instances": 1}], ("npus_per_instance", "1, 2, 4")),
    ("tensor_parallel_size 8", [{**CHAT, "npus_per_instance": 8, "instances": 1, "tensor_parallel_size": 8}],
     ("dsctl_services[0].tensor_parallel_size", "1, 2, 4")),
    ("MindIE, tp 7 splits heads but not 4 KV heads", [{**MINDIE, "npus_per_instance": 7}],
     ("npus_per_instance", "1, 2, 4")),
    ("expert parallel on a dense model", [{**CHAT, "params": {"enable_expert_parallel": True}}],
     ("params.enable_expert_parallel", "dense")),
    ("expert parallel on a dense model, lab-engine", [{**CHAT, "engine": "lab-engine",
                                                       "params": {"enable_expert_parallel": True}}],
     ("params.enable_expert_parallel", "dense")),
    ("expert parallel on a dense model, multi-host", [{**DEEPSEEK, "profile": "deepseek-r1-distill-qwen-7b"}],
     ("enable_expert_parallel", "dense")),
    ("max_num_seqs 10**12", [{**CHAT, "params": {"max_num_seqs": 10**12}}],
     ("params.max_num_seqs", "1048576")),
    ("max_model_len 10**9", [{**CHAT, "params": {"max_model_len": 10**9}}], ("params.max_model_len",)),
    ("max_num_batched_tokens 2**40", [{**CHAT, "params": {"max_num_batched_tokens": 2**40}}],
     ("params.max_num_batched_tokens",)),
    ("MindIE maxSeqLen 10**12", [{**MINDIE, "params": {"maxSeqLen": 10**12}}], ("params.maxSeqLen",)),
]


@pytest.mark.parametrize(("services", "words"), [case[1:] for case in SERVICE_CASES],
                         ids=[case[0] for case in SERVICE_CASES])
def test_a_service_plan_the_engine_refuses_is_refused_first(capsys, tmp_path, sentinel, services, words):
    inventory = site(tmp_path, sentinel, {"dsctl_services": services})
    assert_names(refusal(capsys, sentinel, ["deploy", inventory, "--render"]), *words)


NETWORK_CASES = [
    ("loopback subnet", {"subnets": ["127.0.0.0/24"]}, "dsctl_npu_network.subnets[0]", "loopback"),
    ("multicast subnet", {"subnets": ["224.0.0.0/24"]}, "dsctl_npu_network.subnets[0]", "multicast"),
    ("unspecified subnet", {"subnets": ["0.0.0.0/24"]}, "dsctl_npu_network.subnets[0]", "unspecified"),
    ("link-local subnet", {"subnets": ["10.20.0.0/24", "169.254.1.0/24"]}, "dsctl_npu_network.subnets[1]",
     "link-local"),
    ("reserved subnet", {"subnets": ["240.0.0.0/24"]}, "dsctl_npu_network.subnets[0]", "reserved"),
    ("a /4 spanning special blocks", {"subnets": ["0.0.0.0/4"]}, "dsctl_npu_network.subnets[0]", "/8"),
    ("netmask 0.0.0.0", {"netmask": "0.0.0.0"}, "dsctl_npu_network.netmask", "255.0.0.0"),
    ("loopback gateway", {"subnets": ["10.20.0.0/24"], "gateways": ["127.0.0.1"]}, "dsctl_npu_network.gateways[0]",
     "loopback"),
]


@pytest.mark.parametrize(("network", "field", "why"), [case[1:] for case in NETWORK_CASES],
                         ids=[case[0] for case in NETWORK_CASES])
def test_an_npu_network_no_host_reaches_is_refused(capsys, tmp_path, sentinel, network, field, why):
    ips = {f"atlas-a0{k}": {"dsctl_npu_ips": [f"10.20.0.{8 * k + npu}" for npu in range(8)]} for k in (1, 2)}
    inventory = site(tmp_path, sentinel, {"dsctl_npu_network": network},
                     host_vars=ips if "netmask" in network else None)
    assert_names(refusal(capsys, sentinel, ["provision", inventory, "--check"]), field, why)


def test_every_integer_engine_parameter_has_a_finite_upper_bound():
    unbounded = [f"{engine}: {name}" for engine, spec in registry().items() for name, entry in spec["params"].items()
                 if entry["type"] == "int" and "max" not in entry and "choices" not in entry]
    assert unbounded == []


def test_valid_plans_still_pass(capsys, tmp_path, sentinel):
    # TP 2 and 4 split 28 heads and 4 KV heads; a model dsctl has no profile for is not second-guessed.
    services = [{**CHAT, "npus_per_instance": 2, "instances": 2, "params": {"max_num_seqs": 1024}},
                {**CHAT, "name": "other", "model": "/models/unknown-model", "npus_per_instance": 3, "instances": 1,
                 "port": 9000}]
    inventory = site(tmp_path, sentinel, {"dsctl_services": services,
                                          "dsctl_npu_network": {"subnets": ["10.20.0.0/24", "192.168.8.0/24"]}})
    assert main(["deploy", str(inventory), "--render"]) == 0, capsys.readouterr().err
    assert sentinel.connections == 0
