"""Jinja filters that hand the roles' decisions to dsctl's pure core on the controller.

The roles never re-implement version ordering, the compatibility matrix, the env schema or the audit:
they call these filters, which call the same functions `dsctl provision`, `dsctl check` and the unit
tests use. Each filter raises AnsibleFilterError with dsctl's one-line message on bad input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

try:
    from dsctl.core.fleet import ascend_env, audit, install_steps, inventory_schema
    from dsctl.core.fleet.stack import DesiredStack, serving_venv_name
    from dsctl.core.hostfacts import hoststate
    from dsctl.core.serving import service, service_render
    from dsctl.errors import DsctlError
    from dsctl.services import deploy_plan
except ImportError as missing:  # ansible-playbook run outside dsctl's environment
    IMPORT_ERROR: str | None = str(missing)
else:
    IMPORT_ERROR = None

SETTINGS_PREFIX = "dsctl_"
# Options of one playbook run (dsctl passes them as extra vars, which reach hostvars): not host settings.
RUN_OPTIONS = frozenset({"dsctl_deploy_serial", "dsctl_deploy_force_restart"})
CHECKSUM_LINE = re.compile(r"^([0-9a-fA-F]{64})\s+\*?(\S+)$")


def _require_core() -> None:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"dsctl filters need the dsctl package on the controller ({IMPORT_ERROR}); "
            "run ansible-playbook from dsctl's virtualenv"
        )


def _dsctl_vars(host_vars: Mapping) -> dict:
    # Only dsctl_* keys are read, so unrelated undefined variables are never templated.
    return {key: host_vars[key] for key in list(host_vars.keys())
            if str(key).startswith(SETTINGS_PREFIX) and str(key) not in RUN_OPTIONS}


def _plain(value):
    """Ansible hands filters tagged/lazy containers; the core wants plain JSON-like values."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def fleet_problems(host_names, hostvars) -> list[str]:
    """Every host's settings and desired stack, checked before any host changes; [] when all is well."""
    _require_core()
    fleet = {str(name): _plain(_dsctl_vars(hostvars[name])) for name in host_names}
    try:
        inventory_schema.validate_fleet(fleet)
    except DsctlError as problem:
        return [str(problem)]
    return []


def desired_stack(host_vars, arch: str) -> dict:
    """This host's DesiredStack with the installer names for its architecture."""
    _require_core()
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        settings = inventory_schema.validate_fleet({name: _plain(_dsctl_vars(host_vars))})[name]
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    stack = settings.stack.to_dict()
    for key in ("driver_run", "firmware_run", "toolkit_run", "kernels_run", "nnal_run"):
        stack[key] = stack[key].replace("{arch}", str(arch))
    return stack


def host_settings(host_vars) -> dict:
    """The validated dsctl_* settings of this host with defaults applied (field names without the prefix)."""
    _require_core()
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        settings = inventory_schema.validate_host_vars(name, _plain(_dsctl_vars(host_vars)))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    return {key.removeprefix(SETTINGS_PREFIX): value for key, value in settings.model_dump(mode="json").items()}


def parse_sha256sums(text: str) -> dict:
    """`sha256sum` manifest text -> {file name: hex digest}; malformed lines are an error, not skipped."""
    sums = {}
    for number, line in enumerate(str(text).splitlines(), start=1):
        if not line.strip():
            continue
        found = CHECKSUM_LINE.match(line.strip())
        if not found:
            raise AnsibleFilterError(f"SHA256SUMS line {number} is not '<sha256>  <file>': {line[:80]!r}")
        sums[found.group(2)] = found.group(1).lower()
    return sums


def _wheels_for(name: str, version: str, sums: dict) -> dict[str, str]:
    """Wheel files of one pinned distribution in a wheelhouse manifest (PEP 427 names), file -> sha256."""
    wheel_prefix = re.sub(r"[-_.]+", "_", name).lower() + "-" + version + "-"
    found = {file: digest for file, digest in sums.items() if file.lower().startswith(wheel_prefix)
             and file.endswith(".whl")}
    if not found:
        raise AnsibleFilterError(
            f"wheelhouse: no wheel for {name}=={version} in its SHA256SUMS; add it to the wheelhouse"
        )
    return found


def pinned_wheels(pins, sums) -> list[str]:
    """The wheel files the pins need, to fetch them one by one from a wheelhouse URL."""
    sums = _plain(sums)
    return sorted(file for name, version in _plain(pins).items() for file in _wheels_for(name, version, sums))


def pip_requirements(pins, sums) -> str:
    """requirements.txt pinning each distribution, with every wheelhouse hash of that name and version."""
    sums = _plain(sums)
    lines = []
    for name, version in sorted(_plain(pins).items()):
        hashes = sorted(_wheels_for(name, version, sums).values())
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{digest}" for digest in hashes))
    return "\n".join(lines) + "\n"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def pin_drift(pins, installed) -> list[str]:
    """Distributions whose installed version differs from the pin (PEP 503 names compared)."""
    have = {_normalized(name): str(version) for name, version in _plain(installed or {}).items()}
    return sorted(name for name, version in _plain(pins or {}).items() if have.get(_normalized(name)) != str(version))


def render_env(overrides, toolkit_set_env: str, nnal_set_env: str) -> str:
    _require_core()
    try:
        env = ascend_env.resolve_env(_plain(overrides or {}))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    return ascend_env.render_env_file(env, toolkit_set_env=toolkit_set_env, nnal_set_env=nnal_set_env)


def expected_env(overrides) -> dict:
    _require_core()
    try:
        return ascend_env.resolve_env(_plain(overrides or {}))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def audit_report(host_state, stack, expected_npus, env_expected=None) -> dict:
    _require_core()
    state = hoststate.HostState.from_dict(_plain(host_state))
    desired = DesiredStack.from_dict(_plain(stack)) if stack else None
    report = audit.audit_host(state, desired, expected_npus=int(expected_npus) if expected_npus else None,
                              env_expected=_plain(env_expected) if env_expected is not None else None)
    return report.to_dict()


def install_steps_of(host_state, stack) -> list[dict]:
    """The ordered install/upgrade/switch/none steps of driver, firmware, toolkit, kernels/ops and NNAL."""
    _require_core()
    state = hoststate.HostState.from_dict(_plain(host_state))
    steps = install_steps.plan_install_steps(DesiredStack.from_dict(_plain(stack)), state)
    return [step.to_dict() for step in steps]


def switched_version_cfg(text, version: str) -> str:
    """latest/version.cfg once ``version`` (installed side by side) is the active CANN."""
    _require_core()
    return install_steps.switched_version_cfg(str(text or ""), str(version))


def serving_venv_dir_name(pins) -> str:
    _require_core()
    return serving_venv_name(_plain(pins or {}))


# How each service manager tells whether an instance's process is alive (service_health's process check).
PROCESS_CHECKS = {
    "supervisor": (["supervisorctl", "status", "{unit}"], r"RUNNING|STARTING"),
    "systemd": (["systemctl", "is-active", "{unit}"], r"^(active|activating)"),
    "container": (["{runtime}", "inspect", "-f", "{{{{.State.Running}}}}", "{unit}"], r"true"),
}


def service_instances(host_vars, overrides=None, only=None) -> list[dict]:
    """Every inference instance of this host with its rendered files, fingerprint and readiness check.

    ``overrides`` ({service: {engine parameter: value}}, dsctl_service_overrides) replace engine parameters;
    ``only`` (instance names, dsctl_deploy_only) keeps just those instances (None or empty: all)."""
    _require_core()
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        settings = inventory_schema.validate_fleet({name: _plain(_dsctl_vars(host_vars))})[name]
        settings = deploy_plan.apply_overrides(settings, _plain(overrides or {}))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    services = {spec.name: spec for spec in settings.services}
    rendered = service_render.render_host(
        settings.services, npu_count=settings.dsctl_npu_count, env=settings.environment,
        config_dir=settings.dsctl_service_config_dir, log_dir=settings.dsctl_service_log_dir,
        install_path=settings.dsctl_install_path)
    instances = []
    chosen = set(_plain(only)) if only else None
    for planned in deploy_plan.chosen(service.plan_host(settings.services, settings.dsctl_npu_count), chosen):
        spec = services[planned.service]
        files = rendered[planned.name]
        command, pattern = PROCESS_CHECKS[spec.manager]
        runtime = getattr(spec, "container_runtime", "docker") or "docker"
        instances.append({
            "name": planned.name, "service": spec.name, "unit": planned.unit, "engine": spec.engine,
            "manager": spec.manager, "port": planned.port, "npus": list(planned.npus), "bind": spec.bind,
            "model": spec.served_model_name, "user": spec.user, "group": spec.group,
            "dir": f"{settings.dsctl_service_config_dir}/{planned.name}",
            "log_file": f"{settings.dsctl_service_log_dir}/{planned.name}.log",
            "health_timeout": spec.health_timeout_s,
            "kind": "mindie" if spec.engine == "mindie" else "openai",
            "api_key": spec.api_key.get_secret_value() if spec.api_key is not None else None,
            "process_check": [part.format(unit=planned.unit, runtime=runtime) for part in command],
            "process_pattern": pattern,
            "fingerprint": service_render.fingerprint(files),
            # What the instance runs on besides its files (the role folds their state into the fingerprint).
            "stack_paths": {"install_path": None if spec.manager == "container" else settings.dsctl_install_path,
                            "venv": None if spec.manager == "container" else spec.venv},
            "files": [{"path": f.path, "content": f.content, "mode": f"0{f.mode:o}", "owner": f.owner,
                       "group": f.group, "secret": f.secret, "role": f.role} for f in files],
        })
    return instances


class FilterModule:
    def filters(self):
        return {
            "dsctl_fleet_problems": fleet_problems,
            "dsctl_desired_stack": desired_stack,
            "dsctl_host_settings": host_settings,
            "dsctl_parse_sha256sums": parse_sha256sums,
            "dsctl_pip_requirements": pip_requirements,
            "dsctl_pin_drift": pin_drift,
            "dsctl_pinned_wheels": pinned_wheels,
            "dsctl_render_env": render_env,
            "dsctl_expected_env": expected_env,
            "dsctl_audit": audit_report,
            "dsctl_service_instances": service_instances,
            "dsctl_install_steps": install_steps_of,
            "dsctl_switched_version_cfg": switched_version_cfg,
            "dsctl_serving_venv_name": serving_venv_dir_name,
        }
