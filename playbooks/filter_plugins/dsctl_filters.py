"""Jinja filters that hand the roles' decisions to dsctl's pure core on the controller.

The roles never re-implement version ordering, the compatibility matrix, the env schema or the audit:
they call these filters, which call the same functions `dsctl provision`, `dsctl check` and the unit
tests use. Each filter raises AnsibleFilterError with dsctl's one-line message on bad input.

The verbs compute each host's settings, desired stack and rendered instances once and hand them in as the
``dsctl_plan`` extra var (cli/dsctl/core/inventory/host_plan.py): for a host it covers, the settings, stack and
instance filters return its entry instead of validating and rendering again; without one (plain
``ansible-playbook``, AWX) they compute the same functions here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

try:
    from dsctl.core.ansible_values import plain as _plain
    from dsctl.core.fleet import ascend_env, audit, install_steps, root_paths, sha256sums, wheel_lock
    from dsctl.core.fleet.stack import DesiredStack, serving_venv_name
    from dsctl.core.hostfacts import hoststate, platform
    from dsctl.core.inventory import host_plan
    from dsctl.core.inventory import schema as inventory_schema
    from dsctl.core.network import hccn_plan, hccn_state
    from dsctl.core.serving import multinode
    from dsctl.errors import DsctlError
except ImportError as missing:  # ansible-playbook run outside dsctl's environment
    IMPORT_ERROR: str | None = str(missing)
else:
    IMPORT_ERROR = None


def _require_core() -> None:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"dsctl filters need the dsctl package on the controller ({IMPORT_ERROR}); "
            "run ansible-playbook from dsctl's virtualenv"
        )


def _dsctl_vars(host_vars: Mapping) -> dict:
    # Only dsctl_* keys are read (run options and the plan left out), so unrelated undefined variables are
    # never templated.
    return host_plan.settings_vars(host_vars)


def _plan_entry(host_vars: Mapping) -> dict | None:
    """This host's entry of the dsctl_plan extra var (the verbs compute it once), None without one."""
    if "dsctl_plan" not in host_vars:
        return None
    plan = host_vars["dsctl_plan"]
    if not isinstance(plan, Mapping) or not isinstance(plan.get("hosts"), Mapping):
        return None
    # Only this host's entry is made plain: the plan of a large fleet is not copied at every reference.
    name = str(host_vars.get("inventory_hostname", "host"))
    return host_plan.entry({"version": plan.get("version"), "hosts": {name: _plain(plan["hosts"].get(name))}}, name)


def fleet_problems(host_names, hostvars) -> list[str]:
    """Every host's settings and desired stack, checked before any host changes; [] when all is well."""
    _require_core()
    names = [str(name) for name in host_names]
    plan = hostvars[names[0]].get("dsctl_plan") if names and "dsctl_plan" in hostvars[names[0]] else None
    if isinstance(plan, Mapping) and host_plan.covers_exactly(
            {"version": plan.get("version"), "fleet": _plain(plan.get("fleet"))}, names):
        return []  # dsctl validated exactly these hosts before the play and handed their plan in
    fleet = {name: _plain(_dsctl_vars(hostvars[name])) for name in names}
    try:
        inventory_schema.validate_fleet(fleet)
    except DsctlError as problem:
        return [str(problem)]
    return []


def desired_stack(host_vars, arch: str) -> dict:
    """This host's DesiredStack with the installer names for its architecture."""
    _require_core()
    planned = _plan_entry(host_vars)
    if planned is not None:
        return host_plan.stack_for_arch(planned["stack"], str(arch))
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        settings = inventory_schema.validate_fleet({name: _plain(_dsctl_vars(host_vars))})[name]
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    return host_plan.stack_for_arch(host_plan.stack_template(settings), str(arch))


def host_settings(host_vars) -> dict:
    """The validated dsctl_* settings of this host with defaults applied (field names without the prefix)."""
    _require_core()
    planned = _plan_entry(host_vars)
    if planned is not None:
        return planned["settings"]
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        return host_plan.host_settings(name, _plain(_dsctl_vars(host_vars)))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def root_path_problems(paths, resolved) -> list[str]:
    """The refusals of the paths a role is about to change as root ([] when all pass): ``paths`` a list of
    {field, path (one path or a list), kind (dir, env_file, run_file; default dir)}, ``resolved`` the host's
    realpath of each path, in order (dsctl.core.fleet.root_paths.host_path_problem: the inventory schema's rule, on
    the path as given and as the host resolves it)."""
    _require_core()
    given = [(str(item["field"]), str(path), str(item.get("kind") or "dir"))
             for item in paths
             for path in (item["path"] if isinstance(item["path"], list) else [item["path"]])]
    resolved = [str(line) for line in resolved]
    if len(given) != len(resolved):
        raise AnsibleFilterError(f"dsctl_root_path_problems: {len(given)} paths but {len(resolved)} resolved")
    problems = [root_paths.host_path_problem(field, path, real, kind=kind)
                for (field, path, kind), real in zip(given, resolved, strict=True)]
    return [problem for problem in problems if problem]


def parse_sha256sums(text) -> dict:
    """`sha256sum` manifest text -> {file name: hex digest} (dsctl.core.fleet.sha256sums: a malformed line is
    an error, not skipped)."""
    _require_core()
    try:
        return sha256sums.parse(str(text))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def _wheels_for(name: str, version: str, sums: dict) -> dict[str, str]:
    """Wheel files of one pinned distribution in a wheelhouse manifest, file -> sha256.

    PEP 440 matching (dsctl.core.fleet.wheel_lock), not a file-name prefix: ``torch-2.8.0+cpu-...whl`` is a
    wheel of the pin torch==2.8.0, as pip sees it."""
    _require_core()
    found = {file: sums[file] for file in wheel_lock.wheels_for(name, version, sums)}
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
    """requirements.txt pinning each distribution, with every wheelhouse hash of that name and version.

    For a wheelhouse without a lock: only dependency-free wheels install this way (--require-hashes wants a
    hashed line for every dependency too); `dsctl wheelhouse build` writes the lock that covers them."""
    sums = _plain(sums)
    lines = []
    for name, version in sorted(_plain(pins).items()):
        hashes = sorted(_wheels_for(name, version, sums).values())
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{digest}" for digest in hashes))
    return "\n".join(lines) + "\n"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def pin_drift(pins, installed) -> list[str]:
    """Distributions whose installed version does not meet the pin (PEP 503 names, PEP 440 ``==``:
    an installed vllm 0.13.0+empty meets the pin 0.13.0)."""
    _require_core()
    have = {_normalized(name): str(version) for name, version in _plain(installed or {}).items()}
    return sorted(name for name, version in _plain(pins or {}).items()
                  if _normalized(name) not in have or not wheel_lock.pin_matches(str(version), have[_normalized(name)]))


def _lock_call(function, *args):
    _require_core()
    try:
        return function(*args)
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def choose_lock(sums, pins, arch, python_version) -> str:
    """The wheelhouse's lock file for these pins on a host of ``arch`` with ``python_version``; "" for none."""
    return _lock_call(lambda: wheel_lock.choose_lock(_plain(sums or {}), _plain(pins or {}), str(arch),
                                                     wheel_lock.python_of(str(python_version))) or "")


def lock_requirements(text, pins) -> str:
    """The lock's requirement lines once checked: every pin in it at a matching version, hashes on every line."""
    def check():
        entries = wheel_lock.parse_lock(str(text))
        problems = wheel_lock.lock_problems(entries, _plain(pins or {}))
        if problems:
            raise wheel_lock.LockError(f"lock: {problems[0]}; rebuild it with dsctl wheelhouse build")
        return wheel_lock.render_lock(entries, ["written by dsctl provision from the lock"])
    return _lock_call(check)


def lock_wheels(text, sums) -> list[str]:
    """The wheelhouse files the lock's hashes name (to fetch them from a wheelhouse URL)."""
    return _lock_call(lambda: wheel_lock.lock_wheels(wheel_lock.parse_lock(str(text)), _plain(sums or {})))


def plain_requirements(pins) -> str:
    """The top-level pins without hashes (a package index and no lock: dependencies are pip's choice)."""
    return _lock_call(lambda: wheel_lock.plain_requirements(_plain(pins or {})))


def verified_text(text, digest, name) -> str:
    """``text`` when its SHA256 is ``digest`` (a lock fetched over http checked against the manifest)."""
    actual = hashlib.sha256(str(text).encode()).hexdigest()
    if actual != str(digest).lower():
        raise AnsibleFilterError(f"wheelhouse: {name} does not match its SHA256SUMS line; fetch the wheelhouse again")
    return str(text)


def _profile(profile) -> str | None:
    # A role default templated from a null setting may arrive as "" (or "None" without Jinja native types).
    profile = _plain(profile)
    return None if profile in (None, "", "None") else str(profile)


def render_env(overrides, toolkit_set_env: str, nnal_set_env: str, profile=None) -> str:
    """The env file: the defaults, then ``profile``'s values (dsctl_ascend_env_profile), then the overrides."""
    _require_core()
    try:
        env = ascend_env.resolve_env(_plain(overrides or {}), profile=_profile(profile))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    return ascend_env.render_env_file(env, toolkit_set_env=toolkit_set_env, nnal_set_env=nnal_set_env)


def expected_env(overrides, profile=None) -> dict:
    _require_core()
    try:
        return ascend_env.resolve_env(_plain(overrides or {}), profile=_profile(profile))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def audit_report(host_state, stack, expected_npus, env_expected=None) -> dict:
    _require_core()
    state = hoststate.HostState.from_dict(_plain(host_state))
    desired = DesiredStack.from_dict(_plain(stack)) if stack else None
    report = audit.audit_host(state, desired, expected_npus=int(expected_npus) if expected_npus else None,
                              env_expected=_plain(env_expected) if env_expected is not None else None)
    return report.to_dict()


def downgrades_of(host_state, stack) -> list[str]:
    """The parts provision would move to an older version than the host runs ("CANN 8.5.0 -> 8.3.RC2")."""
    _require_core()
    state = hoststate.HostState.from_dict(_plain(host_state))
    desired = DesiredStack.from_dict(_plain(stack))
    return install_steps.downgrades(install_steps.plan_install_steps(desired, state), desired, state)


def install_steps_of(host_state, stack) -> list[dict]:
    """The ordered install/upgrade/switch/none steps of driver, firmware, toolkit, kernels/ops and NNAL."""
    _require_core()
    state = hoststate.HostState.from_dict(_plain(host_state))
    steps = install_steps.plan_install_steps(DesiredStack.from_dict(_plain(stack)), state)
    return [step.to_dict() for step in steps]


def platform_blockers(system, settings, stack, python=None) -> list[dict]:
    """OS, architecture, kernel, memory, disk and the serving Python against the rules (dsctl.core.hostfacts.platform);
    each blocker as {check, sentence, fix, line}. ``python``: ascend_facts' serving_python ({output, rc}) or None."""
    _require_core()
    found = platform.platform_blockers(_plain(system or {}), _plain(settings or {}), _plain(stack) if stack else None,
                                       _plain(python) if python else None)
    return [{**blocker.to_dict(), "line": blocker.line()} for blocker in found]


def switched_version_cfg(text, version: str) -> str:
    """latest/version.cfg once ``version`` (installed side by side) is the active CANN."""
    _require_core()
    return install_steps.switched_version_cfg(str(text or ""), str(version))


def serving_venv_dir_name(pins) -> str:
    _require_core()
    return serving_venv_name(_plain(pins or {}))


def service_instances(host_vars, overrides=None, only=None) -> list[dict]:
    """Every inference instance of this host with its rendered files, fingerprint and readiness check.

    ``overrides`` ({service: {engine parameter: value}}, dsctl_service_overrides) replace engine parameters;
    ``only`` (instance names, dsctl_deploy_only) keeps just those instances (None or empty: all). From the
    dsctl_plan entry when the plan rendered this host with the same overrides."""
    _require_core()
    overrides = _plain(overrides or {})
    chosen = set(_plain(only)) if only else None
    planned = _plan_entry(host_vars)
    if (planned is not None and planned.get("instances") is not None
            and _plain(host_vars["dsctl_plan"].get("overrides")) == overrides):
        return [item for item in planned["instances"] if chosen is None or item["name"] in chosen]
    name = str(host_vars.get("inventory_hostname", "host"))
    try:
        settings = inventory_schema.validate_fleet({name: _plain(_dsctl_vars(host_vars))})[name]
        return host_plan.rendered_instances(settings, overrides, chosen)
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


def group_nodes(host_vars, declared=False) -> list:
    """This host's nodes of the multi-host instances to deploy (declared=True: the names of every one it belongs to,
    chosen or not, which the role must not retire), from the dsctl_plan entry.  Without one the host's multi-host
    services cannot be planned here: a node's command line needs the whole group (its head's address, its ranks),
    so plain ansible-playbook refuses them instead of starting half an instance."""
    _require_core()
    planned = _plan_entry(host_vars)
    if planned is not None and "group_nodes" in planned:
        return list(planned["group_declared"] if declared else planned["group_nodes"])
    services = host_vars.get("dsctl_services") or []
    spanning = [entry.get("name") for entry in services if multinode.is_multinode(_plain(entry))] \
        if isinstance(services, list) else []
    if spanning:
        raise AnsibleFilterError(f"dsctl_services: {spanning[0]} spans hosts; its nodes are planned for the whole "
                                 "group by dsctl deploy (the dsctl_plan extra var): run dsctl deploy")
    return []


def npu_network_plan(host_vars, host_names, hostvars) -> list[dict]:
    """This host's NPUs in the fleet's NPU network plan ({npu, address, netmask, netdetect, gateway} each; [] for a
    host without one): the dsctl_plan entry's, else planned here over the whole group (the plan derives a host's
    addresses from its place among all hosts, so it is never made for one host alone)."""
    _require_core()
    planned = _plan_entry(host_vars)
    if planned is not None and "npu_network" in planned:
        return list(planned["npu_network"] or [])
    name = str(host_vars.get("inventory_hostname", "host"))
    fleet = {str(other): _plain(_dsctl_vars(hostvars[other])) for other in host_names}
    try:
        plan = hccn_plan.plan_network(fleet)
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None
    return plan.to_dict().get(name, [])


def _host_network(host, npus) -> hccn_plan.HostNetwork:
    return hccn_plan.HostNetwork(str(host), tuple(hccn_plan.NpuAddress(**dict(npu)) for npu in _plain(npus or [])))


def npu_network_changes(raw, npus, tool, host) -> dict:
    """What the npu_network role sets on this host: {ready, reason, changes: [{npu, setting, argv, undo, label}]}
    (dsctl.core.network.hccn_state.role_decision), from npu_network_facts' raw answers and the host's planned NPUs."""
    _require_core()
    state = hccn_state.parse_network(_plain(raw or {}))
    try:
        return hccn_state.role_decision(_host_network(host, npus), state, str(tool))
    except DsctlError as problem:
        raise AnsibleFilterError(str(problem)) from None


class FilterModule:
    def filters(self):
        return {
            "dsctl_fleet_problems": fleet_problems,
            "dsctl_desired_stack": desired_stack,
            "dsctl_host_settings": host_settings,
            "dsctl_root_path_problems": root_path_problems,
            "dsctl_parse_sha256sums": parse_sha256sums,
            "dsctl_pip_requirements": pip_requirements,
            "dsctl_pin_drift": pin_drift,
            "dsctl_pinned_wheels": pinned_wheels,
            "dsctl_choose_lock": choose_lock,
            "dsctl_lock_requirements": lock_requirements,
            "dsctl_lock_wheels": lock_wheels,
            "dsctl_plain_requirements": plain_requirements,
            "dsctl_verified_text": verified_text,
            "dsctl_render_env": render_env,
            "dsctl_expected_env": expected_env,
            "dsctl_audit": audit_report,
            "dsctl_service_instances": service_instances,
            "dsctl_group_nodes": group_nodes,
            "dsctl_install_steps": install_steps_of,
            "dsctl_downgrades": downgrades_of,
            "dsctl_switched_version_cfg": switched_version_cfg,
            "dsctl_platform_blockers": platform_blockers,
            "dsctl_serving_venv_name": serving_venv_dir_name,
            "dsctl_npu_network_plan": npu_network_plan,
            "dsctl_npu_network_changes": npu_network_changes,
        }
