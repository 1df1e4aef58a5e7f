"""`dsctl lab`: a local lab of simulated Atlas 800T A2 hosts (Linux + root only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsctl import ui
from dsctl.core.lab.plan import DEFAULT_SUBNET
from dsctl.errors import DsctlError, ExitStatus
from dsctl.lab import service
from dsctl.lab.faults import FaultKind
from dsctl.lab.hosts import DEFAULT_ROOT

app = typer.Typer(help="Simulated Ascend hosts on this machine: namespaces with sshd, emulated NPUs and packages.",
                  no_args_is_help=True)

RootOption = Annotated[
    Path, typer.Option("--root", envvar="DSCTL_LAB_ROOT", help="Lab state directory (keys, inventory, disks).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON result object.")]


@app.command()
def up(
    hosts: Annotated[int, typer.Option("--hosts", help="Number of lab hosts.")] = 2,
    npus: Annotated[int, typer.Option("--npus", help="NPUs per host.")] = 8,
    chip: Annotated[str, typer.Option("--chip", help="Emulated board: 910B3, 910B4, 910B2C or 910.")] = "910B3",
    driver: Annotated[str | None, typer.Option("--driver", help="Preinstall this NPU driver (HDK) version.")] = None,
    firmware: Annotated[
        str | None, typer.Option("--firmware", help="Preinstall this NPU firmware version (needs --driver).")
    ] = None,
    cann: Annotated[str | None, typer.Option("--cann", help="Preinstall this CANN version, or 'none'.")] = None,
    subnet: Annotated[str, typer.Option("--subnet", help="Lab network (IPv4).")] = DEFAULT_SUBNET,
    disk_gb: Annotated[int, typer.Option("--disk-gb", help="Disk size each host reports.")] = 64,
    root: RootOption = DEFAULT_ROOT,
    as_json: JsonOption = False,
) -> None:
    """Create lab hosts (bare OS unless --driver/--firmware/--cann) and write their Ansible inventory."""
    result = service.lab_up(
        root, hosts_count=hosts, npus=npus, chip=chip, subnet=subnet, disk_gb=disk_gb, driver=driver,
        firmware=firmware, cann=cann, progress=ui.progress,
    )
    spec = result.spec
    hosts_data = [{"name": h.name, "address": h.address} for h in spec.members]
    if as_json:
        ui.emit_json(["lab", "up"], {"inventory": str(result.inventory), "created": result.created,
                                     "hosts": hosts_data, "spec": spec.to_dict()})
        return
    verb = "is up" if result.created else "was already up"
    ui.stderr_console().print(
        f"lab {verb}: {spec.hosts} x {spec.npus} {spec.chip}, driver {spec.driver or '-'}, "
        f"firmware {spec.firmware or '-'}, CANN {spec.cann or '-'}"
    )
    typer.echo(str(result.inventory))


@app.command()
def down(root: RootOption = DEFAULT_ROOT, as_json: JsonOption = False) -> None:
    """Remove every lab host: processes, mounts, namespaces, the bridge and the state directory."""
    removed = service.lab_down(root)
    if as_json:
        ui.emit_json(["lab", "down"], removed)
        return
    ui.stderr_console().print(
        f"lab down: {removed['namespaces']} hosts, {removed['processes']} processes, {removed['mounts']} mounts removed"
    )


@app.command()
def status(root: RootOption = DEFAULT_ROOT, as_json: JsonOption = False) -> None:
    """Each host's power, network and NPUs as `npu-smi` reports them over SSH."""
    spec, statuses = service.lab_status(root)
    unreachable = [s.name for s in statuses if s.error]
    code = ExitStatus.HOSTS_UNREACHABLE if unreachable else ExitStatus.OK
    if as_json:
        ui.emit_json(["lab", "status"], [vars(s) for s in statuses], exit_code=int(code),
                     errors=[f"{s.name}: {s.error}" for s in statuses if s.error])
    else:
        rows = [
            [s.name, s.address, s.power, s.network, s.boots,
             s.npu.get("driver", "-"), s.npu.get("firmware", "-"), s.npu.get("npus", "-"),
             s.npu.get("health", "-"), s.npu.get("hbm", "-"), s.error or s.npu.get("note", "")]
            for s in statuses
        ]
        ui.print_table(
            f"lab: {spec.hosts} x {spec.npus} {spec.chip}",
            ["host", "address", "power", "net", "boots", "driver", "firmware", "NPUs", "health", "HBM used MB",
             "note"],
            rows,
        )
    if code:
        raise typer.Exit(int(code))


@app.command()
def fault(
    host: Annotated[str, typer.Argument(help="Lab host name, e.g. lab-01.")],
    kind: Annotated[FaultKind, typer.Argument(help="What to break (or mend).", case_sensitive=False)],
    npu: Annotated[int | None, typer.Option("--npu", help="NPU id, for chip-unhealthy / chip-healthy.")] = None,
    health: Annotated[str, typer.Option("--health", help="Health to report: Warning, Alarm or Critical.")] = "Critical",
    component: Annotated[
        str,
        typer.Option(
            "--component", help="install-fail: any, driver, firmware, toolkit, kernels or nnal; uninstall: driver or "
            "firmware."
        ),
    ] = "any",
    root: RootOption = DEFAULT_ROOT,
) -> None:
    """Inject a fault that roles can only see through the host itself (npu-smi, exit codes, df, SSH)."""
    typer.echo(service.lab_fault(root, host, kind, npu=npu, health=health, component=component))


@app.command()
def packages(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the .run packages and SHA256SUMS to.")],
    as_json: JsonOption = False,
) -> None:
    """Write the lab's emulated Huawei installer packages (.run) and their sha256 manifest."""
    from dsctl.adapters import output_paths
    from dsctl.lab.packages import build_packages

    output_paths.check_dir("--out", out)  # before the packages are built
    try:
        written = build_packages(out)
    except OSError as exc:
        raise DsctlError(f"--out {out}: {exc.strerror}; choose a writable directory") from exc
    if as_json:
        ui.emit_json(["lab", "packages"], {"out": str(out), "files": [p.name for p in written]})
        return
    for path in written:
        typer.echo(str(path))
