"""Ordering of Ascend version strings and the vendor files' range checks (dsctl.core.fleet.versions)."""

from __future__ import annotations

import pytest

from dsctl.core.fleet.versions import (
    compare_versions,
    in_ranges,
    in_release_line,
    is_prerelease,
    matches_prefix_ranges,
    same_release,
    same_version,
    sort_versions,
    version_key,
)
from dsctl.core.hostfacts.npusmi import firmware_in_ranges

# Each list is in ascending order, as Huawei releases them.
ORDERED = [
    ["24.1.rc1", "24.1.RC2", "24.1.rc2.2", "24.1.rc3", "24.1.0", "24.1.0.1", "25.0.rc1", "25.0.rc1.1", "25.5.0"],
    ["8.0.RC2", "8.0.RC3", "8.0.0", "8.1.RC1.alpha001", "8.1.RC1", "8.2.RC1", "8.3.RC2", "8.5.0", "8.5.1"],
    ["9.0.0-beta.1", "9.0.0-beta.2", "9.0.0", "9.0.1", "9.1.0"],
    ["v0.11.0rc0", "v0.11.0rc3", "v0.11.0", "v0.13.0rc1", "v0.13.0rc3", "v0.13.0", "v0.18.0"],
    ["2.7.1.dev20250724", "2.7.1", "2.7.1.post1", "2.8.0"],
]


@pytest.mark.parametrize("ascending", ORDERED)
def test_versions_sort_in_release_order(ascending):
    assert sort_versions(reversed(ascending)) == ascending
    for earlier, later in zip(ascending, ascending[1:], strict=False):
        assert compare_versions(earlier, later) == -1, (earlier, later)
        assert compare_versions(later, earlier) == 1, (later, earlier)


@pytest.mark.parametrize(
    ("older", "newer"),
    [("24.1.rc3", "24.1.0"), ("24.1.0", "25.5.0"), ("8.0.RC3", "8.0.0"), ("8.0.0", "8.3.RC2"), ("8.3.RC2", "8.5.0")],
)
def test_a_prerelease_sorts_before_the_final_release(older, newer):
    assert compare_versions(older, newer) < 0


@pytest.mark.parametrize(
    ("left", "right"),
    [("24.1.RC3", "24.1.rc3"), ("25.5", "25.5.0"), ("v0.13.0", "0.13.0"), ("2.9.0.post1+git4c901a4", "2.9.0.post1")],
)
def test_spellings_of_one_version_are_equal(left, right):
    assert same_version(left, right)


def test_newest_first():
    assert sort_versions(["8.0.0", "8.5.0", "8.3.RC2"], newest_first=True) == ["8.5.0", "8.3.RC2", "8.0.0"]


@pytest.mark.parametrize(("version", "pre"), [("8.3.RC2", True), ("9.0.0-beta.2", True), ("8.5.0", False),
                                              ("v0.13.0rc1", True), ("2.8.0.post2", False)])
def test_prerelease_detection(version, pre):
    assert is_prerelease(version) is pre


@pytest.mark.parametrize(
    ("firmware", "ranges", "inside"),
    [
        ("7.5.0.1.129", [["7.0.0", "7.5.99"]], True),
        ("7.8.0.5.216", [["7.0.0", "7.5.99"]], False),
        ("7.8.0.5.216", [["7.0.0", "8.9.9"]], True),
        ("7.3.0.1.231", [["7.0.0", "7.2.99"]], False),  # the field failure of section 14, item 6
        ("7.10.0.1.1", [["7.0.0", "7.9.99"]], False),  # numeric, not string order
        ("6.4.0.4.220", [["7.0.0", "7.5.99"], ["6.0.0", "6.4.99"]], True),
    ],
)
def test_firmware_ranges_agree_with_the_npu_smi_check(firmware, ranges, inside):
    assert in_ranges(firmware, ranges) is inside
    text = ",".join(f"[{lo},{hi}]" for lo, hi in ranges)
    assert firmware_in_ranges(firmware, text) is inside


DRV_24_1_RC3_FIRMWARE = [["23.0.0", "23.0.0."], ["24.0", "24.0."], ["24.1", "24.1."]]


@pytest.mark.parametrize(
    ("driver", "matches"),
    [
        ("24.1.rc3", True),
        ("24.1.RC3", True),
        ("24.1.0", True),
        ("24.1", True),
        ("24.0.rc1", True),
        ("23.0.0", True),
        ("23.0.0.1", True),
        ("23.0.rc3", False),  # a pre-release of 23.0.0, not a 23.0.0.* build
        ("24.10.0", False),  # 24.1 is a prefix of the string but not of the version
        ("24.2.0", False),
        ("25.5.0", False),
    ],
)
def test_driver_prefix_ranges(driver, matches):
    assert matches_prefix_ranges(driver, DRV_24_1_RC3_FIRMWARE) is matches


# --------------------------------------------------------------------------- one order, whatever the case

CASE_PAIRS = [("24.1.rc3", "24.1.RC3"), ("8.3.RC2", "8.3.rc2"), ("8.1.RC1.alpha001", "8.1.rc1.ALPHA001"),
              ("v0.13.0rc1", "V0.13.0RC1"), ("25.0.rc1.1", "25.0.RC1.1")]


@pytest.mark.parametrize(("lower", "upper"), CASE_PAIRS)
def test_case_spellings_are_one_version_one_release_and_sort_together(lower, upper):
    assert compare_versions(lower, upper) == 0 and same_version(lower, upper)
    assert same_release(lower, upper)
    assert version_key(lower) == version_key(upper)
    for other in ("24.1.0", "8.3.0", "8.0.0", "0.13.0", "25.5.0", "7.5.0.1.129"):
        assert compare_versions(lower, other) == compare_versions(upper, other), other


@pytest.mark.parametrize("ascending", ORDERED)
def test_mixed_case_lists_sort_like_their_lower_case_spelling(ascending):
    mixed = [version.upper() if index % 2 else version.lower() for index, version in enumerate(ascending)]
    assert sort_versions(reversed(mixed)) == mixed


def test_rc_numbers_compare_as_numbers():
    assert sort_versions(["24.1.rc10", "24.1.RC3", "24.1.rc2.2"]) == ["24.1.rc2.2", "24.1.RC3", "24.1.rc10"]


@pytest.mark.parametrize(
    ("left", "right", "release", "version"),
    [
        ("24.1.RC3", "24.1.rc3", True, True),
        ("v0.13.0", "0.13.0", True, True),
        ("25.5", "25.5.0", False, True),  # a release line is not the 25.5.0 package, but orders with it
        ("8.5.0", "8.5.1", False, False),
        (None, "8.5.0", False, False),
    ],
)
def test_same_release_is_stricter_than_same_version(left, right, release, version):
    assert same_release(left, right) is release
    if left is not None:
        assert same_version(left, right) is version
    if release:
        assert same_version(left, right)


@pytest.mark.parametrize(
    ("version", "line", "inside"),
    [("25.5.0", "25.5", True), ("25.5.1", "25.5", True), ("24.1.rc2.2", "24.1.rc2", True),
     ("24.1.RC2.2", "24.1.rc2", True), ("24.1.rc20", "24.1.rc2", False), ("24.10.0", "24.1", False),
     ("25.5.0", None, False), ("25.5.0", "", False)],
)
def test_release_lines(version, line, inside):
    assert in_release_line(version, line) is inside


@pytest.mark.parametrize(
    ("version", "ranges", "inside"),
    [
        ("24.1.RC3", [["24.1.rc1", "24.1.rc3"]], True),
        ("24.1.rc3", [["24.1.RC1", "24.1.RC3"]], True),
        ("24.1.rc10", [["24.1.rc1", "24.1.rc3"]], False),  # rc10 is after rc3, not between rc1 and rc2
        ("24.1.0", [["24.1.rc1", "24.1.rc3"]], False),
        ("7.5", [["7.5.0", "7.5.99"]], True),  # missing parts are 0, as in the order
    ],
)
def test_ranges_use_the_same_order(version, ranges, inside):
    assert in_ranges(version, ranges) is inside
    text = ",".join(f"[{lo},{hi}]" for lo, hi in ranges)
    assert firmware_in_ranges(version, text) is inside
