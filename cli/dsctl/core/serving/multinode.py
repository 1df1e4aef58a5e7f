"""Multi-host instances: which hosts form each instance of a service, and what every node of it runs (pure).

DeepSeek-V3/R1 (671 B, MoE) does not fit one Atlas 800T A2; the guides serve it over 2 or 4 of them
(multi-node.md, "Why it is needed").  A `MultiNodeSpec` describes such a service: ``nodes`` hosts per instance,
``npus_per_node`` NPUs on each, the tensor-parallel size of one DP rank and the total data-parallel size, expert
parallel on or off, and optionally the host groups themselves (head first)::

    name: deepseek
    engine: vllm-ascend
    model: /models/DeepSeek-V3-w8a8
    weights: int8                   # W8A8 checkpoint, 1 byte per parameter (estimate's int8)
    nodes: 2
    npus_per_node: 8
    tensor_parallel_size: 4         # per DP rank
    data_parallel_size: 4           # in total: 2 per node
    enable_expert_parallel: true
    socket_ifname: enp189s0f0       # the NIC of each host's own address (or NodeFacts.socket_ifname per host)

`plan_instances` cuts the service's hosts into instances and returns, per node, its role as vllm-ascend's
"Multi-Node-DP (DeepSeek)" tutorial lays it out (one ``vllm serve`` per node: the head with the API server,
workers ``--headless`` from their first DP rank, TP x local DP = the node's NPUs), the env of that node, MindIE's
multi-node env and config.json keys, and the instance's HCCL rank table (dsctl.core.network.rank_table).

Refused before anything is touched, one line naming the service, the instance or field, and the fix: exit 2 for a
layout that is wrong in itself (TP x local DP not the node's NPUs, EP for a dense model, a model dsctl has no
profile for), exit 3 for one the fleet cannot hold (a host count that does not divide, an NPU in two instances,
mixed chips or stacks in one instance, the model path missing on a node, a model that does not fit even across the
group by estimate's memory bound).
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dsctl.core.network.hccn_plan import NetworkPlan
from dsctl.core.network.rank_table import FILE_NAME, RankMember, RankTableError, build_rank_table
from dsctl.core.perf import perfmodel
from dsctl.core.perf.estimate import WEIGHT_FORMATS, estimate
from dsctl.core.serving.service import (
    DEFAULT_PORT,
    PORTS_PER_INSTANCE,
    AccountName,
    BindAddress,
    Count,
    Instance,
    ModelRef,
    SafePath,
    ServedName,
    ServiceError,
    ServiceGroup,
    Slug,
    check_env,
    check_unprivileged_port,
    expert_parallel_problem,
    served_default,
)
from dsctl.core.serving.service_render import DEFAULT_CONFIG_DIR
from dsctl.core.text import Text, stated_problem
from dsctl.errors import DsctlError, ExitStatus, UsageError

ENGINES = ("vllm-ascend", "mindie")
# vllm-ascend "Multi-Node-DP (DeepSeek)" and "DeepSeek-V3/3.1" tutorials: --data-parallel-rpc-port 13389, the same on
# every node; HCCL_BUFFSIZE=1024 (MB per communicator; the V3.1 tutorial uses 200 with its MTP weights).
DEFAULT_DP_RPC_PORT = 13389
DEFAULT_HCCL_BUFFSIZE = "1024"
# A node waits this long for the others' HCCL links at start-up (HCCL_CONNECT_TIMEOUT, s; CANN allows 120..7200):
# vllm-ascend's multi-node tutorials set 1200, the vendor's 2- and 4-node MindIE guides 7200 (multi-node.md).
DEFAULT_CONNECT_TIMEOUT = {"vllm-ascend": "1200", "mindie": "7200"}
# VLLM_RPC_TIMEOUT is in milliseconds (vLLM envs); vllm-ascend's multi-node tutorials raise it to 3600000, since
# the first requests of a large MoE group wait for graph compilation on every rank.
DEFAULT_VLLM_RPC_TIMEOUT_MS = "3600000"
# Each node's own identity: set by dsctl, never by a service's env.
NODE_ENV = ("HCCL_IF_IP", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "RANKTABLEFILE",
            "RANK_TABLE_FILE", "MIES_CONTAINER_IP", "HOST_IP")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")  # Linux IFNAMSIZ is 16 with the NUL
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class MultiNodeError(DsctlError):
    exit_status = ExitStatus.USAGE


class _Problem(ServiceError):
    """One problem at a field of the spec; not a ValueError, so pydantic lets it through (as in service.py)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


IfName = Annotated[Text, Field(pattern=_IFNAME_RE.pattern)]
HostName = Annotated[Text, Field(pattern=_HOST_RE.pattern)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]


class MultiNodeSpec(BaseModel):
    """A service whose instances span hosts; each field's description is what an error says it expects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[Slug, Field(description="a slug: lower-case letters, digits and '-', starting with a letter")]
    engine: Annotated[Literal["vllm-ascend", "mindie"], Field(description="vllm-ascend or mindie")]
    model: Annotated[ModelRef, Field(description="the absolute path of the weights on every node")]
    profile: Annotated[Text | None, Field(description="a model profile of dsctl/data/profiles.yaml such as "
                                                      "deepseek-v3 (default: the model path's last part)")] = None
    weights: Annotated[Literal["bf16", "int8"], Field(description="bf16, or int8 for a W8A8 checkpoint")] = "bf16"
    nodes: Annotated[int, Field(strict=True, ge=2, le=64, description="an integer 2..64 (hosts per instance)")]
    npus_per_node: Annotated[Count, Field(description="an integer 1..16")]
    tensor_parallel_size: Annotated[Count | None, Field(description="an integer 1..16 (per DP rank)")] = None
    data_parallel_size: Annotated[int | None, Field(strict=True, ge=1, le=1024,
                                                    description="an integer 1..1024 (DP ranks of the instance)")] = None
    enable_expert_parallel: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = False
    host_groups: Annotated[list[list[HostName]] | None,
                           Field(strict=True, min_length=1, description="a list of host lists, head first")] = None
    port: Annotated[Port | None, Field(description="a port 1..65535 (the head's API)")] = None
    data_parallel_rpc_port: Annotated[Port, Field(description="a port 1..65535")] = DEFAULT_DP_RPC_PORT
    # As for a single-host service (service.check_unprivileged_port): a port below 1024 is asked for.
    allow_privileged_port: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = False
    socket_ifname: Annotated[IfName | None, Field(description="a network interface name such as enp189s0f0")] = None
    max_model_len: Annotated[int | None, Field(strict=True, ge=2, le=1_048_576,
                                               description="an integer 2..1048576 (tokens)")] = None
    gpu_memory_utilization: Annotated[float, Field(strict=True, gt=0, le=1, description="a number in (0, 1]")] = 0.9
    manager: Annotated[Literal["systemd", "supervisor", "container"] | None,
                       Field(description="systemd, supervisor or container (default: the host's "
                                         "dsctl_service_manager)")] = None
    env: Annotated[dict[str, Any], Field(description="a mapping of VARIABLE: value")] = Field(default_factory=dict)
    # What deploy renders and runs on each node (dsctl.core.serving.multinode_render), as for single-host services.
    served_model_name: Annotated[ServedName | None, Field(description="a name of letters, digits and ._/:- "
                                                                      "(default: the model's last path part)")] = None
    bind: Annotated[BindAddress, Field(description="an IP address such as 0.0.0.0 or 127.0.0.1 (the head's API)")] = \
        "0.0.0.0"
    allow_unauthenticated: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = False
    user: Annotated[AccountName, Field(description="a user name (not root)")] = "dsctl-serve"
    group: Annotated[ServiceGroup, Field(description="a group name other than root, sudo, wheel, adm")] = "HwHiAiUser"
    venv: Annotated[SafePath | None, Field(description="an absolute path (default: the host's dsctl_serving_venv)")] \
        = None
    # A large MoE group loads hundreds of GB per node and waits HCCL_CONNECT_TIMEOUT for its peers: 30 min.
    health_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                           description="a number of seconds 1..86400")] = 1800
    chip: Annotated[Text, Field(description="the NPU's npu-smi name such as 910B3 (estimate's fit check)")] = "910B3"

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, Any]) -> dict[str, str]:
        for name in env:
            if name in NODE_ENV:
                raise _Problem(f"env.{name}", "set for each node by dsctl (its address, NIC and rank table); remove "
                                              "it (socket_ifname names the NIC)")
        try:
            return check_env(env)  # the service env's one rule: names, kinds and ranges of ascend_env.yaml
        except ServiceError as invalid:
            field, _, message = str(invalid).partition(": ")
            raise _Problem(field, message) from None

    @model_validator(mode="before")
    @classmethod
    def _default_served_name(cls, values: Any) -> Any:
        # As for a single-host service: the served name defaults to the model path's last part (made a valid name).
        model = values.get("model") if isinstance(values, dict) else None
        if isinstance(model, str) and values.get("served_model_name") is None:
            values = {**values, "served_model_name": served_default(posixpath.basename(model.rstrip("/")))}
        return values

    @model_validator(mode="after")
    def _layout(self) -> MultiNodeSpec:
        if not self.model.startswith("/"):
            raise _Problem("model", "every node of a multi-host instance loads the weights itself: give their "
                                    "absolute path (shared storage or a copy per node)")
        self._check_ports()
        profile = self.model_profile
        local = self.data_parallel_size_local
        tp = self.tp
        if self.data_parallel_size is not None and self.data_parallel_size % self.nodes:
            raise _Problem("data_parallel_size", f"{self.data_parallel_size} DP ranks do not spread evenly over "
                                                 f"{self.nodes} nodes; make it a multiple of nodes")
        if tp * local != self.npus_per_node:
            field = "tensor_parallel_size" if self.tensor_parallel_size is not None else "data_parallel_size"
            raise _Problem(field, f"tensor_parallel_size {tp} x data-parallel-size-local {local} = {tp * local}, "
                                  f"but npus_per_node is {self.npus_per_node}; make tensor_parallel_size x "
                                  "data_parallel_size / nodes equal npus_per_node (vllm-ascend Multi-Node-DP)")
        if self.enable_expert_parallel and self.engine == "mindie":
            raise _Problem("enable_expert_parallel", "a vllm-ascend flag: MindIE's expert layout lives in its "
                                                     "config.json, which dsctl does not render for MoE yet; remove it")
        dense = expert_parallel_problem(profile) if self.enable_expert_parallel else None
        if dense:
            raise _Problem("enable_expert_parallel", dense)  # the single-host rule (service.expert_parallel_problem)
        refused = perfmodel.parallel_problem(profile, tp, self.dp, self.enable_expert_parallel)
        if refused:
            raise _Problem("tensor_parallel_size", f"vLLM refuses tensor_parallel_size {tp} x data_parallel_size "
                                                   f"{self.dp} for {profile.name}: {refused.rstrip('.')}; pick another "
                                                   "layout")
        return self

    def _check_ports(self) -> None:
        for name in ("port", "data_parallel_rpc_port"):
            try:
                check_unprivileged_port(getattr(self, name) or self.port_base, self.allow_privileged_port, name)
            except ServiceError as refused:
                raise _Problem(name, str(refused).removeprefix(f"{name}: ")) from None
        api = self.api_ports
        if self.data_parallel_rpc_port in api:
            raise _Problem("data_parallel_rpc_port", f"{self.data_parallel_rpc_port} is also the head's API port"
                                                     f"{'s' if len(api) > 1 else ''} ({', '.join(map(str, api))}); "
                                                     "the head listens on both: give data_parallel_rpc_port its own "
                                                     f"port (default {DEFAULT_DP_RPC_PORT})")
        if api[-1] > 65535:
            raise _Problem("port", f"the head needs ports up to {api[-1]}; pick a lower port")

    # ------------------------------------------------------------------ derived

    @property
    def api_ports(self) -> tuple[int, ...]:
        """The ports the head serves on: the API port (and MindIE's managementPort and metricsPort after it)."""
        return tuple(self.port_base + k for k in range(PORTS_PER_INSTANCE[self.engine]))

    @property
    def model_profile(self) -> perfmodel.Model:
        """dsctl's profile of the model (``profile``, else the path's last part): experts, size, context."""
        name = self.profile or posixpath.basename(self.model.rstrip("/"))
        try:
            return perfmodel.model_by_name(name)
        except UsageError:
            known = ", ".join(perfmodel.load_profiles()[1])
            raise _Problem("profile", f"dsctl has no profile for {name!r}, so it cannot check experts and memory; "
                                      f"set profile to one of {known} (dsctl/data/profiles.yaml)") from None

    @property
    def data_parallel_size_local(self) -> int:
        if self.data_parallel_size is not None:
            return max(self.data_parallel_size // self.nodes, 1)
        if self.tensor_parallel_size is not None:
            return max(self.npus_per_node // self.tensor_parallel_size, 1)
        return 1

    @property
    def tp(self) -> int:
        if self.tensor_parallel_size is not None:
            return self.tensor_parallel_size
        return max(self.npus_per_node // self.data_parallel_size_local, 1)

    @property
    def dp(self) -> int:
        return self.data_parallel_size_local * self.nodes

    @property
    def world_size(self) -> int:
        return self.nodes * self.npus_per_node

    @property
    def port_base(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT[self.engine]

    @property
    def served_name(self) -> str:
        return self.served_model_name or posixpath.basename(self.model.rstrip("/"))

    @property
    def api_key(self) -> None:
        """Multi-host services take no API key yet (multinode_render.deploy_problem): what probes read."""
        return None

    @property
    def max_len(self) -> int:
        return self.max_model_len if self.max_model_len is not None else self.model_profile.max_model_len


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _loc_text(loc: Sequence[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def validate_multinode(entry: Any) -> MultiNodeSpec:
    """One multi-host service entry -> its spec; `MultiNodeError` (one line: service, field, fix) if wrong."""
    name = entry.get("name") if isinstance(entry, Mapping) else None
    prefix = f"service {name}: " if isinstance(name, str) else "service: "
    if not isinstance(entry, Mapping):
        raise MultiNodeError(f"{prefix}expected a mapping (name, engine, model, nodes, npus_per_node, ...), got "
                             f"{_shown(entry)}")
    try:
        return MultiNodeSpec.model_validate(dict(entry))
    except ValidationError as invalid:
        error = invalid.errors()[0]
        field = _loc_text(error.get("loc", ())) or "service"
        top = str(error["loc"][0]) if error.get("loc") else ""
        info = MultiNodeSpec.model_fields.get(top)
        expected = info.description if info is not None and info.description else "a valid value"
        if error["type"] == "extra_forbidden":
            line = f"{field}: unknown multi-host service setting (known: {', '.join(MultiNodeSpec.model_fields)})"
        elif error["type"] == "missing":
            line = f"{field}: required but not set ({expected}); add it to the service"
        elif stated_problem(error):
            line = f"{field}: {stated_problem(error)}; fix it in the service"
        else:
            line = f"{field}: expected {expected}, got {_shown(error.get('input'))}; fix it in the service"
        raise MultiNodeError(prefix + line) from None
    except _Problem as problem:
        raise MultiNodeError(prefix + str(problem)) from None


# --------------------------------------------------------------------------- the hosts


@dataclass(frozen=True)
class NodeFacts:
    """What the plan needs to know of one host (from the inventory, its desired stack, or its facts)."""

    name: str
    address: str                      # the management IP: server_id, HCCL_IF_IP, --data-parallel-address
    npu_count: int
    chip: str                         # npu-smi's name: 910B3
    cann: str | None = None
    driver: str | None = None
    vllm_ascend: str | None = None
    torch_npu: str | None = None
    model_present: bool | None = None  # None: not looked at (planning before facts)
    socket_ifname: str | None = None   # the NIC carrying `address` (else the spec's socket_ifname)

    def __post_init__(self) -> None:
        # The address reaches the rank table and the command lines of other hosts: an IP, nothing else.
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            raise MultiNodeError(f"host {self.name}: address {self.address!r} is not an IP address; give the host's "
                                 "management IP (ansible_host)") from None
        if self.socket_ifname is not None and not _IFNAME_RE.fullmatch(self.socket_ifname):
            raise MultiNodeError(f"host {self.name}: socket_ifname {self.socket_ifname!r} is not a network interface "
                                 "name")


# Compared across the nodes of one instance (name in messages, attribute, engines it matters for): mismatched
# CANN / driver / vllm-ascend versions fail at HCCL init (multi-node.md, "Failure modes").
_STACK = (("CANN", "cann", ENGINES), ("driver", "driver", ENGINES), ("vllm-ascend", "vllm_ascend", ("vllm-ascend",)),
          ("torch_npu", "torch_npu", ("vllm-ascend",)))


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class NodeRole:
    """One node of a multi-host instance: its NPUs, DP ranks, command line and env."""

    host: str
    address: str
    node_rank: int                    # 0 = the head
    npus: tuple[int, ...]
    tensor_parallel_size: int
    data_parallel_size_local: int
    data_parallel_start_rank: int
    headless: bool                    # a worker: no API server (vllm --headless; a MindIE slave takes no requests)
    argv: tuple[str, ...]             # vllm-ascend: the layout part of the command line; MindIE: ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    mindie_config: Mapping[str, Any] = field(default_factory=dict, hash=False)  # config.json path -> value

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0

    @property
    def visible_devices(self) -> str:
        """``ASCEND_RT_VISIBLE_DEVICES`` on this node."""
        return ",".join(str(npu) for npu in self.npus)


@dataclass(frozen=True)
class MultiNodeInstance:
    """One instance of a multi-host service: its nodes (head first), layout and rank table."""

    service: str
    index: int
    engine: str
    model: str
    port: int                         # the head's API port
    tensor_parallel_size: int
    data_parallel_size: int
    expert_parallel: bool
    nodes: tuple[NodeRole, ...]
    rank_table_path: str
    rank_table: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    @property
    def head(self) -> NodeRole:
        return self.nodes[0]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(node.host for node in self.nodes)

    @property
    def world_size(self) -> int:
        return sum(len(node.npus) for node in self.nodes)


def taken_npus(instances: Mapping[str, Sequence[Instance]]) -> dict[str, dict[int, str]]:
    """host -> NPU -> instance name of the single-host instances (`dsctl.core.serving.service.plan_host`)."""
    return {host: {npu: instance.name for instance in planned for npu in instance.npus}
            for host, planned in instances.items()}


def _groups(spec: MultiNodeSpec, pool: Sequence[NodeFacts]) -> list[list[NodeFacts]]:
    by_name = {host.name: host for host in pool}
    prefix = f"service {spec.name}: "
    if spec.host_groups is None:
        if not pool:
            raise MultiNodeError(f"{prefix}no hosts declare this service; declare it on {spec.nodes} hosts or a "
                                 "multiple of it")
        if len(pool) % spec.nodes:
            names = ", ".join(host.name for host in pool)
            raise MultiNodeError(
                f"{prefix}nodes: {len(pool)} host(s) ({names}) do not divide into instances of {spec.nodes} nodes; "
                f"declare the service on a multiple of {spec.nodes} hosts, or list host_groups",
                ExitStatus.VALIDATION_FAILED)
        return [list(pool[start:start + spec.nodes]) for start in range(0, len(pool), spec.nodes)]
    groups = []
    for g, names in enumerate(spec.host_groups):
        if len(names) != spec.nodes:
            raise MultiNodeError(f"{prefix}host_groups[{g}]: {len(names)} host(s), but nodes is {spec.nodes}; list "
                                 f"{spec.nodes} hosts per group, head first")
        for n, name in enumerate(names):
            if name not in by_name:
                known = ", ".join(by_name) or "none"
                raise MultiNodeError(f"{prefix}host_groups[{g}][{n}]: {name} is not a host of this service "
                                     f"(hosts: {known}); name one of them")
            if name in names[:n]:
                raise MultiNodeError(f"{prefix}host_groups[{g}][{n}]: {name} is already node {names.index(name)} of "
                                     "this group; list each host once")
        groups.append([by_name[name] for name in names])
    return groups


@dataclass(frozen=True)
class HostGroup:
    """One instance of a multi-host service as the inventory alone shows it: its hosts (head first) and the NPUs it
    uses on each (what `dsctl check` pairs and names; `plan_services` makes the full instance from the facts)."""

    service: str
    index: int
    hosts: tuple[str, ...]
    npus: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"


@dataclass(frozen=True)
class _Named:
    name: str


def is_multinode(entry: Any) -> bool:
    """A ``dsctl_services`` entry that spans hosts: it says ``nodes``."""
    return isinstance(entry, Mapping) and "nodes" in entry


def plan_host_groups(declared: Mapping[str, Sequence[MultiNodeSpec]], *, network: NetworkPlan,
                     npu_counts: Mapping[str, int],
                     taken: Mapping[str, Mapping[int, str]] | None = None) -> tuple[HostGroup, ...]:
    """The host groups of every multi-host service the hosts declare (host -> its specs, hosts in inventory order),
    cut as `plan_services` cuts them, checked for what the inventory alone shows: one definition per service, host
    counts that divide (or host_groups naming hosts that declare it), every node in the NPU network plan with
    enough NPUs, no NPU in two instances (``taken``: the single-host instances' NPUs, `taken_npus`).  Chips,
    stacks, the model path and the fit need the hosts' facts: `plan_services` checks them.  `MultiNodeError`, one
    line."""
    specs: dict[str, MultiNodeSpec] = {}
    pools: dict[str, list[str]] = {}
    for host, host_specs in declared.items():
        for spec in host_specs:
            first = specs.setdefault(spec.name, spec)
            if first != spec:
                raise MultiNodeError(f"service {spec.name}: host {host} declares it otherwise than "
                                     f"{pools[spec.name][0]}; a multi-host service has one definition for all its "
                                     "hosts: declare it once, in group_vars")
            pools.setdefault(spec.name, []).append(host)
    claimed: dict[str, dict[int, str]] = {host: dict(npus) for host, npus in (taken or {}).items()}
    groups: list[HostGroup] = []
    for name, spec in specs.items():
        for index, members in enumerate(_groups(spec, [_Named(host) for host in pools[name]])):  # type: ignore[arg-type]
            hosts = tuple(member.name for member in members)
            label = f"service {name}: instance {name}-{index} ({', '.join(hosts)})"
            for host in hosts:
                if npu_counts.get(host, 0) < spec.npus_per_node:
                    raise MultiNodeError(f"{label}: {host} has {npu_counts.get(host, 0)} NPUs, npus_per_node is "
                                         f"{spec.npus_per_node}; group hosts with enough NPUs, or lower npus_per_node",
                                         ExitStatus.VALIDATION_FAILED)
                if host not in network:
                    raise MultiNodeError(f"{label}: {host} has no NPU network plan (dsctl_npu_network or "
                                         "dsctl_npu_ips); multi-host instances talk over the NPUs' RoCE addresses: "
                                         "plan them", ExitStatus.VALIDATION_FAILED)
                other = next((claimed[host][npu] for npu in range(spec.npus_per_node)
                              if npu in claimed.get(host, {})), None)
                if other is not None:
                    raise MultiNodeError(f"{label}: {host}'s NPUs 0-{spec.npus_per_node - 1} overlap {other}'s; an "
                                         "NPU serves one instance: give each instance its own hosts (host_groups), or "
                                         "move the other instance off them", ExitStatus.VALIDATION_FAILED)
            for host in hosts:
                claimed.setdefault(host, {}).update({npu: f"{name}-{index}" for npu in range(spec.npus_per_node)})
            groups.append(HostGroup(name, index, hosts, tuple(range(spec.npus_per_node))))
    return tuple(groups)


def _chip_name(chip: str) -> str:
    try:
        return perfmodel.chip_by_name(chip).name
    except UsageError:
        return chip


def _group_problem(spec: MultiNodeSpec, label: str, group: Sequence[NodeFacts], network: NetworkPlan,
                   claimed: dict[str, dict[int, str]], instance: str) -> tuple[ExitStatus, str] | None:
    """Why this group cannot hold one instance (the first reason), or None; claims its NPUs when it can."""
    for host in group:
        if spec.engine == "vllm-ascend" and (host.socket_ifname or spec.socket_ifname) is None:
            return ExitStatus.USAGE, (
                f"service {spec.name}: socket_ifname: required for {host.name}: the NIC of {host.address} "
                "(GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME, HCCL_SOCKET_IFNAME); set it in the service")
    reason = _fleet_problem(spec, label, group, network, claimed)
    if reason is not None:
        return ExitStatus.VALIDATION_FAILED, reason
    for host in group:
        claimed.setdefault(host.name, {}).update({npu: instance for npu in range(spec.npus_per_node)})
    return None


def _fleet_problem(spec: MultiNodeSpec, label: str, group: Sequence[NodeFacts], network: NetworkPlan,
                   claimed: Mapping[str, Mapping[int, str]]) -> str | None:
    head = group[0]
    for host in group:
        if host.npu_count < spec.npus_per_node:
            return (f"{label}: {host.name} has {host.npu_count} NPUs, npus_per_node is {spec.npus_per_node}; group "
                    "hosts with enough NPUs, or lower npus_per_node")
        if host.name not in network:
            return (f"{label}: {host.name} has no NPU network plan (dsctl_npu_network or dsctl_npu_ips); multi-host "
                    "instances talk over the NPUs' RoCE addresses: plan them")
    for host in group[1:]:
        if _chip_name(host.chip) != _chip_name(head.chip):
            return (f"{label}: {host.name} has {host.chip} NPUs, the head {head.name} {head.chip}; an instance runs "
                    "on one chip type (its ranks split the model evenly): group hosts of one chip (host_groups)")
        for words, attribute, engines in _STACK:
            theirs, ours = getattr(host, attribute), getattr(head, attribute)
            if spec.engine in engines and None not in (theirs, ours) and theirs != ours:
                return (f"{label}: {host.name} runs {words} {theirs}, the head {head.name} {ours}; every node of an "
                        "instance needs the same CANN, driver, vllm-ascend and torch_npu (a mismatch fails at HCCL "
                        "init): provision or upgrade the group's hosts together")
    for host in group:
        if host.model_present is False:
            return (f"{label}: the model path {spec.model} is missing on {host.name}; every node loads the weights "
                    "itself: put them on shared storage or copy them to each node")
    for host in group:
        for npu in range(spec.npus_per_node):
            other = claimed.get(host.name, {}).get(npu)
            if other is not None:
                return (f"{label}: {host.name} NPU {npu} is also in {other}; an NPU serves one instance: give each "
                        "instance its own hosts (host_groups), or move the other instance off them")
    return None


def _fit_problem(spec: MultiNodeSpec, label: str, chip: str) -> tuple[ExitStatus, str] | None:
    """Does the model fit on the whole group?  estimate's memory bound (weights split evenly over every NPU of the
    group plus one full-length request's KV cache), so an instance refused here cannot start at all."""
    model, world = spec.model_profile, spec.world_size
    try:
        verdict = estimate(chip, model, prompt_tokens=spec.max_len - 1, output_tokens=1, chips=world,
                           weight_bytes=WEIGHT_FORMATS[spec.weights], memory_utilization=spec.gpu_memory_utilization)
    except UsageError:
        return ExitStatus.VALIDATION_FAILED, (
            f"{label}: dsctl has no performance profile for chip {chip} (dsctl/data/profiles.yaml), so it cannot check "
            f"that {model.name} fits; add the chip's profile")
    if verdict.fits:
        return None
    needed = verdict.min_chips_for_memory
    if needed is None:
        bound = "no chip count holds it"
    else:
        bound = (f"estimate's memory bound needs at least {needed} NPUs "
                 f"({math.ceil(needed / spec.npus_per_node)} nodes of {spec.npus_per_node})")
    return ExitStatus.VALIDATION_FAILED, (
        f"{label}: {model.name} ({spec.weights}, {verdict.weights_gb:.0f} GB of weights) does not fit on {world} "
        f"{chip} NPUs ({spec.nodes} x {spec.npus_per_node}) with a {spec.max_len}-token context: {bound}; raise "
        + ("nodes, use W8A8 weights (weights: int8), or lower max_model_len" if spec.weights == "bf16"
           else "nodes, or lower max_model_len"))


def _vllm_argv(spec: MultiNodeSpec, node_rank: int, head_address: str) -> tuple[str, ...]:
    # vllm-ascend "Multi-Node-DP (DeepSeek)": one `vllm serve` per node; node 0 starts at DP rank 0 (the V3.1
    # tutorial: "Node 0 starts at rank 0 (default)"), the others at their first rank and --headless.
    local = spec.data_parallel_size_local
    argv = ["vllm", "serve", spec.model]
    if node_rank == 0:
        argv += ["--port", str(spec.port_base)]
    argv += ["--data-parallel-size", str(spec.dp), "--data-parallel-size-local", str(local),
             "--data-parallel-start-rank", str(node_rank * local), "--data-parallel-address", head_address,
             "--data-parallel-rpc-port", str(spec.data_parallel_rpc_port), "--tensor-parallel-size", str(spec.tp)]
    if spec.enable_expert_parallel:
        argv.append("--enable-expert-parallel")  # "on all nodes in the multi-node case" (vLLM DP deployment docs)
    if node_rank > 0:
        argv.append("--headless")
    return tuple(argv)


def _vllm_env(spec: MultiNodeSpec, host: NodeFacts, ifname: str) -> dict[str, str]:
    # vllm-ascend Multi-Node-DP tutorial, "Run the following scripts on two nodes": HCCL_IF_IP=<local ip>, the
    # three *_SOCKET_IFNAME = the NIC of that ip, OMP_PROC_BIND=false, HCCL_BUFFSIZE=1024.
    env = {"HCCL_IF_IP": host.address, "GLOO_SOCKET_IFNAME": ifname, "TP_SOCKET_IFNAME": ifname,
           "HCCL_SOCKET_IFNAME": ifname, "HCCL_BUFFSIZE": DEFAULT_HCCL_BUFFSIZE,
           "HCCL_CONNECT_TIMEOUT": DEFAULT_CONNECT_TIMEOUT["vllm-ascend"], "OMP_PROC_BIND": "false",
           "VLLM_RPC_TIMEOUT": DEFAULT_VLLM_RPC_TIMEOUT_MS}
    return {**env, **spec.env}  # the service's env may tune the defaults, never a NODE_ENV name (_env refuses them)


def _mindie_env(spec: MultiNodeSpec, host: NodeFacts, rank_table_path: str) -> dict[str, str]:
    # MindIE installation guide, "Multi-Node Inference": RANKTABLEFILE (renamed RANK_TABLE_FILE in MindIE 2.x; both
    # are set, each release reads its own), MIES_CONTAINER_IP in a container (the host's address with host
    # networking), HOST_IP on bare metal.  HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT=0 (no limit on one collective),
    # ATB_LLM_HCCL_ENABLE=1 and ATB_LLM_COMM_BACKEND=hccl: the vendor's 2- and 4-node MindIE guides (multi-node.md).
    identity = "MIES_CONTAINER_IP" if spec.manager == "container" else "HOST_IP"
    env = {"RANKTABLEFILE": rank_table_path, "RANK_TABLE_FILE": rank_table_path, identity: host.address,
           "HCCL_CONNECT_TIMEOUT": DEFAULT_CONNECT_TIMEOUT["mindie"], "HCCL_EXEC_TIMEOUT": "0",
           "ATB_LLM_HCCL_ENABLE": "1", "ATB_LLM_COMM_BACKEND": "hccl"}
    return {**env, **spec.env}


def _mindie_config(spec: MultiNodeSpec) -> dict[str, Any]:
    # config.json keys of a multi-node MindIE node, as paths into templates/mindie/config.json.j2: multi-node
    # inference on, world size = every NPU of the instance (multi-node.md); MindIE then takes the devices and the
    # world size from the rank table ("npuDeviceIds and worldSize become invalid", MindIE installation guide), so
    # both are written consistent with it.
    model = "BackendConfig.ModelDeployConfig.ModelConfig[0]"
    config: dict[str, Any] = {"BackendConfig.multiNodesInferEnabled": True,
                              "BackendConfig.npuDeviceIds": [list(range(spec.npus_per_node))],
                              f"{model}.worldSize": spec.world_size}
    if spec.dp > 1:
        config.update({f"{model}.tp": spec.tp, f"{model}.dp": spec.dp})
    return config


def _instance(spec: MultiNodeSpec, index: int, group: Sequence[NodeFacts], network: NetworkPlan,
              config_dir: str) -> MultiNodeInstance:
    name = f"{spec.name}-{index}"
    rank_table_path = posixpath.join(config_dir, name, FILE_NAME)
    npus = tuple(range(spec.npus_per_node))
    head = group[0]
    roles = []
    for node_rank, host in enumerate(group):
        local = spec.data_parallel_size_local
        if spec.engine == "vllm-ascend":
            ifname = host.socket_ifname or spec.socket_ifname
            argv, env, config = _vllm_argv(spec, node_rank, head.address), _vllm_env(spec, host, ifname), {}
        else:
            argv, env, config = (), _mindie_env(spec, host, rank_table_path), _mindie_config(spec)
        roles.append(NodeRole(host=host.name, address=host.address, node_rank=node_rank, npus=npus,
                              tensor_parallel_size=spec.tp, data_parallel_size_local=local,
                              data_parallel_start_rank=node_rank * local, headless=node_rank > 0, argv=argv,
                              env=env, mindie_config=config))
    members = [RankMember(host=host.name, server_id=host.address, npus=npus) for host in group]
    try:
        table = build_rank_table(members, network)
    except RankTableError as missing:
        raise MultiNodeError(f"service {spec.name}: instance {name}: {missing}", ExitStatus.VALIDATION_FAILED) from None
    return MultiNodeInstance(service=spec.name, index=index, engine=spec.engine, model=spec.model,
                             port=spec.port_base, tensor_parallel_size=spec.tp, data_parallel_size=spec.dp,
                             expert_parallel=spec.enable_expert_parallel, nodes=tuple(roles),
                             rank_table_path=rank_table_path, rank_table=table)


def plan_services(specs: Sequence[MultiNodeSpec], hosts: Sequence[NodeFacts], *, network: NetworkPlan,
                  pools: Mapping[str, Sequence[str]] | None = None,
                  taken: Mapping[str, Mapping[int, str]] | None = None,
                  config_dir: str = DEFAULT_CONFIG_DIR,
                  numbers: Mapping[str, Sequence[int]] | None = None) -> list[MultiNodeInstance]:
    """Every instance of every multi-host service, checked as a whole before anything is touched.

    ``numbers``: per service, the instance numbers of its groups in order (default 0, 1, ...): a --limit plans only
    some of the fleet's groups, which keep the numbers the whole fleet gives them.

    ``hosts`` are the fleet's hosts in inventory order; ``pools`` names, per service, the hosts that declare it
    (default: all of them), cut in order into groups of ``nodes`` unless the service lists ``host_groups``;
    ``taken`` the NPUs single-host instances already hold (`taken_npus`); ``config_dir`` the hosts'
    ``dsctl_service_config_dir`` (the rank table goes to ``<config_dir>/<instance>/ranktable.json``).  Each node
    uses NPUs 0..npus_per_node-1.  Raises `MultiNodeError` on the first problem, saying how many more there are."""
    by_name = {host.name: host for host in hosts}
    claimed: dict[str, dict[int, str]] = {host: dict(npus) for host, npus in (taken or {}).items()}
    problems: list[tuple[ExitStatus, str]] = []
    planned: list[tuple[MultiNodeSpec, int, list[NodeFacts]]] = []
    for spec in specs:
        names = (pools or {}).get(spec.name)
        unknown = [name for name in names or () if name not in by_name]
        if unknown:
            raise MultiNodeError(f"service {spec.name}: host {unknown[0]} declares it but is not in the fleet; "
                                 "list the fleet's hosts")
        pool = list(hosts) if names is None else [by_name[name] for name in names]
        try:
            groups = _groups(spec, pool)
        except MultiNodeError as invalid:
            problems.append((invalid.exit_status, str(invalid)))
            continue
        for index, group in zip((numbers or {}).get(spec.name) or range(len(groups)), groups, strict=True):
            label = f"service {spec.name}: instance {spec.name}-{index} ({', '.join(host.name for host in group)})"
            found = _group_problem(spec, label, group, network, claimed, f"{spec.name}-{index}") or \
                _fit_problem(spec, label, group[0].chip)
            if found is not None:
                problems.append(found)
            else:
                planned.append((spec, index, group))
    if problems:
        status, line = problems[0]
        more = len(problems) - 1
        tail = f" ({more} more problem{'s' if more > 1 else ''} in the multi-host plan)" if more else ""
        raise MultiNodeError(line + tail, status)
    return [_instance(spec, index, group, network, config_dir) for spec, index, group in planned]


def plan_instances(spec: MultiNodeSpec, hosts: Sequence[NodeFacts], *, network: NetworkPlan,
                   taken: Mapping[str, Mapping[int, str]] | None = None,
                   config_dir: str = DEFAULT_CONFIG_DIR) -> list[MultiNodeInstance]:
    """The instances of one multi-host service over ``hosts`` (those that declare it, in inventory order)."""
    return plan_services([spec], hosts, network=network, taken=taken, config_dir=config_dir)
