"""Where `dsctl upgrade` records the versions it installed (dsctl.adapters.inventory_versions, issue 20): every
definition that reaches the fleet, through symlinks, with owner and mode kept; what it cannot edit is refused."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.adapters import inventory_versions
from dsctl.errors import UsageError

HOSTS = "all:\n  children:\n    npu_nodes:\n      hosts:\n        a1: {ansible_host: 192.0.2.1}\n        a2: {}\n"


def site(tmp_path: Path, group_vars: str, *, name: str = "npu_nodes.yml") -> Path:
    (tmp_path / "group_vars").mkdir(parents=True)
    (tmp_path / "hosts.yml").write_text(HOSTS)
    (tmp_path / "group_vars" / name).write_text(group_vars)
    return tmp_path


def test_a_group_vars_file_without_a_suffix_behind_a_symlink_is_edited_through_the_link_mode_kept(tmp_path):
    real = tmp_path / "shared" / "npu_nodes"
    real.parent.mkdir()
    real.write_text("# pinned by the platform team\ndsctl_cann_version: \"8.3.RC2\"  # keep quoted\n")
    real.chmod(0o640)
    inventory = site(tmp_path / "inv", "placeholder", name="other.yml")
    (inventory / "group_vars" / "npu_nodes").symlink_to(real)
    edit = inventory_versions.plan_edit(inventory, ["a1", "a2"], {"dsctl_cann_version": "8.5.0"})
    assert [s.scope for s in edit.sites] == ["group npu_nodes"]
    inventory_versions.apply(edit)
    assert (inventory / "group_vars" / "npu_nodes").is_symlink()
    text = real.read_text()  # comments and quoting kept (ruamel keeps the comment's column)
    assert text.startswith("# pinned by the platform team\ndsctl_cann_version: \"8.5.0\"") and "# keep quoted" in text
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640


def test_host_vars_that_pin_a_version_are_edited_too_and_restore_puts_everything_back(tmp_path):
    inventory = site(tmp_path, "dsctl_cann_version: 8.3.RC2\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "a2.yml").write_text("dsctl_cann_version: 8.3.RC2\n")
    (tmp_path / "host_vars" / "elsewhere.yml").write_text("dsctl_cann_version: 8.0.0\n")  # not in the fleet
    edit = inventory_versions.plan_edit(inventory, ["a1", "a2"], {"dsctl_cann_version": "8.5.0"})
    assert sorted(s.scope for s in edit.sites) == ["group npu_nodes", "host a2"]
    previous = inventory_versions.apply(edit)
    assert (tmp_path / "host_vars" / "a2.yml").read_text() == "dsctl_cann_version: 8.5.0\n"
    inventory_versions.restore(previous)
    assert (tmp_path / "host_vars" / "a2.yml").read_text() == "dsctl_cann_version: 8.3.RC2\n"
    assert (tmp_path / "host_vars" / "elsewhere.yml").read_text() == "dsctl_cann_version: 8.0.0\n"


def test_a_version_from_a_shared_anchor_is_refused(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("common: &common\n  dsctl_cann_version: 8.3.RC2\nall:\n  children:\n    npu_nodes:\n"
                         "      hosts: {a1: {}}\n      vars:\n        <<: *common\n")
    with pytest.raises(UsageError, match=r"comes from a YAML merge key"):
        inventory_versions.plan_edit(inventory, ["a1"], {"dsctl_cann_version": "8.5.0"})


def test_a_version_set_nowhere_is_added_to_the_npu_group_of_the_inventory_file(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(HOSTS)
    edit = inventory_versions.plan_edit(inventory, ["a1", "a2"], {"dsctl_vllm_ascend_version": "v0.13.0"})
    inventory_versions.apply(edit)
    assert "    npu_nodes:\n      hosts:" in inventory.read_text()
    assert "      vars:\n        dsctl_vllm_ascend_version: v0.13.0\n" in inventory.read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes any file")
def test_an_unwritable_file_is_refused_before_anything_changes(tmp_path):
    inventory = site(tmp_path, "dsctl_cann_version: 8.3.RC2\n")
    (tmp_path / "group_vars").chmod(0o500)
    (tmp_path / "group_vars" / "npu_nodes.yml").chmod(0o400)
    try:
        with pytest.raises(UsageError, match="not writable"):
            inventory_versions.plan_edit(inventory, ["a1"], {"dsctl_cann_version": "8.5.0"})
    finally:
        (tmp_path / "group_vars").chmod(0o700)


READ_ONLY_PLAN = """
import sys
from pathlib import Path
from dsctl.adapters import inventory_versions
from dsctl.errors import UsageError
try:
    inventory_versions.plan_edit(Path(sys.argv[1]), ["a1"], {"dsctl_cann_version": "8.5.0"})
except UsageError as refused:
    print(refused)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a mount namespace takes root")
def test_a_file_on_a_read_only_mount_is_refused_even_for_root(tmp_path):
    # root writes any file a mode forbids, but not on a read-only mount (a site's inventory from a ro NFS export)
    inventory = site(tmp_path, "dsctl_cann_version: 8.3.RC2\n")
    group_vars = tmp_path / "group_vars"
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$2" -c "$3" "$4"', "sh",
         str(group_vars), sys.executable, READ_ONLY_PLAN, str(inventory)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "not writable" in result.stdout, result.stdout + result.stderr
    assert (group_vars / "npu_nodes.yml").read_text() == "dsctl_cann_version: 8.3.RC2\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner takes root")
def test_the_files_owner_and_group_are_kept(tmp_path):
    inventory = site(tmp_path, "dsctl_cann_version: 8.3.RC2\n")
    path = tmp_path / "group_vars" / "npu_nodes.yml"
    os.chown(path, 1234, 4321)
    inventory_versions.apply(inventory_versions.plan_edit(inventory, ["a1"], {"dsctl_cann_version": "8.5.0"}))
    assert path.read_text() == "dsctl_cann_version: 8.5.0\n"
    assert (path.stat().st_uid, path.stat().st_gid) == (1234, 4321)
