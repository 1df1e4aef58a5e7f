"""`dsctl deploy --render` on the sample inventory: what deploy would write, rendered without any host."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample" / "hosts.yml"
SAMPLE_KEY = "replace-me-with-your-own-key-then-encrypt-this-file"  # inventories/sample/.../vault.yml
ANSIBLE_VAULT = Path(sys.executable).parent / "ansible-vault"


def dsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsctl", *args], capture_output=True, text=True, timeout=120)


def test_the_sample_inventory_renders_two_tp4_instances_per_host_under_systemd():
    result = dsctl("deploy", str(SAMPLE), "--render", "--json")
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)["data"]
    units = {(f["host"], f["path"]) for f in files if f["path"].endswith(".service")}
    assert units == {(host, f"/etc/systemd/system/dsctl-chat-{i}.service")
                     for host in ("atlas-a01", "atlas-a02") for i in (0, 1)}
    launch = next(f["content"] for f in files if f["host"] == "atlas-a01" and f["path"].endswith("chat-1/launch.sh"))
    assert "vllm serve /models/DeepSeek-R1-Distill-Qwen-7B" in launch and "--port 8001" in launch
    # The sample's api_key is "{{ vault_chat_api_key }}": rendered by Ansible, it makes the env file secret.
    env = next(f for f in files if f["host"] == "atlas-a01" and f["path"].endswith("chat-1/service.env"))
    assert env["mode"] == "0600" and env["content"] == "(holds the API key; not shown)"
    assert SAMPLE_KEY not in result.stdout + result.stderr


def test_an_unknown_engine_parameter_is_refused_before_any_host(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(SAMPLE.read_text())
    group_vars = tmp_path / "group_vars"
    group_vars.mkdir()
    (group_vars / "npu_nodes.yml").write_text(
        (SAMPLE.parent / "group_vars" / "npu_nodes" / "site.yml").read_text()
        + "dsctl_services:\n  - {name: chat, engine: vllm-ascend, model: /models/m, npus_per_instance: 4,\n"
          "     allow_unauthenticated: true, params: {max_num_seqz: 8}}\n")
    result = dsctl("deploy", str(inventory), "--render")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and "max_num_seqz" in line and "max_num_seqs" in line


def _sample_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "site"
    shutil.copytree(SAMPLE.parent, copy)
    return copy


def test_the_sample_with_its_vault_file_encrypted_needs_the_password(tmp_path):
    site = _sample_copy(tmp_path)
    password = tmp_path / "vault-password"
    password.write_text("correct horse battery staple\n")
    vault_file = site / "group_vars" / "npu_nodes" / "vault.yml"
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password), str(vault_file)],
                   check=True, capture_output=True, timeout=60)
    assert vault_file.read_text().startswith("$ANSIBLE_VAULT;")

    refused = dsctl("deploy", str(site / "hosts.yml"), "--render")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1
    assert str(vault_file) in refused.stderr and "--vault-password-file" in refused.stderr

    rendered = dsctl("deploy", str(site / "hosts.yml"), "--render", "--json", "--vault-password-file", str(password))
    assert rendered.returncode == 0, rendered.stderr
    env = [f for f in json.loads(rendered.stdout)["data"] if f["path"].endswith("service.env")]
    assert len(env) == 4 and all(f["mode"] == "0600" for f in env)
    assert SAMPLE_KEY not in rendered.stdout


def test_an_unsafe_config_dir_is_refused_before_any_host(tmp_path):
    site = _sample_copy(tmp_path)
    with (site / "group_vars" / "npu_nodes" / "site.yml").open("a") as stream:
        stream.write("dsctl_service_config_dir: /etc/$(touch${IFS}/owned)\n")
    result = dsctl("deploy", str(site / "hosts.yml"), "--render")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "dsctl_service_config_dir: expected an absolute path of letters, digits and . _ / + -" in result.stderr
    assert result.stdout == ""


def test_a_yaml_syntax_error_names_file_and_line(tmp_path):
    site = _sample_copy(tmp_path)
    services = site / "group_vars" / "npu_nodes" / "services.yml"
    services.write_text(services.read_text().replace("    port: 8000", "    port: [8000"))
    result = dsctl("deploy", str(site / "hosts.yml"), "--render")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert f"inventory: {services}, line " in result.stderr and "did not find expected" in result.stderr


def test_a_limit_that_matches_no_host_is_refused(tmp_path):
    from dsctl.adapters.inventory import host_vars
    from dsctl.errors import UsageError

    try:
        host_vars(SAMPLE, limit="h*")
    except UsageError as refused:
        assert str(refused) == ("--limit 'h*' matches no host of npu_nodes (hosts: atlas-a01, atlas-a02); give "
                                "host names, groups or patterns such as 'atlas-a0*'")
    else:
        raise AssertionError("--limit 'h*' was accepted")
