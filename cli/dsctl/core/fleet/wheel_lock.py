"""Hash locks of the serving stack: one file per pin set, architecture and Python (pure).

A lock names every distribution of the closure of one vllm-ascend matrix row (torch, torch-npu, vllm,
vllm-ascend, triton-ascend and all their dependencies) as ``name==version --hash=sha256:...``: exactly what
``pip install --require-hashes -r LOCK`` wants, so every wheel pip installs is hash-checked, not only the four
pins.  `dsctl wheelhouse build` (dsctl.services.wheelhouse) writes locks with pip's resolver; the lab writes
them for its stand-in wheels (dsctl.lab.wheelhouse); provisioning picks the lock of a host with
`choose_lock`, the one place that decides which lock a host uses.

Versions are compared as PEP 440 says (packaging), not as strings: a pin ``torch==2.8.0`` is met by
``torch-2.8.0+cpu`` (PyTorch's CPU index) and ``vllm==0.13.0`` by ``vllm-0.13.0+empty`` (vLLM built from
source with VLLM_TARGET_DEVICE=empty, as vllm-ascend's installation guide builds it), because a ``==``
specifier without a local label ignores the candidate's local label (PEP 440, "Version matching").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from dsctl.core.fleet.stack import serving_venv_name
from dsctl.core.http_url import parse_http_url
from dsctl.errors import DsctlError, ExitStatus

LOCK_PREFIX = "lock-"
LOCK_SUFFIX = ".txt"
# The architectures a lock is built for, as `uname -m` (and Ansible's ansible_architecture) name them.
ARCHES = ("aarch64", "x86_64")
_LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)"
                        r"(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})+)$")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_PYTHON = re.compile(r"^3\.[0-9]{1,2}$")


class LockError(DsctlError):
    exit_status = ExitStatus.USAGE


@dataclass(frozen=True)
class Locked:
    """One line of a lock: a distribution (PEP 503 name), its exact version and the wheel hashes allowed."""

    name: str
    version: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{digest}" for digest in self.hashes)


def python_tag(python: str) -> str:
    """``3.11`` -> ``3.11`` (checked): the major.minor a lock is for."""
    text = str(python).strip()
    if not _PYTHON.fullmatch(text):
        raise LockError(f"python: expected a major.minor version such as 3.11, got {text!r}")
    return text


# The minor versions a suggestion is picked from (CPython 3.x releases a matrix row may name).
_PYTHON_MINORS = tuple(f"3.{minor}" for minor in range(8, 15))


def python_in_row(python: str, supported: str | None, tag: str) -> str:
    """``python`` (checked by `python_tag`) when the matrix row of vllm-ascend ``tag`` supports it (its ``python``
    specifier, e.g. ">=3.10,<3.12"; None: the row says nothing); LockError naming --python otherwise, or pip
    would resolve a closure no server of that row can install."""
    python = python_tag(python)
    if supported is None:
        return python
    try:
        spec = SpecifierSet(supported)
    except InvalidSpecifier:
        return python  # the data's own problem, not the user's: left to pip
    if spec.contains(python):
        return python
    fits = [minor for minor in _PYTHON_MINORS if spec.contains(minor)]
    pick = f"pick one of {', '.join(fits)}" if fits else "pick another --release"
    raise LockError(f"--python {python}: vllm-ascend {tag}'s matrix row supports Python {supported}; {pick}")


def index_url_problem(url: str) -> str | None:
    """Why pip must not be given ``url`` as an index or a page of links, or None: http(s) with a host, or
    file:// with a path (the caller checks that the directory is there); no blank or control character."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "holds a blank or a control character"
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "file":
        return None if rest.startswith("/") else "expected file:///DIR (an absolute directory)"
    try:
        parse_http_url(url)  # the one http(s) URL rule: a host, a port 1..65535 or the scheme's default
    except ValueError as problem:
        return f"{problem} (or file:///DIR of a local simple index)"
    return None


def normalized_arch(arch: str) -> str:
    """``arm64`` (macOS, Debian's dpkg) -> ``aarch64``; ``amd64`` -> ``x86_64``; others checked."""
    text = {"arm64": "aarch64", "amd64": "x86_64"}.get(str(arch).strip().lower(), str(arch).strip().lower())
    if text not in ARCHES:
        raise LockError(f"arch: expected one of {', '.join(ARCHES)}, got {arch!r}")
    return text


def lock_name(pins: Mapping[str, str], arch: str, python: str) -> str:
    """``lock-vllm-ascend-0.13.0-1a2b3c4d-aarch64-py3.11.txt``: the lock of ``pins`` for one platform.

    Named after the stack's venv (`serving_venv_name`: the release and a digest of every pin), so a lock belongs
    to exactly one pin set, as the venv it fills does."""
    return f"{LOCK_PREFIX}{serving_venv_name(pins)}-{normalized_arch(arch)}-py{python_tag(python)}{LOCK_SUFFIX}"


def choose_lock(files: Iterable[str], pins: Mapping[str, str], arch: str, python: str) -> str | None:
    """The lock a host of ``arch`` whose serving Python is ``python`` installs ``pins`` from, if ``files`` has it.

    The one decision of which lock a host uses (the serving_stack role calls it through a filter): the lock
    for exactly these pins, this architecture and this major.minor Python; None when the wheelhouse has none.
    """
    wanted = lock_name(pins, arch, python)
    return wanted if wanted in set(files) else None


def python_of(version_text: str) -> str:
    """``Python 3.11.2`` / ``3.11.2`` / ``3.11`` -> ``3.11``."""
    found = re.search(r"(3\.[0-9]{1,2})(?:\.[0-9]+)?", str(version_text))
    if not found:
        raise LockError(f"python: cannot read a Python version from {str(version_text)[:60]!r}")
    return found.group(1)


# --------------------------------------------------------------------------- versions and wheel names


def pin_matches(pin: str, version: str) -> bool:
    """Whether ``version`` (installed or in a wheel name) meets the pin ``pin`` as pip's ``==`` does.

    ``pin_matches("2.8.0", "2.8.0+cpu")`` is True; ``pin_matches("2.8.0+cpu", "2.8.0")`` is False (a pin
    with a local label wants exactly it); a leading ``v`` of a git tag is accepted on the pin.
    """
    try:
        return Version(str(version)) in SpecifierSet(f"=={str(pin).strip().removeprefix('v')}")
    except (InvalidVersion, InvalidSpecifier):
        return str(pin).strip().lower().removeprefix("v") == str(version).strip().lower()


def wheel_of(file_name: str) -> tuple[str, str] | None:
    """``torch-2.8.0+cpu-cp311-cp311-linux_x86_64.whl`` -> ("torch", "2.8.0+cpu"); None for no wheel name."""
    if not str(file_name).endswith(".whl"):
        return None
    try:
        name, version, _build, _tags = parse_wheel_filename(str(file_name))
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return str(name), str(version)


def wheels_for(name: str, pin: str, files: Iterable[str]) -> list[str]:
    """The wheel files among ``files`` that are distribution ``name`` at a version meeting pin ``pin``."""
    wanted = canonicalize_name(str(name))
    found = []
    for file in files:
        parsed = wheel_of(file)
        if parsed is not None and parsed[0] == wanted and pin_matches(pin, parsed[1]):
            found.append(str(file))
    return sorted(found)


# --------------------------------------------------------------------------- lock text


def lock_entries(wheels: Mapping[str, str]) -> list[Locked]:
    """{wheel file: sha256} of one resolved closure -> its lock entries, one per distribution, sorted.

    Two wheels of one distribution at one version (say a manylinux and a linux tag) both become hashes of
    its line; two versions of one distribution are no closure and are refused.
    """
    by_name: dict[str, tuple[str, set[str]]] = {}
    for file, digest in sorted(wheels.items()):
        parsed = wheel_of(file)
        if parsed is None:
            raise LockError(f"lock: {file} is not a wheel file name (PEP 427)")
        name, version = parsed
        if name in by_name and by_name[name][0] != version:
            raise LockError(f"lock: {name} appears at {by_name[name][0]} and {version}; one closure has one version")
        by_name.setdefault(name, (version, set()))[1].add(str(digest).lower())
    return [Locked(name, version, tuple(sorted(hashes))) for name, (version, hashes) in sorted(by_name.items())]


def render_lock(entries: Iterable[Locked], header: Iterable[str] = ()) -> str:
    """The lock file's text: ``# `` comment lines, then one requirement line per distribution."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [entry.line() for entry in sorted(entries, key=lambda e: e.name)]
    return "\n".join(lines) + "\n"


def parse_lock(text: str) -> list[Locked]:
    """A lock's text -> its entries; a line that is not ``name==version --hash=sha256:<hex>...`` is an error."""
    entries = []
    seen = set()
    for number, raw in enumerate(str(text).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _LOCK_LINE.match(line)
        if not found:
            raise LockError(f"lock line {number} is not 'name==version --hash=sha256:<hex>': {line[:80]!r}")
        name = canonicalize_name(found.group("name"))
        if name in seen:
            raise LockError(f"lock line {number}: {name} is locked twice")
        seen.add(name)
        entries.append(Locked(name, found.group("version"), tuple(_HASH.findall(found.group("hashes")))))
    if not entries:
        raise LockError("lock: no requirement lines")
    return entries


def lock_problems(entries: Iterable[Locked], pins: Mapping[str, str]) -> list[str]:
    """What keeps a lock from installing ``pins``: a pin missing from it or locked at another version."""
    locked = {entry.name: entry.version for entry in entries}
    problems = []
    for name, pin in sorted(pins.items()):
        have = locked.get(canonicalize_name(str(name)))
        if have is None:
            problems.append(f"{canonicalize_name(str(name))}=={pin} is not in the lock")
        elif not pin_matches(pin, have):
            problems.append(f"the lock has {canonicalize_name(str(name))}=={have}, the pin is =={pin}")
    return problems


def lock_wheels(entries: Iterable[Locked], sums: Mapping[str, str]) -> list[str]:
    """The wheel files of a wheelhouse manifest ({file: sha256}) that the lock's hashes name, sorted.

    Every locked distribution must have at least one: a lock whose wheel is not in the wheelhouse is refused
    here, before a host downloads anything."""
    by_digest: dict[str, list[str]] = {}
    for file, digest in sums.items():
        if str(file).endswith(".whl"):
            by_digest.setdefault(str(digest).lower(), []).append(str(file))
    files = []
    for entry in entries:
        found = [file for digest in entry.hashes for file in by_digest.get(digest, [])]
        if not found:
            raise LockError(f"wheelhouse: no wheel of {entry.name}=={entry.version} with a locked hash in its "
                            "SHA256SUMS; rebuild it with dsctl wheelhouse build")
        files += found
    return sorted(set(files))


def plain_requirements(pins: Mapping[str, str]) -> str:
    """``name==version`` lines of the top-level pins only (an index without a lock: dependencies float)."""
    return "".join(f"{canonicalize_name(str(name))}=={str(version).removeprefix('v')}\n"
                   for name, version in sorted(pins.items()))


# --------------------------------------------------------------------------- pip's output


_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement (\S+)")
_CONFLICT = re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies")


def pip_failure(stderr: str) -> str:
    """The one thing a failed ``pip download`` could not do, from its stderr (its last ERROR line otherwise)."""
    text = str(stderr)
    for pattern, sentence in ((_NO_MATCH, "no wheel of {} for this platform"),
                              (_NO_VERSION, "no wheel of {} for this platform"),
                              (_CONFLICT, "conflicting dependencies of {}")):
        found = pattern.search(text)
        if found:
            return sentence.format(found.group(1))
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR:")]
    if errors:
        return errors[-1].removeprefix("ERROR:").strip()[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "pip failed without saying why"
