"""roles/cann/library/cann_switch.py on a real directory tree: the latest/ farm it builds for an installed
version is the farm that version's own installer builds (dsctl.emu.install_cann.build_latest)."""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

import pytest

from dsctl.core.fleet.install_steps import switched_version_cfg
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.emu.install_cann import TOOLKIT_SET_ENV, build_latest

MODULE = Path(__file__).resolve().parents[2] / "roles" / "cann" / "library" / "cann_switch.py"
ARCH = platform.machine()
A, B = "8.3.RC2", "8.5.0"


def load_module():
    spec = importlib.util.spec_from_file_location("cann_switch", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeAnsible:
    """Only the attribute the switch functions read; the functions do the real file work."""

    check_mode = False


def install_version(home: Path, version: str, *, kernels: bool) -> None:
    """What the emulated toolkit (and kernels) installer leaves in <home>/<version>/."""
    root = home / version
    for directory in ("runtime/lib64", "compiler/bin", "hccl/lib64", "opp/test-ops", "toolkit/tools", "atc/bin",
                      "fwkacllib/lib64", "pyACL/python", f"{ARCH}-linux/bin", f"{ARCH}-linux/lib64",
                      f"{ARCH}-linux/include", f"{ARCH}-linux/conf", f"{ARCH}-linux/script"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / f"{ARCH}-linux" / "ascend_toolkit_install.info").write_text(f"version={version}\n")
    (root / "set_env.sh").write_text(TOOLKIT_SET_ENV.format(root=home.parent) + f"# {version}\n")
    if kernels:
        (root / "opp_kernel").mkdir()
        (root / "opp_kernel" / "version.info").write_text(f"version_dir={version}\n")


def cfg_for(versions: list[str], active: str) -> vf.VersionCfg:
    cfg: vf.VersionCfg = {}
    for version in versions:
        cfg = vf.version_cfg_install(cfg, vf.TOOLKIT_CFG_COMPONENTS, (f"build-{version}", version))
        cfg = vf.version_cfg_install(cfg, [vf.KERNELS_CFG_COMPONENT], (f"build-{version}", version))
    return vf.version_cfg_activate(cfg, active)


def farm(latest: Path) -> dict[str, str]:
    """Every entry of a latest/ farm: link -> target, file -> content, directory -> "dir"."""
    listing = {}
    for path in sorted(latest.rglob("*")):
        name = str(path.relative_to(latest))
        if path.is_symlink():
            listing[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            listing[name] = "dir"
        else:
            listing[name] = path.read_text()
    return listing


@pytest.fixture
def toolkit_home(tmp_path: Path) -> Path:
    home = tmp_path / "Ascend" / "ascend-toolkit"
    install_version(home, A, kernels=True)
    install_version(home, B, kernels=True)
    # B installed last: latest/ is B's farm, version.cfg runs B and lists both
    with build_latest(home, B, ARCH, cfg_for([A, B], B)) as latest:
        latest.commit()
    (home / "set_env.sh").write_text((home / B / "set_env.sh").read_text())
    return home


def test_switch_builds_the_farm_the_installer_of_that_version_builds(toolkit_home, tmp_path):
    module = load_module()
    text = (toolkit_home / "latest" / "version.cfg").read_text()
    previous, changes = module.switch_toolkit(FakeAnsible(), str(toolkit_home), A, switched_version_cfg(text, A))
    assert previous == B and changes == ["latest", "set_env.sh"]

    reference_home = tmp_path / "reference" / "ascend-toolkit"
    install_version(reference_home, A, kernels=True)
    install_version(reference_home, B, kernels=True)
    with build_latest(reference_home, A, ARCH, vf.parse_version_cfg(switched_version_cfg(text, A))) as latest:
        latest.commit()
    assert farm(toolkit_home / "latest") == farm(reference_home / "latest")
    assert (toolkit_home / "set_env.sh").read_text().endswith(f"# {A}\n")
    assert not list(toolkit_home.glob(".latest.dsctl-*"))
    # both versions stay installed
    assert (toolkit_home / B / f"{ARCH}-linux" / "ascend_toolkit_install.info").is_file()


def test_switching_back_restores_the_original_farm_and_a_second_run_changes_nothing(toolkit_home):
    module = load_module()
    original = farm(toolkit_home / "latest")
    text = (toolkit_home / "latest" / "version.cfg").read_text()
    module.switch_toolkit(FakeAnsible(), str(toolkit_home), A, switched_version_cfg(text, A))
    text = (toolkit_home / "latest" / "version.cfg").read_text()
    module.switch_toolkit(FakeAnsible(), str(toolkit_home), B, switched_version_cfg(text, B))
    assert farm(toolkit_home / "latest") == original
    text = (toolkit_home / "latest" / "version.cfg").read_text()
    assert module.switch_toolkit(FakeAnsible(), str(toolkit_home), B, switched_version_cfg(text, B)) == (B, [])


def test_a_version_without_kernels_gets_no_opp_kernel_link(toolkit_home):
    module = load_module()
    install_version(toolkit_home, "8.2.RC1", kernels=False)
    module.switch_toolkit(FakeAnsible(), str(toolkit_home), "8.2.RC1", None)
    assert not (toolkit_home / "latest" / "opp_kernel").is_symlink()
    assert os.readlink(toolkit_home / "latest" / "runtime") == "../8.2.RC1/runtime"


def test_an_interrupted_fallback_is_put_back_before_switching(toolkit_home):
    module = load_module()
    original = farm(toolkit_home / "latest")
    os.rename(toolkit_home / "latest", toolkit_home / module.OLD_FARM)  # cut between the two renames
    (toolkit_home / module.NEW_FARM).mkdir()
    module.recover(str(toolkit_home))
    assert farm(toolkit_home / "latest") == original
    assert not list(toolkit_home.glob(".latest.dsctl-*"))


def test_refuses_a_version_that_is_not_installed(toolkit_home):
    module = load_module()
    with pytest.raises(module.SwitchError, match="not installed"):
        module.switch_toolkit(FakeAnsible(), str(toolkit_home), "9.9.9", None)


def test_nnal_latest_link_is_replaced(tmp_path):
    module = load_module()
    atb = tmp_path / "nnal" / "atb"
    for version in (A, B):
        (atb / version).mkdir(parents=True)
        (atb / version / "version.info").write_text(f"    Ascend-cann-atb : {version}\n")
    os.symlink(B, atb / "latest")
    assert module.switch_nnal(FakeAnsible(), str(tmp_path), A) == (B, ["nnal"])
    assert os.readlink(atb / "latest") == A
    assert module.switch_nnal(FakeAnsible(), str(tmp_path), A) == (A, [])
