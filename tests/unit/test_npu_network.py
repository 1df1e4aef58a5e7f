"""The NPU parameter plane, provisioned and checked, without a lab: hccn_tool's answers parsed, the role's changes
(only what differs, in an order the tool accepts, put back on failure), the pings a check sends and its one-line
findings (dsctl.core.network.hccn_state, dsctl.core.network.npu_check).

The answers come from the emulated hccn_tool (dsctl.emu.hccn_tool) in a temporary root, so the parser reads the
output formats the emulation takes from the driver's source and the field transcripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.core.inventory import schema as inventory_schema
from dsctl.core.lab.plan import npu_address, npu_gateway, npu_netmask, npu_network_settings
from dsctl.core.network.hccn_plan import hccn_conf, plan_network
from dsctl.core.network.hccn_state import (
    CHECK_QUERIES,
    PROVISION_QUERIES,
    NetworkStateError,
    PingResult,
    parse_network,
    plan_changes,
    role_decision,
)
from dsctl.core.network.npu_check import InstanceUse, PeerPing, network_findings, ping_plan
from dsctl.emu import hwstate
from dsctl.emu.npu_net import LOST

from .test_emu_hccn_tool import Host

TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
QUERY_ARGS = {"ip": "-ip -g", "gateway": "-gateway -g", "netdetect": "-netdetect -g", "link": "-link -g",
              "net_health": "-net_health -g"}
LAB = npu_network_settings(8)
HOSTS = ["lab-01", "lab-02", "lab-03", "lab-04"]


def fleet_vars(count: int = 4, network: dict | None = None) -> dict[str, dict]:
    return {HOSTS[k]: {"dsctl_npu_count": 8, "dsctl_package_source": "/srv/packages",
                       "dsctl_npu_network": network or LAB} for k in range(count)}


PLAN = plan_network(fleet_vars())


def collect(host: Host, queries=PROVISION_QUERIES, pings: list[PeerPing] = ()) -> dict:
    """What playbooks/library/npu_network_facts.py returns, from the emulated tool (same argv, same raw shape)."""
    npus = {}
    for npu in range(8):
        answers = {}
        for query in queries:
            result = host.tool(f"-i {npu} {QUERY_ARGS[query]}")
            answers[query] = {"rc": result.rc, "stdout": result.out, "stderr": result.err}
        npus[str(npu)] = answers
    sent = []
    for ping in pings:
        result = host.tool(f"-i {ping.npu} -ping -g address {ping.address}")
        sent.append({"npu": ping.npu, "address": ping.address, "rc": result.rc, "stdout": result.out,
                     "stderr": result.err})
    return {"collector_version": 1, "tool": TOOL, "conf": host.conf(), "npus": npus, "pings": sent}


def apply(host: Host, changes: list[dict]) -> None:
    for change in changes:
        assert change["argv"][0] == TOOL
        host.ok(" ".join(change["argv"][1:]))


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# --------------------------------------------------------------------------- the lab's plan in the inventory


def test_the_lab_inventory_plan_gives_each_npu_the_lab_address():
    settings = inventory_schema.validate_fleet(fleet_vars())
    for index, name in enumerate(HOSTS, start=1):
        planned = settings[name].npu_addresses
        assert [npu.address for npu in planned.npus] == [npu_address(index, npu) for npu in range(8)]
        assert all((npu.netmask, npu.gateway, npu.netdetect) == (npu_netmask(), npu_gateway(npu.npu),
                                                                  npu_gateway(npu.npu)) for npu in planned.npus)
    assert settings["lab-01"].network_plan is settings["lab-04"].network_plan


def test_a_limited_fleet_keeps_the_whole_fleets_addresses():
    every = fleet_vars()
    settings = inventory_schema.validate_fleet({"lab-03": every["lab-03"]}, fleet=every)
    assert settings["lab-03"].npu_addresses.npu(0).address == npu_address(3, 0)
    assert [host.host for host in settings["lab-03"].network_plan.hosts] == HOSTS


@pytest.mark.parametrize(("change", "status", "words"), [
    ({"lab-02": {"dsctl_npu_ips": [npu_address(1, npu) for npu in range(8)],
                 "dsctl_npu_network": {"netmask": "255.255.255.0"}}}, 3, "is also NPU 0 of lab-01"),
    ({"lab-03": {"dsctl_npu_network": {**LAB, "subnets": ["10.90.0.0/24", *LAB["subnets"][1:]],
                                       "gateways": ["10.90.0.1", *LAB["gateways"][1:]]}}}, 3,
     "NPU 0 of every server goes in the same subnet"),
    ({"lab-04": {"dsctl_npu_host_index": "two"}}, 2, "dsctl_npu_host_index: expected an integer 0..4095"),
    ({"lab-02": {"dsctl_npu_ips": [f"192.168.{npu}.12" for npu in range(8)],
                 "dsctl_npu_network": {"netmask": "255.255.255.0"}}}, 3, "which hccn_tool refuses for a RoCE port"),
    ({"lab-01": {"dsctl_npu_netwrok": LAB}}, 2, "did you mean dsctl_npu_network?"),
])
def test_an_inconsistent_plan_is_refused_in_one_line_before_anything(change, status, words):
    hosts = fleet_vars()
    for name, values in change.items():
        hosts[name] = {**hosts[name], **values}
    with pytest.raises(inventory_schema.InventoryError) as refused:
        inventory_schema.validate_fleet(hosts)
    assert refused.value.exit_status == status
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("inventory: host")


DEEPSEEK = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "profile": "deepseek-v3",
            "weights": "int8", "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
            "enable_expert_parallel": True, "socket_ifname": "eth0"}
CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/r1-7b", "npus_per_instance": 4, "instances": 2,
        "allow_unauthenticated": True}


def with_services(services: list[dict], count: int = 4) -> dict[str, dict]:
    return {name: {**values, "dsctl_vllm_ascend_version": "v0.13.0", "dsctl_services": services}
            for name, values in fleet_vars(count).items()}


def test_a_multi_host_service_is_cut_into_host_groups_the_check_pairs():
    settings = inventory_schema.validate_fleet(with_services([DEEPSEEK]))
    groups = settings["lab-03"].host_groups
    assert [(group.name, group.hosts, group.npus) for group in groups] == [
        ("deepseek-0", ("lab-01", "lab-02"), tuple(range(8))), ("deepseek-1", ("lab-03", "lab-04"), tuple(range(8)))]
    assert settings["lab-01"].services == ()  # not a single-host service
    assert [spec.name for spec in settings["lab-01"].multi_host_services] == ["deepseek"]


@pytest.mark.parametrize(("services", "count", "words"), [
    ([DEEPSEEK], 3, "3 host(s) (lab-01, lab-02, lab-03) do not divide into instances of 2 nodes"),
    ([CHAT, DEEPSEEK], 4, "lab-01's NPUs 0-7 overlap chat-0's"),
    ([{**DEEPSEEK, "nodes": 1}], 4, "nodes: expected an integer 2..64"),
])
def test_a_multi_host_service_the_fleet_cannot_hold_is_refused_in_one_line(services, count, words):
    with pytest.raises(inventory_schema.InventoryError) as refused:
        inventory_schema.validate_fleet(with_services(services, count))
    assert words in str(refused.value) and "\n" not in str(refused.value)


# --------------------------------------------------------------------------- what the role sets


def test_a_fresh_host_gets_every_setting_then_a_second_run_sets_nothing(host):
    planned = PLAN.host("lab-01")
    decision = role_decision(planned, parse_network(collect(host)), TOOL)
    assert decision["ready"] is True
    changes = decision["changes"]
    assert [c["setting"] for c in changes] == ["address"] * 8 + ["gateway"] * 8 + ["netdetect"] * 8
    assert changes[3]["argv"] == [TOOL, "-i", "3", "-ip", "-s", "address", "10.83.0.11", "netmask", "255.255.255.0"]
    assert changes[8]["argv"] == [TOOL, "-i", "0", "-gateway", "-s", "gateway", "10.80.0.1"]
    assert changes[16]["argv"] == [TOOL, "-i", "0", "-netdetect", "-s", "address", "10.80.0.1"]
    assert all(c["undo"] is None for c in changes)  # nothing to put back on a fresh NPU
    apply(host, changes)

    again = role_decision(planned, parse_network(collect(host)), TOOL)
    assert again == {"ready": True, "reason": "", "changes": []}
    # hccn_tool persisted exactly the plan (same keys, same values; its line order is its own)
    assert sorted(host.conf().splitlines()) == sorted(hccn_conf(planned).splitlines())


def test_a_wrong_hccn_conf_entry_is_set_again_and_only_that(host):
    planned = PLAN.host("lab-01")
    apply(host, role_decision(planned, parse_network(collect(host)), TOOL)["changes"])
    host.conf_path.write_text(host.conf().replace("address_3=10.83.0.11", "address_3=10.38.0.11"))

    changes = role_decision(planned, parse_network(collect(host)), TOOL)["changes"]
    assert [c["label"] for c in changes] == ["NPU 3 address 10.83.0.11/255.255.255.0 (was 10.83.0.11/255.255.255.0)"]
    apply(host, changes)
    assert "address_3=10.83.0.11" in host.conf() and "10.38.0.11" not in host.conf()
    assert role_decision(planned, parse_network(collect(host)), TOOL)["changes"] == []


def test_renumbering_goes_in_an_order_the_tool_accepts_and_a_swap_is_refused_first(host):
    # NPU 0 takes the address NPU 1 holds now: NPU 1 must move first (the tool refuses a conflict).
    host.ok("-i 0 -ip -s address 10.20.0.2 netmask 255.255.255.0")
    host.ok("-i 1 -ip -s address 10.20.0.3 netmask 255.255.255.0")
    moved = plan_network({"h": {"dsctl_npu_count": 2, "dsctl_npu_ips": ["10.20.0.3", "10.20.0.4"],
                                "dsctl_npu_network": {"netmask": "255.255.255.0"}}}).host("h")
    state = parse_network(collect(host))
    changes = [c.to_dict() for c in plan_changes(moved, state, TOOL)]
    assert [c["npu"] for c in changes] == [1, 0]
    apply(host, changes)
    assert host.ok("-i 0 -ip -g").startswith("ipaddr:10.20.0.3")

    swapped = plan_network({"h": {"dsctl_npu_count": 2, "dsctl_npu_ips": ["10.20.0.4", "10.20.0.3"],
                                  "dsctl_npu_network": {"netmask": "255.255.255.0"}}}).host("h")
    with pytest.raises(NetworkStateError) as refused:
        plan_changes(swapped, parse_network(collect(host)), TOOL)
    assert "would swap addresses" in str(refused.value) and "\n" not in str(refused.value)


def test_a_host_whose_driver_is_not_loaded_is_not_ready(host):
    host.boot(driver=None)  # installed, not rebooted: every -i command says "Get invalid device id."
    decision = role_decision(PLAN.host("lab-01"), parse_network(collect(host)), TOOL)
    assert decision["ready"] is False and "Get invalid device id." in decision["reason"]
    no_tool = role_decision(PLAN.host("lab-01"), parse_network({"tool": None, "npus": {}}), TOOL)
    assert no_tool["ready"] is False and "hccn_tool is not on the host" in no_tool["reason"]


# --------------------------------------------------------------------------- what a check pings


def test_each_pair_of_hosts_is_pinged_once_npu_i_to_npu_i_spread_over_the_hosts():
    pings = ping_plan(PLAN, HOSTS)
    pairs = {(source, ping.peer) for source, sent in pings.items() for ping in sent}
    assert {frozenset(pair) for pair in pairs} == {frozenset((a, b)) for a in HOSTS for b in HOSTS if a < b}
    assert len(pairs) == 6
    assert sorted(len({p.peer for p in sent}) for sent in pings.values()) == [1, 1, 2, 2]
    assert all(ping.npu == ping.peer_npu and ping.address == PLAN.host(ping.peer).npu(ping.npu).address
               for sent in pings.values() for ping in sent)
    assert sum(len(sent) for sent in pings.values()) == 6 * 8


def test_a_limited_check_pings_every_peer_itself_and_instances_narrow_the_pairs():
    alone = ping_plan(PLAN, ["lab-02"])
    assert sorted({ping.peer for ping in alone["lab-02"]}) == ["lab-01", "lab-03", "lab-04"]
    grouped = ping_plan(PLAN, HOSTS, [("lab-01", "lab-02"), ("lab-03", "lab-04")])
    assert {(source, ping.peer) for source, sent in grouped.items() for ping in sent} == {
        ("lab-01", "lab-02"), ("lab-03", "lab-04")}


# --------------------------------------------------------------------------- what a check says


class Fleet:
    """Four emulated hosts, provisioned to the plan, whose pings answer as the test says."""

    def __init__(self, root: Path):
        self.hosts = {}
        for name in HOSTS:
            (root / name).mkdir()
            self.hosts[name] = Host(root / name)
            planned = PLAN.host(name)
            apply(self.hosts[name], role_decision(planned, parse_network(collect(self.hosts[name])), TOOL)["changes"])
        self.pings = ping_plan(PLAN, HOSTS)
        self.lost: set[tuple[str, int]] = set()  # NPUs whose packets go nowhere

    def echo_for(self, name: str):
        owner = {npu.address: (host.host, npu.npu) for host in PLAN.hosts for npu in host.npus}

        def echo(source, destination, size, seq, timeout):
            ends = {owner.get(source), owner.get(destination)}
            return LOST if ends & self.lost else 0.1
        return echo

    def states(self) -> dict:
        found = {}
        for name, host in self.hosts.items():
            host.plane.echo = self.echo_for(name)
            found[name] = parse_network(collect(host, CHECK_QUERIES, self.pings.get(name, [])))
        return found

    def check(self, instances=()) -> dict:
        return network_findings(PLAN, self.states(), self.pings, instances=instances, inventory="inv.yml")


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def lines(reports: dict) -> dict[str, list[str]]:
    return {host: [f"{f.severity}: {f.sentence} Fix: {f.fix}" for f in report.findings]
            for host, report in reports.items() if report.findings}


def test_a_clean_plane_has_no_finding_and_every_pair_reachable(fleet):
    reports = fleet.check()
    assert lines(reports) == {}
    for report in reports.values():
        summary = report.summary
        counts = (summary["links_up"], summary["healthy"], summary["addresses_match"], summary["conf_matches"])
        assert counts == (8, 8, 8, 8)
        assert summary["pairs_reachable"] == summary["pairs"] > 0


def test_a_downed_link_is_one_line_on_its_host_naming_the_npu_its_peers_and_the_instances(fleet):
    hwstate.save_faults({"npu_link_down": [3]}, fleet.hosts["lab-02"].hw_dir)
    fleet.lost.add(("lab-02", 3))
    instances = [InstanceUse("deepseek-0", ("lab-01", "lab-02"), tuple(range(8))),
                 InstanceUse("deepseek-1", ("lab-03", "lab-04"), tuple(range(8)))]
    found = lines(fleet.check(instances))
    assert list(found) == ["lab-02"]
    assert found["lab-02"] == [
        "error: The RoCE link of NPU 3 is DOWN (hccn_tool -i 3 -link -g, net health Fault); NPU 3 of lab-01, lab-03 "
        "and lab-04 cannot reach it; instance deepseek-0 (lab-01, lab-02) needs it. Fix: Check the cable, optical "
        "module and switch port of NPU 3 (hccn_tool -i 3 -lldp -g names the port once the link is up), then run "
        "dsctl check inv.yml again."]


def test_a_partitioned_host_is_named_and_the_others_stay_clean(fleet):
    # Nothing of lab-03's NPUs gets through, its detection peer (the switch) included: net health Receive timeout.
    fleet.lost |= {("lab-03", npu) for npu in range(8)}
    found = lines(fleet.check())
    assert list(found) == ["lab-03"]
    (line,) = found["lab-03"]
    assert line.startswith("error: NPUs 0-7 net health is Receive timeout (hccn_tool -i 0 -net_health -g: the "
                           "detection address 10.80.0.1, ... does not answer) and NPUs 0-7 of lab-01, lab-02 and "
                           "lab-04 cannot reach them (hccn_tool -ping), links UP: lab-03's NPU ports are cut off")


def test_a_wrong_hccn_conf_entry_is_named_with_the_plans_value(fleet):
    conf = fleet.hosts["lab-04"].conf_path
    conf.write_text(conf.read_text().replace("address_5=10.85.0.14", "address_5=10.58.0.14"))
    found = lines(fleet.check())
    assert found == {"lab-04": [
        "error: /etc/hccn.conf differs from the plan: NPU 5 address_5: /etc/hccn.conf has 10.58.0.14, the plan sets "
        "10.85.0.14; the driver applies the file at every boot, so NPU 5 would come up with it. Fix: Run dsctl "
        "provision inv.yml --tags network: hccn_tool sets the plan's values and rewrites their lines (edit "
        "/etc/hccn.conf only through hccn_tool)."]}


def test_unexplained_loss_is_put_on_the_host_that_pinged(fleet):
    states = fleet.states()
    source, sent = next((name, sent) for name, sent in fleet.pings.items() if sent)
    lost = sent[0]
    failed = PingResult(lost.npu, lost.address, False, 3, 0, 100.0)
    states[source] = type(states[source])(tool=TOOL, npus=states[source].npus, conf=states[source].conf,
                                          pings=tuple(failed if (p.npu, p.address) == (lost.npu, lost.address) else p
                                                      for p in states[source].pings))
    found = lines(network_findings(PLAN, states, fleet.pings, inventory="inv.yml"))
    assert list(found) == [source]
    assert found[source][0].startswith(f"error: NPU {lost.npu} cannot reach NPU {lost.npu} of {lost.peer} "
                                       f"(hccn_tool -i {lost.npu} -ping -g address {lost.address}: 100% loss), though "
                                       "the links on both ends are UP.")


def test_unreadable_npus_are_info_while_a_reboot_is_pending(fleet):
    states = fleet.states()
    fleet.hosts["lab-01"].boot(driver=None)
    states["lab-01"] = parse_network(collect(fleet.hosts["lab-01"], CHECK_QUERIES))
    reports = network_findings(PLAN, states, {}, pending_reboot={"lab-01"})
    (finding,) = reports["lab-01"].findings
    assert (finding.severity, finding.code) == ("info", "npu-network-unread")
    assert "Get invalid device id." in finding.sentence and finding.fix.startswith("Reboot the host")


# --------------------------------------------------------------------------- the role's apply module


APPLY = Path(__file__).resolve().parents[2] / "roles" / "npu_network" / "library" / "npu_network_apply.py"
FAKE_TOOL = """#!{python}
import sys
open({log!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
if "192.168.1.5" in sys.argv:
    sys.stderr.write("The ip address configured is conflicted!\\n")
    sys.exit(7)
print("Cmd executed successfully!")
"""


def module_run(tmp_path: Path, args: dict) -> dict:
    """The module as Ansible runs it on a host: its arguments in a JSON file, its result on stdout."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    done = subprocess.run([sys.executable, str(APPLY), str(path)], capture_output=True, text=True, check=False)
    return json.loads(done.stdout)


def run_apply(tmp_path: Path, changes: list[dict], check_mode: bool = False) -> tuple[dict, list[str]]:
    log = tmp_path / "calls.log"
    tool = tmp_path / "hccn_tool"
    tool.write_text(FAKE_TOOL.format(python=sys.executable, log=str(log)))
    tool.chmod(0o755)
    result = module_run(tmp_path, {
        "hccn_tool": str(tool), "_ansible_check_mode": check_mode,
        "changes": [{**c, "argv": [str(tool), *c["argv"]], "undo": [str(tool), *c["undo"]] if c["undo"] else None}
                    for c in changes]})
    return result, log.read_text().splitlines() if log.exists() else []


def ip(npu: int, address: str) -> list[str]:
    return ["-i", str(npu), "-ip", "-s", "address", address, "netmask", "255.255.255.0"]


CHANGES = [
    {"label": "NPU 0 address 10.80.0.11/255.255.255.0 (was 10.80.0.9/255.255.255.0)", "argv": ip(0, "10.80.0.11"),
     "undo": ip(0, "10.80.0.9")},
    {"label": "NPU 1 address 10.81.0.11/255.255.255.0 (was none)", "argv": ip(1, "10.81.0.11"), "undo": None},
    {"label": "NPU 2 address 192.168.1.5/255.255.255.0 (was none)", "argv": ip(2, "192.168.1.5"), "undo": None},
    {"label": "NPU 3 address 10.83.0.11/255.255.255.0 (was none)", "argv": ip(3, "10.83.0.11"), "undo": None},
]


def test_apply_stops_at_the_first_failure_and_puts_back_what_it_set(tmp_path):
    result, calls = run_apply(tmp_path, CHANGES)
    assert calls == [" ".join(ip(0, "10.80.0.11")), " ".join(ip(1, "10.81.0.11")), " ".join(ip(2, "192.168.1.5")),
                     " ".join(ip(0, "10.80.0.9"))]  # NPU 3 never ran; NPU 0 went back, last change first
    assert result["failed"] is True
    assert result["msg"] == (
        "hccn_tool failed setting NPU 2 address 192.168.1.5/255.255.255.0 (was none) (rc 7: The ip address configured "
        "is conflicted!); put back: NPU 0 address 10.80.0.11/255.255.255.0 (was 10.80.0.9/255.255.255.0); left as set "
        "(the NPU had no earlier value; hccn_tool cannot unset one): NPU 1 address 10.81.0.11/255.255.255.0 (was "
        "none); fix the cause, then run dsctl provision again (it sets only what still differs)")


def test_apply_runs_only_hccn_tool_and_nothing_in_check_mode(tmp_path):
    result, calls = run_apply(tmp_path, CHANGES[:2], check_mode=True)
    assert (result["changed"], calls) == (True, [])
    ok, calls = run_apply(tmp_path, CHANGES[:2])
    assert (ok["changed"], ok["applied"], len(calls)) == (True, [c["label"] for c in CHANGES[:2]], 2)
    bad = [{**CHANGES[0], "argv": ["/bin/sh", "-c", "true"], "undo": None}]
    refused = module_run(tmp_path, {"hccn_tool": str(tmp_path / "hccn_tool"), "changes": bad})
    assert refused["failed"] and "must be an argument list running" in refused["msg"]


def test_a_multi_host_instance_over_two_chip_types_is_an_error_on_the_odd_host():
    from dsctl.core.network.npu_check import chip_findings

    use = InstanceUse("deepseek-0", ("lab-01", "lab-02"), tuple(range(8)))
    other = InstanceUse("deepseek-1", ("lab-03", "lab-04"), tuple(range(8)))
    chips = {"lab-01": ["910B3"] * 8, "lab-02": ["910B4"] * 8, "lab-03": ["910B3"] * 8, "lab-04": ["910B3"] * 8}
    found = chip_findings([use, other], chips, "hosts.yml")
    assert list(found) == ["lab-02"]
    (finding,) = found["lab-02"]
    assert (finding.severity, finding.code) == ("error", "instance-mixed-chips")
    assert finding.sentence.startswith("lab-02 has 910B4 NPUs, the head lab-01 of instance deepseek-0 (lab-01, lab-02) "
                                       "910B3")
    assert chip_findings([use], {"lab-01": ["910B3"] * 8}, "hosts.yml") == {}  # an unread host says nothing
