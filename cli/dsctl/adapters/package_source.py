"""The package source's files as the controller sees them: its SHA256SUMS (a directory on the controller or an
http(s) mirror) and which packages a local directory holds.  The manifest's checks are the caller's."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "SHA256SUMS"
FETCH_TIMEOUT_S = 30


def manifest_location(source: str) -> str:
    return f"{str(source).rstrip('/')}/{MANIFEST}"


def is_remote(source: str) -> bool:
    return str(source).startswith(("http://", "https://"))


def read_manifest(source: str) -> bytes | None:
    """The manifest's bytes; None when it is absent or cannot be fetched (the roles report that on the hosts)."""
    location = manifest_location(source)
    try:
        if is_remote(source):
            with urllib.request.urlopen(location, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 (http(s) only)
                return response.read()
        return Path(location).read_bytes()
    except OSError:
        return None


def present(source: str, names: Iterable[str]) -> set[str]:
    """Which of ``names`` a local source directory holds as files."""
    return {name for name in names if (Path(source) / name).is_file()}
