"""The emulated firmware query tool (/usr/local/Ascend/driver/tools/upgrade-tool).

Standard library plus dsctl.emu.hwstate only: packed into a zipapp by the
driver .run package. Two queries, as used by ascend-deployer and guides:

``--device_index -1 --component -1 --version`` (sourced)::

    {
    Get component version(7.1.0.7.220) succeed for deviceId(0), componentType(0).
    \t{"device_id":0, "component":nve, "version":7.1.0.7.220}
    ...
    }

  Lines and braces: Ascend/mind-cluster docs/zh/faultdiag/user_guide.md (910
  host, 23.0.5 / 7.1.0.7.220: components nve(0), uefi(3), imu(8), imp(9) per
  device); the tab before the JSON line is from a 310P capture in a public
  issue (other captures show it expanded to 8 spaces). The component list of a
  910B is not published; the 910 list is reused (inferred).

``--device_index -1 --system_version`` (format sourced, value inferred)::

    {
    Get system version(22.0.3) succeed, deviceId(0)
    \t{"device_id":0, "version":22.0.3}
    }

  Format from 310 and Atlas 200 DK captures, where the value equals the
  installed driver package version (22.0.3 next to firmware 1.83.10.1.248),
  i.e. the device OS shipped in the driver package. So the lab prints the
  driver loaded at boot. ascend-deployer runs this query for its firmware
  test (case_firmware.yml) but only prints it; for the firmware version use
  the component query or ``npu-smi info -t board``.

Failures (driver not loaded, no board, no active firmware, bad arguments) have
no published capture; their messages are inferred and exit status is 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dsctl.emu import hwstate

EXIT_OK = 0
EXIT_FAILURE = 1

# (componentType, name) of the firmware components a 910 reports (see docstring).
COMPONENTS = ((0, "nve"), (3, "uefi"), (8, "imu"), (9, "imp"))

USAGE = """\
Usage: upgrade-tool --device_index <index> --system_version
       upgrade-tool --device_index <index> --component <type> --version
"""  # inferred
DEVICE_INIT_FAILED = "dsmi init failed. ret is -8005"  # inferred, mirrors npu-smi's -8005
INVALID_DEVICE = "Invalid device index({index})."  # inferred
NO_FIRMWARE = "Get component version failed for deviceId({device}), componentType({component})."  # inferred


class UsageError(Exception):
    pass


class DeviceError(Exception):
    pass


def render_component_versions(device_ids: Sequence[int], version: str) -> str:
    lines = ["{"]
    for device in device_ids:
        for component_type, name in COMPONENTS:
            lines.append(
                f"Get component version({version}) succeed for deviceId({device}), "
                f"componentType({component_type})."
            )
            lines.append(f'\t{{"device_id":{device}, "component":{name}, "version":{version}}}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_system_versions(device_ids: Sequence[int], version: str) -> str:
    lines = ["{"]
    for device in device_ids:
        lines.append(f"Get system version({version}) succeed, deviceId({device})")
        lines.append(f'\t{{"device_id":{device}, "version":{version}}}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _parse_args(args: Sequence[str]) -> tuple[int, str]:
    """(device index, "system" | "component") from the two supported command lines."""
    values: dict[str, str | None] = {}
    position = 0
    while position < len(args):
        option = args[position]
        if option in ("--device_index", "--component"):
            if position + 1 >= len(args):
                raise UsageError(option)
            values[option] = args[position + 1]
            position += 2
        elif option in ("--system_version", "--version"):
            values[option] = None
            position += 1
        else:
            raise UsageError(option)
    index = values.get("--device_index")
    if index is None or not index.lstrip("-").isdigit():
        raise UsageError("--device_index")
    if set(values) == {"--device_index", "--system_version"}:
        return int(index), "system"
    if set(values) == {"--device_index", "--component", "--version"} and values["--component"] == "-1":
        return int(index), "component"
    raise UsageError("arguments")


def _device_ids(index: int) -> list[int]:
    if not hwstate.present():
        raise DeviceError(DEVICE_INIT_FAILED)
    ids = [int(npu["logic_id"]) for npu in hwstate.board()["npus"]]
    if index == -1:
        return ids
    if index not in ids:
        raise DeviceError(INVALID_DEVICE.format(index=index))
    return [index]


def _output(index: int, query: str) -> str:
    running = hwstate.running()
    if running.get("driver") is None:
        raise DeviceError(DEVICE_INIT_FAILED)
    devices = _device_ids(index)
    if query == "system":
        return render_system_versions(devices, running["driver"]["version"])
    firmware = running.get("firmware")
    if not firmware:
        raise DeviceError(NO_FIRMWARE.format(device=devices[0], component=COMPONENTS[0][0]))
    return render_component_versions(devices, firmware)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        index, query = _parse_args(args)
    except UsageError:
        sys.stdout.write(USAGE)
        return EXIT_FAILURE
    try:
        sys.stdout.write(_output(index, query))
    except DeviceError as error:
        sys.stderr.write(f"{error}\n")
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
