"""The software stack a host should run, resolved from the inventory and the releases data (pure types).

`dsctl.core.fleet.matrix.resolve_stack` builds a `DesiredStack`; the provisioning roles read it (through the
`dsctl_desired_stack` filter) and `dsctl check` compares a host's `HostState` with it.
Installer file names keep ``{arch}`` as a placeholder: the role fills in the host's own architecture
(`uname -m`), as vllm-ascend's install guide does with ``$(uname -i)``.
"""

from __future__ import annotations

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
