"""--write-back: the winner's parameters into the inventory's YAML, comments and order kept, atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from dsctl.adapters import state_files
from dsctl.adapters.writeback import find_definitions, write_back
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
