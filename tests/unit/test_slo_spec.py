"""dsctl's one SLO grammar (`dsctl.core.load.slo_spec`): both forms, the statistic a term binds, one-line errors."""

from __future__ import annotations

import re

import pytest

from dsctl.core.load.slo_spec import Slo, is_term, lex, parse_slos, refuse_unsupported
from dsctl.core.tune.slo import goodput_slos
from dsctl.errors import ExitStatus, UsageError


@pytest.mark.parametrize(("text", "slo"), [
    ("ttft=200ms", Slo("ttft", "p99", 200.0)),
    ("ttft:200", Slo("ttft", "p99", 200.0)),          # vLLM's --goodput form: ms
    ("ttft:200ms", Slo("ttft", "p99", 200.0)),
    ("ttft:0.2s", Slo("ttft", "p99", 200.0)),
    ("ttft=200", Slo("ttft", "p99", 200.0)),          # a bare number is ms, as in vLLM
    ("ttft:p95=200ms", Slo("ttft", "p95", 200.0)),
    ("ttft.p95=200ms", Slo("ttft", "p95", 200.0)),    # the upgrade gate's older spelling
    ("TPOT:Median=40ms", Slo("tpot", "p50", 40.0)),
    ("e2el:mean=2s", Slo("e2el", "mean", 2000.0)),
    ("itl:p90=.5s", Slo("itl", "p90", 500.0)),
    ("error_rate=1%", Slo("error_rate", None, 0.01)),
    ("error_rate:0.02", Slo("error_rate", None, 0.02)),
])
def test_both_forms_mean_the_same(text, slo):
    (parsed,) = parse_slos([text])
    assert parsed == slo
    assert parse_slos([parsed.label]) == (slo,)  # the label is a canonical term: state files store it
    assert parsed.written == text


def test_a_term_without_a_statistic_binds_the_commands_default():
    assert parse_slos(["ttft:200"], default_statistic="p90") == (Slo("ttft", "p90", 200.0),)
    assert parse_slos(["ttft:p99=200ms"], default_statistic="p90") == (Slo("ttft", "p99", 200.0),)


def test_terms_split_on_commas_and_spaces_and_options_repeat():
    slos = parse_slos(["ttft:200 tpot:50", "e2el=2s, error_rate=1%"])
    assert [s.key for s in slos] == ["ttft:p99", "tpot:p99", "e2el:p99", "error_rate"]
    assert parse_slos([], required=False) == ()


@pytest.mark.parametrize(("text", "message"), [
    ("ttft", "expected metric[:stat]=value[ms|s|%] or vLLM's metric:ms"),
    ("ttft=fast", "expected metric[:stat]"),
    ("ttft=200us", "expected metric[:stat]"),
    ("ttft:p98=200ms", "unknown statistic 'p98'; use one of mean, p50, p90, p95, p99"),
    ("ttfb:200", "unknown metric 'ttfb'"),
    ("ttft=0", "a latency bound must be positive"),
    ("ttft=5%", "ttft is a time"),
    ("error_rate=5ms", "error_rate is a share of requests"),
    ("error_rate:p99=1%", "error_rate takes no statistic"),
    ("ttft=1s,ttft:p99=2s", "ttft:p99 is already bound by 'ttft=1s'"),
    ("ttft=1s,,tpot=5ms", "an empty item between commas"),
])
def test_errors_are_one_line_naming_the_term_and_the_fix(text, message):
    with pytest.raises(UsageError) as caught:
        parse_slos([text], "--goodput")
    line = str(caught.value)
    assert message in line and "\n" not in line and line.startswith("--goodput ")
    assert caught.value.exit_status == ExitStatus.USAGE


def test_the_lexer_alone_reads_percentages_for_the_upgrade_gate():
    term = lex("ttft:p90=15%", "--max-regression")
    assert (term.metric, term.statistic, term.number, term.unit) == ("ttft", "p90", 15.0, "%")
    assert is_term("throughput=5%") and not is_term("ttft<5%")


def test_an_unsupported_metric_is_refused_naming_what_is_supported():
    with pytest.raises(UsageError, match=r"^--slo 'itl:5': estimate takes ttft, tpot, e2el, not itl$"):
        refuse_unsupported(parse_slos(["ttft=1s,itl:5"]), ("ttft", "tpot", "e2el"), "--slo", "estimate")


def test_goodput_slos_take_the_tightest_bound_per_metric_at_its_statistic():
    slos = parse_slos(["ttft:p50=100ms,ttft:p99=300ms,itl=50ms,e2el:mean=2s,error_rate=1%"])
    assert goodput_slos(slos) == (Slo("ttft", "p50", 100.0), Slo("e2el", "mean", 2000.0))


@pytest.mark.parametrize(("term", "needle"), [
    ("ttft=" + "9" * 400 + "ms", "--slo ttft inf: not a finite number"),
    ("e2el:" + "9" * 400, "--slo e2el inf: not a finite number"),
    ("e2el=100000s", "more than the 86400000 ms dsctl allows (a day)"),
    ("tpot=0.0000001ms", "--slo tpot must be at least 0.001"),
])
def test_a_latency_bound_is_finite_and_between_a_microsecond_and_a_day(term, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        parse_slos([term])
