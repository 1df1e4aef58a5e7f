"""The emulated vendor .run packages: built deterministically, verified like makeself, installed in a sandbox.

Installers only ever run inside a private sandbox (``Sandbox`` below): a mount
namespace held open by a ``sleep`` process, with overlays over /etc,
/usr/local, /opt, /var, /root and /home (upper layers on a tmpfs private to
the namespace) and fresh tmpfs on /run, /dev/shm and /tmp, so nothing reaches
the real machine's /usr/local/Ascend or /etc.  The emulated hardware directory
(board.json of 8 NPUs, flash.json, faults.json) lives in the test's tmp dir and
is bind-mounted at /run/dsctl-lab/hw, where dsctl.emu.hwstate looks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.lab.plan import board_state
from dsctl.emu import hwstate
from dsctl.lab import packages

ARCH = "x86_64"
DRIVER_OLD = f"Ascend-hdk-910b-npu-driver_24.1.rc3_linux-{ARCH}.run"
DRIVER_NEW = f"Ascend-hdk-910b-npu-driver_25.5.0_linux-{ARCH}.run"
FIRMWARE_OLD = "Ascend-hdk-910b-npu-firmware_7.5.0.1.129.run"
TOOLKIT_800 = f"Ascend-cann-toolkit_8.0.0_linux-{ARCH}.run"
TOOLKIT_83 = f"Ascend-cann-toolkit_8.3.RC2_linux-{ARCH}.run"
KERNELS_800 = f"Ascend-cann-kernels-910b_8.0.0_linux-{ARCH}.run"
KERNELS_83 = f"Ascend-cann-kernels-910b_8.3.RC2_linux-{ARCH}.run"
OPS_850 = f"Ascend-cann-910b-ops_8.5.0_linux-{ARCH}.run"
NNAL_800 = f"Ascend-cann-nnal_8.0.0_linux-{ARCH}.run"
TOOLKIT_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
CHECK_OK = "Verifying archive integrity...  100%   SHA256 checksums are OK. All good."
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]
CHIPS = yaml.safe_load((packages.DSCTL_DIR / "data" / "chips.yaml").read_text())

_root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the install sandbox needs root (mount namespaces)")


def needs_root(test):
    """Sandbox tests: root and Linux namespaces (the project's ``lab`` marker), skipped otherwise."""
    return pytest.mark.lab(_root_only(test))


SANDBOX_SETUP = """\
set -euo pipefail
state={state}
mkdir -p "$state"
mount -t tmpfs -o size=256m dsctl-test-disk "$state"
for d in etc usr/local opt var root home; do
    mkdir -p "$state/upper/$d" "$state/work/$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$state/upper/$d,workdir=$state/work/$d" "/$d"
done
mount -t tmpfs -o mode=0755 dsctl-test-run /run
mkdir -p /run/dsctl-lab/hw
mount --bind {hw} /run/dsctl-lab/hw
mount -t tmpfs -o mode=1777 dsctl-test-shm /dev/shm
mkdir -p /opt/pkgs
mount --bind {pkgs} /opt/pkgs
mount -t tmpfs -o mode=1777 dsctl-test-tmp /tmp
getent group HwHiAiUser >/dev/null || groupadd HwHiAiUser
id HwHiAiUser >/dev/null 2>&1 || useradd -g HwHiAiUser -d /home/HwHiAiUser -m -s /bin/bash HwHiAiUser
echo READY
exec sleep infinity
"""


class Sandbox:
    """A private mount namespace standing in for one Ascend host; commands run in it via nsenter."""

    def __init__(self, base: Path, pkgs: Path, chip: str = "910B3"):
        self.hw = base / "hw"
        self.hw.mkdir(parents=True)
        hwstate.save_board(board_state("sandbox", 8, chip, CHIPS["chips"], CHIPS["bus_ids"]), self.hw)
        script = SANDBOX_SETUP.format(
            state=shlex.quote(str(base / "state")), hw=shlex.quote(str(self.hw)), pkgs=shlex.quote(str(pkgs))
        )
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self.holder.stdout.readline().strip()
        if ready != "READY":
            self.close()
            raise RuntimeError(f"sandbox setup failed: {self.holder.stderr.read()}")

    def sh(self, script: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["nsenter", "-t", str(self.holder.pid), "-m", "--", "env", "-i", *ENV, "bash", "-c", script],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_pkg(self, name: str, *flags: str, stdin: str = "") -> subprocess.CompletedProcess:
        return self.sh(f"bash /opt/pkgs/{name} {' '.join(flags)}", stdin=stdin)

    def run_with_toolkit_env(self, name: str, *flags: str) -> subprocess.CompletedProcess:
        """A kernels/ops or NNAL installer run as the vendor's guide says: the toolkit's set_env.sh sourced first."""
        return self.sh(f". {TOOLKIT_ENV} && bash /opt/pkgs/{name} {' '.join(flags)}")

    def read(self, path: str) -> str | None:
        result = self.sh(f"cat {shlex.quote(path)}")
        return result.stdout if result.returncode == 0 else None

    def exists(self, path: str) -> bool:
        return self.sh(f"test -e {shlex.quote(path)} || test -L {shlex.quote(path)}").returncode == 0

    def readlink(self, path: str) -> str:
        return self.sh(f"readlink {shlex.quote(path)}").stdout.strip()

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
        self.holder.wait()
        for stream in (self.holder.stdout, self.holder.stderr):
            stream.close()


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pkgs")
    packages.build_packages(out, arch=ARCH)
    return out


@pytest.fixture
def make_sandbox(tmp_path, pkgs):
    if os.geteuid() != 0:
        pytest.skip("the install sandbox needs root (mount namespaces)")
    made = []

    def make(chip: str = "910B3") -> Sandbox:
        sandbox = Sandbox(tmp_path / f"sandbox{len(made)}", pkgs, chip)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        sandbox.close()


@pytest.fixture
def host(make_sandbox) -> Sandbox:
    return make_sandbox()


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def failed(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, f"unexpected success:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


# =========================================================================== building


def test_build_writes_every_package_and_checksums(pkgs):
    names = sorted(p.name for p in pkgs.glob("*.run"))
    for expected in (
        DRIVER_OLD,
        DRIVER_NEW,
        f"Ascend-hdk-910b-npu-driver_25.3.rc1_linux-{ARCH}.run",
        FIRMWARE_OLD,
        "Ascend-hdk-910b-npu-firmware_7.8.0.5.216.run",
        TOOLKIT_800,
        TOOLKIT_83,
        KERNELS_800,
        KERNELS_83,
        OPS_850,
        NNAL_800,
        f"Ascend-cann-toolkit_8.5.0_linux-{ARCH}.run",
    ):
        assert expected in names
    assert f"Ascend-cann-kernels-910b_8.5.0_linux-{ARCH}.run" not in names  # renamed to 910b-ops from 8.5
    sums = dict(reversed(line.split("  ")) for line in (pkgs / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == names
    for name, digest in sums.items():
        assert hashlib.sha256((pkgs / name).read_bytes()).hexdigest() == digest
        assert os.access(pkgs / name, os.X_OK)


def test_build_is_deterministic(tmp_path, pkgs):
    again = tmp_path / "again"
    packages.build_packages(again, arch=ARCH)
    assert (again / "SHA256SUMS").read_text() == (pkgs / "SHA256SUMS").read_text()


def test_driver_payload_carries_zipapps(pkgs, tmp_path):
    spec = next(s for s in packages.package_specs(packages.load_releases(), ARCH) if s.name == DRIVER_OLD)
    files = packages.payload_files(spec)
    assert {
        "install.py",
        "package.json",
        "dsctl/emu/installer.py",
        "dsctl/core/hostfacts/versionfiles.py",
        "bin/npu-smi",
        "bin/upgrade-tool",
    } <= set(files)
    import io
    import zipfile

    smi = files["bin/npu-smi"][0]
    assert smi.startswith(b"#!/usr/bin/python3\n")
    members = zipfile.ZipFile(io.BytesIO(smi)).namelist()
    assert "__main__.py" in members and "dsctl/emu/hwstate.py" in members
    assert "dsctl/emu/npu_smi.pyc" in members and "dsctl/emu/hccn_tool.py" not in members  # its own modules only
    toolkit = next(s for s in packages.package_specs(packages.load_releases(), ARCH) if s.name == TOOLKIT_800)
    assert "bin/npu-smi" not in packages.payload_files(toolkit)


def test_check_verifies_the_archive(pkgs, tmp_path):
    result = subprocess.run(["bash", str(pkgs / TOOLKIT_800), "--check"], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.strip() == CHECK_OK
    quiet = subprocess.run(["bash", str(pkgs / TOOLKIT_800), "--check", "--quiet"], capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stdout == ""

    corrupted = tmp_path / TOOLKIT_800
    data = bytearray((pkgs / TOOLKIT_800).read_bytes())
    data[-100] ^= 0xFF  # a byte of the payload
    corrupted.write_bytes(bytes(data))
    result = subprocess.run(["bash", str(corrupted), "--check"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("Error in SHA256 checksums: ")
    assert " is different from " in result.stderr


# =========================================================================== installing


@needs_root
def test_fresh_stack_driver_firmware_toolkit_kernels_nnal(host):
    # as in the reference transcript: no --quiet, so makeself prints its own two lines
    out = ok(host.run_pkg(DRIVER_OLD, "--full", "--install-for-all"))
    lines = out.splitlines()
    assert lines[0] == CHECK_OK
    assert lines[1].startswith("Uncompressing ASCEND DRIVER RUN PACKAGE  100%")
    for expected in (
        "[INFO]LogFile: /var/log/ascend_seclog/ascend_install.log",
        "[INFO]set username and usergroup, HwHiAiUser:HwHiAiUser",
        "[INFO]driver install type: DKMS",
        "[INFO]upgradePercentage:10%",
        "[INFO]upgradePercentage:100%",
        "[INFO]Driver package installed successfully! Reboot needed for installation/upgrade to take effect!",
    ):
        assert any(line.startswith("[Driver] [") and line.endswith(expected) for line in lines), expected
    assert "base version" not in out  # nothing was installed before
    driver = {e["version"]: e for e in packages.load_releases()["hdk"]}["24.1.rc3"]
    assert host.read("/usr/local/Ascend/driver/version.info") == vf.render_driver_version_info(driver["driver"])
    assert host.read("/etc/ascend_install.info") == (
        "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\n"
        "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=yes\nDriver_Install_Mode=normal\n"
    )
    for path in (
        "/usr/local/bin/npu-smi",
        "/usr/local/Ascend/driver/tools/upgrade-tool",
        "/usr/local/Ascend/driver/tools/hccn_tool",
        "/usr/local/Ascend/driver/script/uninstall.sh",
    ):
        assert host.sh(f"test -x {path}").returncode == 0, path
    assert host.exists("/usr/local/Ascend/driver/lib64/driver/libascend_hal.so")
    assert host.exists("/usr/local/dcmi/libdcmi.so")
    assert host.sh("head -c 19 /usr/local/bin/npu-smi").stdout == "#!/usr/bin/python3\n"
    smi = host.sh("npu-smi info")  # runs (no boot happened, so it may well report no driver)
    assert "ModuleNotFoundError" not in smi.stderr and "ImportError" not in smi.stderr
    assert "[INFO]Driver package installed successfully!" in host.read("/var/log/ascend_seclog/ascend_install.log")
    operation = host.read("/var/log/ascend_seclog/operation.log")
    assert f"127.0.0.1 {DRIVER_OLD} success install_type=full; cmdlist=--full --install-for-all." in operation
    assert not (host.hw.parent / "running.json").exists()  # the new driver runs only after a reboot

    out = ok(host.run_pkg(FIRMWARE_OLD, "--nox11", "--full"))
    assert "Uncompressing ASCEND-HDK-910B-NPU FIRMWARE RUN PACKAGE  100%" in out
    assert "[INFO]upgradePercentage: 4%" in out
    assert "[INFO]The firmware of [8] chips are successfully upgraded." in out
    assert "[INFO]Firmware package installed successfully! Reboot now or after driver installation" in out
    assert hwstate.flashed_firmware(host.hw) == "7.5.0.1.129"
    assert vf.parse_key_value(host.read("/usr/local/Ascend/firmware/version.info"))["Version"] == "7.5.0.1.129"
    assert host.read("/etc/ascend_install.info").endswith(
        "Firmware_Install_Type=full\nFirmware_Install_Path_Param=/usr/local/Ascend\n"
    )
    assert host.sh("find /usr/local/Ascend/firmware -name 'upgrade*' | grep -q .").returncode == 0

    out = ok(host.run_pkg(TOOLKIT_800, "--nox11", "--install"))
    assert "Uncompressing ASCEND_RUN_PACKAGE  100%" in out
    assert "[Toolkit] [" in out and "] [INFO] LogFile:/var/log/ascend_seclog/ascend_toolkit_install.log" in out
    assert f"[INFO] CANN-runtime-7.6.0.1.220-linux.{ARCH}.run --full --quiet --nox11 install success" in out
    assert "Write Toolkit_InstallPath to /etc/Ascend/ascend_cann_install.info." in out
    assert "Driver:   Installed in /usr/local/Ascend/driver." in out
    home = "/usr/local/Ascend/ascend-toolkit"
    info = vf.parse_key_value(host.read(f"{home}/latest/{ARCH}-linux/ascend_toolkit_install.info"))
    assert info["version"] == "8.0.0" and info["innerversion"] == "V100R001C20SPC001B251"
    assert info["path"] == f"{home}/8.0.0/{ARCH}-linux"
    assert host.readlink(f"{home}/latest/runtime") == "../8.0.0/runtime"
    assert host.readlink(f"{home}/latest/lib64") == f"{ARCH}-linux/lib64"
    cfg = vf.parse_version_cfg(host.read(f"{home}/latest/version.cfg"))
    assert cfg["toolkit"]["running"] == [("7.6.0.1.220", "8.0.0")]
    assert vf.parse_key_value(host.read("/etc/Ascend/ascend_cann_install.info"))["Install_Path"] == "/usr/local/Ascend"
    env = ok(host.sh(f"source {home}/set_env.sh && echo $ASCEND_TOOLKIT_HOME && echo $LD_LIBRARY_PATH"))
    toolkit_home, library_path = env.splitlines()
    assert toolkit_home == f"{home}/latest"
    assert "/usr/local/Ascend/driver/lib64/common" in library_path

    out = ok(host.run_with_toolkit_env(KERNELS_800, "--install", "--type=toolkit", "--quiet"))
    assert "[kernels_910b] [" in out
    assert f"Ascend910B-opp_kernel-7.6.0.1.220-linux.{ARCH}.run --install --quiet --nox11 install success" in out
    assert f"install success. The installation path is {home}." in out
    cfg = vf.parse_version_cfg(host.read(f"{home}/latest/version.cfg"))
    assert cfg["opp_kernel"]["running"] == [("7.6.0.1.220", "8.0.0")]
    assert host.readlink(f"{home}/latest/opp_kernel") == "../8.0.0/opp_kernel"
    assert vf.parse_key_value(host.read(f"{home}/latest/opp/version.info"))["version_dir"] == "8.0.0"

    out = ok(host.run_with_toolkit_env(NNAL_800, "--install", "--quiet"))
    assert "install success, installed in /usr/local/Ascend/nnal." in out
    atb = vf.parse_colon_key_value(host.read("/usr/local/Ascend/nnal/atb/latest/version.info"))
    assert atb["Ascend-cann-atb"] == "8.0.0" and atb["Platform"] == ARCH
    assert host.readlink("/usr/local/Ascend/nnal/atb/latest") == "8.0.0"
    env = ok(host.sh("source /usr/local/Ascend/nnal/atb/set_env.sh && echo $ATB_HOME_PATH"))
    assert env.strip() == "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1"
    assert host.exists("/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1/lib/libatb.so")
    assert "Install SUGGESTION root" in host.read("/var/log/ascend_seclog/operation.log").splitlines()[-1]
    assert host.sh("ls /tmp | grep -q selfgz").returncode != 0  # the payload temp dirs are gone


@needs_root
def test_firmware_before_driver_fails(host):
    text = failed(host.run_pkg(FIRMWARE_OLD, "--full", "--quiet"))
    assert "please install driver first" in text
    assert hwstate.flashed_firmware(host.hw) is None
    assert not host.exists("/usr/local/Ascend/firmware")


@needs_root
def test_upgrade_and_full_over_existing(host):
    assert "is not installed on this device, upgrade failed" in failed(host.run_pkg(DRIVER_OLD, "--upgrade", "--quiet"))
    ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    # --full over an installed driver asks first; without an answer it gives up
    text = failed(host.run_pkg(DRIVER_OLD, "--full"))
    assert "Driver package has been installed on this device, the version is 24.1.rc3" in text
    out = ok(host.run_pkg(DRIVER_NEW, "--nox11", "--upgrade", "--quiet"))
    assert "[INFO]base version is 24.1.rc3." in out
    assert vf.parse_key_value(host.read("/usr/local/Ascend/driver/version.info"))["Version"] == "25.5.0"
    assert "ERR_NO:0x0004;ERR_DES: Unrecognized parameters: --bogus." in failed(host.run_pkg(DRIVER_NEW, "--bogus"))
    out = ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet", "--install-path=/opt/x"))  # --quiet: overwrite
    assert "install-path /opt/x is ignored" in out and not host.exists("/opt/x")
    assert vf.parse_key_value(host.read("/usr/local/Ascend/driver/version.info"))["Version"] == "24.1.rc3"
    # not root: the driver scripts' isRoot
    not_root = host.sh(
        f"cp /opt/pkgs/{DRIVER_NEW} /tmp/ && chmod 755 /tmp/{DRIVER_NEW} && "
        f"setpriv --reuid=65534 --regid=65534 --clear-groups bash /tmp/{DRIVER_NEW} --upgrade --quiet"
    )
    assert "ERR_NO:0x0093;ERR_DES:do not have root permission" in failed(not_root)


@needs_root
def test_concurrent_runs_are_refused(host):
    host.sh("touch /dev/shm/driver_installing_status_tmp")
    text = failed(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    assert "ERR_NO:0x0094;ERR_DES:There is already a process being executed" in text
    host.sh("rm -f /dev/shm/driver_installing_status_tmp")
    # another driver .run still running (the scripts' ps check)
    script = (
        f"(exec -a /opt/pkgs/Ascend-hdk-910b-npu-driver_25.3.rc1_linux-{ARCH}.run sleep 20) "
        f">/dev/null 2>&1 & other=$!; sleep 0.2; bash /opt/pkgs/{DRIVER_OLD} --full --quiet; rc=$?; "
        "kill $other; exit $rc"
    )
    assert "ERR_NO:0x0094" in failed(host.sh(script))
    assert not host.exists("/usr/local/Ascend/driver")
    assert not host.exists("/dev/shm/driver_installing_status_tmp")  # the refused runs left the lock alone


@needs_root
def test_wrong_chip_is_refused(make_sandbox):
    host = make_sandbox(chip="910")
    text = failed(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    assert "the package is for Ascend 910b chips but this device has Ascend 910 chips" in text
    assert not host.exists("/usr/local/Ascend/driver")


@needs_root
def test_corrupted_package_never_runs(host, pkgs, tmp_path):
    data = bytearray((pkgs / DRIVER_OLD).read_bytes())
    data[-200] ^= 0x01
    host.sh(f"base64 -d > /tmp/{DRIVER_OLD}", stdin=__import__("base64").b64encode(bytes(data)).decode())
    result = host.sh(f"bash /tmp/{DRIVER_OLD} --full --quiet")
    assert result.returncode == 2 and "Error in SHA256 checksums" in result.stderr
    assert not host.exists("/usr/local/Ascend/driver")
    out = ok(host.sh(f"bash /opt/pkgs/{TOOLKIT_800} --noexec --extract=/tmp/x && ls /tmp/x"))
    assert {"install.py", "package.json", "dsctl"} <= set(out.split())
    assert not host.exists("/usr/local/Ascend/ascend-toolkit")


@needs_root
def test_toolkit_already_installed_and_kernels_need_their_toolkit(host):
    text = failed(host.run_pkg(KERNELS_800, "--install", "--quiet"))
    assert "The toolkit of version 8.0.0 is not installed" in text
    ok(host.run_pkg(TOOLKIT_800, "--full", "--quiet"))
    result = host.run_pkg(TOOLKIT_800, "--install", "--quiet")
    assert result.returncode != 0 and "already installed" in result.stdout  # ascend-deployer's test
    assert "The nnae of version 8.0.0 is not installed" in failed(
        host.run_pkg(KERNELS_800, "--install", "--type=nnae", "--quiet")
    )
    assert "The toolkit of version 8.5.0 is not installed" in failed(host.run_pkg(OPS_850, "--install", "--quiet"))
    # --upgrade replaces the active version instead of adding one beside it
    ok(host.run_pkg(TOOLKIT_83, "--upgrade", "--quiet"))
    home = "/usr/local/Ascend/ascend-toolkit"
    assert not host.exists(f"{home}/8.0.0")
    cfg = vf.parse_version_cfg(host.read(f"{home}/latest/version.cfg"))
    assert cfg["toolkit"]["installed"] == [("8.3.0.2.220", "8.3.RC2")]


@needs_root
def test_kernels_and_nnal_fail_without_the_toolkit_env_and_install_with_it(host):
    # vllm-project/vllm-ascend#144: the toolkit installed, its set_env.sh not sourced, the kernels install fails.
    ok(host.run_pkg(TOOLKIT_800, "--install", "--quiet"))
    result = host.run_pkg(KERNELS_800, "--install", "--quiet")
    assert result.returncode == 1, result.stdout
    assert "ASCEND_OPP_PATH is not set" in result.stdout and TOOLKIT_ENV in result.stdout
    assert result.stdout.rstrip().endswith(
        "Run package install failed, please retry after check your device and reboot!"
    )
    assert not host.exists("/usr/local/Ascend/ascend-toolkit/8.0.0/opp_kernel")
    assert "failed" in host.read("/var/log/ascend_seclog/operation.log").splitlines()[-1]
    result = host.run_pkg(NNAL_800, "--install", "--quiet")
    assert result.returncode == 1 and "ASCEND_HOME_PATH is not set" in result.stdout
    assert not host.exists("/usr/local/Ascend/nnal/atb/8.0.0")
    # a variable naming nothing is as good as none
    nowhere = host.sh(f"ASCEND_OPP_PATH=/nowhere bash /opt/pkgs/{KERNELS_800} --install --quiet")
    assert "ASCEND_OPP_PATH is not set" in failed(nowhere)
    out = ok(host.run_with_toolkit_env(KERNELS_800, "--install", "--quiet"))
    assert "install success. The installation path is /usr/local/Ascend/ascend-toolkit." in out
    ok(host.run_with_toolkit_env(NNAL_800, "--install", "--quiet"))
    assert host.readlink("/usr/local/Ascend/nnal/atb/latest") == "8.0.0"


@needs_root
def test_firmware_upgrade_needs_the_firmwares_own_record_not_a_driver(host):
    ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    # driver-only: --upgrade is refused (what dsctl ran before the decision followed the firmware's record)
    text = failed(host.run_pkg(FIRMWARE_OLD, "--nox11", "--upgrade", "--quiet"))
    assert "Firmware package is not installed on this device, upgrade failed. Please use --full" in text
    assert hwstate.flashed_firmware(host.hw) is None
    ok(host.run_pkg(FIRMWARE_OLD, "--nox11", "--full", "--quiet"))
    record = host.sh("find /usr/local/Ascend/firmware -name 'upgrade*'").stdout.split()
    assert record == ["/usr/local/Ascend/firmware/script/upgrade.sh"]
    out = ok(host.run_pkg(FIRMWARE_OLD, "--nox11", "--upgrade", "--quiet"))
    assert "[INFO]base version is 7.5.0.1.129." in out
    # the firmware's uninstaller takes the record with it: driver-only again, --upgrade refused again
    ok(host.sh("/usr/local/Ascend/firmware/script/uninstall.sh --quiet"))
    assert "upgrade failed" in failed(host.run_pkg(FIRMWARE_OLD, "--nox11", "--upgrade", "--quiet"))
    ok(host.run_pkg(FIRMWARE_OLD, "--nox11", "--full", "--quiet"))


@needs_root
def test_side_by_side_cann_switches_latest_and_uninstalls(host):
    home = "/usr/local/Ascend/ascend-toolkit"
    ok(host.run_pkg(TOOLKIT_800, "--install", "--quiet"))
    ok(host.run_with_toolkit_env(KERNELS_800, "--install", "--quiet"))
    ok(host.run_pkg(TOOLKIT_83, "--install", "--quiet", "--install-path=/opt/elsewhere"))
    assert not host.exists("/opt/elsewhere")  # the recorded CANN path wins
    assert host.readlink(f"{home}/latest/runtime") == "../8.3.RC2/runtime"
    assert not host.exists(f"{home}/latest/opp_kernel")  # 8.3.RC2 has no kernels yet
    cfg = vf.parse_version_cfg(host.read(f"{home}/latest/version.cfg"))
    assert cfg["toolkit"]["installed"] == [("7.6.0.1.220", "8.0.0"), ("8.3.0.2.220", "8.3.RC2")]
    assert cfg["toolkit"]["running"] == [("8.3.0.2.220", "8.3.RC2")]
    assert cfg["opp_kernel"]["installed"] == [("7.6.0.1.220", "8.0.0")] and not cfg["opp_kernel"]["running"]
    assert (
        vf.parse_key_value(host.read(f"{home}/latest/{ARCH}-linux/ascend_toolkit_install.info"))["version"] == "8.3.RC2"
    )
    assert host.exists(f"{home}/8.0.0/{ARCH}-linux/ascend_toolkit_install.info")

    uninstall = f"{home}/8.3.RC2/{ARCH}-linux/script/uninstall.sh"
    assert "Only support '--quiet'" in failed(host.sh(f"bash {uninstall} --force"))
    ok(host.sh(f"bash {uninstall} --quiet"))
    assert not host.exists(f"{home}/8.3.RC2")
    assert host.readlink(f"{home}/latest/runtime") == "../8.0.0/runtime"
    assert host.readlink(f"{home}/latest/opp_kernel") == "../8.0.0/opp_kernel"
    cfg = vf.parse_version_cfg(host.read(f"{home}/latest/version.cfg"))
    assert cfg["toolkit"]["running"] == [("7.6.0.1.220", "8.0.0")]
    assert cfg["opp_kernel"]["running"] == [("7.6.0.1.220", "8.0.0")]


@needs_root
def test_the_lab_regressed_toolkit_carries_its_slowdown_and_real_ones_do_not(host):
    """releases.yaml's lab-only 8.5.0.lab1 (lab_regression) installs like any toolkit and leaves the file the lab
    engine reads (cli/dsctl/engine/cann.py); a real release's toolkit has none."""
    home = "/usr/local/Ascend/ascend-toolkit"
    ok(host.run_pkg(TOOLKIT_83, "--install", "--quiet"))
    ok(host.run_pkg(f"Ascend-cann-toolkit_8.5.0.lab1_linux-{ARCH}.run", "--install", "--quiet"))
    assert json.loads(host.read(f"{home}/8.5.0.lab1/{vf.LAB_REGRESSION_FILE}")) == {"slowdown": 3.0}
    assert not host.exists(f"{home}/8.3.RC2/{vf.LAB_REGRESSION_FILE}")
    assert host.readlink(f"{home}/latest/runtime") == "../8.5.0.lab1/runtime"


@needs_root
def test_uninstall_scripts(host):
    ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    ok(host.run_pkg(FIRMWARE_OLD, "--full", "--quiet"))
    text = failed(host.sh("bash /usr/local/Ascend/driver/script/uninstall.sh --uninstall"))
    assert "ERR_NO:0x0004;ERR_DES: Unrecognized parameters: --uninstall. Only support '--quiet'." in text
    out = ok(host.sh("bash /usr/local/Ascend/driver/script/uninstall.sh --force"))
    assert (
        out.strip() == "[INFO]Driver package uninstalled successfully! Reboot needed for uninstallation to take effect!"
    )
    for path in ("/usr/local/Ascend/driver", "/usr/local/bin/npu-smi", "/usr/local/dcmi"):
        assert not host.exists(path)
    record = host.read("/etc/ascend_install.info")
    assert "Driver_Install_Path_Param" not in record and "Firmware_Install_Path_Param" in record
    out = ok(host.sh("bash /usr/local/Ascend/firmware/script/uninstall.sh --quiet"))
    assert "[INFO]base version is 7.5.0.1.129." in out
    assert "[INFO]Firmware package uninstalled successfully! Uninstallation takes effect immediately." in out
    assert not host.exists("/etc/ascend_install.info")
    assert hwstate.flashed_firmware(host.hw) == "7.5.0.1.129"  # the chips keep what was flashed


@needs_root
def test_injected_failure_keeps_the_previous_driver(host):
    ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    hwstate.save_faults({"install_fail": "driver"}, host.hw)
    result = host.run_pkg(DRIVER_NEW, "--upgrade", "--quiet")
    assert result.returncode == 1
    assert "[INFO]upgradePercentage:30%" in result.stdout
    assert "[INFO]upgradePercentage:100%" not in result.stdout
    assert "[ERROR]Dkms install failed, details in : /var/log/ascend_seclog/ascend_install.log" in result.stdout
    assert vf.parse_key_value(host.read("/usr/local/Ascend/driver/version.info"))["Version"] == "24.1.rc3"
    assert hwstate.faults(host.hw) == {}  # consumed once
    assert f"{DRIVER_NEW} failed cmdlist=--upgrade --quiet." in host.read("/var/log/ascend_seclog/operation.log")
    ok(host.run_pkg(DRIVER_NEW, "--upgrade", "--quiet"))  # the next attempt works

    hwstate.save_faults({"install_fail": "toolkit"}, host.hw)
    result = host.run_pkg(TOOLKIT_800, "--install", "--quiet")
    assert result.returncode == 1 and "install failed" in result.stdout
    assert not host.exists("/usr/local/Ascend/ascend-toolkit/8.0.0")


@needs_root
def test_full_disk_keeps_the_previous_driver(host):
    # A disk with room for one driver but not for a second one staged beside it.
    ok(host.sh("mkdir -p /usr/local/Ascend && mount -t tmpfs -o size=300k dsctl-test-tiny /usr/local/Ascend"))
    ok(host.run_pkg(DRIVER_OLD, "--full", "--quiet"))
    result = host.run_pkg(DRIVER_NEW, "--upgrade", "--quiet")
    assert result.returncode == 1, result.stdout
    assert "[ERROR]no space left on device" in result.stdout
    assert vf.parse_key_value(host.read("/usr/local/Ascend/driver/version.info"))["Version"] == "24.1.rc3"
    assert host.sh("ls -A /usr/local/Ascend").stdout.split() == ["driver"]  # no staging left behind
