"""Pure lab planning: names, addresses, boards, and the errors bad options get."""

from __future__ import annotations

import pytest

from dsctl import data
from dsctl.core.lab.plan import board_state, plan_lab
from dsctl.errors import ExitStatus, UsageError
from dsctl.lab import preinstall

CHIPS = data.load("chips")


def plan(**overrides):
    options = {"hosts": 3, "npus": 8, "chip": "910B3", "chips": CHIPS["chips"]} | overrides
    return plan_lab(**options)


def test_hosts_get_sequential_names_addresses_and_namespaces():
    spec = plan(hosts=3)
    assert [(h.name, h.address, h.netns, h.veth) for h in spec.members] == [
        ("lab-01", "10.78.0.11", "dsctl-lab-01", "dlab1"),
        ("lab-02", "10.78.0.12", "dsctl-lab-02", "dlab2"),
        ("lab-03", "10.78.0.13", "dsctl-lab-03", "dlab3"),
    ]
    assert spec.gateway == "10.78.0.1" and spec.prefix_len == 24


def test_spec_round_trips_through_its_dict():
    spec = plan(hosts=2, driver="24.1.rc3", subnet="10.99.0.0/24")
    assert type(spec).from_dict(spec.to_dict()) == spec
    assert spec.same_shape(plan(hosts=2, driver="24.1.rc3", subnet="10.99.0.0/24"))
    assert not spec.same_shape(plan(hosts=2, subnet="10.99.0.0/24"))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hosts": 0}, "--hosts"),
        ({"hosts": 201}, "--hosts"),
        ({"npus": 0}, "--npus"),
        ({"chip": "910B9"}, "--chip"),
        ({"firmware": "7.5.0.1.129"}, "--firmware"),
        ({"subnet": "not-a-net"}, "--subnet"),
        ({"subnet": "10.0.0.0/28", "hosts": 8}, "--subnet"),
        ({"subnet": "10.80.0.0/24"}, "--subnet"),  # the NPU plane's
        ({"disk_gb": 0}, "--disk-gb"),
    ],
)
def test_bad_options_raise_a_usage_error_naming_the_option(overrides, field):
    with pytest.raises(UsageError) as caught:
        plan(**overrides)
    assert field in str(caught.value)
    assert caught.value.exit_status == ExitStatus.USAGE


def test_board_of_an_atlas_800t_a2_matches_the_public_sample():
    board = board_state("lab-01", 8, "910B3", CHIPS["chips"], CHIPS["bus_ids"])
    # Bus ids and idle HBM of vllm-project/vllm-ascend#6512.
    assert [n["bus_id"] for n in board["npus"]] == CHIPS["bus_ids"]
    assert {n["hbm_used_mb"] for n in board["npus"]} == {3408}
    assert board["hbm_total_mb"] == 65536 and board["pci_device_id"] == "0xD802"
    assert len({n["serial"] for n in board["npus"]}) == 8
    assert board == board_state("lab-01", 8, "910B3", CHIPS["chips"], CHIPS["bus_ids"])
    assert board["npus"][0]["serial"] != board_state("lab-02", 8, "910B3", CHIPS["chips"], [])["npus"][0]["serial"]


def test_more_npus_than_known_bus_ids_get_distinct_ids():
    board = board_state("lab-01", 16, "910B3", CHIPS["chips"], CHIPS["bus_ids"])
    assert len({n["bus_id"] for n in board["npus"]}) == 16


def test_preinstalled_hosts_run_kernels_and_nnal_with_the_toolkit_env_and_driver_only_has_no_firmware():
    steps = preinstall.plan(plan(hosts=1, driver="24.1.rc3", cann="8.0.0"), arch="x86_64")
    by_part = {step.component: step.argv for step in steps}
    assert list(by_part) == ["driver", "toolkit", "kernels", "nnal"]  # --driver alone: a driver-only host
    assert by_part["driver"][:2] == ["bash", "/tmp/Ascend-hdk-910b-npu-driver_24.1.rc3_linux-x86_64.run"]
    for part in ("kernels", "nnal"):
        shell, flag, script, env, *run = by_part[part]
        assert (shell, flag, env) == ("bash", "-c", "/usr/local/Ascend/ascend-toolkit/set_env.sh")
        assert script == '. "$0"; exec "$@"' and run[0] == "bash" and "--install" in run


def test_a_named_lab_gets_its_own_bridge_namespaces_and_cables():
    spec = plan(hosts=2, name="ci", subnet="10.78.3.0/24")
    assert spec.bridge == "dsctl-ci0"
    assert [(h.name, h.address, h.netns, h.veth) for h in spec.members] == [
        ("lab-01", "10.78.3.11", "dsctl-ci-01", "dci1"),
        ("lab-02", "10.78.3.12", "dsctl-ci-02", "dci2"),
    ]
    # The default lab keeps today's names.
    assert plan(hosts=1).bridge == "dsctl-lab0" and plan(hosts=1).name == "lab"


@pytest.mark.parametrize("name", ["", "Lab", "lab1", "1lab", "a-b", "toolongname", "a b"])
def test_a_lab_name_that_would_break_interface_names_is_refused(name):
    with pytest.raises(UsageError, match="--name"):
        plan(name=name)


def test_an_old_lab_json_without_a_name_is_the_default_lab():
    data = plan(hosts=1).to_dict()
    del data["name"]
    assert type(plan(hosts=1)).from_dict(data).name == "lab"


def test_named_labs_take_the_first_free_subnet_after_the_default_labs():
    from dsctl.core.lab.plan import free_subnet

    assert free_subnet([]) == "10.78.1.0/24"
    assert free_subnet(["10.78.0.1/24", "10.78.1.1/24", "192.168.1.5/24"]) == "10.78.2.0/24"
    assert free_subnet(["10.78.0.0/23"]) == "10.78.2.0/24"  # overlap, not only equality
    with pytest.raises(UsageError, match="--subnet"):
        free_subnet(["10.78.0.0/16"])


def test_the_npu_plane_has_a_switch_namespace_a_subnet_per_npu_and_a_port_per_npu():
    from dsctl.core.lab.plan import npu_address, npu_gateway, npu_plane_cabling, npu_plane_netns, npu_subnet
    from dsctl.lab.hosts import _npu_plane_batch

    spec = plan(hosts=2, npus=8, name="ta", subnet="10.78.100.0/24")
    assert npu_plane_netns("ta") == "dsctl-ta-npu"
    assert [npu_subnet(npu) for npu in (0, 7, 15)] == ["10.80.0.0/24", "10.87.0.0/24", "10.95.0.0/24"]
    assert (npu_address(2, 3), npu_gateway(3)) == ("10.83.0.12", "10.83.0.1")
    batch = _npu_plane_batch(spec).splitlines()
    assert batch[:2] == ["link add npu-plane type bridge", "address add 10.80.0.1/24 dev npu-plane"]
    assert "link add lab-02 type veth peer name npu-plane netns dsctl-ta-02" in batch
    cabling = npu_plane_cabling("ta", spec.members[1], 8)
    assert cabling["interface"] == "npu-plane" and cabling["ports"][0] == "200GE1/0/9"
