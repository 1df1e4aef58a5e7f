"""The most work one probe, estimate or tune may plan (pure): requests, tokens per request, concurrency.

Every count a user gives is bounded before anything is built from it, so a typo (``--requests 999999999999``)
is one line and exit 2 instead of gigabytes of schedule, prompts or workers and then a MemoryError. The bounds
are far above what a measurement needs: vLLM's ``bench serve`` sends 1000 prompts by default and a probe's
per-request records stay in memory until its report; the longest context windows of the served models are about
1M tokens (DeepSeek-V3 and R1: 128K); ten thousand streams are more than an Atlas host's engines schedule at
once (vLLM's max_num_seqs is 256 by default) and more than the file descriptors of a default ulimit.
"""

from __future__ import annotations

MAX_REQUESTS = 100_000  # per probe (measured or warm-up), and per sweep level; the same as a dataset's entries
MAX_TOKENS = 1_048_576  # prompt or output tokens of one request
MAX_CONCURRENCY = 10_000  # requests in flight (a closed loop's streams, an open loop's cap, estimate's batch)


def check(option: str, value: int | float, limit: int, what: str) -> None:
    """Raise ValueError (one line naming ``option`` and ``limit``) when ``value`` is above ``limit``."""
    if value > limit:
        shown = value if isinstance(value, int) else f"{value:g}"
        raise ValueError(f"{option} {shown}: more than the {limit} {what} dsctl allows; lower it")
