"""The software stack a host should run, resolved from the inventory and the releases data (pure types).

`dsctl.core.fleet.matrix.resolve_stack` builds a `DesiredStack`; the provisioning roles read it (through the
`dsctl_desired_stack` filter) and `dsctl check` compares a host's `HostState` with it.
Installer file names keep ``{arch}`` as a placeholder: the role fills in the host's own architecture
(`uname -m`), as vllm-ascend's install guide does with ``$(uname -i)``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DesiredStack:
    driver: str                 # "25.5.0"
    firmware: str               # "7.8.0.5.216"
    cann: str                   # "8.5.0"
    kernels_package: str        # "kernels-910b" (up to 8.3.RC2) or "910b-ops" (from 8.5)
    vllm_ascend: str | None     # "v0.13.0" (tag as the matrix spells it); None = no serving stack
    vllm: str | None            # "v0.13.0"
    torch: str | None           # "2.8.0"
    torch_npu: str | None       # "2.8.0.post2"
    python: str | None          # ">=3.10,<3.12" (specifier from the matrix row)
    driver_run: str             # "Ascend-hdk-910b-npu-driver_25.5.0_linux-{arch}.run"
    firmware_run: str           # "Ascend-hdk-910b-npu-firmware_7.8.0.5.216.run"
    toolkit_run: str            # "Ascend-cann-toolkit_8.5.0_linux-{arch}.run"
    kernels_run: str            # "Ascend-cann-910b-ops_8.5.0_linux-{arch}.run"
    nnal_run: str               # "Ascend-cann-nnal_8.5.0_linux-{arch}.run"
    # Python distributions to pin in the serving venv: {"torch": "2.8.0", "torch-npu": "2.8.0.post2",
    # "vllm": "0.13.0", "vllm-ascend": "0.13.0"} (PEP 503 names, versions without the leading "v").
    pip_pins: dict[str, str] = field(default_factory=dict)
    # How the pairing is known, for reports: "official", "observed" or "inferred", with the sources.
    confidence: str = "inferred"
    sources: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()   # accepted but worth saying (e.g. driver-side train list does not name the CANN)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DesiredStack:
        values = dict(data)
        values["sources"] = tuple(values.get("sources", ()))
        values["warnings"] = tuple(values.get("warnings", ()))
        return cls(**values)


def serving_venv_name(pins: Mapping[str, str]) -> str:
    """Directory name of the serving venv that holds exactly ``pins``: ``vllm-ascend-0.13.0-1a2b3c4d``.

    Provisioning keeps one venv per pin set side by side and points the configured serving venv (a symlink)
    at the active stack's, so switching CANN back and forth never reinstalls a venv that was built before.
    The digest covers every pin (a changed torch-npu makes a new venv); the prefix names the release for
    people listing the directory.
    """
    normalized = {re.sub(r"[-_.]+", "-", str(name)).lower(): str(version) for name, version in pins.items()}
    digest = hashlib.sha256(json.dumps(normalized, sort_keys=True).encode()).hexdigest()[:8]
    release = normalized.get("vllm-ascend")
    return f"vllm-ascend-{release}-{digest}" if release else f"stack-{digest}"
