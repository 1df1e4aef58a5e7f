"""Build the lab's wheelhouse: small stand-in wheels for the serving stack, from releases.yaml.

The provisioning roles install torch, torch_npu, vllm and vllm-ascend, pinned
from one ``vllm_ascend_matrix`` row, into a venv on each host with::

    pip install --no-index --find-links <packages>/wheels --require-hashes -r requirements.txt

The real wheels need an NPU and weigh several GB, so the lab ships stand-ins
with the same distribution names and versions.  ``build_packages`` (and so
``dsctl lab packages --out DIR`` and ``dsctl lab up``) writes them to
``<packages>/wheels``: for every matrix row whose CANN is one of the releases'
``cann:`` versions, one wheel per distribution and version (duplicates
across rows are built once), plus the dependencies they declare::

    torch-<ver>-py3-none-any.whl                -> module torch
    torch_npu-<ver>-py3-none-any.whl            -> module torch_npu
    vllm-<ver>+empty-py3-none-any.whl           -> module vllm (a local version, as vLLM built from
                                                   source with VLLM_TARGET_DEVICE=empty names itself)
    vllm_ascend-<ver>-py3-none-any.whl          -> module vllm_ascend
    triton_ascend-<ver>-py3-none-any.whl        -> module triton (rows from vllm-ascend 0.13)
    filelock, typing_extensions, sympy, mpmath, numpy, requests, idna   (the dependencies, one version each)
    lock-vllm-ascend-<ver>-<digest>-<arch>-py<X.Y>.txt   one hash lock per row, lab arch and Python
    simple/index.html, simple/<name>/index.html          a PEP 503 index over the same files
    SHA256SUMS                                  "<sha256 hex>  <file name>" lines (wheels and locks)

The stand-ins declare ``Requires-Dist`` as the real ones do, in miniature
(``DEPENDENCIES``): vllm_ascend needs vllm, torch_npu (and triton-ascend where
its row names one), torch_npu needs torch and numpy, torch needs filelock,
typing-extensions and sympy, sympy needs mpmath, vllm needs numpy and
requests, requests needs idna: a tree four levels deep, so ``pip
--require-hashes`` needs a hashed line for every one of them, which the locks
give (dsctl.core.fleet.wheel_lock; `dsctl wheelhouse build` writes the same
locks with pip's resolver).  The dependency stand-ins are empty modules: none
of them is a module the vendored engine imports (it is standard library only).

The ``vllm`` stand-ins (every version, the same files) also serve: they carry

* ``vllm/entrypoints/cli/main.py`` and, in the dist-info, ``entry_points.txt``
  (``vllm = vllm.entrypoints.cli.main:main``, as the real wheel names it), so
  pip writes ``<venv>/bin/vllm`` and ``vllm serve MODEL [flags]`` runs dsctl's
  emulated engine (``dsctl.engine``; see ``STAND_IN_VLLM_MAIN`` for how the
  command line is translated and the environment it reads:
  ``DSCTL_ENGINE_STARTUP``, ``DSCTL_ENGINE_TIME_SCALE``);  ``vllm --version``
  prints the stand-in's version;
* a vendored copy of the part of dsctl the engine imports, as the top-level
  ``dsctl`` package: the import closure of ``dsctl.engine.__main__`` and of the
  entry point (every ``import``/``from ... import`` of a ``dsctl`` module,
  function-level ones included, followed through the modules' sources; see
  ``engine_closure``), plus the data files those modules read with
  ``data.load("<name>")`` (``dsctl/data/<name>.yaml``).  The files are copied
  byte for byte from the dsctl package this module belongs to.  That subset is
  standard library only (``dsctl.engine.profiles`` stands in for PyYAML), so
  ``<venv>/bin/python3 -m dsctl.engine serve ...`` works in the serving venv
  too.  A serving venv is not meant to hold the real dsctl as well: both would
  own ``dsctl/``.

Output is deterministic (sorted entries, fixed zip times and modes, stored
uncompressed so the bytes do not depend on the zlib build), so the same
releases give the same bytes and the same SHA256SUMS.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dsctl.core.fleet import sha256sums, wheel_lock
from dsctl.core.fleet.matrix import row_pins

FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
GENERATOR = "dsctl.lab.wheelhouse"
WHEEL_TAG = "py3-none-any"
SUMS_FILE = "SHA256SUMS"
# Distribution (as the real wheels spell it) -> releases.yaml vllm_ascend_matrix key.
DISTRIBUTIONS = {"torch": "torch", "torch_npu": "torch_npu", "vllm": "vllm", "vllm_ascend": "vllm_ascend",
                 "triton_ascend": "triton_ascend"}
# The import name where it is not the distribution's (Triton-Ascend installs the module triton).
MODULES = {"triton_ascend": "triton"}
# vLLM for Ascend is built from source with VLLM_TARGET_DEVICE=empty and reports "0.13.0+empty" (vllm-ascend's
# installation.md); the stand-ins carry that local version, so the pins' PEP 440 matching is exercised.
LOCAL_LABELS = {"vllm": "empty"}
# The dependency stand-ins: distribution -> (version, Requires-Dist).  Real names and plausible versions; one
# version each, so every row's closure is the same below its own five distributions.
DEPENDENCIES = {
    "filelock": ("3.16.1", ()),
    "typing_extensions": ("4.12.2", ()),
    "sympy": ("1.13.3", ("mpmath<1.4,>=1.1.0",)),
    "mpmath": ("1.3.0", ()),
    "numpy": ("1.26.4", ()),
    "requests": ("2.32.3", ("idna<4,>=2.5",)),
    "idna": ("3.10", ()),
}
# What each stack distribution requires besides the row's own pins (added in _row_requires).
STACK_REQUIRES = {
    "torch": ("filelock", "typing-extensions>=4.10.0", "sympy>=1.13.1"),
    "torch_npu": ("numpy",),
    "vllm": ("numpy", "requests>=2.26.0"),
    "vllm_ascend": (),
    "triton_ascend": (),
}
# The Pythons the lab writes locks for (each row's own python specifier narrows them): the stand-ins are
# py3-none-any, so one lock text serves each; the lab hosts run the machine's /usr/bin/python3.
LOCK_PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
SIMPLE_DIR = "simple"
SUMMARY = "dsctl lab stand-in for {name} {version}: imports and reports its version, nothing else"
VLLM_SUMMARY = "dsctl lab stand-in for vllm {version}: `vllm serve` runs dsctl's emulated engine (no weights, no NPU)"
# The serving stand-in: the distribution that carries the entry point and the vendored engine.
SERVING_DISTRIBUTION = "vllm"
ENTRY_POINTS = "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
ENGINE_ROOT = "dsctl.engine.__main__"
# The dsctl package the vendored files are copied from: the one this module is part of.
DSCTL_DIR = Path(__file__).resolve().parents[1]

@dataclass(frozen=True)
class StandIn:
    name: str  # distribution name, e.g. "torch_npu"
    version: str  # normalized PEP 440 version, e.g. "2.8.0.post2"
    requires: tuple[str, ...] = ()  # Requires-Dist lines, e.g. ("torch==2.8.0", "numpy")

    @property
    def module(self) -> str:
        return MODULES.get(self.name, self.name)

    @property
    def file_name(self) -> str:
        return f"{wheel_name(self.name)}-{self.version}-{WHEEL_TAG}.whl"

    @property
    def dist_info(self) -> str:
        return f"{wheel_name(self.name)}-{self.version}.dist-info"


def normalize_version(text: str) -> str | None:
    """The normalized PEP 440 form of ``text`` ("v0.13.0" -> "0.13.0"), or None if it is no PEP 440 version."""
    try:
        return str(Version(str(text)))
    except InvalidVersion:
        return None


def wheel_name(distribution: str) -> str:
    """The distribution part of a wheel file name (PEP 427 / PEP 503): lower case, runs of -_. as one "_"."""
    return canonicalize_name(distribution).replace("-", "_")


def _lab_rows(releases: dict) -> list[dict]:
    """The matrix rows of a CANN release the lab has whose every version is PEP 440 (pip could pin it).

    A row with a version that is not PEP 440 is skipped whole: a partial row is no installable stack.  None
    of the rows of the lab's CANN releases is like that today."""
    canns = {str(cann["version"]) for cann in releases.get("cann", [])}
    rows = []
    for row in releases.get("vllm_ascend_matrix", []):
        if str(row.get("cann")) not in canns:
            continue
        keys = [key for key in DISTRIBUTIONS.values() if key != "triton_ascend" or row.get(key)]
        if any(normalize_version(row.get(key) or "") is None for key in keys):
            continue
        rows.append(row)
    return rows


def _row_stand_ins(row: dict) -> list[StandIn]:
    """The stack stand-ins of one row, each declaring the row's own pins it depends on."""
    pins = row_pins(row)
    versions = {name: pins[canonicalize_name(name)] for name in DISTRIBUTIONS if canonicalize_name(name) in pins}
    needs = {
        "torch_npu": (f"torch=={versions['torch']}",),
        "vllm_ascend": tuple(f"{canonicalize_name(name)}=={versions[name]}"
                             for name in ("vllm", "torch_npu", "triton_ascend") if name in versions),
    }
    built = []
    for name, version in versions.items():
        local = LOCAL_LABELS.get(name)
        built.append(StandIn(name, f"{version}+{local}" if local else version,
                             tuple(needs.get(name, ())) + STACK_REQUIRES[name]))
    return built


def dependency_stand_ins() -> list[StandIn]:
    return [StandIn(name, version, requires) for name, (version, requires) in sorted(DEPENDENCIES.items())]


def stand_ins(releases: dict) -> list[StandIn]:
    """Every stand-in the wheelhouse carries: each lab row's stack (deduplicated, the first row's wins), sorted,
    with the dependency stand-ins when there is any row."""
    wanted: dict[tuple[str, str], StandIn] = {}
    for row in _lab_rows(releases):
        for stand_in in _row_stand_ins(row):
            wanted.setdefault((stand_in.name, stand_in.version), stand_in)
    if wanted:
        for stand_in in dependency_stand_ins():
            wanted.setdefault((stand_in.name, stand_in.version), stand_in)
    return sorted(wanted.values(), key=lambda s: (s.name, s.version))


def row_closure(row: dict) -> list[StandIn]:
    """The stand-ins pip installs for one row: its stack and every dependency reachable from it."""
    available = {canonicalize_name(s.name): s for s in _row_stand_ins(row) + dependency_stand_ins()}
    pending = [canonicalize_name(s.name) for s in _row_stand_ins(row)]
    seen: dict[str, StandIn] = {}
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen[name] = available[name]
        pending += [canonicalize_name(re.split(r"[<>=!~;\[ ]", need, maxsplit=1)[0]) for need in seen[name].requires]
    return sorted(seen.values(), key=lambda s: s.name)


def lock_files(releases: dict, sums: dict[str, str], arch: str) -> dict[str, str]:
    """File name -> text of every lab lock: one per row and Python its specifier allows, for ``arch``."""
    locks = {}
    for row in _lab_rows(releases):
        pins = row_pins(row)
        entries = wheel_lock.lock_entries({s.file_name: sums[s.file_name] for s in row_closure(row)})
        allowed = SpecifierSet(str(row.get("python") or ""))
        for python in LOCK_PYTHONS:
            if allowed.contains(f"{python}.0"):
                header = [f"dsctl lab: vllm-ascend {pins['vllm-ascend']} on {arch}, Python {python}",
                          "every distribution of the closure with its sha256 (pip install --require-hashes -r)"]
                locks[wheel_lock.lock_name(pins, arch, python)] = wheel_lock.render_lock(entries, header)
    return dict(sorted(locks.items()))


def simple_index(sums: dict[str, str]) -> dict[str, str]:
    """Path (under the wheelhouse) -> HTML of a PEP 503 simple index of the wheels, each link with its sha256."""
    by_project: dict[str, list[str]] = {}
    for file in sorted(sums):
        parsed = wheel_lock.wheel_of(file)
        if parsed is not None:
            by_project.setdefault(parsed[0], []).append(file)
    pages = {}
    root = "".join(f'<a href="{name}/">{name}</a>\n' for name in sorted(by_project))
    pages[f"{SIMPLE_DIR}/index.html"] = f"<!DOCTYPE html>\n<html><body>\n{root}</body></html>\n"
    for name, files in sorted(by_project.items()):
        links = "".join(f'<a href="../../{file}#sha256={sums[file]}">{file}</a>\n' for file in files)
        pages[f"{SIMPLE_DIR}/{name}/index.html"] = f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
    return pages


def build_wheelhouse(out_dir: Path, releases: dict, arch: str = "x86_64") -> list[Path]:
    """Write every stand-in wheel, the locks for ``arch``, the simple index and SHA256SUMS into ``out_dir``;
    return the wheel paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stand_in in stand_ins(releases):
        path = out_dir / stand_in.file_name
        _write_atomically(path, build_wheel(stand_in))
        written.append(path)
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in written}
    locks = lock_files(releases, sums, arch)
    for name, text in locks.items():
        _write_atomically(out_dir / name, text.encode())
        sums[name] = hashlib.sha256(text.encode()).hexdigest()
    for relative, html in simple_index(sums).items():
        (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(out_dir / relative, html.encode())
    _write_atomically(out_dir / SUMS_FILE, sha256sums.render(sums).encode())
    return written


def build_wheel(stand_in: StandIn) -> bytes:
    """The deterministic bytes of one stand-in wheel."""
    name, version = stand_in.name, stand_in.version
    serving = name == SERVING_DISTRIBUTION
    purpose = (
        "version; beyond reporting that version it has `vllm serve` (vllm.entrypoints.cli.main), which runs\n"
        "dsctl's emulated engine (the vendored top-level dsctl package): no weights, no NPU.\n"
        if serving
        else "version; it has no code beyond reporting that version.\n"
    )
    init = (
        f'"""dsctl lab stand-in for {name} {version}, NOT the real package.\n\n'
        "Built by dsctl.lab.wheelhouse so lab hosts can install and import the serving stack at the pinned\n"
        f'{purpose}"""\n\n'
        f'__version__ = "{version}"\n'
    )
    summary = (VLLM_SUMMARY if serving else SUMMARY).format(name=name, version=version)
    requires = "".join(f"Requires-Dist: {need}\n" for need in stand_in.requires)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n{requires}"
    wheel = f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
    files = {f"{stand_in.module}/__init__.py": init.encode()}
    info = {f"{stand_in.dist_info}/METADATA": metadata.encode(), f"{stand_in.dist_info}/WHEEL": wheel.encode()}
    if serving:
        files.update(serving_files())
        info[f"{stand_in.dist_info}/entry_points.txt"] = ENTRY_POINTS.encode()
    return wheel_bytes(stand_in.dist_info, files, info)


def wheel_bytes(dist_info: str, files: dict[str, bytes], info: dict[str, bytes]) -> bytes:
    """A deterministic wheel of ``files`` (path -> bytes) and the ``info`` files of its ``dist_info`` directory
    (METADATA, WHEEL, ...), with the RECORD computed here."""
    # Module files first, then the .dist-info with RECORD last (as PEP 427 recommends), each group sorted.
    members = {**dict(sorted(files.items())), **dict(sorted(info.items()))}
    record_path = f"{dist_info}/RECORD"
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


# =========================================================================== the serving stand-in (vllm)


def serving_files(dsctl_dir: Path = DSCTL_DIR) -> dict[str, bytes]:
    """Wheel path -> bytes of what the vllm stand-in adds: its entry point and the vendored engine."""
    files = {
        "vllm/entrypoints/__init__.py": b'"""dsctl lab stand-in: vllm.entrypoints (only the CLI)."""\n',
        "vllm/entrypoints/cli/__init__.py": b'"""dsctl lab stand-in: vllm.entrypoints.cli (only `vllm serve`)."""\n',
        "vllm/entrypoints/cli/main.py": STAND_IN_VLLM_MAIN.encode(),
    }
    files.update(vendored_dsctl(dsctl_dir))
    return files


def vendored_dsctl(dsctl_dir: Path = DSCTL_DIR) -> dict[str, bytes]:
    """Wheel path (``dsctl/...``) -> bytes of every dsctl file the engine and the entry point need."""
    modules = engine_closure([ENGINE_ROOT], dsctl_dir, extra_sources=(STAND_IN_VLLM_MAIN,))
    files: dict[str, bytes] = {}
    data_names: set[str] = set()
    for module in modules:
        path = _module_file(module, dsctl_dir)
        assert path is not None, module  # engine_closure keeps modules only
        source = path.read_bytes()
        files["dsctl/" + path.relative_to(dsctl_dir).as_posix()] = source
        data_names.update(_DATA_LOAD.findall(source.decode("utf-8")))
    for data_name in sorted(data_names):
        path = dsctl_dir / "data" / f"{data_name}.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"the engine loads data {data_name!r} but {path} does not exist")
        files[f"dsctl/data/{data_name}.yaml"] = path.read_bytes()
    return dict(sorted(files.items()))


# `data.load("profiles")` in a vendored module: ship dsctl/data/profiles.yaml.
_DATA_LOAD = re.compile(r"\bdata\.load\(\s*[\"']([A-Za-z0-9_-]+)[\"']\s*\)")


def engine_closure(roots: list[str], dsctl_dir: Path = DSCTL_DIR, extra_sources: tuple[str, ...] = ()) -> list[str]:
    """Every ``dsctl`` module that importing ``roots`` (and running them) can import, sorted.

    Static: every ``import dsctl...`` / ``from dsctl... import x`` / relative import anywhere in a module's
    source (function bodies included, since the engine imports lazily; ``if TYPE_CHECKING:`` blocks
    excluded), followed transitively, plus every package above each module (importing a module runs its
    packages' ``__init__``).  ``from pkg import name`` counts ``pkg.name`` when that is a module, else only
    ``pkg``.  ``extra_sources`` are more importing code (the stand-in's entry point).  Non-dsctl imports
    are left out: the vendored engine must need the standard library only, which the wheelhouse tests check
    by serving from a venv holding nothing else.
    """
    pending = [name for root in roots for name in _with_parents(root)]
    for source in extra_sources:
        pending += _dsctl_imports(ast.parse(source), "", dsctl_dir)
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        path = _module_file(module, dsctl_dir)
        if path is None:
            raise ModuleNotFoundError(f"the engine imports {module} but {dsctl_dir} has no such module")
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        pending += _dsctl_imports(ast.parse(path.read_bytes(), filename=str(path)), package, dsctl_dir)
    return sorted(seen)


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: n + 1]) for n in range(len(parts))]


def _module_file(module: str, dsctl_dir: Path) -> Path | None:
    """The file of dsctl module ``module`` under ``dsctl_dir``, or None when there is none."""
    parts = module.split(".")
    if parts[0] != "dsctl":
        return None
    base = dsctl_dir.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if len(parts) > 1 and base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _dsctl_imports(tree: ast.AST, package: str, dsctl_dir: Path) -> list[str]:
    """The dsctl modules (with their parent packages) that the statements of ``tree`` import."""
    found: list[str] = []

    def add(module: str) -> None:
        if module == "dsctl" or module.startswith("dsctl."):
            found.extend(_with_parents(module))

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.orelse:
                    visit_one(statement)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: max(len(package.split(".")) - (node.level - 1), 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            add(base)
            for alias in node.names:
                if base.startswith("dsctl") and _module_file(f"{base}.{alias.name}", dsctl_dir) is not None:
                    add(f"{base}.{alias.name}")
        visit(node)

    visit(tree)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    temp.chmod(0o644)
    os.replace(temp, path)


# `vllm/entrypoints/cli/main.py` of the vllm stand-ins (the same for every version).  It runs in the serving
# venv, next to the vendored dsctl, so it may import dsctl.engine and the standard library only.
STAND_IN_VLLM_MAIN = '''"""``vllm`` in dsctl's lab: ``vllm serve MODEL [flags]`` runs dsctl's emulated engine.

NOT the real vLLM: a lab stand-in built by dsctl.lab.wheelhouse.  The wheel vendors the part of dsctl the
engine needs (the top-level ``dsctl`` package, standard library only) and this entry point hands the command
line of a real host to ``dsctl.engine.__main__.main(["serve", ...])``, changed as follows:

* MODEL (positional, or ``--model``) may be a checkpoint path or a Hugging Face id, e.g.
  /models/DeepSeek-R1-Distill-Qwen-7B or deepseek-ai/DeepSeek-R1: the whole string, then its last path
  component, lower-cased (then with "_" read as "-"), is matched against the model names and aliases of
  the engine's profiles (dsctl/data/profiles.yaml, or ``--profile-json``); the engine serves the profile
  matched.  Without a match MODEL goes on as given and the engine names the profiles it knows.
* ``--served-model-name`` defaults to MODEL as given, as vLLM's does.
* vLLM's multi-node data-parallel flags (--data-parallel-size-local/-dpl, --data-parallel-start-rank/-dpr,
  --data-parallel-address/-dpa, --data-parallel-rpc-port/-dpp, --headless, --api-server-count/-asc) are the
  engine's own: a head and its --headless workers form one instance over real sockets (dsctl.engine.cluster).
* ``--flag_name`` is read as ``--flag-name``, as vLLM reads it.  vLLM flags the engine does not model
  (``VLLM_ONLY_FLAGS``, e.g. --compilation-config, --kv-cache-dtype) are dropped with a warning on stderr,
  with the value that follows them.  Any other flag -- a typo, or a knob of another engine such as the
  fixed-batch engine's --stream-num, --batch-size, --kv-sparse-threshold -- is refused as real vLLM's
  argparse refuses it: "vllm: error: unrecognized arguments: --stream-num 4" (vLLM 0.32's words: the top-level
  parser reports it, after its usage line), exit 2, before
  anything starts.  The emulation's own controls (``EMULATION_FLAGS``: --chip, --time-scale, --startup,
  --jitter, --record, --profile-json) pass, for the lab's harness; sites set them through
  DSCTL_ENGINE_TIME_SCALE / DSCTL_ENGINE_STARTUP instead.
* Start-up time: without ``--startup``, ``--startup $DSCTL_ENGINE_STARTUP`` (modelled seconds, default 2;
  "model" leaves it to the engine, which models loading every weight byte plus ~60 s of init, i.e. over a
  minute at time scale 1); without ``--time-scale``, ``--time-scale $DSCTL_ENGINE_TIME_SCALE`` when that
  is set (else the engine's 1: modelled seconds are wall seconds).

``vllm --version`` (or ``-v``) prints the stand-in's version; other subcommands are refused (exit 2).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

DEFAULT_STARTUP = "2"
MODELLED_STARTUP = ("model", "modelled", "modeled", "auto")
USAGE = "usage: vllm [-h] [-v] {serve} ...  (dsctl lab stand-in: only `vllm serve MODEL [flags]`)"
_NUMBER = re.compile(r"-[0-9.]")
# `vllm serve` flags (vLLM's engine and frontend arguments, docs.vllm.ai engine_args / serve --help) that the
# emulated engine does not model: accepted and dropped, with their value.
VLLM_ONLY_FLAGS = frozenset("""
--compilation-config --speculative-config --kv-cache-dtype --load-format --download-dir --tokenizer
--tokenizer-mode --revision --code-revision --tokenizer-revision --pipeline-parallel-size -pp
--distributed-executor-backend --cpu-offload-gb --num-gpu-blocks-override --max-logprobs
--disable-custom-all-reduce --enable-lora --max-loras --max-lora-rank
--scheduling-policy --long-prefill-token-threshold
--generation-config --override-generation-config --chat-template --response-role
--enable-auto-tool-choice --tool-call-parser --reasoning-parser --uvicorn-log-level --root-path
--allowed-origins --allowed-methods --allowed-headers --ssl-keyfile --ssl-certfile --max-log-len
--enable-log-requests --no-enable-log-requests --async-scheduling --no-async-scheduling --hf-overrides
--enable-sleep-mode --kv-transfer-config --limit-mm-per-prompt --mm-processor-kwargs
--structured-outputs-config --prefix-caching-hash-algo
""".split())
# Every flag the stand-in accepts is one real vLLM 0.32's parser accepts (tests/realvllm/test_vllm_parser.py holds
# the two sets against each other): flags older vLLM releases had and 0.32 no longer has (--swap-space,
# --num-scheduler-steps, --max-seq-len-to-capture, --guided-decoding-backend, --max-num-partial-prefills,
# --max-long-partial-prefills, --disable-log-requests) are refused, so the lab is never more forgiving than vLLM.
# The emulation's own controls (the lab's harness; not vLLM flags).
EMULATION_FLAGS = frozenset(["--chip", "--time-scale", "--startup", "--jitter", "--record", "--profile-json"])


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-v"]):
        from vllm import __version__

        print(__version__)
        return 0
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not args or args[0] != "serve":
        print(USAGE, file=sys.stderr)
        print(f"vllm: error: {args[0]!r} is not a command of the lab stand-in" if args else
              "vllm: error: a command is required", file=sys.stderr)
        return 2
    from dsctl.engine import __main__ as engine

    if "-h" in args[1:] or "--help" in args[1:]:
        return engine.main(["serve", "--help"])
    parser = engine.build_parser()
    unknown = unrecognized(args[1:], parser)
    if unknown:
        print(USAGE, file=sys.stderr)
        print("vllm: error: unrecognized arguments: " + " ".join(unknown), file=sys.stderr, flush=True)
        return 2
    engine_args, dropped = engine_argv(args[1:], parser, load_models, os.environ)
    if dropped:
        print("WARNING [vllm stand-in] ignoring vLLM arguments the emulated engine does not model: "
              + " ".join(dropped), file=sys.stderr, flush=True)
    return engine.main(["serve", *engine_args])


def engine_argv(args: list[str], parser: argparse.ArgumentParser, models: Any,
                environ: Any) -> tuple[list[str], list[str]]:
    """The engine's ``serve`` arguments for ``vllm serve`` ``args``, and the arguments dropped.

    ``models(profile_json)`` gives the profiles' models table (name -> spec with ``aliases``).
    """
    known = serve_options(parser)
    tokens = list(args)
    model = tokens.pop(0) if tokens and not _is_flag(tokens[0]) else None
    rest: list[str] = []
    dropped: list[str] = []
    given: set[str] = set()
    profile_json = None
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not _is_flag(token):
            rest.append(token)
            continue
        name, equals, value = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        action = known.get(name)
        takes_value = bool(equals) or (index < len(tokens) and not _is_flag(tokens[index]))
        if action is None:
            dropped.append(token)
            if not equals and takes_value:
                dropped.append(tokens[index])
                index += 1
            continue
        given.add(action.dest)
        if action.dest in ("model", "profile_json") and not equals and takes_value:
            value = tokens[index]
            index += 1
        if action.dest == "model" and (model is None or value == model):
            model = value
            continue
        if action.dest == "profile_json":
            profile_json = value
        rest.append(name + equals + value if equals else name)
        if action.dest in ("model", "profile_json") and not equals:
            rest.append(value)
    head: list[str] = []
    if model is not None:
        profile = match_profile(model, models(profile_json))
        head.append(profile if profile is not None else model)
        if "served_model_name" not in given:
            rest += ["--served-model-name", model]
    time_scale = environ.get("DSCTL_ENGINE_TIME_SCALE", "").strip()
    if "time_scale" not in given and time_scale:
        rest += ["--time-scale", time_scale]
    startup = environ.get("DSCTL_ENGINE_STARTUP", "").strip() or DEFAULT_STARTUP
    if "startup" not in given and startup.lower() not in MODELLED_STARTUP:
        rest += ["--startup", startup]
    return head + rest, dropped


def unrecognized(args: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The arguments real ``vllm serve`` would not recognise, as argparse lists them (a flag and its value)."""
    known = serve_options(parser)
    vllm_knows = (set(known) - ENGINE_ONLY_FLAGS) | VLLM_ONLY_FLAGS | EMULATION_FLAGS
    unknown: list[str] = []
    tokens = list(args)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not _is_flag(token):
            continue
        name, equals, _ = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if name in vllm_knows:
            continue
        unknown.append(token)
        if not equals and index < len(tokens) and not _is_flag(tokens[index]):
            unknown.append(tokens[index])
            index += 1
    return unknown


# Knobs of the fixed-batch engine (dsctl engine serve) that vLLM has no flag for.
FIXED_BATCH_FLAGS = frozenset(["--stream-num", "--batch-size", "--kv-sparse-threshold"])
# The engine's flags real vLLM 0.32 has no longer or never had: the fixed-batch knobs, and one kept for old scripts.
ENGINE_ONLY_FLAGS = FIXED_BATCH_FLAGS | {"--disable-log-requests"}


def serve_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Option string -> action of the engine parser's ``serve`` command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices["serve"]._option_string_actions)
    raise RuntimeError("the engine's parser has no serve command")


def match_profile(model: str, models: dict[str, Any]) -> str | None:
    """The profile name ``model`` (a path, a Hugging Face id or a profile name) stands for, or None."""
    text = model.strip()
    candidates: list[str] = []
    for form in (text, os.path.basename(text.rstrip("/"))):
        for candidate in (form.lower(), form.lower().replace("_", "-")):
            if candidate and candidate not in candidates:
                candidates.append(candidate)
    for candidate in candidates:
        for name, spec in models.items():
            aliases = spec.get("aliases") or () if isinstance(spec, dict) else ()
            if candidate == str(name).lower() or candidate in (str(alias).lower() for alias in aliases):
                return str(name)
    return None


def load_models(profile_json: str | None) -> dict[str, Any]:
    """The models table of the engine's profiles; empty when it cannot be read (the engine then says why)."""
    try:
        if profile_json:
            import json

            with open(profile_json, encoding="utf-8") as handle:
                return dict(json.load(handle).get("models") or {})
        from dsctl.engine import profiles

        profiles.import_perfmodel(None)  # registers the engine's YAML reader when PyYAML is absent
        from dsctl import data

        return dict(data.load("profiles").get("models") or {})
    except Exception:  # the engine reports unreadable profiles itself
        return {}


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


if __name__ == "__main__":
    sys.exit(main())
'''
