"""The emulated NPU driver and firmware installers (Ascend-hdk-910b-npu-{driver,firmware}_*.run).

Standard library only; runs as root on a lab host.  Behaviour follows the
vendor's driver install.sh (public copy quoted below as "driver install.sh")
and the transcripts of ascend-interfaces.md section 5.4:

* driver: ``--full`` fresh install, ``--upgrade`` in place; ``--full`` over an
  existing driver asks "do you want to continue installing?" unless
  ``--quiet`` and then overwrites (driver install.sh "覆盖安装场景");
  ``--install-path`` is not honoured (Ascend/ascend-deployer README: the driver
  only installs to /usr/local/Ascend).  The new driver is only *installed*: the
  running one changes at the next boot (section 6.4), so hwstate.running() is
  never touched.
* firmware: needs the driver's upgrade-tool (Ascend/ascend-deployer
  task_firmware.yml "driver not installed, please install driver first"),
  flashes the NPUs (hwstate.flash_firmware; active at next boot).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dsctl.core.hostfacts import versionfiles as vf
from dsctl.emu import runpkg
from dsctl.emu.runpkg import ASCEND_ROOT, INSTALL_INFO, InstallFailed, Transcript

DRIVER_DIR = ASCEND_ROOT / "driver"
FIRMWARE_DIR = ASCEND_ROOT / "firmware"
UPGRADE_TOOL = DRIVER_DIR / "tools" / "upgrade-tool"
NPU_SMI = Path("/usr/local/bin/npu-smi")
DCMI_DIR = Path("/usr/local/dcmi")
# The driver's installer links its hccn_tool into /usr/bin (host_servers_setup.sh bin_config) and creates an empty
# /etc/hccn.conf, mode 0644, owned by root (run_driver_install.sh changeMode), which uninstalling leaves in place
# (host_servers_remove.sh removes only the link; hicann/driver scripts/package/driver/common/scripts).  A lab host's
# /usr/bin is the base system every host and the controller share, so the lab's link is in /usr/local/bin.
HCCN_TOOL_LINK = Path("/usr/local/bin/hccn_tool")
HCCN_CONF = Path("/etc/hccn.conf")

DRIVER_SWITCHES = {
    "--full",
    "--upgrade",
    "--run",
    "--docker",
    "--quiet",
    "--install-for-all",
    "--help",
    "--version",
}
DRIVER_VALUED = {"--install-username", "--install-usergroup", "--install-path"}
FIRMWARE_SWITCHES = {"--full", "--upgrade", "--quiet", "--help"}
DRIVER_MODES = ("--full", "--run", "--docker", "--upgrade")

FIRMWARE_UPGRADE_HELPER = """\
#!/bin/sh
# Query the flashed firmware through the driver's upgrade-tool (emulated package, dsctl lab).
# Its name starts with "upgrade" because tools detect an installed firmware by such a file
# (Ascend/ascend-deployer task_firmware.yml: find /usr/local/Ascend/firmware -regex upgrade).
exec /usr/local/Ascend/driver/tools/upgrade-tool --device_index -1 --system_version
"""

# Library file names of a real driver (lib64/common and lib64/driver, section 1); content is a marker.
DRIVER_LIBRARIES = (
    "lib64/common/libc_sec.so",
    "lib64/common/libmmpa.so",
    "lib64/driver/libascend_hal.so",
    "lib64/driver/libdrvdsmi_host.so",
    "lib64/driver/libdcmi.so",
)
DCMI_FILES = ("dcmi_interface_api.h", "libdcmi.so")


def _usage_error(transcript: Transcript, flag: str | None) -> InstallFailed:
    # driver install.sh errorUsage
    if flag is None:
        transcript.emit("ERR_NO:0x0004;ERR_DES: Unrecognized parameters. Try './xxx.run --help' for more information.")
    else:
        transcript.emit(
            f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {flag}. Try './xxx.run --help' for more information."
        )
    return InstallFailed(1)


def _installed_version(directory: Path) -> str | None:
    try:
        return vf.parse_key_value((directory / "version.info").read_text()).get("Version") or None
    except OSError:
        return None


def firmware_upgrade_record() -> Path | None:
    """The first ``firmware/**/upgrade*`` file: the installed firmware's upgrade record (ascend-deployer
    task_firmware.yml finds it with ``find /usr/local/Ascend/firmware -regex '.*upgrade.*'``)."""
    found = sorted(FIRMWARE_DIR.glob("**/upgrade*")) if FIRMWARE_DIR.is_dir() else []
    return found[0] if found else None


def _install_info_text() -> str:
    try:
        return INSTALL_INFO.read_text()
    except FileNotFoundError:
        return ""


def _check_chip(transcript: Transcript, family: str, what: str) -> None:
    found = runpkg.board_family()
    if found is None:
        # inferred wording: no public sample of the driver on a host without NPUs
        transcript.error(f"ERR_NO:0x0092;ERR_DES:no Ascend NPU was found on this device, {what} failed")
        raise InstallFailed(1)
    if found != family:
        # inferred wording: no public sample of a 910b package run on another board
        transcript.error(
            f"ERR_NO:0x0092;ERR_DES:the package is for Ascend {family} chips but this device "
            f"has Ascend {found} chips, {what} failed"
        )
        raise InstallFailed(1)


# =========================================================================== driver


def install_driver(pkg: dict, payload: Path, argv: list[str]) -> int:
    transcript = Transcript("Driver", runpkg.log_dir() / "ascend_install.log")
    try:
        flags = runpkg.parse_flags(argv, switches=DRIVER_SWITCHES, valued=DRIVER_VALUED)
    except runpkg.UnknownFlag as unknown:
        return _usage_error(transcript, unknown.flag).rc
    if not argv:
        return _usage_error(transcript, None).rc
    if flags.has("--help"):
        print(DRIVER_HELP)
        return 0
    if flags.has("--version"):
        print(f"driver version :{pkg['driver']['version']}")
        return 0
    if not runpkg.is_root():
        transcript.emit(
            "ERR_NO:0x0093;ERR_DES:do not have root permission, install failed, please use root permission!",
            log=False,
        )
        return 1
    try:
        with runpkg.driver_lock():
            if runpkg.other_runs_of(pkg["package_prefix"]):
                transcript.emit(CONCURRENT_RUN)
                return 1
            return _DriverRun(pkg, payload, flags, transcript).run()
    except FileExistsError:
        transcript.emit(CONCURRENT_RUN)
        return 1


CONCURRENT_RUN = (
    "ERR_NO:0x0094;ERR_DES:There is already a process being executed,"
    "please do not execute multiple tasks at the same time"
)

DRIVER_HELP = """\
Usage: ./Ascend-hdk-910b-npu-driver_<version>_linux-<arch>.run [options]
  --full                      install the driver (fresh install)
  --upgrade                   upgrade the installed driver
  --quiet                     do not ask questions
  --install-for-all           let every user use the driver
  --install-username=<user>   run user (default HwHiAiUser), with --install-usergroup
  --install-usergroup=<group> run user group (default HwHiAiUser)
  --check                     verify the package only
Uninstall: /usr/local/Ascend/driver/script/uninstall.sh [--quiet]"""


class _DriverRun:
    def __init__(self, pkg: dict, payload: Path, flags: runpkg.Flags, transcript: Transcript):
        self.pkg, self.payload, self.flags, self.t = pkg, payload, flags, transcript
        self.start = runpkg.now().strftime("%Y-%m-%d %H:%M:%S")
        self.operation = "Upgrade" if flags.has("--upgrade") else "Install"
        self.install_type = "full"

    def fail(self, message: str | None = None) -> InstallFailed:
        if message:
            self.t.error(message)
        runpkg.log_operation(
            self.operation,
            runpkg.runfile_name(),
            "failed",
            self.flags.cmdlist,
            start=self.start,
            install_type=self.install_type,
        )
        self.t.info(f"End time: {runpkg.now().strftime('%Y-%m-%d %H:%M:%S')}")
        return InstallFailed(1)

    def run(self) -> int:
        t = self.t
        t.info(f"Start time: {self.start}")
        t.info(f"LogFile: {t.log_file}")
        t.info(f"OperationLogFile: {t.log_file.parent / 'operation.log'}")
        t.log(f"[INFO]UserCommand: {runpkg.runfile_name()} {self.flags.cmdlist}")
        try:
            self._validate()
            return self._install()
        except InstallFailed as failed:
            return failed.rc

    def _validate(self) -> None:
        flags, t = self.flags, self.t
        modes = [mode for mode in DRIVER_MODES if flags.has(mode)]
        if len(modes) > 1:
            t.emit("[ERROR]ERR_NO:0x0004;ERR_DES:only support one type: full/run/docker/upgrade, operation failed!")
            raise self.fail()
        if not modes:
            t.emit("ERR_NO:0x0004;ERR_DES:quiet param need used with full/run/docker/upgrade.")
            raise self.fail()
        self.install_type = {"--run": "run", "--docker": "docker"}.get(modes[0], "full")
        if modes[0] == "--upgrade":
            # An upgrade keeps the recorded install type (driver install.sh: Driver_Install_Type).
            self.install_type = vf.parse_key_value(_install_info_text()).get("Driver_Install_Type") or "full"
        user, group = flags.value("--install-username"), flags.value("--install-usergroup")
        if (user is None) != (group is None):
            t.emit(
                "ERR_NO:0x0004;ERR_DES:Input username and usergroup, only the installation scenario "
                "specifies is supported for the specified username or usergroup."
            )
            raise self.fail()
        if user is not None and flags.has("--upgrade"):
            t.emit(
                "ERR_NO:0x0004;ERR_DES:Unsupported parameters, only the installation scenario specifies "
                "is supported for the specified username or usergroup."
            )
            raise self.fail()
        if flags.value("--install-path") is not None:
            if flags.has("--upgrade"):
                t.emit("ERR_NO:0x0004;ERR_DES:Unsupported install-path in upgrade, operation failed.")
                raise self.fail()
            # inferred: ascend-deployer README says the driver only installs to /usr/local/Ascend
            t.warning(
                f"the driver package is always installed in {ASCEND_ROOT}, "
                f"install-path {flags.value('--install-path')} is ignored"
            )

    def _run_user(self) -> tuple[str, str]:
        recorded = vf.parse_key_value(_install_info_text())
        user = self.flags.value("--install-username") or recorded.get("UserName") or runpkg.DEFAULT_USER
        group = self.flags.value("--install-usergroup") or recorded.get("UserGroup") or runpkg.DEFAULT_USER
        return user, group

    def _install(self) -> int:
        t, flags, driver = self.t, self.flags, self.pkg["driver"]
        base = _installed_version(DRIVER_DIR)
        if base:
            t.info(f"base version is {base}.")
        elif flags.has("--upgrade"):
            # inferred wording (built like the uninstaller's 0x0080 message); the brief wants a refusal
            t.emit(
                "ERR_NO:0x0080;ERR_DES:Driver package is not installed on this device, upgrade failed. "
                "Please use --full to install it."
            )
            raise self.fail()
        if base and not flags.has("--upgrade") and not flags.has("--quiet"):
            answer = runpkg.ask_yes_no(
                f"Driver package has been installed on this device, the version is {base}, and the version "
                f"of this package is {driver['version']}, do you want to continue installing?  [y/n] ",
                t,
            )
            if answer is None:
                t.emit("ERR_NO:0x0002;ERR_DES:input error, please input again!")
                raise self.fail()
            if not answer:
                t.emit("stop installation!")
                t.info(f"End time: {runpkg.now().strftime('%Y-%m-%d %H:%M:%S')}")
                return 0
        t.warning("Do not power off or restart the system during the installation/upgrade")
        user, group = self._run_user()
        if not runpkg.user_exists(user):
            t.emit(f"ERR_NO:0x0091;ERR_DES:{user} not exists! Please add {user}")
            raise self.fail()
        if not runpkg.user_in_group(user, group):
            t.emit(f"ERR_NO:0x0096;ERR_DES:{group} not right! Please check the relatianship of {user} and {group}")
            raise self.fail()
        t.info(f"set username and usergroup, {user}:{group}")
        try:
            _check_chip(t, self.pkg["family"], "install")
        except InstallFailed:
            raise self.fail() from None
        t.info("driver install type: DKMS")
        try:
            self._write_driver(user, group)
        except OSError as exc:
            if runpkg.is_disk_full(exc):
                # inferred wording; the previous driver stays (files are staged, then swapped)
                raise self.fail(
                    f"no space left on device ({exc.filename or ASCEND_ROOT}), "
                    "install driver failed, please free disk space and retry!"
                ) from None
            raise
        t.info("Driver package installed successfully! Reboot needed for installation/upgrade to take effect!")
        runpkg.log_operation(
            self.operation,
            runpkg.runfile_name(),
            "success",
            flags.cmdlist,
            start=self.start,
            install_type=self.install_type,
        )
        t.info(f"End time: {runpkg.now().strftime('%Y-%m-%d %H:%M:%S')}")
        return 0

    def _write_driver(self, user: str, group: str) -> None:
        t, driver = self.t, self.pkg["driver"]
        t.progress(10, spaced=False)
        ASCEND_ROOT.mkdir(parents=True, exist_ok=True)
        new_smi = NPU_SMI.with_name(".npu-smi.dsctl-new")
        try:
            with runpkg.StagedDir(DRIVER_DIR) as staged, runpkg.StagedDir(DCMI_DIR) as dcmi:
                root = staged.path
                runpkg.write_file(root / "version.info", vf.render_driver_version_info(driver))
                for library in DRIVER_LIBRARIES:
                    runpkg.write_file(
                        root / library,
                        f"emulated {Path(library).name} of driver {driver['version']}\n",
                        0o755,
                    )
                (root / "tools").mkdir()
                shutil.copy2(self.payload / "bin" / "upgrade-tool", root / "tools" / "upgrade-tool")
                # driver.xml: hccn_tool pkg_mod/install_mod 555, root:root.
                hccn_tool = (self.payload / "bin" / "hccn_tool").read_bytes()
                runpkg.write_file(root / "tools" / "hccn_tool", hccn_tool, 0o555)
                t.progress(30, spaced=False)
                if runpkg.install_failure_armed("driver"):
                    # Field failure: DKMS cannot build for the running kernel (ascend-deployer README FAQ).
                    t.error(f"Dkms install failed, details in : {t.log_file}")
                    t.emit("install driver failed, please retry after uninstall and reboot!")
                    raise self.fail()
                runpkg.copy_installer(self.payload, root / "script")
                runpkg.write_uninstall_script(root / "script", "the NPU driver", "--quiet, --force")
                t.progress(40, spaced=False)
                runpkg.write_file(new_smi, (self.payload / "bin" / "npu-smi").read_bytes(), 0o755)
                for name in DCMI_FILES:
                    runpkg.write_file(dcmi.path / name, f"emulated {name} of driver {driver['version']}\n")
                fields = {"Install_Type": self.install_type, "Install_Path_Param": str(ASCEND_ROOT)}
                if self.flags.has("--install-for-all"):
                    fields["Install_For_All"] = "yes"
                fields["Install_Mode"] = "normal"
                info = vf.install_info_add(_install_info_text(), "Driver", user=user, group=group, fields=fields)
                t.progress(90, spaced=False)
                # Everything is on disk: swap it in (renames only, no new space needed).
                runpkg.replace_file(INSTALL_INFO, info, 0o644)
                staged.commit()
                dcmi.commit()
                os.replace(new_smi, NPU_SMI)
                _link_hccn_tool()
        finally:
            new_smi.unlink(missing_ok=True)
        t.progress(100, spaced=False)


def _link_hccn_tool() -> None:
    """The tool on PATH, and the empty hccn.conf it persists to (kept if a site or an earlier driver wrote one)."""
    if not HCCN_CONF.exists():
        runpkg.write_file(HCCN_CONF, "", 0o644)
    link = HCCN_TOOL_LINK.with_name(f".{HCCN_TOOL_LINK.name}.dsctl-new")
    link.unlink(missing_ok=True)
    link.symlink_to(DRIVER_DIR / "tools" / "hccn_tool")
    os.replace(link, HCCN_TOOL_LINK)


def uninstall_driver(pkg: dict, argv: list[str]) -> int:
    transcript = Transcript("Driver", runpkg.log_dir() / "ascend_install.log")
    start = runpkg.now().strftime("%Y-%m-%d %H:%M:%S")
    for arg in argv:
        if arg not in ("--quiet", "--force"):
            # driver script/uninstall.sh (section 5.3)
            transcript.emit(f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {arg}. Only support '--quiet'.")
            return 1
    if not runpkg.is_root():
        transcript.emit(
            "ERR_NO:0x0093;ERR_DES:do not have root permission, operation failed, please use root permission!",
            log=False,
        )
        return 1
    try:
        with runpkg.driver_lock():
            if not DRIVER_DIR.is_dir():
                transcript.emit(
                    f"[ERROR]ERR_NO:0x0090;ERR_DES:uninstall driver failed;Detail message in {transcript.log_file}"
                )
                return 1
            transcript.log(f"[Driver] [{start}] [INFO]base version is {_installed_version(DRIVER_DIR)}.")
            for path in (DRIVER_DIR, NPU_SMI, DCMI_DIR, HCCN_TOOL_LINK):
                runpkg.remove_path(path)
            _drop_install_record("Driver")
            runpkg.log_operation("Uninstall", "uninstall.sh", "success", " ".join(argv), start=start)
            # longllovers guide: the uninstaller prints this bare line
            transcript.emit(
                "[INFO]Driver package uninstalled successfully! Reboot needed for uninstallation to take effect!"
            )
            return 0
    except FileExistsError:
        transcript.emit(CONCURRENT_RUN)
        return 1


def _drop_install_record(component: str) -> None:
    text = _install_info_text()
    if not text:
        return
    remaining = vf.install_info_remove(text, component)
    if remaining is None:
        INSTALL_INFO.unlink(missing_ok=True)
    else:
        runpkg.replace_file(INSTALL_INFO, remaining, 0o644)


# =========================================================================== firmware

FIRMWARE_HELP = """\
Usage: ./Ascend-hdk-910b-npu-firmware_<version>.run [options]
  --full      install the firmware
  --upgrade   upgrade the installed firmware
  --quiet     do not ask questions
  --check     verify the package only
Uninstall: /usr/local/Ascend/firmware/script/uninstall.sh [--quiet]"""


def install_firmware(pkg: dict, payload: Path, argv: list[str]) -> int:
    t = Transcript("Firmware", runpkg.log_dir() / "ascend_install.log")
    try:
        flags = runpkg.parse_flags(argv, switches=FIRMWARE_SWITCHES, valued=())
    except runpkg.UnknownFlag as unknown:
        return _usage_error(t, unknown.flag).rc
    if not argv:
        return _usage_error(t, None).rc
    if flags.has("--help"):
        print(FIRMWARE_HELP)
        return 0
    if not runpkg.is_root():
        t.emit(
            "ERR_NO:0x0093;ERR_DES:do not have root permission, install failed, please use root permission!",
            log=False,
        )
        return 1
    if runpkg.other_runs_of(pkg["package_prefix"]):
        t.emit(CONCURRENT_RUN)
        return 1
    start = runpkg.now().strftime("%Y-%m-%d %H:%M:%S")
    operation = "Upgrade" if flags.has("--upgrade") else "Install"

    def fail(message: str | None = None) -> int:
        if message:
            t.error(message)
        runpkg.log_operation(
            operation, runpkg.runfile_name(), "failed", flags.cmdlist, start=start, install_type="full"
        )
        t.info(f"End time: {runpkg.now().strftime('%Y-%m-%d %H:%M:%S')}")
        return 1

    t.info(f"Start time: {start}")
    t.info(f"LogFile: {t.log_file}")
    t.info(f"OperationLogFile: {t.log_file.parent / 'operation.log'}")
    if flags.has("--full") == flags.has("--upgrade"):
        t.emit("ERR_NO:0x0004;ERR_DES:only support one type: full/upgrade, operation failed!")
        return fail()
    base = _installed_version(FIRMWARE_DIR)
    if base:
        t.info(f"base version is {base}.")
    if flags.has("--upgrade") and not firmware_upgrade_record():
        # An upgrade needs an installed firmware, known by its upgrade record (what ascend-deployer looks for
        # before choosing --upgrade over --full, task_firmware.yml); inferred wording.
        return fail(
            "Firmware package is not installed on this device, upgrade failed. Please use --full to install it."
        )
    if not UPGRADE_TOOL.is_file():
        # The firmware is written to the chips through the driver's upgrade-tool; wording from
        # Ascend/ascend-deployer task_firmware.yml (the vendor's own message is not public).
        return fail(f"driver not installed ({UPGRADE_TOOL} not found), please install driver first")
    t.warning("Do not power off or restart the system during the installation/upgrade")
    try:
        _check_chip(t, pkg["family"], "install")
    except InstallFailed:
        return fail()
    firmware = pkg["firmware"]
    try:
        t.progress(4, spaced=True)
        with runpkg.StagedDir(FIRMWARE_DIR) as staged:
            runpkg.write_file(staged.path / "version.info", vf.render_firmware_version_info(firmware))
            script_dir = staged.path / "script"
            runpkg.copy_installer(payload, script_dir)
            runpkg.write_uninstall_script(script_dir, "the NPU firmware", "--quiet")
            runpkg.write_file(script_dir / "upgrade.sh", FIRMWARE_UPGRADE_HELPER, 0o755)
            t.progress(51, spaced=True)
            if runpkg.install_failure_armed("firmware"):
                # inferred wording: a chip refused the image; nothing was flashed
                return fail(f"upgrade firmware failed, details in : {t.log_file}")
            recorded = vf.parse_key_value(_install_info_text())
            info = vf.install_info_add(
                _install_info_text(),
                "Firmware",
                user=recorded.get("UserName", runpkg.DEFAULT_USER),
                group=recorded.get("UserGroup", runpkg.DEFAULT_USER),
                fields={"Install_Type": "full", "Install_Path_Param": str(ASCEND_ROOT)},
            )
            t.progress(86, spaced=True)
            from dsctl.emu import hwstate

            hwstate.flash_firmware(firmware["version"])
            runpkg.replace_file(runpkg.INSTALL_INFO, info, 0o644)
            staged.commit()
    except OSError as exc:
        if runpkg.is_disk_full(exc):
            return fail(f"no space left on device ({exc.filename or ASCEND_ROOT}), install firmware failed!")
        raise
    t.progress(100, spaced=True)
    t.info(f"The firmware of [{runpkg.chip_count()}] chips are successfully upgraded.")
    t.info(
        "Firmware package installed successfully! Reboot now or after driver installation for the "
        "installation/upgrade to take effect."
    )
    runpkg.log_operation(operation, runpkg.runfile_name(), "success", flags.cmdlist, start=start, install_type="full")
    t.info(f"End time: {runpkg.now().strftime('%Y-%m-%d %H:%M:%S')}")
    return 0


def uninstall_firmware(pkg: dict, argv: list[str]) -> int:
    t = Transcript("Firmware", runpkg.log_dir() / "ascend_install.log")
    start = runpkg.now().strftime("%Y-%m-%d %H:%M:%S")
    for arg in argv:
        if arg != "--quiet":
            t.emit(f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {arg}. Only support '--quiet'.")
            return 1
    if not runpkg.is_root():
        t.emit(
            "ERR_NO:0x0093;ERR_DES:do not have root permission, operation failed, please use root permission!",
            log=False,
        )
        return 1
    base = _installed_version(FIRMWARE_DIR)
    if base is None:
        t.emit(f"[ERROR]ERR_NO:0x0090;ERR_DES:uninstall firmware failed;Detail message in {t.log_file}")
        return 1
    t.info(f"base version is {base}.")
    runpkg.remove_path(FIRMWARE_DIR)
    _drop_install_record("Firmware")
    runpkg.log_operation("Uninstall", "uninstall.sh", "success", " ".join(argv), start=start)
    # The chips keep the flashed image: only the package record goes (longllovers guide transcript).
    t.info("Firmware package uninstalled successfully! Uninstallation takes effect immediately.")
    return 0


def load_package(script_dir: Path) -> dict:
    return json.loads((script_dir / "package.json").read_text())
