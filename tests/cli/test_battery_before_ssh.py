"""Class 9 of the bad-input battery (issue 41): what can be checked before SSH is checked before SSH.

Every flag of tune, upgrade and provision, and every file the inventory names on the controller, is judged before
the first play: the search's --objective and --min-agreement before the fleet is read (tune_live._check, the
search's own SearchSettings.check), the gate probe's size and --max-regression while the options are parsed, a
package directory without its SHA256SUMS or a dsctl_pip_lock that is no file before provision's play
(services.fleet.Fleet.check_controller_files), a --tags the playbook lacks with the other playbook options.  The
inventories' hosts are the sentinel: a check that came only after dsctl reached them is counted and fails.
"""

from __future__ import annotations

import pytest

from dsctl.app import main
from dsctl.core.load import limits
from dsctl.services import provision as provision_verb

from .battery import REPO, assert_names, refusal, site

TUNE = ["tune", "INVENTORY", "--slo", "ttft=1s"]


def packages(tmp_path, *, manifest: bool = True):
    directory = tmp_path / "packages"
    directory.mkdir(exist_ok=True)
    if manifest:
        (directory / "SHA256SUMS").write_text("")
    return str(directory)


# (extra group_vars of the inventory given tmp_path, args, words the line must name)
CASES = [
    # the cases
    (None, [*TUNE, "--objective", "bogus"], ("--objective", "capacity")),
    (None, [*TUNE, "--min-agreement", "1.5"], ("--min-agreement",)),
    (None, [*TUNE, "--min-agreement", "-1"], ("--min-agreement",)),
    (None, [*TUNE, "--min-agreement", "nan"], ("--min-agreement", "finite")),
    (None, ["upgrade", "INVENTORY", "--probe-requests", "1000000000"], ("--probe-requests", str(limits.MAX_REQUESTS))),
    (None, ["upgrade", "INVENTORY", "--probe-concurrency", "1000000"],
     ("--probe-concurrency", str(limits.MAX_CONCURRENCY))),
    (None, ["upgrade", "INVENTORY", "--max-regression", "throughput=150%"], ("--max-regression throughput", "100")),
    (lambda tmp: {"dsctl_package_source": str(tmp / "no-such-dir")}, ["provision", "INVENTORY"],
     ("dsctl_package_source", "no-such-dir", "not a directory on the controller")),
    (lambda tmp: {"dsctl_package_source": packages(tmp), "dsctl_pip_lock": str(tmp / "no-such.lock")},
     ["provision", "INVENTORY"], ("dsctl_pip_lock", "no-such.lock", "wheelhouse build")),
    # more of the class
    (lambda tmp: {"dsctl_package_source": packages(tmp, manifest=False)}, ["provision", "INVENTORY", "--check"],
     ("dsctl_package_source", "SHA256SUMS")),
    (lambda tmp: {"dsctl_package_source": str(tmp / "no-such-dir")}, ["upgrade", "INVENTORY"],
     ("dsctl_package_source", "not a directory")),
    (lambda tmp: {"dsctl_package_source": packages(tmp)}, ["provision", "INVENTORY", "--tags", "drivr"],
     ("--tags drivr", "driver")),
    (None, [*TUNE, "--max-time", "inf"], ("--max-time", "finite")),
    (None, [*TUNE, "--objective", "goodput", "--rate", "nan"], ("--rate", "finite")),
    (None, ["upgrade", "INVENTORY", "--max-regression", "throughput=-5%"], ("--max-regression",)),
    (None, ["upgrade", "INVENTORY", "--probe-prompt-tokens", "normal:1e308:1e308"], ("--probe-prompt-tokens",)),
]


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.mark.parametrize(("group_vars", "args", "words"), CASES, ids=[" ".join(a[:4]) for _, a, _ in CASES])
def test_what_the_controller_can_judge_is_judged_before_any_host(capsys, tmp_path, sentinel, group_vars, args,
                                                                  words):
    inventory = site(tmp_path, sentinel, group_vars(tmp_path) if group_vars else None)
    line = refusal(capsys, sentinel, [str(inventory) if arg == "INVENTORY" else arg for arg in args])
    assert_names(line, *words)


@pytest.mark.parametrize("source", ["directory", "https://mirror.example/ascend"])
def test_a_package_source_that_is_there_or_a_url_goes_on_to_the_hosts(capsys, tmp_path, sentinel, source):
    # The control: the controller check refuses only what is missing; a URL is the play's (and the hosts') to fetch.
    value = packages(tmp_path) if source == "directory" else source
    inventory = site(tmp_path, sentinel, {"dsctl_package_source": value}, hosts=("atlas-a01",))
    assert main(["provision", str(inventory), "--check"]) != 0
    capsys.readouterr()
    assert sentinel.connections >= 1


def test_the_provision_tags_dsctl_knows_are_the_playbooks():
    import re

    text = (REPO / "playbooks" / "provision.yml").read_text()
    found = {tag for group in re.findall(r"tags: \[([^\]]*)\]", text) for tag in re.split(r",\s*", group)}
    assert found - set(provision_verb.SPECIAL_TAGS) == set(provision_verb.TAGS)
