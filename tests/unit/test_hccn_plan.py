"""The NPU parameter-plane addressing plan: derived and explicit plans, /etc/hccn.conf, hccn_tool, refusals
(dsctl.core.network.hccn_plan)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from dsctl.core.network.hccn_plan import (
    NetworkPlanError,
    conf_differences,
    hccn_commands,
    hccn_conf,
    parse_hccn_conf,
    plan_network,
)
from dsctl.errors import ExitStatus

A2 = {"subnets": ["10.20.0.0/24"], "gateways": ["10.20.0.1"]}  # Atlas 800T A2: all 8 NPUs in one segment
# Atlas 800 training server (model 9000/9010): four segments, NPU i and NPU i+4 share one.
FOUR = {"subnets": ["192.168.100.0/24", "192.168.101.0/24", "192.168.102.0/24", "192.168.103.0/24"],
        "gateways": ["192.168.100.1", "192.168.101.1", "192.168.102.1", "192.168.103.1"]}


def fleet(count: int, network: dict, **extra) -> dict[str, dict]:
    return {f"lab-0{k + 1}": {"dsctl_npu_count": 8, "dsctl_npu_network": network, "ansible_host": f"10.78.0.{11 + k}",
                              **extra} for k in range(count)}


def explicit(addresses: list[str], **extra) -> dict:
    return {"dsctl_npu_count": len(addresses), "dsctl_npu_ips": addresses,
            "dsctl_npu_network": {"netmask": "255.255.255.0", "gateways": ["10.20.0.1"]}, **extra}


def refused(hosts: dict) -> NetworkPlanError:
    with pytest.raises(NetworkPlanError) as raised:
        plan_network(hosts)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("inventory: host ")
    return raised.value


def every_npu(plan):
    return [(host.host, npu) for host in plan.hosts for npu in host.npus]


# --------------------------------------------------------------------------- derived plans


@pytest.mark.parametrize("count", [2, 4])
def test_a2_plan_puts_every_npu_of_every_host_in_the_one_segment(count):
    plan = plan_network(fleet(count, A2))
    subnet = ipaddress.IPv4Network(A2["subnets"][0])
    assert [host.host for host in plan.hosts] == [f"lab-0{k + 1}" for k in range(count)]
    addresses = [npu.address for _, npu in every_npu(plan)]
    assert len(addresses) == 8 * count and len(set(addresses)) == len(addresses)
    for _, npu in every_npu(plan):
        address = ipaddress.IPv4Address(npu.address)
        assert address in subnet and address not in (subnet.network_address, subnet.broadcast_address)
        assert (npu.netmask, npu.subnet, npu.gateway, npu.netdetect) == (
            "255.255.255.0", str(subnet), "10.20.0.1", "10.20.0.1")
    # The first address is the guide's example's (10.20.0.2), and each host's block follows the previous one.
    assert plan.host("lab-01").npu(0).address == "10.20.0.2"
    ends = [max(ipaddress.IPv4Address(npu.address) for npu in host.npus) for host in plan.hosts]
    starts = [min(ipaddress.IPv4Address(npu.address) for npu in host.npus) for host in plan.hosts]
    assert all(start == end + 1 for end, start in zip(ends, starts[1:], strict=False))


def test_four_segment_plan_follows_the_vendor_rule():
    plan = plan_network(fleet(4, FOUR))
    for host in plan.hosts:
        # Within one server NICs 0-3 are in different subnets, and NPU i shares NPU i+4's.
        assert len({host.npu(i).subnet for i in range(4)}) == 4
        assert all(host.npu(i).subnet == host.npu(i + 4).subnet for i in range(4))
        for npu in host.npus:
            assert npu.subnet == FOUR["subnets"][npu.npu % 4]
            assert npu.gateway == FOUR["gateways"][npu.npu % 4] == npu.netdetect
    # NIC i of every server is in the subnet of NIC i of the others.
    for index in range(8):
        assert len({host.npu(index).subnet for host in plan.hosts}) == 1
    addresses = [npu.address for _, npu in every_npu(plan)]
    assert len(set(addresses)) == len(addresses) == 32


def test_host_index_keeps_addresses_when_a_host_is_added_before():
    before = plan_network({"lab-02": {**fleet(1, A2)["lab-01"], "dsctl_npu_host_index": 1}})
    after = plan_network({"lab-01": fleet(1, A2)["lab-01"],
                          "lab-02": {**fleet(1, A2)["lab-01"], "dsctl_npu_host_index": 1}})
    assert before.host("lab-02") == after.host("lab-02")
    assert not set(after.host("lab-01").addresses.values()) & set(after.host("lab-02").addresses.values())


def test_detect_none_and_no_gateway():
    plan = plan_network(fleet(2, {"subnets": ["10.20.0.0/24"], "detect": "none"}))
    assert all(npu.gateway is None and npu.netdetect is None for _, npu in every_npu(plan))
    assert all(len(command) and "-gateway" not in command and "-netdetect" not in command
               for host in plan.hosts for command in hccn_commands(host))
    assert not re.search(r"^(gateway|netdetect)_", hccn_conf(plan.hosts[0]), re.M)


def test_hosts_without_network_settings_stay_off_the_plan():
    hosts = {**fleet(2, A2), "cpu-01": {"dsctl_npu_count": 8, "ansible_host": "10.78.0.40"}}
    plan = plan_network(hosts)
    assert "cpu-01" not in plan and "lab-02" in plan
    with pytest.raises(KeyError):
        plan.host("cpu-01")


def test_to_dict_is_plain_data():
    plan = plan_network(fleet(2, A2))
    data = plan.to_dict()
    assert set(data) == {"lab-01", "lab-02"}
    assert data["lab-02"][3] == {"npu": 3, "address": plan.host("lab-02").npu(3).address, "netmask": "255.255.255.0",
                                 "netdetect": "10.20.0.1", "gateway": "10.20.0.1"}


# --------------------------------------------------------------------------- explicit plans (ascend-deployer style)


def test_explicit_lists_with_netmask_and_gateways():
    hosts = {"lab-01": explicit([f"10.20.0.{i}" for i in range(2, 10)]),
             "lab-02": explicit([f"10.20.0.{i}" for i in range(10, 18)],
                                dsctl_npu_detect_ips=[f"10.20.0.{i}" for i in range(2, 10)])}
    plan = plan_network(hosts)
    assert plan.host("lab-01").addresses == {i: f"10.20.0.{i + 2}" for i in range(8)}
    assert all(npu.gateway == "10.20.0.1" == npu.netdetect for npu in plan.host("lab-01").npus)
    # The second host detects the first one's NPUs (ascend-deployer's detectip per host).
    assert [npu.netdetect for npu in plan.host("lab-02").npus] == [f"10.20.0.{i}" for i in range(2, 10)]


def test_explicit_lists_checked_against_subnets():
    hosts = {"lab-01": {"dsctl_npu_count": 8, "dsctl_npu_network": FOUR,
                        "dsctl_npu_ips": [f"192.168.{100 + i % 4}.{10 + i}" for i in range(8)]}}
    plan = plan_network(hosts)
    assert [npu.subnet for npu in plan.host("lab-01").npus] == [FOUR["subnets"][i % 4] for i in range(8)]


# --------------------------------------------------------------------------- what the tools do with it


def test_hccn_conf_lines_as_hccn_tool_persists_them():
    plan = plan_network(fleet(2, A2))
    host = plan.host("lab-02")
    text = hccn_conf(host)
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == 4 * 8
    assert all(re.fullmatch(r"(address|netmask|netdetect|gateway)_[0-7]=\d+\.\d+\.\d+\.\d+", line) for line in lines)
    # NPU by NPU, in the order the real file holds them: address, netmask, netdetect, gateway.
    assert [line.split("=")[0] for line in lines[:4]] == ["address_0", "netmask_0", "netdetect_0", "gateway_0"]
    parsed = parse_hccn_conf(text)
    assert {npu: values["address"] for npu, values in parsed.items()} == host.addresses
    assert conf_differences(host, text) == []


def test_a_real_hccn_conf_parses_and_its_own_keys_are_left_alone():
    # The shape of a real file: hccn_tool writes send_arp_status_N and tls_enable_N besides the four dsctl manages.
    plan = plan_network(fleet(1, A2))
    host = plan.host("lab-01")
    real = "".join(f"{line}\nsend_arp_status_{line.split('_')[1].split('=')[0]}=1\n" if line.startswith("gateway")
                   else f"{line}\n" for line in hccn_conf(host).splitlines())
    assert parse_hccn_conf(real)[0]["send_arp_status"] == "1"
    assert conf_differences(host, real) == []


def test_conf_differences_name_the_npu_and_key():
    plan = plan_network(fleet(1, A2))
    host = plan.host("lab-01")
    wrong = hccn_conf(host).replace(f"address_3={host.npu(3).address}\n", "address_3=10.20.0.99\n")
    wrong = wrong.replace(f"gateway_5={host.npu(5).gateway}\n", "")
    differences = conf_differences(host, wrong)
    assert len(differences) == 2
    assert differences[0].startswith("NPU 3 address_3: ") and "10.20.0.99" in differences[0]
    assert differences[1].startswith("NPU 5 gateway_5: missing")


def test_hccn_commands_follow_the_toolbox_guide():
    plan = plan_network(fleet(1, A2))
    host = plan.host("lab-01")
    commands = hccn_commands(host)
    assert len(commands) == 3 * 8
    for npu in host.npus:
        mine = [command for command in commands if command[:3] == ["hccn_tool", "-i", str(npu.npu)]]
        assert mine == [
            ["hccn_tool", "-i", str(npu.npu), "-ip", "-s", "address", npu.address, "netmask", npu.netmask],
            ["hccn_tool", "-i", str(npu.npu), "-gateway", "-s", "gateway", npu.gateway],
            ["hccn_tool", "-i", str(npu.npu), "-netdetect", "-s", "address", npu.netdetect],
        ]
    assert hccn_commands(host, tool="/usr/local/Ascend/driver/tools/hccn_tool")[0][0].endswith("/hccn_tool")


# --------------------------------------------------------------------------- refusals


def test_duplicate_address_within_a_host():
    addresses = [f"10.20.0.{i}" for i in range(2, 10)]
    addresses[5] = addresses[0]
    problem = refused({"lab-01": explicit(addresses)})
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "host lab-01: dsctl_npu_ips[5]:" in str(problem)
    assert "also NPU 0 of this host" in str(problem) and "own address" in str(problem)


def test_duplicate_address_across_hosts():
    problem = refused({"lab-01": explicit([f"10.20.0.{i}" for i in range(2, 10)]),
                       "lab-02": explicit([f"10.20.0.{i}" for i in range(9, 17)])})
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert str(problem).startswith("inventory: host lab-02: dsctl_npu_ips[0]: NPU 0's address 10.20.0.9 is also "
                                   "NPU 7 of lab-01")


def test_two_derived_hosts_in_one_slot():
    hosts = fleet(2, A2)
    hosts["lab-02"]["dsctl_npu_host_index"] = 0
    problem = refused(hosts)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "host lab-02" in str(problem) and "NPU 0" in str(problem)
    assert "dsctl_npu_host_index" in str(problem) and "(7 more problems" in str(problem)


def test_npu_i_of_two_hosts_in_different_subnets():
    second = [f"10.20.0.{i}" for i in range(10, 18)]
    second[3] = "10.20.7.3"
    network = {"dsctl_npu_network": {"netmask": "255.255.255.0"}}
    problem = refused({"lab-01": explicit([f"10.20.0.{i}" for i in range(2, 10)], **network),
                       "lab-02": explicit(second, **network)})
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "host lab-02: dsctl_npu_ips[3]: NPU 3 is in 10.20.7.0/24, but NPU 3 of lab-01 is in 10.20.0.0/24" in \
        str(problem)


def test_address_outside_its_subnet():
    addresses = [f"192.168.{100 + i % 4}.{10 + i}" for i in range(8)]
    addresses[6] = "192.168.100.16"  # NPU 6 belongs in subnets[2]
    problem = refused({"lab-01": {"dsctl_npu_count": 8, "dsctl_npu_network": FOUR, "dsctl_npu_ips": addresses}})
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "dsctl_npu_ips[6]: NPU 6's address 192.168.100.16 is outside its subnet 192.168.102.0/24" in str(problem)


def test_gateway_outside_the_subnet():
    problem = refused(fleet(1, {"subnets": ["10.20.0.0/24"], "gateways": ["10.20.1.1"]}))
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "dsctl_npu_network.gateways[0]: 10.20.1.1 is outside subnets[0] 10.20.0.0/24" in str(problem)


def test_detection_peer_outside_the_subnet():
    hosts = fleet(1, A2, dsctl_npu_detect_ips=["10.20.0.1"] * 7 + ["10.30.0.1"])
    problem = refused(hosts)
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "dsctl_npu_detect_ips[7]: NPU 7's detection peer 10.30.0.1 is outside its subnet" in str(problem)


def test_npu_address_on_the_gateway():
    problem = refused(fleet(1, {**A2, "start": 1}))  # .1 is the gateway, and now NPU 0's address too
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "NPU 0's gateway 10.20.0.1 is the NPU's own address" in str(problem)


def test_list_length_not_the_npu_count():
    problem = refused({"lab-01": {**explicit([f"10.20.0.{i}" for i in range(2, 9)]), "dsctl_npu_count": 8}})
    assert problem.exit_status == ExitStatus.USAGE
    assert "host lab-01: dsctl_npu_ips: 7 address(es) for 8 NPUs (dsctl_npu_count)" in str(problem)


def test_derived_plan_runs_out_of_addresses():
    # .2 to .14 are 13 addresses: the first host takes 8, the second runs out at its sixth NPU.
    problem = refused(fleet(3, {"subnets": ["10.20.0.0/28"]}))
    assert problem.exit_status == ExitStatus.VALIDATION_FAILED
    assert "host lab-02: dsctl_npu_network.subnets[0]: 10.20.0.0/28 runs out of addresses at NPU 5" in str(problem)
    assert "larger subnet" in str(problem)


@pytest.mark.parametrize(("network", "extra", "words"), [
    ({"subnets": ["10.20.0.5/24"]}, {}, "dsctl_npu_network.subnets[0]: expected a network address (no host bits), "
                                        "got '10.20.0.5/24'; did you mean 10.20.0.0/24?"),
    ({"subnets": ["10.20.0.0"]}, {}, "dsctl_npu_network.subnets[0]: expected a CIDR subnet"),
    ({"subnets": ["10.20.0.0/24"], "gateway": "10.20.0.1"}, {}, "dsctl_npu_network.gateway: unknown setting"),
    ({"netmask": "255.255.255.0"}, {}, "a netmask alone derives no addresses"),
    ({"netmask": "255.0.255.0"}, {"dsctl_npu_ips": ["10.20.0.2"] * 8},
     "dsctl_npu_network.netmask: expected a contiguous IPv4 netmask"),
    ({"subnets": ["10.20.0.0/24"], "netmask": "255.255.255.0"}, {}, "dsctl_npu_network.netmask: the subnets carry"),
    ({"subnets": ["10.20.0.0/24"], "gateways": ["10.20.0.1", "10.20.0.254"]}, {},
     "dsctl_npu_network.gateways: 2 address(es) for 1 subnet(s)"),
    ({"subnets": ["10.20.0.0/24"], "detect": "sometimes"}, {}, "dsctl_npu_network.detect: expected gateway, none"),
    (A2, {"dsctl_npu_ips": ["10.20.0.300"] * 8}, "dsctl_npu_ips[0]: expected an IPv4 address such as 10.20.0.2, "
                                                  "got '10.20.0.300'"),
    (A2, {"dsctl_npu_host_index": "1"}, "dsctl_npu_host_index: expected an integer 0..4095, got '1'"),
])
def test_malformed_settings_are_usage_errors(network, extra, words):
    problem = refused(fleet(1, network, **extra))
    assert problem.exit_status == ExitStatus.USAGE
    assert str(problem).startswith("inventory: host lab-01: ")
    assert words in str(problem)


def test_addresses_without_a_netmask():
    problem = refused({"lab-01": {"dsctl_npu_count": 8, "dsctl_npu_ips": [f"10.20.0.{i}" for i in range(2, 10)]}})
    assert problem.exit_status == ExitStatus.USAGE
    assert "dsctl_npu_network: required with the host's NPU addresses" in str(problem)
