"""Run one of dsctl's playbooks with ansible-playbook and follow it through the dsctl_events callback.

ansible-playbook is the one from dsctl's own environment (next to sys.executable). Its human output
goes to <artifacts>/ansible.log; the callback plugin playbooks/callback_plugins/dsctl_events.py appends
one JSON event per line to <artifacts>/events.jsonl, which is tailed while the run goes and handed to
``on_event`` in order. Artifacts live under $XDG_STATE_HOME/dsctl/runs (never in the repository); the
newest KEEP_RUNS are kept.
"""

from __future__ import annotations

import configparser
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dsctl.adapters.inventory import VaultOptions, check_yaml_bounds
from dsctl.assets import ansible_cfg, asset_root
from dsctl.errors import DsctlError, EnvironmentUnsupported, ExitStatus, UsageError

CALLBACK = "dsctl_events"
KEEP_RUNS = 20
POLL_SECONDS = 0.1
LOG_TAIL_LINES = 20
INTERRUPT_GRACE_SECONDS = 30.0
# ssh's ControlPath is <dir>/<40-char %C hash> plus a 17-char temporary suffix; sun_path holds 107 bytes.
MAX_CONTROL_DIR_LEN = 45
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
VAULT_PASSWORD_FILE = "vault-password"  # in the run's artifacts directory, only while ansible-playbook runs
# ansible-playbook's own exit codes (ansible.errors.ExitCode).
RC_HOST_FAILED, RC_UNREACHABLE_OR_PARSER, RC_INVALID_OPTION, RC_INTERRUPTED = 2, 4, 5, 99

EventHandler = Callable[[dict[str, Any]], None]
_ERROR_LINE = re.compile(r"^(?:\[ERROR\]:|ERROR!|ansible-playbook: error:)\s*(.*)$")
_USAGE_LINE = re.compile(r"^ansible-playbook: error:", re.MULTILINE)


@dataclass
class HostOutcome:
    name: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    # The failure (or unreachable result) that stopped this host; earlier failures were rescued.
    failed_task: str | None = None
    failed_role: str | None = None
    failed_msg: str = ""
    failed_rc: int | None = None
    stdout_tail: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.unreachable:
            return "unreachable"
        return "changed" if self.changed else "ok"

    @property
    def failed_label(self) -> str | None:
        """``role : task`` as ansible prints it, or None."""
        if self.failed_task is None:
            return None
        return f"{self.failed_role} : {self.failed_task}" if self.failed_role else self.failed_task

    def to_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["status"] = self.status
        return data


@dataclass
class PlaybookRun:
    playbook: str
    rc: int
    artifacts: Path
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    plays: list[str] = field(default_factory=list)
    stats_seen: bool = False
    error: str = ""  # first ERROR line of ansible.log, "" if none
    log_tail: list[str] = field(default_factory=list)
    duration: float = 0.0

    @property
    def log(self) -> Path:
        return self.artifacts / "ansible.log"

    @property
    def events_file(self) -> Path:
        return self.artifacts / "events.jsonl"

    def hosts_with(self, status: str) -> list[str]:
        return [name for name, host in self.hosts.items() if host.status == status]

    def exit_status(self) -> ExitStatus:
        if self.rc == 0:
            return ExitStatus.OK
        if self.rc == RC_INTERRUPTED:
            return ExitStatus.INTERRUPTED
        if self.hosts_with("failed"):
            return ExitStatus.PLAYBOOK_FAILED
        if self.hosts_with("unreachable"):
            return ExitStatus.HOSTS_UNREACHABLE
        if self.stats_seen and self.rc in (RC_HOST_FAILED, RC_UNREACHABLE_OR_PARSER):
            return ExitStatus.PLAYBOOK_FAILED
        return ExitStatus.ERROR

    def to_dict(self) -> dict[str, Any]:
        return {"playbook": self.playbook, "rc": self.rc, "exit_status": int(self.exit_status()),
                "artifacts": str(self.artifacts), "plays": self.plays, "error": self.error,
                "duration": round(self.duration, 1), "hosts": {n: h.to_dict() for n, h in self.hosts.items()}}


class PlaybookError(DsctlError):
    """ansible-playbook could not run the playbook (syntax, options) or ran out of time; ``run`` has the artifacts."""

    def __init__(self, message: str, run: PlaybookRun, exit_status: ExitStatus | None = None):
        super().__init__(message, exit_status)
        self.run = run


class EventCollector:
    """Folds dsctl_events events into per-host outcomes; the stats event, when it comes, has the last word."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostOutcome] = {}
        self.plays: list[str] = []
        self.stats_seen = False

    def host(self, name: str) -> HostOutcome:
        return self.hosts.setdefault(name, HostOutcome(name))

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "play_start":
            self.plays.append(str(event.get("play", "")))
        elif kind == "stats":
            self._stats(event.get("hosts") or {})
        elif isinstance(kind, str) and kind.startswith("runner_") and kind != "runner_start" and event.get("host"):
            self._result(kind.removeprefix("runner_"), event)

    def _result(self, status: str, event: dict[str, Any]) -> None:
        host = self.host(str(event["host"]))
        host.facts.update(event.get("facts") or {})
        if self.stats_seen:
            return
        if status in ("ok", "changed"):
            host.ok += 1
            host.changed += status == "changed"
        elif status == "skipped":
            host.skipped += 1
        elif status == "failed" and event.get("ignore_errors"):
            host.ignored += 1
        elif status in ("failed", "unreachable"):
            if status == "failed":
                host.failed += 1
            else:
                host.unreachable += 1
            host.failed_task, host.failed_role = event.get("task"), event.get("role")
            host.failed_msg = str(event.get("msg") or "")
            host.failed_rc = event.get("rc")
            host.stdout_tail = list(event.get("stdout_tail") or [])
            host.stderr_tail = list(event.get("stderr_tail") or [])

    def _stats(self, stats: dict[str, dict[str, int]]) -> None:
        self.stats_seen = True
        for name, counts in stats.items():
            host = self.host(name)
            host.ok, host.changed = counts.get("ok", 0), counts.get("changed", 0)
            host.failed, host.unreachable = counts.get("failures", 0), counts.get("unreachable", 0)
            host.skipped, host.rescued = counts.get("skipped", 0), counts.get("rescued", 0)
            host.ignored = counts.get("ignored", 0)
            if not (host.failed or host.unreachable):  # a rescued failure is not the host's outcome
                host.failed_task = host.failed_role = None
                host.failed_msg, host.failed_rc, host.stdout_tail, host.stderr_tail = "", None, [], []


def collect(events: Iterable[dict[str, Any]]) -> EventCollector:
    collector = EventCollector()
    for event in events:
        collector.add(event)
    return collector


def first_error_line(log_text: str) -> str:
    lines = log_text.splitlines()
    for index, line in enumerate(lines):
        match = _ERROR_LINE.match(line.strip())
        if match:
            message = match.group(1).strip()
            # 2.19 may put the message on the following line(s).
            rest = (line2.strip() for line2 in lines[index + 1:index + 3])
            return message or next((text for text in rest if text), line.strip())
    return ""


def _state_home() -> Path:
    value = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says relative paths are invalid; ignoring them also keeps runs out of the checkout.
    return Path(value) if value and os.path.isabs(value) else Path.home() / ".local" / "state"


def runs_dir() -> Path:
    return _state_home() / "dsctl" / "runs"


OWNER_FILE = "owner"  # "<pid> <start time>" of the dsctl process that made the run directory


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def _owned_by_another_live_process(run: Path) -> bool:
    """Whether another dsctl process that still lives made ``run`` (it may still be writing or reading it)."""
    try:
        pid_text, start = (run / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return False
    return int(pid_text) != os.getpid() and _process_start(int(pid_text)) == start


def new_artifacts_dir(playbook: str) -> Path:
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = root / f"{stamp}-{Path(playbook).stem}-{secrets.token_hex(3)}"
    path.mkdir(mode=0o700)
    (path / OWNER_FILE).write_text(f"{os.getpid()} {_process_start(os.getpid())}\n")
    prune_runs(root, keep=KEEP_RUNS, current=path)
    return path


def prune_runs(root: Path, keep: int = KEEP_RUNS, current: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` run directories (names start with a sortable UTC stamp).

    A run whose dsctl process still lives is kept whatever its age: dsctl commands running side by side (two
    fleets, a tune's trial slots, a test suite's parallel labs) would otherwise delete each other's runs midway.
    """
    runs = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and p.name[:8].isdigit())
    removed = []
    for old in runs[: max(0, len(runs) - keep)]:
        if old != current and not _owned_by_another_live_process(old):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


def control_path_dir(artifacts: Path) -> tuple[Path, bool]:
    """(directory for ssh control sockets, whether it is a temporary one to remove afterwards)."""
    preferred = artifacts / "cp"
    if len(str(preferred)) <= MAX_CONTROL_DIR_LEN:
        preferred.mkdir(mode=0o700, exist_ok=True)
        return preferred, False
    return Path(tempfile.mkdtemp(prefix="dsctl-cp-", dir="/tmp")), True  # mkdtemp: mode 0700


def ansible_playbook_bin() -> Path:
    return Path(sys.executable).parent / "ansible-playbook"


def _cfg_default(key: str) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(ansible_cfg())
    except configparser.Error:
        return ""
    return parser.get("defaults", key, fallback="")


def _split(value: str, sep: str = ",") -> list[str]:
    return [item.strip() for item in value.split(sep) if item.strip()]


def build_env(artifacts: Path, control_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    root = asset_root()
    # These variables replace ansible.cfg's settings, so they carry what the user or ansible.cfg had.
    callbacks = _split(env.get("ANSIBLE_CALLBACKS_ENABLED", "") or _cfg_default("callbacks_enabled"))
    # Relative plugin dirs: the variable's against our working directory (ansible-playbook runs in the
    # artifacts dir), ansible.cfg's against the file's directory, as Ansible itself does.
    configured_dirs, base_dir = env.get("ANSIBLE_CALLBACK_PLUGINS", ""), Path.cwd()
    if not configured_dirs:
        configured_dirs, base_dir = _cfg_default("callback_plugins"), root
    plugin_dirs = [str(root / "playbooks" / "callback_plugins"),
                   *(str(base_dir / os.path.expanduser(d)) for d in _split(configured_dirs, ":"))]
    env.pop("ANSIBLE_FORCE_COLOR", None)
    env.update({
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(dict.fromkeys([*callbacks, CALLBACK])),
        "ANSIBLE_CALLBACK_PLUGINS": ":".join(dict.fromkeys(plugin_dirs)),
        "DSCTL_EVENTS_FILE": str(artifacts / "events.jsonl"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        "ANSIBLE_LOCAL_TEMP": str(artifacts / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def build_command(playbook_path: Path, inventory: Path, *, limit: str | None = None, check: bool = False,
                  diff: bool = False, tags: str | None = None, forks: int | None = None,
                  extra_vars_file: Path | None = None, vault_password_files: Iterable[Path] = ()) -> list[str]:
    argv = [str(ansible_playbook_bin()), "-i", str(inventory)]
    for password_file in vault_password_files:
        argv += ["--vault-password-file", str(password_file)]
    if limit:
        argv += ["--limit", limit]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    if tags:
        argv += ["--tags", tags]
    if forks:
        argv += ["--forks", str(forks)]
    if extra_vars_file is not None:
        argv += ["-e", f"@{extra_vars_file}"]
    return [*argv, str(playbook_path)]


def resolve_playbook(playbook: str) -> Path:
    """A name under playbooks/ (``provision.yml``), or an absolute path (tests)."""
    path = Path(playbook) if os.path.isabs(playbook) else asset_root() / "playbooks" / playbook
    if not path.is_file():
        raise DsctlError(f"playbook {playbook} is missing from {path.parent}; reinstall dsctl")
    return path


def write_extra_vars(artifacts: Path, extra_vars: dict[str, Any]) -> Path:
    path = artifacts / "extra_vars.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        json.dump(extra_vars, stream, indent=1, default=str)
    return path


class _EventTail:
    """Reads complete JSON lines appended to a file since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as stream:
                stream.seek(self._offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


def write_vault_password(artifacts: Path, vault: VaultOptions | None) -> Path | None:
    """With ``--ask-vault-pass``: the password the prompt got (asked here if nothing asked it yet), in a new 0600
    file of the run's 0700 artifacts directory, which `run_playbook` removes after the run; ansible-playbook runs
    without a terminal, so it cannot prompt itself.  Ansible strips the trailing newline when it reads the file."""
    password = vault.prompted_password() if vault is not None else None
    if password is None:
        return None
    path = artifacts / VAULT_PASSWORD_FILE
    path.unlink(missing_ok=True)  # a leftover of a killed run; O_EXCL below never writes through a planted link
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(password + "\n")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _stop(proc: subprocess.Popen, grace: float = INTERRUPT_GRACE_SECONDS) -> None:
    """SIGINT (ansible-playbook stops its workers and exits), then its process group is terminated."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    except KeyboardInterrupt:  # a second Ctrl-C: do not wait any longer
        _killpg(proc, signal.SIGKILL)
        proc.wait()
        raise
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _killpg(proc, sig):
            return
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


def _interrupt_when_parent_dies() -> None:
    """In the forked child: SIGINT it if dsctl dies, even by SIGKILL, so no playbook runs on unsupervised.

    SIGINT is set back to its default first: a dsctl started with SIGINT ignored (a background job of a
    non-interactive shell, nohup-like wrappers) would hand that on to ansible-playbook, which would then ignore
    both the parent-death signal and _stop's SIGINT (its own session keeps a terminal's Ctrl-C away anyway)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT)
    except (OSError, AttributeError):  # not Linux: the interrupt handlers still cover Ctrl-C and SIGTERM
        pass


def _killpg(proc: subprocess.Popen, sig: int) -> bool:
    try:
        os.killpg(proc.pid, sig)  # ansible-playbook leads its own process group (start_new_session)
        return True
    except ProcessLookupError:
        return False


def _tail_lines(path: Path, count: int = LOG_TAIL_LINES) -> tuple[str, list[str]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "", []
    return text, [line for line in text.splitlines() if line.strip()][-count:]


def run_playbook(
    playbook: str,
    inventory: Path,
    *,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    tags: str | None = None,
    forks: int | None = None,
    extra_vars: dict | None = None,
    vault: VaultOptions | None = None,
    on_event: EventHandler | None = None,
    artifacts_dir: Path | None = None,
    timeout: float | None = None,
    stop: threading.Event | None = None,
) -> PlaybookRun:
    """Run ``playbooks/<playbook>`` against ``inventory``; return per-host outcomes.

    Raises PlaybookError when ansible-playbook fails before any play starts (syntax, options, no hosts to
    target; its message is the first ERROR line of the log) or when ``timeout`` seconds pass.
    KeyboardInterrupt stops ansible-playbook (SIGINT, then TERM/KILL) and is re-raised; so does ``stop`` being set
    (a run in a worker thread, which no signal reaches: tune's trial slots), which then raises KeyboardInterrupt.
    ``vault``: the vault password file or the password asked for (without either, ansible-playbook still
    honours ANSIBLE_VAULT_PASSWORD_FILE).
    """
    playbook_path = resolve_playbook(playbook)
    inventory = Path(inventory).expanduser().absolute()
    if not inventory.exists():
        raise UsageError(f"inventory {inventory} does not exist")
    check_yaml_bounds(inventory)  # ansible-playbook would expand an alias bomb in full
    binary = ansible_playbook_bin()
    if not os.access(binary, os.X_OK):
        raise EnvironmentUnsupported(f"{binary} is missing; reinstall dsctl (it depends on ansible-core)")

    if artifacts_dir is None:
        artifacts = new_artifacts_dir(playbook)
    else:
        artifacts = Path(artifacts_dir).expanduser().absolute()
        artifacts.mkdir(parents=True, exist_ok=True, mode=0o700)
    (artifacts / "tmp").mkdir(mode=0o700, exist_ok=True)
    events_path = artifacts / "events.jsonl"
    os.close(os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    control_dir, control_is_temp = control_path_dir(artifacts)
    extra_vars_file = write_extra_vars(artifacts, extra_vars) if extra_vars else None
    collector = EventCollector()
    tail = _EventTail(events_path)

    def deliver() -> None:
        for event in tail.read():
            collector.add(event)
            if on_event is not None:
                on_event(event)

    timed_out = False
    prompted_file = None
    try:
        prompted_file = write_vault_password(artifacts, vault)
        password_files = [p for p in (vault.password_file if vault else None, prompted_file) if p is not None]
        argv = build_command(playbook_path, inventory, limit=limit, check=check, diff=diff, tags=tags, forks=forks,
                             extra_vars_file=extra_vars_file,
                             vault_password_files=[Path(p).expanduser().absolute() for p in password_files])
        env = build_env(artifacts, control_dir)
        started = time.monotonic()  # after the prompt, if write_vault_password had to ask: --timeout is the run's
        with (artifacts / "ansible.log").open("wb") as log:
            # Own session: a terminal Ctrl-C reaches dsctl only, which forwards one SIGINT; no tty for prompts.
            proc = subprocess.Popen(argv, cwd=artifacts, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_interrupt_when_parent_dies)
        try:
            while proc.poll() is None:
                deliver()
                if timeout is not None and time.monotonic() - started > timeout:
                    timed_out = True
                    _stop(proc)
                    break
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt  # handled below: ansible-playbook is stopped first
                time.sleep(POLL_SECONDS)
            deliver()
        except BaseException:  # KeyboardInterrupt, or on_event raised: never leave ansible-playbook behind
            _stop(proc)
            raise
    finally:
        if control_is_temp:
            shutil.rmtree(control_dir, ignore_errors=True)
        if prompted_file is not None:
            prompted_file.unlink(missing_ok=True)

    rc = proc.returncode
    log_text, log_tail = _tail_lines(artifacts / "ansible.log")
    run = PlaybookRun(playbook=playbook, rc=rc, artifacts=artifacts, hosts=collector.hosts, plays=collector.plays,
                      stats_seen=collector.stats_seen, error=first_error_line(log_text), log_tail=log_tail,
                      duration=time.monotonic() - started)
    _write_summary(run, argv)
    if timed_out:
        raise PlaybookError(f"{playbook} did not finish within {timeout:g} s; log: {run.log}", run,
                            ExitStatus.TIMEOUT)
    if rc not in (0, RC_INTERRUPTED) and not collector.plays:
        # Rejected before any play: syntax (rc 4), options (rc 5, or argparse's 2), no hosts to target (rc 1).
        message = run.error or (log_tail[-1] if log_tail else f"ansible-playbook exited {rc}")
        usage = rc == RC_INVALID_OPTION or (rc == RC_HOST_FAILED and _USAGE_LINE.search(log_text) is not None)
        raise PlaybookError(f"{playbook}: {message}", run, ExitStatus.USAGE if usage else ExitStatus.ERROR)
    return run


def _write_summary(run: PlaybookRun, argv: list[str]) -> None:
    summary = {"argv": argv, **run.to_dict()}
    try:
        (run.artifacts / "run.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    except OSError:
        pass
