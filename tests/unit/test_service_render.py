"""Rendering a service instance's files from templates/ (dsctl.core.serving.service_render)."""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import jinja2
import pytest

from dsctl.assets import templates_dir
from dsctl.core.serving.service import ServiceSpec, engine_params, plan_host, validate_services
from dsctl.core.serving.service_render import (
    RenderedFile,
    engine_args,
    fingerprint,
    render_host,
    render_instance,
    render_template,
)

HOST_ENV = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "TASK_QUEUE_ENABLE": "1"}
CONFIG_DIR = "/etc/dsctl/services"
LOG_DIR = "/var/log/dsctl"
VENV = "/opt/dsctl/serving-venv"
SECRET = "sk-render-secret-42"
# Both listen on every address: without a key that takes allow_unauthenticated (test_service.py has the rule).
CHAT = {"name": "chat", "engine": "vllm-ascend", "model": "/models/DeepSeek-R1-Distill-Qwen-7B",
        "npus_per_instance": 4, "instances": 2, "allow_unauthenticated": True}
MINDIE = {"name": "mi", "engine": "mindie", "model": "/models/Qwen2.5-7B-Instruct/", "npus_per_instance": 4,
          "instances": 2, "allow_unauthenticated": True,
          "params": {"maxBatchSize": 256, "maxPrefillBatchSize": 64, "supportSelectBatch": True}}
DRIVER_MOUNTS = [  # ascend-interfaces.md section 10 (vllm-ascend docs/source/installation.md), read-only
    "/usr/local/dcmi:/usr/local/dcmi:ro",
    "/usr/local/Ascend/driver/tools/hccn_tool:/usr/local/Ascend/driver/tools/hccn_tool:ro",
    "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro",
    "/usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/:ro",
    "/usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info:ro",
    "/etc/ascend_install.info:/etc/ascend_install.info:ro",
]
MANAGER_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]


def specs(*services, npu_count: int = 8, vllm_ascend: str | None = "v0.13.0",
          manager_default: str = "systemd") -> list[ServiceSpec]:
    return validate_services("lab-01", list(services), npu_count=npu_count, vllm_ascend=vllm_ascend,
                             serving_venv=VENV, manager_default=manager_default)


def rendered(*services, npu_count: int = 8, **kwargs) -> dict[str, dict[str, RenderedFile]]:
    """Instance name -> role -> file."""
    hosts = render_host(specs(*services, npu_count=npu_count, **kwargs), npu_count=npu_count, env=HOST_ENV,
                        config_dir=CONFIG_DIR, log_dir=LOG_DIR)
    return {name: {f.role: f for f in files} for name, files in hosts.items()}


def exec_argv(script: str) -> list[str]:
    """The words of the script's `exec` command, continuation lines joined."""
    joined = script.replace("\\\n", " ")
    (line,) = [line for line in joined.splitlines() if line.startswith("exec ")]
    return shlex.split(line)[1:]


def env_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]
    return dict(pairs)


def ini(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, comment_prefixes=("#", ";"))
    parser.optionxform = str  # keys are case-sensitive in unit files
    parser.read_string(text)
    return parser


# --------------------------------------------------------------------------- vllm-ascend


def test_vllm_command_is_exact():
    service = {**CHAT, "params": {
        "max_num_seqs": 64, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.92,
        "enable_chunked_prefill": True, "enable_prefix_caching": False, "enforce_eager": False,
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 8]},
        "multistream_overlap_shared_expert": True, "pa_shape_list": [16, 32]}}
    files = rendered(service)
    assert exec_argv(files["chat-1"]["launch"].content) == [
        f"{VENV}/bin/vllm", "serve", "/models/DeepSeek-R1-Distill-Qwen-7B",
        "--served-model-name", "DeepSeek-R1-Distill-Qwen-7B",
        "--host", "0.0.0.0",
        "--port", "8001",
        "--tensor-parallel-size", "4",
        "--max-num-seqs", "64",
        "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.92",
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--compilation-config", '{"cudagraph_capture_sizes":[1,8],"cudagraph_mode":"FULL_DECODE_ONLY"}',
        "--additional-config", '{"multistream_overlap_shared_expert":true,"pa_shape_list":[16,32]}',
    ]
    launch = files["chat-1"]["launch"]
    assert launch.content.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in launch.content
    assert (launch.path, launch.mode, launch.role) == ("/etc/dsctl/services/chat-1/launch.sh", 0o750, "launch")
    assert (launch.owner, launch.group) == ("dsctl-serve", "HwHiAiUser")


def test_vllm_data_parallel_and_bind():
    files = rendered({**CHAT, "instances": 1, "npus_per_instance": 8, "tensor_parallel_size": 4,
                      "data_parallel_size": 2, "bind": "127.0.0.1", "port": 9000, "served_model_name": "r1"})
    argv = exec_argv(files["chat-0"]["launch"].content)
    assert argv[3:13] == ["--served-model-name", "r1", "--host", "127.0.0.1", "--port", "9000",
                          "--tensor-parallel-size", "4", "--data-parallel-size", "2"]
    assert "--additional-config" not in argv


def test_every_vllm_ascend_parameter_renders():
    """An accepted parameter is never dropped: each one reaches the command line."""
    samples = {"int": lambda e: e.get("choices", [e.get("min", 1)])[0], "float": lambda e: 0.5,
               "bool": lambda e: True, "str": lambda e: "ascend", "enum": lambda e: e["choices"][0],
               "json": lambda e: {} if e.get("shape", "dict") == "dict" else [8]}
    for name, entry in engine_params("vllm-ascend").items():
        version = "v0.12.0rc1" if entry.get("removed_in") else "v0.23.0"
        # Expert parallelism is refused on a dense model (CHAT's): render it for an MoE one.
        model = {"model": "/models/DeepSeek-V2-Lite"} if name == "enable_expert_parallel" else {}
        (spec,) = specs({**CHAT, **model, "params": {name: samples[entry["type"]](entry)}}, vllm_ascend=version)
        lines, additional = engine_args(spec)
        render = entry["render"]
        if "additional_config" in render:
            assert json.loads(additional) == {render["additional_config"]: spec.params[name]}, name
        else:
            assert lines and lines[0].split(" ")[0] == render["flag"], name


def test_api_key_goes_to_a_0600_env_file_only():
    files = rendered({**CHAT, "api_key": SECRET})
    for instance in ("chat-0", "chat-1"):
        env = files[instance]["env"]
        assert (env.path, env.mode, env.secret, env.role) == (
            f"/etc/dsctl/services/{instance}/service.env", 0o600, True, "env")
        assert (env.owner, env.group) == ("dsctl-serve", "HwHiAiUser")
        assert env_lines(env.content)["VLLM_API_KEY"] == SECRET
        assert SECRET not in repr(env)
        for role in ("launch", "unit"):
            assert SECRET not in files[instance][role].content
            assert not files[instance][role].secret
        assert "--api-key" not in exec_argv(files[instance]["launch"].content)


def test_env_file_without_a_key_and_its_precedence():
    files = rendered({**CHAT, "env": {"TASK_QUEUE_ENABLE": 2, "HCCL_BUFFSIZE": 1024}})
    env = files["chat-1"]["env"]
    assert (env.mode, env.secret) == (0o640, False)
    assert env_lines(env.content) == {
        "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7",
        "HCCL_BUFFSIZE": "1024",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "2",  # the service's env wins over the host's
    }
    assert env_lines(files["chat-0"]["env"].content)["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"


def test_launch_script_runs_the_engine_with_the_instance_environment(tmp_path):
    """Run the rendered launch.sh against a fake venv: argv and environment as the engine sees them."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "vllm"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$OUT.args"\n'
                    'printf "%s|%s|%s\\n" "$ASCEND_RT_VISIBLE_DEVICES" "$VLLM_API_KEY" "$TASK_QUEUE_ENABLE" '
                    '> "$OUT.env"\n')
    fake.chmod(0o755)
    (spec,) = validate_services("lab-01", [{**CHAT, "api_key": SECRET, "params": {"max_num_seqs": 8}}],
                                npu_count=8, vllm_ascend="v0.13.0", serving_venv=str(venv))
    instance = plan_host([spec], 8)[1]
    config_dir = tmp_path / "services"
    files = render_instance(spec, instance, env={"TASK_QUEUE_ENABLE": "2"}, config_dir=str(config_dir),
                            log_dir=str(tmp_path / "log"), install_path=str(tmp_path / "Ascend"))
    for item in files:
        if item.role in ("env", "launch"):
            Path(item.path).parent.mkdir(parents=True, exist_ok=True)
            Path(item.path).write_text(item.content)
            os.chmod(item.path, item.mode)
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(config_dir / "chat-1" / "launch.sh")], capture_output=True, text=True,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OUT": str(out)}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert Path(f"{out}.args").read_text().split("\n")[:3] == ["serve", "/models/DeepSeek-R1-Distill-Qwen-7B",
                                                               "--served-model-name"]
    assert "--max-num-seqs\n8\n" in Path(f"{out}.args").read_text()
    assert Path(f"{out}.env").read_text() == f"4,5,6,7|{SECRET}|2\n"


# --------------------------------------------------------------------------- MindIE


def test_mindie_config_json():
    files = rendered(MINDIE)
    for index, (port, devices) in enumerate(((1025, "0,1,2,3"), (1028, "4,5,6,7"))):
        instance = files[f"mi-{index}"]
        config = instance["config"]
        assert (config.path, config.mode, config.role, config.secret) == (
            f"/etc/dsctl/services/mi-{index}/config.json", 0o640, "config", False)
        document = json.loads(config.content)
        assert document["Version"] == "1.0.0"
        server = document["ServerConfig"]
        assert (server["ipAddress"], server["allowAllZeroIpListening"], server["httpsEnabled"]) == (
            "0.0.0.0", True, False)
        assert (server["port"], server["managementPort"], server["metricsPort"]) == (port, port + 1, port + 2)
        backend = document["BackendConfig"]
        assert backend["npuDeviceIds"] == [[0, 1, 2, 3]]
        assert backend["multiNodesInferEnabled"] is False
        model = backend["ModelDeployConfig"]["ModelConfig"][0]
        assert (model["modelName"], model["modelWeightPath"], model["worldSize"]) == (
            "Qwen2.5-7B-Instruct", "/models/Qwen2.5-7B-Instruct", 4)
        assert "tp" not in model and "dp" not in model
        assert (model["npuMemSize"], model["backendType"]) == (-1, "atb")
        schedule = backend["ScheduleConfig"]
        assert (schedule["maxBatchSize"], schedule["maxPrefillBatchSize"], schedule["supportSelectBatch"]) == (
            256, 64, True)
        assert (schedule["cacheBlockSize"], schedule["maxPrefillTokens"], schedule["maxQueueDelayMicroseconds"]) == (
            128, 8192, 5000)
        assert backend["ModelDeployConfig"]["maxSeqLen"] == 8192
        env = env_lines(instance["env"].content)
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == devices
        assert env["MIES_CONFIG_JSON_PATH"] == config.path
        assert env["MINDIE_LOG_TO_STDOUT"] == "1"
        assert exec_argv(instance["launch"].content) == ["./bin/mindieservice_daemon"]
        assert "cd /usr/local/Ascend/mindie/latest/mindie-service\n" in instance["launch"].content
        assert "/usr/local/Ascend/mindie/set_env.sh" in instance["launch"].content


def test_mindie_every_parameter_lands_and_dp_is_written():
    values = {"maxBatchSize": 512, "maxPrefillBatchSize": 100, "maxPrefillTokens": 16384,
              "prefillTimeMsPerReq": 100, "decodeTimeMsPerReq": 40, "prefillPolicyType": 1, "decodePolicyType": 3,
              "supportSelectBatch": True, "maxQueueDelayMicroseconds": 2000, "maxPreemptCount": 10,
              "maxIterTimes": 2048, "cacheBlockSize": 64, "maxSeqLen": 32768, "maxInputTokenLen": 30000,
              "truncation": True, "npuMemSize": 20, "cpuMemSize": 0, "backendType": "ms",
              "trustRemoteCode": True, "maxLinkNum": 300}
    assert set(values) == set(engine_params("mindie"))
    files = rendered({**MINDIE, "instances": 1, "npus_per_instance": 8, "tensor_parallel_size": 4,
                      "data_parallel_size": 2, "bind": "10.0.0.5", "params": values})
    document = json.loads(files["mi-0"]["config"].content)
    backend = document["BackendConfig"]
    assert backend["ScheduleConfig"]["maxPrefillTokens"] == 16384
    assert backend["ModelDeployConfig"]["ModelConfig"][0]["npuMemSize"] == 20
    assert document["ServerConfig"]["maxLinkNum"] == 300
    assert (document["ServerConfig"]["ipAddress"], document["ServerConfig"]["allowAllZeroIpListening"]) == (
        "10.0.0.5", False)
    model = backend["ModelDeployConfig"]["ModelConfig"][0]
    assert (model["worldSize"], model["tp"], model["dp"]) == (8, 4, 2)
    assert backend["npuDeviceIds"] == [list(range(8))]


# --------------------------------------------------------------------------- managers


def test_systemd_unit_keys():
    unit = rendered(CHAT)["chat-1"]["unit"]
    assert (unit.path, unit.mode, unit.role, unit.owner) == ("/etc/systemd/system/dsctl-chat-1.service", 0o644,
                                                            "unit", "root")
    parsed = ini(unit.content)
    service = parsed["Service"]
    assert service["User"] == "dsctl-serve" and service["User"] != "root"
    assert service["Group"] == "HwHiAiUser"
    assert service["EnvironmentFile"] == "/etc/dsctl/services/chat-1/service.env"
    assert service["ExecStart"] == "/bin/bash /etc/dsctl/services/chat-1/launch.sh"
    assert service["WorkingDirectory"] == "/etc/dsctl/services/chat-1"
    assert (service["Restart"], service["KillMode"], service["LimitNOFILE"]) == ("on-failure", "mixed", "65536")
    assert service["StandardOutput"] == "append:/var/log/dsctl/chat-1.log"
    assert parsed["Unit"]["After"] == "network-online.target"
    assert parsed["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    for files in rendered(CHAT, {**MINDIE, "port": 2000}, npu_count=16).values():
        unit = files["unit"]
        path = tmp_path / Path(unit.path).name
        path.write_text(unit.content)
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True,
                                text=True, timeout=120)
        ours = [line for line in (result.stdout + result.stderr).splitlines() if path.name in line]
        assert result.returncode == 0, result.stdout + result.stderr
        assert ours == [], ours


def test_supervisor_program():
    files = rendered({**CHAT, "manager": "supervisor"})
    unit = files["chat-0"]["unit"]
    assert (unit.path, unit.mode) == ("/etc/supervisor/conf.d/dsctl-chat-0.conf", 0o644)
    parsed = ini(unit.content)
    assert parsed.sections() == ["program:dsctl-chat-0"]
    program = parsed["program:dsctl-chat-0"]
    assert program["command"] == "/bin/bash /etc/dsctl/services/chat-0/launch.sh"
    assert program["user"] == "dsctl-serve"
    assert (program["stopasgroup"], program["killasgroup"]) == ("true", "true")
    assert (program["autostart"], program["autorestart"]) == ("true", "false")
    assert (program["redirect_stderr"], program["stdout_logfile"]) == ("true", "/var/log/dsctl/chat-0.log")
    assert "environment" not in program  # launch.sh reads service.env


def test_container_run_command():
    service = {**CHAT, "manager": "container", "image": "quay.io/ascend/vllm-ascend:v0.13.0",
               "api_key": SECRET}
    files = rendered(service)
    run = files["chat-1"]["unit"]
    assert (run.path, run.mode, run.role, run.secret) == ("/etc/dsctl/services/chat-1/container-run.sh", 0o750,
                                                          "unit", False)
    argv = exec_argv(run.content)
    assert argv[:3] == ["docker", "run", "--detach"]
    assert argv[argv.index("--name") + 1] == "dsctl-chat-1"
    assert "--net=host" in argv
    devices = [argv[i + 1] for i, word in enumerate(argv) if word == "--device"]
    assert devices == ["/dev/davinci4", "/dev/davinci5", "/dev/davinci6", "/dev/davinci7", *MANAGER_DEVICES]
    mounts = [argv[i + 1] for i, word in enumerate(argv) if word == "-v"]
    assert mounts[:len(DRIVER_MOUNTS)] == DRIVER_MOUNTS
    assert "/models/DeepSeek-R1-Distill-Qwen-7B:/models/DeepSeek-R1-Distill-Qwen-7B:ro" in mounts
    assert "/etc/dsctl/services/chat-1:/etc/dsctl/services/chat-1:ro" in mounts
    assert argv[argv.index("--env-file") + 1] == "/etc/dsctl/services/chat-1/service.env"
    assert argv[-2:] == ["quay.io/ascend/vllm-ascend:v0.13.0", "/etc/dsctl/services/chat-1/launch.sh"]
    assert SECRET not in run.content
    # Inside the container the engine is the image's, and the NPUs are numbered from 0.
    assert exec_argv(files["chat-1"]["launch"].content)[0] == "vllm"
    assert env_lines(files["chat-1"]["env"].content)["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    assert (files["chat-1"]["env"].owner, files["chat-1"]["env"].mode) == ("root", 0o600)


def test_container_mounts_nothing_of_the_host_writable_but_the_cache_a_service_asks_for():
    base = {**CHAT, "manager": "container", "image": "quay.io/ascend/vllm-ascend:v0.13.0"}
    for service, writable in ((base, []), ({**base, "container_cache": "/var/cache/dsctl/chat"},
                                           ["/var/cache/dsctl/chat:/root/.cache"])):
        argv = exec_argv(rendered(service)["chat-1"]["unit"].content)
        mounts = [argv[i + 1] for i, word in enumerate(argv) if word == "-v"]
        assert [m for m in mounts if not m.endswith(":ro")] == writable, mounts
    with pytest.raises(Exception, match="container_cache"):
        rendered({**CHAT, "container_cache": "/var/cache/dsctl/chat"})  # not a container: refused


def test_container_single_npu_and_podman():
    files = rendered({**CHAT, "manager": "container", "image": "localhost/engine:1", "npus_per_instance": 1,
                      "instances": 1, "container_runtime": "podman", "model": "deepseek-ai/DeepSeek-R1"})
    argv = exec_argv(files["chat-0"]["unit"].content)
    assert argv[:2] == ["podman", "run"]
    mounts = [argv[i + 1] for i, word in enumerate(argv) if word == "-v"]
    assert not any("hccn_tool" in mount for mount in mounts)  # single-card runs drop it
    assert not any(mount.startswith("deepseek-ai") for mount in mounts)
    assert [argv[i + 1] for i, w in enumerate(argv) if w == "--device"] == ["/dev/davinci0", *MANAGER_DEVICES]


def test_unit_dir_override():
    (spec,) = specs({**CHAT, "manager": "supervisor", "instances": 1})
    files = render_instance(spec, plan_host([spec], 8)[0], env={}, config_dir="/srv/dsctl/", log_dir="/srv/log",
                            unit_dir="/etc/supervisord.d")
    paths = {f.role: f.path for f in files}
    assert paths == {"env": "/srv/dsctl/chat-0/service.env", "launch": "/srv/dsctl/chat-0/launch.sh",
                     "unit": "/etc/supervisord.d/dsctl-chat-0.conf"}


# --------------------------------------------------------------------------- lab-engine


def test_lab_engine_command():
    files = rendered({"name": "lab", "engine": "lab-engine", "model": "deepseek-r1-distill-qwen-7b",
                      "npus_per_instance": 1, "instances": 2, "manager": "supervisor", "time_scale": 0.01,
                      "allow_unauthenticated": True,
                      "params": {"max_num_seqs": 32, "stream_num": 4, "kv_sparse_threshold": 0.2, "seed": 7}},
                     vllm_ascend=None)
    assert exec_argv(files["lab-1"]["launch"].content) == [
        f"{VENV}/bin/python3", "-m", "dsctl.engine", "serve", "deepseek-r1-distill-qwen-7b",
        "--served-model-name", "deepseek-r1-distill-qwen-7b",
        "--host", "0.0.0.0",
        "--port", "8001",
        "--tensor-parallel-size", "1",
        "--max-num-seqs", "32",
        "--stream-num", "4",
        "--kv-sparse-threshold", "0.2",
        "--seed", "7",
        "--time-scale", "0.01",
    ]
    assert env_lines(files["lab-1"]["env"].content)["ASCEND_RT_VISIBLE_DEVICES"] == "1"


def test_lab_engine_parser_accepts_the_rendered_command():
    from dsctl.engine.__main__ import build_parser

    files = rendered({"name": "lab", "engine": "lab-engine", "model": "deepseek-r1-distill-qwen-7b",
                      "npus_per_instance": 2, "time_scale": 0.5, "api_key": SECRET,
                      "params": {"max_num_seqs": 16, "max_num_batched_tokens": 4096, "max_model_len": 8192,
                                 "gpu_memory_utilization": 0.8, "enable_chunked_prefill": False, "block_size": 128,
                                 "enforce_eager": True, "quantization": "w8a8", "dtype": "bfloat16",
                                 "trust_remote_code": True, "stream_num": 2, "kv_sparse_threshold": 0.1,
                                 "chip": "910B3", "seed": 1, "jitter": 0.05, "startup": 1.0}},
                     vllm_ascend=None)
    args = build_parser().parse_args(exec_argv(files["lab-0"]["launch"].content)[3:])
    assert (args.max_num_seqs, args.enable_chunked_prefill, args.stream_num, args.time_scale) == (16, False, 2, 0.5)
    assert args.api_key is None  # from VLLM_API_KEY in service.env


# --------------------------------------------------------------------------- fingerprints


def test_one_parameter_changes_one_instance_fingerprint():
    first = {**CHAT, "instances": 1, "params": {"max_num_seqs": 64}}
    second = {**CHAT, "name": "embed", "instances": 1, "port": 9000, "params": {"max_num_seqs": 32}}
    before = {name: fingerprint(files.values()) for name, files in rendered(first, second).items()}
    changed = {**second, "params": {"max_num_seqs": 48}}
    after = {name: fingerprint(files.values()) for name, files in rendered(first, changed).items()}
    assert set(before) == {"chat-0", "embed-0"}
    assert [name for name in before if before[name] != after[name]] == ["embed-0"]


def test_fingerprint_covers_the_secret_without_showing_it():
    one = rendered({**CHAT, "api_key": SECRET})
    two = rendered({**CHAT, "api_key": SECRET + "x"})
    digest = fingerprint(one["chat-0"].values())
    assert len(digest) == 64 and SECRET not in digest
    assert digest != fingerprint(two["chat-0"].values())
    assert digest == fingerprint(reversed(list(one["chat-0"].values())))  # order-independent


# --------------------------------------------------------------------------- the templates


def test_templates_are_strict():
    with pytest.raises(jinja2.UndefinedError):
        render_template("vllm-ascend/launch.sh.j2", instance="x")


def test_every_template_is_documented():
    root = templates_dir()
    readme = (root / "README.md").read_text()
    templates = sorted(str(p.relative_to(root)) for p in root.rglob("*.j2"))
    assert templates == ["common/launch-env.sh.j2", "common/service.env.j2", "gateway/dsctl-gateway.service.j2",
                         "gateway/nginx.conf.j2", "lab-engine/launch.sh.j2",
                         "managers/container-run.sh.j2", "managers/supervisor.conf.j2", "managers/systemd.service.j2",
                         "mindie/config.json.j2", "mindie/launch.sh.j2", "vllm-ascend/launch-node.sh.j2",
                         "vllm-ascend/launch.sh.j2"]
    for name in templates:
        assert f"`{name}`" in readme, name
    assert "dsctl.core.serving.service_render" in readme


def test_rendered_files_are_plain_text_with_a_final_newline():
    for files in rendered(CHAT, {**MINDIE, "manager": "container", "image": "mindie:2.1"}, npu_count=16).values():
        for item in files.values():
            assert item.content.endswith("\n") and not item.content.endswith("\n\n\n"), item.path
            assert stat.S_IMODE(item.mode) == item.mode


# --------------------------------------------------------------------------- hostile values
# A path setting is refused by the schema unless it is of a safe character set (test_service.py,
# test_inventory_schema.py); the renderer quotes every value anyway.  Each value below would run
# `touch <mark>` if a rendered file let a shell see it.

INJECTIONS = {
    "command substitution": "$(touch${{IFS}}{mark})",
    "backquotes": "`touch${{IFS}}{mark}`",
    "single quote": "';touch${{IFS}}{mark};'",
    "double quote": '";touch${{IFS}}{mark};"',
    "variable": "${{IFS}}$HOME$(touch${{IFS}}{mark})",
}
SUPERVISOR_PYTHON = "/usr/bin/python3"  # supervisord's own interpreter (Debian's supervisor package)


def hostile(tmp_path: Path, kind: str, name: str) -> str:
    """An absolute directory under tmp_path whose name carries the injection ``kind``."""
    return f"{tmp_path}/{name}-" + INJECTIONS[kind].format(mark=f"{tmp_path}/owned-{name}")


def install(files: list[RenderedFile]) -> None:
    for item in files:
        Path(item.path).parent.mkdir(parents=True, exist_ok=True)
        Path(item.path).write_text(item.content)
        os.chmod(item.path, item.mode)


def recorder(directory: Path, name: str) -> Path:
    """A program ``name`` that appends its arguments, one per line, to $OUT."""
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / name
    program.write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$OUT"\nprintf -- "--\\n" >> "$OUT"\n')
    program.chmod(0o755)
    return program


def owned(tmp_path: Path) -> list[Path]:
    """The marks an injection would have touched (tmp_path/owned-<name>; the hostile directories themselves
    only hold the text "owned-..." deeper down)."""
    return sorted(tmp_path.glob("owned-*"))


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_container_run_script_takes_hostile_paths_literally(tmp_path, kind):
    (spec,) = specs({**CHAT, "instances": 1, "manager": "container", "image": "quay.io/ascend/vllm-ascend:v0.13.0"})
    config_dir, log_dir = hostile(tmp_path, kind, "config"), hostile(tmp_path, kind, "log")
    files = render_instance(spec, plan_host([spec], 8)[0], env=HOST_ENV, config_dir=config_dir, log_dir=log_dir)
    install(files)
    script = next(f.path for f in files if f.role == "unit")
    assert subprocess.run(["bash", "-n", script], capture_output=True, timeout=30).returncode == 0
    recorder(tmp_path / "bin", "docker")
    out = tmp_path / "docker-argv"
    result = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(out)})
    assert result.returncode == 0, result.stderr
    assert owned(tmp_path) == []
    remove, run = out.read_text().split("--\n")[:2]
    assert remove.splitlines() == ["rm", "--force", "dsctl-chat-0"]
    argv = run.splitlines()
    instance_dir = f"{config_dir}/chat-0"
    assert f"{instance_dir}:{instance_dir}:ro" in argv
    assert argv[argv.index("--env-file") + 1] == f"{instance_dir}/service.env"
    assert argv[-2:] == ["quay.io/ascend/vllm-ascend:v0.13.0", f"{instance_dir}/launch.sh"]


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_launch_script_takes_hostile_paths_literally(tmp_path, kind):
    venv = tmp_path / "venv"
    recorder(venv / "bin", "vllm")
    (spec,) = validate_services("lab-01", [{**CHAT, "instances": 1}], npu_count=8, vllm_ascend="v0.13.0",
                                serving_venv=str(venv))
    config_dir, install_path = hostile(tmp_path, kind, "config"), hostile(tmp_path, kind, "Ascend")
    files = render_instance(spec, plan_host([spec], 8)[0], env=HOST_ENV, config_dir=config_dir,
                            log_dir=hostile(tmp_path, kind, "log"), install_path=install_path)
    install(files)
    Path(install_path, "nnal", "atb").mkdir(parents=True)  # a set_env.sh that exists is sourced
    Path(install_path, "nnal", "atb", "set_env.sh").write_text("export FROM_SET_ENV=1\n")
    launch = f"{config_dir}/chat-0/launch.sh"
    assert subprocess.run(["bash", "-n", launch], capture_output=True, timeout=30).returncode == 0
    out = tmp_path / "vllm-argv"
    result = subprocess.run(["bash", launch], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(out)})
    assert result.returncode == 0, result.stderr
    assert owned(tmp_path) == []
    assert out.read_text().splitlines()[:2] == ["serve", "/models/DeepSeek-R1-Distill-Qwen-7B"]


def systemd_words(line: str) -> list[str]:
    """An ExecStart= value split as systemd.service(5) "Command lines" documents: words at blanks, "..." with
    C escapes, then "%%" -> "%" (specifiers, systemd.unit(5)) and "$$" -> "$" (variable substitution)."""
    words, word, quoted, index, started = [], "", False, 0, False
    while index < len(line):
        char = line[index]
        if quoted and char == "\\":
            word, index = word + line[index + 1], index + 2
            continue
        if char == '"':
            quoted, started, index = not quoted, True, index + 1
            continue
        if char.isspace() and not quoted:
            if started:
                words.append(word)
            word, started, index = "", False, index + 1
            continue
        word, started, index = word + char, True, index + 1
    if started:
        words.append(word)
    # What systemd would substitute shows up as <...>: a test comparing with the literal path then fails.
    return [re.sub(r"%%|%\w|\$\$|\$\{\w+\}|\$\w+",
                   lambda m: {"%%": "%", "$$": "$"}.get(m.group(), f"<{m.group()}>"), word) for word in words]


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_systemd_unit_takes_hostile_paths_literally(tmp_path, kind):
    (spec,) = specs({**CHAT, "instances": 1})
    config_dir, log_dir = hostile(tmp_path, kind, "config"), hostile(tmp_path, kind, "log")
    (unit,) = [f for f in render_instance(spec, plan_host([spec], 8)[0], env=HOST_ENV, config_dir=config_dir,
                                          log_dir=log_dir, unit_dir=str(tmp_path / "units")) if f.role == "unit"]
    service = ini(unit.content)["Service"]
    assert systemd_words(service["ExecStart"]) == ["/bin/bash", f"{config_dir}/chat-0/launch.sh"]
    assert service["WorkingDirectory"] == f"{config_dir}/chat-0"  # no "%" here: nothing for systemd to expand
    assert service["StandardOutput"] == f"append:{log_dir}/chat-0.log"
    if shutil.which("systemd-analyze") is not None:
        path = tmp_path / "dsctl-chat-0.service"
        path.write_text(unit.content)
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True,
                                text=True, timeout=120)
        assert [line for line in (result.stdout + result.stderr).splitlines() if path.name in line] == []


@pytest.mark.parametrize(("value", "expected"), [
    ("/srv/plain/launch.sh", "/srv/plain/launch.sh"),
    ("/srv/100%/$HOME/a b/launch.sh", '"/srv/100%%/$$HOME/a b/launch.sh"'),
    ('/srv/"q"/\\x', '"/srv/\\"q\\"/\\\\x"'),
])
def test_systemd_escaping_follows_systemds_rules(value, expected):
    from dsctl.core.serving.service_render import systemd_arg, systemd_value

    assert systemd_arg(value) == expected
    assert systemd_words(f"/bin/bash {systemd_arg(value)}") == ["/bin/bash", value]
    assert systemd_value("/srv/100%/logs") == "/srv/100%%/logs"


def test_no_value_may_span_lines():
    from dsctl.core.serving.service import ServiceError
    from dsctl.core.serving.service_render import comment_text, shell_quote, supervisor_value, systemd_value

    for escape in (shell_quote, comment_text, systemd_value, supervisor_value):
        with pytest.raises(ServiceError, match="spans lines"):
            escape("/srv/a\ntouch /owned")
    with pytest.raises(ServiceError, match="inline comment"):
        supervisor_value("/srv/a ;b")


@pytest.mark.skipif(subprocess.run([SUPERVISOR_PYTHON, "-c", "import supervisor"], capture_output=True).returncode,
                    reason="supervisor is not installed")
@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_supervisor_program_takes_hostile_paths_literally(tmp_path, kind):
    """supervisord's own parser (ServerOptions, the %-expansion and the shlex split of command=) reads the
    rendered program; it needs an existing user and log directory: the user running the test, and the log dir.
    (The schema refuses shared accounts such as nobody, so the spec names dsctl-serve and the program is given
    the user that exists here.)"""
    (spec,) = specs({**CHAT, "instances": 1, "manager": "supervisor"})
    config_dir, log_dir = hostile(tmp_path, kind, "config"), hostile(tmp_path, kind, "log")
    (unit,) = [f for f in render_instance(spec, plan_host([spec], 8)[0], env=HOST_ENV, config_dir=config_dir,
                                          log_dir=log_dir, unit_dir=str(tmp_path / "conf.d")) if f.role == "unit"]
    here = pwd.getpwuid(os.getuid()).pw_name
    unit = dataclasses.replace(unit, content=unit.content.replace("\nuser=dsctl-serve\n", f"\nuser={here}\n"))
    install([unit])
    Path(log_dir).mkdir(parents=True)
    main = tmp_path / "supervisord.conf"
    main.write_text(f"[supervisord]\nlogfile={tmp_path}/supervisord.log\npidfile={tmp_path}/supervisord.pid\n"
                    f"[include]\nfiles={unit.path}\n")
    reader = ("import json, shlex, sys\nfrom supervisor.options import ServerOptions\n"
              "options = ServerOptions()\noptions.configfile = sys.argv[1]\noptions.process_config(do_usage=False)\n"
              "(group,) = options.process_group_configs\n(program,) = group.process_configs\n"
              "print(json.dumps({'name': program.name, 'argv': shlex.split(program.command),\n"
              "                  'directory': program.directory, 'log': program.stdout_logfile}))\n")
    result = subprocess.run([SUPERVISOR_PYTHON, "-c", reader, str(main)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": "dsctl-chat-0",
                                         "argv": ["/bin/bash", f"{config_dir}/chat-0/launch.sh"],
                                         "directory": f"{config_dir}/chat-0", "log": f"{log_dir}/chat-0.log"}
    assert owned(tmp_path) == []


def test_a_crash_loop_cannot_exhaust_the_start_limit():
    """A limit (StartLimitBurst=3 an hour) would be spent by a crash-looping candidate during the health wait and
    systemd would then refuse the rollback's restart: the unit has none (StartLimitIntervalSec=0)."""
    parsed = ini(rendered(CHAT)["chat-0"]["unit"].content)
    assert parsed["Unit"]["StartLimitIntervalSec"] == "0"
    assert "StartLimitBurst" not in parsed["Unit"] and "StartLimitBurst" not in parsed["Service"]
    assert (parsed["Service"]["Restart"], parsed["Service"]["RestartSec"]) == ("on-failure", "30")
