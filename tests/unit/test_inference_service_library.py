"""roles/inference_service/library: the per-fingerprint snapshots and the stack/state reader, on real files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[2] / "roles" / "inference_service" / "library"
P = "a" * 64
C = "c" * 64


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, LIBRARY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snapshot = load("inference_service_snapshot")
facts = load("inference_service_facts")


@pytest.fixture
def instance(tmp_path):
    directory = tmp_path / "services" / "chat-0"
    directory.mkdir(parents=True)
    (directory / "launch.sh").write_text("exec vllm serve --max-num-seqs 16\n")
    (directory / "service.env").write_text("VLLM_API_KEY=secret-key-123\n")
    os.chmod(directory / "service.env", 0o600)
    unit = tmp_path / "conf.d" / "dsctl-chat-0.conf"
    unit.parent.mkdir()
    unit.write_text("[program:dsctl-chat-0]\n")
    return directory, [str(directory / "launch.sh"), str(directory / "service.env"), str(unit)]


def test_kept_files_are_restored_byte_for_byte_with_their_modes(instance):
    directory, files = instance
    originals = {path: Path(path).read_bytes() for path in files}
    changed, manifest = snapshot.keep(str(directory), P, files)
    assert changed and [entry["path"] for entry in manifest["files"]] == files
    assert manifest["files"][1]["mode"] == "0600"
    assert (directory / ".dsctl-good").stat().st_mode & 0o777 == 0o700
    assert snapshot.keep(str(directory), P, files)[0] is False  # kept and verified already
    for path in files:  # the candidate overwrites everything, one file is even removed
        Path(path).write_text("candidate\n")
    os.chmod(files[1], 0o644)
    os.unlink(files[2])
    snapshot.restore(str(directory), P)
    assert {path: Path(path).read_bytes() for path in files} == originals
    assert Path(files[1]).stat().st_mode & 0o777 == 0o600


def test_a_snapshot_that_does_not_match_its_manifest_is_never_restored(instance):
    directory, files = instance
    snapshot.keep(str(directory), P, files)
    (directory / ".dsctl-good" / P / "files" / "0").write_text("tampered\n")
    Path(files[0]).write_text("candidate\n")
    with pytest.raises(snapshot.SnapshotError, match="does not match the manifest"):
        snapshot.restore(str(directory), P)
    assert Path(files[0]).read_text() == "candidate\n"  # nothing was put back
    with pytest.raises(snapshot.SnapshotError, match="no readable manifest"):
        snapshot.verify(str(directory), C)


def test_a_backup_that_cannot_be_written_fails_and_leaves_no_partial_snapshot(instance):
    directory, files = instance
    (directory / ".dsctl-good").write_text("")  # a file where the directory must go
    with pytest.raises(OSError):
        snapshot.keep(str(directory), P, files)
    (directory / ".dsctl-good").unlink()
    with pytest.raises(FileNotFoundError):
        snapshot.keep(str(directory), P, [*files, str(directory / "missing")])
    assert os.listdir(directory / ".dsctl-good") == []


def test_prune_keeps_the_newest_and_never_the_one_in_use(instance):
    directory, files = instance
    names = [f"{i:x}" * 64 for i in range(1, 6)]
    for age, name in enumerate(names):
        snapshot.keep(str(directory), name, files)
        manifest = directory / ".dsctl-good" / name / "manifest.json"
        os.utime(manifest, (1000 + age, 1000 + age))
    (directory / ".dsctl-good" / ".tmp-left-by-a-crash").mkdir()
    removed = snapshot.prune(str(directory), names[0], 3)
    assert sorted(os.listdir(directory / ".dsctl-good")) == sorted([names[0], names[4], names[3]])
    assert sorted(removed) == sorted(names[1:3])


def test_facts_read_the_stack_and_the_rollout_state(tmp_path, instance):
    directory, files = instance
    toolkit = tmp_path / "Ascend" / "ascend-toolkit"
    (toolkit / "8.3.RC2" / "x86_64-linux").mkdir(parents=True)
    (toolkit / "8.3.RC2" / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=8.3.RC2\n")
    (toolkit / "latest").symlink_to("8.3.RC2")
    site = tmp_path / "venvs" / "v1" / "lib" / "python3.11" / "site-packages"
    (site / "vllm_ascend-0.11.0.dist-info").mkdir(parents=True)
    (site / "torch-2.7.1.dist-info").mkdir()
    (tmp_path / "serving-venv").symlink_to(tmp_path / "venvs" / "v1")
    env = tmp_path / "dsctl-ascend.sh"
    env.write_text("export A=1\n")
    (directory / ".dsctl-fingerprint").write_text(P + "\n")
    (directory / ".dsctl-pending").write_text(json.dumps({"candidate": C, "manager": "supervisor",
                                                          "unit": "dsctl-chat-0", "unit_file": files[2]}))
    snapshot.keep(str(directory), P, files)
    (directory.parent / "not-an-instance").mkdir()
    (directory.parent / "other-0").mkdir()  # never rolled out: no fingerprint, no marker

    stack = facts.read_stack([str(tmp_path / "Ascend")], str(env), [str(tmp_path / "serving-venv"),
                                                                    str(tmp_path / "missing")])
    assert stack["cann"][str(tmp_path / "Ascend")] == {"latest": str(toolkit / "8.3.RC2"), "version": "8.3.RC2"}
    assert stack["env_file"]["sha256"] == hashlib.sha256(b"export A=1\n").hexdigest()
    assert stack["venvs"][str(tmp_path / "serving-venv")] == {
        "real": str(tmp_path / "venvs" / "v1"), "pins": ["torch==2.7.1", "vllm-ascend==0.11.0"]}
    assert stack["venvs"][str(tmp_path / "missing")] is None

    state = facts.read_instances(str(directory.parent))
    assert list(state) == ["chat-0"]
    assert state["chat-0"]["fingerprint"] == P and state["chat-0"]["pending"]["candidate"] == C
    assert state["chat-0"]["good"] == [P]
    assert state["chat-0"]["meta"]["manager"] == "supervisor"
    (directory / ".dsctl-pending").write_text("{trunc")
    assert facts.read_instances(str(directory.parent))["chat-0"]["pending"] == {"unreadable": True}


marker = load("inference_service_marker")


def test_marker_moves_pending_to_good_and_clears_last(instance):
    directory, _ = instance
    marker.mark(str(directory), "pending", content={"candidate": C, "manager": "supervisor"})
    pending = directory / ".dsctl-pending"
    assert json.loads(pending.read_text()) == {"candidate": C, "manager": "supervisor"}
    assert pending.stat().st_mode & 0o777 == 0o600
    state = facts.read_instances(str(directory.parent))["chat-0"]
    assert state["pending"]["candidate"] == C and state["fingerprint"] == ""
    marker.mark(str(directory), "good", fingerprint=C, content={"unit": "dsctl-chat-0"})
    assert not pending.exists() and (directory / ".dsctl-fingerprint").read_text() == C + "\n"
    assert json.loads((directory / ".dsctl-instance.json").read_text()) == {"unit": "dsctl-chat-0"}
    assert sorted(os.listdir(directory)) == [".dsctl-fingerprint", ".dsctl-instance.json", "launch.sh",
                                             "service.env"]  # no temporary file left
    assert marker.mark(str(directory), "cleared") is False
    with pytest.raises(ValueError, match="64 hex digits"):
        marker.mark(str(directory), "good", fingerprint="abc")


def test_the_facts_read_accounts_with_their_groups_and_directories_with_owner_and_mode(tmp_path):
    import grp
    import os
    import pwd

    me = pwd.getpwuid(os.getuid())
    account = facts.read_account(me.pw_name)
    assert account["uid"] == me.pw_uid and account["shell"] == me.pw_shell
    assert grp.getgrgid(me.pw_gid).gr_name in account["groups"]
    assert facts.read_account("dsctl-no-such-user-x") is None
    directory = tmp_path / "logs"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)
    assert facts.read_directory(str(directory)) == {"isdir": True, "uid": os.getuid(), "gid": os.getgid(),
                                                    "mode": "0750"}
    (tmp_path / "file").write_text("")
    assert facts.read_directory(str(tmp_path / "file"))["isdir"] is False
    assert facts.read_directory(str(tmp_path / "absent")) is None


def test_the_facts_resolve_the_role_s_paths_as_the_host_sees_them_and_the_path_rule_refuses_a_detour(tmp_path):
    # The role's last check before it makes and archives instance directories as root: the module resolves the
    # paths in the run that reads the host anyway, and the filter judges them by the inventory schema's rule.
    import subprocess
    import sys

    sys.path.insert(0, str(LIBRARY.parents[2] / "playbooks" / "filter_plugins"))
    try:
        from dsctl_filters import root_path_problems
    finally:
        sys.path.pop(0)
    link = tmp_path / "dsctl-services"
    link.symlink_to("/usr/lib")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"config_dir": str(tmp_path / "absent"),
                                                        "resolve": [str(link), str(tmp_path / "new" / "logs")]}}))
    answer = subprocess.run([sys.executable, str(LIBRARY / "inference_service_facts.py"), str(args)],
                            capture_output=True, text=True, timeout=60)
    resolved = json.loads(answer.stdout)["resolved"]
    assert resolved == ["/usr/lib", str(tmp_path.resolve() / "new" / "logs")]
    paths = [{"field": "dsctl_service_config_dir", "path": str(link)},
             {"field": "dsctl_service_log_dir", "path": [str(tmp_path / "new" / "logs")]}]
    (problem,) = root_path_problems(paths, resolved)
    assert problem.startswith("dsctl_service_config_dir: ") and "/usr/lib" in problem
