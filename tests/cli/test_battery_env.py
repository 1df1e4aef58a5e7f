"""Battery, class 4 (issue 41): the NPU env (dsctl_ascend_env, written to a profile.d script every login shell
sources) takes upper-case names only and never a loader or search-path variable, refused by the schema naming the
variable before any host (dsctl.core.fleet.ascend_env.check_name); and no value, of the NPU env or of a service's
env, is ever evaluated by a shell on its way to the process (shown by sourcing and running what dsctl renders)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dsctl.core.fleet import ascend_env
from dsctl.core.serving.service import plan_host, validate_services
from dsctl.core.serving.service_render import render_instance

from .battery import assert_names, refusal, site

CHAT = {"name": "chat", "engine": "lab-engine", "model": "/models/m", "npus_per_instance": 1, "bind": "127.0.0.1"}

# (id, dsctl_ascend_env, the words the line must name)
CASES = [
    ("LD_PRELOAD", {"LD_PRELOAD": "/tmp/evil.so"}, ["dsctl_ascend_env.LD_PRELOAD", "dynamic loader"]),
    ("PATH=/tmp/evil", {"PATH": "/tmp/evil"}, ["dsctl_ascend_env.PATH", "refused in the NPU env"]),
    ("lower_case", {"lower_case": "x"}, ["dsctl_ascend_env.lower_case", "LOWER_CASE"]),
    # more of the class
    ("LD_LIBRARY_PATH", {"LD_LIBRARY_PATH": "/tmp"}, ["dsctl_ascend_env.LD_LIBRARY_PATH", "dynamic loader"]),
    ("LD_AUDIT", {"LD_AUDIT": "/tmp/a.so"}, ["dsctl_ascend_env.LD_AUDIT"]),
    ("PYTHONPATH", {"PYTHONPATH": "/tmp"}, ["dsctl_ascend_env.PYTHONPATH", "Python"]),
    ("PYTHONSTARTUP", {"PYTHONSTARTUP": "/tmp/x.py"}, ["dsctl_ascend_env.PYTHONSTARTUP"]),
    ("BASH_ENV", {"BASH_ENV": "/tmp/x"}, ["dsctl_ascend_env.BASH_ENV", "bash"]),
    ("IFS", {"IFS": "/"}, ["dsctl_ascend_env.IFS"]),
    ("Mixed_Case", {"Mixed_Case": "1"}, ["dsctl_ascend_env.Mixed_Case", "upper-case"]),
    ("a leading digit", {"1ABC": "1"}, ["dsctl_ascend_env.1ABC", "upper-case"]),
    ("removal of a lower-case name", {"lower_case": None}, ["dsctl_ascend_env.lower_case"]),
]


@pytest.mark.parametrize(("case", "env", "words"), CASES, ids=[case[0] for case in CASES])
def test_an_npu_env_name_outside_the_rule_is_refused_before_any_host(capsys, tmp_path, sentinel, case, env, words):
    inventory = site(tmp_path, sentinel, {"dsctl_ascend_env": env})
    assert_names(refusal(capsys, sentinel, ["deploy", inventory, "--render"], exits=(2,)), *words)


@pytest.mark.parametrize("env", [{"lower_case": "x"}, {"LD_PRELOAD": "/tmp/evil.so"}], ids=["lower_case", "LD_PRELOAD"])
def test_provision_check_refuses_them_before_any_host(capsys, tmp_path, sentinel, env):
    inventory = site(tmp_path, sentinel, {"dsctl_ascend_env": env})
    assert_names(refusal(capsys, sentinel, ["provision", inventory, "--check"], exits=(2,)), *env)


# --------------------------------------------------------------------------- values: no shell evaluates them

HOSTILE = ["$(touch {marker})", "`touch {marker}`", "'; touch {marker}; '", "\"; touch {marker}; \"",
           "${{IFS}}$(touch {marker})", "a;touch {marker}", "$HOME|touch {marker}&"]


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("template", HOSTILE)
def test_the_profile_script_holds_npu_env_values_literally(tmp_path, shell, template):
    """dsctl_env_file is sourced by every login shell (sh and bash): each value comes out as written, nothing runs."""
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    marker = tmp_path / "ran"
    value = template.format(marker=marker)
    env = ascend_env.resolve_env({"MY_VAR": value})  # the schema's rule: an unknown upper-case name, value as given
    script = tmp_path / "dsctl-ascend.sh"
    script.write_text(ascend_env.render_env_file(env, toolkit_set_env=str(tmp_path / "none1"),
                                                 nnal_set_env=str(tmp_path / "none2")))
    result = subprocess.run([shell, "-c", f'. "{script}"; printf %s "$MY_VAR"'], capture_output=True, text=True,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == value
    assert not marker.exists()
    assert ascend_env.parse_env_file(script.read_text())["MY_VAR"] == value  # dsctl check reads it back the same


@pytest.mark.parametrize("template", [t for t in HOSTILE if not t.startswith(("'", '"'))])
def test_the_launch_script_takes_service_and_npu_env_values_literally(tmp_path, template):
    """service.env (systemd's EnvironmentFile=, docker's --env-file, and launch.sh's own read loop) holds a service's
    env and the host's NPU env; launch.sh exports each line without evaluating it.  (systemd.exec(5): EnvironmentFile
    lines are assignments, no shell runs them; docker run --env-file takes each line as it is.)"""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    marker = tmp_path / "ran"
    value = template.format(marker=marker)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "vllm"
    fake.write_text('#!/bin/sh\nprintf "%s\\n%s" "$SERVICE_VAR" "$NPU_VAR" > "$OUT"\n')
    fake.chmod(0o755)
    (spec,) = validate_services("lab-01", [{**CHAT, "engine": "vllm-ascend", "env": {"SERVICE_VAR": value}}],
                                npu_count=8, vllm_ascend="v0.13.0", serving_venv=str(venv))
    host_env = ascend_env.resolve_env({"NPU_VAR": value})
    config_dir = tmp_path / "services"
    files = render_instance(spec, plan_host([spec], 8)[0], env=host_env, config_dir=str(config_dir),
                            log_dir=str(tmp_path / "log"), install_path=str(tmp_path / "Ascend"))
    for item in files:
        if item.role in ("env", "launch"):
            Path(item.path).parent.mkdir(parents=True, exist_ok=True)
            Path(item.path).write_text(item.content)
    env_file = (config_dir / "chat-0" / "service.env").read_text()
    assert f"SERVICE_VAR={value}\n" in env_file and f"NPU_VAR={value}\n" in env_file  # written unquoted, as is
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(config_dir / "chat-0" / "launch.sh")], capture_output=True, text=True,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OUT": str(out)}, cwd=tmp_path,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"{value}\n{value}"
    assert not marker.exists()
