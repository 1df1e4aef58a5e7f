"""`dsctl estimate`: roofline predictions for one chip x model x workload x group size, and SLO verdicts (pure).

Predictions come from dsctl.core.perf.perfmodel, the same model the lab's emulated engine runs. Workload: every
request has ``prompt_tokens`` in and ``output_tokens`` out, and ``concurrency`` requests are in flight, as
with ``vllm bench serve --max-concurrency`` (serving-and-tuning.md s.2):

* TTFT, single: the prompt's prefill on an idle engine (the first token comes out of the prefill step).
* TTFT at concurrency C: C prompts arriving together are prefilled one after another -- prefill is
  compute-bound, so batching them saves nothing -- the i-th waits i prefills. Mean and worst are reported;
  the verdict binds the worst, the p99 of such a burst. Requests beyond the KV capacity wait whole cycles.
* TPOT: a decode step of the running batch at its average context (prompt + output/2), plus the prefills of
  the other B-1 requests that land in its decode phase in steady state, spread over its output tokens.
* E2EL = worst TTFT + (output - 1) x TPOT. Throughput = B x output / cycle, cycle = B x prefill +
  (output - 1) x decode step (the steady-state life of one request).
* Hosts: ``nodes`` spreads the chips evenly over that many hosts (chips / nodes each, which must be whole) and
  ``expert_parallel`` shards a MoE model's experts over all of them (vllm-ascend ``--enable-expert-parallel``).
  Spanning hosts adds the traffic that crosses them to every step (``perfmodel.cross_host_seconds``: RoCE
  bytes and per-message latency of the expert all-to-all, and of tensor-parallel all-reduces when a TP group spans
  hosts), reported separately (``cross_host_*``), so 16 chips over 2 hosts are slower than 16 in one host.

Verdicts compare predictions with the SLOs (dsctl.core.load.slo_spec: ttft, tpot, e2el at any statistic).
An infeasible one says why
and gives bounds: the time at peak compute or bandwidth (no efficiency, no overheads) on the chips asked for,
and the fewest chips for which that bound -- and the efficiency-scaled roofline -- meets the SLO, assuming
perfect tensor-parallel scaling (so real deployments need at least that many).  Over several hosts the
efficiency-scaled count keeps the chips per host and includes the cross-host term (more chips, more hosts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dsctl.core.load import limits, slo_spec
from dsctl.core.load.slo_spec import Slo
from dsctl.core.perf.perfmodel import (
    GB,
    Chip,
    Deployment,
    DoesNotFit,
    Efficiency,
    Model,
    check_fits,
    chip_by_name,
    cross_host_seconds,
    decode_flops,
    decode_step_seconds,
    kv_bytes_per_token_per_chip,
    load_profiles,
    min_chips_to_fit,
    model_by_name,
    peak_flops,
    prefill_flops,
    prefill_seconds,
    startup_seconds,
    touched_params,
    weights_bytes,
    weights_bytes_per_chip,
)
from dsctl.errors import UsageError

SLO_METRICS = ("ttft", "tpot", "e2el")
WEIGHT_FORMATS = {"bf16": 2.0, "int8": 1.0}  # bytes per parameter; int8 = W8A8 checkpoints
MAX_CHIPS = limits.MAX_CHIPS  # search limit for "at least M chips"; beyond it a verdict says "no chip count"


def parse_slo(text: str) -> tuple[Slo, ...]:
    """``--slo`` in dsctl's one SLO grammar (`dsctl.core.load.slo_spec`): ``ttft=200ms,tpot:mean=50ms`` or vLLM's
    ``ttft:200 tpot:50`` (ms); what the roofline does not model (itl, error_rate) refused in one line."""
    slos = slo_spec.parse_slos([text])
    slo_spec.refuse_unsupported(slos, SLO_METRICS, "--slo", "estimate",
                                " (the roofline models each request's TTFT, TPOT and E2EL; dsctl tune measures "
                                "the rest)")
    return slos


@dataclass(frozen=True)
class Verdict:
    """One SLO metric (or "memory") judged: ``reason`` is the sentence the CLI prints after the label."""

    metric: str
    feasible: bool
    reason: str
    target_ms: float | None = None
    statistic: str | None = None              # what the target binds: mean, or a percentile (the burst's worst)
    predicted_ms: float | None = None
    bound_ms: float | None = None             # at peak on the chips asked for: nothing can beat it
    min_chips_peak: int | None = None         # fewest chips whose peak bound meets the target
    min_chips_efficient: int | None = None    # ... whose efficiency-scaled roofline meets it

    @property
    def label(self) -> str:
        if self.target_ms is None:
            return self.metric
        stat = "" if self.statistic in (None, slo_spec.DEFAULT_STATISTIC) else f":{self.statistic}"
        return f"{self.metric}{stat}={_ms_text(self.target_ms)}"

    @property
    def line(self) -> str:
        return f"{self.label}: {'feasible' if self.feasible else 'infeasible'}: {self.reason}"


@dataclass(frozen=True)
class Estimate:
    chip: str
    model: str
    chips: int
    weight_format: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    efficiency: dict[str, float]
    weights_gb: float
    fits: bool
    memory_error: str | None           # the engine's start-up failure, in its words
    min_chips_for_memory: int | None   # fewest chips holding the weights and one full request's KV
    kv_capacity_tokens: int
    max_concurrency: int               # full-length requests the KV cache holds at once
    running_batch: int
    prefill_flops: float
    ttft_s: float                      # single request, idle engine
    ttft_mean_s: float                 # at concurrency, a burst of arrivals
    ttft_worst_s: float
    tpot_s: float
    e2el_s: float
    decode_step_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    startup_s: float
    verdicts: tuple[Verdict, ...] = field(default=())
    nodes: int = 1                          # hosts the chips span
    expert_parallel: bool = False
    tensor_parallel: int = 1                # the attention's TP group (all chips without expert parallel)
    npus_per_host: int = 0                  # what one host of this chip holds (profiles.yaml); 0 = unknown
    cross_host_decode_s: float = 0.0        # of decode_step_s: traffic between hosts (0 within one host)
    cross_host_all_to_all_decode_s: float = 0.0
    cross_host_all_reduce_decode_s: float = 0.0
    cross_host_prefill_s: float = 0.0       # of ttft_s: the same for the one-request prefill
    cross_host_bytes_per_chip_decode: float = 0.0
    weights_per_chip_gb: float = 0.0        # what each chip holds (DP groups keep their own always-active weights)
    one_host_s: dict[str, float] = field(default_factory=dict)  # nodes > 1: the same chips in one host (ttft_mean,
                                                                 # ttft_worst, tpot, e2el), what "fewer hosts" saves

    @property
    def chips_per_node(self) -> int:
        return self.chips // self.nodes

    @property
    def cross_host_share(self) -> float:
        """Share of a decode step spent on traffic between hosts."""
        return self.cross_host_decode_s / self.decode_step_s if self.decode_step_s > 0 else 0.0

    @property
    def feasible(self) -> bool:
        return all(verdict.feasible for verdict in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result["feasible"] = self.feasible
        result["verdicts"] = [{**asdict(verdict), "line": verdict.line} for verdict in self.verdicts]
        return result


def weight_format(weight_bytes: float) -> str:
    names = {value: name for name, value in WEIGHT_FORMATS.items()}
    return names.get(weight_bytes, f"{weight_bytes:g} B/param")


def estimate(chip: Chip | str, model: Model | str, *, prompt_tokens: int, output_tokens: int, concurrency: int = 1,
             chips: int = 1, weight_bytes: float = 2.0, slo: Sequence[Slo] = (),
             efficiency: Efficiency | None = None, memory_utilization: float = 0.9, nodes: int = 1,
             expert_parallel: bool = False, tensor_parallel: int = 0) -> Estimate:
    """Predict one workload on one deployment and judge it against the SLOs ``slo``.

    The model gives each request of a burst its own TTFT, so a statistic is judged on it: ``mean`` on the mean
    TTFT (and E2EL), a percentile on the worst -- the last arrival's, an upper bound on every percentile, so the
    verdict errs on the safe side.  TPOT is one value in steady state: every statistic of it is that value.
    ``nodes``: hosts the chips span (must divide ``chips``); ``expert_parallel``: MoE models only;
    ``tensor_parallel``: a MoE model's attention TP group (DP groups of it over the chips; 0: perfmodel's default)."""
    chip = chip_by_name(chip) if isinstance(chip, str) else chip
    model = model_by_name(model) if isinstance(model, str) else model
    for name, value in (("prompt tokens", prompt_tokens), ("output tokens", output_tokens),
                        ("concurrency", concurrency), ("chips", chips), ("nodes", nodes)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if chips % nodes:
        raise UsageError(f"--nodes {nodes}: {chips} chips do not split evenly over {nodes} hosts (chips per node = "
                         f"chips / nodes must be whole); use a --nodes that divides --chips {chips}")
    if expert_parallel and not model.is_moe:
        raise UsageError(f"--expert-parallel: {model.name} is a dense model (no routed experts in "
                         f"dsctl/data/profiles.yaml), so there are no experts to shard; drop --expert-parallel")
    if expert_parallel and model.experts % chips:
        raise UsageError(f"--expert-parallel: {model.name}'s {model.experts} routed experts do not divide over "
                         f"{chips} chips (vLLM: the number of experts must be divisible by the expert parallel "
                         f"size); use a --chips that divides {model.experts}")
    try:  # the caps every workload shares (`dsctl.core.load.limits`)
        limits.check("--prompt-tokens", prompt_tokens, limits.MAX_TOKENS, "tokens per request")
        limits.check("--output-tokens", output_tokens, limits.MAX_TOKENS, "tokens per request")
        limits.check("--concurrency", concurrency, limits.MAX_CONCURRENCY, "requests in flight")
        limits.number("--chips", chips, 1, limits.MAX_CHIPS, "NPUs of one instance", limits.MAX_CHIPS_WHY)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    d = Deployment(chip=chip, model=model, chips=chips, memory_utilization=memory_utilization,
                   weight_bytes=weight_bytes, efficiency=efficiency or load_profiles()[2], nodes=nodes,
                   expert_parallel=expert_parallel, tensor_parallel=tensor_parallel)
    sequence = prompt_tokens + output_tokens

    try:
        capacity = check_fits(d, max_model_len=sequence)
        memory_error = None
    except DoesNotFit as failure:
        capacity, memory_error = max(failure.capacity_tokens, 0), str(failure)
    fits = memory_error is None
    max_concurrency = capacity // sequence if fits else 0
    # When nothing fits, the times describe the same chips with unlimited memory: what the SLO verdicts judge.
    batch = min(concurrency, max_concurrency) if fits else concurrency

    prefill, decode, tpot, cycle, ttft_mean, ttft_worst, e2el = _timings(d, prompt_tokens, output_tokens,
                                                                         concurrency, batch)
    steps = output_tokens - 1
    cross_decode, cross_prefill = cross_host_seconds(d, batch), cross_host_seconds(d, prompt_tokens)
    one_host: dict[str, float] = {}
    if nodes > 1:  # the same chips and layout in one (hypothetical) host: what "fewer hosts" compares with
        one = replace(d, nodes=1, tensor_parallel=d.tensor_parallel_size)
        _, _, one_tpot, _, one_mean, one_worst, one_e2el = _timings(one, prompt_tokens, output_tokens, concurrency,
                                                                     batch)
        one_host = {"ttft_mean": one_mean, "ttft_worst": one_worst, "tpot": one_tpot, "e2el": one_e2el}

    result = Estimate(
        chip=chip.name, model=model.name, chips=chips, weight_format=weight_format(weight_bytes),
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, concurrency=concurrency,
        efficiency=asdict(d.efficiency), weights_gb=weights_bytes(d) / GB, fits=fits, memory_error=memory_error,
        min_chips_for_memory=chips if fits else min_chips_to_fit(d, sequence),
        kv_capacity_tokens=capacity, max_concurrency=max_concurrency, running_batch=batch,
        prefill_flops=prefill_flops(model, prompt_tokens), ttft_s=prefill, ttft_mean_s=ttft_mean,
        ttft_worst_s=ttft_worst, tpot_s=tpot, e2el_s=e2el, decode_step_s=decode,
        output_tokens_per_s=batch * output_tokens / cycle, total_tokens_per_s=batch * sequence / cycle,
        startup_s=startup_seconds(d), nodes=nodes, expert_parallel=d.experts_sharded,
        tensor_parallel=d.tensor_parallel_size, npus_per_host=chip.npus_per_host,
        cross_host_decode_s=cross_decode.total_s, cross_host_all_to_all_decode_s=cross_decode.all_to_all_s,
        cross_host_all_reduce_decode_s=cross_decode.all_reduce_s, cross_host_prefill_s=cross_prefill.total_s,
        cross_host_bytes_per_chip_decode=cross_decode.bytes_per_chip, one_host_s=one_host,
        weights_per_chip_gb=weights_bytes_per_chip(d) / GB,
    )
    verdicts = [_memory_verdict(d, result)]
    slo_spec.refuse_unsupported(slo, SLO_METRICS, "--slo", "estimate")
    for target in slo:
        judged = result
        if target.statistic == "mean":  # judge the burst's mean: the judges read the worst TTFT
            one = dict(one_host)
            if one:
                one.update(ttft_worst=one["ttft_mean"], e2el=one["ttft_mean"] + steps * one["tpot"])
            judged = replace(result, ttft_worst_s=result.ttft_mean_s, e2el_s=result.ttft_mean_s + steps * tpot,
                             one_host_s=one)
        verdict = _JUDGES[target.metric](d, judged, target.bound / 1e3)
        verdicts.append(replace(verdict, statistic=target.statistic))
    return replace(result, verdicts=tuple(verdicts))


def _timings(d: Deployment, prompt_tokens: int, output_tokens: int, concurrency: int,
             batch: int) -> tuple[float, float, float, float, float, float, float]:
    """(prefill, decode step, TPOT, cycle, mean TTFT, worst TTFT, E2EL) of the workload at running batch ``batch``."""
    prefill = prefill_seconds(d, prompt_tokens)
    decode = decode_step_seconds(d, batch, batch * _average_context(prompt_tokens, output_tokens))
    steps = output_tokens - 1
    tpot = decode + (batch - 1) * prefill / steps if steps else 0.0  # vLLM counts TPOT 0 for one output token
    cycle = batch * prefill + steps * decode
    ttft_mean, ttft_worst = _burst_ttft(concurrency, batch, prefill, cycle)
    return prefill, decode, tpot, cycle, ttft_mean, ttft_worst, ttft_worst + steps * tpot


def _average_context(prompt_tokens: int, output_tokens: int) -> int:
    return prompt_tokens + output_tokens // 2


def _burst_ttft(concurrency: int, batch: int, prefill: float, cycle: float) -> tuple[float, float]:
    # Arrival i (0-based) runs in wave i // batch, which starts once the earlier waves' requests finished,
    # and waits for the prefills ahead of it in its wave: wait(i) = (i // batch) cycle + (i % batch + 1) prefill.
    # Summed in closed form (q full waves, r in the last): no list of `concurrency` waits. The last arrival waits
    # longest, since a cycle holds at least a wave's prefills.
    full, rest = divmod(concurrency, batch)
    waves = batch * full * (full - 1) / 2 + rest * full  # sum of i // batch
    places = full * batch * (batch + 1) / 2 + rest * (rest + 1) / 2  # sum of i % batch + 1
    last = concurrency - 1
    return (waves * cycle + places * prefill) / concurrency, (last // batch) * cycle + (last % batch + 1) * prefill


# --------------------------------------------------------------------------- verdicts


def _on(d: Deployment, chips: int | None = None) -> str:
    chips = d.chips if chips is None else chips
    if chips == 1:
        return f"one {d.chip.name}"
    hosts = f" over {d.nodes} hosts" if chips == d.chips and d.nodes > 1 else ""
    return f"{chips} {d.chip.name} chips{hosts}"


def _min_chips(seconds_at: Callable[[int], float], target_s: float) -> int | None:
    """Fewest chips with seconds_at(chips) <= target_s; the time never grows with chips."""
    high = 1
    while seconds_at(high) > target_s:
        if high >= MAX_CHIPS:
            return None
        high = min(high * 2, MAX_CHIPS)
    low = high // 2 + 1 if high > 1 else 1
    while low < high:
        middle = (low + high) // 2
        if seconds_at(middle) <= target_s:
            high = middle
        else:
            low = middle + 1
    return low


def _chips_text(count: int | None) -> str:
    if count is None:
        return f"more than {MAX_CHIPS} chips (no count suffices)"
    return f"at least {count} chip{'' if count == 1 else 's'}"


def _fixes(d: Deployment, concurrency_fix: str | None, chips_needed: int | None,
           hosts_fix: str | None = None) -> str:
    """What would meet the target: a lower concurrency, more chips (only if more than asked for), fewer hosts (when
    the traffic between them is what misses it), or several of these."""
    options = [concurrency_fix] if concurrency_fix else []
    if chips_needed is None or chips_needed > d.chips:
        options.append(_chips_text(chips_needed))
    if hosts_fix:
        options.append(hosts_fix)
    return " or ".join(options) if options else "a faster engine than the model's efficiency factors"


def _hosts_fix(e: Estimate, metric: str, predicted_s: float, target_s: float) -> str | None:
    """"fewer hosts" when the same chips in one host would meet the target (the traffic between hosts misses it)."""
    one_host = e.one_host_s.get(metric)
    if one_host is None or one_host > target_s:
        return None
    return (f"fewer hosts ({_s_text(predicted_s - one_host)} of it is traffic between the {e.nodes} hosts; the same "
            f"chips in one host would take {_s_text(one_host)})")


def _prefill_bound(d: Deployment, prompt_tokens: int, chips: int) -> float:
    """Prefill FLOPs at peak compute on ``chips`` chips: no engine can be faster."""
    return prefill_flops(d.model, prompt_tokens) / (chips * peak_flops(d))


def _decode_bound(d: Deployment, kv_tokens: int, chips: int) -> float:
    """One request's decode step at peak bandwidth and compute, no overheads (batch 1 moves the fewest bytes)."""
    bytes_per_chip = (touched_params(d.model, 1) * d.weight_bytes / chips
                      + kv_tokens * kv_bytes_per_token_per_chip(_scaled(d, chips)))
    memory_s = bytes_per_chip / (d.chip.hbm_bandwidth_gbs * GB)
    compute_s = decode_flops(d.model, 1, kv_tokens, d.kv_keep_fraction) / (chips * peak_flops(d))
    return max(memory_s, compute_s)


def _scaled(d: Deployment, chips: int) -> Deployment:
    """The same deployment on ``chips`` chips: one host as asked, or as many hosts of d's chips per node as needed
    (the last one partly filled), so the cross-host term grows with them.  The search over such counts is monotone
    only between host boundaries: a count it returns meets the target, a smaller one across a boundary might too."""
    nodes = 1 if d.nodes == 1 else min(chips, math.ceil(chips / d.chips_per_node))
    return Deployment(chip=d.chip, model=d.model, chips=chips, memory_utilization=d.memory_utilization,
                      weight_bytes=d.weight_bytes, kv_keep_fraction=d.kv_keep_fraction, efficiency=d.efficiency,
                      nodes=nodes, expert_parallel=d.expert_parallel,
                      tensor_parallel=d.tensor_parallel if d.tensor_parallel and chips % d.tensor_parallel == 0
                      else 0)


def _memory_verdict(d: Deployment, e: Estimate) -> Verdict:
    sequence = e.prompt_tokens + e.output_tokens
    if not e.fits:
        per_chip = d.chip.hbm_gb * d.memory_utilization
        return Verdict(
            "memory", False,
            f"{d.model.name} does not fit on {_on(d)}: {e.weights_gb:.1f} GB of {e.weight_format} weights plus "
            f"{d.efficiency.workspace_gb:g} GB workspace per chip and the KV cache of one {sequence}-token request "
            f"exceed {per_chip:.1f} GB per chip ({d.chip.hbm_gb:g} GB x {d.memory_utilization:g}); "
            f"{_chips_text(e.min_chips_for_memory)} are needed. The engine stops at start-up with: "
            f"{e.memory_error}",
            min_chips_peak=e.min_chips_for_memory, min_chips_efficient=e.min_chips_for_memory)
    reason = (f"fits on {_on(d)}: {e.weights_gb:.1f} GB of {e.weight_format} weights, KV cache for "
              f"{e.kv_capacity_tokens} tokens = {e.max_concurrency} concurrent {sequence}-token requests")
    if e.concurrency > e.max_concurrency:
        reason += (f"; {e.concurrency - e.max_concurrency} of the {e.concurrency} concurrent requests wait for KV "
                   f"space (TPOT jumps when the cache fills: vllm-ascend FAQ #22)")
    return Verdict("memory", True, reason)


def _judge_ttft(d: Deployment, e: Estimate, target_s: float) -> Verdict:
    bound = _prefill_bound(d, e.prompt_tokens, d.chips)
    m_peak = _min_chips(lambda n: _prefill_bound(d, e.prompt_tokens, n), target_s)
    m_eff = _min_chips(lambda n: prefill_seconds(_scaled(d, n), e.prompt_tokens), target_s)
    facts = dict(target_ms=target_s * 1e3, predicted_ms=e.ttft_worst_s * 1e3, bound_ms=bound * 1e3,
                 min_chips_peak=m_peak, min_chips_efficient=m_eff)
    target = _ms_text(target_s * 1e3)
    if bound > target_s:
        return Verdict("ttft", False, (
            f"prefill of {e.prompt_tokens} tokens ({e.prefill_flops:.3g} FLOP) needs at least {_s_text(bound)} on "
            f"{_on(d)} even at peak compute ({peak_flops(d) / 1e12:g} TFLOPS each); ttft={target} would need "
            f"{_chips_text(m_peak)} at peak ({_chips_text(m_eff).removeprefix('at least ')} at "
            f"{d.efficiency.compute:.0%} compute efficiency with the per-step overheads), with perfect scaling"),
            **facts)
    if e.ttft_worst_s > target_s:
        predicted, concurrency_fix = f"predicted TTFT {_s_text(e.ttft_worst_s)}", None
        if e.concurrency > 1:
            predicted += (f" at concurrency {e.concurrency} (the last of {e.concurrency} prompts arriving together "
                          f"waits for the prefills ahead of it; a single request takes {_s_text(e.ttft_s)})")
            fitting = int(target_s // e.ttft_s)
            concurrency_fix = f"concurrency <= {fitting}" if fitting >= 1 else None
        return Verdict("ttft", False, (
            f"{predicted} exceeds {target} at {d.efficiency.compute:.0%} compute efficiency "
            f"(peak bound {_s_text(bound)}); needs "
            f"{_fixes(d, concurrency_fix, m_eff, _hosts_fix(e, 'ttft_worst', e.ttft_worst_s, target_s))}"),
            **facts)
    return Verdict("ttft", True, f"predicted TTFT {_s_text(e.ttft_worst_s)} <= {target} "
                                 f"(peak bound {_s_text(bound)})", **facts)


def _judge_tpot(d: Deployment, e: Estimate, target_s: float) -> Verdict:
    kv_tokens = _average_context(e.prompt_tokens, e.output_tokens)
    bound = _decode_bound(d, kv_tokens, d.chips)
    m_peak = _min_chips(lambda n: _decode_bound(d, kv_tokens, n), target_s)
    m_eff = _min_chips(lambda n: decode_step_seconds(_scaled(d, n), 1, kv_tokens), target_s)
    facts = dict(target_ms=target_s * 1e3, predicted_ms=e.tpot_s * 1e3, bound_ms=bound * 1e3,
                 min_chips_peak=m_peak, min_chips_efficient=m_eff)
    target = _ms_text(target_s * 1e3)
    if e.output_tokens < 2:
        return Verdict("tpot", True, "one output token: TPOT is 0 by vLLM's definition", **facts)
    if bound > target_s:
        moved = (touched_params(d.model, 1) * d.weight_bytes / d.chips
                 + kv_tokens * kv_bytes_per_token_per_chip(d)) / GB
        return Verdict("tpot", False, (
            f"each decode step moves at least {moved:.2f} GB per chip (active weights + the KV of a "
            f"{kv_tokens}-token context), {_s_text(bound)} on {_on(d)} even at peak bandwidth "
            f"({d.chip.hbm_bandwidth_gbs:g} GB/s each); tpot={target} would need {_chips_text(m_peak)} at peak "
            f"({_chips_text(m_eff).removeprefix('at least ')} at {d.efficiency.bandwidth:.0%} bandwidth "
            f"efficiency with the per-step overheads), with perfect scaling"), **facts)
    if e.tpot_s > target_s:
        interference = e.tpot_s - e.decode_step_s
        batch_fix = _largest_batch_meeting_tpot(d, e, target_s)
        hosts = _hosts_fix(e, "tpot", e.tpot_s, target_s)
        return Verdict("tpot", False, (
            f"predicted TPOT {_s_text(e.tpot_s)} at a running batch of {e.running_batch} (decode step "
            f"{_s_text(e.decode_step_s)} + {_s_text(interference)} of other requests' prefills) exceeds {target} "
            f"(peak bound {_s_text(bound)}); needs "
            f"{_fixes(d, f'concurrency <= {batch_fix}' if batch_fix else None, m_eff, hosts)}"),
            **facts)
    return Verdict("tpot", True, f"predicted TPOT {_s_text(e.tpot_s)} <= {target} at a running batch of "
                                 f"{e.running_batch} (peak bound {_s_text(bound)})", **facts)


def _largest_batch_meeting_tpot(d: Deployment, e: Estimate, target_s: float) -> int:
    steps = e.output_tokens - 1
    best = 0
    for batch in range(1, e.running_batch + 1):
        decode = decode_step_seconds(d, batch, batch * _average_context(e.prompt_tokens, e.output_tokens))
        if decode + (batch - 1) * e.ttft_s / steps > target_s:
            break
        best = batch
    return best


def _judge_e2el(d: Deployment, e: Estimate, target_s: float) -> Verdict:
    kv_tokens = _average_context(e.prompt_tokens, e.output_tokens)
    steps = e.output_tokens - 1

    def bound_at(chips: int) -> float:
        return _prefill_bound(d, e.prompt_tokens, chips) + steps * _decode_bound(d, kv_tokens, chips)

    def predicted_at(chips: int) -> float:
        at = _scaled(d, chips)
        return prefill_seconds(at, e.prompt_tokens) + steps * decode_step_seconds(at, 1, kv_tokens)

    bound = bound_at(d.chips)
    m_peak = _min_chips(bound_at, target_s)
    m_eff = _min_chips(predicted_at, target_s)
    facts = dict(target_ms=target_s * 1e3, predicted_ms=e.e2el_s * 1e3, bound_ms=bound * 1e3,
                 min_chips_peak=m_peak, min_chips_efficient=m_eff)
    target = _ms_text(target_s * 1e3)
    if bound > target_s:
        return Verdict("e2el", False, (
            f"prefill of {e.prompt_tokens} tokens plus {steps} decode steps need at least {_s_text(bound)} on "
            f"{_on(d)} even at peak compute and bandwidth; e2el={target} would need {_chips_text(m_peak)} at peak "
            f"({_chips_text(m_eff).removeprefix('at least ')} at the model's efficiency and overheads), with "
            f"perfect scaling"),
            **facts)
    if e.e2el_s > target_s:
        hosts = _hosts_fix(e, "e2el", e.e2el_s, target_s)
        return Verdict("e2el", False, (
            f"predicted E2EL {_s_text(e.e2el_s)} (TTFT {_s_text(e.ttft_worst_s)} + {steps} x TPOT "
            f"{_s_text(e.tpot_s)}) exceeds {target} (peak bound {_s_text(bound)}); needs "
            f"{_fixes(d, 'a lower concurrency' if e.concurrency > 1 else None, m_eff, hosts)}"), **facts)
    return Verdict("e2el", True, f"predicted E2EL {_s_text(e.e2el_s)} <= {target} (peak bound {_s_text(bound)})",
                   **facts)


_JUDGES = {"ttft": _judge_ttft, "tpot": _judge_tpot, "e2el": _judge_e2el}


def _ms_text(ms: float) -> str:
    return f"{ms:g}ms"


def _s_text(seconds: float) -> str:
    """Durations as people read them: ms below a second, s above, minutes past ten minutes."""
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 600:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def duration_text(seconds: float) -> str:
    return _s_text(seconds)
