"""The gateway on a lab host in front of two served lab hosts: deploy brings it up and it balances; an instance
drained, restarted and undrained under probe load through the gateway costs no client request.

lab-01 and lab-02 run the lab's demo service (chat, 2 x TP4 per host: chat-0 on 8000, chat-1 on 8001); lab-03
is the inventory's gateway group, with nginx from the distribution's packages (the lab hosts see the
controller's, installed by .ci/setup).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dsctl.adapters import gateway

from .conftest import address, bring_up, default_hdk_and_cann, dsctl, requires_lab
from .gateway_load import GatewayLoad

pytestmark = [pytest.mark.lab, requires_lab]

GATEWAY = f"http://{address('lab-03')}:8080"
INSTANCES = {(host, f"chat-{n}"): f"http://{address(host)}:{8000 + n}" for host in ("lab-01", "lab-02") for n in (0, 1)}


def gateway_inventory(lab, directory: Path) -> Path:
    """The lab's inventory with lab-03 moved from the fleet into the gateway group."""
    data = yaml.safe_load(lab.inventory.read_text())
    nodes = data["all"]["children"]["npu_nodes"]
    # This story is about real time (nginx keeping requests alive through a drain and a restart): the engines run
    # at time scale 1, not the lab's faster default.
    nodes["vars"]["dsctl_ascend_env"] = {"DSCTL_ENGINE_TIME_SCALE": "1"}
    gateway_host = nodes["hosts"].pop("lab-03")
    connection = {key: value for key, value in nodes["vars"].items() if key.startswith("ansible_")}
    data["all"]["children"]["gateway"] = {
        "hosts": {"lab-03": gateway_host},
        "vars": {**connection, "dsctl_gateway": {"services": [{"service": "chat", "port": 8080}],
                                                 "drain_timeout_s": 120, "health_timeout_s": 120}},
    }
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def gateway_lab(tmp_path_factory):
    lab = bring_up("--hosts", "3", *default_hdk_and_cann())
    path = gateway_inventory(lab, tmp_path_factory.mktemp("gateway"))
    try:
        result = dsctl("provision", str(path), check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield lab, path
    finally:
        dsctl("lab", "down")


def served(url: str) -> float:
    """Requests the instance finished (vllm:request_success_total over its finish reasons)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(value) for value in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def probe_argv(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "dsctl", "probe", url, "--prompt-tokens", "32", "--json", *args]


def probe(url: str, *args: str) -> dict:
    result = subprocess.run(probe_argv(url, *args), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["data"]["metrics"]


def test_deploy_brings_the_gateway_up_and_it_balances_over_both_hosts(gateway_lab):
    lab, path = gateway_lab
    result = dsctl("deploy", str(path), "--json", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # nginx's master is root (it binds the port); its workers are the unprivileged user
    users = lab.sh_ok("lab-03", "ps -o user=,args= -C nginx")
    assert re.search(r"^root +nginx: master process /usr/sbin/nginx -c /etc/dsctl/gateway/nginx.conf", users, re.M)
    assert re.search(r"^dsctl-g\S* +nginx: worker process", users, re.M), users
    assert "root" not in {line.split()[0] for line in users.splitlines() if "worker process" in line}
    config = lab.sh_ok("lab-03", "cat /etc/dsctl/gateway/nginx.conf")
    for url in INSTANCES.values():
        assert f'server "{url.removeprefix("http://")}" max_fails=1' in config

    before = {key: served(url) for key, url in INSTANCES.items()}
    metrics = probe(GATEWAY, "--rate", "inf", "--requests", "24", "--output-tokens", "16")
    assert (metrics["completed"], metrics["failed"]) == (24, 0)
    gained = {key: served(url) - before[key] for key, url in INSTANCES.items()}
    assert sum(gained.values()) == 24
    for host in ("lab-01", "lab-02"):
        assert sum(n for (h, _), n in gained.items() if h == host) >= 6, gained  # least_conn spreads them

    master = lab.sh_ok("lab-03", "cat /run/dsctl-gateway.pid").strip()
    again = dsctl("deploy", str(path), "--json", check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert lab.sh_ok("lab-03", "cat /run/dsctl-gateway.pid").strip() == master


def test_a_drained_restarted_and_undrained_instance_costs_no_request(gateway_lab):
    lab, path = gateway_lab
    # probes of 10 s at 4 req/s back to back, from before the drain until a whole probe ran after the undrain: the
    # steps take as long as the busy machine makes them, and the load is on throughout (the covered() asserts)
    with GatewayLoad(GATEWAY, "--rate", "4", "--duration", "10", "--prompt-tokens", "32",
                     "--output-tokens", "48") as load:
        time.sleep(3)
        drained = gateway.drain(path, ["lab-01/chat-0"])
        drained_at = time.monotonic()
        assert drained.ok, drained.errors
        assert drained.gateways["lab-03"]["drained"] == ["lab-01/chat-0"]
        assert f'server "{address("lab-01")}:8000" down;' in lab.sh_ok("lab-03", "cat /etc/dsctl/gateway/nginx.conf")
        with urllib.request.urlopen(f"{INSTANCES[('lab-01', 'chat-0')]}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert re.search(r"^vllm:num_requests_running\{[^}]*\} 0(\.0)?$", text, re.M)

        lab.sh_ok("lab-01", "supervisorctl restart dsctl-chat-0")
        restarted_at = time.monotonic()
        undrained = gateway.undrain(path, ["lab-01/chat-0"])
        undrained_at = time.monotonic()
        assert undrained.ok, undrained.errors
        assert undrained.gateways["lab-03"]["drained"] == []
        load.wait_for_run_after(undrained_at)
    assert not load.problems, load.problems
    assert all(load.covered(moment) for moment in (drained_at, restarted_at, undrained_at)), (load.spans, [
        drained_at, restarted_at, undrained_at])
    assert load.completed > 0 and load.failed == 0, load.runs
    # the restarted instance (its counters start at 0) served again once it was back in the gateway
    assert served(INSTANCES[("lab-01", "chat-0")]) > 0


def test_a_drain_naming_no_instance_of_the_gateway_is_refused_and_changes_nothing(gateway_lab):
    lab, path = gateway_lab
    before = lab.sh_ok("lab-03", "cat /etc/dsctl/gateway/nginx.conf")
    result = gateway.drain(path, ["lab-09/chat-0"])
    assert not result.ok
    assert any("dsctl_gateway_drain: lab-09/chat-0 is not an instance behind the gateway" in e for e in result.errors)
    assert lab.sh_ok("lab-03", "cat /etc/dsctl/gateway/nginx.conf") == before
