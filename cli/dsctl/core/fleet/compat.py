"""Whether a host's installed driver, firmware and CANN accept each other, judged from their own files (pure).

ascend-interfaces.md section 8, applied to a parsed `HostState`:

1. release trains both ways: CANN's ``compatible_version`` must list the driver's train (error otherwise);
   the driver's ``compatible_version`` should list CANN's train (warning only, see below);
2. the firmware version lies inside one of the driver's ``compatible_version_fw`` ranges;
3. the driver version matches one of the firmware's ``compatible_version_drv`` prefix ranges;
4. every NPU's board query says ``Compatibility : OK`` (the driver's own runtime verdict).

Only the files on the host are consulted, never releases.yaml: the files are what the vendor's own tools
check, and they cover versions dsctl has never heard of.  Fixes therefore speak in trains and ranges; naming
concrete releases is the job of whoever knows the catalogue (dsctl.core.fleet.matrix).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from dsctl.core.fleet.versions import in_ranges, matches_prefix_ranges
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.hoststate import CannState, DriverState, FirmwareState, HostState

SEVERITIES = ("error", "warning", "info")
COMPONENTS = ("driver", "firmware", "cann", "npu", "network", "env", "serving", "system")


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning" | "info"
    component: str  # one of COMPONENTS
    sentence: str  # one sentence stating the fact, with versions
    fix: str  # one sentence saying what to do
    code: str = ""  # stable identifier for programs and tests, e.g. "cann-rejects-driver"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def file_compatibility(state: HostState) -> list[Finding]:
    """Section 8 checks on the installed files, plus the boards' runtime verdict."""
    return [
        *_train_findings(state.driver, state.cann),
        *_firmware_range_findings(state.driver, state.firmware),
        *_driver_range_findings(state.driver, state.firmware),
        *_board_findings(state),
    ]


# --------------------------------------------------------------------------- 1. release trains


def _train_findings(driver: DriverState, cann: CannState) -> list[Finding]:
    if not driver.installed or not cann.active:
        return []  # nothing to pair; missing components are drift, reported by the audit
    if not driver.train or not cann.train:
        side = "driver/version.info Innerversion" if not driver.train else "the toolkit's innerversion"
        return [
            Finding(
                "info",
                "driver" if not driver.train else "cann",
                f"Driver {driver.installed} and CANN {cann.active} cannot be checked against each other: "
                f"{side} names no release train.",
                "Reinstall the package whose version file is incomplete.",
                "train-unknown",
            )
        ]
    findings = []
    if not cann.accepts_driver_trains:
        findings.append(
            Finding(
                "info",
                "cann",
                f"CANN {cann.active} lists no compatible_version, so its acceptance of driver {driver.installed} "
                f"(train {driver.train}) cannot be checked.",
                "Reinstall the CANN toolkit if its ascend_toolkit_install.info is incomplete.",
                "cann-trains-unknown",
            )
        )
    cann_refuses = bool(cann.accepts_driver_trains) and driver.train not in cann.accepts_driver_trains
    if cann_refuses:
        findings.append(
            Finding(
                "error",
                "cann",
                f"CANN {cann.active} (train {cann.train}) does not accept driver {driver.installed} "
                f"(train {driver.train}): its compatible_version lists {describe_trains(cann.accepts_driver_trains)}.",
                f"Install a driver of a train CANN {cann.active} lists ({describe_trains(cann.accepts_driver_trains)}) "
                f"or a CANN whose compatible_version lists {driver.train}.",
                "cann-rejects-driver",
            )
        )
    # The driver-side list is only a warning: observed working pairs fail it (releases.yaml NOTE: driver
    # 24.1.rc3 lists C13..C19 yet runs CANN 8.0.0, train C20, and Huawei pairs 8.0.0 with 24.1.rc2 officially).
    if driver.accepts_cann_trains and cann.train not in driver.accepts_cann_trains:
        findings.append(
            Finding(
                "warning",
                "driver",
                f"Driver {driver.installed} (train {driver.train}) does not list CANN {cann.active}'s train "
                f"{cann.train}: its compatible_version lists {describe_trains(driver.accepts_cann_trains)}.",
                "Resolve the CANN-side refusal; a pair both sides list avoids this too."
                if cann_refuses
                else f"Nothing to do while CANN {cann.active} accepts the driver, as working pairs often fail this "
                f"direction; a driver that lists {cann.train} would satisfy both.",
                "driver-does-not-list-cann",
            )
        )
    return findings


def describe_trains(trains: Iterable[str]) -> str:
    """("C13", "C15", "C17", "C18", "C19") -> "C13, C15, C17..C19": consecutive trains as a span."""
    numbers = sorted({int(match[1]) for train in trains if (match := re.fullmatch(r"C(\d+)", train))})
    return ", ".join(f"C{low}" if low == high else f"C{low}..C{high}" for low, high in _runs(numbers))


# --------------------------------------------------------------------------- 2. driver -> firmware


def _firmware_range_findings(driver: DriverState, firmware: FirmwareState) -> list[Finding]:
    if not driver.installed or not firmware.installed:
        return []
    if not driver.accepts_firmware_ranges:
        return [
            Finding(
                "info",
                "firmware",
                f"Driver {driver.installed} lists no compatible_version_fw, so firmware {firmware.installed} "
                "cannot be checked against it.",
                "Reinstall the driver if its version.info is incomplete.",
                "firmware-ranges-unknown",
            )
        ]
    ranges = vf.format_ranges(driver.accepts_firmware_ranges)
    if in_ranges(firmware.installed, driver.accepts_firmware_ranges):
        return []
    return [
        Finding(
            "error",
            "firmware",
            f"Firmware {firmware.installed} is outside driver {driver.installed}'s compatible_version_fw {ranges}.",
            f"Install a driver whose compatible_version_fw includes {firmware.installed}, or firmware within "
            f"{ranges}, then reboot.",
            "firmware-outside-driver-range",
        )
    ]


# --------------------------------------------------------------------------- 3. firmware -> driver


def _driver_range_findings(driver: DriverState, firmware: FirmwareState) -> list[Finding]:
    if not driver.installed or not firmware.installed or not firmware.accepts_driver_ranges:
        return []
    ranges = vf.format_ranges(firmware.accepts_driver_ranges)
    # "[24.1,24.1.]" means any 24.1.* (prefix ranges, see dsctl.core.fleet.versions.matches_prefix_ranges).
    if matches_prefix_ranges(driver.installed, firmware.accepts_driver_ranges):
        return []
    return [
        Finding(
            "error",
            "driver",
            f"Driver {driver.installed} is outside firmware {firmware.installed}'s compatible_version_drv {ranges}.",
            f"Install firmware whose compatible_version_drv covers driver {driver.installed}, or a driver "
            f"matching {ranges}, then reboot.",
            "driver-outside-firmware-range",
        )
    ]


# --------------------------------------------------------------------------- 4. runtime verdict

_BOARD_FIXES = {
    "NOK": "Install a driver and firmware that accept each other (see the version-file checks) and reboot.",
    "UNKNOWN": "Reinstall the firmware (UNKNOWN means its install failed or it is too old to say) and reboot.",
}


def _board_findings(state: HostState) -> list[Finding]:
    boards = state.npus.boards
    if not boards:
        return []
    if state.pending_reboot:
        # Until the reboot the boards describe the pair loaded at boot, not the installed one (section 6.4).
        return [
            Finding(
                "info",
                "npu",
                "Board Compatibility was not checked: it describes the driver and firmware loaded before "
                "the pending reboot.",
                "Reboot the host, then check again.",
                "board-check-deferred",
            )
        ]
    by_verdict: dict[str, list[int]] = {}
    for board in boards:
        verdict = board.compatibility or "missing"
        if verdict != "OK":
            by_verdict.setdefault(verdict, []).append(board.npu)
    findings = []
    for verdict, npus in by_verdict.items():
        first = next(board for board in boards if board.npu == npus[0])
        verb = "reports" if len(npus) == 1 else "report"
        findings.append(
            Finding(
                "error",
                "npu",
                f"{describe_npus(npus)} {verb} Compatibility {verdict} for driver {first.software_version or '?'} "
                f"with firmware {first.firmware_version or '?'}.",
                _BOARD_FIXES.get(
                    verdict, "Check the driver and firmware pair with `npu-smi info -t board`, reinstall it and reboot."
                ),
                "board-incompatible",
            )
        )
    return findings


def describe_npus(ids: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5] -> "NPUs 0-3, 5"; [4] -> "NPU 4"."""
    numbers = sorted(set(ids))
    spans = ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in _runs(numbers))
    return f"NPU {spans}" if len(numbers) == 1 else f"NPUs {spans}"


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) spans of consecutive values."""
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs
