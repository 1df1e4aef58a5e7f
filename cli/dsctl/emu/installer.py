"""Entry points of the emulated Ascend packages on a lab host.

``install.py`` at the root of every package payload calls ``main``; the
``script/uninstall.sh`` an install leaves behind calls ``uninstall_main``.
Which installer runs is decided by the payload's ``package.json`` (written by
dsctl.lab.packages from releases.yaml), whose ``component`` is one of
``COMPONENTS``: the same names the lab's fault injection uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsctl.emu import install_cann, install_hdk, runpkg

COMPONENTS = ("driver", "firmware", "toolkit", "kernels", "nnal")


def load_package(directory: Path) -> dict:
    return json.loads((directory / "package.json").read_text())


def main(argv: list[str] | None = None, payload: Path | None = None) -> int:
    """Install from an extracted payload; ``argv`` are the flags given to the .run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    payload = payload or Path(__file__).resolve().parents[2]
    pkg = load_package(payload)
    component = pkg["component"]
    try:
        if component == "driver":
            return install_hdk.install_driver(pkg, payload, argv)
        if component == "firmware":
            return install_hdk.install_firmware(pkg, payload, argv)
        return install_cann.run_component(pkg, payload, argv)
    except runpkg.InstallFailed as failed:
        return failed.rc


def uninstall_main(script_dir: Path, argv: list[str]) -> int:
    """``<component>/script/uninstall.sh``: ``script_dir`` holds the package.json of the installed package."""
    pkg = load_package(script_dir)
    component = pkg["component"]
    if component == "driver":
        return install_hdk.uninstall_driver(pkg, argv)
    if component == "firmware":
        return install_hdk.uninstall_firmware(pkg, argv)
    if component == "toolkit":
        return install_cann.uninstall_toolkit(pkg, argv, script_dir)
    if component == "kernels":
        return install_cann.uninstall_kernels(pkg, argv, script_dir)
    return install_cann.uninstall_nnal(pkg, argv, script_dir)


if __name__ == "__main__":
    raise SystemExit(main())
