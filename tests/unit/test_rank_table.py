"""The HCCL rank table of a multi-host instance: its shape, and the check of one read back
(dsctl.core.network.rank_table)."""

from __future__ import annotations

import copy
import json

import pytest

from dsctl.core.network.hccn_plan import plan_network
from dsctl.core.network.rank_table import (
    RankMember,
    RankTableError,
    build_rank_table,
    check_rank_table,
    expected_device_ips,
)
from dsctl.errors import ExitStatus

HOSTS = {"lab-01": "10.78.0.11", "lab-02": "10.78.0.12"}
NETWORK = plan_network({host: {"dsctl_npu_count": 8, "dsctl_npu_network": {"subnets": ["10.20.0.0/24"]}}
                        for host in HOSTS})
MEMBERS = [RankMember(host=host, server_id=ip, npus=tuple(range(8))) for host, ip in HOSTS.items()]


def table() -> dict:
    return build_rank_table(MEMBERS, NETWORK)


def refused(document, **kwargs) -> str:
    with pytest.raises(RankTableError) as raised:
        check_rank_table(document, **kwargs)
    assert raised.value.exit_status == ExitStatus.VALIDATION_FAILED
    message = str(raised.value)
    assert "\n" not in message and message.startswith("rank table: ")
    return message


def strings(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(key, str) and strings(item) for key, item in value.items())
    if isinstance(value, list):
        return all(strings(item) for item in value)
    return isinstance(value, str)


def test_two_hosts_of_eight_npus():
    document = table()
    # The CANN HCCL guide's A2 format, with MindIE's container_ip (multi-node.md, "Rank table").
    assert set(document) == {"version", "status", "server_count", "server_list"}
    assert (document["version"], document["status"], document["server_count"]) == ("1.0", "completed", "2")
    assert strings(document)  # every value is a string
    servers = document["server_list"]
    assert [server["server_id"] for server in servers] == list(HOSTS.values())
    assert [server["container_ip"] for server in servers] == list(HOSTS.values())
    ranks = []
    for server, host in zip(servers, HOSTS, strict=True):
        assert set(server) == {"server_id", "container_ip", "device"}
        assert [device["device_id"] for device in server["device"]] == [str(npu) for npu in range(8)]
        for device in server["device"]:
            assert set(device) == {"device_id", "device_ip", "rank_id"}
            assert device["device_ip"] == NETWORK.host(host).npu(int(device["device_id"])).address
            ranks.append(int(device["rank_id"]))
    assert ranks == list(range(16))  # globally unique from 0, host order then device order
    assert json.loads(json.dumps(document)) == document


def test_read_back_it_holds():
    servers = check_rank_table(table(), plan=expected_device_ips(MEMBERS, NETWORK))
    assert [server.server_id for server in servers] == list(HOSTS.values())
    assert [device.rank_id for server in servers for device in server.devices] == list(range(16))


def test_container_ip_and_a_partial_host():
    members = [RankMember(host="lab-01", server_id="10.78.0.11", npus=(4, 5, 6, 7), container_ip="172.17.0.2"),
               RankMember(host="lab-02", server_id="10.78.0.12", npus=(4, 5, 6, 7))]
    document = build_rank_table(members, NETWORK)
    assert document["server_list"][0]["container_ip"] == "172.17.0.2"
    assert [device["device_id"] for device in document["server_list"][1]["device"]] == ["4", "5", "6", "7"]
    assert [device["rank_id"] for server in document["server_list"] for device in server["device"]] == \
        [str(rank) for rank in range(8)]
    check_rank_table(document, plan=expected_device_ips(members, NETWORK))


def test_a_host_without_network_plan():
    with pytest.raises(RankTableError) as raised:
        build_rank_table([*MEMBERS, RankMember(host="lab-09", server_id="10.78.0.19", npus=(0,))], NETWORK)
    assert "lab-09" in str(raised.value) and "plan the NPU network" in str(raised.value)


def edited(change) -> dict:
    document = copy.deepcopy(table())
    change(document)
    return document


def device(document, server: int, index: int) -> dict:
    return document["server_list"][server]["device"][index]


def test_duplicate_rank_ids():
    message = refused(edited(lambda d: device(d, 1, 2).update(rank_id="3")))
    assert message.startswith("rank table: server_list[1].device[2].rank_id: 3 is also the rank of "
                              "server_list[0].device[3]")


def test_a_gap_in_the_ranks():
    def gap(document):
        for index in range(8):
            device(document, 1, index)["rank_id"] = str(9 + index)  # 8 is missing
    assert "missing 8" in refused(edited(gap))


def test_interleaved_servers():
    def swap(document):
        device(document, 0, 7)["rank_id"], device(document, 1, 0)["rank_id"] = "8", "7"
    message = refused(edited(swap))
    assert "server_list[0].device[7].rank_id: 8, expected 7" in message and "not interleaved" in message


def test_device_ip_not_the_plans():
    message = refused(edited(lambda d: device(d, 1, 3).update(device_ip="10.20.0.200")),
                      plan=expected_device_ips(MEMBERS, NETWORK))
    planned = NETWORK.host("lab-02").npu(3).address
    assert message.startswith(f"rank table: server_list[1].device[3].device_ip: server 10.78.0.12 NPU 3 is listed at "
                              f"10.20.0.200, but the NPU network plan gives it {planned}")


def test_a_server_missing_from_the_table():
    message = refused(edited(lambda d: (d["server_list"].pop(), d.update(server_count="1"))),
                      plan=expected_device_ips(MEMBERS, NETWORK))
    assert "server 10.78.0.12 of the instance is missing" in message


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d.update(server_count=2), "server_count: expected a string"),
    (lambda d: device(d, 0, 0).update(rank_id=0), "server_list[0].device[0].rank_id: expected a string"),
    (lambda d: d.update(server_count="3"), "server_count: 3, but server_list has 2 server(s)"),
    (lambda d: d.update(version="1.2"), "version: expected '1.0'"),
    (lambda d: d.update(status="initializing"), "status: expected 'completed'"),
    (lambda d: device(d, 1, 1).update(device_ip=device(d, 0, 1)["device_ip"]), "every NPU has its own RoCE address"),
    (lambda d: device(d, 1, 1).update(device_id="0"), "NPU 0 is listed twice on server 10.78.0.12"),
    (lambda d: d["server_list"][1].update(server_id="10.78.0.11"), "server_list[1].server_id: 10.78.0.11 is also"),
    (lambda d: device(d, 0, 0).update(device_ip="not-an-ip"), "'not-an-ip' is not an IP address"),
    (lambda d: d.update(server_list=[]), "server_list: expected a non-empty list"),
])
def test_malformed_tables(change, words):
    assert words in refused(edited(change))


def test_not_an_object():
    assert "expected a JSON object" in refused(["server_list"])
