"""`dsctl wheelhouse build`: the serving stack's wheels and hash locks from an index or mirror you name."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Annotated

import typer

from dsctl import ui
from dsctl.cli_options import AskVaultOption, JsonOption, VaultFileOption, bounded
from dsctl.errors import UsageError
from dsctl.services.inputs import SECONDS, vault_options
from dsctl.services.wheelhouse import DEFAULT_TIMEOUT, WheelhouseRequest, build, pin_sets

app = typer.Typer(help="Serving-stack wheelhouses: every wheel of a matrix row's closure, with hash locks.",
                  no_args_is_help=True)
COLUMNS = ["lock", "arch", "python", "distributions"]


def _out_dir(text: str) -> Path:
    """--out as a path: an empty one (an unset shell variable) would be the current directory."""
    if not text.strip():
        raise UsageError("--out: empty; name the wheelhouse directory to write, e.g. --out ./wheelhouse")
    return Path(text)


@app.command("build")
def build_cmd(
    inventory: Annotated[Path | None, typer.Argument(help="Ansible inventory: lock the row of every host's stack.")]
    = None,
    out: Annotated[str, typer.Option("--out", help="The wheelhouse directory to write (wheels, locks, SHA256SUMS).")]
    = ...,
    release: Annotated[str | None, typer.Option("--release", help="One vllm-ascend tag (v0.13.0) instead of an "
                                                "inventory.")] = None,
    index_url: Annotated[str | None, typer.Option("--index-url", help="A PyPI-style index or mirror (PEP 503).")]
    = None,
    find_links: Annotated[list[str] | None, typer.Option("--find-links", help="A directory or page of wheels "
                                                         "(repeatable); alone it means --no-index.")] = None,
    arch: Annotated[list[str] | None, typer.Option("--arch", help="aarch64 or x86_64 (repeatable); default: this "
                                                   "machine's.")] = None,
    python: Annotated[list[str] | None, typer.Option("--python", help="The servers' major.minor Python "
                                                     "(repeatable); default 3.11.")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds each pip resolve may take.",
        callback=bounded(SECONDS))] = DEFAULT_TIMEOUT,
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    as_json: JsonOption = False,
) -> None:
    """Resolve the pins with pip's resolver, download every wheel of the closure into --out, write one hash
    lock per row, arch and Python (lock-vllm-ascend-<ver>-<digest>-<arch>-py<X.Y>.txt) and SHA256SUMS."""
    vault = vault_options(vault_password_file, ask_vault_pass)
    out_dir = _out_dir(out)
    stacks = pin_sets(inventory, release, vault)
    request = WheelhouseRequest(
        stacks=tuple(pins for pins, _ in stacks), arches=tuple(arch or [platform.machine()]),
        pythons=tuple(python or ["3.11"]), out=out_dir, index_url=index_url, find_links=tuple(find_links or ()),
        timeout=timeout, python_ranges=tuple(supported for _, supported in stacks))
    result = build(request, progress=None if as_json else ui.progress)
    if as_json:
        ui.emit_json(["wheelhouse", "build"], result.to_dict())
        return
    ui.print_table(f"dsctl wheelhouse build: {result.wheels} wheels in {result.out}", COLUMNS,
                   [[lock.file, lock.arch, lock.python, lock.distributions] for lock in result.locks])
