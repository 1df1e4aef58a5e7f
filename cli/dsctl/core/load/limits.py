"""The bounds of every number a user gives dsctl (pure): requests, tokens, concurrency, chips, hosts, seconds.

Every count a user gives is bounded before anything is built from it, so a typo (``--requests 999999999999``)
is one line and exit 2 instead of gigabytes of schedule, prompts or workers and then a MemoryError. The bounds
are far above what a measurement needs: vLLM's ``bench serve`` sends 1000 prompts by default and a probe's
per-request records stay in memory until its report; the longest context windows of the served models are about
1M tokens (DeepSeek-V3 and R1: 128K); ten thousand streams are more than an Atlas host's engines schedule at
once (vLLM's max_num_seqs is 256 by default) and more than the file descriptors of a default ulimit.

`number` is the one rule for a number from the command line or the SLO grammar: finite (no nan, no inf -- and a
400-digit number, which Python's float() reads as inf, is one), at least its lower and at most its upper bound.
`check` is its upper half. Typer options go through it with `dsctl.services.inputs.Bound` (`dsctl.cli_options.bounded`).
"""

from __future__ import annotations

import math

MAX_REQUESTS = 100_000  # per probe (measured or warm-up), and per sweep level; the same as a dataset's entries
MAX_TOKENS = 1_048_576  # prompt or output tokens of one request
MAX_CONCURRENCY = 10_000  # requests in flight (a closed loop's streams, an open loop's cap, estimate's batch)
# NPUs of one instance: eight times the largest Ascend supernode announced (Atlas 950 SuperPoD, 8,192 NPUs,
# https://www.huawei.com/en/news/2025/9/hc-xu-keynote-speech), and the range of estimate's chip-count search.
MAX_CHIPS = 65_536
MAX_CHIPS_WHY = " (8 x the largest Ascend supernode, Atlas 950 SuperPoD's 8192 NPUs)"
# Hosts of one fleet (forks, serial, a canary batch): MAX_CHIPS at eight NPUs a host (an Atlas 800T A2).
MAX_HOSTS = MAX_CHIPS // 8
SECONDS_PER_DAY = 86_400  # the longest timeout, probe or SLO dsctl takes: past a day it is a typo, not a test
MAX_RUN_SECONDS = 30 * SECONDS_PER_DAY  # the longest study (tune --max-time) dsctl plans: a month
MAX_SEED = 2**32 - 1  # numpy's legacy RandomState, which Optuna's samplers seed, takes 0 .. 2**32 - 1


def _shown(value: int | float) -> str:
    if isinstance(value, int):  # Python's ints are unbounded: a 400-digit one is shown by its size
        return str(value) if value.bit_length() <= 128 else f"(a {len(str(abs(value)))}-digit number)"
    return str(value) if not math.isfinite(value) else f"{value:g}"


def number(option: str, value: int | float, low: int | float | None, high: int | float | None, what: str,
           why: str = "") -> None:
    """Raise ValueError (one line naming ``option``) unless ``value`` is finite and within [low, high]; ``what``
    names the unit (``"requests of one probe"``), ``why`` (optional, ``" (...)"``) where the upper bound comes
    from. A bound of None is not checked."""
    if isinstance(value, float) and not math.isfinite(value):  # nan fails every comparison: tested first
        span = (f", from {_shown(low)} to {_shown(high)}" if low is not None and high is not None else
                f", up to {_shown(high)}" if high is not None else f", at least {_shown(low)}" if low is not None
                else "")
        unit = f" in {what}" if what else ""
        raise ValueError(f"{option} {_shown(value)}: not a finite number; give a finite value{unit}{span}{why}")
    if low is not None and value < low:
        raise ValueError(f"{option} must be at least {_shown(low)}, got {_shown(value)}; raise it")
    if high is not None and value > high:
        what = f" {what}" if what else ""
        raise ValueError(f"{option} {_shown(value)}: more than the {_shown(high)}{what} dsctl allows{why}; lower it")


def check(option: str, value: int | float, limit: int | float, what: str) -> None:
    """Raise ValueError (one line naming ``option`` and ``limit``) when ``value`` is above ``limit`` or not finite."""
    number(option, value, None, limit, what)
