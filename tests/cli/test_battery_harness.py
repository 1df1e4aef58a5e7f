"""The battery's own check (tests/cli/battery.py): the sentinel sees a verb that does reach the hosts."""

from __future__ import annotations

from dsctl.app import main

from .battery import site


def test_the_sentinel_counts_a_verb_that_reaches_the_hosts(capsys, tmp_path, sentinel):
    # A valid inventory: `check` goes to the hosts (SSH to the sentinel's port), and the harness must see it, or
    # every "no host contacted" assertion of the battery could not fail.
    inventory = site(tmp_path, sentinel, hosts=("atlas-a01",))
    assert main(["check", str(inventory)]) != 0
    capsys.readouterr()
    assert sentinel.connections >= 1
