"""The Ansible inventory `dsctl lab up` writes: the lab hosts as any fleet, plus site variables.

The variables below are the ones a real site also sets for its own servers
(how to reach them, where packages come from, how to reboot); nothing here
tells a role that it talks to a lab.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

from dsctl.core.lab.plan import LabSpec, npu_network_settings
from dsctl.lab.hosts import LabPaths
from dsctl.lab.seed import REBOOT_COMMAND

GROUP = "npu_nodes"
LAB_MIN_MEMORY_GB = 2
LAB_MIN_FREE_DISK_GB = 10
# Wall seconds per modelled second of the lab's emulated engines: twice as fast as real time.  Read as modelled time,
# the client's and the engine's own Python overheads count 1 / scale times: at 0.25 (tried) six instances confirmed
# at a burst of 256 req/s missed TTFT p99 <= 200 ms by 4-23 % on 2 cores, at 0.5 every one met it (README command 1).
LAB_ENGINE_TIME_SCALE = "0.5"


def demo_service(npus: int) -> dict[str, Any]:
    """The service `dsctl deploy` starts on a fresh lab: DeepSeek-R1-Distill-Qwen-7B, TP4 instances.

    It is what a site would declare for real vllm-ascend (the model path is where a site keeps weights);
    on the lab the serving venv's stand-in vllm is dsctl's emulated engine, which needs no weights.
    """
    # TP 1, 2 or 4: the sizes that split the model's 28 attention heads and 4 KV heads (deploy refuses 3).
    per_instance = max(size for size in (1, 2, 4) if size <= npus)
    return {
        "name": "chat",
        "engine": "vllm-ascend",
        "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "served_model_name": "deepseek-r1-distill-qwen-7b",
        "npus_per_instance": per_instance,
        "instances": npus // per_instance,
        "port": 8000,
        "params": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
        # The lab's bridge is reachable from this machine only; a site sets api_key instead (see
        # inventories/sample), and dsctl refuses a service on 0.0.0.0 with neither.
        "allow_unauthenticated": True,
    }


def manifest_pins(packages: Path) -> dict[str, str]:
    """The digests of the package directory's SHA256SUMS and of its wheelhouse's, as an inventory pins them
    (`sha256sum SHA256SUMS`): with them the lab's packages stay trusted when a test serves them over http://."""
    pins = {}
    for name, manifest in (("dsctl_package_manifest_sha256", packages / "SHA256SUMS"),
                           ("dsctl_wheelhouse_manifest_sha256", packages / "wheels" / "SHA256SUMS")):
        if manifest.is_file():
            pins[name] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    return pins


def render_inventory(spec: LabSpec, paths: LabPaths) -> str:
    group_vars: dict[str, Any] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(paths.client_key),
        # Host-key checking stays on: the lab wrote every host's key into this file.
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={paths.known_hosts} -o StrictHostKeyChecking=yes",
        # Interpreter discovery can pick a pyenv shim that does not exist on the host.  The real file, not the
        # /usr/bin/python3 link: a host made to report openEuler 22.03 (`dsctl lab fault HOST os-openeuler`) has a
        # Python 3.9 stand-in there, as a site whose system python3 is too old for Ansible's modules names another.
        "ansible_python_interpreter": os.path.realpath("/usr/bin/python3"),
        "dsctl_npu_count": spec.npus,
        "dsctl_package_source": str(paths.packages),
        **manifest_pins(paths.packages),
        "dsctl_reboot_command": REBOOT_COMMAND,
        # A lab host boots in about a second; a host that is not back in two minutes never will be.
        "dsctl_reboot_timeout": 120,
        # Lab hosts have no systemd as PID 1 (nor do many containers): instances run under supervisord.
        "dsctl_service_manager": "supervisor",
        "dsctl_services": [demo_service(spec.npus)],
        # The field guide's memory env against aclrtMalloc failed on long prompts (ASCEND_CACHE_SIZE=6000000000,
        # GE_USE_STATIC_MEMORY=1, ...; cli/dsctl/data/ascend_env.yaml, field-practice.md "Memory env").
        "dsctl_ascend_env_profile": "long-context",
        # Only the lab's emulated engine reads this (it changes nothing a real vLLM would accept or refuse); probes,
        # tune and the upgrade gate read the scale from the engine's /version and judge modelled time.
        "dsctl_ascend_env": {"DSCTL_ENGINE_TIME_SCALE": LAB_ENGINE_TIME_SCALE},
        # The lab runs Debian, which no Ascend table lists (a site can opt in the same way), on a machine far
        # smaller than the guides' 64 GB RAM / 200 GB disk.
        "dsctl_extra_supported_os": ["debian"],
        # The lab's own regressed rebuild (releases.yaml's lab_only 8.5.0.lab1, the upgrade tests' target) is
        # installable here; a site's inventory never lists it, so dsctl refuses it there.
        "dsctl_allow_lab_releases": True,
        "dsctl_min_memory_gb": LAB_MIN_MEMORY_GB,
        "dsctl_min_free_disk_gb": min(LAB_MIN_FREE_DISK_GB, spec.disk_gb),
        # The NPU parameter plane, as a site writes its own (dsctl.core.network.hccn_plan derives each NPU's address):
        # NPU i of every host in 10.(80+i).0.0/24, the lab switch's .1 as gateway and detection peer, hosts from .11.
        "dsctl_npu_network": npu_network_settings(spec.npus),
    }
    inventory = {
        "all": {
            "children": {
                GROUP: {
                    "hosts": {host.name: {"ansible_host": host.address} for host in spec.members},
                    "vars": group_vars,
                }
            }
        }
    }
    header = f"# Written by `dsctl lab up` ({spec.hosts} x {spec.npus} {spec.chip}); removed by `dsctl lab down`.\n"
    return header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False)
