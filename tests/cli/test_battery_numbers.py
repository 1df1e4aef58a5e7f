"""Class 8 of the bad-input battery (issue 41): numbers that become infinity or NaN, or lie beyond what the
hardware or the engine can be.

One rule (`dsctl.core.load.limits.number`): every number a user gives -- an SLO term, a length spec, a
--max-regression percentage, every int and float option (`dsctl.cli_options.bounded`) -- is finite (no nan, no
inf, no 400-digit number that float() reads as inf) and within a bound that says where it comes from.  Each case
is refused in one line naming the option, exit 2, before anything runs: a probe's URL, the fleet's hosts and the
index are the sentinel, so an input that got through would be counted.
"""

from __future__ import annotations

import pytest

from dsctl.core.load import limits

from .battery import assert_names, refusal, site

HUGE = "9" * 400  # float(HUGE) is inf; int(HUGE) is a 400-digit int
ESTIMATE = ["estimate", "--chip", "910B3", "--model", "r1-7b", "--prompt-tokens", "128"]
SIMULATE = ["tune", "--simulate", "--model", "r1-7b", "--slo", "ttft=2s", "--budget", "2"]

# (args after the command's fixed part, words the line must name); URL / INVENTORY are filled in per test
CASES = [
    # the cases
    ([*ESTIMATE, "--slo", f"ttft={HUGE}ms"], ("--slo ttft", "not a finite number")),
    ([*SIMULATE[:4], "--slo", f"ttft:{HUGE}", "--budget", "2"], ("--slo ttft", "not a finite number")),
    ([*ESTIMATE, "--chips", "1000000"], ("--chips", str(limits.MAX_CHIPS), "SuperPoD")),
    ([*SIMULATE, "--max-model-len", "0"], ("--max-model-len", "at least")),
    (["probe", "URL", "--rate", "1", "--requests", "2", "--prompt-tokens", "normal:1e308:1e308"],
     ("--prompt-tokens", str(limits.MAX_TOKENS))),
    (["wheelhouse", "build", "--release", "v0.13.0", "--index-url", "URL", "--out", "OUT", "--timeout", "nan"],
     ("--timeout", "not a finite number")),
    # more of the class
    ([*SIMULATE, "--max-model-len", "200000"], ("--max-model-len", "r1-7b's context")),
    ([*ESTIMATE, "--output-tokens", HUGE], ("--output-tokens", "400-digit", str(limits.MAX_TOKENS))),
    (["probe", "URL", "--rate", "1e400", "--requests", "2"], ("--rate", "inf")),
    (["probe", "URL", "--rate", "1", "--requests", "2", "--timeout", "inf"], ("--timeout", "not a finite number")),
    (["probe", "URL", "--rate", "1", "--arrival", "gamma", "--burstiness", "inf"], ("--burstiness", "finite")),
    (["probe", "URL", "--rate", "1", "--requests", "2", "--prompt-tokens", f"uniform:1:{HUGE}"],
     ("--prompt-tokens", str(limits.MAX_TOKENS))),
    (["probe", "URL", "--rate", "1", "--requests", "2", "--goodput", f"e2el:{HUGE}"], ("--goodput e2el", "finite")),
    ([*SIMULATE, "--seed", "99999999999"], ("--seed", str(limits.MAX_SEED))),
    (["upgrade", "INVENTORY", "--slo", f"e2el={HUGE}s"], ("--slo e2el", "not a finite number")),
    (["upgrade", "INVENTORY", "--max-regression", f"ttft={HUGE}%"], ("--max-regression ttft", "finite")),
]


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # tune's run directories


@pytest.mark.parametrize(("args", "words"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_number_that_is_no_number_is_refused_before_anything_runs(capsys, tmp_path, sentinel, args, words):
    fill = {"URL": sentinel.url, "OUT": str(tmp_path / "wheels")}
    if "INVENTORY" in args:
        fill["INVENTORY"] = str(site(tmp_path, sentinel))
    line = refusal(capsys, sentinel, [fill.get(arg, arg) for arg in args], exits=(2,))
    assert_names(line, *words)


@pytest.mark.parametrize("args", [
    [*ESTIMATE, "--chips", str(limits.MAX_CHIPS), "--slo", "ttft=86400000ms"],  # the bounds themselves hold
    [*ESTIMATE, "--slo", "ttft=0.001ms"],
])
def test_the_bounds_themselves_are_accepted(capsys, args):
    from dsctl.app import main

    assert main(args) in (0, 6)  # answered: feasible or not
    capsys.readouterr()
