"""Wall time of a cold and an idempotent provision of bare lab hosts: dsctl vs plain ansible-playbook.

Usage: .venv/bin/python bench/provision.py [--only dsctl|plain] [SIZES...]     e.g.  bench/provision.py 1 8 32
Root and Linux only (it brings up a lab under /run/dsctl/bench-lab; no other lab may be up).

"dsctl" is `dsctl provision INVENTORY` (dsctl's ansible.cfg: forks 16, SSH pipelining, its event callback).
"plain" is `ansible-playbook -i INVENTORY playbooks/provision.yml` with Ansible's own defaults (forks 5, no
pipelining); only the paths to dsctl's roles and plugins are set, since the playbook needs them.
Each size gets a fresh lab per tool so both start from the same bare hosts.
"""

from __future__ import annotations

import argparse
import os
import re
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
        output = result.stdout + result.stderr
        with tempfile.NamedTemporaryFile("w", prefix="bench-provision-", suffix=".log", delete=False) as log:
            log.write(output)
        # plain ansible-playbook's fatal/failed lines and recap; dsctl's run tail ("HOST: failed at TASK: ...")
        problems = [line for line in output.splitlines() if line.startswith(("fatal:", "failed:", "dsctl: error"))
                    or re.search(r"(failed|unreachable)=[1-9]|^\S+: (failed at |unreachable: )", line)]
        raise SystemExit(f"{' '.join(command)} exited {result.returncode} (whole output: {log.name}):\n"
                         + "\n".join(problems[-20:] or output.splitlines()[-20:]))
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


def main(sizes: list[int], tools: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        cfg = Path(scratch) / "ansible.cfg"
        cfg.write_text(PLAIN_CFG.format(repo=REPO))
        print(f"{'hosts':>5}  {'dsctl cold s':>12}  {'dsctl again s':>13}  {'plain cold s':>12}  {'plain again s':>13}",
              flush=True)
        try:
            for size in sizes:
                dsctl_figures = run_dsctl(size) if "dsctl" in tools else (None, None)
                plain_figures = run_plain(size, cfg) if "plain" in tools else (None, None)
                cells = ("-" if value is None else f"{value:.1f}" for value in (*dsctl_figures, *plain_figures))
                print(f"{size:>5}  " + "  ".join(f"{cell:>12} " for cell in cells), flush=True)
        finally:
            dsctl("lab", "down", check=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="cold and idempotent provision wall time, dsctl vs plain")
    parser.add_argument("sizes", nargs="*", type=int, default=[1, 8, 32], help="lab sizes (hosts)")
    parser.add_argument("--only", choices=("dsctl", "plain"), help="time one tool only")
    options = parser.parse_args()
    main(options.sizes, (options.only,) if options.only else ("dsctl", "plain"))
