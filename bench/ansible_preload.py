"""Time a play of set_fact tasks that use dsctl's filters, with and without the dsctl_preload callback.

Usage: .venv/bin/python bench/ansible_preload.py [TASKS] [HOSTS]      (defaults: 20 tasks, 3 local hosts)
Prints the wall time of each run and the ratio. Why it matters: playbooks/callback_plugins/dsctl_preload.py.
Local connections only, so it measures the controller's cost per task and host, not SSH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def write_play(directory: Path, tasks: int, hosts: int) -> tuple[Path, Path]:
    inventory = directory / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        f"h{n}": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for n in range(hosts)}}}))
    play = directory / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": f"Parse a manifest {n}",
         "ansible.builtin.set_fact": {f"sums_{n}": "{{ ('0' * 64 ~ '  a.whl') | dsctl_parse_sha256sums }}"}}
        for n in range(tasks)]}]))
    return inventory, play


def timed(inventory: Path, play: Path, callbacks: str) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACKS_ENABLED": callbacks,
           "PYTHONPATH": str(ROOT / "cli")}
    env.pop("DSCTL_EVENTS_FILE", None)
    started = time.perf_counter()
    run = subprocess.run([str(PLAYBOOK), "-i", str(inventory), str(play)], env=env, capture_output=True, text=True,
                         timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"ansible-playbook exited {run.returncode}: {(run.stdout + run.stderr)[-800:]}")
    return time.perf_counter() - started


def main(tasks: int, hosts: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        inventory, play = write_play(Path(scratch), tasks, hosts)
        # Ansible refuses an empty list; dsctl_events does nothing without DSCTL_EVENTS_FILE.
        without = timed(inventory, play, "dsctl_events")
        with_preload = timed(inventory, play, "dsctl_events,dsctl_preload")
    print(f"{tasks} set_fact tasks x {hosts} hosts: without dsctl_preload {without:.1f} s, "
          f"with {with_preload:.1f} s, ratio {without / with_preload:.1f}x")


if __name__ == "__main__":
    args = [int(value) for value in sys.argv[1:3]]
    main(*(args + [20, 3][len(args):]))
