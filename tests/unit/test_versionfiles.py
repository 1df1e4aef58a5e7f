"""versionfiles: the renderings of the reference's verbatim samples are byte-identical; parsers round-trip.

Samples are copied from shared/reference/ascend-interfaces.md section 4 (each cites its public source).
"""

from __future__ import annotations

import pytest

from dsctl.core.hostfacts import versionfiles as vf

# 24.1.rc3 driver (vllm-project/vllm-ascend#451)
DRIVER_24_1_RC3 = """\
Version=24.1.rc3
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=V100R001C19SPC001B124
compatible_version=[V100R001C13],[V100R001C15],[V100R001C17],[V100R001C18],[V100R001C19]
compatible_version_fw=[7.0.0,7.5.99]
package_version=24.1.rc3
"""

# 25.3.rc1 driver (hicann/pypto docs/zh/tutorials/appendix/faq/cann-package-incompatible.md)
DRIVER_25_3_RC1 = """\
Version=25.3.rc1
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=V100R001C23SPC002B212
compatible_version=[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C22],[V100R001C23]
compatible_version_fw=[7.0.0,8.9.9]
package_version=25.3.rc1
"""

# firmware 7.5.0.1.129 (stephenfuyuxin/npuAdapter CodeFormerNPUMig/README.md)
FIRMWARE_7_5_0_1_129 = """\
Version=7.5.0.1.129
firmware_version=1.0
package_version=24.1.rc3
compatible_version_drv=[23.0.0,23.0.0.],[24.0,24.0.],[24.1,24.1.]
"""

# /etc/ascend_install.info, liguodongiot/llm-action (firmware installed before the driver's lines)
INSTALL_INFO_LLM_ACTION = """\
UserName=HwHiAiUser
UserGroup=HwHiAiUser
Firmware_Install_Type=full
Firmware_Install_Path_Param=/usr/local/Ascend
Driver_Install_Type=full
Driver_Install_Path_Param=/usr/local/Ascend
Driver_Install_For_All=yes
"""

# /etc/ascend_install.info, longllovers guide (driver first, with Driver_Install_Mode)
INSTALL_INFO_LONGLLOVERS = """\
UserName=HwHiAiUser
UserGroup=HwHiAiUser
Driver_Install_Type=full
Driver_Install_Path_Param=/usr/local/Ascend
Driver_Install_For_All=yes
Driver_Install_Mode=normal
Firmware_Install_Type=full
Firmware_Install_Path_Param=/usr/local/Ascend
"""

# CANN 8.3.RC2 ascend_toolkit_install.info (vllm-project/vllm-ascend#6512)
TOOLKIT_8_3_RC2 = """\
package_name=Ascend-cann-toolkit
version=8.3.RC2
innerversion=V100R001C23SPC002B210
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C23]
arch=aarch64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.3.RC2/aarch64-linux
"""

# CANN 8.1.RC1.alpha001 in a custom path (vllm-project/vllm-ascend#834)
TOOLKIT_8_1_RC1_ALPHA = """\
package_name=Ascend-cann-toolkit
version=8.1.RC1.alpha001
innerversion=V100R001C21B071
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21]
arch=aarch64
os=linux
path=/data/8.1/ascend-toolkit/8.1.RC1.alpha001/aarch64-linux
"""

# version_cfg.inc format comment (vllm-project/vllm-ascend csrc/scripts/package/common/sh/version_cfg.inc)
VERSION_CFG_FORMAT_COMMENT = """\
# version: 1.0
runtime_running_version=[1.80:CANN-1.80]
runtime_installed_version=[1.79:CANN-1.79][1.80:CANN-1.80]
"""

_CFG_COMPONENTS = ("runtime", "compiler", "hccl", "opp", "toolkit", "aoe", "ncs", "opp_kernel")
# CANN 8.2.RC2 latest/version.cfg (itove/ascend docs/src/ver-2.1.md)
VERSION_CFG_8_2_RC2 = "# version: 1.0\n" + "".join(
    f"{component}_{kind}_version=[8.2.0.2.220:8.2.RC2]\n"
    for kind in ("running", "upgrade", "installed")
    for component in _CFG_COMPONENTS
)

# CANN 8.5 latest/opp/version.info (hicann/pypto FAQ)
OPP_8_5 = """\
Version=8.5.0.2.220
version_dir=8.5.0
timestamp=20251117_000024591
required_package_amct_acl_version="8.5"
"""

# NNAL/ATB version.info from the MindIE 2.1.RC2 image (itove/ascend docs/src/ver-2.1.md)
ATB_8_2_RC2 = """\
    Ascend-cann-atb : 8.2.RC2
    Ascend-cann-atb Version : 8.2.RC2.B030
    Platform : aarch64
    branch : br_release_cann_8.2.RC1_20251226
    commit id : 02a94694766ebf12d820aa4b5d9c95c4fe149379
"""

MINDIE_VERSION_INFO = """\
Ascend-mindie : MindIE 2.1.RC2.B080
mindie-rt: 2.1.RC2.B080
mindie-torch: 2.1.RC2.B080
mindie-service: 2.1.RC2.B080
mindie-llm: 2.1.RC2.B080
mindie-sd:2.1.RC2.B080
Platform : aarch64
"""

ATB_MODELS_VERSION_INFO = """\
MindIE-ATB Tag/Branch : master
MindIE-ATB Version :
ATB-Models Version :
Commit id : 8a0bb889056f2c40e256bae4aef32cdcfbf81334
Platform : aarch64
Time: 2025-09-21 04:43:22 PM CST
"""


def _driver_entry(text: str) -> dict:
    fields = vf.parse_key_value(text)
    return {
        "version": fields["Version"],
        "components": {key: fields[key] for key in vf.DRIVER_COMPONENT_KEYS},
        "innerversion": fields["Innerversion"],
        "compatible_version": vf.parse_id_list(fields["compatible_version"]),
        "compatible_version_fw": vf.parse_ranges(fields["compatible_version_fw"]),
        "package_version": fields["package_version"],
    }


@pytest.mark.parametrize("sample", [DRIVER_24_1_RC3, DRIVER_25_3_RC1])
def test_driver_version_info_is_byte_identical(sample):
    assert vf.render_driver_version_info(_driver_entry(sample)) == sample


def test_firmware_version_info_is_byte_identical():
    firmware = {
        "version": "7.5.0.1.129",
        "firmware_version": "1.0",
        "package_version": "24.1.rc3",
        "compatible_version_drv": [("23.0.0", "23.0.0."), ("24.0", "24.0."), ("24.1", "24.1.")],
    }
    assert vf.render_firmware_version_info(firmware) == FIRMWARE_7_5_0_1_129


def test_driver_version_info_from_releases_yaml_matches_samples():
    from dsctl.lab.packages import load_releases

    drivers = {entry["version"]: entry["driver"] for entry in load_releases()["hdk"]}
    assert vf.render_driver_version_info(drivers["24.1.rc3"]) == DRIVER_24_1_RC3
    assert vf.render_driver_version_info(drivers["25.3.rc1"]) == DRIVER_25_3_RC1
    firmware = {e["version"]: e["firmware"] for e in load_releases()["hdk"]}["24.1.rc3"]
    assert vf.render_firmware_version_info(firmware) == FIRMWARE_7_5_0_1_129


def test_parse_key_value_keeps_values_and_skips_noise():
    fields = vf.parse_key_value("# comment\n\nVersion=24.1.rc3\nkey = a=b \nnot a pair\n" + OPP_8_5)
    assert fields["Version"] == "8.5.0.2.220"  # later line wins
    assert fields["key"] == "a=b"
    assert fields["required_package_amct_acl_version"] == '"8.5"'
    assert vf.unquote(fields["required_package_amct_acl_version"]) == "8.5"
    assert "not a pair" not in fields


def test_bracket_lists_and_trains():
    fields = vf.parse_key_value(DRIVER_24_1_RC3)
    assert vf.parse_id_list(fields["compatible_version"])[-1] == "V100R001C19"
    assert vf.parse_ranges("[23.0.0,23.0.0.],[24.0,24.0.],[24.1,24.1.]")[2] == ("24.1", "24.1.")
    assert vf.parse_ranges("[7.0.0,7.5.99]") == [("7.0.0", "7.5.99")]
    assert vf.release_train("V100R001C19SPC001B124") == "C19"
    assert vf.release_train("V100R001C21B071") == "C21"
    assert vf.release_train("garbage") is None


def test_install_info_byte_identical_in_both_install_orders():
    user = {"user": "HwHiAiUser", "group": "HwHiAiUser"}
    firmware = {"Install_Type": "full", "Install_Path_Param": "/usr/local/Ascend"}
    driver = {"Install_Type": "full", "Install_Path_Param": "/usr/local/Ascend", "Install_For_All": "yes"}
    text = vf.install_info_add("", "Firmware", fields=firmware, **user)
    assert vf.install_info_add(text, "Driver", fields=driver, **user) == INSTALL_INFO_LLM_ACTION
    text = vf.install_info_add("", "Driver", fields={**driver, "Install_Mode": "normal"}, **user)
    assert vf.install_info_add(text, "Firmware", fields=firmware, **user) == INSTALL_INFO_LONGLLOVERS


def test_install_info_add_replaces_in_place():
    text = vf.install_info_add(
        INSTALL_INFO_LONGLLOVERS, "Driver", user="x", group="y", fields={"Install_Type": "docker"}
    )
    assert text == INSTALL_INFO_LONGLLOVERS.replace("Driver_Install_Type=full", "Driver_Install_Type=docker")


def test_install_info_remove_deletes_lines_then_file():
    after_driver = vf.install_info_remove(INSTALL_INFO_LONGLLOVERS, "Driver")
    assert "Driver_Install_Path_Param" not in after_driver and "Driver_Install_Type" not in after_driver
    assert "Firmware_Install_Path_Param=/usr/local/Ascend" in after_driver
    assert vf.install_info_remove(after_driver, "Firmware") is None


@pytest.mark.parametrize("sample", [TOOLKIT_8_3_RC2, TOOLKIT_8_1_RC1_ALPHA])
def test_toolkit_install_info_is_byte_identical(sample):
    fields = vf.parse_key_value(sample)
    rendered = vf.render_toolkit_install_info(
        version=fields["version"],
        innerversion=fields["innerversion"],
        compatible_version=vf.parse_id_list(fields["compatible_version"]),
        arch=fields["arch"],
        path=fields["path"],
    )
    assert rendered == sample


def test_version_cfg_samples_round_trip_byte_identical():
    for sample in (VERSION_CFG_FORMAT_COMMENT, VERSION_CFG_8_2_RC2):
        assert vf.render_version_cfg(vf.parse_version_cfg(sample)) == sample
    cfg = vf.parse_version_cfg(VERSION_CFG_FORMAT_COMMENT)
    assert cfg["runtime"]["installed"] == [("1.79", "CANN-1.79"), ("1.80", "CANN-1.80")]
    assert vf.version_cfg_running(cfg, "runtime") == ("1.80", "CANN-1.80")


def test_version_cfg_built_by_install_is_byte_identical():
    cfg = vf.version_cfg_install({}, vf.TOOLKIT_CFG_COMPONENTS, ("8.2.0.2.220", "8.2.RC2"))
    cfg = vf.version_cfg_install(cfg, [vf.KERNELS_CFG_COMPONENT], ("8.2.0.2.220", "8.2.RC2"))
    assert vf.render_version_cfg(cfg) == VERSION_CFG_8_2_RC2


def test_version_cfg_side_by_side_switch_and_remove():
    cfg = vf.version_cfg_install({}, ("runtime", "toolkit"), ("7.6.0.1.220", "8.0.0"))
    cfg = vf.version_cfg_install(cfg, ("runtime", "toolkit"), ("8.3.0.2.220", "8.3.RC2"))
    text = vf.render_version_cfg(cfg)
    assert "toolkit_running_version=[8.3.0.2.220:8.3.RC2]\n" in text
    assert "toolkit_installed_version=[7.6.0.1.220:8.0.0][8.3.0.2.220:8.3.RC2]\n" in text
    back = vf.version_cfg_activate(cfg, "8.0.0")
    assert vf.version_cfg_running(back) == ("7.6.0.1.220", "8.0.0")
    assert back["toolkit"]["installed"] == cfg["toolkit"]["installed"]
    removed = vf.version_cfg_remove(cfg, "8.3.RC2")
    assert removed["toolkit"]["installed"] == [("7.6.0.1.220", "8.0.0")]
    assert vf.version_cfg_remove(removed, "8.0.0") == {}
    # reinstalling a version does not list it twice
    again = vf.version_cfg_install(cfg, ("toolkit",), ("8.0.0.9.999", "8.0.0"))
    assert [p[1] for p in again["toolkit"]["installed"]] == ["8.3.RC2", "8.0.0"]


def test_opp_version_info_is_byte_identical():
    rendered = vf.render_opp_version_info(
        inner_version="8.5.0.2.220",
        version_dir="8.5.0",
        timestamp="20251117_000024591",
        required_amct_acl_version="8.5",
    )
    assert rendered == OPP_8_5


def test_atb_version_info_is_byte_identical_and_parses():
    rendered = vf.render_atb_version_info(
        package_version="8.2.RC2",
        build_version="8.2.RC2.B030",
        platform="aarch64",
        branch="br_release_cann_8.2.RC1_20251226",
        commit_id="02a94694766ebf12d820aa4b5d9c95c4fe149379",
    )
    assert rendered == ATB_8_2_RC2
    fields = vf.parse_colon_key_value(ATB_8_2_RC2)
    assert fields["Ascend-cann-atb"] == "8.2.RC2"
    assert fields["Ascend-cann-atb Version"] == "8.2.RC2.B030"
    assert fields["commit id"] == "02a94694766ebf12d820aa4b5d9c95c4fe149379"


def test_colon_parser_tolerates_irregular_spacing():
    mindie = vf.parse_colon_key_value(MINDIE_VERSION_INFO)
    assert mindie["Ascend-mindie"] == "MindIE 2.1.RC2.B080"
    assert mindie["mindie-sd"] == "2.1.RC2.B080"
    assert mindie["Platform"] == "aarch64"
    models = vf.parse_colon_key_value(ATB_MODELS_VERSION_INFO)
    assert models["MindIE-ATB Version"] == ""
    assert models["Time"] == "2025-09-21 04:43:22 PM CST"
    assert models["MindIE-ATB Tag/Branch"] == "master"
    assert vf.parse_colon_key_value("version=6.0.RC1\n\n  junk line\n") == {"version": "6.0.RC1"}


def test_cann_install_info():
    text = vf.render_cann_install_info("/usr/local/Ascend", "/usr/local/Ascend/ascend-toolkit/latest")
    assert vf.parse_key_value(text)["Install_Path"] == "/usr/local/Ascend"
    # tools grep "Install_Path" and expect exactly one hit
    assert [line for line in text.splitlines() if "Install_Path" in line] == ["Install_Path=/usr/local/Ascend"]
