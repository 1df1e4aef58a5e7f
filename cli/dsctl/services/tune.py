"""The tune verb, ``--simulate``: search an engine's parameters against SLOs on the offline evaluator.

The recipe is dsctl.core.tune's (its ``__init__`` shows it): parse the SLOs, resolve the space (``--param``
overrides), refuse a physically impossible SLO before any evaluation (`screens.impossible`, exit 6), then the one
tune driver (`dsctl.services.tune_driver.drive`, as the live tune) runs the study on `SimulatedTrials` with the
roofline and model screens and writes ``trials.jsonl`` and ``pareto.png`` in the run directory.
The evaluator is the engine's own offline model: a candidate's engine parameters become an
`engine_config.EngineConfig` and `dsctl.core.perf.evaluate.evaluate` runs it on the same requests ``dsctl probe``
would send.  A configuration the engine's start-up plan refuses (``StartupFailure``: torch_npu's out-of-memory
words, vLLM's "No available memory for the cache blocks", its token-budget ValueErrors) and one that fails under
load (aclrtMalloc) are classified from those words by `search.classify_failure`, as the live tuner classifies a
log tail.

Objective ``capacity`` (the default): each candidate's highest offered rate that it sustains while meeting every
SLO is searched (`rate_search.search_rate`, up to `capacity.rate_ceiling`: twice estimate's throughput bound).
Every probe is sized by `capacity.probe_size` (the sample-size rule for the SLOs' statistics, a warm-up at the same
rate kept out of the statistics, a window of at least `capacity.SIM_WINDOW_S` virtual seconds) and judged on its
window (`capacity.window_metrics`: the SLOs, and sustained: achieved throughput within 5 % of offered, the queue not
growing).  ``goodput`` / ``throughput``: the same search, the figure at the highest rate that held; with ``rate``
(goodput at a fixed load) one probe of that size at that rate.  ``requests`` is a floor on a probe's measured
requests, refused below the sample-size rule (`capacity.check_floor`).

An instance over several hosts (``nodes`` > 1, vllm-ascend only): ``npus_per_instance`` NPUs, ``npus_per_instance /
nodes`` on each host; the space's layout knobs are searched with the other knobs -- tensor_parallel_size over the
divisors of one node's NPUs, data_parallel_size = NPUs / TP (TP x local DP = the node's NPUs, vllm-ascend
Multi-Node-DP) and, for a MoE model, enable_expert_parallel.  The evaluator models the layout (engine_config's
docstring): a MoE model's DP ranks as one lockstep instance over all the NPUs, with the traffic between hosts; a
dense model's as independent replicas.  Capacity per NPU divides by all of the instance's NPUs.

Exit statuses (``TuneResult.exit_status``): 0 a configuration met the SLO; 6 none did (``errors`` names the
closest configuration and its binding constraint).  An impossible SLO raises DsctlError with exit 6 before any
evaluation; bad inputs raise UsageError (exit 2).  The study journal (``study.journal``) makes a run resumable
(``resume=True`` on the same run directory with the same space, SLOs and objective): finished trials are kept and
not evaluated again.

Progress records: the driver's (``dsctl_note``, ``dsctl_tune_trial``; `dsctl.services.tune_driver`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.core.load import arrivals, limits
from dsctl.core.load.workload import LengthSpec, Workload
from dsctl.core.perf import engine_config, evaluate, perfmodel
from dsctl.core.perf.engine_config import CONTINUOUS, FIXED_BATCH, EngineConfig
from dsctl.core.perf.estimate import WEIGHT_FORMATS
from dsctl.core.tune import capacity, quality, rate_search, screens, search, slo
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import Candidate, Failure, Outcome, SearchResult, SearchSettings
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services import tune_driver
from dsctl.services.ports import ProgressSink, no_progress
from dsctl.services.tune_driver import MAX_REQUESTS, StudyPlan, length, shortest
from dsctl.services.tune_result import TuneResult, capacity_figure

ENGINES = ("lab-engine", "vllm-ascend")
MAX_BUDGET = 1000
# Rate search bounds (req/s): the lowest rate worth reporting and, without an estimate's bound (capacity.rate_ceiling),
# a ceiling; the first probe at START_RATE, doubling or halving from there, then bisection to RATE_TOLERANCE.
# Simulated probes cost no wall time, so the bracket is narrowed to 2 % (live: tune_live's 15 %): at 10 % every
# capacity fell on the same few rates (common random numbers send every candidate through the same probes) and
# the landscapes' tops were steps of 8 % (bench/tune.py chat-fixed: every method at 91.7 % of the optimum).
MIN_RATE, MAX_RATE, START_RATE, RATE_TOLERANCE, RATE_PROBES = 0.05, 256.0, 1.0, 0.02, 16
# EngineConfig fields the offline evaluator models, by registry name (the rest of the registry is not simulated).
_MODELLED = frozenset(f.name for f in dataclasses.fields(EngineConfig)) - {
    "model", "chip", "mode", "weight_bytes", "alloc_conf", "visible_npus", "nodes"}
# --weights: bytes per parameter, as dsctl estimate takes them (W8A8 checkpoints: int8)
WEIGHTS_NAMES = {value: name for name, value in WEIGHT_FORMATS.items()}
DEFAULT_NPUS_PER_HOST = 8  # an Atlas 800T A2; a chip profile's npus_per_host when it has one


@dataclass(frozen=True)
class TuneInputs:
    model: str
    chip: str
    slos: tuple[str, ...]  # --slo values, e.g. ("ttft=200ms", "tpot:p90=50ms")
    run_dir: Path | None  # holds study.journal, trials.jsonl, pareto.png; None: a new one, once the inputs are checked
    engine: str = "lab-engine"
    space: str | None = None  # default: the engine's (tune_spaces.yaml default_for)
    objective: str = "capacity"
    budget: int = 20  # evaluations
    slots: int = 1  # evaluations at once
    seed: int = 0
    prompt_tokens: str = "512"  # as dsctl probe takes them: N, uniform:LO:HI, normal:MEAN:STD
    output_tokens: str = "128"
    requests: int | None = None  # floor on a probe's measured requests; None: the sample-size rule (capacity)
    rate: float | None = None  # req/s (Poisson); None: search each candidate's highest sustained SLO-holding rate
    params: tuple[str, ...] = ()  # --param overrides
    npus_per_instance: int = 1  # all of the instance's NPUs (over every node)
    max_model_len: int | None = None  # None: the model's own (as the engine does)
    resume: bool = False
    screen: str = "model"  # "model": the roofline, then the offline engine model; "roofline": the bound; "none"
    # the simulated hardware's efficiencies (perfmodel.Efficiency) when not dsctl's profile: bench/tune.py's ground
    # truth; the screens always predict with the profile
    hardware: Any = None
    window_s: float = capacity.SIM_WINDOW_S  # a probe's least measured window (virtual seconds)
    nodes: int = 1  # hosts the instance spans, npus_per_instance / nodes NPUs each
    weight_bytes: float = 2.0  # per parameter: 2 bf16, 1 int8 (W8A8)
    # PYTORCH_NPU_ALLOC_CONF the simulated engine runs with; None: what dsctl provision writes (the memory env's
    # default, ascend_env.yaml), since that is the env every instance dsctl deploys starts under
    alloc_conf: str | None = None

    @property
    def npus_per_node(self) -> int:
        return self.npus_per_instance // max(1, self.nodes)


def _longest(spec: LengthSpec) -> int:
    """The most tokens a request of ``spec`` has (a normal spec: three standard deviations above its mean)."""
    if spec.kind == "uniform":
        return int(spec.b)
    if spec.kind == "normal":
        return int(spec.a + 3 * spec.b)
    return int(spec.a)


def _check(inputs: TuneInputs) -> None:
    if inputs.engine not in ENGINES:
        raise UsageError(f"--engine {inputs.engine!r}: --simulate models {' or '.join(ENGINES)}")
    tune_driver.check_inputs(inputs, SearchSettings(budget=inputs.budget, slots=inputs.slots, seed=inputs.seed,
                                                    objective=inputs.objective),
                             max_budget=MAX_BUDGET, unit="", max_rate=MAX_RATE, slots=inputs.slots)
    if inputs.npus_per_instance < 1:
        raise UsageError(f"--npus must be at least 1, got {inputs.npus_per_instance}")
    if inputs.nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {inputs.nodes}")
    if inputs.weight_bytes not in WEIGHT_FORMATS.values():
        raise UsageError(f"--weights: {inputs.weight_bytes:g} bytes per parameter is not one of "
                         f"{', '.join(WEIGHT_FORMATS)}")
    if inputs.nodes > 1:
        if inputs.engine != "vllm-ascend":
            raise UsageError(f"--nodes {inputs.nodes}: {inputs.engine} has no data parallelism, so its instance "
                             f"cannot span hosts; use --engine vllm-ascend (vllm-ascend Multi-Node-DP)")
        if inputs.npus_per_instance % inputs.nodes:
            raise UsageError(f"--nodes {inputs.nodes}: the instance's {inputs.npus_per_instance} NPUs do not split "
                             f"evenly over {inputs.nodes} hosts; give --npus a multiple of --nodes (or "
                             f"--npus-per-node)")
        host = npus_per_host(inputs.chip)
        if inputs.npus_per_node > host:
            raise UsageError(f"--nodes {inputs.nodes}: {inputs.npus_per_node} NPUs per host, but a {inputs.chip} host "
                             f"holds {host}; use more --nodes or fewer --npus")
    if inputs.max_model_len is not None:  # the engine refuses a context longer than the model's (vLLM: max_model_len)
        context = perfmodel.model_by_name(inputs.model).max_model_len
        try:  # one prompt token and one output token at least; at most the model's context
            limits.number("--max-model-len", inputs.max_model_len, 2, context, f"tokens ({inputs.model}'s context)")
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def resolve(inputs: TuneInputs) -> tuple[tuple[slo.Slo, ...], space_mod.SearchSpace, Workload]:
    """Validate every input (UsageError, one line); no I/O."""
    _check(inputs)
    slos = slo.parse_slos(inputs.slos)
    capacity.check_floor(slos, inputs.requests)
    name = inputs.space or space_mod.default_space(inputs.engine)
    fixed = {} if inputs.max_model_len is None else {"max_model_len": inputs.max_model_len}
    moe = _is_moe(inputs.model)
    space = space_mod.resolve_space(name, npus_per_instance=inputs.npus_per_instance, params=fixed,
                                    overrides=inputs.params, nodes=inputs.nodes, moe=moe)
    if space.engine != inputs.engine:
        raise UsageError(f"--space {name}: it tunes {space.engine}, not --engine {inputs.engine}")
    unmodelled = sorted({k.param for k in space.knobs if not k.parallel} - _MODELLED)
    if unmodelled:
        raise UsageError(f"--param {unmodelled[0]}: --simulate does not model it; tune it live or drop it")
    expert = next((k for k in space.knobs if k.param == "enable_expert_parallel"), None)
    if moe is False and expert is not None and True in expert.values:
        raise UsageError(f"--param {expert.source.removeprefix('--param ') or 'enable_expert_parallel'}: "
                         f"{inputs.model} is a dense model (no routed experts in dsctl/data/profiles.yaml), so there "
                         f"are no experts to shard; drop enable_expert_parallel")
    workload = Workload(length(inputs.prompt_tokens, "--prompt-tokens"),
                        length(inputs.output_tokens, "--output-tokens"), seed=inputs.seed)
    return slos, space, workload


def engine_config_for(inputs: TuneInputs, space: space_mod.SearchSpace, candidate: Candidate) -> EngineConfig:
    """The engine a candidate starts: its parameters and fields on the model, chip and instance of the run.

    The lab engine runs fixed-batch when --batch-size or --stream-num is given (engine_params.yaml), else
    continuous batching, like vllm-ascend."""
    params = {**space.fixed, **candidate.params}
    values = {k: v for k, v in {**params, **candidate.fields}.items() if k in _MODELLED}
    fixed_batch = inputs.engine == "lab-engine" and ("batch_size" in params or "stream_num" in params)
    if "pa_shape_list" in values:
        values["pa_shape_list"] = tuple(values["pa_shape_list"])
    if inputs.nodes > 1 and "tensor_parallel_size" not in values:  # no layout knob: TP one node, DP one per node
        values["tensor_parallel_size"] = inputs.npus_per_node
        values["data_parallel_size"] = inputs.nodes
    values.setdefault("tensor_parallel_size", inputs.npus_per_instance)
    alloc_conf = inputs.alloc_conf if inputs.alloc_conf is not None else deployed_alloc_conf()
    return EngineConfig(model=inputs.model, chip=inputs.chip, mode=FIXED_BATCH if fixed_batch else CONTINUOUS,
                        visible_npus=inputs.npus_per_node, efficiency=inputs.hardware, nodes=inputs.nodes,
                        weight_bytes=inputs.weight_bytes, alloc_conf=alloc_conf, **values)


def deployed_alloc_conf() -> str:
    """PYTORCH_NPU_ALLOC_CONF of the env dsctl provision writes by default (expandable segments: vllm-ascend FAQ
    #12, the field guide), so that --simulate judges a long prompt as the deployed engine would, not as one started
    with the vendor's fragmenting default."""
    from dsctl.core.fleet import ascend_env

    return ascend_env.default_env().get("PYTORCH_NPU_ALLOC_CONF", "")


def _is_moe(model: str) -> bool | None:
    """Whether dsctl's profile of ``model`` has routed experts (None: no profile; the evaluator refuses it later)."""
    from dsctl.core.perf import perfmodel

    try:
        return perfmodel.model_by_name(model).is_moe
    except DsctlError:
        return None


def npus_per_host(chip: str) -> int:
    """NPUs one host of ``chip`` holds (profiles.yaml npus_per_host; an Atlas 800T A2's 8 without one)."""
    from dsctl.core.perf import perfmodel

    try:
        return perfmodel.chip_by_name(chip).npus_per_host or DEFAULT_NPUS_PER_HOST
    except DsctlError:
        return DEFAULT_NPUS_PER_HOST


def instance_npus(*, nodes: int, npus: int | None, npus_per_node: int | None, chip: str) -> int:
    """The instance's NPUs from the CLI's --nodes, --npus and --npus-per-node (UsageError, one line, when they
    disagree): one host: --npus (default 1); several: --npus, or --nodes x --npus-per-node (default: a host's NPUs)."""
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    if npus_per_node is not None and npus_per_node < 1:
        raise UsageError(f"--npus-per-node must be at least 1, got {npus_per_node}")
    if nodes == 1:
        if npus is not None and npus_per_node is not None and npus != npus_per_node:
            raise UsageError(f"--npus {npus} and --npus-per-node {npus_per_node} disagree on one host; give one")
        return npus if npus is not None else (npus_per_node or 1)
    if npus is None:
        return nodes * (npus_per_node or npus_per_host(chip))
    if npus % nodes:
        raise UsageError(f"--nodes {nodes}: the instance's {npus} NPUs do not split evenly over {nodes} hosts; give "
                         f"--npus a multiple of --nodes (or --npus-per-node)")
    if npus_per_node is not None and npus != nodes * npus_per_node:
        raise UsageError(f"--npus {npus} is not --nodes {nodes} x --npus-per-node {npus_per_node}; give one of them")
    return npus


def _failure(status: str, message: str) -> Failure:
    failure = search.classify_failure(message)
    if status == evaluate.FAILED_TO_START and failure == Failure.ERROR and message.startswith("ValueError"):
        return Failure.BAD_FLAG  # the engine refused its arguments before it listened
    return failure


def simulator(inputs: TuneInputs, slos: tuple[slo.Slo, ...], space: space_mod.SearchSpace, workload: Workload):
    """The `search.Evaluator` of --simulate: one candidate -> an `Outcome` from the offline evaluator."""
    bounds = slo.goodput_bounds_ms(slos)
    ceiling = rate_ceiling(inputs, workload, space)

    def run(config: EngineConfig, rate: float, seed: int) -> tuple[evaluate.Evaluation, dict[str, Any]]:
        size = capacity.probe_size(slos, rate, min_window_s=inputs.window_s, floor=inputs.requests,
                                   max_requests=MAX_REQUESTS)
        e = evaluate.evaluate(config, workload, arrivals.ArrivalSpec(process="poisson", rate=rate),
                              size.requests, seed=seed, goodput_ms=bounds)
        return e, capacity.window_metrics(e.records, size.warmup, required=size.rule, goodput_ms=bounds)

    def evaluator(candidate: Candidate) -> Outcome:
        config = engine_config_for(inputs, space, candidate)
        try:
            engine_config.plan(config)
        except engine_config.StartupFailure as exc:
            return Outcome(failure=_failure(evaluate.FAILED_TO_START, exc.message), detail=exc.message,
                           data={"log_tail": exc.message})
        if inputs.rate is not None:
            e, metrics = run(config, inputs.rate, inputs.seed)
            if not e.ok:
                return Outcome(metrics=metrics if e.metrics else None, failure=_failure(e.status, e.message),
                               detail=e.message, rate=inputs.rate, agreement=e.agreement, data={"log_tail": e.message})
            return Outcome(metrics=metrics, rate=inputs.rate, agreement=e.agreement)
        crashed: list[evaluate.Evaluation] = []
        probed: dict[float, int] = {}

        def probe(rate: float) -> dict[str, Any]:
            # Common random numbers: every rate's first probe, of every candidate, draws the same requests and the
            # same arrival pattern (scaled to the rate), so verdicts across rates and candidates differ by the
            # engine, not by the draw (seeded per probe, the optimum's capacity varied 0.56-2.7 req/s with the
            # seed: bench/landscape.py chat-fixed).  A repeat at a rate is a new draw: it measures the noise.
            repeat = probed.get(rate, 0)
            probed[rate] = repeat + 1
            e, metrics = run(config, rate, inputs.seed + repeat)
            if not e.ok:
                crashed.append(e)
                return {**metrics, "completed": 0}  # the engine died at this rate: it holds nothing there
            return metrics

        found = rate_search.search_rate(probe, slos, start=min(START_RATE, ceiling),
                                        min_rate=capacity.rate_floor(ceiling, floor=MIN_RATE),
                                        max_rate=ceiling, max_probes=RATE_PROBES, rel_tol=RATE_TOLERANCE,
                                        repeats=1)
        outcome = rate_search.to_outcome(found)
        if found.rate is None and crashed and len(crashed) == len(found.probes):
            last = crashed[-1]  # it failed at every rate tried: the engine dies under this load, not an SLO miss
            return Outcome(failure=_failure(last.status, last.message), detail=last.message,
                           data={"log_tail": last.message, **outcome.data})
        return dataclasses.replace(outcome, agreement=agreement(config))

    return evaluator


def rate_ceiling(inputs: TuneInputs, workload: Workload, space: space_mod.SearchSpace | None = None) -> float:
    """The rate search's upper end: `capacity.rate_ceiling` of estimate's throughput bound for the workload's
    shortest requests (an upper bound for every configuration), `MAX_RATE` when estimate has none."""
    prompt, output = shortest(workload.prompt_len), shortest(workload.output_len)
    if inputs.nodes == 1:  # as it always was: one TP group of the instance's NPUs
        bound = capacity.throughput_bound(chip=inputs.chip, model=inputs.model, prompt_tokens=prompt,
                                          output_tokens=output, npus=inputs.npus_per_instance,
                                          weight_bytes=inputs.weight_bytes)
        return capacity.rate_ceiling(bound, fallback=MAX_RATE)
    # Over several hosts the layouts differ by more than a tolerance (a DP group's KV, replicated weights, the
    # traffic between hosts): the ceiling is the largest of estimate's bounds over the layouts the space can sample.
    bounds = [b for b in (capacity.throughput_bound(chip=inputs.chip, model=inputs.model, prompt_tokens=prompt,
                                                    output_tokens=output, npus=inputs.npus_per_instance,
                                                    weight_bytes=inputs.weight_bytes, nodes=inputs.nodes,
                                                    tensor_parallel=tp, expert_parallel=ep, moe=_is_moe(inputs.model))
                          for tp, ep in layouts(inputs, space)) if b is not None]
    return capacity.rate_ceiling(max(bounds) if bounds else None, fallback=MAX_RATE)


def layouts(inputs: TuneInputs, space: space_mod.SearchSpace | None = None) -> list[tuple[int, bool]]:
    """(TP, expert parallel) of every layout a run over several hosts can sample: TP dividing one node's NPUs
    (narrowed by --param), expert parallel on and off for a MoE model."""
    if space is None:
        space = resolve(inputs)[1]
    tp = next((k for k in space.knobs if k.parallel), None)
    tps = tuple(tp.choices) if tp is not None else (int(space.fixed.get("tensor_parallel_size") or
                                                        inputs.npus_per_node),)
    ep = next((k for k in space.knobs if k.param == "enable_expert_parallel"), None)
    eps = tuple(ep.values) if ep is not None else (bool(space.fixed.get("enable_expert_parallel", False)),)
    return [(t, e) for t in tps for e in eps]


def layout_of(inputs: TuneInputs, record: TrialRecord, space: space_mod.SearchSpace | None = None
              ) -> dict[str, Any]:
    """A trial's layout: TP per DP rank, total DP (and per node), expert parallel, hosts x NPUs per host."""
    if space is None:
        space = resolve(inputs)[1]
    config = engine_config_for(inputs, space, Candidate(record.number, dict(record.config), dict(record.params),
                                                        dict(record.fields), False))
    moe = _is_moe(inputs.model) is True
    return {"tensor_parallel_size": config.tensor_parallel_size, "data_parallel_size": config.data_parallel_size,
            "data_parallel_size_local": config.data_parallel_size // inputs.nodes,
            "enable_expert_parallel": bool(config.enable_expert_parallel) and moe, "moe": moe,
            "nodes": inputs.nodes, "npus_per_node": inputs.npus_per_node, "npus": inputs.npus_per_instance}


def layout_text(layout: dict[str, Any]) -> str:
    """``TP 4 x DP 4 (2 per host) over 2 hosts x 8 NPUs, expert parallel over 16 NPUs``."""
    tp, dp, nodes = layout["tensor_parallel_size"], layout["data_parallel_size"], layout["nodes"]
    text = f"TP {tp} x DP {dp}"
    if nodes > 1:
        text += f" ({layout['data_parallel_size_local']} per host) over {nodes} hosts x {layout['npus_per_node']} NPUs"
    else:
        text += f" on {layout['npus']} NPU{'s' if layout['npus'] != 1 else ''} of one host"
    if layout["enable_expert_parallel"]:
        text += f", expert parallel over {layout['npus']} NPUs"
    elif layout.get("moe") and dp > 1:
        text += f", experts tensor-parallel over {layout['npus']} NPUs (no expert parallel)"
    elif dp > 1:
        text += f": {dp} independent replicas"
    return text


def _weights_name(weight_bytes: float) -> str:
    return WEIGHTS_NAMES.get(weight_bytes, f"{weight_bytes:g} B/param")


MODEL_REQUESTS = 50  # requests of one model prediction (virtual time: well under a second)
MODEL_BURST_REQUESTS = 64  # the most requests of the memory check's step at full concurrency (screens.UnderLoad)
BURST_RATE = 1e6  # req/s: "at once"


def model_predictor(inputs: TuneInputs, slos: tuple[slo.Slo, ...], space: space_mod.SearchSpace,
                    workload: Workload, *, seed_offset: int = 1) -> screens.Predictor:
    """For `screens.model_screen`: a candidate's start-up on the offline engine model, then its metrics at the
    lowest load the tune probes (``rate``, or the rate search's floor).  Its requests are drawn with another seed
    than the evaluation's (``seed_offset``), as a model's prediction would differ from a measurement.  It predicts
    with dsctl's profile, whatever hardware the evaluations run on (``inputs.hardware``)."""
    inputs = dataclasses.replace(inputs, hardware=None)
    bounds = slo.goodput_bounds_ms(slos)
    rate = inputs.rate if inputs.rate is not None else capacity.rate_floor(
        rate_ceiling(inputs, workload, space), floor=MIN_RATE)
    requests = MODEL_REQUESTS if inputs.requests is None else min(inputs.requests, MODEL_REQUESTS)

    def predict(candidate: Candidate) -> tuple[str | None, dict | None]:
        config = engine_config_for(inputs, space, candidate)
        try:
            engine_config.plan(config)
        except engine_config.StartupFailure as exc:
            return exc.message, None
        e = evaluate.evaluate(config, workload, arrivals.ArrivalSpec(process="poisson", rate=rate), requests,
                              seed=inputs.seed + seed_offset, goodput_ms=bounds)
        return None, dict(e.metrics) if e.ok and e.metrics else None

    return predict


def build_screen(inputs: TuneInputs, slos: tuple[slo.Slo, ...], space: space_mod.SearchSpace, workload: Workload,
                 *, min_agreement: float | None = None
                 ) -> tuple[search.Screen | None, screens.ModelScreen | None]:
    """The screen of a run (``inputs.screen``: the roofline, then the model; the roofline alone; none) and its model
    screen, whose counts a caller may read (bench/tune.py builds the same screen with it).  The live tune screens
    with it too, on the ``inputs`` of its service's model (``min_agreement``: its quality floor)."""
    if inputs.screen == "none":
        return None, None
    roofline = screens.roofline_screen(chip=inputs.chip, model=inputs.model, prompt_tokens=shortest(
        workload.prompt_len), output_tokens=shortest(workload.output_len), slos=slos,
        npus_per_instance=inputs.npus_per_instance, weight_bytes=inputs.weight_bytes)
    if inputs.screen != "model":
        return roofline, None
    floor = quality.DEFAULT_MIN_AGREEMENT if min_agreement is None else min_agreement
    model = screens.model_screen(model_predictor(inputs, slos, space, workload), slos, budget=inputs.budget,
                                 min_agreement=floor, agreement_of=model_agreement(inputs, space),
                                 memory_check=model_memory(inputs, space, workload))
    return screens.combined(roofline, model), model


def model_memory(inputs: TuneInputs, space: space_mod.SearchSpace, workload: Workload, *, seed_offset: int = 1
                 ) -> Callable[[Candidate], str | screens.UnderLoad | None]:
    """For `screens.model_screen`: the engine's memory arithmetic on a candidate, with dsctl's profile: its start-up
    (engine_config.plan: weights, KV cache, the argument checks; the refusal message) and one step at full
    concurrency (an `screens.UnderLoad`); None when both hold."""
    inputs = dataclasses.replace(inputs, hardware=None)
    longest = _longest(workload.prompt_len)
    if inputs.max_model_len is not None:
        longest = min(longest, inputs.max_model_len - 1)
    burst = Workload(LengthSpec("fixed", float(longest)), LengthSpec("fixed", 1.0), seed=inputs.seed + seed_offset)

    def check(candidate: Candidate) -> str | screens.UnderLoad | None:
        config = engine_config_for(inputs, space, candidate)
        try:
            plan = engine_config.plan(config)
        except engine_config.StartupFailure as exc:
            return exc.message
        # Full concurrency: as many of the workload's longest prompts as the engine admits at once (bounded),
        # arriving together, one output token each (the KV cache is reserved at start; a step's activations are what
        # a burst adds).  A 100 s probe near capacity meets it: with prompts drawn from the workload instead, the
        # check let batch 2 x 2 streams of 32K-64K prompts through, which then died in the rate search.
        at_once = max(1, min(plan.config.max_num_seqs, MODEL_BURST_REQUESTS))
        peak = evaluate.evaluate(config, burst, arrivals.ArrivalSpec(process="constant", rate=BURST_RATE), at_once,
                                 seed=inputs.seed + seed_offset)
        if peak.status == evaluate.FAILED_UNDER_LOAD and not peak.message.startswith("HTTP 400"):
            return screens.UnderLoad(peak.message, f"{at_once} prompts of {longest} tokens at once")
        return None

    return check


def quality_narrowed(inputs: TuneInputs, space: space_mod.SearchSpace, *, min_agreement: float | None = None,
                     baseline: Mapping[str, Any] | None = None) -> tuple[space_mod.SearchSpace, tuple[str, ...]]:
    """``space`` with its lossy knobs narrowed to what the model screen's quality verdict lets through
    (`screens.quality_narrowed`), and the notes to show; unchanged unless the model screen runs."""
    if inputs.screen != "model" or not space.lossy:
        return space, ()
    floor = quality.DEFAULT_MIN_AGREEMENT if min_agreement is None else min_agreement
    return screens.quality_narrowed(space, model_agreement(inputs, space), floor, baseline=baseline)


def model_agreement(inputs: TuneInputs, space: space_mod.SearchSpace) -> Callable[[Candidate], float]:
    """For `screens.model_screen`: a candidate's output agreement with the baseline in dsctl's model."""
    return lambda candidate: agreement(engine_config_for(inputs, space, candidate))


def agreement(config: EngineConfig) -> float:
    """The offline model's output agreement of ``config`` with the unsparsified baseline (1.0 without sparsity)."""
    from dsctl.core.perf import perfmodel

    if not 0 <= config.kv_sparse_threshold < 1:
        return 1.0
    return 1.0 - perfmodel.divergence_probability(perfmodel.kv_keep_fraction(config.kv_sparse_threshold))


def prepare(inputs: TuneInputs) -> tuple[tuple[slo.Slo, ...], space_mod.SearchSpace, Workload]:
    """`resolve`, then refuse an SLO no configuration can meet (DsctlError, exit 6, with the bound); no I/O."""
    slos, space, workload = resolve(inputs)
    shortest_prompt, shortest_output = shortest(workload.prompt_len), shortest(workload.output_len)
    reason = screens.impossible(chip=inputs.chip, model=inputs.model, prompt_tokens=shortest_prompt,
                                output_tokens=shortest_output, slos=slos, npus_per_instance=inputs.npus_per_instance,
                                weight_bytes=inputs.weight_bytes)
    if reason:
        raise DsctlError(f"no configuration of {inputs.model} on {inputs.npus_per_instance} x {inputs.chip} can "
                         f"meet {', '.join(s.label for s in slos)} for {shortest_prompt}-token prompts: {reason}",
                         ExitStatus.SLO_NOT_MET)
    return slos, space, workload


def run(inputs: TuneInputs, *, progress: ProgressSink = no_progress) -> TuneResult:
    """`dsctl tune --simulate`: `prepare` (every refusal before a run directory is made), then the one tune driver
    on the offline engine model."""
    slos, space, workload = prepare(inputs)
    inputs = dataclasses.replace(inputs, run_dir=tune_driver.run_dir_for(inputs.run_dir))
    return tune_driver.drive(SimulatedTrials(inputs, slos, space, workload), progress)


class SimulatedTrials:
    """The tune driver's port on dsctl's offline engine model (`simulator`): nothing restarts, nothing to restore."""

    def __init__(self, inputs: TuneInputs, slos: tuple[slo.Slo, ...], space: space_mod.SearchSpace,
                 workload: Workload):
        self.space, self.narrowed = quality_narrowed(inputs, space)  # the space searched
        self.inputs, self.slos, self.workload = inputs, slos, workload
        self._evaluate = simulator(inputs, slos, self.space, workload)

    @property
    def study(self) -> StudyPlan:
        inputs = self.inputs
        return StudyPlan(run_dir=inputs.run_dir, resume=inputs.resume, budget=inputs.budget, slos=self.slos,
                         settings=SearchSettings(budget=inputs.budget, slots=inputs.slots, seed=inputs.seed,
                                                 objective=inputs.objective,
                                                 npus_per_instance=inputs.npus_per_instance),
                         context={"simulated": True, "model": inputs.model, "chip": inputs.chip})

    def opening(self) -> Sequence[str]:
        inputs, space = self.inputs, self.space
        where = inputs.chip if inputs.nodes == 1 else (f"{inputs.nodes} hosts x {inputs.npus_per_node} {inputs.chip} "
                                                       f"(one instance of {inputs.npus_per_instance} NPUs)")
        return [f"tuning {space.name} ({', '.join(space.names)}) for {', '.join(s.label for s in self.slos)}: "
                f"{inputs.model} on {where}, simulated; budget {inputs.budget}; run directory {inputs.run_dir}"]

    def screening(self) -> tuple[space_mod.SearchSpace, search.Screen | None, Sequence[str]]:
        screen, _ = build_screen(self.inputs, self.slos, self.space, self.workload)
        return self.space, screen, self.narrowed

    def begin(self) -> None:
        pass

    def evaluate(self, candidate: Candidate) -> Outcome:
        return self._evaluate(candidate)

    def event_fields(self, record: TrialRecord) -> Mapping[str, Any]:
        return {}

    def told(self, record: TrialRecord, incumbent: TrialRecord | None) -> None:
        pass

    def interrupted(self) -> None:
        pass  # nothing ran but this process: Ctrl-C goes on (exit 130); the journal keeps what was measured

    def conclude(self, found: SearchResult, started: float) -> TuneResult:
        inputs, space = self.inputs, self.space
        paths = tune_driver.artifacts(found.trials, inputs.run_dir, winner=found.best, slos=self.slos,
                                      title=f"dsctl tune --simulate {inputs.model} on {inputs.chip}")
        errors: tuple[str, ...] = ()
        status = ExitStatus.OK
        if found.best is None:
            status = ExitStatus.SLO_NOT_MET
            errors = (tune_driver.nothing_met(found),)
        layout = None  # shown when the layout was searched (a multi-host instance, or TP / DP among the knobs)
        if found.best is not None and (inputs.nodes > 1 or any(knob.parallel for knob in space.knobs)):
            layout = layout_of(inputs, found.best, space)
        hardware = (f"{inputs.npus_per_instance} x {inputs.chip} over {inputs.nodes} hosts" if inputs.nodes > 1
                    else inputs.chip)
        weights = "" if inputs.weight_bytes == 2.0 else f", {WEIGHTS_NAMES[inputs.weight_bytes]} weights"
        return tune_driver.result(
            found, mode="simulate", subject=f"{inputs.model} on {hardware} ({inputs.engine}, space {space.name}"
                                            f"{weights})", space=space, best=found.best, paths=paths,
            exit_status=status, errors=errors, started=started, layout=layout,
            inputs=tune_driver.echo(inputs, self.slos, {
                "model": inputs.model, "chip": inputs.chip, "engine": inputs.engine, "npus": inputs.npus_per_instance,
                "nodes": inputs.nodes, "npus_per_node": inputs.npus_per_node,
                "weights": _weights_name(inputs.weight_bytes)}))


def rate_text(figure: dict[str, Any]) -> str:
    """``6.2 req/s (1.5 per NPU)``, "≥ ..., not measured above" at the ceiling."""
    return _rate_text(figure)


def _rate_text(figure: dict[str, Any]) -> str:
    rate, per = figure.get("sustained_rate"), figure.get("per_npu")
    if rate is None:
        return "none sustained"
    text = f"{rate:.3g} req/s ({per:.3g} per NPU)"
    return f"≥ {text}, not measured above" if figure.get("at_ceiling") else text


def capacity_line(best: TrialRecord | None, baseline: TrialRecord | None = None) -> str:
    """``capacity: trial 3 sustains 6.2 req/s (1.5 per NPU) against the baseline's 4.1 req/s (1.0 per NPU)``."""
    winner = capacity_figure(best)
    if winner is None:
        return ""
    line = f"capacity: trial {winner['trial']} sustains {_rate_text(winner)}"
    base = capacity_figure(baseline)
    if base is not None and baseline is not best:
        line += f" against the baseline's (trial {base['trial']}) {_rate_text(base)}"
    elif base is not None:
        line += " (the baseline)"
    return line
