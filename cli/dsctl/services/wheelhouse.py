"""`dsctl wheelhouse build`: resolve the serving stack's pins with pip, download the closure, write hash locks.

The resolver is pip's own, run as ``pip download --only-binary=:all: --platform ... --python-version X.Y
--implementation cp``: of the three ways pip offers (``download``, ``install --dry-run --report``, ``lock``),
it is the one that resolves for ANOTHER platform and Python than the controller's (the servers are often
aarch64 with another Python), downloads exactly the wheels it chose in one step, and is stable across the pip
versions sites run (``pip lock`` is experimental in pip 25-26, and ``--report`` carries a hash only when the
index published one).  Each wheel downloaded is hashed here, so the lock's hashes are those of the bytes in
the wheelhouse whatever the index said.

One lock per pin set, architecture and Python (dsctl.core.fleet.wheel_lock names it), each from its own empty
download directory, so a lock lists exactly the closure pip chose for it; the wheels then join the wheelhouse
and SHA256SUMS covers every wheel and lock there (the file provisioning checks them against).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from dsctl import data
from dsctl.adapters import output_paths, pip_download
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import sha256sums, wheel_lock
from dsctl.core.fleet.matrix import release_pins
from dsctl.core.load import limits
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services.fleet import load_fleet

SUMS_FILE = "SHA256SUMS"
# The platform tags pip may choose for a Linux server of ``arch``: torch publishes manylinux_2_28 wheels,
# torch_npu manylinux_2_17 / manylinux2014 ones, a wheel built on the host itself (vllm from source) is
# linux_<arch>; pure wheels (py3-none-any) fit every platform.
PLATFORM_TAGS = ("manylinux_2_28_{arch}", "manylinux_2_17_{arch}", "manylinux2014_{arch}", "linux_{arch}")
DEFAULT_TIMEOUT = 900.0


def pin_sets(inventory: Path | None, release: str | None, vault: VaultOptions | None = None
            ) -> tuple[tuple[dict[str, str], str | None], ...]:
    """The pin sets to lock, each with its matrix row's Python specifier."""
    if (inventory is None) == (release is None):
        raise UsageError("INVENTORY or --release: give exactly one (the hosts' rows, or one vllm-ascend tag)")
    if release is not None:
        return (release_pins(data.load("releases"), release),)
    settings = load_fleet(inventory, vault=vault).settings
    stacks: dict[tuple, tuple[dict[str, str], str | None]] = {}
    for host in settings.values():
        if host.stack is not None and host.stack.pip_pins:
            stacks[tuple(sorted(host.stack.pip_pins.items()))] = (dict(host.stack.pip_pins), host.stack.python)
    return tuple(stacks[key] for key in sorted(stacks))


@dataclass(frozen=True)
class WheelhouseRequest:
    stacks: tuple[Mapping[str, str], ...]  # pin sets, one per matrix row wanted
    arches: tuple[str, ...]
    pythons: tuple[str, ...]
    out: Path
    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    pip: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "pip"))
    # Each stack's matrix row Python specifier (">=3.10,<3.12"), in the order of ``stacks``; None: not said.
    python_ranges: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class BuiltLock:
    file: str
    arch: str
    python: str
    pins: dict[str, str]
    distributions: int

    def to_dict(self) -> dict:
        return {"file": self.file, "arch": self.arch, "python": self.python, "pins": self.pins,
                "distributions": self.distributions}


@dataclass(frozen=True)
class WheelhouseResult:
    out: Path
    locks: tuple[BuiltLock, ...]
    wheels: int

    def to_dict(self) -> dict:
        return {"out": str(self.out), "locks": [lock.to_dict() for lock in self.locks], "wheels": self.wheels}


def check_request(request: WheelhouseRequest) -> None:
    """Usage problems, before pip runs."""
    if not request.index_url and not request.find_links:
        raise UsageError("--index-url or --find-links: name the index or mirror to resolve the pins from")
    if not request.stacks:
        raise UsageError("INVENTORY: no host of it has a serving stack (dsctl_vllm_ascend_version: none everywhere)")
    if request.timeout <= 0:
        raise UsageError(f"--timeout: {request.timeout:g} should be more than 0 seconds")
    try:  # the one number rule (the command line's callback applies it too): no nan, no inf, at most a day
        limits.number("--timeout", request.timeout, None, limits.SECONDS_PER_DAY, "seconds")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for arch in request.arches:
        wheel_lock.normalized_arch(arch)
    for python in request.pythons:
        wheel_lock.python_tag(python)
        for pins, supported in zip(request.stacks, request.python_ranges, strict=False):
            wheel_lock.python_in_row(python, supported, pins.get("vllm-ascend", "?"))
    if request.index_url is not None:
        _check_url("--index-url", request.index_url)
        _check_simple_index(request.index_url, request.stacks)
    for link in request.find_links:
        # pip takes a URL or a local directory/page; a missing local one would surface as "no wheel of torch"
        if "://" in link:
            _check_url("--find-links", link)
        elif not Path(link).exists():
            raise UsageError(f"--find-links {link}: no such directory or file; give a directory of wheels, a page "
                             "of links, or a URL")
    if request.out.exists() and not request.out.is_dir():
        raise UsageError(f"--out: {request.out} exists and is not a directory")


def _check_url(option: str, url: str) -> None:
    """http(s), or file:// naming a directory that exists: pip also fetches ftp:// or any other scheme its
    session knows, and a file:// URL of a system directory (/etc) is nothing pip can resolve from."""
    problem = wheel_lock.index_url_problem(url)
    if problem is not None:
        raise UsageError(f"{option} {url!r}: {problem}; give the index or mirror's http(s):// URL, or a local "
                         "directory of wheels with --find-links DIR")
    if url.lower().startswith("file://"):
        directory = Path(url2pathname(urlsplit(url).path))
        if not directory.is_dir():
            raise UsageError(f"{option} {url}: {directory} is not a directory; give an existing local index or "
                             "directory of wheels")


def _check_simple_index(url: str, stacks: tuple[Mapping[str, str], ...]) -> None:
    """A file:// index must be laid out as PEP 503 says: pip reads <index>/<project>/index.html of a local one
    (pip's collector joins "index.html" to a file: directory URL), so a directory without them (file:///etc) is
    refused here, naming the first project missing, instead of pip failing on every pin.  Only the pinned projects
    are looked for; their dependencies are pip's to find."""
    if not url.lower().startswith("file://"):
        return
    root = Path(url2pathname(urlsplit(url).path))
    for pins in stacks:
        for name in sorted(pins):
            if not (root / name / "index.html").is_file():
                raise UsageError(f"--index-url {url}: not a simple index (PEP 503): no {name}/index.html under "
                                 f"{root}; give an http(s):// index, a directory laid out as a simple index, or the "
                                 "wheels' directory with --find-links")


def _source(request: WheelhouseRequest) -> str:
    return request.index_url or " ".join(request.find_links)


def download_argv(request: WheelhouseRequest, pins: Mapping[str, str], arch: str, python: str,
                  dest: Path) -> list[str]:
    argv = [*request.pip, "download", "--dest", str(dest), "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python, "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
    for tag in PLATFORM_TAGS:
        argv += ["--platform", tag.format(arch=arch)]
    argv += ["--index-url", request.index_url] if request.index_url else ["--no-index"]
    for link in request.find_links:
        argv += ["--find-links", link]
    return argv + [f"{name}=={version}" for name, version in sorted(pins.items())]


def _download(request: WheelhouseRequest, pins: Mapping[str, str], arch: str, python: str, dest: Path) -> None:
    lock = wheel_lock.lock_name(pins, arch, python)
    try:
        result = pip_download.run(download_argv(request, pins, arch, python, dest), request.timeout)
    except subprocess.TimeoutExpired:
        raise DsctlError(f"wheelhouse: pip did not resolve {lock} from {_source(request)} in {request.timeout:g} s; "
                         "raise --timeout or use a nearer mirror", ExitStatus.TIMEOUT) from None
    if result.returncode != 0:
        raise DsctlError(f"wheelhouse: {arch}/py{python}: {wheel_lock.pip_failure(result.stderr)} "
                         f"from {_source(request)}; add it to the index or mirror, or pick another --release")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _take_wheels(staging: Path, out: Path) -> dict[str, str]:
    """Move the downloaded wheels into ``out``; {file: sha256}.  The same name with other bytes is refused."""
    taken = {}
    for path in sorted(staging.glob("*.whl")):
        digest = _sha256(path)
        target = out / path.name
        if target.exists() and _sha256(target) != digest:
            raise DsctlError(f"wheelhouse: {target} exists with other bytes than the index serves now; "
                             "remove it or build into an empty --out")
        os.replace(path, target)
        taken[path.name] = digest
    return taken


def write_sums(out: Path) -> int:
    """SHA256SUMS over every wheel and lock in ``out``; the number of wheels."""
    files = sorted(p for p in out.iterdir() if p.is_file() and (p.suffix == ".whl" or (
        p.name.startswith(wheel_lock.LOCK_PREFIX) and p.name.endswith(wheel_lock.LOCK_SUFFIX))))
    text = sha256sums.render({p.name: _sha256(p) for p in files})
    temp = out / f".{SUMS_FILE}.tmp"
    temp.write_text(text)
    os.replace(temp, out / SUMS_FILE)
    return sum(1 for p in files if p.suffix == ".whl")


def build(request: WheelhouseRequest, progress: Callable[[str], None] | None = None) -> WheelhouseResult:
    """Resolve and download every (pins, arch, python) of ``request`` into ``request.out`` and lock each."""
    check_request(request)
    out = request.out
    output_paths.check_dir("--out", out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # os.access cannot see every refusal (root under /proc, a full disk): the kernel's answer, in one line.
        raise UsageError(f"--out {out}: cannot create it ({exc.strerror}); choose a writable directory") from None
    built = []
    for pins in request.stacks:
        for arch in (wheel_lock.normalized_arch(a) for a in request.arches):
            for python in request.pythons:
                name = wheel_lock.lock_name(pins, arch, python)
                if progress is not None:
                    progress(f"resolving {name}")
                staging = out / f".download-{name.removesuffix(wheel_lock.LOCK_SUFFIX)}"
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir()
                try:
                    _download(request, pins, arch, python, staging)
                    wheels = _take_wheels(staging, out)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                entries = wheel_lock.lock_entries(wheels)
                problems = wheel_lock.lock_problems(entries, pins)
                if problems:  # pip resolved, but not to the pins (cannot happen with == pins; kept as a guard)
                    raise DsctlError(f"wheelhouse: {name}: {problems[0]}")
                header = [f"dsctl wheelhouse build: vllm-ascend {pins.get('vllm-ascend', '?')} on {arch}, "
                          f"Python {python}, from {_source(request)}",
                          "every distribution of the closure with its sha256 (pip install --require-hashes -r)"]
                (out / name).write_text(wheel_lock.render_lock(entries, header))
                built.append(BuiltLock(name, arch, python, dict(pins), len(entries)))
    return WheelhouseResult(out, tuple(built), write_sums(out))
