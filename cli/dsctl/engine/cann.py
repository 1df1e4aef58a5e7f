"""Which CANN toolkit the engine runs on, resolved from its environment as a real serving process does.

A real vLLM / MindIE process finds CANN through the variables the toolkit's ``set_env.sh`` exports
(``ASCEND_TOOLKIT_HOME``, and ``ASCEND_HOME_PATH`` pointing at the same place; the lab's emulated installer
writes the same script, cli/dsctl/emu/install_cann.py ``TOOLKIT_SET_ENV``).  The engine does the same and
reads the toolkit's own record, so what it reports is what it would really load:

1. ``ASCEND_TOOLKIT_HOME``, else ``ASCEND_HOME_PATH``; neither set means ``set_env.sh`` was not sourced
   (the engine logs a warning and reports ``null``);
2. its real path (``latest/`` is a directory of links into ``../<version>/``; a variable may also name
   the version directory itself, as ``conf/path.cfg`` does);
3. ``<home>/<arch>-linux/ascend_toolkit_install.info``, the file vllm-ascend's ``collect_env.py`` reads
   (ascend-interfaces.md s.4.4): its ``version=``; the toolkit path is the real directory the record
   sits in, one level up (``.../ascend-toolkit/8.3.RC2``);
4. failing that, ``<home>/version.cfg``'s ``toolkit_running_version`` (s.4.4).

A toolkit of a lab-only regressed release (releases.yaml ``lab_regression``) holds
``dsctl-lab-regression.json``; its ``slowdown`` makes the engine serve that many times slower (the upgrade's probe
gate must catch it).  Real toolkits have no such file.

Standard library only (plus dsctl.core.hostfacts.versionfiles, itself standard library only).
"""

from __future__ import annotations

import glob
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass

from dsctl.core.hostfacts import versionfiles as vf

HOME_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
INSTALL_INFO = "ascend_toolkit_install.info"


@dataclass(frozen=True)
class Cann:
    """The CANN the engine found: ``version`` None when it found none, ``problem`` saying why."""

    version: str | None
    toolkit: str | None
    variable: str | None
    problem: str | None = None
    slowdown: float = 1.0  # > 1 on a lab-only regressed release

    def log_line(self) -> str:
        if self.version is None:
            return f"CANN toolkit not found: {self.problem}; reporting cann: null"
        slower = f"; lab regression: serving {self.slowdown:g}x slower" if self.slowdown != 1.0 else ""
        return f"CANN version: {self.version} (toolkit at {self.toolkit}){slower}"


def _slowdown(toolkit: str) -> float:
    text = _read(os.path.join(toolkit, vf.LAB_REGRESSION_FILE))
    if text is None:
        return 1.0
    try:
        value = float(json.loads(text).get("slowdown", 1.0))
    except (ValueError, TypeError, AttributeError):
        return 1.0
    return value if value >= 1.0 else 1.0


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _install_info(home: str) -> str | None:
    arch = platform.machine()
    preferred = os.path.join(home, f"{arch}-linux", INSTALL_INFO)
    if os.path.isfile(preferred):
        return preferred
    found = sorted(glob.glob(os.path.join(glob.escape(home), "*-linux", INSTALL_INFO)))
    return found[0] if found else None


def resolve(environ: Mapping[str, str]) -> Cann:
    """The CANN toolkit ``environ`` (the process's environment) points at."""
    variable = next((name for name in HOME_VARIABLES if environ.get(name, "").strip()), None)
    if variable is None:
        return Cann(None, None, None, "ASCEND_TOOLKIT_HOME and ASCEND_HOME_PATH are unset (source the toolkit's "
                                      "set_env.sh, e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh, before starting)")
    home = os.path.realpath(environ[variable].strip())
    if not os.path.isdir(home):
        return Cann(None, None, variable, f"{variable}={environ[variable].strip()} is not a directory")
    info_path = _install_info(home)
    if info_path is not None:
        fields = vf.parse_key_value(_read(info_path) or "")
        version = vf.unquote(fields.get("version", "")).strip()
        if version:
            toolkit = os.path.dirname(os.path.dirname(os.path.realpath(info_path)))
            return Cann(version, toolkit, variable, slowdown=_slowdown(toolkit))
    cfg_text = _read(os.path.join(home, "version.cfg"))
    running = vf.version_cfg_running(vf.parse_version_cfg(cfg_text)) if cfg_text else None
    if running is not None:
        return Cann(running[1], home, variable, slowdown=_slowdown(home))
    return Cann(None, None, variable, f"{variable}={environ[variable].strip()} holds neither "
                                      f"<arch>-linux/{INSTALL_INFO} nor version.cfg")


RUNTIME_LIBRARY = os.path.join("runtime", "lib64", "libascendcl.so")
_LOADED: list = []  # the mappings, kept for the process's life as a loaded library is


def load_runtime(found: Cann) -> str | None:
    """Map the toolkit's ``libascendcl.so`` read-only, as torch_npu's dlopen of it does in a real serving process:
    the mapping is what ``/proc/PID/maps`` shows under the version directory the process started on, and so what
    `dsctl check` reads to tell which CANN a running instance really uses after ``latest/`` was switched under it.
    Returns the mapped path, or None (no toolkit, no library, an empty file)."""
    import mmap

    if not found.toolkit:
        return None
    path = os.path.join(found.toolkit, RUNTIME_LIBRARY)
    try:
        with open(path, "rb") as handle:
            _LOADED.append(mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ))
    except (OSError, ValueError):
        return None
    return path
