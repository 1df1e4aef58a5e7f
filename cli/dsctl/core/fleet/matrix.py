"""Which driver / firmware / CANN / vllm-ascend combinations dsctl installs, decided from releases.yaml (pure).

Three callers, one set of rules:

* `resolve_stack` turns a host's four ``dsctl_*_version`` variables (unset ones from ``default_stack``)
  into the `DesiredStack` the roles install, or raises `StackError` naming the variable to change;
* `check_pair` / `check_serving` judge a combination, installed or wanted, for ``dsctl check``;
* `matrix_rows` lists every combination of the data's releases that passes, for ``dsctl matrix``.

The rules are the ones the vendor files carry (ascend-interfaces.md section 8), read from the same fields
of the data: the driver's ``compatible_version_fw`` must hold the firmware, the firmware's
``compatible_version_drv`` must match the driver, CANN's toolkit ``compatible_version`` must list the
driver's train, the driver's ``compatible_version`` must list CANN's train, and the vllm-ascend matrix row
must be built for the CANN.  The last train check is the one real pairs break (24.1.rc3 + CANN 8.0.0, see
the NOTE in releases.yaml): a pair that fails only there is accepted, with a warning, when Huawei's table
recommends it or it was observed working, and refused otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from dsctl.core.fleet.stack import DesiredStack
from dsctl.core.fleet.versions import (
    in_ranges,
    in_release_line,
    matches_prefix_ranges,
    same_release,
    sort_versions,
    version_key,
)
from dsctl.core.hostfacts.versionfiles import release_train
from dsctl.errors import DsctlError, ExitStatus

# Inventory variable of each stack piece: every refusal names the one to change.
DRIVER_VAR = "dsctl_driver_version"
FIRMWARE_VAR = "dsctl_firmware_version"
CANN_VAR = "dsctl_cann_version"
VLLM_ASCEND_VAR = "dsctl_vllm_ascend_version"

NO_SERVING = "none"  # dsctl_vllm_ascend_version: none = install the NPU stack only
# Releases marked lab_only in releases.yaml (a lab's rebuilds, no vendor ships them) are installed only where the
# inventory opts in with this setting: dsctl lab's inventory does, and a site running its own lab may.
ALLOW_LAB_VAR = "dsctl_allow_lab_releases"
CONFIDENCE_RANK = {"inferred": 0, "observed": 1, "official": 2}
INFERRED_STATUS = "inferred: passes the version-file checks"

Severity = Literal["error", "warning"]


class StackError(DsctlError):
    """A stack the data cannot build: incompatible (exit 3) or naming an unknown version (exit 2)."""

    exit_status = ExitStatus.VALIDATION_FAILED


@dataclass(frozen=True)
class Verdict:
    """One compatibility check of a combination.

    ``ok`` says whether the check passed.  ``severity`` is what a failure weighs: "error" refuses the
    combination, "warning" accepts it with a note (a driver-side train miss on an official or observed
    pair).  ``sentence`` states the finding, ``fix`` what to change, ``variable`` the inventory variable
    the fix is about; `message` joins them into dsctl's one-line error.
    """

    check: str
    ok: bool
    severity: Severity
    sentence: str
    fix: str = ""
    variable: str = ""
    sources: tuple[str, ...] = ()

    @property
    def refuses(self) -> bool:
        return not self.ok and self.severity == "error"

    @property
    def warns(self) -> bool:
        return not self.ok and self.severity == "warning"

    @property
    def message(self) -> str:
        head = f"{self.variable}: {self.sentence}" if self.variable else self.sentence
        return f"{head}; {self.fix}" if self.fix else head

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sources": list(self.sources)}


# --------------------------------------------------------------------------- lookups
# "24.1.RC3" is the 24.1.rc3 release, but "25.5" is a release line, not the 25.5.0 release: lookups compare
# release names (same_release), never order.


def _pip_version(tag: str) -> str:
    """The normalized PEP 440 version pip pins and wheel file names use: "v0.13.0" -> "0.13.0", "v0.9.0-RC1" ->
    "0.9.0rc1"; a tag that is no PEP 440 version stays as written (pip then refuses the pin in its own words)."""
    try:
        return str(Version(str(tag)))
    except InvalidVersion:
        return str(tag).strip()


def _hdk(releases: Mapping, driver: str) -> dict | None:
    return next((h for h in releases.get("hdk", []) if same_release(h["driver"]["version"], driver)), None)


def _firmware_release(releases: Mapping, firmware: str) -> dict | None:
    """The HDK release that ships ``firmware``."""
    return next((h for h in releases.get("hdk", []) if same_release(h["firmware"]["version"], firmware)), None)


def _cann(releases: Mapping, cann: str) -> dict | None:
    return next((c for c in releases.get("cann", []) if same_release(c["version"], cann)), None)


def _serving_row(releases: Mapping, tag: str) -> dict | None:
    return next((r for r in releases.get("vllm_ascend_matrix", []) if same_release(r["vllm_ascend"], tag)), None)


def _known_drivers(releases: Mapping) -> list[str]:
    return sort_versions(h["driver"]["version"] for h in releases.get("hdk", []))


def _known_firmware(releases: Mapping) -> list[str]:
    return sort_versions(h["firmware"]["version"] for h in releases.get("hdk", []))


def _known_canns(releases: Mapping) -> list[str]:
    """The CANN releases a refusal offers: lab-only ones (the regressed lab release) are accepted, never offered."""
    return sort_versions(c["version"] for c in releases.get("cann", []) if not c.get("lab_only"))


def _tags_for_cann(releases: Mapping, cann: str) -> list[str]:
    """vllm-ascend tags built for ``cann``, newest first."""
    tags = [r["vllm_ascend"] for r in releases.get("vllm_ascend_matrix", []) if same_release(r["cann"], cann)]
    return sort_versions(tags, newest_first=True)


def _installable_tags(releases: Mapping) -> list[str]:
    """vllm-ascend tags whose CANN the data carries, newest first: the ones dsctl can install."""
    return [tag for cann in reversed(_known_canns(releases)) for tag in _tags_for_cann(releases, cann)]


def _listing(items: Iterable[str]) -> str:
    return ", ".join(items) or "none"


def _unknown(check: str, variable: str, what: str, known: list[str], extra: str = "") -> Verdict:
    return Verdict(check, False, "error", f"{what} is not in the releases data (known: {_listing(known)})",
                   f"pick one of them{extra}", variable)


# --------------------------------------------------------------------------- pairing evidence


def _trains(entries: Iterable[str]) -> list[str]:
    return [train for train in (release_train(entry) for entry in entries) if train]


def _driver_train(hdk: Mapping) -> str | None:
    return hdk["driver"].get("train") or release_train(hdk["driver"]["innerversion"])


def _cann_train(cann: Mapping) -> str | None:
    return cann["toolkit"].get("train") or release_train(cann["toolkit"]["innerversion"])


def _official_pairings(releases: Mapping) -> list[dict]:
    """CANN -> recommended HDK line, from Huawei's table and from vllm-ascend's install pages."""
    rows = [dict(row) for row in releases.get("cann_hdk_official", [])]
    for requirement in releases.get("vllm_ascend_requirements", []):
        cann = str(requirement.get("cann", ""))
        if requirement.get("hdk_recommended") and cann.startswith("=="):
            rows.append({"cann": cann[2:], "driver": requirement["hdk_recommended"], "firmware": None,
                         "source": requirement["source"], "confidence": requirement["confidence"]})
    return rows


def _pair_evidence(releases: Mapping, driver: str, cann: str) -> list[dict]:
    """Official rows, then observed ones, that pair ``driver`` with ``cann``."""
    official = [row for row in _official_pairings(releases)
                if same_release(row["cann"], cann)
                and (in_release_line(driver, row["driver"]) or same_release(row.get("driver_file_version"), driver))]
    observed = [row for row in releases.get("observed_pairings", [])
                if row.get("cann") and same_release(row["cann"], cann) and same_release(row["driver"], driver)]
    return official + observed


def _firmware_evidence(releases: Mapping, hdk: Mapping, firmware: str) -> tuple[str, tuple[str, ...]]:
    """How the driver/firmware pairing is known: its own HDK release, a published pairing, or only the files."""
    if same_release(hdk["firmware"]["version"], firmware):
        return hdk["confidence"], (hdk["source"],)
    driver = hdk["driver"]["version"]
    rows = [row for row in _official_pairings(releases)
            if same_release(row.get("firmware"), firmware) and in_release_line(driver, row["driver"])]
    rows += [row for row in releases.get("observed_pairings", [])
             if row.get("firmware") and same_release(row["firmware"], firmware)
             and same_release(row["driver"], driver)]
    if rows:
        return _strongest(row["confidence"] for row in rows), tuple(row["source"] for row in rows)
    return "inferred", ()


def _weakest(confidences: Iterable[str]) -> str:
    return min(confidences, key=lambda c: CONFIDENCE_RANK.get(c, 0))


def _strongest(confidences: Iterable[str]) -> str:
    return max(confidences, key=lambda c: CONFIDENCE_RANK.get(c, 0))


# --------------------------------------------------------------------------- checks


def _cann_accepts(hdk: Mapping, cann: Mapping) -> bool:
    return _driver_train(hdk) in _trains(cann["toolkit"]["compatible_version"])


def _driver_accepts(hdk: Mapping, cann: Mapping) -> bool:
    return _cann_train(cann) in _trains(hdk["driver"]["compatible_version"])


def _pair_allowed(releases: Mapping, hdk: Mapping, cann: Mapping) -> bool:
    """Both train checks pass, or only the driver side misses on an official/observed pair."""
    if not _cann_accepts(hdk, cann):
        return False
    return _driver_accepts(hdk, cann) or bool(_pair_evidence(releases, hdk["driver"]["version"], cann["version"]))


def _firmware_allowed(hdk: Mapping, firmware_hdk: Mapping) -> bool:
    firmware = firmware_hdk["firmware"]
    return (in_ranges(firmware["version"], hdk["driver"]["compatible_version_fw"])
            and matches_prefix_ranges(hdk["driver"]["version"], firmware["compatible_version_drv"]))


def _ranges_text(ranges: Iterable[Iterable[str]]) -> str:
    return ",".join("[{},{}]".format(*pair) for pair in ranges)


def _choice(variable: str, values: list[str]) -> str:
    if len(values) == 1:
        return f'{variable}: "{values[0]}"'
    return f"{variable} to one of ({_listing(values)})"


def _firmware_verdicts(releases: Mapping, hdk: Mapping, firmware_hdk: Mapping) -> list[Verdict]:
    driver = hdk["driver"]["version"]
    firmware = firmware_hdk["firmware"]["version"]
    fits = [h["firmware"]["version"] for h in releases.get("hdk", []) if _firmware_allowed(hdk, h)]
    drivers = [h["driver"]["version"] for h in releases.get("hdk", []) if _firmware_allowed(h, firmware_hdk)]
    fix = ", or ".join(part for part in (
        f"set {_choice(FIRMWARE_VAR, sort_versions(fits))}" if fits else "",
        f"set {_choice(DRIVER_VAR, sort_versions(drivers))}" if drivers else "",
    ) if part) or "pick another driver and firmware pair"
    fw_ranges = hdk["driver"]["compatible_version_fw"]
    drv_ranges = firmware_hdk["firmware"]["compatible_version_drv"]
    in_driver_range = in_ranges(firmware, fw_ranges)
    driver_matches = matches_prefix_ranges(driver, drv_ranges)
    return [
        Verdict(
            "driver-accepts-firmware", in_driver_range, "error",
            f"firmware {firmware} is {'inside' if in_driver_range else 'outside'} driver {driver}'s "
            f"compatible_version_fw {_ranges_text(fw_ranges)}",
            "" if in_driver_range else fix, FIRMWARE_VAR,
        ),
        Verdict(
            "firmware-accepts-driver", driver_matches, "error",
            f"driver {driver} {'matches' if driver_matches else 'does not match'} firmware {firmware}'s "
            f"compatible_version_drv {_ranges_text(drv_ranges)}",
            "" if driver_matches else fix, FIRMWARE_VAR,
        ),
    ]


def _train_verdicts(releases: Mapping, hdk: Mapping, cann: Mapping) -> list[Verdict]:
    driver, version = hdk["driver"]["version"], cann["version"]
    driver_train, cann_train = _driver_train(hdk), _cann_train(cann)
    canns_for_driver = [c["version"] for c in releases.get("cann", []) if _pair_allowed(releases, hdk, c)]
    drivers_for_cann = [h["driver"]["version"] for h in releases.get("hdk", []) if _pair_allowed(releases, h, cann)]
    other_side = ", or ".join(part for part in (
        f"set {_choice(DRIVER_VAR, sort_versions(drivers_for_cann))}" if drivers_for_cann else "",
        f"set {_choice(CANN_VAR, sort_versions(canns_for_driver))}" if canns_for_driver else "",
    ) if part) or "pick another driver and CANN pair"

    cann_side_ok = _cann_accepts(hdk, cann)
    cann_lists = _listing(_trains(cann["toolkit"]["compatible_version"]))
    verdicts = [Verdict(
        "cann-accepts-driver", cann_side_ok, "error",
        f"CANN {version} {'accepts' if cann_side_ok else 'refuses'} driver {driver} (CANN side: the toolkit's "
        f"compatible_version lists driver trains {cann_lists}, {'with' if cann_side_ok else 'not'} {driver_train})",
        "" if cann_side_ok else other_side, CANN_VAR,
    )]

    driver_side_ok = _driver_accepts(hdk, cann)
    driver_lists = _listing(_trains(hdk["driver"]["compatible_version"]))
    evidence = _pair_evidence(releases, driver, version)
    if driver_side_ok:
        verdicts.append(Verdict(
            "driver-accepts-cann", True, "error",
            f"driver {driver} accepts CANN {version} (driver side: compatible_version lists CANN trains "
            f"{driver_lists}, with {cann_train})", "", DRIVER_VAR,
        ))
    elif evidence:
        kind = "recommended by the official tables" if evidence[0]["confidence"] == "official" else "observed working"
        sources = tuple(row["source"] for row in evidence)
        verdicts.append(Verdict(
            "driver-accepts-cann", False, "warning",
            f"driver {driver}'s compatible_version lists CANN trains {driver_lists}, not CANN {version}'s "
            f"{cann_train} (driver side), but the pair is {kind} ({'; '.join(sources)})",
            "accepted; verify on hardware", DRIVER_VAR, sources,
        ))
    else:
        verdicts.append(Verdict(
            "driver-accepts-cann", False, "error",
            f"driver {driver} refuses CANN {version} (driver side: compatible_version lists CANN trains "
            f"{driver_lists}, not {cann_train}) and the pair is neither official nor observed",
            other_side, DRIVER_VAR,
        ))
    return verdicts


def check_pair(releases: Mapping, *, driver: str, firmware: str | None = None,
               cann: str | None = None) -> list[Verdict]:
    """Every compatibility check of driver (+ firmware) (+ CANN), from the data's version-file fields.

    Works on installed versions too: a version the data does not carry gives a failed "known-*" verdict
    and the checks that need its data are left out.
    """
    verdicts: list[Verdict] = []
    hdk = _hdk(releases, driver)
    if hdk is None:
        verdicts.append(_unknown("known-driver", DRIVER_VAR, f"driver {driver}", _known_drivers(releases)))
    if firmware is not None:
        firmware_hdk = _firmware_release(releases, firmware)
        if firmware_hdk is None:
            verdicts.append(_unknown("known-firmware", FIRMWARE_VAR, f"firmware {firmware}",
                                     _known_firmware(releases)))
        elif hdk is not None:
            verdicts += _firmware_verdicts(releases, hdk, firmware_hdk)
        else:
            drv_ranges = firmware_hdk["firmware"]["compatible_version_drv"]
            matches = matches_prefix_ranges(driver, drv_ranges)
            verdicts.append(Verdict(
                "firmware-accepts-driver", matches, "error",
                f"driver {driver} {'matches' if matches else 'does not match'} firmware {firmware}'s "
                f"compatible_version_drv {_ranges_text(drv_ranges)}", "", FIRMWARE_VAR,
            ))
    if cann is not None:
        cann_release = _cann(releases, cann)
        if cann_release is None:
            verdicts.append(_unknown("known-cann", CANN_VAR, f"CANN {cann}", _known_canns(releases)))
        elif hdk is not None:
            verdicts += _train_verdicts(releases, hdk, cann_release)
    return verdicts


def check_serving(releases: Mapping, *, cann: str, vllm_ascend: str) -> list[Verdict]:
    """Whether the vllm-ascend release's official matrix row is built for ``cann`` (one whole row: the
    project says to take vLLM Ascend, vLLM, PyTorch, torch_npu and CANN together)."""
    row = _serving_row(releases, vllm_ascend)
    if row is None:
        return [_unknown("known-vllm-ascend", VLLM_ASCEND_VAR, f"vllm-ascend {vllm_ascend}",
                         _installable_tags(releases), f", or {NO_SERVING} for no serving stack")]
    tag, row_cann = row["vllm_ascend"], row["cann"]
    if same_release(row_cann, cann):
        return [Verdict("serving-cann", True, "error", f"vllm-ascend {tag} is built for CANN {cann} "
                        f"({row['confidence']} matrix row)", "", VLLM_ASCEND_VAR, (row["source"],))]
    built_for_cann = _tags_for_cann(releases, cann)
    pick = (f"pick a vllm-ascend release built for CANN {cann} ({_listing(built_for_cann)})" if built_for_cann
            else f"set {VLLM_ASCEND_VAR}: {NO_SERVING} (no vllm-ascend release is built for CANN {cann})")
    if _cann(releases, row_cann) is None:
        sentence = (f"vllm-ascend {tag} needs CANN {row_cann} ({row['confidence']} matrix row), which the releases "
                    f"data does not carry")
        fix = pick
    else:
        sentence = f"vllm-ascend {tag} needs CANN {row_cann} ({row['confidence']} matrix row), not {cann}"
        fix = f'set {CANN_VAR}: "{row_cann}" or {pick}'
    return [Verdict("serving-cann", False, "error", sentence, fix, VLLM_ASCEND_VAR, (row["source"],))]


# --------------------------------------------------------------------------- resolution


def _required(found: Any, verdicts: list[Verdict]) -> Any:
    if found is None:
        unknown = next(v for v in verdicts if v.check.startswith("known-"))
        raise StackError(unknown.message, ExitStatus.USAGE)
    return found


def _run_names(hdk: Mapping, firmware_hdk: Mapping, cann: Mapping) -> dict[str, str]:
    # Named as dsctl.lab.packages names the emulated packages and Huawei names the real ones (section 5.1).
    version, kernels = cann["version"], cann["kernels"]["package"]
    return {
        "driver_run": f"Ascend-hdk-{hdk['family']}-npu-driver_{hdk['driver']['version']}_linux-{{arch}}.run",
        "firmware_run": f"Ascend-hdk-{firmware_hdk['family']}-npu-firmware_{firmware_hdk['firmware']['version']}.run",
        "toolkit_run": f"Ascend-cann-toolkit_{version}_linux-{{arch}}.run",
        "kernels_run": f"Ascend-cann-{kernels}_{version}_linux-{{arch}}.run",
        "nnal_run": f"Ascend-cann-nnal_{version}_linux-{{arch}}.run",
    }


def row_pins(row: Mapping) -> dict[str, str]:
    """The pip pins of one vllm_ascend_matrix row: PEP 503 names, normalized PEP 440 versions.

    The one place a row becomes pins: the roles pin them, the lab builds its stand-ins and locks for them and
    `dsctl wheelhouse build` resolves them."""
    pins = {"torch": row["torch"], "torch-npu": row["torch_npu"], "vllm": row["vllm"],
            "vllm-ascend": row["vllm_ascend"]}
    if row.get("triton_ascend"):
        # From vllm-ascend 0.13 the row names a Triton-Ascend release: installed with the stack, as
        # Ascend/triton-ascend docs/en/installation_guide.md (pip install triton-ascend, 3.2.0 <-> CANN 8.5.0)
        # and vllm-ascend's versioning_policy.md row say; releases.yaml carries the version per row.
        pins["triton-ascend"] = row["triton_ascend"]
    # pip wants "0.13.0", the matrix writes the git tag "v0.13.0".
    return {name: _pip_version(version) for name, version in pins.items()}


def release_pins(releases: Mapping, tag: str) -> tuple[dict[str, str], str | None]:
    """The pins and Python specifier of the matrix row of vllm-ascend ``tag`` (`dsctl wheelhouse build
    --release`); StackError (exit 2) naming the installable tags when the data has no such row."""
    row = _serving_row(releases, tag)
    if row is None:
        raise StackError(f"--release: vllm-ascend {tag} is not in the matrix; pick one of "
                         f"{_listing(_installable_tags(releases)[:8])}, ...", ExitStatus.USAGE)
    return row_pins(row), row.get("python")


def _serving_fields(row: Mapping | None) -> dict[str, Any]:
    if row is None:
        return {"vllm_ascend": None, "vllm": None, "torch": None, "torch_npu": None, "python": None, "pip_pins": {}}
    return {
        "vllm_ascend": row["vllm_ascend"],
        "vllm": row["vllm"],
        "torch": row["torch"],
        "torch_npu": row["torch_npu"],
        "python": row.get("python"),
        "pip_pins": row_pins(row),
    }


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in items if item))


def resolve_stack(releases: Mapping, *, driver: str | None = None, firmware: str | None = None,
                  cann: str | None = None, vllm_ascend: str | None = None) -> DesiredStack:
    """The stack a host should run: unset values from ``default_stack``, checked, with installer names and pins.

    ``firmware`` defaults to the firmware of the driver's own HDK release (to ``default_stack``'s when the
    driver is the default too); ``vllm_ascend`` may be "none" for no serving stack.  Raises `StackError`:
    exit USAGE for a version the data does not carry, VALIDATION_FAILED for an incompatible combination.
    """
    default = releases.get("default_stack", {})
    driver_given = driver is not None
    driver = driver if driver_given else default["driver"]
    hdk = _required(_hdk(releases, driver), check_pair(releases, driver=driver))
    if firmware is None:
        firmware = default["firmware"] if not driver_given else hdk["firmware"]["version"]
    firmware_hdk = _required(_firmware_release(releases, firmware),
                             check_pair(releases, driver=driver, firmware=firmware))
    cann = cann if cann is not None else default["cann"]
    cann_release = _required(_cann(releases, cann), check_pair(releases, driver=driver, cann=cann))
    tag = vllm_ascend if vllm_ascend is not None else default["vllm_ascend"]
    row = None
    if tag is not None and not same_release(tag, NO_SERVING):  # null in the data also means no serving stack
        row = _required(_serving_row(releases, tag), check_serving(releases, cann=cann, vllm_ascend=tag))

    verdicts = check_pair(releases, driver=hdk["driver"]["version"], firmware=firmware_hdk["firmware"]["version"],
                          cann=cann_release["version"])
    if row is not None:
        verdicts += check_serving(releases, cann=cann_release["version"], vllm_ascend=row["vllm_ascend"])
    refusal = next((v for v in verdicts if v.refuses), None)
    if refusal is not None:
        raise StackError(refusal.message)

    pair_evidence = _pair_evidence(releases, hdk["driver"]["version"], cann_release["version"])
    firmware_confidence, firmware_sources = _firmware_evidence(releases, hdk, firmware_hdk["firmware"]["version"])
    confidences = [hdk["confidence"], firmware_hdk["confidence"], cann_release["confidence"], firmware_confidence,
                   _strongest(row["confidence"] for row in pair_evidence) if pair_evidence else "inferred"]
    sources = [hdk["source"], firmware_hdk["source"], cann_release["source"], *firmware_sources,
               *(row["source"] for row in pair_evidence)]
    if row is not None:
        confidences.append(row["confidence"])
        sources.append(row["source"])
    return DesiredStack(
        driver=hdk["driver"]["version"],
        firmware=firmware_hdk["firmware"]["version"],
        cann=cann_release["version"],
        kernels_package=cann_release["kernels"]["package"],
        **_serving_fields(row),
        **_run_names(hdk, firmware_hdk, cann_release),
        confidence=_weakest(confidences),
        sources=_unique(sources),
        warnings=tuple(v.sentence for v in verdicts if v.warns),
    )


def check_lab_releases(releases: Mapping, stack: DesiredStack, *, allowed: bool) -> None:
    """Refuse (StackError, exit USAGE) a stack with a ``lab_only`` release unless ``allowed`` (the host's
    `ALLOW_LAB_VAR`): such a release exists only where dsctl lab builds it, and would fail on a real host."""
    if allowed:
        return
    cann = _cann(releases, stack.cann)
    row = _serving_row(releases, stack.vllm_ascend) if stack.vllm_ascend else None
    for variable, version, entry in ((CANN_VAR, stack.cann, cann), (VLLM_ASCEND_VAR, stack.vllm_ascend, row)):
        if entry is not None and entry.get("lab_only"):
            raise StackError(f"{variable}: {version} is a lab-only release (dsctl lab builds it; no vendor ships "
                             f"it); pick a vendor release (dsctl matrix lists them), or set {ALLOW_LAB_VAR}: true "
                             "if this inventory is a lab's", ExitStatus.USAGE)


# --------------------------------------------------------------------------- dsctl matrix


def pairing_status(releases: Mapping, *, driver: str, firmware: str, cann: str) -> str:
    """The status column of `dsctl matrix`: official, observed or inferred (INFERRED_STATUS)."""
    evidence = _pair_evidence(releases, driver, cann)
    if any(row["confidence"] == "official" for row in evidence):
        return "official"
    observed = [row for row in evidence if row["confidence"] == "observed"]
    if any(not row.get("firmware") or same_release(row["firmware"], firmware) for row in observed):
        return "observed"
    return INFERRED_STATUS


def matrix_rows(releases: Mapping) -> list[dict[str, Any]]:
    """Every (HDK release, CANN release, vllm-ascend row for that CANN) of the data that passes the checks.

    Newest first; releases marked ``lab_only`` are left out.  ``default`` marks the default stack; a compatible
    HDK/CANN pair with no vllm-ascend row still gets one row, with the serving fields None.
    """
    default = releases.get("default_stack", {})
    rows = []
    for hdk in releases.get("hdk", []):
        for cann in releases.get("cann", []):
            if cann.get("lab_only"):  # a lab construct (the regressed release of the upgrade tests), no stack to offer
                continue
            driver, firmware = hdk["driver"]["version"], hdk["firmware"]["version"]
            tags = _tags_for_cann(releases, cann["version"]) or [NO_SERVING]
            for tag in tags:
                try:
                    stack = resolve_stack(releases, driver=driver, firmware=firmware, cann=cann["version"],
                                          vllm_ascend=tag)
                except StackError:
                    break  # the driver/CANN pair itself is refused: no serving row can fix that
                rows.append({
                    "driver": stack.driver,
                    "firmware": stack.firmware,
                    "cann": stack.cann,
                    "kernels_package": stack.kernels_package,
                    "vllm_ascend": stack.vllm_ascend,
                    "vllm": stack.vllm,
                    "torch": stack.torch,
                    "torch_npu": stack.torch_npu,
                    "python": stack.python,
                    "status": pairing_status(releases, driver=driver, firmware=firmware, cann=stack.cann),
                    "confidence": stack.confidence,
                    "default": _is_default(stack, default),
                    "warnings": list(stack.warnings),
                    "sources": list(stack.sources),
                })
    return sorted(rows, key=lambda r: (version_key(r["driver"]), version_key(r["cann"]),
                                       version_key(r["vllm_ascend"] or "0")), reverse=True)


def _is_default(stack: DesiredStack, default: Mapping) -> bool:
    return (
        same_release(stack.driver, default.get("driver", ""))
        and same_release(stack.firmware, default.get("firmware", ""))
        and same_release(stack.cann, default.get("cann", ""))
        and same_release(stack.vllm_ascend or NO_SERVING, default.get("vllm_ascend") or NO_SERVING)
    )
