"""SHA256SUMS manifests (dsctl.core.fleet.sha256sums): what sha256sum writes reads back, broken ones are refused."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from dsctl.core.fleet import sha256sums
from dsctl.errors import DsctlError

A, B = "a" * 64, "b" * 64


def test_render_then_parse_round_trips():
    digests = {"two.run": B, "one.run": A.upper(), "name with spaces.whl": A}
    text = sha256sums.render(digests)
    assert sha256sums.parse(text) == {name: digest.lower() for name, digest in digests.items()}


def test_render_sorts_by_name_with_lowercase_hex_in_sha256sums_layout():
    assert sha256sums.render({"b.whl": B.upper(), "A.whl": A, "a.whl": A}) == (
        f"{A}  A.whl\n{A}  a.whl\n{B}  b.whl\n")
    assert sha256sums.render({}) == ""


def test_what_sha256sum_writes_parses_in_text_and_binary_mode(tmp_path):
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum (coreutils) not installed")
    for name, data in (("one.run", b"one"), ("two.whl", b"two")):
        (tmp_path / name).write_bytes(data)
    expected = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in ("one.run", "two.whl")}
    for mode in ("-t", "-b"):
        written = subprocess.run(["sha256sum", mode, "one.run", "two.whl"], cwd=tmp_path, check=True,
                                 capture_output=True, text=True, timeout=30).stdout
        assert sha256sums.parse(written) == expected
    # And sha256sum accepts what render writes.
    (tmp_path / "SHA256SUMS").write_text(sha256sums.render(expected))
    subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=30)


def test_binary_marker_is_not_part_of_the_name_and_blank_lines_are_ignored():
    text = f"\n{A}  one.run\r\n\n{B.upper()} *two.run\n   \n"
    assert sha256sums.parse(text) == {"one.run": A, "two.run": B}


@pytest.mark.parametrize("line", [f"{A[:-1]}  short.run", f"{A}", f"{A}  ", f"{A} *", "not a line",
                                  f"{A}x  glued.run", f"\\{A}  escaped\\\\name.run"])
def test_a_malformed_line_names_the_source_the_line_and_the_fix(line):
    text = f"{B}  fine.run\n\n{line}\n"
    with pytest.raises(DsctlError) as refused:
        sha256sums.parse(text, source="/srv/ascend/SHA256SUMS")
    message = str(refused.value)
    assert message.startswith("/srv/ascend/SHA256SUMS line 3 is not '<sha256>  <file name>'")
    assert message.endswith("; regenerate it with sha256sum") and "\n" not in message


def test_a_name_listed_twice_must_have_one_digest():
    assert sha256sums.parse(f"{A}  one.run\n{A.upper()} *one.run\n") == {"one.run": A}
    with pytest.raises(DsctlError, match=r"^SHA256SUMS line 3 lists one.run again with another digest than "
                                         r"line 1; regenerate it with sha256sum$"):
        sha256sums.parse(f"{A}  one.run\n{B}  two.run\n{B}  one.run\n")


@pytest.mark.parametrize("name", ["", "wheels/x.whl", "two\nlines.run", "cr\r.run", "back\\slash.run",
                                  " padded.run", "*starred.run"])
def test_render_refuses_a_name_parse_would_not_read_back(name):
    with pytest.raises(DsctlError, match="cannot list the file name .*; rename it$"):
        sha256sums.render({name: A})


@pytest.mark.parametrize("digest", ["a" * 63, "g" * 64, "", A + "\n"])
def test_render_refuses_a_digest_that_is_not_64_hex(digest):
    with pytest.raises(DsctlError, match="the digest of x.run is not 64 hex digits"):
        sha256sums.render({"x.run": digest})


@pytest.mark.parametrize("name", ["../../x.whl", "../x.run", "wheels/x.whl", "/etc/shadow", "back\\slash.whl",
                                  "..", ".", "bell\x07.whl", "del\x7f.whl", "tab\tin.whl"])
def test_a_name_that_is_not_a_plain_file_name_is_refused_naming_the_line(name):
    # The roles use each name as a get_url destination below the staging directory.
    with pytest.raises(DsctlError) as refused:
        sha256sums.parse(f"{B}  fine.run\n{A}  {name}\n", source="https://mirror.example/wheels/SHA256SUMS")
    message = str(refused.value)
    assert message.startswith(f"https://mirror.example/wheels/SHA256SUMS line 2 names {name!r}, not a plain file "
                              "name (no '/', '\\', control character, '.' or '..')")
    assert "\n" not in message
