"""What every emulated Ascend installer shares: flags, transcripts, logs, guards, staging.

Runs on lab hosts as root inside the extracted payload of a ``.run`` package
(see dsctl/lab/packages.py), standard library only.  The behaviours copy the
vendor scripts; each cites where it comes from (ascend-interfaces.md section
5 unless noted).  Anything marked "inferred" has no public sample.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ASCEND_ROOT = Path("/usr/local/Ascend")
INSTALL_INFO = Path("/etc/ascend_install.info")
CANN_INSTALL_INFO = Path("/etc/Ascend/ascend_cann_install.info")
# Concurrent-run guard of the driver scripts (driver install.sh: driverInStatusFile).
DRIVER_LOCK = Path("/dev/shm/driver_installing_status_tmp")
DEFAULT_USER = "HwHiAiUser"

# Flags the makeself header consumes; they reach the installer too (the vendor
# scripts filter them out the same way) and must not count as unknown.
MAKESELF_FLAGS = {"--nox11", "--noexec", "--keep", "--noprogress", "--nodiskspace", "--check", "--nochown"}
MAKESELF_VALUED = {"--extract", "--target"}


def log_dir() -> Path:
    # Non-root installs log under $HOME (CANN common_func.inc: COMM_LOG_DIR).
    if os.geteuid() == 0:
        return Path("/var/log/ascend_seclog")
    return Path.home() / "var/log/ascend_seclog"


def now() -> datetime:
    return datetime.now()


class InstallFailed(Exception):
    """Ends an installer run with ``rc``; the message was already printed."""

    def __init__(self, rc: int = 1):
        super().__init__(rc)
        self.rc = rc


# --------------------------------------------------------------------------- transcripts


@dataclass
class Transcript:
    """Vendor-formatted console lines, each also appended to the package's install log.

    Two house styles exist:
    * HDK (driver/firmware): ``[Driver] [2025-03-31 09:50:07] [INFO]Start time: ...`` (section 5.4);
    * CANN (toolkit/kernels/nnal): ``[Toolkit] [20230710-22:44:15] [INFO] LogFile:...``
      (public CANN 6.3.RC1 and 8.0.0 install logs, e.g. liguodongiot/llm-action
      docs/llm_localization/ascend910-env-install.md).
    """

    tag: str
    log_file: Path
    cann_style: bool = False
    quiet_console: bool = False
    lines: list[str] = field(default_factory=list)

    def _stamp(self) -> str:
        return now().strftime("%Y%m%d-%H:%M:%S" if self.cann_style else "%Y-%m-%d %H:%M:%S")

    def line(self, level: str, message: str) -> str:
        separator = " " if self.cann_style else ""
        return f"[{self.tag}] [{self._stamp()}] [{level}]{separator}{message}"

    def info(self, message: str) -> None:
        self.emit(self.line("INFO", message))

    def warning(self, message: str) -> None:
        self.emit(self.line("WARNING", message))

    def error(self, message: str) -> None:
        self.emit(self.line("ERROR", message))

    def emit(self, text: str, *, log: bool = True) -> None:
        """Print a line as is (also used for the scripts' bare ``ERR_NO`` echoes)."""
        if not self.quiet_console:
            print(text, flush=True)
        if log:
            self.log(text)

    def log(self, text: str) -> None:
        self.lines.append(text)
        append_line(self.log_file, text)

    def progress(self, percent: int, *, spaced: bool) -> None:
        # Driver prints "upgradePercentage:10%", firmware "upgradePercentage: 4%" (section 5.4).
        self.info(f"upgradePercentage:{' ' if spaced else ''}{percent}%")
        pause()


def append_line(path: Path, text: str) -> None:
    """Append to a log; a full disk must not turn a log write into a crash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o750)
        with open(path, "a") as handle:
            handle.write(text + "\n")
    except OSError:
        pass


def pause() -> None:
    """Optional pacing between progress steps, so concurrent runs overlap in the lab."""
    try:
        delay = float(os.environ.get("DSCTL_LAB_INSTALL_DELAY", "0"))
    except ValueError:
        delay = 0.0
    if delay > 0:
        time.sleep(delay)


def log_operation(
    operation: str,
    runfile: str,
    result: str,
    cmdlist: str,
    *,
    start: str,
    install_type: str | None = None,
    cann_style: bool = False,
) -> None:
    """One line in operation.log per run.

    Driver form (driver install.sh ``logOperation``):
    ``Install SUGGESTION root <start> 127.0.0.1 <run> success install_type=full; cmdlist=--full.``
    CANN form (CANN common_func.inc ``comm_log_operation``):
    ``Install SUGGESTION root <date> 127.0.0.1 <run> succeeded installmode=full; cmdlist=--full``
    """
    level = {"Install": "SUGGESTION", "Upgrade": "MINOR", "Uninstall": "MAJOR"}.get(operation, "UNKNOWN")
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", str(os.geteuid()))
    if cann_style:
        outcome = "succeeded" if result == "success" else result
        text = (
            f"{operation} {level} {user} {start} 127.0.0.1 {runfile} {outcome} "
            f"installmode={install_type or ''}; cmdlist={cmdlist}"
        )
    elif operation == "Install" and install_type:
        text = (
            f"{operation} {level} root {start} 127.0.0.1 {runfile} {result} "
            f"install_type={install_type}; cmdlist={cmdlist}."
        )
    else:
        text = f"{operation} {level} root {start} 127.0.0.1 {runfile} {result} cmdlist={cmdlist}."
    target = log_dir() / "operation.log"
    append_line(target, text)
    try:
        os.chmod(target, 0o640)
    except OSError:
        pass


# --------------------------------------------------------------------------- flags


class UnknownFlag(Exception):
    def __init__(self, flag: str):
        super().__init__(flag)
        self.flag = flag


@dataclass
class Flags:
    argv: list[str]
    switches: set[str] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.switches

    def value(self, name: str) -> str | None:
        return self.values.get(name)

    @property
    def cmdlist(self) -> str:
        return " ".join(self.argv)


def parse_flags(argv: Iterable[str], *, switches: Iterable[str], valued: Iterable[str]) -> Flags:
    """Split ``--name`` and ``--name=value`` flags; anything else raises UnknownFlag."""
    argv = list(argv)
    known_switches, known_valued = set(switches) | MAKESELF_FLAGS, set(valued) | MAKESELF_VALUED
    flags = Flags(argv=argv)
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name in known_valued:
            flags.values[name] = value
        elif not eq and name in known_switches:
            flags.switches.add(name)
        else:
            raise UnknownFlag(arg)
    return flags


def runfile_name() -> str:
    """Base name of the .run being executed, as the vendor logs name it."""
    return Path(os.environ.get("DSCTL_RUN_PACKAGE", "unknown.run")).name


# --------------------------------------------------------------------------- guards


def is_root() -> bool:
    return os.geteuid() == 0


@contextmanager
def driver_lock(path: Path = DRIVER_LOCK):
    """The driver scripts' lock: refuse when the status file exists, remove it on any exit.

    A run killed with SIGKILL leaves the file behind and blocks the next run, as on a real host.
    """
    # O_EXCL makes "exists? then create" atomic; FileExistsError reaches the caller.
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o440))
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def other_runs_of(package_prefix: str) -> list[int]:
    """PIDs of other processes running a ``<package_prefix>*.run`` (the scripts' ``ps -ef`` check).

    Only processes of this host count: lab hosts share the kernel's PID space
    with their neighbours only when /proc is not private, so compare mount
    namespaces too.
    """
    pattern = re.compile(r"(^|[\s/])" + re.escape(package_prefix) + r"[^\s/]*\.run(\s|$)")
    try:
        own_ns = os.readlink("/proc/self/ns/mnt")
    except OSError:
        own_ns = None
    skip, found = _ancestors(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if own_ns is not None and os.readlink(entry / "ns/mnt") != own_ns:
                continue
        except OSError:
            continue
        if any(pattern.search(arg.decode(errors="replace")) for arg in args if arg):
            found.append(int(entry.name))
    return found


def user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def user_in_group(user: str, group: str) -> bool:
    import grp
    import pwd

    try:
        entry, group_entry = pwd.getpwnam(user), grp.getgrnam(group)
    except KeyError:
        return False
    return entry.pw_gid == group_entry.gr_gid or user in group_entry.gr_mem


def install_failure_armed(component: str) -> bool:
    """The lab's injected installer fault for this component (consumed once)."""
    from dsctl.emu import hwstate

    if not hwstate.HW_DIR.is_dir():
        return False
    try:
        return hwstate.take_install_failure(component)
    except OSError:
        return False


def board_family() -> str | None:
    from dsctl.emu import hwstate

    try:
        board = hwstate.board()
    except (OSError, ValueError):
        return None
    return (board or {}).get("family")


def chip_count() -> int:
    from dsctl.emu import hwstate

    board = hwstate.board() or {}
    return len(board.get("npus", []))


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def ask_yes_no(prompt: str, transcript: Transcript) -> bool | None:
    """The scripts' ``read yn`` loop; None at end of input (a real run would spin forever)."""
    transcript.emit(prompt)
    while True:
        answer = sys.stdin.readline()
        if not answer:
            return None
        answer = answer.strip()
        if answer in ("y", "n"):
            return answer == "y"
        transcript.emit("ERR_NO:0x0002;ERR_DES:input error, please input again!")


# --------------------------------------------------------------------------- files


def write_file(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    os.chmod(path, mode)


def replace_file(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write next to the target, then rename over it: the old content survives a full disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.dsctl-new")
    try:
        write_file(temp, text, mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def replace_symlink(link: Path, target: str) -> None:
    temp = link.with_name(f".{link.name}.dsctl-new")
    temp.unlink(missing_ok=True)
    os.symlink(target, temp)
    os.replace(temp, link)


def remove_path(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


class StagedDir:
    """Build a directory beside its final place (same filesystem) and swap it in at commit.

    Until ``commit`` the previous content stays untouched, so a failure midway
    (injected fault, ENOSPC) leaves the old version installed.
    """

    def __init__(self, final: Path):
        self.final = final
        self.path = final.with_name(f".{final.name}.dsctl-staging-{os.getpid()}")
        self.committed = False
        self.entered = False

    def __enter__(self) -> StagedDir:
        # Re-entering keeps what was staged: a builder may stage, then hand the result to a `with`.
        if not self.entered:
            remove_path(self.path)
            self.path.mkdir(parents=True)
            self.entered = True
        return self

    def commit(self) -> None:
        old = self.final.with_name(f".{self.final.name}.dsctl-old-{os.getpid()}")
        if self.final.exists() or self.final.is_symlink():
            os.replace(self.final, old)
        os.replace(self.path, self.final)
        self.committed = True
        remove_path(old)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)


def copy_tree(source: Path, target: Path) -> None:
    """Copy files and symlinks one by one: shutil.copytree folds ENOSPC into a shutil.Error list."""
    for entry in sorted(source.rglob("*")):
        if "__pycache__" in entry.parts:
            continue
        destination = target / entry.relative_to(source)
        if entry.is_symlink():
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(entry), destination)
        elif entry.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry, destination)


def copy_installer(payload: Path, script_dir: Path) -> None:
    """Keep the installer code next to the installed component, for its uninstall.sh."""
    copy_tree(payload / "dsctl", script_dir / "pylib" / "dsctl")
    shutil.copy2(payload / "package.json", script_dir / "package.json")
    write_file(script_dir / "pylib" / "uninstall.py", UNINSTALL_LAUNCHER, 0o644)


UNINSTALL_LAUNCHER = '''\
"""Entry of script/uninstall.sh: the emulated vendor uninstaller (dsctl lab)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dsctl.emu.installer import uninstall_main  # noqa: E402

sys.exit(uninstall_main(HERE.parent, sys.argv[1:]))
'''

UNINSTALL_SH = """\
#!/bin/bash
# Uninstall {what} (emulated Ascend package, dsctl lab).
# Accepted: {accepted}
script_dir="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
exec /usr/bin/python3 "$script_dir/pylib/uninstall.py" "$@"
"""


def write_uninstall_script(script_dir: Path, what: str, accepted: str) -> None:
    write_file(script_dir / "uninstall.sh", UNINSTALL_SH.format(what=what, accepted=accepted), 0o755)
