"""SHA256SUMS manifests: ``<64 hex>  <file name>`` lines, as ``sha256sum`` writes them (pure).

The one reader and writer of the format for the package source and the wheelhouse: `dsctl upgrade` and
`dsctl check --ready` read the package source's manifest (dsctl.services.upgrade), the roles read both through
the dsctl_parse_sha256sums filter (playbooks/filter_plugins/dsctl_filters.py), `dsctl wheelhouse build` and the
lab's package and wheelhouse builders write them.  Reading is strict: a line that is not a digest and a name
is an error, not skipped, since a skipped line would surface later as a "missing" package or wheel and hide
that the manifest itself is broken.  ``sha256sum -b`` marks each name with ``*`` (binary mode); the marker is
not part of the name.  sha256sum's escaped form (a line starting with ``\\``, for names with a backslash or a
line break) is not read: render never writes such names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from dsctl.errors import DsctlError

FIX = "regenerate it with sha256sum"
_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
# The digest, blanks, then the name with an optional "*" binary marker (sha256sum writes "<hex>  <name>" in
# text mode and "<hex> *<name>" in binary mode). Spaces inside a name are kept, as sha256sum writes them.
_LINE = re.compile(r"(?P<digest>[0-9a-fA-F]{64})[ \t]+\*?(?P<name>[^\s*].*)")


def parse(text: str, source: str = "SHA256SUMS") -> dict[str, str]:
    """Manifest text -> {file name: lowercase hex digest}; blank lines are ignored.

    A malformed line, or a name listed twice with different digests, raises DsctlError naming ``source``
    (the manifest's path or URL) and the line."""
    sums: dict[str, str] = {}
    first_line: dict[str, int] = {}
    # Lines end at "\n" only (sha256sum's separator), not at every character str.splitlines() breaks at.
    for number, raw in enumerate(str(text).split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        found = _LINE.fullmatch(line)
        if found is None:
            raise DsctlError(f"{source} line {number} is not '<sha256>  <file name>': {line[:80]!r}; {FIX}")
        name, digest = found["name"], found["digest"].lower()
        if _not_plain(name):
            # The roles join the name to a staging directory (get_url's dest): "../../x" would land outside it.
            raise DsctlError(f"{source} line {number} names {name[:80]!r}, not a plain file name (no '/', '\\', "
                             f"control character, '.' or '..'); {FIX} in the directory of the files")
        if sums.get(name, digest) != digest:
            raise DsctlError(f"{source} line {number} lists {name} again with another digest than line "
                             f"{first_line[name]}; {FIX}")
        sums[name] = digest
        first_line.setdefault(name, number)
    return sums


def _not_plain(name: str) -> bool:
    return (name in (".", "..") or "/" in name or "\\" in name
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name))


def render(digests: Mapping[str, str]) -> str:
    """The manifest of ``digests`` ({file name: hex digest}): one ``<hex>  <name>`` line each, sorted by name,
    hex in lowercase, so the same files always give the same bytes.  Names are plain file names of the
    manifest's own directory (no slash), which `parse` reads back unchanged."""
    lines = []
    for name in sorted(digests):
        digest = str(digests[name])
        if not name or name != name.strip() or any(c in name for c in "/\\\n\r") or name.startswith("*"):
            raise DsctlError(f"SHA256SUMS: cannot list the file name {name!r}: a name must be a plain file name "
                             "(no slash, backslash, line break or surrounding blanks, no leading '*'); rename it")
        if not _DIGEST.fullmatch(digest):
            raise DsctlError(f"SHA256SUMS: the digest of {name} is not 64 hex digits: {digest[:80]!r}; "
                             "hash the file again (hashlib.sha256(...).hexdigest())")
        lines.append(f"{digest.lower()}  {name}\n")
    return "".join(lines)
