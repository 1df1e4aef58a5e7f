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
