"""Jinja filters that hand the gateway's decisions to dsctl.core.serving.gateway on the controller.

`dsctl_gateway_targets` says where the inventory wants gateways; `dsctl_gateway_plan` says what one of them
fronts (the members, each up or drained) and renders its nginx configuration.  Bad input is one line of
dsctl's (AnsibleFilterError), raised before the gateway host changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

try:
    from dsctl.core.ansible_values import plain
    from dsctl.core.inventory import host_plan
    from dsctl.core.inventory import schema as inventory_schema
    from dsctl.core.serving import gateway
    from dsctl.errors import DsctlError
except ImportError as missing:  # ansible-playbook run outside dsctl's environment
    # This guard stays in each plugin (dsctl_filters.py has its own): it reports the dsctl package missing, so it
    # cannot live in that package, and a plugin cannot import another plugin (see dsctl.core.ansible_values).
    IMPORT_ERROR: str | None = str(missing)
else:
    IMPORT_ERROR = None

FLEET_GROUP = "npu_nodes"


def _require_core() -> None:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(f"dsctl filters need the dsctl package on the controller ({IMPORT_ERROR}); "
                                 "run ansible-playbook from dsctl's virtualenv")


def _dsctl_vars(host_vars: Mapping) -> dict:
    """A host's dsctl settings; this run's options (extra vars such as dsctl_plan) are not settings."""
    return {key: plain(value) for key, value in host_plan.settings_vars(host_vars).items()}


def _targets(groups, hostvars) -> list:
    gateway_hosts = {name: _dsctl_vars(hostvars[name]) for name in groups.get(gateway.GATEWAY_GROUP, [])}
    fleet_vars = {name: _dsctl_vars(hostvars[name]) for name in groups.get(FLEET_GROUP, [])}
    return gateway.gateway_targets(gateway_hosts, fleet_vars)


def gateway_targets(groups, hostvars) -> list[dict]:
    """[{name, on_controller}] of every gateway the inventory declares; [] when it declares none."""
    _require_core()
    try:
        return [{"name": target.name, "on_controller": target.on_controller} for target in _targets(groups, hostvars)]
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def _fleet(groups, hostvars) -> list:
    names = list(groups.get(FLEET_GROUP, []))
    settings = inventory_schema.validate_fleet({name: _dsctl_vars(hostvars[name]) for name in names})
    return gateway.fleet_hosts({name: {"ansible_host": hostvars[name].get("ansible_host", name),
                                       "ansible_port": plain(hostvars[name].get("ansible_port")),
                                       "dsctl_services": plain(hostvars[name].get("dsctl_services"))}
                                for name in names}, settings)


def gateway_plan(name, groups, hostvars, drained_state="", drain=None, undrain=None, nginx="/usr/sbin/nginx") -> dict:
    """What the gateway ``name`` (a gateway host or "controller") serves: its settings, the members (each up or
    drained, with the ones this run drains or undrains), the nginx configuration and the systemd unit."""
    _require_core()
    try:
        target = next((t for t in _targets(groups, hostvars) if t.name == str(name)), None)
        if target is None:
            raise AnsibleFilterError(f"{name} is not a gateway of this inventory")
        drain_ids = gateway.member_ids(plain(drain), gateway.DRAIN_VAR)
        undrain_ids = gateway.member_ids(plain(undrain), gateway.UNDRAIN_VAR)
        before = [line.strip() for line in str(drained_state or "").splitlines() if line.strip()]
        plan = gateway.plan_gateway(target, _fleet(groups, hostvars), drained=before, drain=drain_ids,
                                    undrain=undrain_ids)
        spec = target.spec
        by_id = {member.id: member.to_dict() for member in plan.members}
        return {
            "spec": spec.model_dump(mode="json") | {"config_file": spec.config_file, "state_file": spec.state_file,
                                                    "error_log": spec.error_log, "access_log": spec.access_log},
            "members": list(by_id.values()),
            "drained": plan.drained,
            "drained_state": "".join(f"{member_id}\n" for member_id in plan.drained),
            "drain": [by_id[member_id] for member_id in drain_ids],
            "undrain": [by_id[member_id] for member_id in undrain_ids],
            "config": gateway.render_config(plan),
            "fingerprint": gateway.fingerprint(plan),
            "config_url": gateway.config_url(plan),
            "systemd_unit": gateway.render_systemd_unit(spec, nginx),
            "nginx_argv": gateway.nginx_argv(spec, nginx),
        }
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


class FilterModule:
    def filters(self):
        return {"dsctl_gateway_targets": gateway_targets, "dsctl_gateway_plan": gateway_plan}
