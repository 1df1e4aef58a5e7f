"""`dsctl lab`: a local lab of simulated Atlas 800T A2 hosts (Linux + root only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsctl import ui
from dsctl.cli_options import bounded
from dsctl.errors import ExitStatus
from dsctl.services import lab as lab_verb
from dsctl.services.lab import DEFAULT_SUBNET, FaultKind

app = typer.Typer(help="Simulated Ascend hosts on this machine: namespaces with sshd, emulated NPUs and packages.",
                  no_args_is_help=True)

RootOption = Annotated[
    Path | None, typer.Option("--root", envvar="DSCTL_LAB_ROOT",
                              help="Lab state directory (keys, inventory, disks); default /run/dsctl/<name>.")
]
NameOption = Annotated[
    str | None, typer.Option("--name", envvar="DSCTL_LAB_NAME",
                             help="Which lab: several can run side by side, each with its own bridge, subnet and "
                                  "state directory (default: lab).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON result object.")]


@app.command()
def up(
    hosts: Annotated[int, typer.Option("--hosts", help="Number of lab hosts.",
                                       callback=bounded(lab_verb.LAB_HOSTS))] = 2,
    npus: Annotated[int, typer.Option("--npus", help="NPUs per host.",
                                      callback=bounded(lab_verb.NPUS))] = 8,
    chip: Annotated[str, typer.Option("--chip", help="Emulated board: 910B3, 910B4, 910B2C or 910.")] = "910B3",
    driver: Annotated[str | None, typer.Option("--driver", help="Preinstall this NPU driver (HDK) version.")] = None,
    firmware: Annotated[
        str | None, typer.Option("--firmware", help="Preinstall this NPU firmware version (needs --driver).")
    ] = None,
    cann: Annotated[str | None, typer.Option("--cann", help="Preinstall this CANN version, or 'none'.")] = None,
    subnet: Annotated[str | None, typer.Option(
        "--subnet", help=f"Lab network (IPv4; default {DEFAULT_SUBNET} for the lab named lab, else the first free "
                         "10.78.K.0/24).")] = None,
    disk_gb: Annotated[int, typer.Option("--disk-gb", help="Disk size each host reports.",
                                         callback=bounded(lab_verb.DISK_GB))] = 64,
    name: NameOption = None,
    root: RootOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create lab hosts (bare OS unless --driver/--firmware/--cann) and write their Ansible inventory."""
    result = lab_verb.lab_up(
        root, hosts_count=hosts, npus=npus, chip=chip, subnet=subnet, disk_gb=disk_gb, driver=driver,
        firmware=firmware, cann=cann, progress=ui.progress, name=name,
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
def down(name: NameOption = None, root: RootOption = None, as_json: JsonOption = False) -> None:
    """Remove every lab host: processes, mounts, namespaces, the bridge, the NPU plane and the state directory (of
    this lab only)."""
    removed = lab_verb.lab_down(root, name)
    if as_json:
        ui.emit_json(["lab", "down"], removed)
        return
    ui.stderr_console().print(
        f"lab down: {removed['namespaces']} hosts, {removed['processes']} processes, {removed['mounts']} mounts removed"
    )


@app.command()
def status(name: NameOption = None, root: RootOption = None, as_json: JsonOption = False) -> None:
    """Each host's power, network and NPUs as `npu-smi` reports them over SSH."""
    spec, statuses = lab_verb.lab_status(root, name=name)
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
    npu: Annotated[int | None, typer.Option(
        "--npu", help="NPU id, for chip-unhealthy / chip-healthy, link-down / link-up and hccn-conf-wrong.",
        callback=bounded(lab_verb.NPU_ID))] = None,
    health: Annotated[str, typer.Option("--health", help="Health to report: Warning, Alarm or Critical.")] = "Critical",
    component: Annotated[
        str,
        typer.Option(
            "--component", help="install-fail: any, driver, firmware, toolkit, kernels or nnal; uninstall: driver or "
            "firmware."
        ),
    ] = "any",
    name: NameOption = None,
    root: RootOption = None,
) -> None:
    """Inject a fault that roles can only see through the host itself (npu-smi, hccn_tool, exit codes, df, SSH)."""
    typer.echo(lab_verb.lab_fault(root, host, kind, name=name, npu=npu, health=health, component=component))


@app.command()
def packages(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the .run packages and SHA256SUMS to.")],
    as_json: JsonOption = False,
) -> None:
    """Write the lab's emulated Huawei installer packages (.run) and their sha256 manifest."""
    written = lab_verb.lab_packages(out)
    if as_json:
        ui.emit_json(["lab", "packages"], {"out": str(out), "files": [p.name for p in written]})
        return
    for path in written:
        typer.echo(str(path))


snapshot_app = typer.Typer(
    help="Save the lab hosts' disks and bring them back: try an upgrade or a tune, then go back.", no_args_is_help=True
)
app.add_typer(snapshot_app, name="snapshot")
SnapshotName = Annotated[str, typer.Argument(help="Snapshot name (letters, digits, '.', '_', '-').")]


def _render_snapshot(verb: str, info, as_json: bool) -> None:
    if as_json:
        ui.emit_json(["lab", "snapshot", verb], None if info is None else vars(info))
    elif info is not None:
        ui.stderr_console().print(f"snapshot {info.name} {verb}d: {len(info.hosts)} hosts, "
                                  f"{info.size_bytes / 2**20:.1f} MiB")


@snapshot_app.command("save")
def snapshot_save(
    snapshot: SnapshotName,
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite a snapshot of that name.")] = False,
    name: NameOption = None, root: RootOption = None, as_json: JsonOption = False,
) -> None:
    """Save every host's disk (installed HDK, CANN, venvs, services' files) and boards; processes keep running."""
    _render_snapshot("save", lab_verb.lab_snapshot(root, name, "save", snapshot, replace=replace,
                                                  progress=ui.progress), as_json)


@snapshot_app.command("restore")
def snapshot_restore(snapshot: SnapshotName, name: NameOption = None, root: RootOption = None,
                     as_json: JsonOption = False) -> None:
    """Bring every host back to the snapshot: powered off, its saved files put back, booted (as after a reboot)."""
    _render_snapshot("restore", lab_verb.lab_snapshot(root, name, "restore", snapshot, progress=ui.progress), as_json)


@snapshot_app.command("delete")
def snapshot_delete(snapshot: SnapshotName, name: NameOption = None, root: RootOption = None,
                    as_json: JsonOption = False) -> None:
    """Delete a snapshot."""
    lab_verb.lab_snapshot(root, name, "delete", snapshot)
    if as_json:
        ui.emit_json(["lab", "snapshot", "delete"], {"deleted": snapshot})
    else:
        ui.stderr_console().print(f"snapshot {snapshot} deleted")


@snapshot_app.command("list")
def snapshot_list(name: NameOption = None, root: RootOption = None, as_json: JsonOption = False) -> None:
    """The lab's snapshots: when saved, hosts, size and the driver and CANN each host's disk holds."""
    import time

    infos = lab_verb.lab_snapshot(root, name, "list")
    if as_json:
        ui.emit_json(["lab", "snapshot", "list"], [vars(info) for info in infos])
        return
    rows = []
    for info in infos:
        stacks = sorted({f"{s.get('driver', '-')} / {s.get('cann', '-')}" for s in info.stacks.values()})
        rows.append([info.name, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.created)),
                     len(info.hosts), f"{info.size_bytes / 2**20:.1f}", ", ".join(stacks) or "-"])
    ui.print_table("lab snapshots", ["name", "saved", "hosts", "MiB", "driver / CANN"], rows)
