"""Wall time of a cold and an idempotent provision of bare lab hosts: dsctl vs plain ansible-playbook.

Usage: .venv/bin/python bench/provision.py [SIZES...]        e.g.  bench/provision.py 1 8 32
Root and Linux only (it brings up a lab under /run/dsctl/bench-lab; no other lab may be up).

"dsctl" is `dsctl provision INVENTORY` (dsctl's ansible.cfg: forks 16, SSH pipelining, its event callback).
"plain" is `ansible-playbook -i INVENTORY playbooks/provision.yml` with Ansible's own defaults (forks 5, no
pipelining); only the paths to dsctl's roles and plugins are set, since the playbook needs them.
Each size gets a fresh lab per tool so both start from the same bare hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = "/run/dsctl/bench-lab"
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLAIN_CFG = """[defaults]
roles_path = {repo}/roles
library = {repo}/playbooks/library
action_plugins = {repo}/playbooks/action_plugins
filter_plugins = {repo}/playbooks/filter_plugins
"""


def dsctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DSCTL_LAB_ROOT": ROOT}
    return subprocess.run([sys.executable, "-m", "dsctl", *args], env=env, check=check, capture_output=True,
                          text=True)


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        tail = result.stdout[-2000:] + result.stderr[-2000:]
        raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{tail}")
    return elapsed


def lab_up(size: int) -> str:
    dsctl("lab", "down")
    return dsctl("lab", "up", "--hosts", str(size)).stdout.strip().splitlines()[-1]


def run_dsctl(size: int) -> tuple[float, float]:
    inventory = lab_up(size)
    command = [sys.executable, "-m", "dsctl", "provision", inventory]
    return timed(command, dict(os.environ)), timed(command, dict(os.environ))


def run_plain(size: int, cfg: Path) -> tuple[float, float]:
    inventory = lab_up(size)
    env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(BIN / "ansible-playbook"), "-i", inventory, str(REPO / "playbooks" / "provision.yml")]
    return timed(command, env), timed(command, env)


def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        cfg = Path(scratch) / "ansible.cfg"
        cfg.write_text(PLAIN_CFG.format(repo=REPO))
        print(f"{'hosts':>5}  {'dsctl cold s':>12}  {'dsctl again s':>13}  {'plain cold s':>12}  {'plain again s':>13}",
              flush=True)
        try:
            for size in sizes:
                dsctl_cold, dsctl_again = run_dsctl(size)
                plain_cold, plain_again = run_plain(size, cfg)
                figures = (dsctl_cold, dsctl_again, plain_cold, plain_again)
                print(f"{size:>5}  " + "  ".join(f"{value:>12.1f} " for value in figures), flush=True)
        finally:
            dsctl("lab", "down", check=False)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [1, 8, 32])
