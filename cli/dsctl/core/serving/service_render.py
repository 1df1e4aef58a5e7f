"""The files one service instance needs on its host, rendered from ``templates/`` (pure).

``templates/`` holds one Jinja template per engine artefact (the vllm-ascend and lab-engine launch scripts,
MindIE's ``config.json`` and launch script, the instance env file) and per service manager (systemd unit,
supervisor program, container run script).  They are the single source of what runs: ``dsctl deploy`` renders
them for the inventory's services and ``dsctl tune`` for its candidates, both through `render_instance`.

Per instance, under ``<config_dir>/<instance>/`` (e.g. ``/etc/dsctl/services/chat-0/``)::

    service.env     NAME=value lines: the host's NPU environment, the service's env, ASCEND_RT_VISIBLE_DEVICES,
                    VLLM_API_KEY (then the file is secret: mode 0600) or MIES_CONFIG_JSON_PATH
    launch.sh       sources the CANN/NNAL (and MindIE) set_env.sh scripts, reads service.env, execs the engine
    config.json     MindIE only
    container-run.sh  manager container: (re)creates the container

and the manager's unit (``/etc/systemd/system/dsctl-chat-0.service`` or
``/etc/supervisor/conf.d/dsctl-chat-0.conf``).  `fingerprint` hashes an instance's files, secrets included,
so deploy restarts exactly the instances whose files changed.

The API key is passed in the env file (vLLM reads ``VLLM_API_KEY`` when ``--api-key`` is absent), never on the
command line where ``ps`` would show it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.serving import templates
from dsctl.core.serving.service import Instance, ServiceError, ServiceSpec, effective_params, engine_params, plan_host

DEFAULT_CONFIG_DIR = "/etc/dsctl/services"
DEFAULT_LOG_DIR = "/var/log/dsctl"
DEFAULT_INSTALL_PATH = "/usr/local/Ascend"
UNIT_DIRS = {"systemd": "/etc/systemd/system", "supervisor": "/etc/supervisor/conf.d"}
ROLES = ("launch", "env", "config", "unit")
# Engine defaults under the host's and the service's environment.  MindIE logs to files under ~/mindie unless
# told otherwise; dsctl wants the lines (readiness, crash classes) in the manager's log.
ENGINE_ENV = {"vllm-ascend": {}, "lab-engine": {}, "mindie": {"MINDIE_LOG_TO_STDOUT": "1"}}
# Shipped by the CANN toolkit (8.x) or the single CANN package (9.x): the first one present is sourced.
_TOOLKIT_SET_ENV = ("cann/set_env.sh", "ascend-toolkit/set_env.sh")
_SET_ENV = {"vllm-ascend": ("nnal/atb/set_env.sh",), "lab-engine": ("nnal/atb/set_env.sh",),
            "mindie": ("nnal/atb/set_env.sh", "atb-models/set_env.sh", "mindie/set_env.sh")}
_TEMPLATES = {"vllm-ascend": "vllm-ascend/launch.sh.j2", "lab-engine": "lab-engine/launch.sh.j2",
              "mindie": "mindie/launch.sh.j2"}


@dataclass(frozen=True)
class RenderedFile:
    """One file to put on the host.  ``content`` is left out of repr: it may hold the API key."""

    path: str
    content: str = field(repr=False)
    mode: int
    secret: bool
    role: str  # launch | env | config | unit
    owner: str = "root"
    group: str = "root"


# --------------------------------------------------------------------------- jinja


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _one_line(value: Any, where: str) -> str:
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        # A line break would end the directive (or the comment) and start a new one: never rendered.
        raise ServiceError(f"{where}: {text.splitlines()[0][:40]!r}... spans lines; values must be one line")
    return text


def shell_quote(value: Any) -> str:
    """One word for bash, whatever it holds (`shlex.quote`): ``$(...)``, backquotes, blanks and quotes stay
    text.  A line break is refused: inside quotes it would be kept, but never wanted in a path or name."""
    return shlex.quote(_one_line(value, "shell value"))


def comment_text(value: Any) -> str:
    """A value inside a ``#`` or ``;`` comment line: one line, so it cannot end the comment."""
    return _one_line(value, "comment")


# systemd.service(5) "Command lines": ExecStart= is split into words at blanks, words may be quoted with "..."
# (C-style escapes inside), "%" starts a specifier (systemd.unit(5), "%%" is a literal %) and "$VAR"/"${VAR}"
# are substituted from the unit's environment ("$$" is a literal $).  Both happen inside quotes as well.
_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def _systemd_specifiers(text: str) -> str:
    return text.replace("%", "%%")


def systemd_arg(value: Any) -> str:
    """One argument of an ExecStart= command line, taken literally by systemd."""
    text = _one_line(value, "systemd ExecStart argument")
    if _SYSTEMD_SAFE.fullmatch(text):
        return _systemd_specifiers(text)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
    return '"' + _systemd_specifiers(escaped) + '"'


def systemd_value(value: Any) -> str:
    """The value of a unit setting that takes the rest of the line (WorkingDirectory=, EnvironmentFile=,
    User=, StandardOutput=append:..., Description=): specifiers escaped; one line, no leading or trailing
    blank (systemd strips them) and no trailing backslash (a line continuation, systemd.syntax(7))."""
    text = _one_line(value, "systemd setting")
    if text != text.strip() or text.endswith("\\"):
        raise ServiceError(f"systemd setting: {text!r} has surrounding blanks or ends in a backslash")
    return _systemd_specifiers(text)


# supervisord reads [program:x] with Python's RawConfigParser (";" or "#" after a blank starts an inline
# comment), expands "%(name)s" in every value ("%%" is a literal %) and splits command= with shlex.split
# (supervisor 4.2: options.py UnhosedConfigParser, ServerOptions.processes_from_section; process.py).
_SUPERVISOR_COMMENT = re.compile(r"\s[;#]")


def supervisor_value(value: Any) -> str:
    """A supervisor setting's value (directory=, user=, stdout_logfile=): % escaped, no inline comment."""
    text = _one_line(value, "supervisor setting")
    if _SUPERVISOR_COMMENT.search(text) or text != text.strip():
        raise ServiceError(f"supervisor setting: {text!r} has a blank before ';' or '#' (an inline comment to "
                           "supervisord) or surrounding blanks")
    return text.replace("%", "%%")


def supervisor_arg(value: Any) -> str:
    """One word of a supervisor command= line: shell-quoted for its shlex.split, then % escaped."""
    return supervisor_value(shell_quote(value))


# Shell, INI, unit files and JSON: every value goes through the filter of the syntax it lands in: q (bash word),
# systemd_arg / systemd_value (unit files), supervisor_arg / supervisor_value (supervisor programs), comment (inside a
# comment line), json (MindIE's config.json).
templates.register(q=shell_quote, json=_json, comment=comment_text, systemd_arg=systemd_arg,
                   systemd_value=systemd_value, supervisor_arg=supervisor_arg, supervisor_value=supervisor_value)


def render_template(name: str, **context: Any) -> str:
    """``templates/<name>`` rendered with ``context`` (an undefined variable is an error)."""
    return templates.render(name, **context)


# --------------------------------------------------------------------------- engine arguments


def engine_args(spec: ServiceSpec) -> tuple[list[str], str | None]:
    """The command-line flags of a vLLM-style engine, each shell-quoted ("--max-num-seqs 256"), in registry
    order, and the ``--additional-config`` JSON (None when no key is set)."""
    lines: list[str] = []
    additional: dict[str, Any] = {}
    for name, entry in engine_params(spec.engine).items():
        if name not in spec.params:
            continue
        value, render = spec.params[name], entry["render"]
        if "additional_config" in render:
            additional[render["additional_config"]] = value
        elif entry["type"] == "bool":
            flag = render["flag"] if value else render.get("false_flag")
            if flag:
                lines.append(flag)
        else:
            text = _json(value) if entry["type"] == "json" else str(value)
            lines.append(f"{render['flag']} {shlex.quote(text)}")
    return lines, (_json(additional) if additional else None)


def _mindie_path(document: Any, dotted: str) -> Any:
    for part in dotted.replace("[", ".[").split("."):
        document = document[int(part[1:-1])] if part.startswith("[") else document[part]
    return document


def _check_mindie_config(text: str, values: Mapping[str, Any]) -> None:
    """Every MindIE parameter landed where the registry says (the template and the registry agree)."""
    document = json.loads(text)
    for name, entry in engine_params("mindie").items():
        path = entry["render"]["config"]
        try:
            found = _mindie_path(document, path)
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"templates/mindie/config.json.j2 has no {path} for {name}") from None
        if found != values[name] or type(found) is not type(values[name]):
            raise RuntimeError(f"templates/mindie/config.json.j2 writes {found!r} at {path}, not {values[name]!r}")


# --------------------------------------------------------------------------- one instance


def _absolute_dir(name: str, value: str) -> str:
    if not value.startswith("/") or any(c.isspace() or c in "%\0" for c in value):
        raise ServiceError(f"{name}: expected an absolute path without blanks or '%', got {value!r}")
    return value.rstrip("/") or "/"


def _env_lines(env: Mapping[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise ServiceError(f"environment {name!r}: not a variable name; use letters, digits and _")
        text = str(value)
        if text != text.strip() or text[:1] in ("'", '"') or any(c in text for c in "\\\n\r\0"):
            raise ServiceError(f"environment {name}: the value cannot be written unquoted to an env file "
                               "(surrounding blanks, a leading quote, a backslash or a line break)")
    return {name: str(value) for name, value in sorted(env.items())}


def instance_env(spec: ServiceSpec, instance: Instance, *, env: Mapping[str, str], config_dir: str) -> dict[str, str]:
    """The instance's environment: engine defaults < the host's NPU environment (``env``) < the service's env
    < what dsctl sets (visible devices, API key, MindIE config path)."""
    merged = {**ENGINE_ENV[spec.engine], **env, **spec.env}
    container = spec.manager == "container"
    # In a container only the instance's /dev/davinciN are mounted and the runtime numbers them from 0.
    merged["ASCEND_RT_VISIBLE_DEVICES"] = (",".join(str(i) for i in range(len(instance.npus))) if container
                                           else instance.visible_devices)
    if spec.engine == "mindie":
        merged["MIES_CONFIG_JSON_PATH"] = posixpath.join(config_dir, instance.name, "config.json")
    if spec.api_key is not None:
        merged["VLLM_API_KEY"] = spec.api_key.get_secret_value()
    return _env_lines(merged)


def render_instance(spec: ServiceSpec, instance: Instance, *, env: Mapping[str, str], config_dir: str,
                    log_dir: str, install_path: str = DEFAULT_INSTALL_PATH,
                    unit_dir: str | None = None) -> list[RenderedFile]:
    """Every file of ``instance``: env file, launch script, MindIE config.json, the manager's unit.

    ``env`` is the host's NPU process environment (`HostSettings.environment`); ``install_path`` its
    ``dsctl_install_path`` (a container uses its image's /usr/local/Ascend); ``unit_dir`` overrides where the
    systemd unit or supervisor program goes.
    """
    config_dir = _absolute_dir("config_dir", config_dir)
    log_dir = _absolute_dir("log_dir", log_dir)
    install_path = _absolute_dir("install_path", install_path)
    container = spec.manager == "container"
    if container:
        install_path = DEFAULT_INSTALL_PATH
    instance_dir = posixpath.join(config_dir, instance.name)
    env_file = posixpath.join(instance_dir, "service.env")
    launch = posixpath.join(instance_dir, "launch.sh")
    owner, group = ("root", "root") if container else (spec.user, spec.group)
    secret = spec.api_key is not None
    common = {"service": spec.name, "instance": instance.name, "index": instance.index, "engine": spec.engine,
              "env_file": env_file, "install_path": install_path,
              "toolkit_set_env": [posixpath.join(install_path, s) for s in _TOOLKIT_SET_ENV],
              "set_env_scripts": [posixpath.join(install_path, s) for s in _SET_ENV[spec.engine]]}

    environment = instance_env(spec, instance, env=env, config_dir=config_dir)
    files = [RenderedFile(env_file, render_template("common/service.env.j2", env=environment, **common),
                          0o600 if secret else 0o640, secret, "env", owner, group)]
    files.append(RenderedFile(launch, _launch(spec, instance, common), 0o750, False, "launch", owner, group))
    if spec.engine == "mindie":
        files.append(RenderedFile(posixpath.join(instance_dir, "config.json"), _mindie_config(spec, instance),
                                  0o640, False, "config", owner, group))
    files.append(_unit(spec, instance, common, instance_dir=instance_dir, launch=launch, log_dir=log_dir,
                       unit_dir=unit_dir))
    return files


def _launch(spec: ServiceSpec, instance: Instance, common: Mapping[str, Any]) -> str:
    container = spec.manager == "container"
    if spec.engine == "mindie":
        service_dir = posixpath.join(common["install_path"], "mindie", "latest", "mindie-service")
        return render_template(_TEMPLATES["mindie"], mindie_service_dir=service_dir, **common)
    lines, additional = engine_args(spec)
    bin_dir = "" if container or spec.venv is None else posixpath.join(spec.venv, "bin")
    context = {**common, "model": spec.model, "served_model_name": spec.served_model_name, "bind": spec.bind,
               "port": instance.port, "tp": spec.tp, "dp": spec.data_parallel_size, "engine_args": lines,
               "additional_config": additional}
    if spec.engine == "lab-engine":
        return render_template(_TEMPLATES["lab-engine"], python=posixpath.join(bin_dir, "python3"),
                               time_scale=spec.time_scale, **context)
    return render_template(_TEMPLATES["vllm-ascend"], vllm=posixpath.join(bin_dir, "vllm"), **context)


def _mindie_config(spec: ServiceSpec, instance: Instance) -> str:
    values = effective_params("mindie", spec.params)
    management_port, metrics_port = instance.extra_ports
    text = render_template(
        "mindie/config.json.j2", p=values, bind=spec.bind, all_zero=spec.bind in ("0.0.0.0", "::"),
        port=instance.port, management_port=management_port, metrics_port=metrics_port,
        # Device ids count within ASCEND_RT_VISIBLE_DEVICES (service.env), which pins the instance's NPUs.
        npu_device_ids=list(range(len(instance.npus))), world_size=len(instance.npus),
        model_name=spec.served_model_name, model_path=spec.model.rstrip("/") or "/", tp=spec.tp,
        dp=spec.data_parallel_size)
    _check_mindie_config(text, values)
    return text


def _unit(spec: ServiceSpec, instance: Instance, common: Mapping[str, Any], *, instance_dir: str, launch: str,
          log_dir: str, unit_dir: str | None) -> RenderedFile:
    log_file = posixpath.join(log_dir, f"{instance.name}.log")
    context = {**common, "unit": instance.unit, "launch": launch, "instance_dir": instance_dir,
               "log_file": log_file, "user": spec.user, "group": spec.group, "port": instance.port,
               "served_model_name": spec.served_model_name}
    if spec.manager == "container":
        model_mount = spec.model.rstrip("/") if spec.model.startswith("/") else None
        text = render_template("managers/container-run.sh.j2", runtime=spec.container_runtime, image=spec.image,
                               devices=[f"/dev/davinci{npu}" for npu in instance.npus],
                               hccn_tool=len(instance.npus) > 1, model_mount=model_mount,
                               cache_mount=spec.container_cache, **context)
        return RenderedFile(posixpath.join(instance_dir, "container-run.sh"), text, 0o750, False, "unit")
    directory = _absolute_dir("unit_dir", unit_dir) if unit_dir else UNIT_DIRS[spec.manager]
    if spec.manager == "systemd":
        text = render_template("managers/systemd.service.j2", **context)
        return RenderedFile(posixpath.join(directory, f"{instance.unit}.service"), text, 0o644, False, "unit")
    text = render_template("managers/supervisor.conf.j2", **context)
    return RenderedFile(posixpath.join(directory, f"{instance.unit}.conf"), text, 0o644, False, "unit")


def render_host(services: Sequence[ServiceSpec], *, npu_count: int, env: Mapping[str, str],
                config_dir: str = DEFAULT_CONFIG_DIR, log_dir: str = DEFAULT_LOG_DIR,
                install_path: str = DEFAULT_INSTALL_PATH,
                unit_dirs: Mapping[str, str] | None = None) -> dict[str, list[RenderedFile]]:
    """Instance name -> its files, for every instance of ``services`` on one host (`plan_host` order)."""
    by_name = {spec.name: spec for spec in services}
    return {instance.name: render_instance(by_name[instance.service], instance, env=env, config_dir=config_dir,
                                           log_dir=log_dir, install_path=install_path,
                                           unit_dir=(unit_dirs or {}).get(by_name[instance.service].manager))
            for instance in plan_host(services, npu_count)}


# --------------------------------------------------------------------------- change detection


def fingerprint(files: Iterable[RenderedFile]) -> str:
    """sha256 (hex) of the files' paths, modes, owners and contents, secrets included: a changed API key
    changes it, yet only the digest leaves this function."""
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.path):
        for part in (item.path, f"{item.mode:o}", f"{item.owner}:{item.group}", item.role):
            digest.update(part.encode() + b"\0")
        content = item.content.encode()
        digest.update(str(len(content)).encode() + b"\0" + content + b"\0")
    return digest.hexdigest()
