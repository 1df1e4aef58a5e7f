"""Helpers shared by the engine tests, which start the real engine on 127.0.0.1."""

from __future__ import annotations

import platform
import socket
from pathlib import Path

from dsctl.core.hostfacts import versionfiles as vf
from dsctl.emu import install_cann

# (inner build, version, innerversion) of the toolkits the tests install side by side
TOOLKITS = {"8.0.0": ("7.6.0.1.220", "V100R001C19SPC001B124"), "8.3.RC2": ("8.3.0.2.220", "V100R001C23SPC002B210")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install_toolkits(root: Path, versions: list[str], active: str) -> Path:
    """A CANN toolkit tree under ``root``/ascend-toolkit as the lab's emulated installer lays it out: each version's
    ``<arch>-linux/ascend_toolkit_install.info`` and ``set_env.sh``, and ``latest/`` (the installer's own
    ``build_latest``: links into ``../<active>/`` plus version.cfg).  Returns the toolkit home."""
    home = root / "ascend-toolkit"
    arch = platform.machine()
    cfg: vf.VersionCfg = {}
    for version in versions:
        build, inner = TOOLKITS[version]
        arch_dir = home / version / f"{arch}-linux"
        arch_dir.mkdir(parents=True)
        (arch_dir / "ascend_toolkit_install.info").write_text(vf.render_toolkit_install_info(
            version=version, innerversion=inner, compatible_version=["V100R001C19"], arch=arch, path=str(arch_dir)))
        (home / version / "set_env.sh").write_text(install_cann.TOOLKIT_SET_ENV.format(root=root))
        cfg = vf.version_cfg_install(cfg, vf.TOOLKIT_CFG_COMPONENTS, (build, version))
    cfg = vf.version_cfg_activate(cfg, active)
    latest = install_cann.build_latest(home, active, arch, cfg)
    with latest:
        latest.commit()
    (home / "set_env.sh").write_text(install_cann.TOOLKIT_SET_ENV.format(root=root))
    return home
