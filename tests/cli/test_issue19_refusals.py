"""Small refusals of issue 19 item 9: each is one line naming the option or setting and the fix, exit 2, before
any work starts (nothing is simulated, built or contacted)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dsctl.app import main

from .test_probe_cli import one_error_line


def test_tune_simulate_refuses_zero_slots(capsys):
    # Before: `slots or 1` ran 0 slots as 1.
    assert main(["tune", "--simulate", "--model", "r1-7b", "--slo", "ttft=200ms", "--slots", "0"]) == 2
    assert "--slots must be at least 1, got 0" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["check"], ["deploy", "--render"], ["provision"]])
def test_a_non_regular_inventory_is_not_called_missing(capsys, tmp_path, command):
    fifo = tmp_path / "inventory.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        assert main([command[0], path, *command[1:]]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"inventory: {path} is not a file or directory of an inventory" in line


SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample"
# Every host at a closed port: a refusal that came after the first play would fail to connect instead.
CLOSED = "        {host}:\n          ansible_host: 127.0.0.1\n          ansible_port: 9\n"


def _with_gateway(tmp_path: Path, gateway: str) -> Path:
    site = tmp_path / "site"
    shutil.copytree(SAMPLE, site)
    (site / "hosts.yml").write_text(
        "all:\n  children:\n    npu_nodes:\n      hosts:\n" + CLOSED.format(host="atlas-a01")
        + "    gateway:\n      hosts:\n" + CLOSED.format(host="gw-01"))
    (site / "group_vars" / "gateway.yml").write_text(gateway)
    return site / "hosts.yml"


@pytest.mark.parametrize("render", [True, False])
@pytest.mark.parametrize("gateway, needle", [
    ("dsctl_gateway:\n  services:\n    - {service: chatt, port: 8080}\n",
     "inventory: host gw-01: dsctl_gateway.services[0].service: no host of the fleet runs a service named chatt; "
     "did you mean chat?"),
    ("dsctl_gateway:\n  services:\n    - {service: chat, port: x}\n",
     "inventory: host gw-01: dsctl_gateway.services[0].port: expected a port"),
    ("dsctl_gateway: chat\n", "inventory: host gw-01: dsctl_gateway: expected a mapping"),
])
def test_a_bad_gateway_is_refused_when_deploy_plans(capsys, tmp_path, gateway, needle, render):
    # Before: deploy --render exited 0 and deploy found it in the gateway play, after every instance rolled out.
    inventory = _with_gateway(tmp_path, gateway)
    assert main(["deploy", str(inventory), *(["--render"] if render else [])]) == 2
    assert needle in one_error_line(capsys.readouterr().err)


def test_a_good_gateway_still_renders(capsys, tmp_path):
    inventory = _with_gateway(tmp_path, "dsctl_gateway:\n  services:\n    - {service: chat, port: 8080}\n")
    assert main(["deploy", str(inventory), "--render", "--limit", "atlas-a01"]) == 0
