"""The emulated hardware of a lab host, as the emulated driver tools see it.

Standard library only: this module runs on lab hosts inside the emulated
vendor programs (npu-smi, upgrade-tool, the .run installers), which ship as
self-contained zipapps and must not depend on dsctl being installed there.

Two kinds of state, as on a real server (ascend-interfaces.md section 6.4):

* ``HW_DIR`` is the hardware itself and survives a reboot: the boards
  (``board.json``), what firmware is flashed (``flash.json``) and injected
  faults (``faults.json``).  The lab controller writes it from outside.
* ``RUNNING_FILE`` is what the kernel has loaded in this boot: the driver
  version that was installed when the host booted and the firmware that was
  active then.  It lives on the host's /run, which every boot starts empty.

Nothing under these paths is read by dsctl's roles: they see the host only
through npu-smi, upgrade-tool, installer exit codes and the disk.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time: the emulated tools import this module at every call
if TYPE_CHECKING:
    from typing import Any

LAB_RUN_DIR = Path(os.environ.get("DSCTL_LAB_RUN_DIR", "/run/dsctl-lab"))
HW_DIR = LAB_RUN_DIR / "hw"
RUNNING_FILE = LAB_RUN_DIR / "running.json"
NPU_PROCESS_DIR = LAB_RUN_DIR / "npu-procs"

BOARD_FILE = "board.json"
FLASH_FILE = "flash.json"
FAULTS_FILE = "faults.json"
NPU_PLANE_FILE = "npu_plane.json"


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def present(hw_dir: Path = HW_DIR) -> bool:
    return (hw_dir / BOARD_FILE).is_file()


def board(hw_dir: Path = HW_DIR) -> dict[str, Any]:
    """Static board description plus per-NPU health and load.

    Shape: {"chip": "910B3", "family": "910b", "npu_smi_name": "910B3",
    "hbm_total_mb": 65536, "memory_total_mb": 0, "pci_device_id": "0xD802",
    "subsystem_vendor_id", "subsystem_device_id", "product_name", "board_id",
    "npus": [{"id": 0, "chip_id": 0, "logic_id": 0, "bus_id": "0000:C1:00.0",
    "serial": "...", "health": "OK", "hbm_used_mb": 3408, "memory_used_mb": 0,
    "power_w": 97.9, "temp_c": 34, "aicore_pct": 0}, ...]}
    """
    return _read_json(hw_dir / BOARD_FILE, None)


def save_board(data: dict[str, Any], hw_dir: Path = HW_DIR) -> None:
    _write_json(hw_dir / BOARD_FILE, data)


def flashed_firmware(hw_dir: Path = HW_DIR) -> str | None:
    """Firmware version written to the NPUs' flash; becomes active at the next boot."""
    return _read_json(hw_dir / FLASH_FILE, {}).get("firmware")


def flash_firmware(version: str | None, hw_dir: Path = HW_DIR) -> None:
    _write_json(hw_dir / FLASH_FILE, {"firmware": version})


def faults(hw_dir: Path = HW_DIR) -> dict[str, Any]:
    """Injected faults: {"install_fail": "any"|"driver"|"firmware"|"toolkit"|..., "npu_link_down": [3, ...],
    "hccn_conf_wrong": {"key", "right", "wrong"}}."""
    return _read_json(hw_dir / FAULTS_FILE, {})


def save_faults(data: dict[str, Any], hw_dir: Path = HW_DIR) -> None:
    _write_json(hw_dir / FAULTS_FILE, data)


def npu_plane(hw_dir: Path = HW_DIR) -> dict[str, Any] | None:
    """How the NPUs' RoCE ports are cabled: {"interface": "npu-plane", "switch": {"name", "chassis_mac",
    "description", "management_address"}, "ports": ["200GE1/0/1", ...] (one per NPU)}; None when they are not
    cabled (a host outside a lab)."""
    return _read_json(hw_dir / NPU_PLANE_FILE, None)


def save_npu_plane(data: dict[str, Any], hw_dir: Path = HW_DIR) -> None:
    _write_json(hw_dir / NPU_PLANE_FILE, data)


def npu_links_down(hw_dir: Path = HW_DIR) -> set[int]:
    """NPUs whose RoCE link is down (lab fault link-down): faults.json "npu_link_down"."""
    return {int(npu) for npu in faults(hw_dir).get("npu_link_down", [])}


def take_install_failure(component: str, hw_dir: Path = HW_DIR) -> bool:
    """True once if an installer fault is armed for this component (or for any)."""
    with locked(hw_dir):
        current = faults(hw_dir)
        armed = current.get("install_fail")
        if armed not in ("any", component):
            return False
        current.pop("install_fail")
        save_faults(current, hw_dir)
        return True


@contextmanager
def locked(hw_dir: Path = HW_DIR):
    with open(hw_dir / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def running(path: Path = RUNNING_FILE) -> dict[str, Any]:
    """What this boot loaded.

    Shape: {"boot_id": "<uuid>", "driver": null | {"version": "24.1.rc3",
    "compatible_version_fw": "[7.0.0,7.5.99]"}, "firmware": null | "7.5.0.1.129"}.
    "driver" is null when no driver was installed at boot (npu-smi then
    cannot talk to the device).
    """
    return _read_json(path, {"boot_id": None, "driver": None, "firmware": None})


def save_running(data: dict[str, Any], path: Path = RUNNING_FILE) -> None:
    _write_json(path, data)


def npu_processes(proc_dir: Path = NPU_PROCESS_DIR) -> list[dict[str, Any]]:
    """Processes holding NPU memory, each registered by the process itself as
    ``<pid>.json`` = {"pid", "name", "npu", "chip", "memory_mb"}; entries whose
    process has exited are ignored, as the driver forgets a dead process."""
    found = []
    for entry in sorted(proc_dir.glob("*.json")) if proc_dir.is_dir() else []:
        record = _read_json(entry, None)
        if record and Path(f"/proc/{record['pid']}").exists():
            found.append(record)
    return found
