"""`dsctl deploy` on provisioned lab hosts: two instances per host under supervisor, health-gated, day-2 safe.

The services run `<venv>/bin/vllm serve ...`, exactly what a real host runs; on the lab the serving venv's
stand-in vllm is dsctl's emulated engine.  One lab (2 hosts, provisioned once) serves the whole module; the
tests run in order and each starts from the state the previous one left.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import LAB_ROOT, address, dsctl, provisioned_lab, requires_lab

pytestmark = [pytest.mark.lab, requires_lab]

KEY = "lab-test-key-0123456789"


def service(name: str, port: int, **params) -> dict:
    return {"name": name, "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
            "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": port,
            "health_timeout_s": 120, "allow_unauthenticated": True, "params": {"max_num_seqs": 32, **params}}


@pytest.fixture(scope="module")
def served_lab(tmp_path_factory):
    yield from provisioned_lab(2, tmp_path_factory, "deploy")


def inventory(lab, directory: Path, services: list[dict]) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"] = services
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def deploy(path: Path, *args: str) -> tuple[int, dict]:
    result = dsctl("deploy", str(path), "--json", *args, check=False)
    return result.returncode, json.loads(result.stdout)


def pids(lab) -> dict[tuple[str, str], str]:
    found = {}
    for host in ("lab-01", "lab-02"):
        for unit in ("dsctl-a-0", "dsctl-b-0"):
            found[(host, unit)] = lab.sh(host, f"supervisorctl pid {unit}").stdout.strip()
    return found


def probe(url: str, *args: str):
    return dsctl("probe", url, "--rate", "inf", "--requests", "4", "--prompt-tokens", "32", "--output-tokens", "8",
                 "--json", *args, check=False)


def test_two_instances_per_host_serve_and_an_unchanged_deploy_restarts_nothing(served_lab):
    lab, directory = served_lab
    path = inventory(lab, directory, [service("a", 8000), service("b", 8001)])
    code, report = deploy(path)
    assert code == 0, report["errors"]
    rows = report["data"]["instances"]
    assert {(r["host"], r["instance"], r["npus"], r["port"], r["status"]) for r in rows} == {
        (h, i, n, p, "restarted") for h in ("lab-01", "lab-02")
        for i, n, p in (("a-0", "0,1,2,3", 8000), ("b-0", "4,5,6,7", 8001))}
    for row in rows:
        result = probe(row["endpoint"].removesuffix("/v1"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["data"]["metrics"]["completed"] == 4
    # the instance's NPUs and user come from the inventory, not from root
    environment = lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/service.env")
    assert "ASCEND_RT_VISIBLE_DEVICES=4,5,6,7" in environment
    assert lab.sh_ok("lab-01", "ps -o user= -p $(supervisorctl pid dsctl-a-0)").strip() != "root"

    before = pids(lab)
    code, report = deploy(path)
    assert code == 0
    assert {r["status"] for r in report["data"]["instances"]} == {"unchanged"}
    assert pids(lab) == before
    # the state the module's last deploy story goes back to (test_a_snapshot_restore_...)
    dsctl("lab", "snapshot", "save", "two-services")


def test_changing_one_parameter_restarts_only_that_instance(served_lab):
    lab, directory = served_lab
    before = pids(lab)
    code, report = deploy(inventory(lab, directory, [service("a", 8000), service("b", 8001, max_num_seqs=16)]))
    assert code == 0, report["errors"]
    statuses = {(r["host"], r["instance"]): r["status"] for r in report["data"]["instances"]}
    assert statuses == {("lab-01", "a-0"): "unchanged", ("lab-01", "b-0"): "restarted",
                        ("lab-02", "a-0"): "unchanged", ("lab-02", "b-0"): "restarted"}
    after = pids(lab)
    for host in ("lab-01", "lab-02"):
        assert after[(host, "dsctl-a-0")] == before[(host, "dsctl-a-0")]
        assert after[(host, "dsctl-b-0")] != before[(host, "dsctl-b-0")]
    assert "--max-num-seqs 16" in lab.sh_ok("lab-02", "cat /etc/dsctl/services/b-0/launch.sh")


def test_a_config_that_cannot_start_is_rolled_back_and_the_old_one_serves(served_lab):
    lab, directory = served_lab
    # 5 % of a 64 GB chip cannot hold the 7B weights: the engine stops at start-up, as vLLM does.
    bad = service("b", 8001, max_num_seqs=16, gpu_memory_utilization=0.05)
    code, report = deploy(inventory(lab, directory, [service("a", 8000), bad]), "--limit", "lab-01")
    assert code == 4
    statuses = {r["instance"]: r["status"] for r in report["data"]["instances"] if r["host"] == "lab-01"}
    assert statuses == {"a-0": "unchanged", "b-0": "rolled back"}
    errors = " ".join(report["errors"])
    assert "b-0: the new configuration failed" in errors and "rolled back" in errors
    assert "memory" in errors.lower()
    result = probe(f"http://{address('lab-01')}:8001")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--max-num-seqs 16" in lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/launch.sh")
    assert "gpu-memory-utilization" not in lab.sh_ok("lab-01", "cat /etc/dsctl/services/b-0/launch.sh")


def test_an_api_key_is_required_when_set_and_never_shown(served_lab):
    lab, directory = served_lab
    keyed = {**service("a", 8000), "api_key": KEY}
    path = inventory(lab, directory, [keyed, service("b", 8001, max_num_seqs=16)])
    result = dsctl("deploy", str(path), "--limit", "lab-02", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert KEY not in result.stdout + result.stderr
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{address('lab-02')}:8000/v1/models", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request(f"http://{address('lab-02')}:8000/v1/models",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert probe(f"http://{address('lab-02')}:8000", "--api-key", KEY).returncode == 0
    mode = lab.sh_ok("lab-02", "stat -c %a /etc/dsctl/services/a-0/service.env").strip()
    assert mode == "600"
    rendered = dsctl("deploy", str(path), "--render", "--limit", "lab-02")
    assert KEY not in rendered.stdout and "not shown" in rendered.stdout
    runs = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "dsctl" / "runs"
    newest = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    for item in newest.rglob("*"):
        if item.is_file() and stat.S_ISREG(item.stat().st_mode):
            assert KEY.encode() not in item.read_bytes(), item


# --------------------------------------------------------------------------- stack, crash safety, retirement

CONFIG = "/etc/dsctl/services"
KEYED = {**service("a", 8000), "api_key": KEY}


def statuses(report) -> dict[tuple[str, str], str]:
    return {(r["host"], r["instance"]): r["status"] for r in report["data"]["instances"]}


def instance_state(lab, host: str, instance: str) -> dict:
    """The instance's rollout state as the role left it on the host."""
    directory = f"{CONFIG}/{instance}"
    out = lab.sh(host, f"cat {directory}/.dsctl-fingerprint 2>/dev/null; echo ---; "
                       f"cat {directory}/.dsctl-pending 2>/dev/null; echo ---; ls {directory}/.dsctl-good 2>/dev/null")
    fingerprint, pending, good = (part.strip() for part in out.stdout.split("---"))
    return {"fingerprint": fingerprint, "pending": json.loads(pending) if pending else None,
            "good": good.split()}


def verify_snapshot(lab, host: str, instance: str, fingerprint: str) -> list[str]:
    """Every kept copy of a good snapshot checked against its manifest on the host; the paths it holds."""
    directory = f"{CONFIG}/{instance}/.dsctl-good/{fingerprint}"
    manifest = json.loads(lab.sh_ok(host, f"cat {directory}/manifest.json"))
    assert manifest["fingerprint"] == fingerprint
    for entry in manifest["files"]:
        digest = lab.sh_ok(host, f"sha256sum {directory}/files/{entry['stored']}").split()[0]
        assert digest == entry["sha256"], entry["path"]
    return [entry["path"] for entry in manifest["files"]]


def test_a_stack_change_restarts_exactly_that_hosts_instances(served_lab):
    lab, directory = served_lab
    path = inventory(lab, directory, [KEYED, service("b", 8001, max_num_seqs=16)])
    code, report = deploy(path)
    assert code == 0, report["errors"]
    before = pids(lab)
    # what provision does when the env changes: /etc/profile.d/dsctl-ascend.sh gets other content
    lab.sh_ok("lab-01", "echo 'export ASCEND_GLOBAL_LOG_LEVEL=3' >> /etc/profile.d/dsctl-ascend.sh")
    code, report = deploy(path)
    assert code == 0, report["errors"]
    assert statuses(report) == {("lab-01", "a-0"): "restarted", ("lab-01", "b-0"): "restarted",
                                ("lab-02", "a-0"): "unchanged", ("lab-02", "b-0"): "unchanged"}
    after = pids(lab)
    assert all(after[("lab-01", unit)] != before[("lab-01", unit)] for unit in ("dsctl-a-0", "dsctl-b-0"))
    assert all(after[("lab-02", unit)] == before[("lab-02", unit)] for unit in ("dsctl-a-0", "dsctl-b-0"))
    stack = json.loads(lab.sh_ok("lab-01", f"cat {CONFIG}/b-0/.dsctl-instance.json"))["stack"]
    assert stack["cann"]["latest"].startswith("/usr/local/Ascend/ascend-toolkit/") and stack["cann"]["version"]
    assert any(pin.startswith("vllm-ascend==") or pin.startswith("vllm_ascend==") for pin in stack["venv"]["pins"])
    code, report = deploy(path)
    assert code == 0 and set(statuses(report).values()) == {"unchanged"}
    assert pids(lab) == after


def test_a_failing_backup_stops_the_deploy_before_the_instance_is_touched(served_lab):
    lab, directory = served_lab
    before = pids(lab)[("lab-02", "dsctl-b-0")]
    launch = lab.sh_ok("lab-02", f"cat {CONFIG}/b-0/launch.sh")
    # a file where the backup directory has to be created: the backup cannot be written
    lab.sh_ok("lab-02", f"rm -rf {CONFIG}/b-0/.dsctl-good && touch {CONFIG}/b-0/.dsctl-good")
    try:
        path = inventory(lab, directory, [KEYED, service("b", 8001, max_num_seqs=12)])
        code, report = deploy(path, "--limit", "lab-02")
        assert code == 4, report
        errors = " ".join(report["errors"])
        assert "backup of the last good files failed" in errors and f"{CONFIG}/b-0/.dsctl-good" in errors, errors
        assert statuses(report)[("lab-02", "b-0")] != "restarted"
        assert pids(lab)[("lab-02", "dsctl-b-0")] == before  # the old process still serves
        assert lab.sh_ok("lab-02", f"cat {CONFIG}/b-0/launch.sh") == launch
        assert instance_state(lab, "lab-02", "b-0")["pending"] is None
        assert probe(f"http://{address('lab-02')}:8001").returncode == 0
    finally:
        lab.sh_ok("lab-02", f"rm -f {CONFIG}/b-0/.dsctl-good")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def slow(max_num_seqs: int) -> dict:
    """Service b taking 10 s to come up: long enough to kill dsctl while the health gate waits for it."""
    return {**service("b", 8001, max_num_seqs=max_num_seqs), "env": {"DSCTL_ENGINE_STARTUP": "10"}}


def kill_dsctl_during_the_health_wait(lab, path: Path, max_num_seqs: int) -> None:
    """Run `dsctl deploy --limit lab-01`, SIGKILL it once b-0's candidate runs, wait for its playbook to end."""
    env = {**os.environ, "DSCTL_LAB_ROOT": str(LAB_ROOT), "COLUMNS": "200"}
    size = int(lab.sh_ok("lab-01", "stat -c %s /var/log/dsctl/b-0.log"))
    proc = subprocess.Popen([sys.executable, "-m", "dsctl", "deploy", str(path), "--limit", "lab-01"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = lab.sh("lab-01", f"tail -c +{size + 1} /var/log/dsctl/b-0.log").stdout
            if f"'max_num_seqs': {max_num_seqs}" in log and instance_state(lab, "lab-01", "b-0")["pending"]:
                break  # the candidate runs and loads its weights: deploy waits in the health gate
            assert proc.poll() is None, "deploy ended before the health wait"
            time.sleep(0.5)
        else:
            raise AssertionError("the candidate never started")
        playbooks = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for child in playbooks:  # ansible-playbook gets SIGINT when dsctl dies; let it end
            for _ in range(120):
                if not Path(f"/proc/{child}").exists():
                    break
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_of_dsctl_during_the_health_wait_is_finished_by_the_next_deploy(served_lab):
    lab, directory = served_lab
    good = instance_state(lab, "lab-01", "b-0")["fingerprint"]
    path = inventory(lab, directory, [KEYED, slow(8)])
    kill_dsctl_during_the_health_wait(lab, path, 8)
    left = instance_state(lab, "lab-01", "b-0")
    assert left["pending"] is not None and left["fingerprint"] == good  # interrupted: nothing validated
    kept = verify_snapshot(lab, "lab-01", "b-0", good)

    code, report = deploy(path, "--limit", "lab-01")
    assert code == 0, report["errors"]
    assert statuses(report)[("lab-01", "b-0")] == "restarted"
    state = instance_state(lab, "lab-01", "b-0")
    assert state["pending"] is None and state["fingerprint"] not in ("", good)  # the candidate passed the gate
    assert "--max-num-seqs 8" in lab.sh_ok("lab-01", f"cat {CONFIG}/b-0/launch.sh")
    assert verify_snapshot(lab, "lab-01", "b-0", good) == kept  # the last good backup is intact
    assert probe(f"http://{address('lab-01')}:8001").returncode == 0


def test_an_interrupted_rollout_no_longer_declared_is_undone_through_the_gate(served_lab):
    lab, directory = served_lab
    good = instance_state(lab, "lab-01", "b-0")["fingerprint"]
    launch = lab.sh_ok("lab-01", f"cat {CONFIG}/b-0/launch.sh")
    kill_dsctl_during_the_health_wait(lab, inventory(lab, directory, [KEYED, slow(4)]), 4)
    assert "--max-num-seqs 4" in lab.sh_ok("lab-01", f"cat {CONFIG}/b-0/launch.sh")  # unvalidated, in place
    # the inventory went back to what served: the last good files are restored, verified, and gated
    code, report = deploy(inventory(lab, directory, [KEYED, slow(8)]), "--limit", "lab-01")
    assert code == 0, report["errors"]
    assert statuses(report)[("lab-01", "b-0")] == "recovered"
    assert lab.sh_ok("lab-01", f"cat {CONFIG}/b-0/launch.sh") == launch
    state = instance_state(lab, "lab-01", "b-0")
    assert state["fingerprint"] == good and state["pending"] is None
    size = int(lab.sh_ok("lab-01", "stat -c %s /var/log/dsctl/b-0.log"))
    assert probe(f"http://{address('lab-01')}:8001").returncode == 0
    assert "'max_num_seqs': 8" in lab.sh_ok("lab-01", "grep non-default /var/log/dsctl/b-0.log | tail -n 1")
    assert size > 0


def test_force_restart_restarts_every_selected_instance_through_the_gate(served_lab):
    from dsctl.adapters.ansible_run import run_playbook

    lab, directory = served_lab
    before = pids(lab)
    run = run_playbook("deploy.yml", inventory(lab, directory, [KEYED, service("b", 8001, max_num_seqs=16)]),
                       limit="lab-02", extra_vars={"dsctl_deploy_force_restart": True}, timeout=300)
    assert run.rc == 0, run.to_dict()
    assert run.hosts["lab-02"].facts["inference_service_report"] == {"a-0": "restarted", "b-0": "restarted"}
    after = pids(lab)
    assert all(after[("lab-02", unit)] != before[("lab-02", unit)] for unit in ("dsctl-a-0", "dsctl-b-0"))
    assert all(after[("lab-01", unit)] == before[("lab-01", unit)] for unit in ("dsctl-a-0", "dsctl-b-0"))


def test_a_service_removed_from_the_inventory_is_stopped_and_archived(served_lab):
    lab, directory = served_lab
    code, report = deploy(inventory(lab, directory, [KEYED]), "--limit", "lab-02")
    assert code == 0, report["errors"]
    assert statuses(report) == {("lab-02", "a-0"): "unchanged"}
    assert "no such process" in lab.sh("lab-02", "supervisorctl status dsctl-b-0").stdout.lower()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address('lab-02')}:8001/health", timeout=5)
    assert lab.sh("lab-02", "test -e /etc/supervisor/conf.d/dsctl-b-0.conf").exit_code != 0
    assert lab.sh("lab-02", f"test -e {CONFIG}/b-0").exit_code != 0
    archived = lab.sh_ok("lab-02", f"ls -d {CONFIG}/.dsctl-retired/b-0-*").split()
    assert len(archived) == 1
    kept = lab.sh_ok("lab-02", f"ls -A {archived[0]}").split()
    assert {"launch.sh", "service.env", ".dsctl-fingerprint", "dsctl-b-0.conf.disabled"} <= set(kept)
    # the other host, not in --limit, still serves b
    assert probe(f"http://{address('lab-01')}:8001").returncode == 0
    code, report = deploy(inventory(lab, directory, [KEYED]), "--limit", "lab-02")
    assert code == 0 and set(statuses(report).values()) == {"unchanged"}


def test_a_snapshot_restore_brings_back_the_saved_instances_and_deploy_finds_them_unchanged(served_lab):
    """The tests since the first one changed b's parameters, set an API key and retired b on lab-02; the snapshot
    taken after the first one brings every host back to two serving instances, as after a power cycle."""
    lab, directory = served_lab
    running = pids(lab)
    dsctl("lab", "snapshot", "restore", "two-services")
    deadline = time.monotonic() + 60
    for host in ("lab-01", "lab-02"):
        for port in (8000, 8001):
            url = f"http://{address(host)}:{port}/health"
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{url} did not serve again after the restore"
                time.sleep(0.3)
    restarted = pids(lab)
    assert all(restarted[key] and restarted[key] != running[key] for key in restarted), (running, restarted)
    code, report = deploy(inventory(lab, directory, [service("a", 8000), service("b", 8001)]))
    assert code == 0 and set(statuses(report).values()) == {"unchanged"}, report
    assert pids(lab) == restarted
    assert probe(f"http://{address('lab-02')}:8001").returncode == 0  # b, retired on lab-02 before, serves there
