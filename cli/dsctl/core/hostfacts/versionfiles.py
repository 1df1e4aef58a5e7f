"""Read and write the version and install-record files of an Ascend host.

Pure functions over text, standard library only: this module is copied into
the emulated vendor packages that run on lab hosts, and the lab host's boot,
dsctl's checks and the tests read the same files with it.

Formats (ascend-interfaces.md section 4; samples quoted there are verbatim and
the renderings below reproduce them byte for byte, see
tests/unit/test_versionfiles.py):

* ``key=value`` files: driver and firmware ``version.info``,
  ``/etc/ascend_install.info``, ``ascend_toolkit_install.info``,
  ``opp/version.info``, ``/etc/Ascend/ascend_cann_install.info``.
* ``latest/version.cfg``: ``<component>_<kind>_version=[inner:version]...``.
* ``key : value`` files with irregular spacing: NNAL/ATB, MindIE, ATB-models
  ``version.info``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

VersionPair = tuple[str, str]  # (inner build id, CANN version), e.g. ("8.2.0.2.220", "8.2.RC2")
VersionCfg = dict[str, dict[str, list[VersionPair]]]

VERSION_CFG_KINDS = ("running", "upgrade", "installed")
VERSION_CFG_HEADER = "# version: 1.0"

# Sub-packages a toolkit records in version.cfg, in the file's order (itove/ascend docs/src/ver-2.1.md).
TOOLKIT_CFG_COMPONENTS = ("runtime", "compiler", "hccl", "opp", "toolkit", "aoe", "ncs")
KERNELS_CFG_COMPONENT = "opp_kernel"
# Not a vendor file: the lab's emulated toolkit installer writes it into the version directory of a release that
# releases.yaml marks with lab_regression ({"slowdown": 3.0}); the lab engine runs that much slower on it.
LAB_REGRESSION_FILE = "dsctl-lab-regression.json"

# Order of the driver's version.info keys (vllm-project/vllm-ascend#451, hicann/pypto FAQ).
DRIVER_COMPONENT_KEYS = (
    "ascendhal_version",
    "aicpu_version",
    "tdt_version",
    "log_version",
    "prof_version",
    "dvppkernels_version",
    "tsfw_version",
)


# --------------------------------------------------------------------------- key=value


def parse_key_value(text: str) -> dict[str, str]:
    """``key=value`` lines to a dict; blank lines and ``#`` comments are skipped.

    Values are kept as written (quotes included, e.g. ``"8.5"``): the files are
    shell-sourced on hosts and callers decide what quoting means.  Only the
    first ``=`` splits, so values may contain ``=``.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or "=" not in stripped:
            continue
        key, _, value = stripped.partition("=")
        fields[key.strip()] = value.strip()
    return fields


def render_key_value(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return "".join(f"{key}={value}\n" for key, value in items)


def unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


# --------------------------------------------------------------------------- bracket lists


def format_id_list(items: Iterable[str]) -> str:
    """``["V100R001C13", "V100R001C15"]`` -> ``[V100R001C13],[V100R001C15]``."""
    return ",".join(f"[{item}]" for item in items)


def parse_id_list(text: str) -> list[str]:
    return re.findall(r"\[([^\[\],]+)\]", text)


def format_ranges(ranges: Iterable[Iterable[str]]) -> str:
    """``[("7.0.0", "7.5.99")]`` -> ``[7.0.0,7.5.99]`` (compatible_version_fw / _drv)."""
    return ",".join("[{},{}]".format(*pair) for pair in ranges)


def parse_ranges(text: str) -> list[tuple[str, str]]:
    return [(lo.strip(), hi.strip()) for lo, hi in re.findall(r"\[([^\[\],]*),([^\[\],]*)\]", text)]


def release_train(innerversion: str) -> str | None:
    """``V100R001C19SPC001B124`` -> ``C19``: the train shared by driver and CANN (section 8)."""
    match = re.search(r"R\d+(C\d+)", innerversion)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- driver / firmware


def render_driver_version_info(driver: Mapping) -> str:
    """``/usr/local/Ascend/driver/version.info`` from a releases.yaml ``driver`` entry."""
    pairs = [("Version", driver["version"])]
    pairs += list(driver.get("components", {}).items())
    pairs += [
        ("Innerversion", driver["innerversion"]),
        ("compatible_version", format_id_list(driver["compatible_version"])),
        ("compatible_version_fw", format_ranges(driver["compatible_version_fw"])),
        ("package_version", driver.get("package_version", driver["version"])),
    ]
    return render_key_value(pairs)


def render_firmware_version_info(firmware: Mapping) -> str:
    """``/usr/local/Ascend/firmware/version.info`` from a releases.yaml ``firmware`` entry."""
    return render_key_value(
        [
            ("Version", firmware["version"]),
            ("firmware_version", firmware.get("firmware_version", "1.0")),
            ("package_version", firmware["package_version"]),
            ("compatible_version_drv", format_ranges(firmware["compatible_version_drv"])),
        ]
    )


# --------------------------------------------------------------------------- /etc/ascend_install.info


def install_info_add(text: str, component: str, *, user: str, group: str, fields: Mapping[str, str]) -> str:
    """Record a driver/firmware install in ``/etc/ascend_install.info`` text.

    As the driver's install.sh ``updateInstallInfo`` does: add ``UserName`` and
    ``UserGroup`` when missing, replace a ``<Component>_<key>`` line in place
    when it exists, append it otherwise.  ``fields`` keys are given without the
    component prefix, e.g. ``{"Install_Type": "full", "Install_Path_Param": ...}``.
    """
    lines = text.splitlines()
    present = parse_key_value(text)
    wanted = []
    if "UserName" not in present:
        wanted.append(("UserName", user))
    if "UserGroup" not in present:
        wanted.append(("UserGroup", group))
    wanted += [(f"{component}_{key}", value) for key, value in fields.items()]
    for key, value in wanted:
        index = next((i for i, line in enumerate(lines) if line.split("=", 1)[0].strip() == key), None)
        if index is None:
            lines.append(f"{key}={value}")
        else:
            lines[index] = f"{key}={value}"
    return "".join(line + "\n" for line in lines)


def install_info_remove(text: str, component: str) -> str | None:
    """Drop a component's path and type lines; None when the file should be deleted.

    The driver's uninstaller deletes ``Driver_Install_Path_Param=`` and
    ``Driver_Install_Type=`` and removes the file once no ``Install_Path_Param``
    line (any component, case-insensitive) is left (section 4.3).
    """
    doomed = {f"{component}_Install_Path_Param", f"{component}_Install_Type"}
    kept = [line for line in text.splitlines() if line.split("=", 1)[0].strip() not in doomed]
    if not any("install_path_param" in line.lower() for line in kept):
        return None
    return "".join(line + "\n" for line in kept)


# --------------------------------------------------------------------------- CANN records


def render_toolkit_install_info(
    *,
    version: str,
    innerversion: str,
    compatible_version: Iterable[str],
    arch: str,
    path: str,
    os_name: str = "linux",
    package_name: str = "Ascend-cann-toolkit",
) -> str:
    """``<root>/ascend-toolkit/<ver>/<arch>-linux/ascend_toolkit_install.info``."""
    return render_key_value(
        [
            ("package_name", package_name),
            ("version", version),
            ("innerversion", innerversion),
            ("compatible_version", format_id_list(compatible_version)),
            ("arch", arch),
            ("os", os_name),
            ("path", path),
        ]
    )


def render_cann_install_info(install_path: str, toolkit_install_path: str) -> str:
    """``/etc/Ascend/ascend_cann_install.info`` (root installs).

    ``Install_Path`` is what tools grep for (ascend-deployer README, public
    set_env wrappers: ``grep Install_Path | cut -d= -f2``); the CANN 8.0.0
    installer prints "Write Toolkit_InstallPath to /etc/Ascend/ascend_cann_install.info".
    """
    return render_key_value([("Install_Path", install_path), ("Toolkit_InstallPath", toolkit_install_path)])


def render_opp_version_info(
    *, inner_version: str, version_dir: str, timestamp: str, required_amct_acl_version: str
) -> str:
    """``latest/opp/version.info`` (hicann/pypto FAQ, CANN 8.5)."""
    return render_key_value(
        [
            ("Version", inner_version),
            ("version_dir", version_dir),
            ("timestamp", timestamp),
            ("required_package_amct_acl_version", f'"{required_amct_acl_version}"'),
        ]
    )


# --------------------------------------------------------------------------- latest/version.cfg

_CFG_LINE = re.compile(r"^(?P<component>.+)_(?P<kind>running|upgrade|installed)_version=(?P<pairs>.*)$")
_CFG_PAIR = re.compile(r"\[([^\[\]:]*):([^\[\]]*)\]")


def parse_version_cfg(text: str) -> VersionCfg:
    """``{"runtime": {"running": [(inner, ver)], "upgrade": [...], "installed": [...]}, ...}``."""
    cfg: VersionCfg = {}
    for line in text.splitlines():
        match = _CFG_LINE.match(line.strip())
        if not match:
            continue
        entry = cfg.setdefault(match["component"], {kind: [] for kind in VERSION_CFG_KINDS})
        entry[match["kind"]] = _CFG_PAIR.findall(match["pairs"])
    return cfg


def render_version_cfg(cfg: VersionCfg) -> str:
    """All ``running`` lines, then ``upgrade``, then ``installed``, as the vendor file orders them."""
    lines = [VERSION_CFG_HEADER]
    for kind in VERSION_CFG_KINDS:
        for component, entry in cfg.items():
            pairs = entry.get(kind) or []
            if pairs:
                lines.append(f"{component}_{kind}_version=" + "".join(f"[{a}:{b}]" for a, b in pairs))
    return "\n".join(lines) + "\n"


def version_cfg_install(cfg: VersionCfg, components: Iterable[str], pair: VersionPair) -> VersionCfg:
    """Record a newly installed version and make it the running one (the new ``latest``).

    Older versions stay listed in ``*_installed_version`` (side-by-side
    installs, vllm-ascend ``csrc/scripts/package/common/sh/version_cfg.inc``).
    """
    result = {name: {kind: list(pairs) for kind, pairs in entry.items()} for name, entry in cfg.items()}
    for component in components:
        entry = result.setdefault(component, {kind: [] for kind in VERSION_CFG_KINDS})
        installed = [p for p in entry.get("installed", []) if p[1] != pair[1]]
        entry["installed"] = installed + [tuple(pair)]
        entry["running"] = [tuple(pair)]
        entry["upgrade"] = [tuple(pair)]
    return result


def version_cfg_remove(cfg: VersionCfg, version: str, components: Iterable[str] | None = None) -> VersionCfg:
    """Forget a CANN version (all components, or only the given ones); drop emptied components."""
    only = set(components) if components is not None else None
    result: VersionCfg = {}
    for name, entry in cfg.items():
        if only is not None and name not in only:
            result[name] = {kind: list(pairs) for kind, pairs in entry.items()}
            continue
        kept = {kind: [p for p in pairs if p[1] != version] for kind, pairs in entry.items()}
        if kept.get("installed"):
            result[name] = kept
    return result


def version_cfg_activate(cfg: VersionCfg, version: str) -> VersionCfg:
    """Point ``running``/``upgrade`` of every component that has ``version`` installed at it."""
    result: VersionCfg = {}
    for name, entry in cfg.items():
        copy = {kind: list(pairs) for kind, pairs in entry.items()}
        match = [p for p in copy.get("installed", []) if p[1] == version]
        if match:
            copy["running"] = [match[-1]]
            copy["upgrade"] = [match[-1]]
        result[name] = copy
    return result


def version_cfg_running(cfg: VersionCfg, component: str = "toolkit") -> VersionPair | None:
    pairs = cfg.get(component, {}).get("running") or []
    return pairs[-1] if pairs else None


# --------------------------------------------------------------------------- "key : value" files


def render_atb_version_info(
    *, package_version: str, build_version: str, platform: str, branch: str, commit_id: str
) -> str:
    """``nnal/atb/<ver>/version.info``: four leading spaces, ``key : value`` (itove/ascend ver-2.1.md)."""
    rows = [
        ("Ascend-cann-atb", package_version),
        ("Ascend-cann-atb Version", build_version),
        ("Platform", platform),
        ("branch", branch),
        ("commit id", commit_id),
    ]
    return "".join(f"    {key} : {value}\n" for key, value in rows)


def parse_colon_key_value(text: str) -> dict[str, str]:
    """Tolerant ``key : value`` parser for ATB/MindIE/ATB-models ``version.info``.

    Copes with leading spaces, missing spaces around the colon
    (``mindie-sd:2.1.RC2.B080``), empty values (``MindIE-ATB Version :``) and
    values holding colons (``Time: 2025-09-21 04:43:22 PM CST``): only the first
    colon splits.  ``key=value`` lines are accepted as well.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        colon, equals = stripped.find(":"), stripped.find("=")
        if colon < 0 and equals < 0:
            continue
        cut = colon if equals < 0 or (0 <= colon < equals) else equals
        key, value = stripped[:cut].strip(), stripped[cut + 1 :].strip()
        if key:
            fields[key] = value
    return fields
