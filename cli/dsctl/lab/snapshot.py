"""Lab snapshots: every host's disk and boards saved, and brought back as after a power cycle.

A lab host's disk is its upper layers (``hosts/<host>/disk/upper``, the overlays of /etc, /usr/local, /opt,
/var, /home and its own /root) and its boards' state (``hosts/<host>/hw``: health, flashed firmware, armed
faults).  ``save`` archives both for every host; ``restore`` powers each host off, puts the saved files back
and boots it, so what ran before the restore is stopped and what the saved disk starts at boot (supervisord
and the instances it supervises) runs again.

Why archives and not a copy of the directories: one file per host and part carries its sha256 in the
snapshot's manifest, so a damaged or edited snapshot is refused before any host is touched.  GNU tar keeps
what an overlay's upper layer is made of (whiteouts are 0/0 character devices, opaque directories an
extended attribute), which a plain file copy in Python would not.

Saving is consistent without stopping anything: the host's processes are frozen (SIGSTOP) for the moment the
archive takes, and a watchdog thaws them if dsctl dies in between.  Restoring replaces a host's files by
rename, so an interrupted restore leaves every host either as it was or as saved; a host left powered off by
an interruption is booted by the next ``restore`` (or ``lab up``).

Snapshots live under the lab's state directory (``snapshots/<name>``) and go with ``dsctl lab down``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dsctl.core.hostfacts.versionfiles import parse_key_value
from dsctl.core.lab.plan import LabHost, LabSpec
from dsctl.errors import DsctlError, UsageError
from dsctl.lab import hosts
from dsctl.lab.hosts import LabPaths, Progress

NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MANIFEST = "snapshot.json"
FORMAT = 1
PARTS = ("disk", "hw")  # hosts/<host>/disk/upper and hosts/<host>/hw
TAR_OPTIONS = ["--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"]
POWER_OFF_TIMEOUT_S = 20.0
FREEZE_WATCHDOG_S = 60  # a frozen host is thawed after this long whatever happens to dsctl
ARCHIVE_TIMEOUT_S = 600.0
MAX_SNAPSHOTS = 64


@dataclass(frozen=True)
class SnapshotInfo:
    name: str
    created: float
    hosts: list[str]
    size_bytes: int
    stacks: dict[str, dict[str, str]]  # host -> {"driver": ..., "cann": ...} as the saved files say


def _check_name(name: str) -> str:
    if not NAME_RULE.fullmatch(name):
        raise UsageError(f"NAME {name!r} is not a snapshot name: 1 to 64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def _snapshots_dir(paths: LabPaths) -> Path:
    return paths.root / "snapshots"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _part_dir(paths: LabPaths, host: str, part: str) -> Path:
    return paths.disk(host) / "upper" if part == "disk" else paths.hw_dir(host)


def _tar(args: list[str]) -> None:
    try:
        result = subprocess.run(["tar", *args], capture_output=True, text=True, timeout=ARCHIVE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise DsctlError(f"lab snapshot: tar did not finish in {ARCHIVE_TIMEOUT_S:.0f} s") from exc
    if result.returncode != 0:
        raise DsctlError(f"lab snapshot: tar failed: {result.stderr.strip()[-300:]}")


def _stack_of(upper: Path) -> dict[str, str]:
    """The driver and active CANN a saved disk holds, read from the files the installers wrote."""
    stack: dict[str, str] = {}
    driver = upper / "usr/local/Ascend/driver/version.info"
    if driver.is_file():
        stack["driver"] = parse_key_value(driver.read_text(errors="replace")).get("Version", "?")
    runtime = upper / "usr/local/Ascend/ascend-toolkit/latest/runtime"
    if runtime.is_symlink():
        stack["cann"] = os.readlink(runtime).split("/")[1] if "/" in os.readlink(runtime) else "?"
    return stack


# --- freezing a running host --------------------------------------------------------------------------------

def _host_processes(paths: LabPaths, host: LabHost) -> list[int]:
    """The host's own processes: everything in its network namespace but its unshare wrapper and PID 1."""
    keep = {hosts.init_pid(paths, host.name)}
    try:
        keep.add(int((paths.host_dir(host.name) / "unshare.pid").read_text()))
    except (OSError, ValueError):
        pass
    listing = hosts._run(["ip", "netns", "pids", host.netns], check=False).stdout.split()
    return [int(pid) for pid in listing if int(pid) not in keep]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@contextmanager
def _frozen(paths: LabPaths, host: LabHost) -> Iterator[None]:
    pids = _host_processes(paths, host)
    # The watchdog outlives a killed dsctl (its own session) and thaws the host; it is ended once thawed.
    watchdog = subprocess.Popen(
        ["sh", "-c", f'sleep {FREEZE_WATCHDOG_S}; kill -CONT "$@" 2>/dev/null', "sh", *map(str, pids)],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ) if pids else None
    _signal_all(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        _signal_all(pids, signal.SIGCONT)
        if watchdog is not None:
            os.killpg(watchdog.pid, signal.SIGKILL)
            watchdog.wait()


# --- save ---------------------------------------------------------------------------------------------------

def _save_host(paths: LabPaths, host: LabHost, target: Path) -> dict[str, dict[str, str]]:
    parts: dict[str, dict[str, str]] = {}
    with _frozen(paths, host):
        for part in PARTS:
            archive = target / f"{host.name}.{part}.tar"
            _tar(["--create", "--file", str(archive), *TAR_OPTIONS, "-C", str(_part_dir(paths, host.name, part)), "."])
    for part in PARTS:
        archive = target / f"{host.name}.{part}.tar"
        parts[part] = {"file": archive.name, "sha256": _sha256(archive)}
    return parts


def save(paths: LabPaths, spec: LabSpec, name: str, progress: Progress, *, replace: bool = False) -> SnapshotInfo:
    _check_name(name)
    base = _snapshots_dir(paths)
    final = base / name
    if final.exists() and not replace:
        raise UsageError(f"NAME: a snapshot {name!r} exists; pass --replace to overwrite it or choose another name")
    if not final.exists() and len(list_snapshots(paths)) >= MAX_SNAPSHOTS:
        raise UsageError(f"this lab holds {MAX_SNAPSHOTS} snapshots already; delete one first")
    down = [host.name for host in spec.members if hosts.init_pid(paths, host.name) is None]
    if down:
        raise DsctlError(f"lab host {down[0]} is powered off; run `dsctl lab up` (same options) before saving")
    staging = base / f".{name}.saving"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, mode=0o700)
    try:
        progress(f"snapshot {name}: saving {len(spec.members)} hosts")
        with ThreadPoolExecutor(max_workers=4) as pool:
            saved = dict(zip((h.name for h in spec.members),
                             pool.map(lambda host: _save_host(paths, host, staging), spec.members), strict=True))
        manifest = {
            "format": FORMAT, "name": name, "created": time.time(), "lab": spec.to_dict(), "hosts": saved,
            "stacks": {host.name: _stack_of(paths.disk(host.name) / "upper") for host in spec.members},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _info(final)


# --- restore ------------------------------------------------------------------------------------------------

def _manifest(paths: LabPaths, name: str) -> tuple[Path, dict]:
    _check_name(name)
    directory = _snapshots_dir(paths) / name
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        saved = ", ".join(info.name for info in list_snapshots(paths)) or "none"
        raise UsageError(f"NAME: no snapshot {name!r} in this lab (saved: {saved}); "
                         "`dsctl lab snapshot save NAME` makes one") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"NAME: snapshot {name!r} is corrupt (its {MANIFEST} cannot be read: {exc}); "
                         f"delete it with `dsctl lab snapshot delete {name}`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("hosts"), dict):
        raise UsageError(f"NAME: snapshot {name!r} is corrupt (its {MANIFEST} is not a format-{FORMAT} manifest); "
                         f"delete it with `dsctl lab snapshot delete {name}`")
    return directory, manifest


def verify(paths: LabPaths, spec: LabSpec, name: str) -> tuple[Path, dict]:
    """The snapshot's manifest, after checking it fits this lab and every archive is intact (nothing touched)."""
    directory, manifest = _manifest(paths, name)
    try:
        saved_spec = LabSpec.from_dict(dict(manifest["lab"]))
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"NAME: snapshot {name!r} is corrupt (no lab description); delete it") from None
    if not saved_spec.same_shape(spec):
        raise UsageError(f"NAME: snapshot {name!r} was saved on a lab of {saved_spec.hosts} x {saved_spec.chip} "
                         f"({saved_spec.subnet}); this lab is {spec.hosts} x {spec.chip} ({spec.subnet})")
    for host in spec.members:
        for part in PARTS:
            entry = manifest["hosts"].get(host.name, {}).get(part, {})
            archive = directory / str(entry.get("file", f"{host.name}.{part}.tar"))
            if not archive.is_file():
                raise UsageError(f"NAME: snapshot {name!r} is corrupt: {archive.name} is missing; delete it")
            got = _sha256(archive)
            if got != entry.get("sha256"):
                raise UsageError(f"NAME: snapshot {name!r} is corrupt: {archive.name} has sha256 {got[:12]}..., its "
                                 f"manifest says {str(entry.get('sha256'))[:12]}...; delete it")
    return directory, manifest


def power_off(paths: LabPaths, host: LabHost) -> None:
    """Stop every process of the host and release its mounts, as pulling the power does (the disk stays)."""
    pid = hosts.init_pid(paths, host.name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # PID 1 stops the others (TERM, then KILL) and exits
    deadline = time.monotonic() + POWER_OFF_TIMEOUT_S
    killed = False
    while True:
        left = [int(p) for p in hosts._run(["ip", "netns", "pids", host.netns], check=False).stdout.split()]
        if not left:
            return
        if time.monotonic() > deadline:
            raise DsctlError(f"lab host {host.name} did not power off within {POWER_OFF_TIMEOUT_S:.0f} s")
        if not killed and time.monotonic() > deadline - POWER_OFF_TIMEOUT_S / 2:
            _signal_all(left, signal.SIGKILL)
            killed = True
        time.sleep(0.05)


def _swap_in(archive: Path, live: Path) -> None:
    """Unpack next to the live directory, then swap by rename: the host has one or the other, never a mix."""
    fresh, old = live.with_name(live.name + ".restoring"), live.with_name(live.name + ".replaced")
    for leftover in (fresh, old):
        shutil.rmtree(leftover, ignore_errors=True)
    fresh.mkdir(mode=0o755)
    try:
        _tar(["--extract", "--file", str(archive), *TAR_OPTIONS, "-C", str(fresh)])
    except BaseException:  # a full disk, say: the live files stay as they are
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    live.rename(old)
    try:
        fresh.rename(live)
    except BaseException:
        old.rename(live)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _restore_host(paths: LabPaths, host: LabHost, directory: Path, entry: dict) -> None:
    power_off(paths, host)
    try:
        for part in PARTS:
            _swap_in(directory / entry[part]["file"], _part_dir(paths, host.name, part))
        work = paths.disk(host.name) / "work"
        shutil.rmtree(work, ignore_errors=True)  # overlayfs wants its work directories empty for new upper layers
    finally:
        hosts.start_init(paths, host)  # restored or not, the host is never left powered off


def restore(paths: LabPaths, spec: LabSpec, name: str, progress: Progress) -> SnapshotInfo:
    directory, manifest = verify(paths, spec, name)
    before = {host.name: (hosts.host_state(paths, host.name) or {}).get("boot_id") for host in spec.members}
    progress(f"snapshot {name}: restoring {len(spec.members)} hosts (power off, files back, boot)")
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda host: _restore_host(paths, host, directory, manifest["hosts"][host.name]),
                      spec.members))
    hosts.wait_until_booted(paths, spec.members, before)
    return _info(directory)


# --- list / delete ------------------------------------------------------------------------------------------

def _info(directory: Path) -> SnapshotInfo:
    manifest = json.loads((directory / MANIFEST).read_text())
    size = sum(path.stat().st_size for path in directory.iterdir() if path.is_file())
    return SnapshotInfo(name=manifest["name"], created=manifest["created"], hosts=sorted(manifest["hosts"]),
                        size_bytes=size, stacks=manifest.get("stacks", {}))


def list_snapshots(paths: LabPaths) -> list[SnapshotInfo]:
    base = _snapshots_dir(paths)
    if not base.is_dir():
        return []
    found = []
    for directory in sorted(base.iterdir()):
        if directory.name.startswith(".") or not directory.is_dir():
            continue
        try:
            found.append(_info(directory))
        except (OSError, ValueError, KeyError, TypeError):
            found.append(SnapshotInfo(directory.name, 0.0, [], 0, {"?": {"note": "corrupt manifest"}}))
    return found


def delete(paths: LabPaths, name: str) -> None:
    _check_name(name)
    directory = _snapshots_dir(paths) / name
    if not directory.is_dir():
        raise UsageError(f"NAME: no snapshot {name!r} in this lab; `dsctl lab snapshot list` shows the saved ones")
    shutil.rmtree(directory)
