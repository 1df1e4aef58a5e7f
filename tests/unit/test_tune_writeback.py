"""--write-back: the winner's parameters into the inventory's YAML, comments and order kept, atomically."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from dsctl.adapters import state_files, writeback
from dsctl.adapters.writeback import check, find_definitions, write_back
from dsctl.errors import UsageError

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample"


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    shutil.copytree(SAMPLE, tmp_path / "inv")
    return tmp_path / "inv" / "hosts.yml"


def services_file(inventory: Path) -> Path:
    return inventory.parent / "group_vars" / "npu_nodes" / "services.yml"


def test_only_the_tuned_lines_change_and_comments_stay(inventory: Path):
    path = services_file(inventory)
    before = path.read_text().splitlines()
    os.chmod(path, 0o640)
    result = write_back(inventory, "chat", {"max_num_seqs": 128, "max_num_batched_tokens": 8192,
                                            "enable_chunked_prefill": True})
    after = path.read_text().splitlines()
    assert result.written == (path,)
    assert result.changed == {"params.max_num_seqs": 128, "params.enable_chunked_prefill": True}
    expected = list(before)
    expected[expected.index("      max_num_seqs: 64")] = "      max_num_seqs: 128"
    # the new key joins params above the commented-out api_key line that followed it; nothing else moves
    expected.insert(expected.index("      gpu_memory_utilization: 0.9") + 1, "      enable_chunked_prefill: true")
    assert after == expected
    assert os.stat(path).st_mode & 0o777 == 0o640
    service = yaml.safe_load(path.read_text())["dsctl_services"][0]
    assert service["params"] == {"max_num_seqs": 128, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9,
                                 "enable_chunked_prefill": True}


def test_fields_and_host_vars_definitions(inventory: Path):
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir()
    (host_vars / "npu-02.yml").write_text(
        "# npu-02 runs a smaller layout\n"
        "dsctl_services:\n"
        "- name: chat   # same service, other NPUs\n"
        "  engine: vllm-ascend\n"
        "  model: /models/m\n"
        "  npus_per_instance: 2\n")
    result = write_back(inventory, "chat", {"max_num_seqs": 32}, fields={"tensor_parallel_size": 2})
    assert set(result.written) == {services_file(inventory), host_vars / "npu-02.yml"}
    text = (host_vars / "npu-02.yml").read_text()
    assert text.startswith("# npu-02 runs a smaller layout\ndsctl_services:\n- name: chat   # same service")
    loaded = yaml.safe_load(text)["dsctl_services"][0]
    assert loaded["params"] == {"max_num_seqs": 32} and loaded["tensor_parallel_size"] == 2
    only = write_back(inventory, "chat", {"max_num_seqs": 16}, only=host_vars / "npu-02.yml")
    assert only.written == (host_vars / "npu-02.yml",)


def test_unknown_service_is_refused_in_one_line(inventory: Path):
    with pytest.raises(UsageError) as caught:
        write_back(inventory, "chatt", {"max_num_seqs": 8})
    assert "service 'chatt' is not defined in dsctl_services" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_vault_files_are_skipped_and_named(inventory: Path):
    path = services_file(inventory)
    path.write_text("$ANSIBLE_VAULT;1.1;AES256\n6162636465\n")
    with pytest.raises(UsageError, match="vault-encrypted, not edited"):
        write_back(inventory, "chat", {"max_num_seqs": 8})


def test_an_interrupted_write_leaves_the_old_file(inventory: Path, monkeypatch):
    path = services_file(inventory)
    before = path.read_text()

    def crash(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(state_files.os, "replace", crash)  # writeback writes through state_files.write_durably
    with pytest.raises(OSError):
        write_back(inventory, "chat", {"max_num_seqs": 8})
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_unchanged_values_write_nothing(inventory: Path):
    path = services_file(inventory)
    stamp = path.stat().st_mtime_ns
    result = write_back(inventory, "chat", {"max_num_seqs": 64, "gpu_memory_utilization": 0.9})
    assert result.written == () and result.changed == {} and path.stat().st_mtime_ns == stamp
    assert [d.index for d in find_definitions(inventory, "chat")[0]] == [0]


def test_an_inventory_files_own_vars_are_edited_too(tmp_path: Path):
    """`dsctl lab up` (and many sites) keep dsctl_services in the inventory file's group vars."""
    path = tmp_path / "inventory.yml"
    path.write_text("# the fleet\nall:\n  children:\n    npu_nodes:\n      hosts:\n"
                    "        h1: {ansible_host: 10.0.0.1}\n"
                    "      vars:\n        dsctl_services:\n          - name: chat  # the chat service\n"
                    "            engine: vllm-ascend\n            params:\n              max_num_seqs: 64\n")
    result = write_back(path, "chat", {"max_num_seqs": 96}, fields={"tensor_parallel_size": 2})
    assert result.written == (path,)
    text = path.read_text()
    assert "# the fleet" in text and "# the chat service" in text
    entry = yaml.safe_load(text)["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"][0]
    assert entry["params"] == {"max_num_seqs": 96} and entry["tensor_parallel_size"] == 2


# --------------------------------------------------------------------------- what Ansible reads is what is edited

CHAT = ("dsctl_services:\n"
        "  - name: chat\n"
        "    engine: vllm-ascend\n"
        "    model: /models/m\n"
        "    params:\n"
        "      max_num_seqs: 64\n")


def test_vars_files_without_an_extension_are_found_as_ansible_finds_them(inventory: Path):
    """Ansible reads group_vars/NAME and host_vars/NAME with no suffix (and NAME/ files without one); a host's
    FQDN-named host_vars file counts for the tuned hosts; NAME.yml beside a NAME/ directory is never read."""
    services = services_file(inventory)
    plain = services.with_suffix("")
    services.rename(plain)  # group_vars/npu_nodes/services
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir()
    (host_vars / "npu-02").write_text(CHAT)
    (host_vars / "npu-03.example.com").write_text(CHAT)
    (host_vars / "npu-02.yml.bak").write_text(CHAT)  # nobody's: left alone
    shadowed = inventory.parent / "group_vars" / "npu_nodes.yml"  # Ansible reads group_vars/npu_nodes/ instead
    shadowed.write_text(CHAT)
    result = write_back(inventory, "chat", {"max_num_seqs": 32}, hosts=("npu-02", "npu-03.example.com"))
    assert set(result.written) == {plain, host_vars / "npu-02", host_vars / "npu-03.example.com"}
    for path in result.written:
        assert yaml.safe_load(path.read_text())["dsctl_services"][0]["params"]["max_num_seqs"] == 32
    assert (host_vars / "npu-02.yml.bak").read_text() == CHAT and shadowed.read_text() == CHAT


def test_a_directory_inventorys_own_hosts_file_is_edited(tmp_path: Path):
    """An inventory directory: Ansible reads every file in it (hosts.yml here) as well as its group_vars."""
    directory = tmp_path / "inv"
    directory.mkdir()
    (directory / "hosts.yml").write_text(
        "all:\n  children:\n    npu_nodes:\n      hosts:\n        h1: {ansible_host: 10.0.0.1}\n"
        "      vars:\n        dsctl_services:\n          - name: chat   # served here\n"
        "            params:\n              max_num_seqs: 64\n")
    (directory / "README.md").write_text("dsctl_services of chat are in hosts.yml\n")  # Ansible skips .md
    result = write_back(directory, "chat", {"max_num_seqs": 96})
    assert result.written == (directory / "hosts.yml",)
    text = (directory / "hosts.yml").read_text()
    assert "# served here" in text
    assert yaml.safe_load(text)["all"]["children"]["npu_nodes"]["vars"]["dsctl_services"][0]["params"] == {
        "max_num_seqs": 96}


def test_a_non_utf8_file_that_does_not_define_the_service_is_no_obstacle(inventory: Path):
    (inventory.parent / "group_vars" / "npu_nodes" / "site-notes.yml").write_bytes(
        "# Caf\u00e9 rack, r\u00e9seau 2\nsite_contact: ops\n".encode("latin-1"))
    assert write_back(inventory, "chat", {"max_num_seqs": 8}).written == (services_file(inventory),)


# --------------------------------------------------------------------------- refused before anything is written


def _refused(inventory: Path, *words: str, service: str = "chat") -> str:
    """check() and write_back() refuse alike, in one line, and nothing is written."""
    files = sorted(p for p in inventory.parent.rglob("*") if p.is_file() and not p.is_symlink())
    before = {p: p.read_bytes() for p in files}
    with pytest.raises(UsageError) as checked:
        check(inventory, service)
    with pytest.raises(UsageError) as written:
        write_back(inventory, service, {"max_num_seqs": 8}, fields={"tensor_parallel_size": 2})
    line = str(checked.value)
    assert str(written.value) == line and "\n" not in line and line.startswith("--write-back: ")
    for word in words:
        assert word in line, line
    assert {p: p.read_bytes() for p in files} == before
    assert not [p for p in inventory.parent.rglob("*.tmp")]
    return line


def test_a_non_utf8_services_file_is_refused(inventory: Path):
    path = services_file(inventory)
    path.write_bytes(path.read_bytes().replace(b"# What", "# Qu\u00e9".encode("latin-1"), 1))
    _refused(inventory, str(path), "is not UTF-8 (byte 0xe9 on line 1)", "save it as UTF-8",
             "tune without --write-back")


def test_a_file_ruamel_cannot_round_trip_is_refused_with_its_line(inventory: Path):
    path = services_file(inventory)
    path.write_text(path.read_text() + "dsctl_service_manager: supervisor\n")  # a duplicate key
    _refused(inventory, str(path), "is not YAML that ruamel.yaml can rewrite (found duplicate key",
             "fix that line")


def test_a_vault_encrypted_only_definition_is_refused_by_check_too(inventory: Path):
    path = services_file(inventory)
    path.write_text("$ANSIBLE_VAULT;1.1;AES256\n6162636465\n")
    _refused(inventory, f"{path}: vault-encrypted, not edited",
             "no definition of service 'chat' that write-back can edit", "keep dsctl_services in a plain YAML file")


def test_templated_params_are_refused_not_replaced_by_the_winners_keys(inventory: Path):
    path = services_file(inventory)
    text = path.read_text()
    start, end = text.index("    params:\n"), text.index("    # Required")
    path.write_text(text[:start] + '    params: "{{ chat_params }}"\n' + text[end:]
                    + "chat_params: {max_num_seqs: 64, max_num_batched_tokens: 8192}\n")
    _refused(inventory, str(path), "the params of service 'chat' are a template ({{ chat_params }})",
             "write the params out as a mapping")


@pytest.mark.parametrize(("text", "words"), [
    ("common: &common\n  max_num_seqs: 64\n"
     "dsctl_services:\n  - name: chat\n    params: *common\n  - name: embed\n    params: *common\n",
     ["the params mapping of service 'chat' is shared through the YAML anchor &common with common;",
      "give chat a params mapping of its own"]),
    ("dsctl_services:\n  - name: chat\n    params: &shared\n      max_num_seqs: 64\n"
     "  - name: embed\n    params: *shared\n",
     ["the params mapping of service 'chat' is shared through the YAML anchor &shared with "
      "dsctl_services[1].params"]),
    ("base: &base\n  engine: vllm-ascend\n  params:\n    max_num_seqs: 64\n"
     "dsctl_services:\n  - <<: *base\n    name: chat\n",
     ["service 'chat' takes its params from the merge key `<<: *base` (defined at base)",
      "give chat a params mapping of its own"]),
    ("chat_service: &chat\n  name: chat\n  params:\n    max_num_seqs: 64\n"
     "dsctl_services:\n  - *chat\n",
     ["the definition of service 'chat' is shared through the YAML anchor &chat with chat_service"]),
    ("all_services: &all\n  - name: chat\n    params:\n      max_num_seqs: 64\n"
     "dsctl_services: *all\n",
     ["dsctl_services is shared through the YAML anchor &all with all_services"]),
])
def test_nodes_shared_through_yaml_anchors_are_refused(inventory: Path, text: str, words: list[str]):
    path = services_file(inventory)
    path.write_text(text)
    _refused(inventory, str(path), "writing the winner", *words)


def test_a_merge_that_leaves_params_local_is_edited_and_the_shared_mapping_kept(inventory: Path):
    path = services_file(inventory)
    path.write_text("base: &base\n  engine: vllm-ascend\n  model: /models/m\n"
                    "dsctl_services:\n  - <<: *base\n    name: chat\n    params:\n      max_num_seqs: 64\n"
                    "  - <<: *base\n    name: embed\n")
    write_back(inventory, "chat", {"max_num_seqs": 8}, fields={"tensor_parallel_size": 2})
    loaded = yaml.safe_load(path.read_text())
    assert loaded["base"] == {"engine": "vllm-ascend", "model": "/models/m"}
    chat, embed = loaded["dsctl_services"]
    assert chat["params"] == {"max_num_seqs": 8} and chat["tensor_parallel_size"] == 2
    assert "tensor_parallel_size" not in embed


def test_json_and_ini_definitions_are_refused_not_skipped(inventory: Path, tmp_path: Path):
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir()
    (host_vars / "npu-02.json").write_text(json.dumps(yaml.safe_load(CHAT)))
    _refused(inventory, str(host_vars / "npu-02.json"), "defines service 'chat' in JSON",
             "move the definition into a .yml file")
    ini = tmp_path / "hosts.ini"
    ini.write_text("[npu_nodes]\nh1\n\n[npu_nodes:vars]\n"
                   "dsctl_services='[{\"name\": \"chat\", \"params\": {\"max_num_seqs\": 64}}]'\n")
    with pytest.raises(UsageError, match=r"hosts.ini is an INI inventory that defines dsctl_services, and "
                                         r"write-back edits YAML only; move"):
        check(ini, "chat")


def test_a_file_or_directory_this_user_cannot_write_is_refused(inventory: Path, monkeypatch):
    path = services_file(inventory)
    real_access = os.access

    def denied(target, *args, **kwargs):
        return False if Path(target) == denied.path else real_access(target, *args, **kwargs)

    monkeypatch.setattr(writeback.os, "access", denied)  # root writes anywhere: os.access is what is asked
    denied.path = path
    _refused(inventory, f"{path} is not writable by", "(mode 0", "make it writable")
    denied.path = path.parent
    _refused(inventory, f"the directory {path.parent} is not writable by", "through a temporary file beside it")


def test_a_file_of_another_owner_is_refused_unless_root(inventory: Path, monkeypatch):
    path = services_file(inventory)
    monkeypatch.setattr(writeback.os, "geteuid", lambda: path.stat().st_uid + 4242)
    _refused(inventory, str(path), f"belongs to {pwd.getpwuid(path.stat().st_uid).pw_name}",
             "run the tune as")


# --------------------------------------------------------------------------- the write keeps the file what it was


def test_a_symlinked_vars_file_is_written_through_the_link(inventory: Path):
    path = services_file(inventory)
    shared = inventory.parent / "shared" / "services.yml"
    shared.parent.mkdir()
    path.rename(shared)
    path.symlink_to(os.path.relpath(shared, path.parent))
    result = write_back(inventory, "chat", {"max_num_seqs": 128})
    assert result.written == (path,)
    assert path.is_symlink() and path.resolve() == shared.resolve()
    assert yaml.safe_load(shared.read_text())["dsctl_services"][0]["params"]["max_num_seqs"] == 128


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner takes root")
def test_the_files_owner_group_and_mode_are_kept(inventory: Path):
    path = services_file(inventory)
    os.chown(path, 4321, 4322)
    os.chmod(path, 0o660)
    write_back(inventory, "chat", {"max_num_seqs": 128})
    info = path.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 4322, 0o660)
    assert "max_num_seqs: 128" in path.read_text()


def test_a_failed_write_puts_back_the_files_already_written(inventory: Path, monkeypatch):
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir()
    (host_vars / "npu-02.yml").write_text(CHAT)
    files = [services_file(inventory), host_vars / "npu-02.yml"]
    before = {p: p.read_text() for p in files}
    real_replace, calls = state_files.os.replace, []

    def second_fails(source, destination):
        calls.append(destination)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(state_files.os, "replace", second_fails)
    with pytest.raises(OSError, match="No space left"):
        write_back(inventory, "chat", {"max_num_seqs": 8})
    assert len(calls) == 3  # the first file, the failed second, the first put back
    assert {p: p.read_text() for p in files} == before
