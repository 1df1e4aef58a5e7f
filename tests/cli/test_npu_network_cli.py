"""The NPU parameter plane through the verbs (the sample inventory's network.yml, ansible-playbook a stand-in): an
inconsistent plan stops provision and check before ansible-playbook starts, in one line with its exit code; provision
hands each host its planned NPUs; check hands each host its NPUs and the pings it sends, and turns what the hosts'
hccn_tool answered into one line per problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsctl.app import main
from dsctl.core.network.hccn_plan import hccn_conf, plan_network

from .test_verbs import REPORT, SAMPLE, ev, stats

NETWORK = {"subnets": ["10.20.0.0/24"], "gateways": ["10.20.0.1"], "detect": "gateway", "start": 2}
PLAN = plan_network({host: {"dsctl_npu_count": 8, "dsctl_npu_network": NETWORK} for host in ("atlas-a01", "atlas-a02")})


def extra_vars(fake_ansible) -> dict:
    argv = fake_ansible.argv()
    return json.loads(Path(argv[argv.index("-e") + 1].removeprefix("@")).read_text())


def site(tmp_path: Path, network: str) -> Path:
    inventory = tmp_path / "inventory"
    shutil.copytree(SAMPLE.parent, inventory)
    (inventory / "group_vars" / "npu_nodes" / "network.yml").write_text(network)
    return inventory / "hosts.yml"


@pytest.mark.parametrize(("network", "code", "line"), [
    # Two hosts in one /28 with 8 NPUs each from .2: the second host's block runs past the last address.
    ("dsctl_npu_network: {subnets: [10.20.0.0/28], gateways: [10.20.0.1]}\n", 3,
     "inventory: host atlas-a02: dsctl_npu_network.subnets[0]: 10.20.0.0/28 runs out of addresses at NPU 5 of this "
     "host (host slot 1, 8 addresses per host from host part 2: it needs host part 15, the last usable address is "
     "10.20.0.14); use a larger subnet, a lower start, or a lower dsctl_npu_host_index (2 more problems in the NPU "
     "network plan)"),
    ("dsctl_npu_network: {subnets: [10.20.0.0/24], gateways: [10.21.0.1]}\n", 3,
     "inventory: 2 hosts (atlas-a01, atlas-a02): dsctl_npu_network.gateways[0]: 10.21.0.1 is outside subnets[0] "
     "10.20.0.0/24; give an address inside it"),
    ("dsctl_npu_network: {subnets: [10.20.0.1/24]}\n", 2,
     "inventory: 2 hosts (atlas-a01, atlas-a02): dsctl_npu_network.subnets[0]: expected a network address (no host "
     "bits), got '10.20.0.1/24'; did you mean 10.20.0.0/24?"),
])
@pytest.mark.parametrize("verb", ["provision", "check"])
def test_an_inconsistent_plan_stops_the_verb_before_any_host(fake_ansible, capsys, tmp_path, network, code, line,
                                                            verb):
    fake_ansible(0, [])
    inventory = site(tmp_path, network)
    assert main([verb, str(inventory)]) == code
    assert capsys.readouterr().err == f"dsctl: error: {line}\n"
    assert not (tmp_path / "argv.json").exists()  # ansible-playbook never started


def test_a_limited_provision_hands_the_host_its_npus_from_the_whole_fleets_plan(fake_ansible, provisionable):
    fake_ansible(0, [{"event": "play_start", "play": "p"}, stats(**{"atlas-a02": {"ok": 1}})])
    assert main(["provision", str(provisionable), "--limit", "atlas-a02"]) == 0
    planned = extra_vars(fake_ansible)["dsctl_plan"]["hosts"]["atlas-a02"]["npu_network"]
    assert planned[0] == {"npu": 0, "address": "10.20.0.10", "netmask": "255.255.255.0", "netdetect": "10.20.0.1",
                          "gateway": "10.20.0.1"}  # atlas-a02 is the fleet's second host: .10-.17, --limit or not
    assert [npu["address"] for npu in planned] == [f"10.20.0.{10 + npu}" for npu in range(8)]


def answer(rc: int = 0, stdout: str = "", stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def raw(host: str, *, down: set[int] = frozenset(), pings: list[dict] = ()) -> dict:
    """What npu_network_facts would return on a host provisioned to the plan, with ``down`` NPUs' links DOWN."""
    npus = {}
    for npu in PLAN.host(host).npus:
        npus[str(npu.npu)] = {
            "link": answer(stdout=f"link status: {'DOWN' if npu.npu in down else 'UP'}\n"),
            "net_health": answer(stdout=f"net health status: {'Fault' if npu.npu in down else 'Success'}\n"),
            "netdetect": answer(stdout=f"netdetect address: {npu.netdetect}\n"),
            "ip": answer(stdout=f"ipaddr:{npu.address}\nnetmask:{npu.netmask}\n"),
        }
    return {"collector_version": 1, "tool": "/usr/local/Ascend/driver/tools/hccn_tool",
            "conf": hccn_conf(PLAN.host(host)), "npus": npus, "pings": list(pings)}


def ping(npu: int, address: str, ok: bool) -> dict:
    lines = [f"device {npu} PING {address}"]
    lines += ([f"recv seq={seq},time=0.114000ms" for seq in range(3)] if ok
              else [f"recv time out seq={seq}" for seq in range(3)])
    lines.append(f"3 packets transmitted, {3 if ok else 0} received, {0 if ok else 100:.2f}% packet loss")
    return {"npu": npu, "address": address, **answer(0 if ok else 1, "\n".join(lines) + "\n",
                                                         "" if ok else "Command execute failed!\n")}


def test_check_pings_each_pair_once_and_names_a_downed_link_on_its_host(fake_ansible, capsys):
    peer = PLAN.host("atlas-a02")
    sent = [ping(npu.npu, npu.address, npu.npu != 3) for npu in peer.npus]
    events = [{"event": "play_start", "play": "Audit every NPU server"}]
    for host, facts in (("atlas-a01", raw("atlas-a01", pings=sent)), ("atlas-a02", raw("atlas-a02", down={3}))):
        events += [ev("runner_ok", host, "Read the host", role="ascend_validate",
                      facts={"ascend_validate_report": REPORT}),
                   ev("runner_ok", host, "Read the NPU parameter plane", role=None,
                      facts={"ascend_npu_network": facts})]
    fake_ansible(0, [*events, stats(**{h: {"ok": 2} for h in ("atlas-a01", "atlas-a02")})])

    assert main(["check", str(SAMPLE)]) == 3
    out = capsys.readouterr().out
    handed = extra_vars(fake_ansible)["dsctl_check_npu_network"]
    assert handed["atlas-a01"] == {"npus": list(range(8)),
                                   "pings": [{"npu": npu.npu, "address": npu.address} for npu in peer.npus]}
    assert handed["atlas-a02"] == {"npus": list(range(8)), "pings": []}  # the pair is pinged once
    network = [line for line in out.splitlines() if ": error: " in line]
    assert network == [
        f"atlas-a02: error: The RoCE link of NPU 3 is DOWN (hccn_tool -i 3 -link -g, net health Fault); NPU 3 of "
        f"atlas-a01 cannot reach it. Fix: Check the cable, optical module and switch port of NPU 3 (hccn_tool -i 3 "
        f"-lldp -g names the port once the link is up), then run dsctl check {SAMPLE} again."]
    assert "NPU parameter plane (hccn_tool)" in out


def test_check_names_the_host_whose_chips_differ_from_its_multi_host_instances_head(fake_ansible, capsys, tmp_path):
    inventory = site(tmp_path, "dsctl_npu_network: " + json.dumps(NETWORK) + "\n")
    deepseek = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "weights": "int8",
                "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
                "enable_expert_parallel": True, "socket_ifname": "eth0", "allow_unauthenticated": True}
    (inventory.parent / "group_vars" / "npu_nodes" / "services.yml").write_text(
        "dsctl_services: " + json.dumps([deepseek]) + "\n")
    peer = PLAN.host("atlas-a02")
    sent = [ping(npu.npu, npu.address, True) for npu in peer.npus]
    events = [{"event": "play_start", "play": "Audit every NPU server"}]
    for host, chip, facts in (("atlas-a01", "910B3", raw("atlas-a01", pings=sent)),
                              ("atlas-a02", "910B4", raw("atlas-a02"))):
        report = {**REPORT, "npus": {"chips": [chip] * 8}}
        events += [ev("runner_ok", host, "Read the host", role="ascend_validate",
                      facts={"ascend_validate_report": report}),
                   ev("runner_ok", host, "Read the NPU parameter plane", role=None,
                      facts={"ascend_npu_network": facts})]
    fake_ansible(0, [*events, stats(**{h: {"ok": 2} for h in ("atlas-a01", "atlas-a02")})])

    assert main(["check", str(inventory)]) == 3
    errors = [line for line in capsys.readouterr().out.splitlines() if ": error: " in line]
    assert errors == [
        "atlas-a02: error: atlas-a02 has 910B4 NPUs, the head atlas-a01 of instance deepseek-0 (atlas-a01, atlas-a02) "
        "910B3; an instance runs on one chip type (its ranks split the model evenly). Fix: Group hosts of one chip in "
        f"the service's host_groups, then run dsctl check {inventory} again."]
