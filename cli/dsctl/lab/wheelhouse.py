"""Build the lab's wheelhouse: small stand-in wheels for the serving stack, from releases.yaml.

The provisioning roles install torch, torch_npu, vllm and vllm-ascend, pinned
from one ``vllm_ascend_matrix`` row, into a venv on each host with::

    pip install --no-index --find-links <packages>/wheels --require-hashes -r requirements.txt

The real wheels need an NPU and weigh several GB, so the lab ships stand-ins
with the same distribution names and versions.  ``build_packages`` (and so
``dsctl lab packages --out DIR`` and ``dsctl lab up``) writes them to
``<packages>/wheels``: for every matrix row whose CANN is one of the releases'
``cann:`` versions, one wheel per distribution and version (duplicates
across rows are built once)::

    torch-<ver>-py3-none-any.whl          -> module torch
    torch_npu-<ver>-py3-none-any.whl      -> module torch_npu
    vllm-<ver>-py3-none-any.whl           -> module vllm
    vllm_ascend-<ver>-py3-none-any.whl    -> module vllm_ascend
    SHA256SUMS                            "<sha256 hex>  <file name>" lines, sorted by name

Each wheel is a PEP 427 ``py3-none-any`` wheel made with zipfile: the module's
``__init__.py`` (a docstring saying it is a lab stand-in, and ``__version__``),
then ``<name>-<ver>.dist-info/`` with METADATA (2.1), WHEEL and RECORD.  The
stand-ins declare no ``Requires-Dist``: the real ones pull dozens of PyPI
packages that the offline wheelhouse does not carry, and ``--require-hashes``
would need a pinned, hashed line for every one of them.

Output is deterministic (sorted entries, fixed zip times and modes, stored
uncompressed so the bytes do not depend on the zlib build), so the same
releases give the same bytes and the same SHA256SUMS.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
GENERATOR = "dsctl.lab.wheelhouse"
WHEEL_TAG = "py3-none-any"
SUMS_FILE = "SHA256SUMS"
# Distribution (as the real wheels spell it) -> releases.yaml vllm_ascend_matrix key; the import name is the same.
DISTRIBUTIONS = {"torch": "torch", "torch_npu": "torch_npu", "vllm": "vllm", "vllm_ascend": "vllm_ascend"}
SUMMARY = "dsctl lab stand-in for {name} {version}: imports and reports its version, nothing else"

# PEP 440 public + local version, as the spec's appendix gives it (case-insensitive, surrounding space allowed).
_PEP440 = re.compile(
    r"""
    ^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$
    """,
    re.VERBOSE | re.IGNORECASE,
)
_PRE_LETTERS = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}


@dataclass(frozen=True)
class StandIn:
    name: str  # distribution name, e.g. "torch_npu"
    version: str  # normalized PEP 440 version, e.g. "2.8.0.post2"

    @property
    def module(self) -> str:
        return self.name

    @property
    def file_name(self) -> str:
        return f"{wheel_name(self.name)}-{self.version}-{WHEEL_TAG}.whl"

    @property
    def dist_info(self) -> str:
        return f"{wheel_name(self.name)}-{self.version}.dist-info"


def normalize_version(text: str) -> str | None:
    """The normalized PEP 440 form of ``text`` ("v0.13.0" -> "0.13.0"), or None if it is no PEP 440 version."""
    match = _PEP440.match(str(text))
    if match is None:
        return None
    parts = []
    if match["epoch"] and int(match["epoch"]):
        parts.append(f"{int(match['epoch'])}!")
    parts.append(".".join(str(int(n)) for n in match["release"].split(".")))
    if match["pre"]:
        parts.append(f"{_PRE_LETTERS[match['pre_l'].lower()]}{int(match['pre_n'] or 0)}")
    if match["post"]:
        parts.append(f".post{int(match['post_n1'] or match['post_n2'] or 0)}")
    if match["dev"]:
        parts.append(f".dev{int(match['dev_n'] or 0)}")
    if match["local"]:
        parts.append("+" + ".".join(re.split(r"[-_.]", match["local"].lower())))
    return "".join(parts)


def wheel_name(distribution: str) -> str:
    """The distribution part of a wheel file name (PEP 427 / PEP 503): lower case, runs of -_. as one "_"."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def stand_ins(releases: dict) -> list[StandIn]:
    """The stand-ins the wheelhouse carries: every matrix row of a CANN release the lab has, deduplicated, sorted."""
    canns = {str(cann["version"]) for cann in releases.get("cann", [])}
    wanted = set()
    for row in releases.get("vllm_ascend_matrix", []):
        if str(row.get("cann")) not in canns:
            continue
        versions = {name: normalize_version(row.get(key) or "") for name, key in DISTRIBUTIONS.items()}
        # A row with a version that is not PEP 440 (pip could not pin it) is skipped whole: a partial row is
        # no installable stack.  None of the rows of the lab's CANN releases is like that today.
        if None in versions.values():
            continue
        wanted.update(StandIn(name, version) for name, version in versions.items())
    return sorted(wanted, key=lambda s: (s.name, s.version))


def build_wheelhouse(out_dir: Path, releases: dict) -> list[Path]:
    """Write every stand-in wheel plus SHA256SUMS into ``out_dir``; return the wheel paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stand_in in stand_ins(releases):
        path = out_dir / stand_in.file_name
        _write_atomically(path, build_wheel(stand_in))
        written.append(path)
    sums = "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(written, key=lambda p: p.name)
    )
    _write_atomically(out_dir / SUMS_FILE, sums.encode())
    return written


def build_wheel(stand_in: StandIn) -> bytes:
    """The deterministic bytes of one stand-in wheel."""
    name, version = stand_in.name, stand_in.version
    init = (
        f'"""dsctl lab stand-in for {name} {version}, NOT the real package.\n\n'
        "Built by dsctl.lab.wheelhouse so lab hosts can install and import the serving stack at the pinned\n"
        'version; it has no code beyond reporting that version.\n"""\n\n'
        f'__version__ = "{version}"\n'
    )
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY.format(name=name, version=version)}\n"
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
    files = {f"{stand_in.module}/__init__.py": init.encode()}
    info = {f"{stand_in.dist_info}/METADATA": metadata.encode(), f"{stand_in.dist_info}/WHEEL": wheel.encode()}
    # Module files first, then the .dist-info with RECORD last (as PEP 427 recommends), each group sorted.
    members = {**dict(sorted(files.items())), **dict(sorted(info.items()))}
    record_path = f"{stand_in.dist_info}/RECORD"
    record = "".join(f"{path},sha256={_record_digest(data)},{len(data)}\n" for path, data in members.items())
    members[record_path] = (record + f"{record_path},,\n").encode()

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for path, data in members.items():
            entry = zipfile.ZipInfo(path, date_time=FIXED_ZIP_TIME)
            entry.create_system = 3  # Unix, so the mode below is read as one
            entry.external_attr = 0o100644 << 16
            entry.compress_type = zipfile.ZIP_STORED
            archive.writestr(entry, data)
    return buffer.getvalue()


def _record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    temp.chmod(0o644)
    os.replace(temp, path)
