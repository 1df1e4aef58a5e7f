"""The verbs through dsctl's real runner: the sample inventory read by ansible-inventory and checked by the real
schema and planner, ansible-playbook replaced by a stand-in that replays dsctl_events lines (conftest.py)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsctl.adapters import ansible_run
from dsctl.app import main
from dsctl.errors import ExitStatus
from dsctl.services.context import AppContext
from dsctl.services.deploy import DeployInputs, DeployInterrupted, deploy
from dsctl.services.provision import ProvisionInputs, provision
from dsctl.services.runtime import AnsiblePlaybookRunner

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventories" / "sample" / "hosts.yml"
HOSTS = ("atlas-a01", "atlas-a02")


def ev(event: str, host: str | None = None, task: str = "", role: str | None = "inference_service", **fields) -> dict:
    base = {"event": event, "task": task, "role": role}
    if host:
        base["host"] = host
    return {**base, **fields}


def stats(**hosts) -> dict:
    keys = ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored")
    return {"event": "stats", "hosts": {h: {k: c.get(k, 0) for k in keys} for h, c in hosts.items()}}


def deploy_events(report: dict[str, dict[str, str]]) -> list[dict]:
    events = [{"event": "playbook_start"}, {"event": "play_start", "play": "Deploy the inference instances"}]
    for host, instances in report.items():
        for name, status in instances.items():
            events += [ev("runner_start", host, f"Read the deployed fingerprint of {name}"),
                       ev("runner_changed", host, "Report a restarted instance",
                          facts={"inference_service_report": {name: status}})]
    return events


def test_deploy_hands_the_plan_to_the_play_and_reports_only_the_chosen_instances(fake_ansible, capsys):
    fake_ansible(0, [*deploy_events({"atlas-a01": {"chat-1": "restarted"}}), stats(**{h: {"ok": 2} for h in HOSTS})])
    code = main(["deploy", str(SAMPLE), "--instance", "chat-1", "--param", "chat.max_num_seqs=16", "--restart",
                 "--serial", "1", "--json"])
    envelope = json.loads(capsys.readouterr().out)
    assert code == 0, envelope
    rows = envelope["data"]["instances"]
    assert rows == [
        {"host": "atlas-a01", "instance": "chat-1", "engine": "vllm-ascend", "npus": "4,5,6,7", "port": 8001,
         "status": "restarted", "endpoint": "http://192.0.2.11:8001/v1"},
        {"host": "atlas-a02", "instance": "chat-1", "engine": "vllm-ascend", "npus": "4,5,6,7", "port": 8001,
         "status": "not reached", "endpoint": "http://192.0.2.12:8001/v1"}]
    argv = fake_ansible.argv()
    extra = json.loads(Path(argv[argv.index("-e") + 1].removeprefix("@")).read_text())
    plan = extra.pop("dsctl_plan")  # the per-host plan, computed once with the same overrides and choice
    assert (plan["version"], plan["fleet"], plan["overrides"], plan["only"]) == (
        1, list(HOSTS), {"chat": {"max_num_seqs": 16}}, ["chat-1"])
    assert plan["hosts"]["atlas-a01"]["settings"]["npu_count"] == 8
    assert plan["hosts"]["atlas-a02"]["stack"]["cann"] == "8.5.0"
    assert extra == {"dsctl_deploy_serial": 1, "dsctl_service_overrides": {"chat": {"max_num_seqs": 16}},
                     "dsctl_deploy_only": ["chat-1"], "dsctl_deploy_force_restart": True}
    assert envelope["command"] == ["deploy"] and envelope["data"]["check_mode"] is False


def test_a_bad_override_stops_deploy_before_any_play(fake_ansible, capsys, tmp_path):
    fake_ansible(0, [])
    code = main(["deploy", str(SAMPLE), "--param", "chat.max_num_seqz=16"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("dsctl: error: --param (host atlas-a01): service chat: params.max_num_seqz: unknown vllm-ascend "
                   "parameter; did you mean max_num_seqs?\n")
    assert not (tmp_path / "argv.json").exists()  # ansible-playbook never started


def test_provision_verb_called_directly_returns_a_frozen_result(fake_ansible, provisionable):
    report = {"status": "ok", "versions": {"driver": {"installed": "25.5.0", "running": "24.1.rc3"},
                                           "firmware": {"installed": "7.8.0.5.216"},
                                           "cann": {"active": "8.5.0", "installed": ["8.3.RC2", "8.5.0"]},
                                           "torch_npu": "2.8.0.post2", "vllm_ascend": "0.13.0"}}
    events = [{"event": "play_start", "play": "Provision NPU servers"},
              ev("runner_start", "atlas-a01", "Read the host", role="ascend_validate"),
              ev("runner_ok", "atlas-a01", "Read the host", role="ascend_validate",
                 facts={"ascend_validate_report": report}),
              ev("runner_unreachable", "atlas-a02", "Gather facts", role=None, msg="Failed to connect"),
              stats(**{"atlas-a01": {"ok": 1}, "atlas-a02": {"unreachable": 1}})]
    fake_ansible(4, events)
    seen: list[dict] = []
    result = provision(AnsiblePlaybookRunner(), ProvisionInputs(inventory=provisionable, forks=2), seen.append)
    assert [e["event"] for e in seen] == [e["event"] for e in events]
    assert result.exit_status == ExitStatus.HOSTS_UNREACHABLE and result.rerun == ("atlas-a02",)
    one, two = result.hosts
    assert (one.host, one.driver, one.cann, one.cann_others, one.status) == (
        "atlas-a01", "25.5.0 (running 24.1.rc3)", "8.5.0", "8.3.RC2", "ok")
    assert one.stack is not None and one.stack["cann"] == "8.5.0"
    assert (two.status, two.driver) == ("unreachable", "-")
    assert result.errors == ("atlas-a02: unreachable: Failed to connect",)
    assert result.to_dict()["hosts"][0]["driver"] == "25.5.0 (running 24.1.rc3)"
    with pytest.raises(AttributeError):
        result.exit_status = ExitStatus.OK  # type: ignore[misc]
    argv = fake_ansible.argv()
    assert "--forks" in argv
    extra = json.loads(Path(argv[argv.index("-e") + 1].removeprefix("@")).read_text())
    assert list(extra) == ["dsctl_plan"] and extra["dsctl_plan"]["fleet"] == list(HOSTS)
    assert extra["dsctl_plan"]["hosts"]["atlas-a01"]["stack"]["cann"] == one.stack["cann"]


def _report_events(host_reports: dict[str, dict]) -> list[dict]:
    events = [{"event": "play_start", "play": "Provision NPU servers"}]
    for host, report in host_reports.items():
        events.append(ev("runner_ok", host, "Read the host", role="ascend_validate",
                         facts={"ascend_validate_report": report}))
    return [*events, stats(**{h: {"ok": 1} for h in host_reports})]


REPORT = {"status": "ok", "findings": [], "npus": {},
          "versions": {"driver": {"installed": "25.5.0"}, "firmware": {"installed": "7.8.0.5.216"},
                       "cann": {"active": "8.5.0", "installed": ["8.5.0"]}, "torch_npu": "2.8.0.post2",
                       "vllm_ascend": "0.13.0"}}


def test_provision_shows_each_env_value_with_its_source_and_confidence(fake_ansible, capsys, provisionable):
    # the sample inventory applies the long-context profile (the field guide's memory env)
    fake_ansible(0, _report_events({h: REPORT for h in HOSTS}))
    code = main(["provision", str(provisionable)])
    out = re.sub(r" {2,}", " ", capsys.readouterr().out)  # the values are padded to one column
    assert code == 0, out
    assert "NPU env of atlas-a01, atlas-a02:" in out
    assert "ASCEND_CACHE_SIZE=6000000000 profile long-context; field guide; field practice, effect unknown" in out
    assert "GE_USE_STATIC_MEMORY=1 profile long-context; field guide; documented" in out
    assert "ASCEND_MAX_OP_CACHE_SIZE=1024 inventory; CANN reference; documented" in out  # the override wins
    warning = next(line for line in out.splitlines() if line.startswith("warning: ASCEND_CACHE_SIZE"))
    assert "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in warning


def test_check_marks_each_env_value_verified_or_drifted(fake_ansible, capsys):
    drift = {**REPORT, "status": "error", "findings": [
        {"severity": "error", "component": "env",
         "sentence": "GE_USE_STATIC_MEMORY is '0' in the env file, '1' wanted.",
         "fix": "Run dsctl provision to rewrite the env file.", "code": "env-changed"}]}
    fake_ansible(0, _report_events({"atlas-a01": REPORT, "atlas-a02": drift}))
    code = main(["check", str(SAMPLE), "--json"])
    hosts = {row["host"]: row for row in json.loads(capsys.readouterr().out)["data"]["hosts"]}
    assert code == 3
    states = {host: {e["name"]: e["state"] for e in row["env"]} for host, row in hosts.items()}
    assert set(states["atlas-a01"].values()) == {"verified"}
    assert (states["atlas-a02"]["GE_USE_STATIC_MEMORY"], states["atlas-a02"]["ASCEND_CACHE_SIZE"]) == (
        "drift", "verified")
    entry = next(e for e in hosts["atlas-a01"]["env"] if e["name"] == "ASCEND_CACHE_SIZE")
    assert (entry["value"], entry["source"], entry["confidence"]) == (
        "6000000000", "field guide", "field practice, effect unknown")

    fake_ansible(0, _report_events({"atlas-a01": REPORT, "atlas-a02": drift}))
    main(["check", str(SAMPLE)])
    out = re.sub(r" {2,}", " ", capsys.readouterr().out)
    assert "NPU env of atlas-a01:" in out and "NPU env of atlas-a02:" in out
    assert "GE_USE_STATIC_MEMORY=1 profile long-context; field guide; documented; drift" in out


@pytest.mark.parametrize(("env", "line"), [
    ("dsctl_ascend_env: {ASCEND_CACHE_SIZE: 6000000000000000}",
     "dsctl: error: inventory: 2 hosts (atlas-a01, atlas-a02): dsctl_ascend_env.ASCEND_CACHE_SIZE: expected an "
     "integer number of bytes from 1 to 1099511627776, got 6000000000000000; write a value in range, e.g. 6000000000"),
    ("dsctl_ascend_env_profile: long-contxt",
     "dsctl: error: inventory: 2 hosts (atlas-a01, atlas-a02): dsctl_ascend_env_profile: no profile 'long-contxt'; "
     "did you mean long-context?"),
])
def test_a_bad_env_value_stops_provision_before_any_host(fake_ansible, capsys, tmp_path, env, line):
    fake_ansible(0, [])
    inventory = tmp_path / "inventory"
    shutil.copytree(SAMPLE.parent, inventory)
    (inventory / "group_vars" / "npu_nodes" / "env.yml").write_text(env + "\n")
    code = main(["provision", str(inventory / "hosts.yml")])
    assert (code, capsys.readouterr().err) == (2, line + "\n")
    assert not (tmp_path / "argv.json").exists()  # ansible-playbook never started


def test_an_interrupted_deploy_names_the_instance_mid_rollout(fake_ansible):
    fake_ansible(0, deploy_events({"atlas-a01": {"chat-0": "unchanged"}})
                 + [ev("runner_start", "atlas-a01", "Read the deployed fingerprint of chat-1"),
                    ev("runner_start", "atlas-a01", "Wait until the instance serves (health, model list, one "
                                                    "completion)")], sleep=30)

    def interrupt_at_the_health_wait(event: dict) -> None:
        if event.get("task", "").startswith("Wait until"):
            raise KeyboardInterrupt  # what Ctrl-C (or SIGTERM, through app.main) does in the run loop

    started = time.monotonic()
    with pytest.raises(DeployInterrupted) as stopped:
        deploy(AnsiblePlaybookRunner(), DeployInputs(inventory=SAMPLE), interrupt_at_the_health_wait)
    assert time.monotonic() - started < 20  # the stand-in was stopped, not waited for
    assert stopped.value.exit_status == ExitStatus.INTERRUPTED
    assert str(stopped.value).startswith("deploy stopped during the rollout of chat-1 on atlas-a01 (at: Wait until")


DSCTL_DEPLOY = """\
import sys
from pathlib import Path
from dsctl import app
from dsctl.adapters import ansible_run
ansible_run.ansible_playbook_bin = lambda: Path(sys.argv[1])
sys.exit(app.main(["deploy", sys.argv[2]]))
"""


def test_sigterm_during_deploy_exits_130_naming_the_instance(fake_ansible, tmp_path):
    fake_ansible(0, [ev("runner_start", "atlas-a02", "Read the deployed fingerprint of chat-0"),
                     ev("runner_start", "atlas-a02", "Start or restart the instance")], sleep=60)
    parent = subprocess.Popen([sys.executable, "-c", DSCTL_DEPLOY, str(ansible_run.ansible_playbook_bin()),
                               str(SAMPLE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = tmp_path / "argv.json.pid"
    try:
        deadline = time.monotonic() + 30
        while not (events.is_file() and events.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the events are written and tailed
        parent.send_signal(signal.SIGTERM)
        _, stderr = parent.communicate(timeout=60)
    finally:
        parent.kill()
        parent.wait()
    assert parent.returncode == ExitStatus.INTERRUPTED, stderr
    assert stderr.strip().splitlines()[-1] == (
        "dsctl: interrupted: deploy stopped during the rollout of chat-0 on atlas-a02 (at: Start or restart the "
        "instance); run the same dsctl deploy again to finish or roll back that instance")


def test_vault_password_file_reaches_ansible(fake_ansible, tmp_path, capsys):
    fake_ansible(0, [stats(**{h: {"ok": 1} for h in HOSTS})])
    secret = tmp_path / "vault.txt"
    secret.write_text("correct horse\n")
    assert main(["check", str(SAMPLE), "--vault-password-file", str(secret), "--json"]) == 3  # no report: error
    argv = fake_ansible.argv()
    assert argv[argv.index("--vault-password-file") + 1] == str(secret)
    plan = json.loads(Path(argv[argv.index("-e") + 1].removeprefix("@")).read_text())["dsctl_plan"]
    assert plan["fleet"] == list(HOSTS) and plan["hosts"]["atlas-a01"]["settings"]["npu_count"] == 8
    # the sample's services hold a vaulted API key: their instances stay out of the file written to disk
    assert all(entry["instances"] is None for entry in plan["hosts"].values())
    assert main(["check", str(SAMPLE), "--vault-password-file", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.endswith("dsctl: error: --vault-password-file: "
                                            f"{tmp_path / 'nope'} is not a file\n")


def test_ask_vault_pass_prompts_once_and_leaves_no_password_behind(fake_ansible, monkeypatch, capsys, provisionable):
    fake_ansible(0, [stats(**{h: {"ok": 1} for h in HOSTS})])
    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or "s3cr3t vault pass")
    assert main(["provision", str(provisionable), "--ask-vault-pass", "--json"]) == 0
    assert prompts == ["Vault password: "]
    envelope = json.loads(capsys.readouterr().out)
    argv = fake_ansible.argv()
    password_file = Path(argv[argv.index("--vault-password-file") + 1])
    assert password_file.parent == Path(envelope["data"]["artifacts"])  # inside the run's own 0700 directory
    assert stat.S_IMODE(password_file.parent.stat().st_mode) == 0o700
    assert fake_ansible.vault_seen() == "s3cr3t vault pass\n"
    assert fake_ansible.vault_mode_seen() == 0o600  # while ansible-playbook ran
    assert not password_file.exists()
    assert all(b"s3cr3t" not in item.read_bytes() for item in password_file.parent.rglob("*") if item.is_file())
    assert not any("s3cr3t" in item for item in argv)
    assert not any("s3cr3t" in value for value in fake_ansible.env_seen().values())
    assert "s3cr3t" not in json.dumps(envelope)
    assert main(["provision", str(SAMPLE), "--ask-vault-pass", "--vault-password-file", str(SAMPLE)]) == 2
    assert capsys.readouterr().err.endswith("dsctl: error: --ask-vault-pass: give it or --vault-password-file, "
                                            "not both\n")
    assert prompts == ["Vault password: "]  # refused before any prompt


def test_ask_vault_pass_with_nothing_typed_is_refused_before_any_run(fake_ansible, monkeypatch, capsys):
    fake_ansible(0, [stats(**{h: {"ok": 1} for h in HOSTS})])
    monkeypatch.setattr("getpass.getpass", lambda prompt: "")
    assert main(["deploy", str(SAMPLE), "--ask-vault-pass"]) == ExitStatus.USAGE
    assert capsys.readouterr().err.endswith("dsctl: error: --ask-vault-pass: no password entered; type the vault "
                                            "password at the prompt or use --vault-password-file FILE\n")
    with pytest.raises(FileNotFoundError):
        fake_ansible.argv()  # ansible-playbook never started


def test_the_context_on_ctx_obj_is_what_commands_use(fake_ansible, capsys):
    """A context handed to main() replaces the default ports: here a runner with a timeout."""
    fake_ansible(0, [{"event": "play_start", "play": "x"}], sleep=30)
    started = time.monotonic()
    code = main(["check", str(SAMPLE)], context=AppContext(runner=AnsiblePlaybookRunner(timeout=0.5)))
    assert code == ExitStatus.TIMEOUT
    assert time.monotonic() - started < 20
    assert "check.yml did not finish within 0.5 s" in capsys.readouterr().err


def test_deploy_check_mode_rows_and_the_table(fake_ansible, capsys):
    fake_ansible(0, [*deploy_events({"atlas-a02": {"chat-0": "would restart"}}),
                     stats(**{h: {"ok": 2} for h in HOSTS})])
    assert main(["deploy", str(SAMPLE), "--check"]) == 0
    out = capsys.readouterr().out
    assert "dsctl deploy --check: 4 instances" in out
    cells = {tuple(line.split("│")[1:7]) for line in out.splitlines() if "atlas-" in line}
    statuses = {(row[0].strip(), row[1].strip()): row[5].strip() for row in cells}
    assert statuses == {("atlas-a01", "chat-0"): "checked", ("atlas-a01", "chat-1"): "checked",
                        ("atlas-a02", "chat-0"): "would restart", ("atlas-a02", "chat-1"): "checked"}
    assert "--check" in fake_ansible.argv()
