"""The NPU parameter plane of a 4-host lab, provisioned and checked (issue 22, item 1): `dsctl provision` sets every
NPU's address, gateway and detection peer from the plan dsctl derives for the whole fleet (the lab's inventory
carries it as a site's would), a rerun changes nothing; `dsctl check` finds every link UP and every NPU pair of the
hosts that share an instance reachable; a downed link, a partitioned host and a mistyped /etc/hccn.conf are each one
line on the host at fault, naming the NPUs and the multi-host instance that needs them; provision mends the file and
the plane checks clean again.

The hosts come up with the default stack's HDK and CANN already installed and no serving stack
(dsctl_vllm_ascend_version: none): only the NPU network and the env file are provisioned (--tags network,env), the
rest of provision is other stories'. The fleet declares one multi-host service, DeepSeek-V3 over 2 hosts per
instance (planned and checked, not deployed: deploy does not start multi-host instances yet), so lab-01/lab-02 and
lab-03/lab-04 ping each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dsctl.core.lab.plan import npu_address, npu_gateway, npu_netmask

from .conftest import bring_up, default_hdk_and_cann, dsctl, lab_capable

pytestmark = pytest.mark.lab

HOSTS = ("lab-01", "lab-02", "lab-03", "lab-04")
DEEPSEEK = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "profile": "deepseek-v3",
            "weights": "int8", "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
            "enable_expert_parallel": True, "socket_ifname": "eth0"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not lab_capable():
        pytest.skip("the lab needs Linux and root")
    lab = bring_up("--hosts", "4", *default_hdk_and_cann())
    try:
        inventory = yaml.safe_load(lab.inventory.read_text())
        group = inventory["all"]["children"]["npu_nodes"]["vars"]
        assert group["dsctl_npu_network"]["subnets"][3] == "10.83.0.0/24"  # what `lab up` wrote
        group.update({"dsctl_vllm_ascend_version": "none", "dsctl_services": [DEEPSEEK]})
        path = tmp_path_factory.mktemp("npu-network") / "hosts.yml"
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        yield lab, path
    finally:
        dsctl("lab", "down")


def provision(path: Path, *extra: str) -> dict[str, dict]:
    result = dsctl("provision", str(path), "--tags", "network,env", "--json", *extra, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return {row["host"]: row for row in json.loads(result.stdout)["data"]["hosts"]}


def check(path: Path) -> tuple[int, dict[str, dict]]:
    result = dsctl("check", str(path), "--json", check=False)
    return result.returncode, {row["host"]: row for row in json.loads(result.stdout)["data"]["hosts"]}


def network_lines(stdout: str, host: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"{host}: ") and " Fix: " in line]


def expected_conf(index: int) -> set[str]:
    return {f"{key}_{npu}={value}" for npu in range(8) for key, value in (
        ("address", npu_address(index, npu)), ("netmask", npu_netmask()), ("netdetect", npu_gateway(npu)),
        ("gateway", npu_gateway(npu)))}


def test_provision_sets_every_npu_from_the_fleets_plan_and_a_rerun_changes_nothing(fleet):
    lab, path = fleet
    first = provision(path)
    assert {host: row["status"] for host, row in first.items()} == dict.fromkeys(HOSTS, "changed")
    for index, host in enumerate(HOSTS, start=1):
        assert set(lab.sh_ok(host, "cat /etc/hccn.conf").splitlines()) == expected_conf(index)
    assert lab.sh_ok("lab-03", "hccn_tool -i 6 -ip -g; hccn_tool -i 6 -gateway -g; hccn_tool -i 6 -netdetect -g") == (
        f"ipaddr:{npu_address(3, 6)}\nnetmask:{npu_netmask()}\ndefault gateway:10.86.0.1, Iface:eth6\n"
        "netdetect address: 10.86.0.1\n")

    again = provision(path)
    assert {host: (row["status"], row["changed"]) for host, row in again.items()} == dict.fromkeys(HOSTS, ("ok", 0))


def test_check_finds_every_link_up_and_every_pair_of_an_instance_reachable(fleet):
    _, path = fleet
    code, rows = check(path)
    assert code == 0, rows
    for host, row in rows.items():
        plane = row["npu_network"]
        assert (row["status"], plane["links_up"], plane["healthy"], plane["addresses_match"],
                plane["conf_matches"]) == ("ok", 8, 8, 8, 8), host
        assert plane["pairs"] == plane["pairs_reachable"] == 8, host  # NPU i to NPU i of its instance's other host
    # lab-01 pings lab-02 and lab-03 pings lab-04 (each pair once), NPU i to NPU i, three packets each
    sent = {host: {(p["npu"], p["peer"], p["peer_npu"]) for p in row["npu_network"]["pings"]}
            for host, row in rows.items()}
    assert sent["lab-01"] | sent["lab-02"] == {(npu, "lab-02", npu) for npu in range(8)}
    assert sent["lab-03"] | sent["lab-04"] == {(npu, "lab-04", npu) for npu in range(8)}


def test_a_downed_link_a_partition_and_a_wrong_hccn_conf_are_each_named_on_their_host(fleet):
    _, path = fleet
    dsctl("lab", "fault", "lab-02", "link-down", "--npu", "3")
    dsctl("lab", "fault", "lab-03", "npu-plane-partition")
    dsctl("lab", "fault", "lab-04", "hccn-conf-wrong", "--npu", "5")
    result = dsctl("check", str(path), check=False)
    assert result.returncode == 3, result.stdout + result.stderr
    out = result.stdout

    assert network_lines(out, "lab-01") == []  # it cannot reach lab-02 NPU 3, and that is lab-02's line
    assert network_lines(out, "lab-02") == [
        "lab-02: error: The RoCE link of NPU 3 is DOWN (hccn_tool -i 3 -link -g, net health Fault); NPU 3 of lab-01 "
        "cannot reach it; instance deepseek-0 (lab-01, lab-02) needs it. Fix: Check the cable, optical module and "
        "switch port of NPU 3 (hccn_tool -i 3 -lldp -g names the port once the link is up), then run dsctl check "
        f"{path} again."]
    (cut_off,) = network_lines(out, "lab-03")
    assert cut_off.startswith(
        "lab-03: error: NPUs 0-7 net health is Receive timeout (hccn_tool -i 0 -net_health -g: the detection address "
        "10.80.0.1, ... does not answer) and NPUs 0-7 of lab-04 cannot reach them (hccn_tool -ping), links UP: "
        "lab-03's NPU ports are cut off the NPU plane; instance deepseek-1 (lab-03, lab-04) needs them. Fix: Check "
        "lab-03's switch ports")
    assert network_lines(out, "lab-04") == [
        "lab-04: error: /etc/hccn.conf differs from the plan: NPU 5 address_5: /etc/hccn.conf has 10.58.0.14, the "
        "plan sets 10.85.0.14; the driver applies the file at every boot, so NPU 5 would come up with it; instance "
        "deepseek-1 (lab-03, lab-04) needs it. Fix: Run dsctl provision "
        f"{path} --tags network: hccn_tool sets the plan's values and rewrites their lines (edit /etc/hccn.conf "
        "only through hccn_tool)."]
    assert "NPU parameter plane" in out


def test_provision_mends_hccn_conf_and_the_plane_checks_clean_once_the_faults_are_gone(fleet):
    lab, path = fleet
    dsctl("lab", "fault", "lab-02", "link-up", "--npu", "3")
    dsctl("lab", "fault", "lab-03", "npu-plane-heal")
    mended = provision(path, "--limit", "lab-04")
    assert (mended["lab-04"]["status"], mended["lab-04"]["changed"]) == ("changed", 1)
    assert set(lab.sh_ok("lab-04", "cat /etc/hccn.conf").splitlines()) == expected_conf(4)

    code, rows = check(path)
    assert code == 0, rows
    assert all(row["npu_network"]["pairs_reachable"] == 8 and row["npu_network"]["links_up"] == 8
               for row in rows.values())
