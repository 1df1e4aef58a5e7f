"""The upgrade verb (dsctl.services.upgrade) over a simulated fleet: the real inventory reader, schema, matrix,
planner, state file and probe metrics; the ports (playbook runner, prober, gateway) are a small fleet model that
installs what the play's dsctl_plan asks for, serves at a speed that depends on the active CANN, and can fail."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from dsctl.adapters.ansible_run import HostOutcome, PlaybookRun
from dsctl.adapters.probe_client import RunResult
from dsctl.core.load.probe_metrics import RequestRecord
from dsctl.core.upgrade import gate
from dsctl.errors import ExitStatus, UsageError
from dsctl.lab.packages import package_specs
from dsctl.services.upgrade import UpgradeInputs, UpgradeInterrupted, upgrade

HOSTS = ("h1", "h2", "h3")
OLD = {"cann": "8.3.RC2", "vllm_ascend": "0.11.0"}
SERVICE = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
           "served_model_name": "r1-7b", "npus_per_instance": 4, "instances": 1, "port": 8000,
           "allow_unauthenticated": True}


@dataclass
class Host:
    cann: str = OLD["cann"]
    vllm_ascend: str = OLD["vllm_ascend"]
    installed: set = field(default_factory=lambda: {OLD["cann"]})


class Fleet:
    """The simulated hosts and every call made to them, in order."""

    def __init__(self, tmp_path: Path):
        self.hosts = {name: Host() for name in HOSTS}
        self.calls: list[tuple] = []
        self.drained: set[str] = set()
        self.gateway_vaults: list = []  # the vault options each drain and undrain was given
        self.fail_install: set[tuple[str, str]] = set()  # (host, cann) whose installer fails
        self.slow_cann: dict[str, float] = {}  # cann -> TTFT factor
        self.interrupt: tuple[str, str] | None = None  # (playbook, limit) raising KeyboardInterrupt once
        self.tmp = tmp_path

    # ------------------------------------------------------------------ PlaybookRunner
    def run(self, playbook, inventory, *, limit=None, check=False, diff=False, tags=None, forks=None,
            extra_vars=None, vault=None, on_event=None, artifacts_dir=None):
        self.calls.append((playbook, limit))
        if self.interrupt == (playbook, limit):
            self.interrupt = None
            raise KeyboardInterrupt
        names = limit.split(",") if limit else list(HOSTS)
        outcomes = {}
        rc = 0
        for name in names:
            host = self.hosts[name]
            outcome = HostOutcome(name, ok=5)
            if playbook == "provision.yml":
                stack = extra_vars["dsctl_plan"]["hosts"][name]["stack"]
                if (name, stack["cann"]) in self.fail_install:
                    outcome.failed, outcome.failed_task = 1, "Run the toolkit installer"
                    outcome.failed_msg = "non-zero return code"
                    outcome.stdout_tail = ["[Toolkit] [20251201-10:00:00] [ERROR] install failed, please retry"]
                    rc = 2
                else:
                    host.installed.add(stack["cann"])
                    host.cann, host.vllm_ascend = stack["cann"], stack["vllm_ascend"].lstrip("v")
                    outcome.facts["ascend_validate_report"] = self.report(name)
            elif playbook == "check.yml":
                outcome.facts["ascend_validate_report"] = self.report(name)
                outcome.facts["ascend_raw"] = {"arch": "x86_64", "disk": {"free_mb": 60000}}
            elif playbook == "deploy.yml":
                outcome.facts["inference_service_report"] = {"chat-0": "restarted"}
            outcomes[name] = outcome
        return PlaybookRun(playbook=playbook, rc=rc, artifacts=self.tmp, hosts=outcomes)

    def report(self, name: str) -> dict:
        host = self.hosts[name]
        return {"status": "ok", "findings": [], "npus": {"unhealthy": []},
                "versions": {"driver": {"installed": "25.3.rc1"}, "firmware": {"installed": "7.8.0.2.212"},
                             "cann": {"active": host.cann, "installed": sorted(host.installed)},
                             "vllm_ascend": host.vllm_ascend}}

    # ------------------------------------------------------------------ Prober
    def engine_time_scale(self, target, *, api_key, timeouts):
        return None  # a real engine: no emulated time scale

    def prompt_token_counts(self, target, *, api_key, timeouts, bodies):
        return None, "HTTP 404"  # as MindIE answers: no /tokenize

    def probe(self, target, *, path, model, api_key, request_id_header, timeouts, load, warmup, body, backstop,
              on_model, on_finish, lag_samples=None, keep_text=False, preflight=None):
        name = {f"10.0.0.{i}": h for i, h in enumerate(HOSTS, 1)}[target.host]
        self.calls.append(("probe", name))
        ttft = 0.05 * self.slow_cann.get(self.hosts[name].cann, 1.0)
        records = []
        for index in range(load.requests):
            sent = index * 0.1
            chunks = [sent + ttft + 0.01 * k for k in range(8)]
            records.append(RequestRecord(request_id=str(index), scheduled=sent, sent=sent, chunk_times=chunks,
                                         token_messages=8, output_tokens=8, prompt_tokens=16, status=200,
                                         end=chunks[-1]))
        on_model(model)
        return model, RunResult(records=records, warmup=[], duration=records[-1].end, started_wall=0.0,
                                perf_to_wall=0.0, perf_to_wall_end=math.nan)

    # ------------------------------------------------------------------ Gateway
    def _gateway(self, kind, members, vault=None):
        self.calls.append((kind, tuple(members)))
        self.gateway_vaults.append(vault)
        (self.drained.update if kind == "drain" else self.drained.difference_update)(members)

        class Result:
            ok, errors, gateways = True, [], {"gw": {"drained": sorted(self.drained)}}
        return Result()

    def drain(self, inventory, members, **options):
        return self._gateway("drain", members, options.get("vault"))

    def undrain(self, inventory, members, **options):
        return self._gateway("undrain", members, options.get("vault"))

    def playbooks(self, name: str) -> list[str | None]:
        return [limit for kind, limit in self.calls if kind == name]


@pytest.fixture
def world(tmp_path):
    packages = tmp_path / "packages"
    packages.mkdir()
    from dsctl import data

    specs = package_specs(data.load("releases"), "x86_64")
    (packages / "SHA256SUMS").write_text("".join(f"{'0' * 64}  {spec.name}\n" for spec in specs))
    for spec in specs:
        (packages / spec.name).touch()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"npu_nodes": {
        "hosts": {name: {"ansible_host": f"10.0.0.{i}"} for i, name in enumerate(HOSTS, 1)},
        "vars": {"dsctl_npu_count": 8, "dsctl_package_source": str(packages), "dsctl_driver_version": "25.3.rc1",
                 "dsctl_firmware_version": "7.8.0.2.212", "dsctl_cann_version": "8.3.RC2",
                 "dsctl_vllm_ascend_version": "v0.11.0", "dsctl_services": [SERVICE]}}}}}))
    fleet = Fleet(tmp_path)

    def run(**options):
        inputs = UpgradeInputs(inventory=inventory, state_dir=tmp_path / "upgrade", **options)
        return upgrade(fleet, fleet, inputs, gateway=fleet)

    return fleet, run, inventory, packages


TO_NEW = {"cann": "8.5.0", "vllm_ascend": "v0.13.0"}


def test_a_rolling_upgrade_drains_installs_restarts_gates_and_undrains_one_host_at_a_time(world):
    fleet, run, _, _ = world
    result = run(**TO_NEW)
    assert result.exit_status == ExitStatus.OK, result.errors
    assert {name: host.cann for name, host in fleet.hosts.items()} == dict.fromkeys(HOSTS, "8.5.0")
    steps = [call for call in fleet.calls if call[0] != "probe"]
    assert steps[0] == ("check.yml", None)
    assert steps[1:6] == [("drain", ("h1/chat-0",)), ("provision.yml", "h1"), ("deploy.yml", "h1"),
                          ("undrain", ("h1/chat-0",)), ("drain", ("h2/chat-0",))]
    assert fleet.drained == set()
    rows = {row.host: row for row in result.hosts}
    assert (rows["h1"].source, rows["h1"].target) == ("CANN 8.3.RC2, vllm-ascend v0.11.0",
                                                      "CANN 8.5.0, vllm-ascend v0.13.0")
    assert rows["h1"].versions["to"] == {"driver": "25.3.rc1", "firmware": "7.8.0.2.212", "cann": "8.5.0",
                                         "vllm_ascend": "v0.13.0"}
    assert rows["h2"].status == "upgraded" and rows["h2"].batch == 2
    assert rows["h3"].probe == "chat-0: ttft +0.0%, throughput +0.0%"
    assert rows["h3"].gate["chat-0"]["summary"].startswith("ttft 50.0 -> 50.0 ms (+0.0%, max +10%) ok")
    state = yaml.safe_load(Path(result.state_file).read_text())
    assert [entry["stage"] for entry in state["hosts"]["h1"]["history"]] == [
        "drained", "installed", "switched", "restarted", "gated", "undrained"]


def test_an_installer_fault_on_host_2_rolls_it_back_and_leaves_host_3_untouched(world):
    fleet, run, _, _ = world
    fleet.fail_install.add(("h2", "8.5.0"))
    result = run(**TO_NEW)
    assert result.exit_status == ExitStatus.PLAYBOOK_FAILED
    assert result.errors[0].startswith("h2: failed at installed: h2: failed at Run the toolkit installer")
    assert "install failed, please retry" in result.errors[0]
    assert result.errors[1:] == ("batch 2 (h2) rolled back to its previous stack", "not reached, untouched: h3")
    assert (fleet.hosts["h2"].cann, fleet.hosts["h3"].cann) == ("8.3.RC2", "8.3.RC2")
    assert fleet.hosts["h1"].cann == "8.5.0"
    assert fleet.playbooks("provision.yml") == ["h1", "h2", "h2"]  # the second h2 run switches it back
    # h3 had its baseline probe (before anything changed) and nothing else
    assert "h3" not in [call[1] for call in fleet.calls if call[0] not in ("check.yml", "probe")]
    assert fleet.drained == set()
    rows = {row.host: row.status for row in result.hosts}
    assert rows == {"h1": "upgraded", "h2": "rolled back (installed)", "h3": "pending"}
    assert (result.halted["host"], result.halted["stage"]) == ("h2", "installed")


def test_a_regressed_release_is_rolled_back_at_the_canary_with_its_numbers(world):
    fleet, run, _, _ = world
    fleet.slow_cann["8.5.0"] = 3.0
    result = run(**TO_NEW, max_regression="ttft=10%,throughput=5%")
    assert result.exit_status == ExitStatus.SLO_NOT_MET
    assert result.errors[0].startswith("h1: failed at gated: h1/chat-0 regressed: ttft 50.0 -> 150.0 ms (+200.0%, "
                                       "max +10%) REGRESSED")
    assert {name: host.cann for name, host in fleet.hosts.items()} == dict.fromkeys(HOSTS, "8.3.RC2")
    assert fleet.playbooks("provision.yml") == ["h1", "h1"]
    assert {row.host: row.status for row in result.hosts}["h1"] == "rolled back (gated)"


def test_an_slo_the_new_stack_misses_fails_the_gate_within_the_regression_limits(world):
    fleet, run, _, _ = world
    fleet.slow_cann["8.5.0"] = 3.0
    result = run(**TO_NEW, max_regression="ttft=1000%,throughput=90%", slos=gate.parse_slos("ttft:p99=100ms"))
    assert result.exit_status == ExitStatus.SLO_NOT_MET
    assert result.errors[0].startswith("h1: failed at gated: h1/chat-0 missed the --slo: ttft:p99 150")
    assert "(SLO 100 ms): missed by" in result.errors[0]


def test_check_changes_nothing_and_writes_no_state(world, tmp_path):
    fleet, run, _, _ = world
    result = run(**TO_NEW, check=True)
    assert result.exit_status == ExitStatus.OK and result.check_mode
    assert [call[0] for call in fleet.calls] == ["check.yml"]
    assert [row.status for row in result.hosts] == ["would upgrade"] * 3
    assert not (tmp_path / "upgrade").exists()


@pytest.mark.parametrize("missing", ["checksum", "file"])
def test_a_missing_package_is_refused_before_anything_is_touched(world, missing):
    fleet, run, _, packages = world
    toolkit = "Ascend-cann-toolkit_8.5.0_linux-x86_64.run"
    if missing == "file":
        (packages / toolkit).unlink()
    else:
        sums = packages / "SHA256SUMS"
        sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines() if toolkit not in line))
    result = run(**TO_NEW)
    assert result.exit_status == ExitStatus.VALIDATION_FAILED
    assert len(result.errors) == 3 and f"h1: {toolkit} (for CANN 8.5.0" in result.errors[0]
    assert [call[0] for call in fleet.calls] == ["check.yml"]


def test_an_interrupted_upgrade_resumes_where_it_stopped(world):
    fleet, run, _, _ = world
    fleet.interrupt = ("deploy.yml", "h2")
    with pytest.raises(UpgradeInterrupted, match="--resume to continue"):
        run(**TO_NEW)
    assert fleet.hosts["h2"].cann == "8.5.0" and "h2/chat-0" in fleet.drained
    with pytest.raises(UsageError, match="unfinished"):
        run(**TO_NEW)
    fleet.calls.clear()
    result = run(resume=True)
    assert result.exit_status == ExitStatus.OK, result.errors
    # h2 re-enters after the switch: restart, gate, undrain; then h3 from the start
    assert [call for call in fleet.calls if call[0] != "probe"][:3] == [
        ("deploy.yml", "h2"), ("undrain", ("h2/chat-0",)), ("drain", ("h3/chat-0",))]
    assert fleet.drained == set()


def test_rollback_returns_every_touched_host_to_its_previous_stack(world):
    fleet, run, _, _ = world
    assert run(**TO_NEW).exit_status == ExitStatus.OK
    fleet.calls.clear()
    result = run(rollback=True)
    assert result.exit_status == ExitStatus.OK, result.errors
    assert {name: host.cann for name, host in fleet.hosts.items()} == dict.fromkeys(HOSTS, "8.3.RC2")
    assert fleet.playbooks("provision.yml") == ["h3", "h2", "h1"]
    assert {row.status for row in result.hosts} == {"rolled back"}
    assert fleet.drained == set()


@pytest.mark.parametrize(("options", "message"), [
    ({"resume": True, "rollback": True}, "--resume: give it or --rollback"),
    ({"resume": True, "cann": "8.5.0"}, "--resume: the versions come from the state file"),
    ({"firmware": "7.8.0.5.216"}, "--firmware: give --driver with it"),
    ({"batch": "0"}, "--batch '0'"), ({"max_regression": "ttft=10"}, "--max-regression 'ttft=10'")])
def test_bad_options_are_refused_before_any_host_is_read(options, message, tmp_path):
    with pytest.raises(UsageError, match=message):
        UpgradeInputs(inventory=tmp_path / "none.yml", **options)


def test_resume_without_a_state_file_says_what_to_do(world):
    _, run, _, _ = world
    with pytest.raises(UsageError, match="no upgrade state at"):
        run(resume=True)


def test_the_command_prints_the_plan_table_and_the_json_envelope(world, monkeypatch, tmp_path, capsys):
    from dsctl.app import main
    from dsctl.services.context import AppContext

    fleet, _, inventory, _ = world
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    context = AppContext(runner=fleet, prober=fleet)
    assert main(["upgrade", str(inventory), "--cann", "8.5.0", "--vllm-ascend", "v0.13.0", "--check"],
                context=context) == 0
    out = capsys.readouterr().out
    assert "dsctl upgrade --check: 3 hosts" in out and "would upgrade" in out
    assert main(["upgrade", str(inventory), "--cann", "8.5.0", "--vllm-ascend", "v0.11.0", "--check", "--json"],
                context=context) == 3
    envelope = __import__("json").loads(capsys.readouterr().out)
    assert envelope["exit_code"] == 3 and envelope["errors"][0].startswith("h1: target CANN 8.5.0")
    assert main(["upgrade", str(inventory), "--batch", "two"], context=context) == 2
    assert "dsctl: error: --batch 'two': expected a host count" in capsys.readouterr().err
    assert not (tmp_path / "xdg").exists()


# -- one fleet, one state, one upgrade at a time (issue 19) ----------------------------------------------------


@pytest.fixture
def keyed(world, tmp_path, monkeypatch):
    """The world with its state where dsctl keeps it by default (under the runs directory's parent)."""
    from dsctl.adapters import ansible_run

    monkeypatch.setattr(ansible_run, "runs_dir", lambda: tmp_path / "state" / "runs")
    fleet, _, inventory, _ = world
    site = tmp_path / "site"
    site.mkdir()
    (site / "hosts.yml").write_text(inventory.read_text())
    (site / "group_vars").mkdir()
    (site / "README.md").write_text("not an inventory source\n")
    (tmp_path / "link").symlink_to(site)

    def run(spelling, **options):
        return upgrade(fleet, fleet, UpgradeInputs(inventory=Path(spelling), **options), gateway=fleet)

    return fleet, run, site


def test_every_spelling_of_an_inventory_keys_the_same_state(keyed, tmp_path, monkeypatch):
    _, _, site = keyed
    monkeypatch.chdir(tmp_path)
    spellings = [site, tmp_path / "site" / ".." / "site", tmp_path / "link", Path("site"), site / "hosts.yml",
                 tmp_path / "link" / "hosts.yml"]
    paths = {UpgradeInputs(inventory=spelling).state_path() for spelling in spellings}
    assert len(paths) == 1, paths


def test_an_unfinished_upgrade_is_seen_through_another_spelling(keyed, tmp_path):
    fleet, run, site = keyed
    fleet.interrupt = ("deploy.yml", "h2")
    with pytest.raises(UpgradeInterrupted):
        run(site, **TO_NEW)
    for spelling in (tmp_path / "link", site / "hosts.yml", tmp_path / "site" / ".." / "site"):
        with pytest.raises(UsageError, match="unfinished"):
            run(spelling, **TO_NEW)


def test_a_second_upgrade_of_the_same_fleet_is_refused_naming_the_first_s_pid(keyed, tmp_path):
    import os

    from dsctl.adapters import state_files

    fleet, run, site = keyed
    lock = UpgradeInputs(inventory=site).state_path().with_name("state.lock")
    with state_files.exclusive(lock, "the first upgrade"):
        with pytest.raises(state_files.StateLocked) as refused:
            run(tmp_path / "link", **TO_NEW)
    assert f"is already running (pid {os.getpid()}" in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_status == ExitStatus.ERROR
    assert fleet.calls == []  # refused before dsctl check
    assert run(site, **TO_NEW).exit_status == ExitStatus.OK  # the lock went with its holder


def test_the_state_is_fsynced_with_its_directory(tmp_path, monkeypatch):
    import os
    import stat

    from dsctl.adapters import state_files

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)), real_fsync(fd)))
    state_files.write_durably(tmp_path / "upgrade" / "state.json", "{}\n")
    assert synced == [False, True]  # the file, then the directory holding the rename
    assert (tmp_path / "upgrade" / "state.json").read_text() == "{}\n"
    assert [p.name for p in (tmp_path / "upgrade").iterdir()] == ["state.json"]


def test_an_edited_state_naming_an_unknown_host_is_one_line(world, tmp_path):
    import json

    from dsctl.core.upgrade.state import StateError

    fleet, run, _, _ = world
    fleet.interrupt = ("deploy.yml", "h2")
    with pytest.raises(UpgradeInterrupted):
        run(**TO_NEW)
    path = tmp_path / "upgrade" / "state.json"
    state = json.loads(path.read_text())
    state["batches"][2] = ["h9"]
    path.write_text(json.dumps(state))
    with pytest.raises(StateError) as refused:
        run(resume=True)
    assert str(refused.value) == (f"{path}: batch 3 names host h9, which \"hosts\" does not list; restore the file "
                                  "or remove it to start over")


# -- targets and options checked before dsctl check contacts a host (issue 19) ---------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"cann": "9.9.9"}, "--cann 9.9.9: CANN 9.9.9 is not in the releases data (known: "),
    ({"vllm_ascend": "v9.9.9"}, "--vllm-ascend v9.9.9: vllm-ascend v9.9.9 is not in the releases data (known: "),
    ({"driver": "99.0.0"}, "--driver 99.0.0: "),
])
def test_an_unknown_target_is_refused_before_any_playbook_or_probe(world, options, message):
    from dsctl.core.fleet.matrix import StackError

    fleet, run, _, _ = world
    with pytest.raises(StackError) as refused:
        run(**options)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    assert refused.value.exit_status == ExitStatus.USAGE
    assert fleet.calls == []


@pytest.mark.parametrize(("workload", "message"), [
    ({"prompt_tokens": "abc"}, "--probe-prompt-tokens 'abc': expected N, uniform:LO:HI or normal:MEAN:STD"),
    ({"output_tokens": "uniform:9"}, "--probe-output-tokens 'uniform:9'"),
])
def test_a_bad_probe_length_is_refused_with_the_options(workload, message, tmp_path):
    from dsctl.services.upgrade import GateWorkload

    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        UpgradeInputs(inventory=tmp_path / "none.yml", workload=GateWorkload(**workload))


def test_an_incompatible_target_is_a_plan_problem_found_before_any_playbook(world):
    fleet, run, _, _ = world
    result = run(cann="8.5.0", vllm_ascend="v0.11.0")
    assert result.exit_status == ExitStatus.VALIDATION_FAILED
    assert result.errors[0].startswith("h1: target CANN 8.5.0") and len(result.errors) == 1
    assert fleet.calls == []


@pytest.mark.parametrize(("gateway", "message"), [
    ({"services": [{"service": "chat", "port": "8080"}]},
     "inventory: host gw: dsctl_gateway.services[0].port: expected a port 1..65535, got '8080'"),
    ({"services": [{"service": "embed", "port": 8080}]}, "embed"),
    (None, "host gw is in group gateway but declares no gateway"),
])
def test_a_bad_gateway_is_refused_before_any_playbook_or_probe(world, gateway, message):
    from dsctl.core.serving.gateway import GatewayError

    fleet, run, inventory, _ = world
    doc = yaml.safe_load(inventory.read_text())
    doc["all"]["children"]["gateway"] = {"hosts": {"gw": {"ansible_host": "10.0.0.9",
                                                          **({"dsctl_gateway": gateway} if gateway else {})}}}
    inventory.write_text(yaml.safe_dump(doc))
    with pytest.raises(GatewayError) as refused:
        run(**TO_NEW)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_status == ExitStatus.USAGE
    assert fleet.calls == []


def test_the_vault_options_reach_every_drain_and_undrain(world, tmp_path):
    from dsctl.adapters.inventory import VaultOptions

    fleet, run, _, _ = world
    secret = tmp_path / "vault.txt"
    secret.write_text("correct horse\n")
    vault = VaultOptions(password_file=secret)
    assert run(**TO_NEW, vault=vault).exit_status == ExitStatus.OK
    assert len(fleet.gateway_vaults) == 2 * len(HOSTS) and all(given is vault for given in fleet.gateway_vaults)


# --------------------------------------------------------------------------- the inventory follows (issue 20)


def inventory_versions_of(inventory: Path) -> dict:
    nodes = yaml.safe_load(inventory.read_text())["all"]["children"]["npu_nodes"]["vars"]
    return {key: nodes[key] for key in ("dsctl_cann_version", "dsctl_vllm_ascend_version")}


def test_a_finished_upgrade_writes_its_versions_into_the_inventory_and_a_rollback_writes_the_old_ones_back(world):
    fleet, run, inventory, _ = world
    inventory.write_text("# the site's fleet\n" + inventory.read_text())
    result = run(**TO_NEW)
    assert result.exit_status == ExitStatus.OK, result.errors
    assert inventory_versions_of(inventory) == {"dsctl_cann_version": "8.5.0", "dsctl_vllm_ascend_version": "v0.13.0"}
    assert inventory.read_text().startswith("# the site's fleet\n")  # a round trip: comments kept
    assert any("dsctl_cann_version: 8.3.RC2 -> 8.5.0 (group npu_nodes)" in line for line in result.inventory)
    back = run(rollback=True)
    assert back.exit_status == ExitStatus.OK, back.errors
    assert inventory_versions_of(inventory) == {"dsctl_cann_version": "8.3.RC2", "dsctl_vllm_ascend_version": "v0.11.0"}
    assert run(**TO_NEW).exit_status == ExitStatus.OK
    # Once more with the same flags: nothing to do, and no edit.
    again = run(**TO_NEW)
    assert again.exit_status == ExitStatus.OK and not again.inventory


def test_a_halted_upgrade_leaves_the_inventory_alone_until_every_host_is_done(world):
    fleet, run, inventory, _ = world
    before = inventory.read_text()
    fleet.fail_install.add(("h2", "8.5.0"))
    assert run(**TO_NEW).exit_status == ExitStatus.PLAYBOOK_FAILED
    assert inventory.read_text() == before


def test_a_resume_after_the_inventory_changed_is_refused_with_the_reason(world):
    fleet, run, inventory, _ = world
    fleet.interrupt = ("deploy.yml", "h2")
    with pytest.raises(UpgradeInterrupted):
        run(**TO_NEW)
    inventory.write_text(inventory.read_text().replace("8.3.RC2", "8.5.0").replace("v0.11.0", "v0.13.0"))
    with pytest.raises(UsageError, match=r"--resume: the inventory changed since the upgrade began \(h1: CANN 8.3.RC2"):
        run(resume=True)


def test_a_templated_version_is_refused_before_any_host_is_contacted(world):
    fleet, run, inventory, _ = world
    data = yaml.safe_load(inventory.read_text())
    group = data["all"]["children"]["npu_nodes"]["vars"]
    group.update(dsctl_cann_version="{{ site_cann }}", site_cann="8.3.RC2")
    inventory.write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError, match=r"dsctl_cann_version \(group npu_nodes\) is templated"):
        run(**TO_NEW)
    assert fleet.calls == []


def test_provision_is_refused_while_an_upgrade_is_half_done_and_allowed_once_it_is_finished(world, monkeypatch):
    from dsctl.adapters.upgrade_state import fleet_key, state_path
    from dsctl.services import provision as provision_verb

    fleet, _, inventory, _ = world
    monkeypatch.setenv("XDG_STATE_HOME", str(inventory.parent / "state"))
    state_dir = state_path(fleet_key(inventory)).parent

    def run(**options):
        return upgrade(fleet, fleet, UpgradeInputs(inventory=inventory, state_dir=state_dir, **options),
                       gateway=fleet)

    fleet.interrupt = ("deploy.yml", "h2")
    with pytest.raises(UpgradeInterrupted):
        run(**TO_NEW)
    with pytest.raises(UsageError, match=r"an upgrade of this inventory is unfinished \(h1, h2 on its new stack"):
        provision_verb.provision(fleet, provision_verb.ProvisionInputs(inventory=inventory))
    assert run(resume=True).exit_status == ExitStatus.OK
    result = provision_verb.provision(fleet, provision_verb.ProvisionInputs(inventory=inventory))
    assert result.exit_status == ExitStatus.OK
    assert {name: host.cann for name, host in fleet.hosts.items()} == dict.fromkeys(HOSTS, "8.5.0")


def test_one_upgrade_reads_the_inventory_once_and_once_more_to_verify_what_it_wrote(world, monkeypatch):
    """One Ansible inventory child before any host is contacted (the preflight check, every batch's provision and
    deploy and the rollbacks use that fleet: dsctl.services.fleet.Fleet.only), and one after the versions are written
    into the inventory, to see that Ansible resolves them (the files changed); --check reads once."""
    from dsctl.adapters import inventory as reader

    fleet, run, _, _ = world
    reads: list[int] = []  # how many playbooks, probes and gateway calls had run at each read
    real = reader._read_in_child

    def counted(inventory, request):
        reads.append(len(fleet.calls))
        return real(inventory, request)

    monkeypatch.setattr(reader, "_read_in_child", counted)
    assert run(check=True, **TO_NEW).exit_status == ExitStatus.OK
    assert reads == [0]
    fleet.fail_install.add(("h2", "8.5.0"))  # a rollback's provision and deploy read nothing either
    failing = len(fleet.calls)
    assert run(**TO_NEW).exit_status == ExitStatus.PLAYBOOK_FAILED
    assert fleet.playbooks("provision.yml") == ["h1", "h2", "h2"]
    assert reads == [0, failing]
    fleet.fail_install.clear()
    resuming = len(fleet.calls)
    result = run(resume=True)
    assert result.exit_status == ExitStatus.OK, result.errors
    assert fleet.playbooks("provision.yml") == ["h1", "h2", "h2", "h2", "h3"] and result.inventory
    assert reads == [0, failing, resuming, len(fleet.calls)]
