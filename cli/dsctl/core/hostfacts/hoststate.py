"""What an Ascend host has installed and is running, parsed from the raw facts its collector returned (pure).

The collector (an Ansible module, read-only on the host) returns text and a few flags; everything is
interpreted here, on the controller, so the same parsing serves ``dsctl check``, provisioning preflights
and the tests.  Raw shape (every value may be missing or None when the file or tool is absent)::

    {"collector_version": 1, "install_path": "/usr/local/Ascend", "arch": "x86_64", "kernel": "6.1.0-18-amd64",
     "os": {"id": "debian", "version_id": "12", "pretty_name": "..."}, "boot_id": "...", "mem_total_mb": 2048000,
     "disk": {"path": "/usr/local/Ascend", "free_mb": 51200, "total_mb": 102400},
     "files": {"driver_version_info", "firmware_version_info", "ascend_install_info", "cann_install_info",
               "toolkit_version_cfg", "opp_version_info", "nnal_version_info", "env_file"},   # text or None
     "toolkit_dirs": {"8.5.0": "<ascend_toolkit_install.info text or None>"}, "toolkit_latest": "8.5.0",
     "kernels_dirs": {"8.5.0": true}, "nnal_dirs": {"8.5.0": true},
     "npu_smi": {"path": "/usr/local/bin/npu-smi", "info": {"rc", "stdout", "stderr"},
                 "boards": {"0": {"rc", "stdout"}}},
     "upgrade_tool": "/usr/local/Ascend/driver/tools/upgrade-tool",
     "run_user": {"name": "HwHiAiUser", "exists": true, "group_exists": true},
     "serving": {"venv": "/opt/dsctl/serving-venv", "exists": true, "python": "3.11.2", "packages": {...}}}

Where each fact comes from follows ascend-interfaces.md section 7: *installed* versions from the version
files, *running* versions from ``npu-smi`` (header and ``-t board``), which lag until the host reboots
(section 6.4).  Hosts are not under our control, so nothing here raises on bad input: whatever cannot be
read becomes a `Problem` and the rest of the picture is still returned.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from packaging.utils import canonicalize_name
from pydantic import TypeAdapter

from dsctl.core.hostfacts import npusmi
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.versionorder import same_release, version_key

COLLECTOR_VERSION = 1
T = TypeVar("T")

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Board values meaning "nothing to report" (board_fields prints NA for an unknown firmware).
_NOT_AVAILABLE = {"", "NA", "N/A", "-"}


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Problem:
    """Something the collector returned that could not be read; the audit reports it as a warning."""

    component: str  # "driver" | "firmware" | "cann" | "npu" | "env" | "serving" | "system"
    message: str


@dataclass(frozen=True)
class DriverState:
    installed: str | None = None  # driver/version.info Version
    running: str | None = None  # npu-smi header "Version:", else board "Software Version"
    innerversion: str | None = None  # V100R001C19SPC001B124
    train: str | None = None  # "C19"
    accepts_cann_trains: tuple[str, ...] = ()  # compatible_version as trains: ("C13", "C15", ...)
    accepts_firmware_ranges: tuple[tuple[str, str], ...] = ()  # compatible_version_fw: (("7.0.0", "7.5.99"),)
    # /etc/ascend_install.info Driver_Install_Path_Param: CANN's set_env.sh finds the driver through it (4.3).
    install_record_path: str | None = None
    upgrade_tool: str | None = None


@dataclass(frozen=True)
class FirmwareState:
    installed: str | None = None  # firmware/version.info Version
    running: str | None = None  # board "Firmware Version" of the lowest NPU id
    running_mixed: bool = False  # NPUs report different firmware (details in NpusState.boards)
    package_version: str | None = None  # the HDK release the firmware shipped with
    accepts_driver_ranges: tuple[tuple[str, str], ...] = ()  # compatible_version_drv prefix ranges
    # The firmware's own upgrade record: the first /usr/local/Ascend/firmware/**/upgrade* file.  ascend-deployer
    # runs the firmware installer with --upgrade when it exists, else --full (task_firmware.yml;
    # ascend-interfaces.md section 6.2), whatever the driver's state.
    upgrade_record: str | None = None


@dataclass(frozen=True)
class CannState:
    active: str | None = None  # the version latest/ points into
    installed: tuple[str, ...] = ()  # side-by-side versions, oldest first
    innerversion: str | None = None  # of the active toolkit
    train: str | None = None  # "C25"
    accepts_driver_trains: tuple[str, ...] = ()  # the active toolkit's compatible_version as trains
    kernels_version: str | None = None  # latest/opp/version.info version_dir (or Version)
    # Whether kernels/ops are installed into the active version; None when the collector could not tell.
    kernels_installed: bool | None = None
    kernels_installed_for: tuple[str, ...] = ()
    nnal_version: str | None = None  # nnal/atb/latest/version.info "Ascend-cann-atb"
    nnal_installed: tuple[str, ...] = ()  # side-by-side nnal/atb/<version>/ directories, oldest first
    install_path: str | None = None  # /etc/Ascend/ascend_cann_install.info Install_Path


@dataclass(frozen=True)
class NpuChip:
    """One chip row pair of `npu-smi info` (910B: one chip per NPU; A3: two)."""

    npu: int
    chip: int
    name: str
    health: str
    bus_id: str
    hbm_used_mb: int | None
    hbm_total_mb: int | None


@dataclass(frozen=True)
class NpuBoard:
    """`npu-smi info -t board -i <npu>`: the versions the NPU runs and the driver's verdict on them."""

    npu: int
    software_version: str | None
    firmware_version: str | None
    compatibility: str | None  # OK, NOK, UNKNOWN, NOT SUPPORT


@dataclass(frozen=True)
class NpuHealth:
    npu: int
    chip: int
    health: str


@dataclass(frozen=True)
class NpusState:
    present: bool = False  # npu-smi exists on the host
    path: str | None = None
    error: str | None = None  # one line when npu-smi could not report the NPUs
    dcmi_code: int | None = None  # e.g. -8005 (driver not usable yet), -8020 (device held by a container)
    driver_version: str | None = None  # the table header's "Version:", i.e. the driver loaded at boot
    count: int = 0  # distinct NPU ids in the table
    chip_names: tuple[str, ...] = ()  # e.g. ("910B3",)
    chips: tuple[NpuChip, ...] = ()
    unhealthy: tuple[NpuHealth, ...] = ()  # chips whose Health is not OK
    boards: tuple[NpuBoard, ...] = ()
    busy: tuple[int, ...] = ()  # NPU ids with processes in the process table

    @property
    def health_by_npu(self) -> dict[int, str]:
        """Per NPU id; on two-chip cards (A3) a non-OK chip wins over its OK sibling."""
        health: dict[int, str] = {}
        for chip in self.chips:
            if health.get(chip.npu, "OK") == "OK":
                health[chip.npu] = chip.health
        return health

    @property
    def compatibility_by_npu(self) -> dict[int, str | None]:
        return {board.npu: board.compatibility for board in self.boards}

    @property
    def hbm_used_mb(self) -> int | None:
        values = [chip.hbm_used_mb for chip in self.chips if chip.hbm_used_mb is not None]
        return sum(values) if values else None

    @property
    def hbm_total_mb(self) -> int | None:
        values = [chip.hbm_total_mb for chip in self.chips if chip.hbm_total_mb is not None]
        return sum(values) if values else None


@dataclass(frozen=True)
class SystemState:
    arch: str | None = None
    kernel: str | None = None
    os_id: str | None = None
    os_version: str | None = None
    os_pretty_name: str | None = None
    mem_total_mb: int | None = None
    disk_path: str | None = None
    disk_free_mb: int | None = None
    disk_total_mb: int | None = None
    boot_id: str | None = None


@dataclass(frozen=True)
class RunUserState:
    name: str | None = None  # the driver's --install-username (HwHiAiUser by default)
    exists: bool | None = None
    group_exists: bool | None = None


@dataclass(frozen=True)
class ServingState:
    venv: str | None = None
    exists: bool = False
    python: str | None = None
    packages: dict[str, str] = field(default_factory=dict)  # PEP 503 name -> version


@dataclass(frozen=True)
class EnvState:
    present: bool = False
    values: dict[str, str] = field(default_factory=dict)  # the file's exported variables, unexpanded


@dataclass(frozen=True)
class HostState:
    collector_version: int | None = None
    install_path: str | None = None
    driver: DriverState = field(default_factory=DriverState)
    firmware: FirmwareState = field(default_factory=FirmwareState)
    cann: CannState = field(default_factory=CannState)
    npus: NpusState = field(default_factory=NpusState)
    system: SystemState = field(default_factory=SystemState)
    run_user: RunUserState = field(default_factory=RunUserState)
    serving: ServingState = field(default_factory=ServingState)
    env: EnvState = field(default_factory=EnvState)
    pending_reboot: bool = False
    pending_reasons: tuple[str, ...] = ()  # "driver 25.5.0 installed, 24.1.rc3 running"
    problems: tuple[Problem, ...] = ()

    @property
    def run_user_exists(self) -> bool | None:
        return self.run_user.exists

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; ``run_user_exists`` is repeated at the top for playbook conditions (ignored by from_dict)."""
        return {**_host_state_adapter().dump_python(self, mode="json"), "run_user_exists": self.run_user.exists}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostState:
        """Inverse of `to_dict` (missing keys keep their defaults); a value of the wrong type raises
        pydantic.ValidationError naming the field."""
        return _host_state_adapter().validate_python(data)


# --------------------------------------------------------------------------- entry point


def parse_host(raw: Mapping[str, Any]) -> HostState:
    """Interpret the collector's raw facts; never raises, unreadable parts end up in ``problems``."""
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        return HostState(problems=(Problem("system", f"collector returned {type(raw).__name__}, not a mapping"),))
    version = _int(raw.get("collector_version"))
    if version != COLLECTOR_VERSION:
        problems.append(
            Problem("system", f"collector_version {version} is not {COLLECTOR_VERSION}; fields may be misread")
        )
    files = _mapping(raw.get("files"))
    npu_smi = _mapping(raw.get("npu_smi"))

    npu_smi_path = _str(npu_smi.get("path"))
    unread_npus = NpusState(present=npu_smi_path is not None, path=npu_smi_path)
    npus = _guarded(problems, "npu", lambda: _parse_npus(npu_smi, problems), unread_npus)
    driver = _guarded(problems, "driver", lambda: _parse_driver(raw, files, npus, problems), DriverState())
    firmware = _guarded(problems, "firmware", lambda: _parse_firmware(raw, files, npus, problems), FirmwareState())
    cann = _guarded(problems, "cann", lambda: _parse_cann(raw, files, problems), CannState())
    env = _guarded(problems, "env", lambda: _parse_env(files.get("env_file"), problems), EnvState())
    reasons = _pending_reasons(driver, firmware, npus)
    return HostState(
        collector_version=version,
        install_path=_str(raw.get("install_path")),
        driver=driver,
        firmware=firmware,
        cann=cann,
        npus=npus,
        system=_guarded(problems, "system", lambda: _parse_system(raw), SystemState()),
        run_user=_guarded(problems, "system", lambda: _parse_run_user(raw.get("run_user")), RunUserState()),
        serving=_guarded(problems, "serving", lambda: _parse_serving(raw.get("serving")), ServingState()),
        env=env,
        pending_reboot=bool(reasons),
        pending_reasons=tuple(reasons),
        problems=tuple(problems),
    )


def _guarded(problems: list[Problem], component: str, parse: Callable[[], T], fallback: T) -> T:
    # Host files are arbitrary text; one section that trips a parser must not hide the others.
    try:
        return parse()
    except Exception as exc:  # reported below as a Problem, not swallowed
        problems.append(Problem(component, f"could not read the {component} facts: {type(exc).__name__}: {exc}"))
        return fallback


# --------------------------------------------------------------------------- driver and firmware


def _parse_driver(
    raw: Mapping[str, Any],
    files: Mapping[str, Any],
    npus: NpusState,
    problems: list[Problem],
) -> DriverState:
    text = _str(files.get("driver_version_info"))
    fields = vf.parse_key_value(text) if text else {}
    if text and not fields.get("Version"):
        problems.append(Problem("driver", "driver/version.info has no Version= line (truncated or not a driver)"))
    innerversion = fields.get("Innerversion")
    train = vf.release_train(innerversion) if innerversion else None
    if text and fields.get("Version") and not train:
        problems.append(Problem("driver", f"driver/version.info Innerversion {innerversion!r} names no release train"))
    info_driver = npus.driver_version
    board_driver = next((b.software_version for b in npus.boards if b.software_version), None)
    if info_driver and board_driver and info_driver != board_driver:
        problems.append(
            Problem("driver", f"npu-smi header says driver {info_driver}, the board query {board_driver}")
        )
    record = vf.parse_key_value(_str(files.get("ascend_install_info")) or "")
    return DriverState(
        installed=fields.get("Version") or None,
        running=info_driver or board_driver,
        innerversion=innerversion,
        train=train,
        accepts_cann_trains=_trains(fields.get("compatible_version", "")),
        accepts_firmware_ranges=tuple(vf.parse_ranges(fields.get("compatible_version_fw", ""))),
        install_record_path=record.get("Driver_Install_Path_Param") or None,
        upgrade_tool=_str(raw.get("upgrade_tool")),
    )


def _parse_firmware(
    raw: Mapping[str, Any], files: Mapping[str, Any], npus: NpusState, problems: list[Problem]
) -> FirmwareState:
    text = _str(files.get("firmware_version_info"))
    fields = vf.parse_key_value(text) if text else {}
    if text and not fields.get("Version"):
        problems.append(Problem("firmware", "firmware/version.info has no Version= line (truncated?)"))
    running = [board.firmware_version for board in npus.boards if board.firmware_version]
    return FirmwareState(
        installed=fields.get("Version") or None,
        running=running[0] if running else None,
        running_mixed=len(set(running)) > 1,
        package_version=fields.get("package_version") or None,
        accepts_driver_ranges=tuple(vf.parse_ranges(fields.get("compatible_version_drv", ""))),
        upgrade_record=_firmware_record(raw, text),
    )


def _firmware_record(raw: Mapping[str, Any], version_info: str | None) -> str | None:
    if "firmware_record" in raw:
        return _str(raw.get("firmware_record"))
    # A collector that predates the key: the version file stands in (the installer writes both together;
    # firmware, like the driver, always lives under /usr/local/Ascend).
    return "/usr/local/Ascend/firmware/version.info" if version_info else None


def _trains(id_list_text: str) -> tuple[str, ...]:
    """``[V100R001C13],[V100R001C15]`` -> ("C13", "C15"); ids without a train are dropped."""
    trains = (vf.release_train(item) for item in vf.parse_id_list(id_list_text))
    return tuple(train for train in trains if train)


def _pending_reasons(driver: DriverState, firmware: FirmwareState, npus: NpusState) -> list[str]:
    """Files changed but the NPUs still run the old pair: they converge only at reboot (section 6.4)."""
    reasons = []
    if driver.installed and driver.running and not same_release(driver.installed, driver.running):
        reasons.append(f"driver {driver.installed} installed, {driver.running} running")
    elif driver.installed and npus.present and npus.dcmi_code == -8005:
        # -8005 is what npu-smi prints after a driver or firmware install without reboot (mind-cluster FAQ).
        reasons.append(f"driver {driver.installed} installed, not loaded yet (npu-smi: {npus.error})")
    if firmware.installed and firmware.running and not same_release(firmware.installed, firmware.running):
        reasons.append(f"firmware {firmware.installed} installed, {firmware.running} running")
    elif firmware.installed and npus.boards and not firmware.running:
        reasons.append(f"firmware {firmware.installed} installed, none active on the NPUs")
    return reasons


# --------------------------------------------------------------------------- npu-smi


def _parse_npus(npu_smi: Mapping[str, Any], problems: list[Problem]) -> NpusState:
    path = _str(npu_smi.get("path"))
    if path is None:
        return NpusState()
    boards = _parse_boards(npu_smi.get("boards"), problems)
    info = npu_smi.get("info")
    if not isinstance(info, Mapping):
        problems.append(Problem("npu", "npu-smi is installed but `npu-smi info` was not collected"))
        return NpusState(present=True, path=path, boards=boards)
    rc = _int(info.get("rc"))
    stdout, stderr = _str(info.get("stdout")) or "", _str(info.get("stderr")) or ""
    parsed = npusmi.parse_info(stdout)
    if rc not in (0, None) and not parsed.npus:
        return NpusState(
            present=True,
            path=path,
            error=_error_line(stdout, stderr) or f"npu-smi info exited {rc}",
            dcmi_code=npusmi.dcmi_error_code(stdout + "\n" + stderr),
            boards=boards,
        )
    _check_table(stdout, rc, parsed, problems)
    chips = tuple(
        NpuChip(
            npu=npu.npu_id,
            chip=npu.chip_id,
            name=npu.name,
            health=npu.health,
            bus_id=npu.bus_id,
            hbm_used_mb=npu.hbm_used_mb,
            hbm_total_mb=npu.hbm_total_mb,
        )
        for npu in parsed.npus
    )
    return NpusState(
        present=True,
        path=path,
        error=None if chips else "npu-smi info listed no NPUs",
        driver_version=parsed.driver_version or None,
        count=len({chip.npu for chip in chips}),
        chip_names=tuple(dict.fromkeys(chip.name for chip in chips)),
        chips=chips,
        unhealthy=tuple(NpuHealth(c.npu, c.chip, c.health) for c in chips if c.health != "OK"),
        boards=boards,
        busy=tuple(sorted({process.npu_id for process in parsed.processes})),
    )


def _check_table(stdout: str, rc: int | None, parsed: npusmi.InfoResult, problems: list[Problem]) -> None:
    """Say when the table looks cut short: parse_info silently drops a chip whose second row is missing."""
    parsed_chips = len(parsed.npus)
    if rc not in (0, None):
        problems.append(Problem("npu", f"npu-smi info exited {rc} but printed a table"))
    if not parsed.driver_version:
        problems.append(Problem("npu", "npu-smi info printed no version header (truncated or unknown format)"))
    started = sum(1 for line in stdout.splitlines() if _is_status_row(line))
    if started > parsed_chips:
        problems.append(
            Problem("npu", f"npu-smi info began {started} chip rows but only {parsed_chips} are complete (truncated?)")
        )
    if not parsed_chips:
        problems.append(Problem("npu", "npu-smi info printed no complete NPU rows (truncated or unknown format)"))
    elif "Process id" not in stdout:
        problems.append(Problem("npu", "npu-smi info ends before its process table (truncated?)"))


def _is_status_row(line: str) -> bool:
    """The first row of a chip: "| <npu id> <name> |" ("| 0     910B3 |"), where the second row and the
    process rows hold only numbers in their first cell; counting these tells how many chips the table began."""
    cells = line.strip().split("|")
    first = cells[1].split() if len(cells) > 2 and not line.strip().startswith("+") else []
    return len(first) == 2 and first[0].isdigit() and not first[1].isdigit()


def _parse_boards(raw_boards: Any, problems: list[Problem]) -> tuple[NpuBoard, ...]:
    boards = []
    for key, result in _mapping(raw_boards).items():
        npu = _int(key)
        result = _mapping(result)
        rc = _int(result.get("rc"))
        if npu is None:
            problems.append(Problem("npu", f"board query result under {key!r}, which is not an NPU id"))
            continue
        if rc not in (0, None):
            line = _error_line(_str(result.get("stdout")) or "", _str(result.get("stderr")) or "")
            problems.append(Problem("npu", f"npu-smi info -t board -i {npu} exited {rc}: {line or 'no output'}"))
            continue
        fields = npusmi.parse_board(_str(result.get("stdout")) or "")
        if "Compatibility" not in fields and "Software Version" not in fields:
            problems.append(Problem("npu", f"npu-smi info -t board -i {npu} printed no board fields (truncated?)"))
            continue
        boards.append(
            NpuBoard(
                npu=npu,
                software_version=_available(fields.get("Software Version")),
                firmware_version=_available(fields.get("Firmware Version")),
                compatibility=_available(fields.get("Compatibility")),
            )
        )
    return tuple(sorted(boards, key=lambda board: board.npu))


def _error_line(stdout: str, stderr: str) -> str | None:
    """The informative line of a failed npu-smi: the DCMI one ("... ret is -8020"), else the last line."""
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    dcmi = [line for line in lines if "ret is" in line or "dcmi" in line.lower()]
    return (dcmi or lines or [None])[-1]


def _available(value: str | None) -> str | None:
    return None if value is None or value.strip() in _NOT_AVAILABLE else value.strip()


# --------------------------------------------------------------------------- CANN


def _parse_cann(raw: Mapping[str, Any], files: Mapping[str, Any], problems: list[Problem]) -> CannState:
    cfg_text = _str(files.get("toolkit_version_cfg"))
    cfg = vf.parse_version_cfg(cfg_text) if cfg_text else {}
    if cfg_text and "toolkit" not in cfg:
        problems.append(Problem("cann", "latest/version.cfg has no toolkit lines (truncated?)"))
    cfg_running = vf.version_cfg_running(cfg, "toolkit")
    cfg_installed = [pair[1] for pair in cfg.get("toolkit", {}).get("installed", [])]

    raw_dirs = _mapping(raw.get("toolkit_dirs"))
    records = {str(ver): vf.parse_key_value(text) for ver, text in raw_dirs.items() if _str(text)}
    for version in cfg_installed:
        if version not in records:
            problems.append(Problem("cann", f"version.cfg lists CANN {version} but its ascend_toolkit_install.info "
                                            "is missing"))

    latest = _str(raw.get("toolkit_latest"))
    active = latest or (cfg_running[1] if cfg_running else None)
    if latest and cfg_running and not same_release(latest, cfg_running[1]):
        problems.append(Problem("cann", f"latest/ points into {latest} but version.cfg runs {cfg_running[1]}"))
    record = records.get(active, {}) if active else {}
    if active and not record:
        problems.append(Problem("cann", f"no ascend_toolkit_install.info for the active CANN {active}"))
    innerversion = record.get("innerversion")

    kernels_for = _kernels_installed_for(raw.get("kernels_dirs"), cfg)
    kernels_known = isinstance(raw.get("kernels_dirs"), Mapping) or vf.KERNELS_CFG_COMPONENT in cfg
    opp = vf.parse_key_value(_str(files.get("opp_version_info")) or "")
    nnal_text = _str(files.get("nnal_version_info"))
    nnal = vf.parse_colon_key_value(nnal_text).get("Ascend-cann-atb") if nnal_text else None
    if nnal_text and not nnal:
        problems.append(Problem("cann", "nnal/atb/latest/version.info has no Ascend-cann-atb line"))
    return CannState(
        active=active,
        installed=tuple(sorted(set(cfg_installed) | set(records), key=version_key)),
        innerversion=innerversion,
        train=vf.release_train(innerversion) if innerversion else None,
        accepts_driver_trains=_trains(record.get("compatible_version", "")),
        kernels_version=opp.get("version_dir") or opp.get("Version") or None,
        kernels_installed=(active in kernels_for) if active and kernels_known else None,
        kernels_installed_for=kernels_for,
        nnal_version=nnal or None,
        nnal_installed=tuple(sorted((str(name) for name, present in _mapping(raw.get("nnal_dirs")).items()
                                     if present is True), key=version_key)),
        install_path=vf.parse_key_value(_str(files.get("cann_install_info")) or "").get("Install_Path") or None,
    )


def _kernels_installed_for(raw_dirs: Any, cfg: vf.VersionCfg) -> tuple[str, ...]:
    """Versions with kernels/ops: an opp_kernel directory in the version dir, or version.cfg's opp_kernel list."""
    from_dirs = {str(version) for version, present in _mapping(raw_dirs).items() if present is True}
    from_cfg = {pair[1] for pair in cfg.get(vf.KERNELS_CFG_COMPONENT, {}).get("installed", [])}
    return tuple(sorted(from_dirs | from_cfg, key=version_key))


# --------------------------------------------------------------------------- env file


def _parse_env(text: Any, problems: list[Problem]) -> EnvState:
    """``export NAME='value'`` lines of the managed env file, read as the shell would quote them.

    Other lines (comments, ``[ -f X ] && . X``) are part of the file but set no managed variable.
    Values stay unexpanded (``${ASCEND_TOOLKIT_HOME}/lib64``), which is how the file's template writes them.
    """
    if not isinstance(text, str):
        return EnvState()
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError as exc:
            problems.append(Problem("env", f"env file line {number} cannot be read as shell words: {exc}"))
            continue
        assignments = words[1:] if words[:1] == ["export"] else words
        if not assignments or not all(_is_assignment(word) for word in assignments):
            continue
        for word in assignments:
            name, _, value = word.partition("=")
            values[name] = value
    return EnvState(present=True, values=values)


def _is_assignment(word: str) -> bool:
    name, equals, _ = word.partition("=")
    return bool(equals) and bool(_ENV_NAME_RE.fullmatch(name))


# --------------------------------------------------------------------------- system, run user, serving


def _parse_system(raw: Mapping[str, Any]) -> SystemState:
    os_info, disk = _mapping(raw.get("os")), _mapping(raw.get("disk"))
    return SystemState(
        arch=_str(raw.get("arch")),
        kernel=_str(raw.get("kernel")),
        os_id=_str(os_info.get("id")),
        os_version=_str(os_info.get("version_id")),
        os_pretty_name=_str(os_info.get("pretty_name")),
        mem_total_mb=_int(raw.get("mem_total_mb")),
        disk_path=_str(disk.get("path")),
        disk_free_mb=_int(disk.get("free_mb")),
        disk_total_mb=_int(disk.get("total_mb")),
        boot_id=_str(raw.get("boot_id")),
    )


def _parse_run_user(raw_user: Any) -> RunUserState:
    user = _mapping(raw_user)
    return RunUserState(name=_str(user.get("name")), exists=_bool(user.get("exists")),
                        group_exists=_bool(user.get("group_exists")))


def _parse_serving(raw_serving: Any) -> ServingState:
    serving = _mapping(raw_serving)
    packages = {
        pep503_name(str(name)): str(version)
        for name, version in _mapping(serving.get("packages")).items()
        if isinstance(version, str | int | float) and not isinstance(version, bool)
    }
    return ServingState(
        venv=_str(serving.get("venv")),
        exists=_bool(serving.get("exists")) is True,
        python=_str(serving.get("python")),
        packages=packages,
    )


def pep503_name(name: str) -> str:
    """``torch_npu`` and ``Torch.NPU`` are the distribution ``torch-npu`` (PEP 503 normalisation)."""
    return canonicalize_name(name)


# --------------------------------------------------------------------------- raw value coercion


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


# --------------------------------------------------------------------------- dict round trip

# pydantic does the round trip the dataclasses declare: tuples to JSON lists and back, nested states, defaults
# for missing keys, unknown keys (``run_user_exists``) ignored.  Built once, on first use, so importing the
# parser (the emulator's tests, `dsctl --help`) does not pay for building the schema.
@functools.cache
def _host_state_adapter() -> TypeAdapter[HostState]:
    return TypeAdapter(HostState)
