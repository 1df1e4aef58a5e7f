"""The bad-input battery's harness (issue 41): run a dsctl command on a malformed input and assert the refusal.

A right refusal is exit 2 or 3, one line ``dsctl: error: ...`` that names the field (and, by the project's rule,
the fix), and **no host contacted**.  "Not contacted" is observed, not inferred from the exit code: every host of
the inventories made here points at a `Sentinel`, a TCP listener on the loopback that counts the connections it
accepts (SSH, HTTP, anything).  A check that ran only after dsctl tried to reach a host shows up as a count above 0.
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from dsctl.app import main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventories" / "sample"
_ACCEPT_TIMEOUT_S = 0.2


class Sentinel:
    """A loopback TCP port that counts the connections made to it (closes each at once). Stop it with close()."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self._socket.settimeout(_ACCEPT_TIMEOUT_S)
        self.port = self._socket.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():  # bounded: close() sets the event, each accept waits 0.2 s at most
            try:
                peer, _ = self._socket.accept()
            except OSError:  # the timeout, or the socket closed
                continue
            self.connections += 1
            peer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()


def site(tmp_path: Path, sentinel: Sentinel, group_vars: Mapping | None = None, *,
         hosts: Sequence[str] = ("atlas-a01", "atlas-a02"), host_vars: Mapping[str, Mapping] | None = None,
         gateway: Mapping | None = None, name: str = "site") -> Path:
    """A copy of inventories/sample whose hosts all point at ``sentinel``; ``group_vars`` are written into the
    fleet's group_vars after the sample's own (a later file wins), ``host_vars`` per host, ``gateway`` (the
    gateway group's vars) adds a gateway host at the sentinel too.  Returns the inventory's hosts.yml."""
    root = tmp_path / name
    shutil.copytree(SAMPLE, root)
    connection = {"ansible_host": "127.0.0.1", "ansible_port": sentinel.port}
    children = {"npu_nodes": {"hosts": {host: dict(connection) for host in hosts}}}
    if gateway is not None:
        children["gateway"] = {"hosts": {"gw-01": dict(connection)}}
        (root / "group_vars" / "gateway.yml").write_text(yaml.safe_dump(dict(gateway)))
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": children}}))
    if group_vars:
        # zz-: Ansible reads a group's files in name order, so this one overrides the sample's.
        (root / "group_vars" / "npu_nodes" / "zz-battery.yml").write_text(yaml.safe_dump(dict(group_vars)))
    for host, values in (host_vars or {}).items():
        (root / "host_vars").mkdir(exist_ok=True)
        (root / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(dict(values)))
    return root / "hosts.yml"


def gateway_on_fleet_host(inventory: Path, gateway: Mapping, host: str = "atlas-a01") -> None:
    """Make fleet ``host`` a gateway host too (a host of both groups, sharing its port table) with ``gateway`` as
    the gateway group's vars."""
    hosts = yaml.safe_load(inventory.read_text())
    connection = hosts["all"]["children"]["npu_nodes"]["hosts"][host]
    hosts["all"]["children"]["gateway"] = {"hosts": {host: dict(connection)}}
    inventory.write_text(yaml.safe_dump(hosts))
    (inventory.parent / "group_vars" / "gateway.yml").write_text(yaml.safe_dump(dict(gateway)))


def write_raw(inventory: Path, relative: str, text: str) -> Path:
    """Write ``text`` as it is (a YAML scalar safe_dump would quote: 010, a date) to a file of the inventory."""
    path = inventory.parent / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def refusal(capsys, sentinel: Sentinel, args: Sequence[str], *, exits: Sequence[int] = (2, 3)) -> str:
    """Run ``dsctl ARGS`` in-process; assert exit in ``exits``, one error line, no connection to any host.
    Returns the error line."""
    before = sentinel.connections
    status = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.strip().splitlines() if line.strip()]
    assert status in exits, f"exit {status} for {list(args)}:\n{captured.err}{captured.out}"
    assert len(lines) == 1 and lines[0].startswith("dsctl: error: "), captured.err
    assert sentinel.connections == before, f"a host was contacted before the refusal: {lines[0]}"
    return lines[0]


def assert_names(line: str, *words: str) -> None:
    """The refusal names each of ``words`` (the field, and the fix's key word)."""
    for word in words:
        assert word in line, f"{word!r} not named in: {line}"
