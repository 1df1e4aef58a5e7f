"""The gateway in front of a fleet's inference instances: its schema, its member plan and its nginx config (pure).

A gateway is one nginx (from the distribution's packages) that balances a service over every instance of it on
the fleet, so an upgrade can take one instance out (drain) while clients keep being served by the others.  It is
declared by the inventory variable ``dsctl_gateway``, either on the host(s) of the ``gateway`` group or, with
``dsctl_gateway_on_controller: true`` next to it in the fleet's variables, on the controller::

    dsctl_gateway:
      services:                 # the services it fronts, each on its own port of the gateway
        - {service: chat, port: 8080}
      listen: 0.0.0.0
      read_timeout_s: 900       # longest silence of an instance inside one response (prefill of a long prompt)
      drain_timeout_s: 600      # how long a drain waits for the instance's in-flight requests

Every problem is one line naming the host and the field: ``inventory: host gw-01: dsctl_gateway.services[0].port:
expected a port 1..65535, got 'x'; fix it in group_vars or host_vars``.

`plan_gateway` turns the fleet's planned instances (`dsctl.core.serving.service.plan_host`, each host's
``ansible_host``) into the upstream members of each fronted service, each ``up`` or ``drained``;
`render_config` writes nginx's configuration from ``templates/gateway/nginx.conf.j2``.

nginx open source has no active health checks (``health_check`` is NGINX Plus only,
https://nginx.org/en/docs/http/ngx_http_upstream_hc_module.html).  dsctl compensates in three ways: an instance
joins (undrain) only after its own ``/health`` answers 200; the passive check (``max_fails`` / ``fail_timeout``,
https://nginx.org/en/docs/http/ngx_http_upstream_module.html#server) takes an instance that fails out for
``fail_timeout``; and ``proxy_next_upstream`` passes a request that could not reach an instance (refused, reset,
502/503/504 before a byte reached the client) on to the next one, so a dying instance costs a retry, not a
failed request.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dsctl.core.fleet.root_paths import RootPathRefused, root_dir, root_run_file
from dsctl.core.serving import host_ports, templates
from dsctl.core.serving.port_table import SSH_PORT, PortTable
from dsctl.core.serving.service import (
    AccountName,
    BindAddress,
    ServiceSpec,
    Slug,
    Text,
    plan_host,
)
from dsctl.core.text import stated_problem
from dsctl.errors import DsctlError, ExitStatus

GATEWAY_VAR = "dsctl_gateway"
ON_CONTROLLER_VAR = "dsctl_gateway_on_controller"
DRAIN_VAR = "dsctl_gateway_drain"
UNDRAIN_VAR = "dsctl_gateway_undrain"
GATEWAY_GROUP = "gateway"
CONTROLLER = "controller"
UP, DRAINED = "up", "drained"
FIX = "fix it in group_vars or host_vars"
_WILDCARD = ("0.0.0.0", "::")


class GatewayError(DsctlError):
    exit_status = ExitStatus.USAGE


# --------------------------------------------------------------------------- the schema


def _safe_path(value: str) -> str:
    # These paths reach nginx's configuration and a systemd unit unquoted-safe: no blanks, quotes, '$' or '%'.
    if not _SAFE_PATH_RE.fullmatch(value) or "//" in value or "/../" in value + "/":
        raise ValueError("not a plain absolute path")
    return value.rstrip("/") or "/"


_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+-]*$")
AbsolutePath = Annotated[Text, AfterValidator(_safe_path)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535, description="a port 1..65535")]


_PATH = "an absolute path of letters, digits and ._/@+-"


class GatewayRoute(BaseModel):
    """One fronted service: clients reach it on ``port`` of the gateway."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: Annotated[Slug, Field(description="the name of a service of dsctl_services")]
    port: Port


class GatewaySpec(BaseModel):
    """``dsctl_gateway``; each field's description is what an error says it expects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    services: Annotated[list[GatewayRoute], Field(strict=True, min_length=1,
                                                  description="a list of {service, port}, at least one")]
    listen: Annotated[BindAddress, Field(description="an IP address such as 0.0.0.0")] = "0.0.0.0"
    balance: Annotated[Literal["least_conn", "round_robin"],
                       Field(description="least_conn or round_robin")] = "least_conn"
    # Time to open a TCP connection to an instance; a refused one moves on at once (proxy_next_upstream error).
    connect_timeout_s: Annotated[int, Field(strict=True, ge=1, le=300, description="a number of seconds 1..300")] = 5
    # proxy_read_timeout is the gap between two reads, not the whole response: the prefill of a long prompt
    # (and queueing before it) is the longest silence of a streamed completion.
    read_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                         description="a number of seconds 1..86400")] = 900
    send_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                         description="a number of seconds 1..86400")] = 300
    # Passive health check: this many failed attempts within fail_timeout take the instance out for fail_timeout.
    max_fails: Annotated[int, Field(strict=True, ge=0, le=100, description="an integer 0..100 (0: never)")] = 1
    fail_timeout_s: Annotated[int, Field(strict=True, ge=1, le=3600,
                                         description="a number of seconds 1..3600")] = 10
    # Completions have no side effect a retry could repeat, so a POST whose instance died before answering is
    # passed to another instance (nginx does not retry non-idempotent requests by default).
    retry_non_idempotent: Annotated[bool, Field(strict=True, description="true or false (unquoted)")] = True
    drain_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                          description="a number of seconds 1..86400")] = 600
    # How long an undrain waits for the instance's /health before it refuses to put it back.
    health_timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400,
                                           description="a number of seconds 1..86400")] = 300
    max_body_mb: Annotated[int, Field(strict=True, ge=1, le=4096, description="an integer number of MB 1..4096")] = 64
    worker_user: Annotated[AccountName, Field(description="a user name (not root)")] = "dsctl-gateway"
    worker_processes: Annotated[int, Field(strict=True, ge=0, le=256,
                                           description="an integer 0..256 (0: one per CPU)")] = 0
    worker_connections: Annotated[int, Field(strict=True, ge=64, le=65536,
                                             description="an integer 64..65536")] = 4096
    # The gateway role creates these as root (mode 0755): dsctl.core.fleet.root_paths's rule too.
    config_dir: Annotated[AbsolutePath, AfterValidator(root_dir("make it root's (mode 0755)", "/etc/dsctl/gateway")),
                          Field(description=_PATH)] = "/etc/dsctl/gateway"
    state_dir: Annotated[AbsolutePath, AfterValidator(root_dir("make it root's (mode 0755)", "/var/lib/dsctl-gateway")),
                         Field(description=_PATH)] = "/var/lib/dsctl-gateway"
    log_dir: Annotated[AbsolutePath, AfterValidator(root_dir("make it root's (mode 0755)", "/var/log/dsctl")),
                       Field(description=_PATH)] = "/var/log/dsctl"
    # nginx's master writes its pid here as root: /run/dsctl* or a directory of dsctl's own, never /etc/passwd.
    pid_file: Annotated[AbsolutePath, AfterValidator(root_run_file("write nginx's pid into it as root",
                                                                   "/run/dsctl-gateway.pid")),
                        Field(description=_PATH)] = "/run/dsctl-gateway.pid"

    @field_validator("worker_user")
    @classmethod
    def _not_root(cls, user: str) -> str:
        if user == "root":
            raise ValueError("root")
        return user

    @model_validator(mode="after")
    def _distinct_ports(self) -> GatewaySpec:
        seen: dict[int, int] = {}
        for index, route in enumerate(self.services):
            if route.port in seen:
                raise _Problem(f"services[{index}].port", f"port {route.port} is also the port of "
                                                          f"services[{seen[route.port]}]; give each service its own")
            seen[route.port] = index
        names = [route.service for route in self.services]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise _Problem(f"services[{index}].service", f"{name} is fronted twice; list it once")
        return self

    @property
    def config_file(self) -> str:
        return f"{self.config_dir}/nginx.conf"

    @property
    def state_file(self) -> str:
        """The drained members (one ``host/instance`` per line): a deploy keeps them drained."""
        return f"{self.config_dir}/drained"

    @property
    def error_log(self) -> str:
        return f"{self.log_dir}/gateway-error.log"

    @property
    def access_log(self) -> str:
        return f"{self.log_dir}/gateway-access.log"


class _Problem(GatewayError):
    """A problem at a path inside dsctl_gateway (passes pydantic validators unchanged, like service._Problem)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _field(loc: Sequence[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "dsctl_gateway"


def _pydantic_problem(error: Mapping[str, Any]) -> str:
    loc = list(error.get("loc", ()))
    field = _field(loc)
    model = GatewayRoute if len(loc) >= 3 and loc[0] == "services" else GatewaySpec
    name = str(loc[-1]) if loc else ""
    if isinstance(loc[-1] if loc else None, int):
        name = str(loc[-2])
    info = model.model_fields.get(name)
    expected = info.description if info is not None and info.description else "a valid value"
    if isinstance((error.get("ctx") or {}).get("error"), RootPathRefused):
        return f"{field}: {error['ctx']['error']}"
    if error["type"] == "extra_forbidden":
        known = list(model.model_fields)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
        return f"{field}: unknown gateway setting; {hint}"
    if error["type"] == "missing":
        return f"{field}: required but not set ({expected}); add it"
    if stated_problem(error):
        return f"{field}: {stated_problem(error)}; {FIX}"
    return f"{field}: expected {expected}, got {_shown(error.get('input'))}; {FIX}"


def validate_gateway(host: str, value: Any) -> GatewaySpec:
    """``dsctl_gateway`` of ``host`` -> its `GatewaySpec`; `GatewayError` (one line: host and field) if wrong."""
    try:
        return check_gateway(value)
    except GatewayError as problem:
        raise GatewayError(f"inventory: host {host}: {problem}") from None


def check_gateway(value: Any) -> GatewaySpec:
    """`validate_gateway` without the host: the inventory schema's validator (it names the host itself)."""
    if isinstance(value, GatewaySpec):  # validated once already (a fleet laid over with other variables)
        return value
    prefix = GATEWAY_VAR
    if not isinstance(value, Mapping):
        raise GatewayError(f"{prefix}: expected a mapping with services: [{{service, port}}], got {_shown(value)}; "
                           f"{FIX}")
    try:
        return GatewaySpec.model_validate(dict(value))
    except ValidationError as invalid:
        errors = invalid.errors()
        more = len(errors) - 1
        tail = f" ({more} more problem{'s' if more > 1 else ''} in {GATEWAY_VAR})" if more else ""
        raise GatewayError(f"{prefix}.{_pydantic_problem(errors[0])}{tail}") from None
    except _Problem as problem:
        raise GatewayError(f"{prefix}.{problem.field}: {problem.message}") from None


# --------------------------------------------------------------------------- where gateways run


@dataclass(frozen=True)
class GatewayTarget:
    """One gateway to run: a host of the ``gateway`` group, or the controller (``name`` CONTROLLER)."""

    name: str
    spec: GatewaySpec
    on_controller: bool
    ssh_port: int = SSH_PORT  # the gateway host's sshd (its ansible_port): the gateway may not listen there


def gateway_targets(gateway_hosts: Mapping[str, Mapping[str, Any]],
                    fleet_vars: Mapping[str, Mapping[str, Any]]) -> list[GatewayTarget]:
    """The gateways an inventory declares: each host of the ``gateway`` group with its ``dsctl_gateway``, and the
    controller when the fleet's hosts set ``dsctl_gateway_on_controller: true`` (all alike)."""
    targets = []
    for host, values in gateway_hosts.items():
        if values.get(GATEWAY_VAR) is None:
            raise GatewayError(f"inventory: host {host}: {GATEWAY_VAR}: host {host} is in group {GATEWAY_GROUP} "
                               f"but declares no gateway; set {GATEWAY_VAR} (services: [{{service, port}}]) "
                               f"for it or take it out of the group")
        targets.append(GatewayTarget(str(host), validate_gateway(str(host), values[GATEWAY_VAR]), False,
                                     host_ports.ssh_port(values)))
    on_controller = {host: values for host, values in fleet_vars.items() if values.get(ON_CONTROLLER_VAR) is not None}
    for host, values in on_controller.items():
        if not isinstance(values[ON_CONTROLLER_VAR], bool):
            raise GatewayError(f"inventory: host {host}: {ON_CONTROLLER_VAR}: expected true or false (unquoted), "
                               f"got {_shown(values[ON_CONTROLLER_VAR])}; {FIX}")
    wanted = [host for host, values in on_controller.items() if values[ON_CONTROLLER_VAR]]
    if wanted:
        first = wanted[0]
        differing = [host for host in fleet_vars if host not in wanted
                     or fleet_vars[host].get(GATEWAY_VAR) != fleet_vars[first].get(GATEWAY_VAR)]
        if differing:
            raise GatewayError(f"inventory: host {differing[0]}: {ON_CONTROLLER_VAR}: the controller's gateway must "
                               f"be declared alike for every host of the fleet (as host {first} does); set "
                               f"{ON_CONTROLLER_VAR} and {GATEWAY_VAR} in group_vars, not per host")
        if fleet_vars[first].get(GATEWAY_VAR) is None:
            raise GatewayError(f"inventory: host {first}: {GATEWAY_VAR}: {ON_CONTROLLER_VAR} is true but no gateway "
                               f"is declared; set {GATEWAY_VAR} (services: [{{service, port}}]) next to it")
        targets.append(GatewayTarget(CONTROLLER, validate_gateway(first, fleet_vars[first][GATEWAY_VAR]), True))
    return targets


# --------------------------------------------------------------------------- the member plan


@dataclass(frozen=True)
class FleetHost:
    """What the planner needs of one host of the fleet: where to reach it and what it runs."""

    name: str
    address: str
    services: tuple[ServiceSpec, ...]
    npu_count: int
    # The multi-host instances whose head this host is (instance name, its service): only a head serves the API,
    # so only heads are members (a headless worker has no port to balance to).
    heads: tuple[tuple[str, Any], ...] = ()
    ssh_port: int = SSH_PORT
    service_fields: tuple[tuple[str, str], ...] = ()  # service name -> dsctl_services[i] (host_ports.service_fields)


@dataclass(frozen=True)
class Member:
    """One instance behind the gateway."""

    host: str
    instance: str
    service: str
    address: str
    port: int
    state: str  # UP | DRAINED

    @property
    def id(self) -> str:
        return f"{self.host}/{self.instance}"

    @property
    def server(self) -> str:
        """nginx's ``server`` address: ``10.78.0.11:8000``, ``[fd00::1]:8000``."""
        try:
            bracketed = ipaddress.ip_address(self.address).version == 6
        except ValueError:
            bracketed = False
        return f"[{self.address}]:{self.port}" if bracketed else f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.server}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "instance": self.instance, "service": self.service,
                "address": self.address, "port": self.port, "state": self.state, "url": self.url}


@dataclass(frozen=True)
class GatewayPlan:
    target: GatewayTarget
    upstreams: dict[str, tuple[Member, ...]]  # fronted service -> its members, fleet order

    @property
    def members(self) -> list[Member]:
        return [member for members in self.upstreams.values() for member in members]

    @property
    def drained(self) -> list[str]:
        return [member.id for member in self.members if member.state == DRAINED]


_MEMBER_RE = re.compile(r"^[A-Za-z0-9_.:-]+/[a-z][a-z0-9-]*-[0-9]+$")


def member_ids(value: Any, field: str) -> list[str]:
    """An extra var naming instances (``lab-01/chat-0``; a list or a comma-separated string) -> the ids."""
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise GatewayError(f"{field}: expected a list of host/instance (lab-01/chat-0), got {_shown(value)}")
    ids = []
    for item in items:
        text = str(item).strip()
        if not isinstance(item, str) or not _MEMBER_RE.fullmatch(text):
            raise GatewayError(f"{field}: {_shown(item)} is not host/instance (e.g. lab-01/chat-0)")
        ids.append(text)
    return ids


def _address(host: FleetHost, spec: Any, target: GatewayTarget, route_index: int) -> str:
    if spec.bind in _WILDCARD:
        return host.address
    # The whole of 127.0.0.0/8 and ::1 stay on their host (RFC 1122 section 3.2.1.3), not just 127.0.0.1.
    if ipaddress.ip_address(spec.bind).is_loopback and not (not target.on_controller and target.name == host.name):
        field = dict(host.service_fields).get(spec.name, "dsctl_services")
        raise GatewayError(f"inventory: host {host.name}: {field}.bind: service {spec.name} binds {spec.bind}, so "
                           f"the gateway on {target.name} ({GATEWAY_VAR}.services[{route_index}]) cannot reach it "
                           "(a loopback address stays on its host); set its bind to 0.0.0.0 or to an address the "
                           "gateway reaches, or run the gateway on that host")
    return spec.bind


def plan_gateway(target: GatewayTarget, fleet: Sequence[FleetHost], *, drained: Iterable[str] = (),
                 drain: Iterable[str] = (), undrain: Iterable[str] = ()) -> GatewayPlan:
    """The members of each fronted service: every planned instance of it on the fleet, ``drained`` when it was
    drained before (the gateway's state) or is drained now and not undrained now, else ``up``.

    A drain or undrain naming no instance of the gateway is an error; a drained id that no longer exists (the
    inventory dropped it) is forgotten."""
    spec = target.spec
    wanted_drained = (set(drained) | set(drain)) - set(undrain)
    upstreams: dict[str, tuple[Member, ...]] = {}
    fronted = {route.service: index for index, route in enumerate(spec.services)}
    for service_name, route_index in fronted.items():
        members = []
        for host in fleet:
            for instance_name, head_spec in host.heads:
                if head_spec.name == service_name:
                    member_id = f"{host.name}/{instance_name}"
                    members.append(Member(host.name, instance_name, service_name,
                                          _address(host, head_spec, target, route_index), head_spec.port_base,
                                          DRAINED if member_id in wanted_drained else UP))
            by_name = {s.name: s for s in host.services}
            if service_name not in by_name:
                continue
            service_spec = by_name[service_name]
            address = _address(host, service_spec, target, route_index)
            for planned in plan_host(host.services, host.npu_count):
                if planned.service != service_name:
                    continue
                member_id = f"{host.name}/{planned.name}"
                members.append(Member(host.name, planned.name, service_name, address, planned.port,
                                      DRAINED if member_id in wanted_drained else UP))
        if not members:
            raise _unknown_service(target, route_index, service_name, {s.name for host in fleet for s in host.services}
                                   | {spec.name for host in fleet for _, spec in host.heads})
        upstreams[service_name] = tuple(members)
    known_ids = {member.id for members in upstreams.values() for member in members}
    for var, ids in ((DRAIN_VAR, drain), (UNDRAIN_VAR, undrain)):
        for member_id in ids:
            if member_id not in known_ids:
                raise GatewayError(f"{var}: {member_id} is not an instance behind the gateway on {target.name}; "
                                   f"known: {', '.join(sorted(known_ids))}")
    _check_ports(target, fleet)
    return GatewayPlan(target, upstreams)


def _unknown_service(target: GatewayTarget, index: int, name: str, known: Iterable[str]) -> GatewayError:
    names = sorted(set(known))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else (f"the fleet runs {', '.join(names)}" if names
                                                        else "the fleet declares no dsctl_services")
    return GatewayError(f"inventory: host {target.name}: {GATEWAY_VAR}.services[{index}].service: no host of the "
                        f"fleet runs a service named {name}; {hint}")


def check_gateways(gateway_hosts: Mapping[str, Mapping[str, Any]], fleet_vars: Mapping[str, Mapping[str, Any]],
                   settings: Mapping[str, Any] | None = None) -> list[GatewayTarget]:
    """The planning-time check of every gateway (`gateway_targets`), and that each fronted service is a service
    of some host's dsctl_services: what the gateway play would refuse only after every instance rolled out.

    ``fleet_vars`` are every host of the fleet (not just --limit's), so only service names are read of them;
    with ``settings`` (`validate_fleet`'s, for every host of ``fleet_vars``) each gateway is planned too, as the
    gateway play plans it: an instance it cannot reach (bound to loopback on another host) and a port its host
    already uses are refused here, before any host is contacted."""
    targets = gateway_targets(gateway_hosts, fleet_vars)
    known = {str(service.get("name")) for values in fleet_vars.values()
             for service in (values.get("dsctl_services") or []) if isinstance(service, Mapping)}
    for target in targets:
        for index, route in enumerate(target.spec.services):
            if route.service not in known:
                raise _unknown_service(target, index, route.service, known)
    if settings is not None:
        fleet = fleet_hosts(fleet_vars, settings)
        for target in targets:
            plan_gateway(target, fleet)
    return targets


def _check_ports(target: GatewayTarget, fleet: Sequence[FleetHost]) -> None:
    """The gateway's ports join its host's port table (dsctl.core.serving.host_ports): sshd's, and on a host of
    the fleet every instance's; a port used twice is refused naming both users."""
    if target.on_controller:
        return  # the controller's ports are not the inventory's to know
    host = next((host for host in fleet if host.name == target.name), None)
    if host is None:
        table = PortTable(target.name)
        table.claim(target.ssh_port, host_ports.SSH_VAR, "sshd", host_ports.FIX)
    else:
        table = host_ports.host_table(host.name, services=host.services, npu_count=host.npu_count,
                                      heads=host.heads, ssh=host.ssh_port, fields=dict(host.service_fields))
    for index, route in enumerate(target.spec.services):
        table.claim(route.port, f"{GATEWAY_VAR}.services[{index}].port", f"the gateway's {route.service}",
                    "pick another port for the gateway")


# --------------------------------------------------------------------------- the nginx configuration


_NGINX_UNSAFE = re.compile(r"[\x00-\x1f\x7f$]")


def nginx_quote(value: Any) -> str:
    """``value`` as one double-quoted nginx token: backslashes and quotes escaped.

    nginx expands ``$name`` even inside quotes and has no escape for it, and a control character ends a token,
    so those are refused (the schema never lets one through; this is the last line of defence)."""
    text = str(value)
    if _NGINX_UNSAFE.search(text):
        raise ValueError(f"cannot put {text!r} into nginx's configuration: '$' or a control character")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def nginx_int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer for nginx's configuration, got {value!r}")
    return str(value)


templates.register(nq=nginx_quote, ni=nginx_int)


def upstream_name(service: str) -> str:
    return f"dsctl_{service.replace('-', '_')}"


def listen_address(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


CONFIG_PATH = "/dsctl-gateway/config"


def fingerprint(plan: GatewayPlan) -> str:
    """A short hash of everything the configuration holds.  Each server of the gateway answers it on
    ``CONFIG_PATH``: ``nginx -s reload`` returns before the master has applied the new file (and a master that
    cannot apply it keeps the old one), so dsctl knows the new configuration is live when it reads this back."""
    payload = {"spec": plan.target.spec.model_dump(mode="json"),
               "members": [member.to_dict() for member in plan.members]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def config_url(plan: GatewayPlan) -> str:
    """Where the gateway host itself reads the live configuration's fingerprint."""
    spec = plan.target.spec
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(spec.listen, spec.listen)
    return f"http://{listen_address(address, spec.services[0].port)}{CONFIG_PATH}"


def render_config(plan: GatewayPlan) -> str:
    """nginx.conf of the gateway (``templates/gateway/nginx.conf.j2``)."""
    spec = plan.target.spec
    servers = [{"service": route.service, "listen": listen_address(spec.listen, route.port),
                "upstream": upstream_name(route.service), "members": plan.upstreams[route.service]}
               for route in spec.services]
    return templates.render("gateway/nginx.conf.j2",
        spec=spec, servers=servers, fingerprint=fingerprint(plan), config_path=CONFIG_PATH)


def render_systemd_unit(spec: GatewaySpec, nginx: str = "/usr/sbin/nginx") -> str:
    """The gateway's systemd unit (hosts with systemd as PID 1)."""
    return templates.render("gateway/dsctl-gateway.service.j2", spec=spec, nginx=nginx)


def nginx_argv(spec: GatewaySpec, nginx: str = "/usr/sbin/nginx") -> list[str]:
    """nginx with the gateway's own configuration (never the distribution's /etc/nginx) and, before that is
    read, its own error log (``-e``, nginx 1.19.5+)."""
    return [nginx, "-c", spec.config_file, "-e", spec.error_log]


# --------------------------------------------------------------------------- a whole inventory


def fleet_hosts(fleet_vars: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]) -> list[FleetHost]:
    """The planner's view of the fleet: ``settings`` are `validate_fleet`'s (services, dsctl_npu_count), each
    host reached at its ``ansible_host`` (else its inventory name)."""
    return [FleetHost(str(name), str(values.get("ansible_host", name)), tuple(settings[name].services),
                      int(settings[name].dsctl_npu_count), _heads(str(name), settings[name]),
                      host_ports.ssh_port(values),
                      tuple(host_ports.service_fields(values.get("dsctl_services")).items()))
            for name, values in fleet_vars.items()]


def _heads(name: str, settings: Any) -> tuple[tuple[str, Any], ...]:
    specs = {spec.name: spec for spec in getattr(settings, "multi_host_services", ())}
    return tuple((group.name, specs[group.service]) for group in getattr(settings, "host_groups", ())
                 if group.hosts[0] == name and group.service in specs)


def plan_inventory(gateway_hosts: Mapping[str, Mapping[str, Any]], fleet_vars: Mapping[str, Mapping[str, Any]],
                   settings: Mapping[str, Any]) -> list[GatewayPlan]:
    """Every gateway the inventory declares, planned with nothing drained: what a verb checks before any host
    changes (`GatewayError`, one line, on the first problem); [] when the inventory declares none."""
    fleet = fleet_hosts(fleet_vars, settings)
    return [plan_gateway(target, fleet) for target in gateway_targets(gateway_hosts, fleet_vars)]
