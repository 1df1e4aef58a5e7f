"""The emulated CANN installers: toolkit, operator kernels (kernels-910b / 910b-ops) and NNAL (ATB).

Standard library only; runs on a lab host.  Layout and records follow
ascend-interfaces.md sections 4.4, 4.5, 6.5:

* toolkit: ``<root>/ascend-toolkit/<ver>/`` side by side with older versions,
  ``latest/`` as a farm of relative symlinks into ``../<ver>/`` plus the real
  files ``version.cfg`` (every installed version listed, the active one
  running), ``platform.ini`` and ``remove_latest_softlink.sh``;
  ``<root>/ascend-toolkit/set_env.sh``; ``/etc/Ascend/ascend_cann_install.info``
  (root installs; once it exists its path wins over ``--install-path``).
* kernels/ops: under the nnae (``--type=nnae``) or toolkit of the same
  version (section 6.1); ``opp_kernel`` joins version.cfg.
* nnal: ``<root>/nnal/atb/<ver>/`` with ``latest -> <ver>`` and
  ``nnal/atb/set_env.sh``.
* kernels/ops and nnal need the toolkit's environment (``source <root>/ascend-toolkit/set_env.sh``) in the
  shell that runs them, as the vendor's do: the kernels' install.sh takes its install path from
  ``ASCEND_OPP_PATH`` (``opp_env_dir=${ASCEND_OPP_PATH}``, public copies of the opp_kernel install.sh) and
  without it ends "Run package install failed, please retry after check your device and reboot!", rc 1;
  vllm-project/vllm-ascend#144 (kernels install failing until set_env.sh was sourced right after the
  toolkit) and Ascend/docs#69.

Transcripts copy the public CANN 6.3.RC1 / 8.0.0 install logs
(``[Toolkit] [20230710-22:44:15] [INFO] ...``, "install package CANN-runtime-...
start", the Summary block; liguodongiot/llm-action ascend910-env-install.md and
a public Atlas 200I DK A2 install log for 8.0.0 / kernels-310b).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dsctl.core.hostfacts import versionfiles as vf
from dsctl.emu import runpkg
from dsctl.emu.runpkg import CANN_INSTALL_INFO, InstallFailed, Transcript

MODES = ("--install", "--full", "--run", "--devel", "--upgrade")
TOOLKIT_SWITCHES = {*MODES, "--quiet", "--install-for-all", "--pylocal", "--help"}
TOOLKIT_VALUED = {"--install-path", "--feature"}
KERNELS_VALUED = {"--install-path", "--type"}

# Directories of a toolkit version (itove/ascend ver-2.1.md `ll latest/`), created with a marker file each.
TOOLKIT_DIRS = (
    "runtime/lib64",
    "compiler/bin",
    "hccl/lib64",
    "opp/built-in/op_impl/ai_core/tbe",
    "opp/test-ops",
    "toolkit/tools",
    "atc/bin",
    "fwkacllib/lib64",
    "bisheng_toolkit/bin",
    "mindstudio-toolkit/bin",
    "pyACL/python",
    "aoe/bin",
    "ncs/bin",
    "python/site-packages",
    "tools",
)
TOOLKIT_LIBRARIES = (
    "runtime/lib64/libascendcl.so",
    "runtime/lib64/libruntime.so",
    "hccl/lib64/libhccl.so",
    "compiler/lib64/libge_runner.so",
    "opp/built-in/op_impl/ai_core/tbe/op_tiling/liboptiling.so",
)
# latest/<name> -> ../<ver>/<target> (same listing); names under <arch>-linux get their own links.
LATEST_VERSION_LINKS = {
    "acllib": "runtime",
    "atc": "atc",
    "bisheng_toolkit": "bisheng_toolkit",
    "compiler": "compiler",
    "fwkacllib": "fwkacllib",
    "hccl": "hccl",
    "mindstudio-toolkit": "mindstudio-toolkit",
    "opp": "opp",
    "ops": "opp",
    "pyACL": "pyACL",
    "runtime": "runtime",
    "test-ops": "opp/test-ops",
    "toolkit": "toolkit",
}
LATEST_ARCH_LINKS = ("bin", "conf", "include", "lib64")
ARCH_DIRS = ("bin", "conf", "include", "lib64", "script")

REMOVE_LATEST_SOFTLINK = """\
#!/bin/bash
# Remove the latest/ symlink farm of the CANN toolkit (emulated package, dsctl lab).
latest_dir="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
find "$latest_dir" -maxdepth 1 -type l -delete
"""

TOOLKIT_SET_ENV = """\
#!/bin/bash
# CANN toolkit environment (emulated package, dsctl lab); same variables as the vendor's set_env.sh.
export ASCEND_TOOLKIT_HOME={root}/ascend-toolkit/latest
export ASCEND_HOME_PATH=${{ASCEND_TOOLKIT_HOME}}
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
export ASCEND_AICPU_PATH=${{ASCEND_TOOLKIT_HOME}}
export TOOLCHAIN_HOME=${{ASCEND_TOOLKIT_HOME}}/toolkit
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/opskernel:\
${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/nnengine:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux/$(arch):$LD_LIBRARY_PATH
export PYTHONPATH=${{ASCEND_TOOLKIT_HOME}}/python/site-packages:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe:$PYTHONPATH
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:${{ASCEND_TOOLKIT_HOME}}/compiler/ccec_compiler/bin:\
${{ASCEND_TOOLKIT_HOME}}/tools/ccec_compiler/bin:$PATH
# The driver libraries, found through the driver's install record (as the vendor script does; under
# `set -euo pipefail` a record without the key makes this line fail, as on real hosts).
DEP_INFO_FILE=/etc/ascend_install.info
if [ -f "$DEP_INFO_FILE" ]; then
    driver_install_path_param=$(grep -iw driver_install_path_param "$DEP_INFO_FILE" \\
        | cut --only-delimited -d"=" -f2-)
    if [ -n "$driver_install_path_param" ] && [ -d "$driver_install_path_param/driver/lib64" ]; then
        export LD_LIBRARY_PATH=$driver_install_path_param/driver/lib64/common:\
$driver_install_path_param/driver/lib64/driver:$LD_LIBRARY_PATH
    fi
fi
"""

NNAL_SET_ENV = """\
#!/bin/bash
# NNAL/ATB environment (emulated package, dsctl lab).  Usage: source set_env.sh [--cxx_abi=0|1]
cxx_abi=1
for arg in "$@"; do
    case "$arg" in
        --cxx_abi=0) cxx_abi=0 ;;
        --cxx_abi=1) cxx_abi=1 ;;
    esac
done
export ATB_HOME_PATH={root}/nnal/atb/latest/atb/cxx_abi_${{cxx_abi}}
export LD_LIBRARY_PATH=$ATB_HOME_PATH/lib:$ATB_HOME_PATH/examples:\
$ATB_HOME_PATH/tests/atbopstest:$LD_LIBRARY_PATH
export PATH=$ATB_HOME_PATH/bin:$PATH
export ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0
export ATB_WORKSPACE_MEM_ALLOC_GLOBAL=1
"""


def _usage_error(t: Transcript, flag: str | None) -> int:
    # inferred: CANN scripts print "Unsupported parameters : <flag>"; the ERR_NO form matches the HDK scripts
    detail = f": {flag}" if flag else ""
    t.error(f"ERR_NO:0x0004;ERR_DES:Unrecognized parameters{detail}. Try './xxx.run --help' for more information.")
    return 1


def _stamp() -> str:
    return runpkg.now().strftime("%Y-%m-%d %H:%M:%S")


class _CannRun:
    """Shared frame: flags, CANN root, operation log, disk-full and injected failures."""

    tag = "Toolkit"
    log_name = "ascend_toolkit_install.log"
    fault_component = "toolkit"
    switches: set[str] = TOOLKIT_SWITCHES
    valued: set[str] = TOOLKIT_VALUED

    def __init__(self, pkg: dict, payload: Path, argv: list[str]):
        self.pkg, self.payload, self.argv = pkg, payload, argv
        self.version = pkg["version"]
        self.arch = pkg["arch"]
        self.t = Transcript(self.tag, runpkg.log_dir() / self.log_name, cann_style=True)
        self.start = _stamp()
        self.flags = runpkg.Flags(argv=argv)
        self.operation = "Install"
        self.mode = "full"

    # ------------------------------------------------------------------ frame

    def main(self) -> int:
        try:
            self.flags = runpkg.parse_flags(self.argv, switches=self.switches, valued=self.valued)
        except runpkg.UnknownFlag as unknown:
            return _usage_error(self.t, unknown.flag)
        if self.flags.has("--help"):
            print(
                f"Usage: ./{runpkg.runfile_name()} --install|--full|--upgrade [--quiet] "
                "[--install-path=<dir>] "
                "[--install-for-all]"
            )
            return 0
        modes = [mode for mode in MODES if self.flags.has(mode)]
        if len(modes) != 1:
            if modes:
                self.t.error("Only support one type: full, operation failed!")
                return 1
            return _usage_error(self.t, None)
        self.mode = modes[0].lstrip("-")
        self.operation = "Upgrade" if self.mode == "upgrade" else "Install"
        self.t.info(f"LogFile:{self.t.log_file}")
        try:
            self.root = self.resolve_root()
            self.run()
        except InstallFailed as failed:
            self.log_operation("failed")
            return failed.rc
        except OSError as exc:
            if not runpkg.is_disk_full(exc):
                raise
            # inferred wording; staged files were discarded, the previous version is untouched
            self.t.error(
                f"No space left on device: {exc.filename or self.root}. "
                f"{self.package_title} install failed, please free disk space and retry."
            )
            self.log_operation("failed")
            return 1
        self.log_operation("success")
        return 0

    @property
    def package_title(self) -> str:
        return Path(self.pkg["run_name"]).stem

    def log_operation(self, result: str) -> None:
        runpkg.log_operation(
            self.operation,
            runpkg.runfile_name(),
            result,
            self.flags.cmdlist,
            start=self.start,
            install_type=self.mode,
            cann_style=True,
        )

    def fail(self, message: str) -> InstallFailed:
        self.t.error(message)
        return InstallFailed(1)

    def resolve_root(self) -> Path:
        """Where CANN goes: the recorded path, else --install-path, else the default root."""
        asked = self.flags.value("--install-path")
        if asked is not None:
            asked = asked.rstrip("/") or "/"
            if not asked.startswith("/"):
                raise self.fail("ERR_NO:0x0003;ERR_DES:install-path only support absolute path, install failed")
        if runpkg.is_root() and CANN_INSTALL_INFO.is_file():
            recorded = vf.parse_key_value(CANN_INSTALL_INFO.read_text()).get("Install_Path")
            if recorded:
                if asked and asked != recorded.rstrip("/"):
                    # ascend-deployer README: with the record present CANN goes to the recorded path.
                    self.t.warning(
                        f"{CANN_INSTALL_INFO} exists, install-path {asked} is ignored, install to {recorded}."
                    )
                return Path(recorded)
        if asked:
            return Path(asked)
        # Non-root installs go to $HOME/Ascend (section 1).
        return runpkg.ASCEND_ROOT if runpkg.is_root() else Path.home() / "Ascend"

    def armed(self) -> bool:
        return runpkg.install_failure_armed(self.fault_component)

    def toolkit_env_missing(self, variable: str) -> bool:
        """``variable`` (exported by the toolkit's set_env.sh) is unset or names no directory."""
        value = os.environ.get(variable, "")
        return not value or not Path(value).is_dir()

    def run(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ toolkit helpers shared by kernels

    @property
    def toolkit_home(self) -> Path:
        return self.root / "ascend-toolkit"

    def cfg_path(self) -> Path:
        return self.toolkit_home / "latest" / "version.cfg"

    def read_cfg(self) -> vf.VersionCfg:
        try:
            return vf.parse_version_cfg(self.cfg_path().read_text())
        except OSError:
            return {}

    def sub_args(self) -> str:
        extra = " --install-for-all" if self.flags.has("--install-for-all") else ""
        return f"--full --quiet --nox11{extra}"


# =========================================================================== toolkit


class ToolkitRun(_CannRun):
    def run(self) -> None:
        t, toolkit = self.t, self.pkg["cann"]["toolkit"]
        version_dir = self.toolkit_home / self.version
        record = version_dir / f"{self.arch}-linux" / "ascend_toolkit_install.info"
        cfg = self.read_cfg()
        installed = [pair[1] for pair in cfg.get("toolkit", {}).get("installed", [])]
        if self.mode != "upgrade" and record.is_file():
            # ascend-deployer task_toolkit.yml tolerates rc != 0 when stdout says "already installed".
            # inferred wording around that phrase
            raise self.fail(
                f"The {Path(self.pkg['run_name']).stem} is already installed in {version_dir}, "
                "please uninstall it first or use --upgrade."
            )
        if self.mode == "upgrade" and not installed and not record.is_file():
            raise self.fail(
                f"The toolkit package is not installed in {self.toolkit_home}, upgrade failed. "
                "Please use --install or --full to install it."
            )
        previous = vf.version_cfg_running(cfg)
        t.info("install start")
        t.info(f"The installation path is {self.root}.")
        self.toolkit_home.mkdir(parents=True, exist_ok=True)
        with runpkg.StagedDir(version_dir) as staged:
            self._fill_version_dir(staged.path, toolkit)
            if (version_dir / "opp_kernel").is_dir():
                # Reinstalling a version keeps the kernels installed into it (a separate package).
                runpkg.copy_tree(version_dir / "opp_kernel", staged.path / "opp_kernel")
            new_cfg = vf.version_cfg_install(cfg, vf.TOOLKIT_CFG_COMPONENTS, (toolkit["build"], self.version))
            if previous and previous[1] != self.version and self.mode == "upgrade":
                # --upgrade replaces the active version (inferred: the vendor's latest manager is not public)
                new_cfg = vf.version_cfg_remove(new_cfg, previous[1])
            new_cfg = _drop_components_missing_in(new_cfg, self.version)
            latest = build_latest(self.toolkit_home, self.version, self.arch, new_cfg, staged_version=staged.path)
            with latest:
                set_env = TOOLKIT_SET_ENV.format(root=self.root)
                runpkg.replace_file(self.toolkit_home / "set_env.sh", set_env, 0o755)
                write_record = runpkg.is_root() and not CANN_INSTALL_INFO.is_file()
                if write_record:
                    runpkg.replace_file(
                        CANN_INSTALL_INFO,
                        vf.render_cann_install_info(str(self.root), str(self.toolkit_home / "latest")),
                        0o644,
                    )
                staged.commit()
                latest.commit()
        if previous and previous[1] != self.version and self.mode == "upgrade":
            runpkg.remove_path(self.toolkit_home / previous[1])
        if write_record:
            t.info(f"Write Toolkit_InstallPath to {CANN_INSTALL_INFO}.")
        self._summary()

    def _fill_version_dir(self, path: Path, toolkit: dict) -> None:
        t, build, arch = self.t, self.pkg["cann"]["toolkit"]["build"], self.arch
        subpackages = [f"CANN-{name}-{build}-linux.{arch}.run" for name in vf.TOOLKIT_CFG_COMPONENTS]
        for directory in TOOLKIT_DIRS:
            (path / directory).mkdir(parents=True, exist_ok=True)
        for index, sub in enumerate(subpackages):
            t.info(f"install package {sub} start")
            if index == 3 and self.armed():
                t.error(f"{sub} {self.sub_args()} install failed")
                raise self.fail(f"{self.pkg['run_name']} install failed, please retry after uninstall!")
            component = vf.TOOLKIT_CFG_COMPONENTS[index]
            runpkg.write_file(
                path / component / "version.info",
                vf.render_key_value([("Version", build), ("version_dir", self.version)]),
            )
            runpkg.pause()
            t.info(f"{sub} {self.sub_args()} install success")
        for library in TOOLKIT_LIBRARIES:
            runpkg.write_file(path / library, f"emulated {Path(library).name} of CANN {self.version}\n", 0o755)
        opp = self.pkg["cann"]["opp_version_info"]
        runpkg.write_file(
            path / "opp" / "version.info",
            vf.render_opp_version_info(
                inner_version=build,
                version_dir=self.version,
                timestamp=opp["timestamp"],
                required_amct_acl_version=opp["required_package_amct_acl_version"],
            ),
        )
        arch_dir = path / f"{arch}-linux"
        for directory in ARCH_DIRS:
            (arch_dir / directory).mkdir(parents=True, exist_ok=True)
        runpkg.write_file(
            arch_dir / "ascend_toolkit_install.info",
            vf.render_toolkit_install_info(
                version=self.version,
                innerversion=toolkit["innerversion"],
                compatible_version=toolkit["compatible_version"],
                arch=arch,
                path=str(self.toolkit_home / self.version / f"{arch}-linux"),
            ),
        )
        runpkg.write_file(arch_dir / "conf" / "path.cfg", f"ASCEND_HOME_PATH={self.toolkit_home / self.version}\n")
        runpkg.copy_installer(self.payload, arch_dir / "script")
        runpkg.write_uninstall_script(arch_dir / "script", f"CANN toolkit {self.version}", "--quiet")
        runpkg.write_file(path / "set_env.sh", TOOLKIT_SET_ENV.format(root=self.root), 0o755)
        regression = self.pkg["cann"].get("lab_regression")
        if regression:  # a lab-only regressed release (releases.yaml): the lab engine reads it (engine/cann.py)
            runpkg.write_file(path / vf.LAB_REGRESSION_FILE, json.dumps(regression, sort_keys=True) + "\n")

    def _summary(self) -> None:
        driver = (
            "Installed in /usr/local/Ascend/driver."
            if Path("/usr/local/Ascend/driver/version.info").is_file()
            else "Not installed."
        )  # inferred: the missing-driver wording is not public
        set_env = self.toolkit_home / "set_env.sh"
        self.t.emit("\n===========\n= Summary =\n===========\n")
        self.t.emit(f"Driver:   {driver}")
        self.t.emit(f"Toolkit:  {Path(self.pkg['run_name']).stem} install success, installed in {self.root}.\n")
        self.t.emit("Please make sure that the environment variables have been configured.")
        self.t.emit(f'-  To take effect for all users, you can add "source {set_env}" to /etc/profile.')
        self.t.emit(
            f"-  To take effect for current user, you can exec command below: source {set_env} "
            f'or add "source {set_env}" to ~/.bashrc.'
        )


def _drop_components_missing_in(cfg: vf.VersionCfg, version: str) -> vf.VersionCfg:
    """After switching latest to ``version``, components it lacks (e.g. opp_kernel) run nothing."""
    result = {}
    for name, entry in cfg.items():
        copy = {kind: list(pairs) for kind, pairs in entry.items()}
        if not any(pair[1] == version for pair in copy.get("installed", [])):
            copy["running"], copy["upgrade"] = [], []
        result[name] = copy
    return result


def build_latest(
    toolkit_home: Path,
    version: str,
    arch: str,
    cfg: vf.VersionCfg,
    staged_version: Path | None = None,
    with_kernels: bool = False,
) -> runpkg.StagedDir:
    """Stage a complete ``latest/`` for ``version``; the caller commits it (``with latest: latest.commit()``).

    ``staged_version`` is where the version's files are before their own commit,
    used to decide which links to make (the links themselves point at ``../<version>``);
    ``with_kernels`` links ``opp_kernel`` although it is still being staged.
    """
    source = staged_version or toolkit_home / version
    latest = runpkg.StagedDir(toolkit_home / "latest").__enter__()
    try:
        path = latest.path
        for name, target in LATEST_VERSION_LINKS.items():
            if (source / target).exists():
                os.symlink(f"../{version}/{target}", path / name)
        if with_kernels or (source / "opp_kernel").is_dir():
            os.symlink(f"../{version}/opp_kernel", path / "opp_kernel")
        arch_dir = path / f"{arch}-linux"
        arch_dir.mkdir()
        for entry in sorted((source / f"{arch}-linux").iterdir()):
            os.symlink(f"../../{version}/{arch}-linux/{entry.name}", arch_dir / entry.name)
        if arch == "aarch64":
            os.symlink("aarch64-linux", path / "arm64-linux")
        for name in LATEST_ARCH_LINKS:
            os.symlink(f"{arch}-linux/{name}", path / name)
        for directory in ("python/site-packages", "tools", "var"):
            (path / directory).mkdir(parents=True, exist_ok=True)
        os.symlink(f"../{version}/set_env.sh", path / "set_env.sh")
        runpkg.write_file(path / "platform.ini", "[platform]\narch=" + arch + "\n", 0o664)
        runpkg.write_file(path / "remove_latest_softlink.sh", REMOVE_LATEST_SOFTLINK, 0o550)
        runpkg.write_file(path / "version.cfg", vf.render_version_cfg(cfg), 0o644)
    except BaseException:
        latest.__exit__(None, None, None)
        raise
    return latest


def uninstall_toolkit(pkg: dict, argv: list[str], script_dir: Path) -> int:
    t = Transcript("Toolkit", runpkg.log_dir() / "ascend_toolkit_install.log", cann_style=True)
    for arg in argv:
        if arg != "--quiet":
            t.error(f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {arg}. Only support '--quiet'.")
            return 1
    start = _stamp()
    version, arch = pkg["version"], pkg["arch"]
    toolkit_home = script_dir.parent.parent.parent  # <home>/<ver>/<arch>-linux/script
    try:
        cfg = vf.parse_version_cfg((toolkit_home / "latest" / "version.cfg").read_text())
    except OSError:
        cfg = {}
    running = vf.version_cfg_running(cfg)
    cfg = vf.version_cfg_remove(cfg, version)
    remaining = [
        pair[1]
        for pair in cfg.get("toolkit", {}).get("installed", [])
        if (toolkit_home / pair[1] / f"{arch}-linux").is_dir()
    ]
    runpkg.remove_path(toolkit_home / version)
    if remaining:
        active = running[1] if running and running[1] != version else remaining[-1]
        cfg = _drop_components_missing_in(vf.version_cfg_activate(cfg, active), active)
        with build_latest(toolkit_home, active, arch, cfg) as latest:
            latest.commit()
    else:
        for leftover in ("latest", "set_env.sh"):
            runpkg.remove_path(toolkit_home / leftover)
        if toolkit_home.is_dir() and not any(toolkit_home.iterdir()):
            toolkit_home.rmdir()
        if not (toolkit_home.parent / "nnal").exists():
            CANN_INSTALL_INFO.unlink(missing_ok=True)
    runpkg.log_operation(
        "Uninstall",
        "uninstall.sh",
        "success",
        " ".join(argv),
        start=start,
        install_type="full",
        cann_style=True,
    )
    # inferred wording (CANN common scripts: "<package> package uninstalled successfully!")
    t.info(f"Toolkit package uninstalled successfully! {toolkit_home / version} has been removed.")
    return 0


# =========================================================================== kernels / ops


class KernelsRun(_CannRun):
    """``Ascend-cann-kernels-910b_<ver>`` (up to 8.3.RC2) or ``Ascend-cann-910b-ops_<ver>`` (from 8.5)."""

    fault_component = "kernels"
    valued = KERNELS_VALUED

    def __init__(self, pkg: dict, payload: Path, argv: list[str]):
        kernels = pkg["cann"]["kernels"]
        family = kernels["family"]
        # Observed tag/log for kernels-310b_8.0.0: "[kernels_310b]", ascend_kernels_310b_install.log;
        # the ops package's are inferred by analogy.
        kind = "kernels" if kernels["package"].startswith("kernels") else "ops"
        self.tag = f"{kind}_{family}"
        self.log_name = f"ascend_{kind}_{family}_install.log"
        super().__init__(pkg, payload, argv)

    def run(self) -> None:
        t, kernels = self.t, self.pkg["cann"]["kernels"]
        found = runpkg.board_family()
        if found != kernels["family"]:
            # inferred wording: no public sample of a kernels package run on another chip
            raise self.fail(
                f"The {self.pkg['run_name']} package is for Ascend {kernels['family']} chips, "
                f"but this device has {'no Ascend NPU' if found is None else 'Ascend ' + found + ' chips'}, "
                "install failed!"
            )
        base = self._base_dir()
        if self.toolkit_env_missing("ASCEND_OPP_PATH"):
            # The detail line is inferred; the last line and rc 1 are the vendor install.sh's.
            t.error(
                f"ASCEND_OPP_PATH is not set, the opp path of the toolkit cannot be found; please source "
                f"{self.toolkit_home}/set_env.sh before installing {Path(self.pkg['run_name']).stem}."
            )
            t.info("Run package install failed, please retry after check your device and reboot!")
            raise InstallFailed(1)
        build = self.pkg["cann"]["toolkit"]["build"]
        sub = f"{kernels['inner_package']}-{build}-linux.{self.arch}.run"
        with runpkg.StagedDir(base / "opp_kernel") as staged:
            runpkg.write_file(
                staged.path / "version.info",
                vf.render_key_value(
                    [
                        ("Version", build),
                        ("version_dir", self.version),
                        ("chip_type", kernels["family"]),
                        ("package", kernels["package"]),
                    ]
                ),
            )
            kernel_dir = (
                staged.path / "built-in" / "op_impl" / "ai_core" / "tbe" / "kernel" / f"ascend{kernels['family']}"
            )
            for name in ("add", "matmul_v3", "flash_attention_score", "moe_gating_top_k"):
                runpkg.write_file(kernel_dir / name / f"{name}.json", '{"emulated": true}\n')
                runpkg.pause()
            if self.armed():
                t.error(f"{sub} --{self.mode} --quiet --nox11 install failed")
                raise self.fail(f"{Path(self.pkg['run_name']).stem} install failed.")
            runpkg.copy_installer(self.payload, staged.path / "script")
            runpkg.write_uninstall_script(staged.path / "script", f"{kernels['package']} {self.version}", "--quiet")
            latest = None
            if base.parent == self.toolkit_home:
                cfg = self.read_cfg()
                pair = (build, self.version)
                if vf.version_cfg_running(cfg) and vf.version_cfg_running(cfg)[1] == self.version:
                    cfg = vf.version_cfg_install(cfg, [vf.KERNELS_CFG_COMPONENT], pair)
                    latest = build_latest(self.toolkit_home, self.version, self.arch, cfg, with_kernels=True)
                else:
                    cfg = _add_installed(cfg, vf.KERNELS_CFG_COMPONENT, pair)
                    runpkg.replace_file(self.cfg_path(), vf.render_version_cfg(cfg))
            if latest is None:
                staged.commit()
            else:
                with latest:  # discards the staged latest/ if the commit below fails
                    staged.commit()
                    latest.commit()
        t.info(f"{sub} --{self.mode} --quiet --nox11 install success")
        t.info(f"{Path(self.pkg['run_name']).stem} install success. The installation path is {base.parent}.")

    def _base_dir(self) -> Path:
        """Kernels go under the same version's nnae when present, else under its toolkit (section 6.1)."""
        kind = self.flags.value("--type")
        if kind not in (None, "toolkit", "nnae"):
            raise self.fail(f"ERR_NO:0x0004;ERR_DES:Unsupported type {kind}, only support toolkit or nnae.")
        nnae = self.root / "nnae" / self.version
        toolkit = self.toolkit_home / self.version
        toolkit_installed = (toolkit / f"{self.arch}-linux" / "ascend_toolkit_install.info").is_file()
        if kind == "nnae" or (kind is None and nnae.is_dir()):
            if not nnae.is_dir():
                # inferred wording
                raise self.fail(
                    f"The nnae of version {self.version} is not installed in {self.root / 'nnae'}, "
                    f"please install Ascend-cann-nnae_{self.version} first."
                )
            return nnae
        if not toolkit_installed:
            # inferred wording: kernels need the toolkit (or nnae) of the same version
            raise self.fail(
                f"The toolkit of version {self.version} is not installed in {self.toolkit_home}, "
                f"please install Ascend-cann-toolkit_{self.version} first."
            )
        return toolkit


def _add_installed(cfg: vf.VersionCfg, component: str, pair: vf.VersionPair) -> vf.VersionCfg:
    result = {name: {kind: list(pairs) for kind, pairs in entry.items()} for name, entry in cfg.items()}
    entry = result.setdefault(component, {kind: [] for kind in vf.VERSION_CFG_KINDS})
    entry["installed"] = [p for p in entry.get("installed", []) if p[1] != pair[1]] + [tuple(pair)]
    return result


def uninstall_kernels(pkg: dict, argv: list[str], script_dir: Path) -> int:
    kernels = pkg["cann"]["kernels"]
    kind = "kernels" if kernels["package"].startswith("kernels") else "ops"
    t = Transcript(
        f"{kind}_{kernels['family']}",
        runpkg.log_dir() / f"ascend_{kind}_{kernels['family']}_install.log",
        cann_style=True,
    )
    for arg in argv:
        if arg != "--quiet":
            t.error(f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {arg}. Only support '--quiet'.")
            return 1
    opp_kernel = script_dir.parent
    base = opp_kernel.parent
    toolkit_home = base.parent
    runpkg.remove_path(opp_kernel)
    cfg_path = toolkit_home / "latest" / "version.cfg"
    if cfg_path.is_file():
        cfg = vf.version_cfg_remove(
            vf.parse_version_cfg(cfg_path.read_text()), pkg["version"], [vf.KERNELS_CFG_COMPONENT]
        )
        runpkg.replace_file(cfg_path, vf.render_version_cfg(cfg))
        link = toolkit_home / "latest" / "opp_kernel"
        if link.is_symlink() and not link.exists():
            link.unlink()
    t.info(f"{kernels['package']} package uninstalled successfully! {opp_kernel} has been removed.")
    return 0


# =========================================================================== nnal


class NnalRun(_CannRun):
    tag = "NNAL"  # inferred: no public NNAL transcript
    log_name = "ascend_nnal_install.log"
    fault_component = "nnal"

    def run(self) -> None:
        t, nnal = self.t, self.pkg["cann"]["nnal"]
        if not any((self.toolkit_home).glob(f"*/{self.arch}-linux/ascend_toolkit_install.info")):
            # ATB is built on the CANN runtime; vllm-ascend's guide installs it after the toolkit.
            # inferred wording
            raise self.fail(
                f"The CANN toolkit is not installed in {self.toolkit_home}, please install "
                "Ascend-cann-toolkit first and source its set_env.sh."
            )
        if self.toolkit_env_missing("ASCEND_HOME_PATH"):
            # ATB links against the CANN runtime it finds through the toolkit's env; inferred wording
            raise self.fail(
                f"ASCEND_HOME_PATH is not set, please source {self.toolkit_home}/set_env.sh before installing "
                f"{Path(self.pkg['run_name']).stem}."
            )
        atb_home = self.root / "nnal" / "atb"
        atb_home.mkdir(parents=True, exist_ok=True)
        sub = f"Ascend-cann-atb_{self.version}_linux-{self.arch}.run"
        t.info(f"install package {sub} start")
        with runpkg.StagedDir(atb_home / self.version) as staged:
            runpkg.write_file(
                staged.path / "version.info",
                vf.render_atb_version_info(
                    package_version=nnal["version"],
                    build_version=nnal["atb_version"],
                    platform=self.arch,
                    branch=nnal["branch"],
                    commit_id=nnal["commit_id"],
                ),
            )
            for abi in ("cxx_abi_0", "cxx_abi_1"):
                abi_dir = staged.path / "atb" / abi
                runpkg.write_file(
                    abi_dir / "lib" / "libatb.so", f"emulated libatb.so {nnal['atb_version']} {abi}\n", 0o755
                )
                runpkg.write_file(abi_dir / "include" / "atb" / "atb_infer.h", "/* emulated */\n")
                (abi_dir / "bin").mkdir(exist_ok=True)
                runpkg.pause()
                if abi == "cxx_abi_0" and self.armed():
                    t.error(f"{sub} --install --quiet --nox11 install failed")
                    raise self.fail(f"{Path(self.pkg['run_name']).stem} install failed.")
            runpkg.write_file(staged.path / "atb" / "set_env.sh", NNAL_SET_ENV.format(root=self.root), 0o755)
            runpkg.copy_installer(self.payload, staged.path / "atb" / "script")
            runpkg.write_uninstall_script(staged.path / "atb" / "script", f"NNAL {self.version}", "--quiet")
            runpkg.replace_file(atb_home / "set_env.sh", NNAL_SET_ENV.format(root=self.root), 0o755)
            staged.commit()
        runpkg.replace_symlink(atb_home / "latest", self.version)
        t.info(f"{sub} --install --quiet --nox11 install success")
        t.info(f"{Path(self.pkg['run_name']).stem} install success, installed in {self.root / 'nnal'}.")
        t.emit("Please make sure that the environment variables have been configured.")
        t.emit(f"-  To take effect for current user, you can exec command below: source {atb_home / 'set_env.sh'}")


def uninstall_nnal(pkg: dict, argv: list[str], script_dir: Path) -> int:
    t = Transcript("NNAL", runpkg.log_dir() / "ascend_nnal_install.log", cann_style=True)
    for arg in argv:
        if arg != "--quiet":
            t.error(f"ERR_NO:0x0004;ERR_DES: Unrecognized parameters: {arg}. Only support '--quiet'.")
            return 1
    version_dir = script_dir.parent.parent
    atb_home = version_dir.parent
    runpkg.remove_path(version_dir)
    others = (
        sorted(p.name for p in atb_home.iterdir() if p.is_dir() and not p.is_symlink()) if atb_home.is_dir() else []
    )
    latest = atb_home / "latest"
    if not latest.exists():
        if others:
            runpkg.replace_symlink(latest, others[-1])
        else:
            for leftover in (latest, atb_home / "set_env.sh"):
                if leftover.is_symlink() or leftover.exists():
                    leftover.unlink()
    t.info(f"NNAL package uninstalled successfully! {version_dir} has been removed.")
    return 0


def run_component(pkg: dict, payload: Path, argv: list[str]) -> int:
    runner = {"toolkit": ToolkitRun, "kernels": KernelsRun, "nnal": NnalRun}[pkg["component"]]
    return runner(pkg, payload, argv).main()
