"""The files each node of a multi-host instance needs, rendered from ``templates/`` (pure).

`dsctl.core.serving.multinode` plans the instance (its hosts, head first, each node's DP ranks, command line and
env, the HCCL rank table); this module turns one node of it into files, under the same
``<config_dir>/<instance>/`` layout single-host instances use (`dsctl.core.serving.service_render`)::

    service.env      the host's NPU environment < the service's env < the node's own (HCCL_IF_IP, GLOO/TP/HCCL
                     socket interfaces, HCCL_CONNECT_TIMEOUT, HCCL_BUFFSIZE, VLLM_RPC_TIMEOUT), its visible NPUs
    ranktable.json   the instance's HCCL rank table, the same file on every node (CANN HCCL guide, "Rank Table
                     Configuration"; MindIE's RANKTABLEFILE reads it, vllm-ascend's multi-node DP does not need it but
                     dsctl check and a human debugging HCCL do)
    launch.sh        templates/vllm-ascend/launch-node.sh.j2: ``vllm serve`` with the node's layout flags
    the unit         systemd or supervisor, as for a single-host instance (templates/managers/)

Why each node is an "instance" of its host for the inference_service role: the role's crash-safe rollout (pending
marker, verified snapshot of the last good files, fingerprint) then holds per node unchanged; only the gate differs
(roles/inference_service/tasks/group_rollout.yml gates the instance on its head and rolls every node back).

Refused here, one line each, before any host is touched: a container manager (the nodes' containers would need
host networking and the RoCE devices mapped; not rendered yet), MindIE (its multi-node config.json is planned in
`multinode.MultiNodeInstance`, not yet rendered and started), a head that listens beyond its host without
``allow_unauthenticated: true`` (multi-host services take no API key yet).
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

from dsctl.core.serving.multinode import MultiNodeError, MultiNodeInstance, MultiNodeSpec, NodeRole
from dsctl.core.serving.service import Instance
from dsctl.core.serving.service_render import (
    _SET_ENV,
    _TOOLKIT_SET_ENV,
    DEFAULT_INSTALL_PATH,
    RenderedFile,
    _absolute_dir,
    _env_lines,
    _unit,
    render_template,
)
from dsctl.errors import ExitStatus

LAUNCH_TEMPLATE = "vllm-ascend/launch-node.sh.j2"
RANK_TABLE_MODE = 0o640  # the MindIE guide's mode for its config files (multi-node.md); read by the service group


def deploy_problem(spec: MultiNodeSpec) -> str | None:
    """Why dsctl deploy cannot start this service's instances yet (one line), or None."""
    prefix = f"service {spec.name}"
    if spec.engine != "vllm-ascend":
        return (f"{prefix}: engine: dsctl deploy starts multi-host vllm-ascend instances; MindIE's multi-node "
                "config.json and rank table are planned (dsctl check pairs its NPUs) but not started yet: use "
                "engine: vllm-ascend")
    if spec.manager == "container":
        return (f"{prefix}: manager: multi-host instances run under systemd or supervisor (a container per node "
                "would need host networking and the RoCE devices mapped, not rendered yet): set manager")
    if not ipaddress.ip_address(spec.bind).is_loopback and not spec.allow_unauthenticated:
        return (f"{prefix}: allow_unauthenticated: the head listens on {spec.bind}, beyond its host, and multi-host "
                "services take no api_key yet; bind 127.0.0.1 behind an authenticating gateway, or set "
                "allow_unauthenticated: true to serve anyone who can reach the port")
    return None


def _option_lines(argv: tuple[str, ...]) -> list[str]:
    """``--flag value`` pairs of a command line (after ``vllm serve MODEL``), one per line, each word quoted."""
    lines: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return [" ".join(shlex.quote(word) for word in line) for line in lines]


def node_env(spec: MultiNodeSpec, node: NodeRole, *, env: Mapping[str, str]) -> dict[str, str]:
    """The node's environment: the host's NPU environment < the service's env and the node's own (planned by
    `multinode`, which keeps the service's env from overriding a node's identity) < its visible NPUs."""
    return _env_lines({**env, **node.env, "ASCEND_RT_VISIBLE_DEVICES": node.visible_devices})


def render_node(spec: MultiNodeSpec, instance: MultiNodeInstance, node: NodeRole, *, env: Mapping[str, str],
                config_dir: str, log_dir: str, install_path: str = DEFAULT_INSTALL_PATH,
                venv: str) -> list[RenderedFile]:
    """Every file of ``node`` on its host: env file, rank table, launch script, the manager's unit."""
    problem = deploy_problem(spec)
    if problem is not None:
        raise MultiNodeError(problem, ExitStatus.USAGE)
    config_dir = _absolute_dir("config_dir", config_dir)
    log_dir = _absolute_dir("log_dir", log_dir)
    install_path = _absolute_dir("install_path", install_path)
    instance_dir = posixpath.join(config_dir, instance.name)
    env_file = posixpath.join(instance_dir, "service.env")
    launch = posixpath.join(instance_dir, "launch.sh")
    owner, group = spec.user, spec.group
    common: dict[str, Any] = {
        "service": spec.name, "instance": instance.name, "index": instance.index, "engine": spec.engine,
        "env_file": env_file, "install_path": install_path, "node_rank": node.node_rank,
        "toolkit_set_env": [posixpath.join(install_path, s) for s in _TOOLKIT_SET_ENV],
        "set_env_scripts": [posixpath.join(install_path, s) for s in _SET_ENV[spec.engine]]}
    # The planned layout (DP sizes and ranks, the head's address and RPC port, EP, --headless), then what every
    # node shares; the API flags only on the head, which alone runs the API server.
    lines = _option_lines(node.argv[3:])
    if node.is_head:
        lines += _option_lines(("--host", spec.bind, "--served-model-name", spec.served_name))
    if spec.weights == "int8":  # vllm-ascend's DeepSeek W8A8 tutorials: msModelSlim checkpoints load with this
        lines += _option_lines(("--quantization", "ascend"))
    lines += _option_lines(("--max-model-len", str(spec.max_len),
                            "--gpu-memory-utilization", str(spec.gpu_memory_utilization)))
    text_env = render_template("common/service.env.j2", env=node_env(spec, node, env=env), **common)
    files = [
        RenderedFile(env_file, text_env, 0o640, False, "env", owner, group),
        RenderedFile(instance.rank_table_path, json.dumps(dict(instance.rank_table), indent=2) + "\n",
                     RANK_TABLE_MODE, False, "config", owner, group),
        RenderedFile(launch, render_template(LAUNCH_TEMPLATE, vllm=posixpath.join(venv, "bin", "vllm"),
                                             model=spec.model, lines=lines, **common), 0o750, False, "launch", owner,
                     group),
    ]
    # The unit as a single-host instance's (service_render._unit: the same templates, escaping and paths).
    as_instance = Instance(service=spec.name, index=instance.index, npus=node.npus, port=instance.port)
    files.append(_unit(spec, as_instance, common, instance_dir=instance_dir, launch=launch, log_dir=log_dir,
                       unit_dir=None))
    return files
