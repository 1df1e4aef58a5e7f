#!/usr/bin/python
"""Read-only collector of an Ascend host's NPU parameter plane: hccn_tool's answers per NPU, /etc/hccn.conf, pings.

It runs hccn_tool with argument lists (no shell) and returns the raw text; parsing happens on the controller
(dsctl.core.network.hccn_state), so the npu_network role and `dsctl check` read the same facts the same way.
The queries and the ping are the checks the vllm-ascend multi-node tutorials ask for on every node (multi-node.md,
"The NPU network": ``hccn_tool -i $i -link -g``, ``-net_health -g``, ``-netdetect -g``, ``-ip -g``, ``cat
/etc/hccn.conf``, ``hccn_tool -i $i -ping -g address <peer NPU ip>``).

The NPUs are read side by side, one thread per NPU (each NPU's own queries and pings one after the other), so a
host's answer takes about as long as its slowest NPU: a ping that gets no answer waits for each of its packets.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: npu_network_facts
short_description: Read the NPU parameter plane (RoCE) of an Ascend host with hccn_tool (read-only)
description:
  - For each NPU of O(npus), runs C(hccn_tool -i N <query> -g) for each of O(queries) and returns exit code,
    stdout and stderr; then each of O(pings) as C(hccn_tool -i N -ping -g address A).
  - Returns C(/etc/hccn.conf) as text.
  - Never changes the host; safe in check mode.
options:
  hccn_tool:
    description: The driver's hccn_tool.
    type: path
    default: /usr/local/Ascend/driver/tools/hccn_tool
  npus:
    description: NPU (device) ids to read.
    type: list
    elements: int
    required: true
  queries:
    description: What to read of each NPU.
    type: list
    elements: str
    choices: [ip, gateway, netdetect, link, net_health]
    default: [ip, gateway, netdetect]
  pings:
    description: Pings to send, each a dict with C(npu) (the sending NPU) and C(address) (an IPv4 address).
    type: list
    elements: dict
    default: []
  conf:
    description: The hccn_tool configuration file.
    type: path
    default: /etc/hccn.conf
author: dsctl
"""

RETURN = r"""
ansible_facts:
  description: C(ascend_npu_network), the raw answers (C(tool), C(conf), C(npus) by id then query, C(pings)).
  returned: always
  type: dict
"""

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

COLLECTOR_VERSION = 1
QUERIES = {
    "ip": ["-ip", "-g"],
    "gateway": ["-gateway", "-g"],
    "netdetect": ["-netdetect", "-g"],
    "link": ["-link", "-g"],
    "net_health": ["-net_health", "-g"],
}
MAX_NPUS = 16
MAX_PINGS = 1024
MAX_OUTPUT = 65536
# A ping is three packets; the device waits for each (hccn_tool's own timing), so this only stops a hung tool.
COMMAND_TIMEOUT_S = 60
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")


def read_text(path, limit=1 << 20):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return None


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S,
                              env={**os.environ, "LC_ALL": "C"}, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": f"timed out after {COMMAND_TIMEOUT_S} s"}
    except OSError as problem:
        return {"rc": None, "stdout": "", "stderr": str(problem)}
    return {"rc": done.returncode, "stdout": done.stdout[:MAX_OUTPUT], "stderr": done.stderr[:MAX_OUTPUT]}


def read_npu(tool, npu, queries, pings):
    answers = {query: run([tool, "-i", str(npu), *QUERIES[query]]) for query in queries}
    sent = [{"npu": npu, "address": address, **run([tool, "-i", str(npu), "-ping", "-g", "address", address])}
            for address in pings]
    return answers, sent


def main():
    module = AnsibleModule(
        argument_spec={
            "hccn_tool": {"type": "path", "default": "/usr/local/Ascend/driver/tools/hccn_tool"},
            "npus": {"type": "list", "elements": "int", "required": True},
            "queries": {"type": "list", "elements": "str", "choices": sorted(QUERIES),
                        "default": ["ip", "gateway", "netdetect"]},
            "pings": {"type": "list", "elements": "dict", "default": []},
            "conf": {"type": "path", "default": "/etc/hccn.conf"},
        },
        supports_check_mode=True,
    )
    params = module.params
    npus = sorted(set(params["npus"]))
    if len(npus) > MAX_NPUS or any(npu < 0 or npu >= MAX_NPUS for npu in npus):
        module.fail_json(msg=f"npus: expected NPU ids 0..{MAX_NPUS - 1}, got {params['npus']}")
    pings = {npu: [] for npu in npus}
    for item in params["pings"][:MAX_PINGS]:
        npu, address = item.get("npu"), item.get("address")
        if not isinstance(npu, int) or npu not in pings or not isinstance(address, str) or not _IPV4.match(address):
            module.fail_json(msg=f"pings: expected {{npu: one of npus, address: an IPv4 address}}, got {item}")
        pings[npu].append(address)
    tool = params["hccn_tool"]
    raw = {"collector_version": COLLECTOR_VERSION, "tool": tool if os.access(tool, os.X_OK) else None,
           "conf_path": params["conf"], "conf": read_text(params["conf"]), "npus": {}, "pings": []}
    if raw["tool"] is not None and npus:
        with ThreadPoolExecutor(max_workers=len(npus)) as pool:
            done = {npu: pool.submit(read_npu, tool, npu, params["queries"], pings[npu]) for npu in npus}
            for npu, future in done.items():
                answers, sent = future.result()
                raw["npus"][str(npu)] = answers
                raw["pings"] += sent
    module.exit_json(changed=False, ansible_facts={"ascend_npu_network": raw})


if __name__ == "__main__":
    main()
