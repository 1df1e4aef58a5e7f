"""The offline evaluator: one engine configuration under one workload, in virtual time (pure, no I/O).

``evaluate(config, workload, arrival, requests)`` plans the engine as it starts (`engine_config.plan`: a
configuration that cannot start is reported with the engine's words), draws the same requests and release
times ``dsctl probe`` would send (`dsctl.core.load.workload.Workload`, `dsctl.core.load.arrivals.schedule`,
same seed), runs the engine's own scheduler (`engine_sched.simulate`) on its virtual clock, and computes the
metrics ``dsctl probe`` reports from the requests' token times (`dsctl.core.load.probe_metrics`: TTFT, TPOT,
ITL, E2EL, throughput, goodput, with vLLM's definitions).  A step that runs out of memory ends the run as
"failed under load" (the live engine dies there too).  The quality cost of KV sparsity comes with it:
``agreement`` is the expected share of output tokens equal to the threshold-0 output.

A dense model's data-parallel ranks (``EnginePlan.replicas``) are that many independent engines, each fed every
replicas-th request; a MoE model's DP ranks are one scheduler (engine_config's docstring).

What it leaves out against a live engine + probe: network and HTTP time (tens of microseconds per event on
loopback) and the event loop's scheduling jitter; `tests/unit/test_evaluate.py` compares both.  A few
hundred requests take well under a second.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.load import arrivals, probe_metrics
from dsctl.core.load.workload import Workload
from dsctl.core.perf import engine_config, perfmodel
from dsctl.core.perf.engine_sched import OutOfMemory, Request, simulate

OK = "ok"
FAILED_TO_START = "failed to start"
FAILED_UNDER_LOAD = "failed under load"


@dataclass
class Evaluation:
    config: engine_config.EngineConfig
    status: str
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    agreement: float = 1.0  # expected share of output tokens equal to the unsparsified output
    kv_capacity_tokens: int = 0
    # every request as the probe would record it, in send order (windowed metrics: dsctl.core.tune.capacity)
    records: list[probe_metrics.RequestRecord] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def value(self, metric: str, statistic: str = "p99") -> float:
        """``ttft`` / ``tpot`` / ``itl`` / ``e2el`` at a statistic, in ms (inf when not measured)."""
        got = (self.metrics.get(f"{metric}_ms") or {}).get(statistic)
        return math.inf if got is None else float(got)


# Request i of a workload is a pure function of its seed (Workload's docstring), and a tune sends the same requests
# to every probe (common random numbers): their engine-side token counts are kept per workload object, so a probe
# does not rebuild and re-count the same prompt texts (a third of a probe's time on 1024-token prompts).
_PLANNED: weakref.WeakKeyDictionary[Workload, dict[tuple[int, int, bool], tuple[int, int, tuple]]] = \
    weakref.WeakKeyDictionary()


def planned_requests(workload: Workload, schedule: list[float], block_size: int, prefix_caching: bool
                     ) -> list[Request]:
    """The engine-side requests the probe's workload sends at ``schedule`` (prompt tokens as the engine counts)."""
    from dsctl.core.load.tokens import block_hashes, count_tokens, token_units

    try:
        known = _PLANNED.setdefault(workload, {})
    except TypeError:  # not weakly referable: count every time
        known = {}
    requests = []
    for index, at in enumerate(schedule):
        key = (index, block_size, prefix_caching)
        got = known.get(key)
        if got is None:
            planned = workload.request(index)
            text = planned.prompt or " ".join(str(m.get("content", "")) for m in planned.messages or ())
            hashes = block_hashes(token_units(text), block_size) if prefix_caching else ()
            got = known[key] = (max(1, count_tokens(text)), max(1, planned.output_tokens), hashes)
        tokens, output, hashes = got
        requests.append(Request(f"r{index}", tokens, output, arrival=at, block_hashes=hashes))
    return requests


def evaluate(config: engine_config.EngineConfig, workload: Workload, arrival: arrivals.ArrivalSpec, requests: int,
             *, seed: int = 0, goodput_ms: dict[str, float] | None = None, jitter: float = 0.0) -> Evaluation:
    keep = perfmodel.kv_keep_fraction(config.kv_sparse_threshold) if 0 <= config.kv_sparse_threshold < 1 else 1.0
    agreement = 1.0 - perfmodel.divergence_probability(keep)
    try:
        plan = engine_config.plan(config)
    except engine_config.StartupFailure as exc:
        return Evaluation(config, FAILED_TO_START, exc.message, agreement=agreement)
    # A dense model's DP ranks are independent engines behind one API server: each gets every replicas-th request
    # (round robin; vLLM's front end balances by queue length, which a steady Poisson stream makes about even).
    replicas = max(1, plan.replicas)
    scheds = [engine_config.scheduler(plan, jitter=jitter, seed=seed + k) for k in range(replicas)]
    schedule = arrivals.schedule(arrival, requests=requests, seed=seed)
    reqs = planned_requests(workload, schedule, config.block_size, config.enable_prefix_caching)
    too_long = [r for r in reqs if r.prompt_tokens + r.max_tokens > plan.max_model_len]
    message = ""
    status = OK
    try:
        if too_long:
            raise ValueError(f"{len(too_long)} requests exceed max_model_len ({plan.max_model_len})")
        done = []
        for k, sched in enumerate(scheds):  # one replica dying fails the instance (its API server answers errors)
            done += simulate(sched, reqs[k::replicas] if replicas > 1 else reqs)
    except OutOfMemory as exc:
        status, message = FAILED_UNDER_LOAD, str(exc)
        done = [r for r in reqs if r.finished]
    except ValueError as exc:  # the engine answers 400 to what can never run
        status, message = FAILED_UNDER_LOAD, f"HTTP 400: {exc}"
        done = [r for r in reqs if r.finished]
    now = max(sched.now for sched in scheds)
    records = []
    for r in reqs:
        record = probe_metrics.RequestRecord(r.id, scheduled=r.arrival, sent=r.arrival, prompt_tokens=r.prompt_tokens)
        if r.finished:
            record.chunk_times = list(r.token_times)
            record.output_tokens = r.output_tokens
            record.status = 200
            record.end = r.finished_at
        else:
            record.error = probe_metrics.ErrorClass.CONNECTION
            record.end = now
        records.append(record)
    ends = [r.finished_at for r in done if r.finished_at is not None] or [now]
    metrics = probe_metrics.calculate_metrics(records, max(ends), goodput_ms)
    return Evaluation(config, status, message, metrics, agreement, plan.capacity_tokens * replicas, records)


# --------------------------------------------------------------------------- SLO targets over many configurations


@dataclass(frozen=True)
class Target:
    """An SLO at a load: every bound (ms, vLLM goodput keys ttft/tpot/itl/e2el) holds at ``statistic`` over the run,
    at ``rate`` requests/s (Poisson), and the output agrees with the unsparsified model on ``min_agreement`` of its
    tokens. Among configurations that meet it, the best has the highest goodput (requests/s meeting the per-request
    bounds, DistServe's definition as ``vllm bench serve --goodput`` computes it), then the lowest bound metric."""

    name: str
    rate: float
    slo_ms: dict[str, float]
    statistic: str = "p99"
    min_agreement: float = 0.9
    burstiness: float = 1.0  # gamma shape of the arrivals (1 = Poisson, < 1 = bursty), as vllm bench serve's

    @property
    def arrival(self) -> arrivals.ArrivalSpec:
        return arrivals.ArrivalSpec(process="poisson" if self.burstiness == 1.0 else "gamma", rate=self.rate,
                                    burstiness=self.burstiness)

    def goodput_bounds(self) -> dict[str, float]:
        return {k: v for k, v in self.slo_ms.items() if k in probe_metrics.GOODPUT_METRICS}

    def meets(self, e: Evaluation) -> bool:
        return e.ok and e.agreement >= self.min_agreement and all(
            e.value(metric, self.statistic) <= bound for metric, bound in self.slo_ms.items())

    def goodput(self, e: Evaluation) -> float:
        """Requests/s meeting the per-request bounds; ITL has none (it is per gap), so then every completed one."""
        value = e.metrics.get("request_goodput")
        if value is None:
            value = e.metrics.get("request_throughput")
        return value or 0.0

    def rank(self, e: Evaluation) -> tuple[float, float]:
        first = next(iter(self.slo_ms))
        return (round(self.goodput(e), 6), -e.value(first, self.statistic))


def run_target(config: engine_config.EngineConfig, target: Target, workload: Workload, requests: int,
               seed: int = 0) -> Evaluation:
    return evaluate(config, workload, target.arrival, requests, seed=seed, goodput_ms=target.goodput_bounds())


def best(evaluations: list[Evaluation], target: Target) -> Evaluation | None:
    meeting = [e for e in evaluations if target.meets(e)]
    return max(meeting, key=target.rank) if meeting else None
