"""Build the emulated vendor installer packages (.run) that lab hosts install, from releases.yaml.

Backend of ``dsctl lab packages --out DIR``.  Every release in
``dsctl/data/releases.yaml`` gives the packages a real site downloads
(ascend-interfaces.md section 5.1):

    Ascend-hdk-910b-npu-driver_<ver>_linux-<arch>.run
    Ascend-hdk-910b-npu-firmware_<fwver>.run
    Ascend-cann-toolkit_<ver>_linux-<arch>.run
    Ascend-cann-kernels-910b_<ver>_linux-<arch>.run   (up to 8.3.RC2)
    Ascend-cann-910b-ops_<ver>_linux-<arch>.run       (from 8.5)
    Ascend-cann-nnal_<ver>_linux-<arch>.run

plus ``SHA256SUMS`` (the .run files only), and the wheelhouse ``wheels/``: small
stand-in wheels of torch, torch_npu, vllm, vllm-ascend and triton-ascend at the
versions of the ``vllm_ascend_matrix`` rows of those CANN releases, with the
dependencies they declare, one hash lock per row for ``arch``, a PEP 503
``wheels/simple/`` index and their own ``wheels/SHA256SUMS`` for ``pip install
--require-hashes`` (dsctl.lab.wheelhouse).
Each .run is makeself-shaped: a bash header, then a
tar.gz payload whose SHA256 the header embeds.  The header implements the
makeself flags the vendor packages honour (``--check``, ``--quiet``,
``--nox11``, ``--noexec``, ``--extract=<dir>``) with makeself's messages
(megastep/makeself makeself-header.sh: "Verifying archive integrity...",
"Error in SHA256 checksums: X is different from Y", "Unable to decompress";
written anew here, not copied), extracts to a temporary directory and runs
``/usr/bin/python3 install.py <flags>`` from there.

The payload carries the package's metadata as JSON (lab hosts have no yaml),
a minimal ``dsctl`` package tree with the stdlib-only installer modules, and
for the driver the ``npu-smi``, ``upgrade-tool`` and ``hccn_tool`` zipapps.

Output is deterministic (fixed tar/zip times and owners, gzip mtime 0), so
the same releases give the same bytes and checksums; the wheelhouse is
deterministic the same way.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import io
import json
import marshal
import os
import platform
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

import dsctl
from dsctl.core.fleet import sha256sums
from dsctl.lab.wheelhouse import build_wheelhouse

DSCTL_DIR = Path(dsctl.__file__).resolve().parent
RELEASES_FILE = DSCTL_DIR / "data" / "releases.yaml"

# Modules the installer needs on the host (all standard library only).
INSTALLER_MODULES = (
    "emu/hwstate.py",
    "emu/runpkg.py",
    "emu/installer.py",
    "emu/install_hdk.py",
    "emu/install_cann.py",
    "core/hostfacts/versionfiles.py",
)
PACKAGE_INITS = ("__init__.py", "emu/__init__.py", "core/__init__.py", "core/hostfacts/__init__.py")
# Driver tools shipped as zipapps: file name -> (entry point, the modules it imports).  Each carries only its own
# modules: with their bytecode beside them (bytecode()), one zipapp of every module was three times the driver's size.
DRIVER_TOOLS = {
    "npu-smi": ("dsctl.emu.npu_smi:main", ("emu/hwstate.py", "emu/npu_smi.py", "core/hostfacts/npusmi.py",
                                          "core/hostfacts/versionorder.py")),
    "upgrade-tool": ("dsctl.emu.upgrade_tool:main", ("emu/hwstate.py", "emu/upgrade_tool.py")),
    "hccn_tool": ("dsctl.emu.hccn_tool:main", ("emu/hwstate.py", "emu/npu_net.py", "emu/hccn_tool.py")),
}
ZIPAPP_SHEBANG = b"#!/usr/bin/python3\n"

# makeself labels printed as "Uncompressing <label>  100%" (section 5.4; the 910B firmware label and the
# CANN one from public Atlas 800I A2 / CANN 8.0.0 install transcripts).
DRIVER_LABEL = "ASCEND DRIVER RUN PACKAGE"
FIRMWARE_LABEL = "ASCEND-HDK-{family}-NPU FIRMWARE RUN PACKAGE"
CANN_LABEL = "ASCEND_RUN_PACKAGE"

FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)

INSTALL_LAUNCHER = '''\
"""Installer entry of an emulated Ascend package (dsctl lab); run by the .run header."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dsctl.emu.installer import main  # noqa: E402

sys.exit(main(sys.argv[1:], HERE))
'''

PACKAGE_INIT = '"""Installer modules of an emulated Ascend package (copied from dsctl)."""\n'

HEADER = """\
#!/bin/bash
# Emulated Ascend vendor package for the dsctl lab, NOT a Huawei package: a makeself-style
# self-extracting archive (this bash header + a tar.gz payload), built by dsctl.lab.packages.
# Package: @NAME@
label="@LABEL@"
payload_sha256="@SHA256@"
payload_offset=$((@OFFSET@))
payload_size=$((@SIZE@))

quiet=n
noexec=n
check=n
target=""
for arg in "$@"; do
    case "$arg" in
        --check) check=y ;;
        -q|--quiet) quiet=y ;;
        --noexec) noexec=y ;;
        --extract=*) target="${arg#--extract=}" ;;
        --nox11) ;;  # no xterm is ever spawned: nothing to turn off
    esac
done

payload() {
    tail -c +$((payload_offset + 1)) "$0" | head -c "$payload_size"
}

verify() {
    [ "$quiet" = n ] && printf 'Verifying archive integrity...'
    actual=$(payload | sha256sum | cut -b-64)
    [ "$quiet" = n ] && printf '  100%%  '
    if [ "$actual" != "$payload_sha256" ]; then
        echo "Error in SHA256 checksums: $actual is different from $payload_sha256" >&2
        exit 2
    fi
    if [ "$quiet" = n ]; then
        printf ' SHA256 checksums are OK.'
        echo " All good."
    fi
}

verify
[ "$check" = y ] && exit 0

if [ -n "$target" ]; then
    tmpdir="$target"
    keep=y
    mkdir -p "$tmpdir" || { echo "Cannot create target directory $tmpdir" >&2; exit 1; }
else
    keep=n
    tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/selfgz.XXXXXX") || {
        echo "Cannot create target directory ${TMPDIR:-/tmp}/selfgz.XXXXXX" >&2
        echo "You should try option --extract=<dir>" >&2
        exit 1
    }
fi
cleanup() {
    if [ "$keep" = n ]; then cd / && rm -rf "$tmpdir"; fi
}
trap 'echo "Signal caught, cleaning up" >&2; cleanup; exit 15' 1 2 3 15

[ "$quiet" = n ] && printf 'Uncompressing %s' "$label"
if ! payload | gzip -cd | tar -xpf - -C "$tmpdir" 2>/dev/null; then
    echo >&2
    echo "Unable to decompress $0" >&2
    cleanup
    exit 1
fi
[ "$quiet" = n ] && printf '  100%%  \\n'

res=0
if [ "$noexec" = n ]; then
    runfile=$(readlink -f "$0")
    (cd "$tmpdir" && DSCTL_RUN_PACKAGE="$runfile" /usr/bin/python3 "$tmpdir/install.py" "$@")
    res=$?
fi
cleanup
exit $res
"""


@dataclass(frozen=True)
class PackageSpec:
    name: str
    label: str
    metadata: dict
    with_driver_tools: bool = False


def load_releases(path: Path = RELEASES_FILE) -> dict:
    return yaml.safe_load(path.read_text())


def package_specs(releases: dict, arch: str) -> list[PackageSpec]:
    """Every package the releases describe, with the metadata its installer reads."""
    specs = []
    for hdk in releases.get("hdk", []):
        family = hdk["family"]
        driver_prefix = f"Ascend-hdk-{family}-npu-driver_"
        firmware_prefix = f"Ascend-hdk-{family}-npu-firmware_"
        common = {
            "family": family,
            "arch": arch,
            "hdk_version": hdk["version"],
            "driver": hdk["driver"],
            "firmware": hdk["firmware"],
        }
        driver_name = f"{driver_prefix}{hdk['driver']['version']}_linux-{arch}.run"
        specs.append(
            PackageSpec(
                driver_name,
                DRIVER_LABEL,
                {
                    "component": "driver",
                    "version": hdk["driver"]["version"],
                    "run_name": driver_name,
                    "package_prefix": driver_prefix,
                    **common,
                },
                with_driver_tools=True,
            )
        )
        firmware_name = f"{firmware_prefix}{hdk['firmware']['version']}.run"
        specs.append(
            PackageSpec(
                firmware_name,
                FIRMWARE_LABEL.format(family=family.upper()),
                {
                    "component": "firmware",
                    "version": hdk["firmware"]["version"],
                    "run_name": firmware_name,
                    "package_prefix": firmware_prefix,
                    **common,
                },
            )
        )
    for cann in releases.get("cann", []):
        version = cann["version"]
        kernels_package = cann["kernels"]["package"]  # kernels-910b (<= 8.3.RC2) or 910b-ops (>= 8.5)
        for component, product in (("toolkit", "toolkit"), ("kernels", kernels_package), ("nnal", "nnal")):
            prefix = f"Ascend-cann-{product}_"
            name = f"{prefix}{version}_linux-{arch}.run"
            specs.append(
                PackageSpec(
                    name,
                    CANN_LABEL,
                    {
                        "component": component,
                        "version": version,
                        "arch": arch,
                        "run_name": name,
                        "package_prefix": prefix,
                        "family": cann["kernels"]["family"],
                        "cann": cann,
                    },
                )
            )
    return specs


def build_packages(out_dir: Path, arch: str = platform.machine(), releases: dict | None = None) -> list[Path]:
    """Write every package plus SHA256SUMS into ``out_dir``, the wheelhouse into ``out_dir/wheels``.

    Return the .run paths, then the wheel paths.
    """
    releases = load_releases() if releases is None else releases
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in package_specs(releases, arch):
        data = build_run(spec)
        path = out_dir / spec.name
        temp = path.with_name(f".{spec.name}.tmp")
        temp.write_bytes(data)
        temp.chmod(0o755)
        os.replace(temp, path)
        written.append(path)
    sums = sha256sums.render({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in written})
    (out_dir / "SHA256SUMS").write_text(sums)
    return written + build_wheelhouse(out_dir / "wheels", releases, arch)


def build_run(spec: PackageSpec) -> bytes:
    payload = tar_gz(payload_files(spec))
    # Fixed-width numbers keep the header length independent of their values; the shell reads
    # "$((      2232))" as 2232 (no leading zeros: POSIX sh would take them for octal).
    placeholder = " " * 10
    header = (
        HEADER.replace("@NAME@", spec.name)
        .replace("@LABEL@", spec.label)
        .replace("@SHA256@", hashlib.sha256(payload).hexdigest())
        .replace("@SIZE@", f"{len(payload):10d}")
    )
    offset = len(header.replace("@OFFSET@", placeholder).encode())
    return header.replace("@OFFSET@", f"{offset:10d}").encode() + payload


def payload_files(spec: PackageSpec) -> dict[str, tuple[bytes, int]]:
    """Relative path -> (content, mode) of a package payload."""
    files = {
        "install.py": (INSTALL_LAUNCHER.encode(), 0o755),
        "package.json": ((json.dumps(spec.metadata, indent=1) + "\n").encode(), 0o644),
    }
    for init in PACKAGE_INITS:
        files[f"dsctl/{init}"] = (PACKAGE_INIT.encode(), 0o644)
    for module in INSTALLER_MODULES:
        files[f"dsctl/{module}"] = ((DSCTL_DIR / module).read_bytes(), 0o644)
    if spec.with_driver_tools:
        for tool, (entry, modules) in DRIVER_TOOLS.items():
            files[f"bin/{tool}"] = (zipapp(entry, modules), 0o755)
    return files


def zipapp(entry: str, modules: tuple[str, ...]) -> bytes:
    """A deterministic zipapp (``#!/usr/bin/python3``) running ``module:function``.

    Built from whatever the emulator modules contain now; a module not written
    yet is left out (the tool then fails on the host with ImportError).
    """
    module, function = entry.split(":")
    members = {"__main__.py": f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n".encode()}
    for init in PACKAGE_INITS:
        members[f"dsctl/{init}"] = b""
    for name in modules:
        source = DSCTL_DIR / name
        if source.is_file():
            members[f"dsctl/{name}"] = source.read_bytes()
            members[f"dsctl/{name}c"] = bytecode(f"dsctl/{name}", members[f"dsctl/{name}"])
    buffer = io.BytesIO()
    buffer.write(ZIPAPP_SHEBANG)
    # As zipapp.create_archive does: the zip follows the shebang in the same stream.
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, members[name])
    return buffer.getvalue()


def bytecode(name: str, source: bytes) -> bytes:
    """The module's bytecode as an unchecked hash-based .pyc (PEP 552), stored beside its source in the zipapp.

    Why: zipimport never writes a bytecode cache, so a zipapp of sources compiles every module at every run: a third
    of each ``hccn_tool`` or ``npu-smi`` call's CPU on the lab (79 -> 53 ms measured), where the real tools are C
    programs, and a provision or check calls them dozens of times per host.  zipimport takes a .pyc before
    its .py and, with an unchecked hash, never reads the source to validate it; an interpreter of another Python
    version rejects the magic number and compiles the .py beside it instead.  Deterministic: the same source and
    interpreter give the same bytes (the packages' checksums rely on it).
    """
    flags = (1).to_bytes(4, "little")  # hash-based, not checked against the source (PEP 552)
    code = compile(source, name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)


def tar_gz(files: dict[str, tuple[bytes, int]]) -> bytes:
    """Deterministic tar.gz: sorted members, root-owned, mtime 0, gzip header mtime 0."""
    directories = sorted({str(parent) for name in files for parent in Path(name).parents if str(parent) != "."})
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.GNU_FORMAT) as archive:
            for directory in directories:
                archive.addfile(_tar_info(directory, tarfile.DIRTYPE, 0o755, 0))
            for name in sorted(files):
                content, mode = files[name]
                archive.addfile(_tar_info(name, tarfile.REGTYPE, mode, len(content)), io.BytesIO(content))
    return raw.getvalue()


def _tar_info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsctl.lab.packages", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--arch", default=platform.machine())
    args = parser.parse_args(argv)
    for path in build_packages(args.out, args.arch):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
