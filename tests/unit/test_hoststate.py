"""parse_host: the collector's raw facts become a HostState; bad input becomes problems, never exceptions.

Raw facts are built the way a lab host would show them: version files rendered by the lab's own renderers
from releases.yaml entries, npu-smi text rendered by dsctl.core.hostfacts.npusmi from a chips.yaml board, verbatim
npu-smi captures from tests/fixtures/npu_smi.  The builders below are shared with test_compat and test_audit.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from dsctl import data
from dsctl.core.hostfacts import npusmi
from dsctl.core.hostfacts import versionfiles as vf
from dsctl.core.hostfacts.hoststate import HostState, parse_host
from dsctl.core.lab.plan import board_state
from dsctl.emu.npu_smi import DCMI_INIT_FAILED, EXIT_FAILURE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu_smi"
RELEASES = data.load("releases")
CHIPS = data.load("chips")
ROOT = "/usr/local/Ascend"
ARCH = "x86_64"
NPU_SMI = "/usr/local/bin/npu-smi"

# ascend-interfaces.md 2.6, verbatim: a second non-privileged container opening the same NPU.
DEVICE_BUSY = (
    "DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\n"
    "dcmi model initialized failed, because the device is used. ret is -8020\n"
)

ENV_EXPECTED = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "TASK_QUEUE_ENABLE": "1",
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}
SERVING_PINS = {"torch": "2.8.0", "torch-npu": "2.8.0.post2", "vllm": "0.13.0", "vllm-ascend": "0.13.0",
                "triton-ascend": "3.2.0"}


# --------------------------------------------------------------------------- builders (shared)


def hdk(version: str) -> dict:
    return next(entry for entry in RELEASES["hdk"] if entry["version"] == version)


def cann(version: str) -> dict:
    return next(entry for entry in RELEASES["cann"] if entry["version"] == version)


def driver_file(hdk_version: str) -> str:
    return vf.render_driver_version_info(hdk(hdk_version)["driver"])


def firmware_file(hdk_version: str) -> str:
    return vf.render_firmware_version_info(hdk(hdk_version)["firmware"])


def install_record() -> str:
    text = vf.install_info_add(
        "", "Driver", user="HwHiAiUser", group="HwHiAiUser",
        fields={"Install_Type": "full", "Install_Path_Param": ROOT, "Install_For_All": "yes"},
    )
    return vf.install_info_add(
        text, "Firmware", user="HwHiAiUser", group="HwHiAiUser",
        fields={"Install_Type": "full", "Install_Path_Param": ROOT},
    )


def toolkit_record(version: str) -> str:
    toolkit = cann(version)["toolkit"]
    return vf.render_toolkit_install_info(
        version=version,
        innerversion=toolkit["innerversion"],
        compatible_version=toolkit["compatible_version"],
        arch=ARCH,
        path=f"{ROOT}/ascend-toolkit/{version}/{ARCH}-linux",
    )


def version_cfg(installed: list[str], active: str, kernels: list[str]) -> str:
    """latest/version.cfg as the emulated installers leave it after installing ``installed`` in order."""
    cfg: vf.VersionCfg = {}
    for version in installed:
        cfg = vf.version_cfg_install(cfg, vf.TOOLKIT_CFG_COMPONENTS, (cann(version)["toolkit"]["build"], version))
    for version in kernels:
        cfg = vf.version_cfg_install(cfg, [vf.KERNELS_CFG_COMPONENT], (cann(version)["toolkit"]["build"], version))
    return vf.render_version_cfg(vf.version_cfg_activate(cfg, active))


def opp_file(version: str) -> str:
    release = cann(version)
    return vf.render_opp_version_info(
        inner_version=release["toolkit"]["build"],
        version_dir=version,
        timestamp=release["opp_version_info"]["timestamp"],
        required_amct_acl_version=release["opp_version_info"]["required_package_amct_acl_version"],
    )


def nnal_file(version: str) -> str:
    nnal = cann(version)["nnal"]
    return vf.render_atb_version_info(
        package_version=nnal["version"],
        build_version=nnal["atb_version"],
        platform=ARCH,
        branch=nnal["branch"],
        commit_id=nnal["commit_id"],
    )


def env_file(values: dict[str, str]) -> str:
    lines = [
        "# Managed by dsctl: environment of every NPU process.",
        f"[ -f {ROOT}/ascend-toolkit/set_env.sh ] && . {ROOT}/ascend-toolkit/set_env.sh",
        f"[ -f {ROOT}/nnal/atb/set_env.sh ] && . {ROOT}/nnal/atb/set_env.sh",
        *(f"export {name}='{value}'" for name, value in values.items()),
    ]
    return "\n".join(lines) + "\n"


def npu_board(npus: int = 8, health: dict[int, str] | None = None) -> dict:
    board = board_state("lab-01", npus, "910B3", CHIPS["chips"], CHIPS["bus_ids"])
    for npu_id, value in (health or {}).items():
        board["npus"][npu_id]["health"] = value
    return board


def npu_smi_raw(
    driver: dict,
    firmware: str | None,
    *,
    npus: int = 8,
    health: dict[int, str] | None = None,
    compatibility: dict[int, str] | None = None,
    processes: tuple[npusmi.NpuProcess, ...] = (),
) -> dict:
    """What the collector gets from `npu-smi info` and `-t board -i N` while ``driver`` and ``firmware`` run.

    ``driver`` is a releases.yaml driver entry (version, compatible_version_fw); the board's Compatibility is
    the emulated driver's own verdict unless ``compatibility`` overrides it per NPU.
    """
    board = npu_board(npus, health)
    table = npusmi.render_info(driver["version"], npusmi.npus_from_board(board, processes), processes)
    verdict = npusmi.compatibility_verdict(firmware, vf.format_ranges(driver["compatible_version_fw"]))
    boards = {}
    for npu in board["npus"]:
        value = (compatibility or {}).get(npu["id"], verdict)
        fields = npusmi.board_fields(board, npu, driver["version"], firmware, value)
        boards[str(npu["id"])] = {"rc": 0, "stdout": npusmi.render_board(fields), "stderr": ""}
    return {"path": NPU_SMI, "info": {"rc": 0, "stdout": table, "stderr": ""}, "boards": boards}


def npu_smi_failed(stderr: str, rc: int = EXIT_FAILURE) -> dict:
    return {"path": NPU_SMI, "info": {"rc": rc, "stdout": "", "stderr": stderr}, "boards": {}}


def bare_raw() -> dict:
    """A host with nothing Ascend on it yet: no driver, no npu-smi, no CANN, no venv."""
    return {
        "collector_version": 1,
        "install_path": ROOT,
        "arch": ARCH,
        "kernel": "6.1.0-18-amd64",
        "os": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)"},
        "boot_id": "0e1f6b1c-4a52-4c4f-9a51-0d0c3b1e7a11",
        "mem_total_mb": 2048000,
        "disk": {"path": "/usr/local", "free_mb": 51200, "total_mb": 102400},
        "files": dict.fromkeys(
            ["driver_version_info", "firmware_version_info", "ascend_install_info", "cann_install_info",
             "toolkit_version_cfg", "opp_version_info", "nnal_version_info", "env_file"]
        ),
        "toolkit_dirs": {},
        "toolkit_latest": None,
        "kernels_dirs": {},
        "npu_smi": {"path": None, "info": None, "boards": {}},
        "upgrade_tool": None,
        "firmware_record": None,
        "run_user": {"name": "HwHiAiUser", "exists": True, "group": "HwHiAiUser", "group_exists": True},
        "serving": {"venv": "/opt/dsctl/serving-venv", "exists": False, "python": None, "packages": {}},
    }


def host_raw(
    hdk_version: str = "25.5.0",
    cann_versions: tuple[str, ...] = ("8.5.0",),
    *,
    active: str | None = None,
    running_hdk: str | None = None,
    kernels: bool = True,
    nnal: bool = True,
    npus: int = 8,
    health: dict[int, str] | None = None,
    env: dict[str, str] | None = None,
    packages: dict[str, str] | None = None,
) -> dict:
    """A provisioned host: HDK ``hdk_version`` installed (running ``running_hdk``, default the same), the CANN
    versions installed side by side in order with ``active`` (default the last) behind latest/."""
    active = active or cann_versions[-1]
    running = hdk(running_hdk or hdk_version)
    raw = bare_raw()
    raw["files"].update(
        driver_version_info=driver_file(hdk_version),
        firmware_version_info=firmware_file(hdk_version),
        ascend_install_info=install_record(),
        cann_install_info=vf.render_cann_install_info(ROOT, f"{ROOT}/ascend-toolkit/latest"),
        toolkit_version_cfg=version_cfg(list(cann_versions), active, [active] if kernels else []),
        opp_version_info=opp_file(active),
        nnal_version_info=nnal_file(active) if nnal else None,
        env_file=env_file(ENV_EXPECTED if env is None else env),
    )
    raw["toolkit_dirs"] = {version: toolkit_record(version) for version in cann_versions}
    raw["toolkit_latest"] = active
    raw["kernels_dirs"] = {version: kernels and version == active for version in cann_versions}
    raw["npu_smi"] = npu_smi_raw(running["driver"], running["firmware"]["version"], npus=npus, health=health)
    raw["upgrade_tool"] = f"{ROOT}/driver/tools/upgrade-tool"
    raw["firmware_record"] = f"{ROOT}/firmware/script/upgrade.sh"  # what the lab's firmware installer writes
    raw["serving"] = {
        "venv": "/opt/dsctl/serving-venv",
        "exists": True,
        "python": "3.11.2",
        "packages": dict(SERVING_PINS if packages is None else packages),
    }
    return raw


# --------------------------------------------------------------------------- tests


def test_bare_host_has_nothing_installed_and_no_npu_smi():
    state = parse_host(bare_raw())
    assert state.driver.installed is None and state.driver.running is None
    assert state.firmware.installed is None
    assert state.cann.active is None and state.cann.installed == ()
    assert not state.npus.present and state.npus.error is None and state.npus.count == 0
    assert not state.pending_reboot
    assert state.system.os_id == "debian" and state.system.disk_free_mb == 51200
    assert state.run_user_exists is True and state.to_dict()["run_user_exists"] is True
    assert state.problems == ()


def test_provisioned_host_reads_every_component():
    state = parse_host(host_raw("25.5.0", ("8.5.0",)))
    assert (state.driver.installed, state.driver.running, state.driver.train) == ("25.5.0", "25.5.0", "C25")
    assert state.driver.accepts_cann_trains == ("C21", "C22", "C23", "C24", "C25")
    assert state.driver.accepts_firmware_ranges == (("7.0.0", "8.9.9"),)
    assert state.driver.install_record_path == ROOT
    assert (state.firmware.installed, state.firmware.running) == ("7.8.0.5.216", "7.8.0.5.216")
    assert ("25.5", "25.5.") in state.firmware.accepts_driver_ranges
    assert state.cann.active == "8.5.0" and state.cann.installed == ("8.5.0",)
    assert state.cann.train == "C25" and state.cann.accepts_driver_trains[0] == "C21"
    assert state.cann.kernels_installed is True and state.cann.kernels_version == "8.5.0"
    assert state.cann.nnal_version == "8.5.0" and state.cann.install_path == ROOT
    assert state.npus.count == 8 and state.npus.chip_names == ("910B3",)
    assert state.npus.unhealthy == () and state.npus.compatibility_by_npu == dict.fromkeys(range(8), "OK")
    assert state.npus.hbm_total_mb == 8 * 65536
    assert state.env.present and state.env.values == ENV_EXPECTED
    assert state.serving.packages["torch-npu"] == "2.8.0.post2"
    assert not state.pending_reboot and state.problems == ()


def test_side_by_side_cann_lists_every_version_and_the_active_one():
    state = parse_host(host_raw("25.5.0", ("8.3.RC2", "8.5.0", "8.0.0"), active="8.3.RC2"))
    assert state.cann.installed == ("8.0.0", "8.3.RC2", "8.5.0")
    assert state.cann.active == "8.3.RC2" and state.cann.train == "C23"
    assert state.cann.kernels_installed_for == ("8.3.RC2",)


def test_kernels_missing_for_the_active_cann():
    state = parse_host(host_raw(kernels=False))
    assert state.cann.kernels_installed is False


def test_installed_driver_not_running_yet_is_a_pending_reboot():
    state = parse_host(host_raw("25.5.0", running_hdk="24.1.rc3"))
    assert state.driver.installed == "25.5.0" and state.driver.running == "24.1.rc3"
    assert state.pending_reboot
    assert "driver 25.5.0 installed, 24.1.rc3 running" in state.pending_reasons
    assert any(reason.startswith("firmware 7.8.0.5.216 installed, 7.5.0.1.129") for reason in state.pending_reasons)


def test_a_running_driver_spelled_in_upper_case_is_the_installed_one():
    # Vendor pages and some npu-smi builds print "24.1.RC3" for the 24.1.rc3 package: not a pending reboot.
    raw = host_raw("24.1.rc3")
    for block in (raw["npu_smi"]["info"], *raw["npu_smi"]["boards"].values()):
        block["stdout"] = block["stdout"].replace("24.1.rc3", "24.1.RC3")
    state = parse_host(raw)
    assert state.driver.installed == "24.1.rc3" and state.driver.running == "24.1.RC3"
    assert not state.pending_reboot and state.pending_reasons == ()


def test_side_by_side_canns_are_listed_in_release_order_whatever_the_case():
    raw = host_raw("25.5.0", ("8.3.RC2", "8.5.0", "8.0.0"), active="8.5.0")
    raw["toolkit_dirs"]["8.3.rc10"] = "version=8.3.rc10\n"  # a made-up later RC, spelled in lower case
    state = parse_host(raw)
    assert state.cann.installed == ("8.0.0", "8.3.RC2", "8.3.rc10", "8.5.0")


def test_fresh_driver_before_its_first_reboot_is_pending_not_broken():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_failed(DCMI_INIT_FAILED + "\n")
    state = parse_host(raw)
    assert state.npus.present and state.npus.dcmi_code == -8005
    assert state.npus.error == DCMI_INIT_FAILED
    assert state.pending_reboot and "not loaded yet" in state.pending_reasons[0]


def test_device_held_by_a_container_names_the_dcmi_line():
    raw = host_raw()
    raw["npu_smi"] = npu_smi_failed(DEVICE_BUSY)
    state = parse_host(raw)
    assert state.npus.dcmi_code == -8020
    assert state.npus.error.endswith("ret is -8020")
    assert not state.pending_reboot


def test_unhealthy_chips_are_listed_with_their_health():
    state = parse_host(host_raw(health={3: "Critical", 5: "Warning"}))
    assert [(sick.npu, sick.health) for sick in state.npus.unhealthy] == [(3, "Critical"), (5, "Warning")]
    assert state.npus.health_by_npu[3] == "Critical" and state.npus.health_by_npu[0] == "OK"


def test_mixed_firmware_across_npus_is_flagged():
    raw = host_raw("24.1.rc3", ("8.0.0",))
    board7 = raw["npu_smi"]["boards"]["7"]
    board7["stdout"] = board7["stdout"].replace("7.5.0.1.129", "7.3.0.1.231")
    state = parse_host(raw)
    assert state.firmware.running == "7.5.0.1.129" and state.firmware.running_mixed


def test_busy_npus_come_from_the_process_table():
    raw = host_raw()
    raw["npu_smi"]["info"]["stdout"] = (FIXTURES / "info_910b3_x8_25.2.0.txt").read_text()
    state = parse_host(raw)
    assert state.npus.busy == (2,)
    assert state.driver.running == "25.2.0"


def test_a3_listing_counts_npus_not_chips():
    raw = host_raw()
    raw["npu_smi"] = {"path": NPU_SMI, "boards": {},
                      "info": {"rc": 0, "stdout": (FIXTURES / "info_a3_ascend910_25.2.3.txt").read_text()}}
    state = parse_host(raw)
    assert len(state.npus.chips) == 2 * state.npus.count
    assert state.npus.chip_names == ("Ascend910",)


def test_env_file_tolerates_comments_sourcing_and_shell_quoting():
    text = (
        "# dsctl\n"
        "[ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ] && . /usr/local/Ascend/ascend-toolkit/set_env.sh\n"
        "source /usr/local/Ascend/nnal/atb/set_env.sh\n"
        "export A='x y'  # trailing comment\n"
        'export B="it\'s"\n'
        "export C=plain D='two'\n"
        "E=unexported\n"
        "export F='unterminated\n"
    )
    raw = bare_raw()
    raw["files"]["env_file"] = text
    state = parse_host(raw)
    assert state.env.values == {"A": "x y", "B": "it's", "C": "plain", "D": "two", "E": "unexported"}
    assert [problem.component for problem in state.problems] == ["env"]


def test_round_trip_through_json():
    state = parse_host(host_raw("25.5.0", ("8.0.0", "8.5.0"), health={1: "Warning"}, running_hdk="24.1.rc3"))
    again = HostState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state


def test_from_dict_keeps_defaults_for_missing_keys():
    assert HostState.from_dict({"driver": {"installed": "25.5.0"}}).driver.installed == "25.5.0"
    assert HostState.from_dict({}) == HostState()


def test_from_dict_rebuilds_nested_tuples_and_ignores_the_convenience_copy():
    data = {"npus": {"chips": [{"npu": 0, "chip": 0, "name": "910B3", "health": "OK", "bus_id": "0000:c1:00.0",
                                "hbm_used_mb": 3300, "hbm_total_mb": 65536}], "busy": [0]},
            "firmware": {"accepts_driver_ranges": [["24.1", "24.1."]]}, "run_user_exists": True}
    state = HostState.from_dict(data)
    assert state.npus.chips[0].hbm_total_mb == 65536 and state.npus.busy == (0,)
    assert state.firmware.accepts_driver_ranges == (("24.1", "24.1."),)
    assert HostState.from_dict(state.to_dict()) == state


def test_from_dict_refuses_a_value_of_the_wrong_type_naming_the_field():
    with pytest.raises(ValidationError, match="npus.count"):
        HostState.from_dict({"npus": {"count": "eight"}})


# --------------------------------------------------------------------------- robustness


def truncated_tables() -> list[str]:
    full = (FIXTURES / "info_910b3_x8_25.2.0.txt").read_text()
    lines = full.splitlines(keepends=True)
    return [
        "".join(lines[:7]),  # stops after NPU 0's first row
        "".join(lines[:10]),  # NPU 0 complete, NPU 1 started
        "".join(lines[:30]),  # all chips, no process table
        full[: len(full) // 3],  # cut in the middle of a line
        "".join(lines[:2]),  # header only
    ]


@pytest.mark.parametrize("stdout", truncated_tables())
def test_truncated_npu_smi_output_is_a_problem_not_an_exception(stdout):
    raw = host_raw()
    raw["npu_smi"]["info"]["stdout"] = stdout
    state = parse_host(raw)
    assert any(problem.component == "npu" for problem in state.problems)


def test_truncated_table_keeps_the_complete_chips():
    raw = host_raw()
    raw["npu_smi"]["info"]["stdout"] = truncated_tables()[1]
    state = parse_host(raw)
    assert state.npus.count == 1 and state.npus.error is None


def test_truncated_board_and_version_files_are_problems():
    raw = host_raw()
    raw["npu_smi"]["boards"]["0"]["stdout"] = ""
    raw["files"]["driver_version_info"] = "Versi"
    raw["files"]["toolkit_version_cfg"] = "# version: 1.0\nruntime_running_ver"
    state = parse_host(raw)
    components = {problem.component for problem in state.problems}
    assert {"npu", "driver", "cann"} <= components
    assert state.driver.installed is None


GARBAGE = [
    None,
    [],
    "not a mapping",
    {"files": "nope", "npu_smi": [1, 2], "toolkit_dirs": None, "serving": 3, "os": "x"},
    {"collector_version": "1", "files": {"driver_version_info": 42, "env_file": b"bytes"},
     "npu_smi": {"path": NPU_SMI, "info": {"rc": "x", "stdout": None}, "boards": {"zero": {}, "1": None}}},
    {"npu_smi": {"path": NPU_SMI, "info": {"rc": 0, "stdout": "\x00\xff|||\n| 0 910B3 | OK |\n"}, "boards": []}},
    {"toolkit_dirs": {"8.5.0": "version=8.5.0\ninnerversion=garbage\ncompatible_version=[[["},
     "toolkit_latest": "8.5.0", "kernels_dirs": {"8.5.0": "yes"},
     "files": {"toolkit_version_cfg": "toolkit_running_version=[:::]"}},
]


@pytest.mark.parametrize("raw", GARBAGE)
def test_garbage_never_raises(raw):
    state = parse_host(raw)
    assert isinstance(state, HostState)
    json.dumps(state.to_dict())


def test_garbage_values_in_a_real_host_are_contained():
    raw = copy.deepcopy(host_raw())
    raw["serving"]["packages"] = {"torch": None, "vllm": ["0.13.0"], "torch_npu": "2.8.0.post2"}
    raw["mem_total_mb"] = "lots"
    state = parse_host(raw)
    assert state.serving.packages == {"torch-npu": "2.8.0.post2"}
    assert state.system.mem_total_mb is None
    assert state.driver.installed == "25.5.0"


def test_a_parser_failure_is_contained_to_its_section(monkeypatch):
    def broken(text):
        raise ValueError("unexpected layout")

    monkeypatch.setattr(npusmi, "parse_info", broken)
    state = parse_host(host_raw())
    assert state.npus.present and state.npus.path == NPU_SMI and state.npus.count == 0
    assert any("unexpected layout" in problem.message for problem in state.problems)
    assert state.driver.installed == "25.5.0" and state.cann.active == "8.5.0"
