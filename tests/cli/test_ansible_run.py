"""The ansible-playbook edge without Ansible: event folding, exit statuses, artifacts, streaming, the plugin itself."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from dsctl.adapters import ansible_run
from dsctl.adapters.ansible_run import PlaybookError, PlaybookRun, collect, first_error_line
from dsctl.assets import asset_root
from dsctl.errors import ExitStatus
from dsctl.ui_progress import PlaybookProgress

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "playbooks" / "callback_plugins" / "dsctl_events.py"


def result(event, host, task="Install the CANN toolkit", role="cann", **fields):
    return {"event": event, "host": host, "task": task, "role": role, "changed": event == "runner_changed",
            "failed": event == "runner_failed", "ignore_errors": False, "msg": "", "rc": None,
            "stdout_tail": [], "stderr_tail": [], **fields}


def stats(**hosts):
    keys = ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored")
    return {"event": "stats", "hosts": {h: {k: counts.get(k, 0) for k in keys} for h, counts in hosts.items()}}


PLAY = [
    {"event": "playbook_start", "playbook": "provision.yml"},
    {"event": "play_start", "play": "Provision NPU servers"},
    {"event": "task_start", "task": "Install the CANN toolkit", "role": "cann", "action": "ansible.builtin.command"},
    result("runner_ok", "lab-01", facts={"ascend_driver_version": "24.1.rc3"}),
    result("runner_changed", "lab-01", facts={"ascend_driver_version": "25.0.rc1", "dsctl_report": {"a": 1}}),
    result("runner_failed", "lab-02", msg="non-zero return code", rc=3,
           stdout_tail=["step 9", "installer: checksum mismatch"], stderr_tail=["boom"]),
    result("runner_unreachable", "lab-03", task="Gather facts", role=None, msg="Failed to connect to the host"),
    result("runner_skipped", "lab-01"),
]


def test_outcomes_from_events_without_stats():
    hosts = collect(PLAY).hosts
    assert {n: h.status for n, h in hosts.items()} == {"lab-01": "changed", "lab-02": "failed",
                                                        "lab-03": "unreachable"}
    assert (hosts["lab-01"].ok, hosts["lab-01"].changed, hosts["lab-01"].skipped) == (2, 1, 1)
    failed = hosts["lab-02"]
    assert (failed.failed_task, failed.failed_role, failed.failed_label) == (
        "Install the CANN toolkit", "cann", "cann : Install the CANN toolkit")
    assert failed.failed_msg == "non-zero return code" and failed.failed_rc == 3
    assert failed.stdout_tail[-1] == "installer: checksum mismatch" and failed.stderr_tail == ["boom"]
    assert hosts["lab-03"].failed_msg == "Failed to connect to the host"
    # Later facts override earlier ones.
    assert hosts["lab-01"].facts == {"ascend_driver_version": "25.0.rc1", "dsctl_report": {"a": 1}}


def test_stats_have_the_last_word_and_rescued_failures_are_forgotten():
    events = [*PLAY, stats(**{"lab-01": {"ok": 5, "changed": 2, "failures": 0, "rescued": 1},
                              "lab-02": {"ok": 1, "failures": 1}, "lab-03": {"unreachable": 1}})]
    events.insert(3, result("runner_failed", "lab-01", task="Probe", msg="rescued later"))
    collector = collect(events)
    assert collector.stats_seen
    one = collector.hosts["lab-01"]
    assert (one.ok, one.changed, one.failed, one.rescued, one.status) == (5, 2, 0, 1, "changed")
    assert one.failed_task is None and one.failed_msg == ""
    assert collector.hosts["lab-02"].failed_task == "Install the CANN toolkit"


def test_ignored_failures_do_not_fail_the_host():
    collector = collect([result("runner_failed", "lab-01", ignore_errors=True)])
    host = collector.hosts["lab-01"]
    assert (host.failed, host.ignored, host.status, host.failed_task) == (0, 1, "ok", None)


def run_with(rc, events, **kw):
    collector = collect(events)
    return PlaybookRun(playbook="p.yml", rc=rc, artifacts=Path("/nonexistent"), hosts=collector.hosts,
                       plays=collector.plays, stats_seen=collector.stats_seen, **kw)


@pytest.mark.parametrize(
    ("rc", "events", "expected"),
    [
        (0, [*PLAY[:2], stats(**{"lab-01": {"ok": 3}})], ExitStatus.OK),
        (2, [*PLAY[:2], result("runner_failed", "lab-02"), stats(**{"lab-02": {"failures": 1}})],
         ExitStatus.PLAYBOOK_FAILED),
        (4, [*PLAY[:2], result("runner_unreachable", "lab-03"), stats(**{"lab-03": {"unreachable": 1}})],
         ExitStatus.HOSTS_UNREACHABLE),
        # Failed and unreachable hosts together: the playbook failed.
        (6, [*PLAY, stats(**{"lab-02": {"failures": 1}, "lab-03": {"unreachable": 1}})], ExitStatus.PLAYBOOK_FAILED),
        (4, [*PLAY[:2], stats(**{"lab-01": {"ok": 1}})], ExitStatus.PLAYBOOK_FAILED),
        (1, [*PLAY[:3]], ExitStatus.ERROR),
        (250, [], ExitStatus.ERROR),
        (99, PLAY[:2], ExitStatus.INTERRUPTED),
    ],
)
def test_exit_status(rc, events, expected):
    assert run_with(rc, events).exit_status() == expected


def test_first_error_line():
    log = "PLAY [x]\n[WARNING]: meh\n[ERROR]: conflicting action statements: debug, bogus\nOrigin: /p.yml:4\n"
    assert first_error_line(log) == "conflicting action statements: debug, bogus"
    assert first_error_line("ERROR! the playbook: x.yml could not be found\n") == (
        "the playbook: x.yml could not be found")
    assert first_error_line("usage: ...\nansible-playbook: error: bad --forks\n") == "bad --forks"
    assert first_error_line("all good\n") == ""


def test_artifacts_default_under_xdg_state_and_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made = [ansible_run.new_artifacts_dir("provision.yml") for _ in range(ansible_run.KEEP_RUNS + 3)]
    runs = sorted((tmp_path / "state" / "dsctl" / "runs").iterdir())
    assert len(runs) == ansible_run.KEEP_RUNS
    assert runs == made[-ansible_run.KEEP_RUNS:]
    assert made[-1].name[:8].isdigit() and made[-1].name[-17:-6] == "-provision-"
    assert stat.S_IMODE(made[-1].stat().st_mode) == 0o700
    # A relative XDG_STATE_HOME is invalid (and would land in the working tree): ~/.local/state instead.
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ansible_run.runs_dir() == tmp_path / "home" / ".local" / "state" / "dsctl" / "runs"


def test_a_run_of_another_live_dsctl_is_never_pruned(tmp_path, monkeypatch):
    """dsctl commands side by side (two fleets, parallel test labs) must not delete each other's runs midway."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        theirs = ansible_run.new_artifacts_dir("deploy.yml")
        start = ansible_run._process_start(other.pid)
        (theirs / ansible_run.OWNER_FILE).write_text(f"{other.pid} {start}\n")  # as the other process wrote it
        gone = ansible_run.new_artifacts_dir("deploy.yml")
        (gone / ansible_run.OWNER_FILE).write_text(f"{other.pid} 1\n")  # an earlier process with that pid
        made = [ansible_run.new_artifacts_dir("provision.yml") for _ in range(ansible_run.KEEP_RUNS + 2)]
        runs = sorted((tmp_path / "state" / "dsctl" / "runs").iterdir())
        assert theirs in runs and gone not in runs
        assert runs == sorted([theirs, *made[-ansible_run.KEEP_RUNS:]])
    finally:
        other.communicate(b"")
    ansible_run.new_artifacts_dir("provision.yml")  # the other process ended: its run goes like any other
    assert theirs not in sorted((tmp_path / "state" / "dsctl" / "runs").iterdir())


def test_control_path_dir_is_short(tmp_path):
    long_dir = tmp_path / ("x" * 60)
    long_dir.mkdir()
    cp, temporary = ansible_run.control_path_dir(long_dir)
    try:
        assert temporary and len(str(cp)) <= ansible_run.MAX_CONTROL_DIR_LEN and str(cp).startswith("/tmp/")
        assert stat.S_IMODE(cp.stat().st_mode) == 0o700
    finally:
        cp.rmdir()


def test_env_and_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSIBLE_FORCE_COLOR", "1")
    env = ansible_run.build_env(tmp_path, tmp_path / "cp", base={"ANSIBLE_FORCE_COLOR": "1",
                                                                "ANSIBLE_CALLBACKS_ENABLED": "profile_tasks",
                                                                "ANSIBLE_CALLBACK_PLUGINS": "/opt/cb"})
    root = asset_root()
    assert "ANSIBLE_FORCE_COLOR" not in env and env["ANSIBLE_NOCOLOR"] == "1"
    assert env["ANSIBLE_CALLBACKS_ENABLED"] == "profile_tasks,dsctl_events"
    assert env["ANSIBLE_CALLBACK_PLUGINS"] == f"{root}/playbooks/callback_plugins:/opt/cb"
    assert env["ANSIBLE_CONFIG"] == str(root / "ansible.cfg")
    assert env["DSCTL_EVENTS_FILE"] == str(tmp_path / "events.jsonl")
    assert env["ANSIBLE_LOCAL_TEMP"] == str(tmp_path / "tmp")
    argv = ansible_run.build_command(root / "playbooks" / "npu_info.yml", Path("/inv.yml"), limit="lab-01",
                                     check=True, diff=True, tags="cann", forks=4,
                                     extra_vars_file=tmp_path / "extra_vars.json")
    assert argv[0] == str(Path(sys.executable).parent / "ansible-playbook")
    assert argv[1:] == ["-i", "/inv.yml", "--limit", "lab-01", "--check", "--diff", "--tags", "cann", "--forks", "4",
                        "-e", f"@{tmp_path / 'extra_vars.json'}", str(root / "playbooks" / "npu_info.yml")]


def test_run_streams_events_in_order_and_keeps_secrets_off_the_command_line(fake_ansible):
    events = [*PLAY, stats(**{"lab-01": {"ok": 2, "changed": 1}, "lab-02": {"failures": 1},
                              "lab-03": {"unreachable": 1}})]
    inventory = fake_ansible(2, events)
    seen = []
    run = ansible_run.run_playbook("npu_info.yml", inventory, extra_vars={"password": "s3cr3t-value"},
                                   on_event=seen.append)
    assert [e["event"] for e in seen] == [e["event"] for e in events]
    assert run.rc == 2 and run.exit_status() == ExitStatus.PLAYBOOK_FAILED
    assert run.hosts["lab-02"].failed_task == "Install the CANN toolkit"
    assert not run.artifacts.is_relative_to(REPO)
    argv = fake_ansible.argv()
    assert "s3cr3t-value" not in " ".join(argv)
    extra = run.artifacts / "extra_vars.json"
    assert argv[argv.index("-e") + 1] == f"@{extra}"
    assert json.loads(extra.read_text()) == {"password": "s3cr3t-value"}
    assert stat.S_IMODE(extra.stat().st_mode) == 0o600
    assert (run.artifacts / "ansible.log").read_text().startswith("PLAY [fake]")
    assert json.loads((run.artifacts / "run.json").read_text())["rc"] == 2


def test_rejected_before_any_play_raises_with_the_error_line(fake_ansible):
    inventory = fake_ansible(4, [{"event": "playbook_start"}],
                             log="[ERROR]: conflicting action statements: debug, bogus\nOrigin: x")
    with pytest.raises(PlaybookError) as caught:
        ansible_run.run_playbook("npu_info.yml", inventory)
    assert str(caught.value) == "npu_info.yml: conflicting action statements: debug, bogus"
    assert caught.value.exit_status == ExitStatus.ERROR and caught.value.run.rc == 4

    inventory = fake_ansible(5, [], log="[ERROR]: Unable to use --limit with that")
    with pytest.raises(PlaybookError) as caught:
        ansible_run.run_playbook("npu_info.yml", inventory)
    assert caught.value.exit_status == ExitStatus.USAGE


def test_crash_mid_run_is_an_error_with_the_log_tail(fake_ansible):
    inventory = fake_ansible(250, PLAY[:3], log="PLAY [x]\nTraceback...\n[ERROR]: Unexpected Exception")
    run = ansible_run.run_playbook("npu_info.yml", inventory)
    assert run.exit_status() == ExitStatus.ERROR
    assert run.error == "Unexpected Exception" and run.log_tail[-1] == "[ERROR]: Unexpected Exception"


def test_timeout_stops_ansible(fake_ansible):
    inventory = fake_ansible(0, PLAY[:2], sleep=30)
    with pytest.raises(PlaybookError) as caught:
        ansible_run.run_playbook("npu_info.yml", inventory, timeout=0.5)
    assert caught.value.exit_status == ExitStatus.TIMEOUT
    assert caught.value.run.plays == ["Provision NPU servers"]


def test_interrupt_stops_ansible_and_reraises(fake_ansible, monkeypatch):
    inventory = fake_ansible(0, PLAY[:2], sleep=30)
    started = []
    real_popen = ansible_run.subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def interrupt(event):
        if event["event"] == "play_start":
            raise KeyboardInterrupt

    monkeypatch.setattr(ansible_run.subprocess, "Popen", recording_popen)
    with pytest.raises(KeyboardInterrupt):
        ansible_run.run_playbook("npu_info.yml", inventory, on_event=interrupt)
    assert started and started[0].poll() is not None


# dsctl as its own process, driving the fake ansible-playbook: a signal to dsctl must not leave the playbook running.
# The inventory is the sample one, validated for real (ansible-inventory); only the playbook binary is a stand-in.
DSCTL_PARENT = """\
import sys
from pathlib import Path
from dsctl import app
from dsctl.adapters import ansible_run
ansible_run.ansible_playbook_bin = lambda: Path(sys.argv[1])
sys.exit(app.main(["check", sys.argv[2]]))
"""
SAMPLE_INVENTORY = REPO / "inventories" / "sample" / "hosts.yml"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux prctl")
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["", "started-with-sigint-ignored"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_dsctl_takes_its_playbook_down(fake_ansible, tmp_path, signum, sigint_ignored):
    """Also when dsctl was started with SIGINT ignored (a background job of a script): ansible-playbook gets the
    default disposition back, else it would ignore the parent-death signal and run on."""
    inventory = fake_ansible(0, PLAY[:2], sleep=60)
    assert inventory.is_file()  # the fake's spec is written; dsctl itself gets the sample inventory
    parent = subprocess.Popen([sys.executable, "-c", DSCTL_PARENT, str(ansible_run.ansible_playbook_bin()),
                               str(SAMPLE_INVENTORY)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_ignore_sigint if sigint_ignored else None)
    pid_file = tmp_path / "argv.json.pid"
    try:
        assert _wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), 30), parent.stderr
        playbook_pid = int(pid_file.read_text())
        parent.send_signal(signum)
        stdout, stderr = parent.communicate(timeout=60)
        assert _wait_for(lambda: not _alive(playbook_pid)), "ansible-playbook outlived dsctl"
    finally:
        parent.kill()
        parent.wait()
    if signum == signal.SIGTERM:  # dsctl itself saw it as an interrupt
        assert parent.returncode == ExitStatus.INTERRUPTED and "dsctl: interrupted" in stderr, stdout + stderr


def test_missing_inventory_and_playbook(tmp_path):
    with pytest.raises(ansible_run.UsageError):
        ansible_run.run_playbook("npu_info.yml", tmp_path / "nope.yml")
    with pytest.raises(ansible_run.DsctlError, match="missing"):
        ansible_run.run_playbook("no_such_playbook.yml", tmp_path / "nope.yml")


def test_progress_plain_lines():
    out = io.StringIO()
    progress = PlaybookProgress(Console(file=out, width=200, color_system=None), live=False)
    for event in [*PLAY, stats()]:
        progress(event)
    lines = out.getvalue().splitlines()
    assert lines[0] == "PLAY Provision NPU servers"
    assert lines[1] == "TASK cann : Install the CANN toolkit"
    assert "lab-01  changed      cann : Install the CANN toolkit" in lines
    assert "lab-02  failed       cann : Install the CANN toolkit: non-zero return code" in lines
    assert "lab-03  unreachable  Gather facts: Failed to connect to the host" in lines
    assert not any("skipped" in line or " ok " in line for line in lines)


def test_progress_live_rows():
    out = io.StringIO()
    with PlaybookProgress(Console(file=out, width=200, force_terminal=True), live=True) as progress:
        for event in PLAY:
            progress(event)
        assert set(progress._rows) == {"lab-01", "lab-02", "lab-03"}
        assert progress._progress is not None
        assert progress._progress.tasks[progress._rows["lab-01"]].completed == 3
    assert progress._progress is None


# The plugin itself, driven with stand-ins for ansible's objects.

def load_plugin():
    spec = importlib.util.spec_from_file_location("dsctl_events_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(data, *, host="lab-01", name="Use a secret", no_log=False):
    task = SimpleNamespace(name=name, action="ansible.builtin.command", no_log=no_log, _role=None)
    return SimpleNamespace(result=data, task=task, host=SimpleNamespace(get_name=lambda: host))


@pytest.fixture
def plugin(tmp_path):
    module = load_plugin()
    callback = module.CallbackModule()
    callback._path = str(tmp_path / "events.jsonl")

    def events():
        return [json.loads(line) for line in Path(callback._path).read_text().splitlines()]

    callback.events = events
    return callback


def test_plugin_hides_no_log_results(plugin):
    secret = "hunter2-do-not-print"
    plugin.v2_runner_on_ok(fake_result({"changed": True, "stdout": secret, "msg": secret}, no_log=True))
    plugin.v2_runner_on_failed(fake_result({"failed": True, "stdout": secret, "_ansible_no_log": True}))
    plugin.v2_runner_on_ok(fake_result({"results": [{"stdout": secret, "_ansible_no_log": True}]}))
    text = Path(plugin._path).read_text()
    assert secret not in text
    events = plugin.events()
    assert [e["event"] for e in events] == ["runner_changed", "runner_failed", "runner_ok"]
    assert all(e["msg"] == "output hidden (no_log)" and "stdout_tail" not in e for e in events)
    assert stat.S_IMODE(os.stat(plugin._path).st_mode) == 0o600


def test_plugin_result_fields(plugin):
    stdout = "\n".join(f"installer log line {i}" for i in range(1, 31))
    plugin.v2_runner_on_failed(fake_result({"failed": True, "rc": 3, "msg": "non-zero return code\nsecond line",
                                            "stdout": stdout, "stderr": "E: broken",
                                            "ansible_facts": {"ascend_x": 1, "dsctl_report": "r", "other": 2}}),
                               ignore_errors=True)
    loop = {"changed": False, "failed": True, "msg": "One or more items failed",
            "results": [{"rc": 0, "stdout": "fine"}, {"failed": True, "rc": 2, "msg": "item broke", "stdout": "x"}]}
    plugin.v2_runner_on_failed(fake_result(loop))
    first, second = plugin.events()
    assert first["stdout_tail"] == [f"installer log line {i}" for i in range(11, 31)]
    assert first["stderr_tail"] == ["E: broken"] and first["rc"] == 3 and first["ignore_errors"] is True
    assert first["msg"] == "non-zero return code second line"
    assert first["facts"] == {"ascend_x": 1, "dsctl_report": "r"}
    assert (second["msg"], second["rc"], second["stdout_tail"]) == ("item broke", 2, ["x"])


def test_plugin_is_inert_without_events_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    callback = load_plugin().CallbackModule()
    callback.v2_runner_on_ok(fake_result({"changed": False}))
    assert list(tmp_path.iterdir()) == []


def test_plugin_documentation_is_valid_yaml():
    import yaml

    doc = yaml.safe_load(load_plugin().DOCUMENTATION)
    assert doc["name"] == "dsctl_events" and doc["type"] == "aggregate"
    assert doc["options"]["events_file"]["env"] == [{"name": "DSCTL_EVENTS_FILE"}]


def test_the_prompted_vault_password_goes_to_a_new_0600_file_never_through_a_planted_link(tmp_path, monkeypatch):
    from dsctl.adapters.inventory import VaultOptions

    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or "typed secret")
    artifacts = tmp_path / "run"
    artifacts.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched\n")
    (artifacts / ansible_run.VAULT_PASSWORD_FILE).symlink_to(elsewhere)  # e.g. left by someone with access
    vault = VaultOptions(ask=True)
    path = ansible_run.write_vault_password(artifacts, vault)
    assert path == artifacts / ansible_run.VAULT_PASSWORD_FILE and not path.is_symlink()
    assert path.read_text() == "typed secret\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert elsewhere.read_text() == "untouched\n"
    assert ansible_run.write_vault_password(artifacts, vault) == path and prompts == ["Vault password: "]
    assert ansible_run.write_vault_password(artifacts, None) is None
    assert ansible_run.write_vault_password(artifacts, VaultOptions(password_file=elsewhere)) is None
