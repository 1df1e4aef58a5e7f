"""The NPU parameter plane of two lab hosts: hccn_tool over SSH sets each NPU's RoCE address, detection peer and
gateway, reads them back from the device and /etc/hccn.conf, and pings the other host's NPUs with real packets;
each NPU-plane fault makes its output fail; the driver re-applies hccn.conf at boot and after a snapshot restore;
`lab down` leaves nothing."""

from __future__ import annotations

import re

import pytest

from dsctl.core.lab.plan import npu_address, npu_gateway, npu_netmask
from dsctl.lab import hosts

from .conftest import Lab, bring_up, dsctl, lab_capable, lab_leftovers

pytestmark = pytest.mark.lab

NPUS = range(8)
MASK = npu_netmask()
NOTHING = {"netns": [], "links": [], "mounts": [], "processes": [], "state": []}
UP_OPTIONS = ("--hosts", "2", "--driver", "24.1.rc3", "--firmware", "7.5.0.1.129")
RTT = re.compile(r"recv seq=(\d),time=(\d+\.\d{6})ms")


@pytest.fixture(scope="module")
def lab():
    if not lab_capable():
        pytest.skip("the lab needs Linux and root")
    lab = bring_up(*UP_OPTIONS)
    yield lab
    dsctl("lab", "down")


def configure(index: int) -> str:
    """What a site's role runs on lab-0<index>: every NPU's address, detection peer and gateway."""
    lines = []
    for npu in NPUS:
        lines += [f"hccn_tool -i {npu} -ip -s address {npu_address(index, npu)} netmask {MASK}",
                  f"hccn_tool -i {npu} -netdetect -s address {npu_gateway(npu)}",
                  f"hccn_tool -i {npu} -gateway -s gateway {npu_gateway(npu)}"]
    return " && ".join(lines)


def expected_conf(index: int) -> str:
    return "".join(f"address_{npu}={npu_address(index, npu)}\nnetmask_{npu}={MASK}\n"
                   f"netdetect_{npu}={npu_gateway(npu)}\ngateway_{npu}={npu_gateway(npu)}\n" for npu in NPUS)


def ping(lab: Lab, host: str, npu: int, address: str):
    return lab.sh(host, f"hccn_tool -i {npu} -ping -g address {address}", timeout=60)


def assert_reachable(result, npu: int, address: str) -> None:
    assert result.exit_code == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == f"device {npu} PING {address}"
    assert [int(seq) for seq, _ in RTT.findall(result.stdout)] == [0, 1, 2]
    assert all(float(ms) < 100 for _, ms in RTT.findall(result.stdout))  # real round trips over the lab's switch
    assert lines[-1] == "3 packets transmitted, 3 received, 0.00% packet loss"


def assert_lost(result, npu: int, address: str) -> None:
    assert (result.exit_code, result.stderr) == (1, "Command execute failed!\n"), result
    assert result.stdout.splitlines() == [f"device {npu} PING {address}", "recv time out seq=0",
                                          "recv time out seq=1", "recv time out seq=2",
                                          "3 packets transmitted, 0 received, 100.00% packet loss"]


def test_hccn_tool_comes_with_the_driver_and_the_npus_start_with_no_address(lab: Lab):
    assert lab.sh_ok("lab-01", "readlink /usr/local/bin/hccn_tool") == "/usr/local/Ascend/driver/tools/hccn_tool\n"
    assert lab.sh_ok("lab-01", "stat -c %a /etc/hccn.conf && cat /etc/hccn.conf") == "644\n"
    unset = lab.sh("lab-01", "hccn_tool -i 0 -ip -g")
    assert (unset.exit_code, unset.stderr) == (13, "Get ipconf failed, because no ip was preset there!\n")
    assert lab.sh_ok("lab-01", "hccn_tool -i 7 -link -g") == "link status: UP\n"
    assert lab.sh_ok("lab-02", "hccn_tool -i 0 -lldp -g | grep Ifname") == "\tIfname: 200GE1/0/9\n"  # lab-02, NPU 0


def test_addresses_set_over_ssh_read_back_from_the_device_and_hccn_conf(lab: Lab):
    for index, host in ((1, "lab-01"), (2, "lab-02")):
        out = lab.sh_ok(host, configure(index))
        assert out == "Cmd executed successfully!\n" * 24
        assert lab.sh_ok(host, "cat /etc/hccn.conf") == expected_conf(index)
    read_back = lab.sh_ok("lab-02", "for i in 0 1 2 3 4 5 6 7; do hccn_tool -i $i -ip -g; done; "
                                    "hccn_tool -i 5 -netdetect -g; hccn_tool -i 5 -gateway -g")
    assert read_back == "".join(f"ipaddr:{npu_address(2, npu)}\nnetmask:{MASK}\n" for npu in NPUS) + (
        "netdetect address: 10.85.0.1\ndefault gateway:10.85.0.1, Iface:eth5\n")
    # The same settings again, in the same order (a role's second run that did not read back first), leave the
    # file byte for byte as it was: hccn_tool rewrites a key's line at the end, so only the order could change.
    digest = lab.sh_ok("lab-02", "sha256sum /etc/hccn.conf")
    lab.sh_ok("lab-02", configure(2))
    assert lab.sh_ok("lab-02", "sha256sum /etc/hccn.conf") == digest
    # Bad input fails as the real tool does and changes nothing.
    no_such_npu = lab.sh("lab-02", "hccn_tool -i 8 -ip -g")
    assert (no_such_npu.exit_code, no_such_npu.stderr) == (4, "Get invalid device id.\n")
    malformed = lab.sh("lab-02", f"hccn_tool -i 7 -ip -s address 10.87.0.256 netmask {MASK}")
    assert (malformed.exit_code, malformed.stderr) == (6, "The ip address you configured is invalid!\n")
    assert lab.sh_ok("lab-02", "sha256sum /etc/hccn.conf") == digest


def test_npus_reach_the_other_hosts_npus_with_real_packets(lab: Lab):
    for npu in (0, 7):
        assert_reachable(ping(lab, "lab-01", npu, npu_address(2, npu)), npu, npu_address(2, npu))
    # Another NPU subnet: through the NPU's gateway, the switch.
    assert_reachable(ping(lab, "lab-02", 0, npu_address(1, 5)), 0, npu_address(1, 5))
    assert lab.sh_ok("lab-01", "hccn_tool -i 4 -net_health -g") == "net health status: Success\n"
    # The NPUs' network is not the host's: the host's own sockets have no route to it.
    host_socket = lab.sh("lab-01", "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                                   f".connect((\"{npu_address(2, 0)}\", 9))'")
    assert host_socket.exit_code != 0 and "Network is unreachable" in host_socket.stderr
    # `lab up` with the same options changes nothing, the plane included.
    assert "already up" in dsctl("lab", "up", *UP_OPTIONS).stderr
    assert_reachable(ping(lab, "lab-01", 0, npu_address(2, 0)), 0, npu_address(2, 0))


def test_a_downed_link_reports_down_fails_health_and_stops_answering(lab: Lab):
    dsctl("lab", "fault", "lab-02", "link-down", "--npu", "3")
    try:
        assert lab.sh_ok("lab-02", "hccn_tool -i 3 -link -g; hccn_tool -i 3 -net_health -g") == (
            "link status: DOWN\nnet health status: Fault\n")
        assert_lost(ping(lab, "lab-01", 3, npu_address(2, 3)), 3, npu_address(2, 3))
        assert lab.sh_ok("lab-02", "hccn_tool -i 2 -link -g") == "link status: UP\n"
    finally:
        dsctl("lab", "fault", "lab-02", "link-up", "--npu", "3")
    assert_reachable(ping(lab, "lab-01", 3, npu_address(2, 3)), 3, npu_address(2, 3))


def test_a_partitioned_plane_loses_the_packets_while_every_link_stays_up(lab: Lab):
    dsctl("lab", "fault", "lab-02", "npu-plane-partition")
    try:
        assert lab.sh_ok("lab-02", "hccn_tool -i 0 -link -g") == "link status: UP\n"
        assert_lost(ping(lab, "lab-01", 0, npu_address(2, 0)), 0, npu_address(2, 0))
        assert lab.sh_ok("lab-01", "hccn_tool -i 0 -net_health -g") == "net health status: Success\n"
    finally:
        dsctl("lab", "fault", "lab-02", "npu-plane-heal")
    assert_reachable(ping(lab, "lab-01", 0, npu_address(2, 0)), 0, npu_address(2, 0))


def test_a_mistyped_hccn_conf_takes_effect_at_boot_and_a_restore_brings_the_saved_addresses_back(lab: Lab):
    dsctl("lab", "snapshot", "save", "plane")
    right, wrong = npu_address(2, 3), "10.38.0.12"
    dsctl("lab", "fault", "lab-02", "hccn-conf-wrong", "--npu", "3")
    assert f"address_3={wrong}\n" in lab.sh_ok("lab-02", "cat /etc/hccn.conf")
    assert lab.sh_ok("lab-02", "hccn_tool -i 3 -ip -g").startswith(f"ipaddr:{right}\n")  # until the driver reloads
    hosts.reboot(lab.paths, [lab.spec.members[1]])
    assert lab.sh_ok("lab-02", "hccn_tool -i 3 -ip -g").startswith(f"ipaddr:{wrong}\n")
    assert_lost(ping(lab, "lab-01", 3, right), 3, right)

    dsctl("lab", "snapshot", "restore", "plane")

    for index, host in ((1, "lab-01"), (2, "lab-02")):
        assert lab.sh_ok(host, "cat /etc/hccn.conf") == expected_conf(index)
        assert lab.sh_ok(host, "hccn_tool -i 3 -ip -g; hccn_tool -i 3 -gateway -g") == (
            f"ipaddr:{npu_address(index, 3)}\nnetmask:{MASK}\ndefault gateway:10.83.0.1, Iface:eth3\n")
    assert_reachable(ping(lab, "lab-01", 3, right), 3, right)


def test_lab_down_leaves_nothing_of_the_plane(lab: Lab):
    dsctl("lab", "down")
    assert lab_leftovers() == NOTHING
