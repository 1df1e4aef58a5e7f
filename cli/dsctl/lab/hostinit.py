"""PID 1 of a lab host.

Started by the lab controller as ``ip netns exec <ns> unshare -m -u -p -f
--mount-proc --propagation private --kill-child python -m dsctl.lab.hostinit``,
so it owns a network, mount, UTS and PID namespace.  It gives the host its own
disk (overlays of the system directories on the host's own tmpfs), boots it
(fresh /run, /tmp and /dev/shm, a new boot id, the driver that is installed now
is what gets "loaded", the flashed firmware becomes active, the driver re-applies
/etc/hccn.conf to the NPUs' RoCE ports), starts sshd and reaps orphans.

A reboot is SIGUSR1 to this process (the host's reboot command sends it):
every other process of the host is killed, the runtime filesystems are thrown
away and the host boots again.  SIGTERM powers it off.

Keep the imports to the standard library and the emulator modules: this runs
once per lab host and must start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from dsctl.core.hostfacts.versionfiles import parse_key_value
from dsctl.emu import hwstate, npu_net

# Directories a role or installer writes to; each host gets its own view of them.
OVERLAID_DIRS = ("etc", "usr/local", "opt", "var", "home")
# Directories a host has of its own, with nothing of the controller's below: root's home (a fresh server's root
# has the distribution's dotfiles, not the controller user's shell setup, PATH or tools).
OWN_DIRS = ("root",)
RUNTIME_DIRS = ("/run", "/tmp", "/dev/shm")
DRIVER_VERSION_FILE = Path("/usr/local/Ascend/driver/version.info")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
STATE_FILE = "state.json"


class _Reboot(Exception):
    pass


class _PowerOff(Exception):
    pass


HOST_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGTERM, signal.SIGINT})
BOOT_ATTEMPTS = 5


def _raise(exc: type[Exception]):
    def handler(_signum, _frame):
        # Block before raising: a second reboot signal (the reboot helper repeats until it is killed) landing
        # before the except clause runs would otherwise escape it and end PID 1, which kills the host.
        signal.pthread_sigmask(signal.SIG_BLOCK, HOST_SIGNALS)
        raise exc()

    return handler


def _run(*cmd: str, **kwargs) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def mount_disk(host_dir: Path) -> None:
    """Overlay each system directory with this host's upper layer, bind its own ones (done once per power-on)."""
    disk = host_dir / "disk"
    for directory in OVERLAID_DIRS:
        upper, work = disk / "upper" / directory, disk / "work" / directory
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir=/{directory},upperdir={upper},workdir={work}", f"/{directory}")
    for directory in OWN_DIRS:
        own = disk / "upper" / directory
        own.mkdir(parents=True, exist_ok=True)
        _run("mount", "--bind", str(own), f"/{directory}")


def mount_runtime(hw_fd: int) -> str:
    """Fresh /run, /tmp, /dev/shm and boot id, as every boot starts with.

    The new /run hides the lab's own state directory (it lives under the
    controller's /run), so the hardware directory is reached through an open
    descriptor instead of its path.
    """
    _run("mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "lab-run", "/run")
    _run("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "lab-tmp", "/tmp")
    _run("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "lab-shm", "/dev/shm")
    for directory in (hwstate.HW_DIR, Path("/run/sshd"), Path("/run/lock")):
        directory.mkdir(parents=True, exist_ok=True)
    _run("mount", "--bind", f"/proc/self/fd/{hw_fd}", str(hwstate.HW_DIR), pass_fds=(hw_fd,))
    boot_id = str(uuid.uuid4())
    boot_id_file = hwstate.LAB_RUN_DIR / "boot_id"
    boot_id_file.write_text(boot_id + "\n")
    _run("mount", "--bind", str(boot_id_file), BOOT_ID_PATH)
    return boot_id


def unmount_runtime() -> None:
    for target in (BOOT_ID_PATH, *RUNTIME_DIRS):
        subprocess.run(["umount", "-l", target], check=False, stderr=subprocess.DEVNULL)


def load_driver_and_firmware(boot_id: str) -> None:
    """What the kernel loads at boot: the driver installed now, the firmware flashed now."""
    driver = None
    if DRIVER_VERSION_FILE.is_file():
        fields = parse_key_value(DRIVER_VERSION_FILE.read_text())
        driver = {
            "version": fields.get("Version", ""),
            "compatible_version_fw": fields.get("compatible_version_fw", ""),
        }
    hwstate.save_running(
        {"boot_id": boot_id, "driver": driver, "firmware": hwstate.flashed_firmware()}
    )


def recover_npu_network() -> None:
    """The NPUs' ports start every boot with nothing; the driver, if one is loaded, re-applies /etc/hccn.conf:
    its device_boot_init.sh runs network_cfg_recovery (driver/tools/network.sh -> hccn_tool -cfg recovery) for each
    device (hicann/driver scripts/package/driver/common/scripts/device_boot_init.sh).  Here the installed driver's
    own hccn_tool does it, once for all devices (``-a -cfg recovery``)."""
    ctx = npu_net.Context.default()
    try:
        npu_net.flush(ctx)
    except OSError as problem:
        print(f"dsctl-lab-init: NPU plane: {problem}", file=sys.stderr, flush=True)
    if not ctx.driver_loaded() or not npu_net.HCCN_TOOL.is_file():
        return
    try:
        if not npu_net.HCCN_CONF.read_text().strip():
            return  # nothing to recover: spare the boot a process
    except OSError:
        return
    try:
        subprocess.run([str(npu_net.HCCN_TOOL), "-a", "-cfg", "recovery"], check=False, env=BOOT_ENV,
                       stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError) as problem:  # a broken driver leaves the NPUs unset, not the host
        print(f"dsctl-lab-init: hccn_tool -a -cfg recovery: {problem}", file=sys.stderr, flush=True)


def power_off_npu_network() -> None:
    """A powered-off server's NPUs answer nobody: their addresses leave the wire with the power."""
    try:
        npu_net.flush(npu_net.Context.default())
    except OSError:
        pass


# The distribution's supervisor package starts supervisord at boot (Debian's supervisor.service, enabled on install)
# with this file, which includes /etc/supervisor/conf.d/*.conf: a host whose instances run under supervisor gets
# them back after a reboot, as a real one does.  A host with no program there skips it (nothing would run; it
# saves a process per lab host, and the role starts supervisord itself when it finds none).
SUPERVISOR_CONF = Path("/etc/supervisor/supervisord.conf")
SUPERVISOR_PROGRAMS = Path("/etc/supervisor/conf.d")
BOOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def start_boot_services() -> None:
    if SUPERVISOR_CONF.is_file() and any(SUPERVISOR_PROGRAMS.glob("*.conf")):
        # supervisord daemonizes; PID 1 reaps what it leaves behind.
        # With an init system's clean environment, not the one `dsctl lab up` ran with.
        subprocess.run(["supervisord", "-c", str(SUPERVISOR_CONF)], check=False, env=BOOT_ENV,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_sshd() -> int:
    # -D keeps sshd in the foreground as our child, so a reboot can stop it with the rest.
    process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"])
    return process.pid


def write_state(host_fd: int, state: dict) -> None:
    payload = (json.dumps(state) + "\n").encode()
    fd = os.open(".state.json.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=host_fd)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    os.rename(".state.json.tmp", STATE_FILE, src_dir_fd=host_fd, dst_dir_fd=host_fd)


def boot(hostname: str, hw_fd: int, host_fd: int, boots: int) -> None:
    boot_id = mount_runtime(hw_fd)
    _run("hostname", hostname)
    load_driver_and_firmware(boot_id)
    recover_npu_network()
    sshd_pid = start_sshd()
    start_boot_services()
    write_state(host_fd, {"boot_id": boot_id, "boots": boots, "sshd_pid": sshd_pid, "booted_at": time.time()})


def stop_everything_else() -> None:
    """Kill every process of the host but this one, like a reboot does."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.02)


def reap_forever() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsctl-lab-init")
    parser.add_argument("--host-dir", required=True, type=Path)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--boots-before", type=int, default=0, help="boots of earlier power-ons (a power cycle)")
    args = parser.parse_args(argv)
    if os.getpid() != 1:
        print("dsctl.lab.hostinit must run as PID 1 of a lab host's namespaces", file=sys.stderr)
        return 2

    host_fd = os.open(args.host_dir, os.O_RDONLY | os.O_DIRECTORY)
    hw_fd = os.open(args.host_dir / "hw", os.O_RDONLY | os.O_DIRECTORY)
    mount_disk(args.host_dir)
    signal.signal(signal.SIGUSR1, _raise(_Reboot))
    signal.signal(signal.SIGTERM, _raise(_PowerOff))
    signal.signal(signal.SIGINT, _raise(_PowerOff))

    boots = args.boots_before + 1
    boot(args.hostname, hw_fd, host_fd, boots)
    while True:
        try:
            reap_forever()
        except _Reboot:
            boots += 1
            reboot(args.hostname, hw_fd, host_fd, boots)
            # A reboot asked for while this one ran is satisfied by it; a power-off is not.
            while signal.SIGUSR1 in signal.sigpending():
                signal.sigtimedwait({signal.SIGUSR1}, 0)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HOST_SIGNALS)
        except _PowerOff:
            stop_everything_else()
            power_off_npu_network()
            return 0


def reboot(hostname: str, hw_fd: int, host_fd: int, boots: int) -> None:
    """Stop everything and boot again; a failed boot is retried, as a watchdog would, instead of ending PID 1."""
    for attempt in range(1, BOOT_ATTEMPTS + 1):
        stop_everything_else()
        unmount_runtime()
        try:
            boot(hostname, hw_fd, host_fd, boots)
            return
        except (OSError, subprocess.SubprocessError) as problem:
            print(f"dsctl-lab-init: boot {boots} attempt {attempt} failed: {problem}", file=sys.stderr, flush=True)
            time.sleep(1)
    raise SystemExit(f"dsctl-lab-init: boot {boots} failed {BOOT_ATTEMPTS} times; the host stays down")


if __name__ == "__main__":
    raise SystemExit(main())
