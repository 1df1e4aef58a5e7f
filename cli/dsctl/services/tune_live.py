"""The tune verb, live: search a service's engine parameters on the fleet's own instances, and leave the winner.

The recipe (dsctl.core.tune's, as ``--simulate`` runs it, with the fleet as the evaluator):

1. Plan, no host touched: the inventory is read and validated once; the service's instances are the trial slots
   (2 hosts x 2 instances = 4 candidates at once); the space is resolved against the service's engine and
   vllm-ascend release, with ``--param`` overrides; an SLO that no configuration of one instance can meet is
   refused with estimate's bound (exit 6).
2. Baseline: ``dsctl deploy`` of the inventory's configuration for the service's instances (nothing restarts
   when they already run it).  That is the pre-tune state every exit path returns to unless a winner replaces
   it.  When the space has a lossy knob, the baseline's greedy outputs on `quality.PROMPTS` are kept.
3. The search (the one tune driver, `dsctl.services.tune_driver`, as ``--simulate`` runs it: Optuna TPE with
   constraints, journal storage for ``--resume``; `LiveTune` is its port on the fleet): the baseline
   configuration is the first trial; every candidate is checked against the space's dependencies and screened
   with the roofline before any restart.  A trial on slot *i*: deploy the candidate to that one instance through
   deploy's health gate (``--instance``, parameter overrides: the same templates as ``dsctl deploy``; a failed
   start is rolled back by deploy and classified from its log lines), probe it (a short warm-up, then the
   highest request rate it sustains while meeting the SLO, or ``--rate``; every probe is sized by
   `capacity.probe_size` with a window of `capacity.LIVE_WINDOW_S` of the engine's modelled time (the lab
   engine's time scale makes long windows cheap) and judged on it, `capacity.window_metrics`; the search's
   ceiling is twice estimate's throughput bound; a probe stops as soon as the SLO is certainly missed), and
   when it changes a lossy knob, compare its greedy outputs with the baseline's.  An engine that died under load
   is classified from its log tail (``playbooks/service_log.yml``).  Deploys on one host are serialized (one
   service manager per host); probes of all slots run at once.
4. The end, one transaction: every instance of the service gets the winner (parameter overrides, as a trial
   does) or the baseline when nothing beat it, and a probe of each at the winner's rate confirms it.  Only then
   does ``--write-back`` write the winner's parameters into the inventory (`dsctl.adapters.writeback`), so that
   any later deploy reproduces it; whether it can was checked in the plan, before any restart.  A winner that
   does not take (its deploy fails, or with ``--write-back`` its confirmation misses or the write fails) is
   replaced by the baseline on every instance, and result.json says why; so does any exception of the end:
   no instance is left on a trial's configuration.
5. Ctrl-C or SIGTERM at any point: the running trials are stopped (their playbooks interrupted, their probes
   ended), then every instance is deployed back to the inventory's configuration; the study journal keeps what
   was measured, for ``--resume``.

What has only run on the lab: all of it (the lab's stand-in vllm is dsctl's emulated engine).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import posixpath
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters import completions, tune_artifacts, writeback
from dsctl.adapters.ansible_run import PlaybookError
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.inventory.deploy_plan import PlannedInstance, plan_deploy
from dsctl.core.load import generator_limit
from dsctl.core.load.workload import Workload
from dsctl.core.perf import perfmodel
from dsctl.core.serving.service_render import instance_env
from dsctl.core.tune import analysis, capacity, quality, rate_search, screens, search, slo
from dsctl.core.tune import space as space_mod
from dsctl.core.tune.pareto import TrialRecord
from dsctl.core.tune.search import Candidate, Failure, Outcome, SearchResult, SearchSettings
from dsctl.errors import DsctlError, ExitStatus, UsageError
from dsctl.services import deploy as deploy_verb
from dsctl.services import probe as probe_verb
from dsctl.services import tune as tune_sim
from dsctl.services import tune_driver
from dsctl.services.fleet import Fleet, load_fleet
from dsctl.services.ports import PlaybookRunner, Prober, ProgressSink, no_progress
from dsctl.services.tune_driver import MAX_REQUESTS, RESULT, StudyPlan, config_text, length, shortest
from dsctl.services.tune_result import Deployment, TuneResult, Verification

MAX_BUDGET = 200  # restarts: each one is a real engine start on a real instance
# Rate search (req/s of one instance): first probe at START_RATE, doubling or halving, then bisection to
# RATE_TOLERANCE; RATE_PROBES bounds the probes of one trial.
MIN_RATE, MAX_RATE, START_RATE, RATE_TOLERANCE, RATE_PROBES = 0.1, 512.0, 4.0, 0.15, 8
PROBE_TIMEOUT_S = 120.0  # per request; a probe is bounded by its request count times this
PROBE_MAX_S = 300.0  # modelled s: a probe at a low rate sends for at most this long (then marked undersized)
QUALITY_TOKENS = 64
LOG_LINES = 40
RESTORED = "the instances run the inventory's configuration again"  # what a tune without a winner leaves
STOP_WAIT_S = 120.0  # after Ctrl-C: how long the running trials get to stop before the restore starts
LOG_PLAYBOOK = "service_log.yml"
LOG_FACT = "dsctl_service_log_tail"


@dataclass(frozen=True)
class LiveTuneInputs:
    inventory: Path
    slos: tuple[str, ...]  # --slo values
    run_dir: Path | None  # None: a new one, once the inputs and the fleet are checked
    service: str | None = None  # default: the inventory's only service
    space: str | None = None  # default: the engine's
    objective: str = "capacity"
    budget: int = 16  # restarts
    seed: int = 0
    prompt_tokens: str = "512"
    output_tokens: str = "128"
    requests: int | None = None  # floor on a probe's measured requests; None: the sample-size rule (capacity)
    window_s: float = capacity.LIVE_WINDOW_S  # a probe's least measured window (the engine's modelled seconds)
    rate: float | None = None  # None: each candidate's highest sustained SLO-holding rate
    params: tuple[str, ...] = ()  # --param overrides of the space
    min_agreement: float = quality.DEFAULT_MIN_AGREEMENT
    warmup: int = 4  # requests before each trial's first probe
    chip: str = "910B3"  # for the roofline screen: the fleet's chip (npu-smi's Name column)
    write_back: bool = False
    resume: bool = False
    limit: str | None = None
    vault: VaultOptions | None = None
    max_time_s: float | None = None  # stop starting trials after this
    screen: str = "model"  # as --simulate's (services.tune_driver.SCREENS)
    max_slots: int | None = None  # at most this many instances are trial slots (None: all)


@dataclass(frozen=True)
class Slot:
    index: int
    planned: PlannedInstance

    @property
    def host(self) -> str:
        return self.planned.host

    @property
    def name(self) -> str:
        return self.planned.instance.name

    @property
    def url(self) -> str:
        return f"http://{self.planned.address}:{self.planned.instance.port}"


@dataclass(frozen=True)
class LivePlan:
    service: str
    engine: str
    model: str  # served model name
    slots: tuple[Slot, ...]  # the instances trials run on
    instances: tuple[Slot, ...]  # every instance of the service (the winner's and the restore's)
    slos: tuple[slo.Slo, ...]
    space: space_mod.SearchSpace
    baseline: dict[str, Any]  # the baseline configuration, by knob
    profile: str | None  # dsctl's model profile, for the roofline screen (None: not screened)
    shortest_prompt: int
    shortest_output: int
    api_key: str | None = field(repr=False, default=None)
    log_files: Mapping[str, str] = field(default_factory=dict)  # instance -> log path on its host
    alloc_conf: str = ""  # PYTORCH_NPU_ALLOC_CONF the instances start with (host env, then the service's env)
    fleet: Fleet | None = field(repr=False, default=None)  # read once: every trial's deploy narrows it to its host


# --------------------------------------------------------------------------- 1. the plan (no host contacted)


def _check(inputs: LiveTuneInputs) -> None:
    if not 0 <= inputs.warmup <= 100:
        raise UsageError(f"--warmup must be in 0..100 requests, got {inputs.warmup}")
    if inputs.max_time_s is not None and not inputs.max_time_s > 0:
        raise UsageError(f"--max-time must be a positive number of seconds, got {inputs.max_time_s:g}")
    # before the fleet is read or contacted
    tune_driver.check_inputs(inputs, SearchSettings(budget=inputs.budget, seed=inputs.seed, objective=inputs.objective,
                                                    min_agreement=inputs.min_agreement),
                             max_budget=MAX_BUDGET, unit=" restarts", max_rate=MAX_RATE, slots=inputs.max_slots)


def _profile(*names: str) -> str | None:
    """dsctl's model profile for the service's model (its path's last component or served name), if any."""
    for name in names:
        for candidate in (name, posixpath.basename(name.rstrip("/"))):
            try:
                return perfmodel.model_by_name(candidate).name
            except UsageError:
                continue
    return None


def prepare(inputs: LiveTuneInputs) -> LivePlan:
    """Validate every input and the fleet, lay out the slots, resolve the space; refuse an impossible SLO."""
    _check(inputs)
    slos = slo.parse_slos(inputs.slos)
    capacity.check_floor(slos, inputs.requests)
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit)
    services = sorted({spec.name for settings in fleet.settings.values() for spec in settings.services})
    if inputs.service is None:
        if len(services) != 1:
            raise UsageError(f"--service: the inventory runs {', '.join(services) or 'no service'}; name the one "
                             "to tune" if services else "--service: the inventory declares no dsctl_services")
        name = services[0]
    elif inputs.service not in services:
        raise UsageError(f"--service {inputs.service}: no such service in dsctl_services (known: "
                         f"{', '.join(services) or 'none'})")
    else:
        name = inputs.service
    plan = plan_deploy(fleet.settings, {host: fleet.address(host) for host in fleet.settings}, instances=(name,))
    if not plan.instances:
        raise UsageError(f"--service {name}: no instance of it on the hosts chosen (--limit)")
    if inputs.write_back:  # the end writes the winner: a file it cannot rewrite is refused before any restart
        writeback.check(inputs.inventory, name, hosts=tuple(dict.fromkeys(p.host for p in plan.instances)))
    spec = plan.instances[0].spec

    def alloc_conf(planned: PlannedInstance) -> str:  # the allocator in the environment the instance starts with
        settings = plan.settings[planned.host]
        return instance_env(planned.spec, planned.instance, env=settings.environment,
                            config_dir=settings.dsctl_service_config_dir).get("PYTORCH_NPU_ALLOC_CONF", "")

    differing = [p.host for p in plan.instances if p.spec.params != spec.params or p.spec.engine != spec.engine
                 or p.spec.npus_per_instance != spec.npus_per_instance
                 or alloc_conf(p) != alloc_conf(plan.instances[0])]
    if differing:
        raise UsageError(f"--service {name}: host {differing[0]} defines it differently from "
                         f"{plan.instances[0].host} (engine, params, NPUs or PYTORCH_NPU_ALLOC_CONF); tune a group "
                         "of hosts that share one definition with --limit")
    space_name = inputs.space or space_mod.default_space(spec.engine)
    space = space_mod.resolve_space(space_name, vllm_ascend=spec.vllm_ascend,
                                    npus_per_instance=spec.npus_per_instance, params=spec.params,
                                    overrides=inputs.params)
    if space.engine != spec.engine:
        raise UsageError(f"--space {space_name}: it tunes {space.engine}, but service {name} runs {spec.engine}")
    shortest_prompt = shortest(length(inputs.prompt_tokens, "--prompt-tokens"))
    shortest_output = shortest(length(inputs.output_tokens, "--output-tokens"))
    profile = _profile(spec.model, spec.served_model_name or "")
    try:
        perfmodel.chip_by_name(inputs.chip)
    except UsageError as exc:
        raise UsageError(f"--chip: {exc}") from None
    if profile is not None:
        reason = screens.impossible(chip=inputs.chip, model=profile, prompt_tokens=shortest_prompt,
                                    output_tokens=shortest_output, slos=slos,
                                    npus_per_instance=spec.npus_per_instance)
        if reason:
            raise DsctlError(f"no configuration of {profile} on {spec.npus_per_instance} x {inputs.chip} can meet "
                             f"{', '.join(s.label for s in slos)} for {shortest_prompt}-token prompts: {reason}",
                             ExitStatus.SLO_NOT_MET)
    current = {"tensor_parallel_size": spec.tensor_parallel_size}
    overridden = [space_mod.parse_override(text).name for text in inputs.params]
    space = space_mod.including_baseline(space, space.baseline(spec.params, current), overridden)
    baseline = space.baseline(spec.params, current)
    # Slots spread over the hosts first (chat-0 of every host, then chat-1 ...): deploys of one host take turns.
    hosts = list(dict.fromkeys(p.host for p in plan.instances))
    rank = {id(p): ([q for q in plan.instances if q.host == p.host].index(p), hosts.index(p.host))
            for p in plan.instances}
    spread = sorted(plan.instances, key=lambda p: rank[id(p)])
    chosen = spread[:inputs.max_slots] if inputs.max_slots is not None else list(plan.instances)
    slots = tuple(Slot(index, planned) for index, planned in enumerate(chosen))
    every = tuple(Slot(index, planned) for index, planned in enumerate(plan.instances))
    logs = {}
    for planned in plan.instances:
        log_dir = plan.settings[planned.host].dsctl_service_log_dir
        logs[planned.instance.name] = posixpath.join(log_dir, f"{planned.instance.name}.log")
    api_key = spec.api_key.get_secret_value() if getattr(spec, "api_key", None) is not None else None
    return LivePlan(service=name, engine=spec.engine, model=spec.served_model_name or spec.model, slots=slots,
                    instances=every,
                    slos=slos, space=space, baseline=baseline, profile=profile, shortest_prompt=shortest_prompt,
                    shortest_output=shortest_output, api_key=api_key, log_files=logs,
                    alloc_conf=alloc_conf(slots[0].planned), fleet=fleet)


# --------------------------------------------------------------------------- 2-5. the run


class _Trials:
    """The running trials, so an interrupt can stop them and wait (bounded) until they have."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._running = 0
        self._idle = threading.Condition()

    def __enter__(self) -> _Trials:
        with self._idle:
            self._running += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def stop_and_wait(self, timeout: float) -> bool:
        self.stop.set()
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout)


class _Stopped(Exception):
    """A trial ended because the tune is being interrupted."""


def _first_line(lines: list[str] | tuple[str, ...]) -> str:
    return next((line for line in lines if line.strip()), "")


# inference_service's failure message (roles/inference_service/tasks/rollout.yml): the reason, then the rollback.
_START_REASON = re.compile(r"the new configuration failed: (?P<reason>.*?); (?:rolled back|failed)", re.S)


def start_failure(errors: tuple[str, ...] | list[str], where: Mapping[str, Any]) -> Outcome:
    """A candidate deploy's health gate refused: its failure class and the engine's own reason (pure).

    A ValueError before the engine listened is vLLM refusing its arguments (e.g. "max_num_batched_tokens (3475)
    is smaller than max_model_len (131072)"): a bad flag combination, as --simulate classifies it."""
    text = "\n".join(errors)
    match = _START_REASON.search(text)
    reason = match.group("reason").strip() if match else _first_line(errors)
    failure = search.classify_failure(text)
    if failure == Failure.ERROR and re.search(r"\bValueError\b", reason):
        failure = Failure.BAD_FLAG
    return Outcome(failure=failure, detail=reason, data={**where, "log_tail": text[-2000:]})


class LiveTune:
    """One live tune: the evaluator on the fleet's slots, the baseline, the end and the restore."""

    def __init__(self, runner: PlaybookRunner, prober: Prober, inputs: LiveTuneInputs, plan: LivePlan,
                 progress: ProgressSink):
        self.runner, self.prober, self.inputs, self.plan, self.progress = runner, prober, inputs, plan, progress
        self.trials = _Trials()
        self.host_locks = {slot.host: threading.Lock() for slot in plan.instances}
        self.baseline_outputs: list[str] | None = None
        self.goodput = slo.goodput_slos(plan.slos)  # typed, to the probe: each bound judged at its statistic
        self.incumbent: TrialRecord | None = None  # the run's best trial so far (the driver tells it: `told`)
        # the inventory's own configuration as trial overrides (the baseline trial's, and the end's fallback)
        self.baseline_config: dict[str, Any] | None = None if not plan.baseline else {
            **plan.space.params(plan.baseline), **plan.space.fields(plan.baseline)}

    # ------------------------------------------------------------------ edges

    def _note(self, msg: str) -> None:
        self.progress({"event": "dsctl_note", "msg": msg})

    def _stage(self, slot: Slot, number: int | None, stage: str) -> None:
        self.progress({"event": "dsctl_tune_slot", "slot": slot.index, "host": slot.host, "instance": slot.name,
                       "trial": number, "stage": stage})

    def deploy(self, overrides: Mapping[str, Any] | None, *, only: Slot | None = None, artifacts: str,
               stop: threading.Event | None = None) -> deploy_verb.DeployResult:
        inputs = deploy_verb.DeployInputs(
            inventory=self.inputs.inventory, limit=only.host if only is not None else self.inputs.limit,
            instances=(only.name,) if only is not None else (self.plan.service,),
            overrides={self.plan.service: dict(overrides)} if overrides else {}, vault=self.inputs.vault,
            artifacts_dir=self.inputs.run_dir / "runs" / artifacts)
        return deploy_verb.deploy(self.runner, inputs, stop=stop, read=self.plan.fleet)

    def log_tail(self, slot: Slot) -> list[str]:
        try:
            run = self.runner.run(LOG_PLAYBOOK, self.inputs.inventory, limit=slot.host, vault=self.inputs.vault,
                                  extra_vars={"service_log_path": self.plan.log_files[slot.name],
                                              "service_log_lines": LOG_LINES},
                                  artifacts_dir=self.inputs.run_dir / "runs" / f"log-{slot.name}-{time.time():.0f}",
                                  stop=self.trials.stop)
        except (PlaybookError, KeyboardInterrupt):
            return []
        outcome = run.hosts.get(slot.host)
        return [str(line) for line in (outcome.facts.get(LOG_FACT) if outcome is not None else None) or []]

    def probe(self, slot: Slot, rate: float, *, warmup: int, seed: int
              ) -> tuple[probe_verb.ProbeResult, dict[str, Any]]:
        """One probe at ``rate``, sized by `capacity.probe_size` (``warmup``: engine warm-up requests before it,
        e.g. after a restart); its result and the metrics of its measured window (`capacity.window_metrics`)."""
        stop = self.trials.stop
        size = capacity.probe_size(self.plan.slos, rate, min_window_s=self.inputs.window_s,
                                   floor=self.inputs.requests, max_requests=MAX_REQUESTS)
        cfg = probe_verb.ProbeConfig(
            url=slot.url, model=self.plan.model, rate=rate, requests=size.requests, warmup=warmup,
            duration=PROBE_MAX_S if size.requests / rate > PROBE_MAX_S else None,
            prompt_tokens=self.inputs.prompt_tokens, output_tokens=self.inputs.output_tokens,
            goodput=self.goodput, early_stop=bool(self.goodput), early_stop_excluded=size.warmup,
            timeout=PROBE_TIMEOUT_S, api_key=self.plan.api_key, seed=seed,
            max_error_rate=1.0)  # failures are judged by the SLO (error_rate) and the crash check, not here

        class _Stopping:  # ends the probe early when the tune is interrupted
            def probe(_, target, **kwargs):
                on_finish = kwargs.pop("on_finish")

                def finish(record):
                    return "the tune is being interrupted" if stop.is_set() else on_finish(record)

                return self.prober.probe(target, on_finish=finish, **kwargs)

            def engine_time_scale(_, target, **kwargs):
                return self.prober.engine_time_scale(target, **kwargs)

            def prompt_token_counts(_, target, **kwargs):
                return self.prober.prompt_token_counts(target, **kwargs)

        result = probe_verb.probe(_Stopping(), cfg)
        metrics = capacity.window_metrics(result.result.records, size.warmup, required=size.rule,
                                          goodput_ms=slo.goodput_bounds_ms(self.goodput))
        metrics["errors"] = result.data["metrics"]["errors"]  # the whole probe's failures: the crash check's
        # whether the load generator was the limit: such a probe is no verdict on the instance (rate_search.measured)
        metrics[generator_limit.KEY] = result.data[generator_limit.KEY]
        return result, metrics

    # ------------------------------------------------------------------ one trial

    def evaluate(self, candidate: Candidate) -> Outcome:
        slot = self.plan.slots[candidate.slot]
        with self.trials:
            try:
                return self._evaluate(slot, candidate)
            except _Stopped:
                return Outcome(failure=Failure.ERROR, detail="interrupted")

    def _evaluate(self, slot: Slot, candidate: Candidate) -> Outcome:
        overrides = {**candidate.params, **candidate.fields}
        where = {"host": slot.host, "instance": slot.name}
        self._stage(slot, candidate.number, "waiting for the host" if self.host_locks[slot.host].locked()
                    else "deploying")
        with self.host_locks[slot.host]:
            if self.trials.stop.is_set():
                raise _Stopped
            self._stage(slot, candidate.number, "deploying")
            try:
                result = self.deploy(overrides, only=slot, artifacts=f"trial-{candidate.number:04d}",
                                     stop=self.trials.stop)
            except deploy_verb.DeployInterrupted:
                raise _Stopped from None
            except PlaybookError as exc:
                return Outcome(failure=Failure.ERROR, detail=str(exc), data=where)
        if self.trials.stop.is_set():
            raise _Stopped
        if result.exit_status != ExitStatus.OK:
            return start_failure(result.errors, where)
        outcome = self._measure(slot, candidate)
        if outcome.failure is None and candidate.needs_quality:
            self._stage(slot, candidate.number, "quality check")
            try:
                outputs = completions.greedy_outputs(slot.url, self.plan.model, list(quality.PROMPTS),
                                                     max_tokens=QUALITY_TOKENS, api_key=self.plan.api_key)
            except DsctlError as exc:
                return dataclasses.replace(outcome, failure=Failure.ERROR, detail=f"quality check: {exc}")
            agreement = quality.agreement(self.baseline_outputs or [], outputs, unit="char").value \
                if self.baseline_outputs else None
            outcome = dataclasses.replace(outcome, agreement=agreement)
        return dataclasses.replace(outcome, data={**where, **dict(outcome.data)})

    def _died(self, slot: Slot, result: probe_verb.ProbeResult) -> Outcome | None:
        """A probe with failed connections: if the engine died, its log says why (a crash, not an SLO miss)."""
        by_class = result.data["metrics"]["errors"]["by_class"]
        if not any(by_class.get(kind) for kind in ("connection", "http_5xx", "truncated", "protocol")):
            return None
        tail = self.log_tail(slot)
        failure = search.classify_failure("\n".join(tail))
        if failure == Failure.ERROR:
            return None  # nothing in the log names a crash: the failures count against the SLO
        line = next((line for line in reversed(tail) if search.classify_failure(line) == failure), tail[-1])
        return Outcome(metrics=result.data["metrics"], failure=failure, detail=f"died under load: {line.strip()}",
                       data={"log_tail": "\n".join(tail)})

    def _measure(self, slot: Slot, candidate: Candidate) -> Outcome:
        crashed: list[Outcome] = []
        probes = 0

        def one(rate: float) -> Mapping[str, Any]:
            nonlocal probes
            if self.trials.stop.is_set():
                raise _Stopped
            self._stage(slot, candidate.number, f"probing at {rate:.3g} req/s")
            result, metrics = self.probe(slot, rate, warmup=self.inputs.warmup if probes == 0 else 0,
                                         seed=self.inputs.seed + 1000 * candidate.number + probes)
            probes += 1
            if self.trials.stop.is_set():
                raise _Stopped
            died = self._died(slot, result)
            if died is not None:
                crashed.append(died)
                return {**metrics, "completed": 0}  # it holds nothing at a rate that kills it
            if (result.data.get("slo") or {}).get("early_stopped"):  # stopped because the miss was certain
                stopped = {**metrics, rate_search.STOPPED_EARLY: True}  # a few dozen requests: no measure of throughput
                # a miss, also where the window's own statistics (its warm-up left out) would pass
                return {**stopped, "completed": 0} if slo.judge(self.plan.slos, metrics).met else stopped
            return metrics

        if self.inputs.rate is not None:
            try:
                metrics = rate_search.measured(one)(self.inputs.rate)
            except rate_search.GeneratorLimited as limit:
                return Outcome(failure=Failure.UNMEASURED, detail=str(limit), rate=self.inputs.rate)
            if crashed:
                return dataclasses.replace(crashed[-1], rate=self.inputs.rate)
            return Outcome(metrics=metrics, rate=self.inputs.rate)
        ceiling = self.ceiling()
        # a candidate's search stops once it missed at a rate the incumbent holds (`rate_search`'s pruning); the
        # baseline's capacity is always measured in full, the report compares the winner with it
        baseline = self.baseline_config is not None and _same_config({**candidate.params, **candidate.fields},
                                                                     self.baseline_config)
        prune = None if baseline or self.inputs.objective != "capacity" else (
            lambda: None if self.incumbent is None else self.incumbent.rate)
        found = rate_search.search_rate(one, self.plan.slos, start=min(START_RATE, ceiling),
                                        min_rate=capacity.rate_floor(ceiling, floor=MIN_RATE), max_rate=ceiling,
                                        max_probes=RATE_PROBES, rel_tol=RATE_TOLERANCE, repeats=1, prune_at=prune)
        outcome = rate_search.to_outcome(found)
        if crashed and found.rate is None:
            return dataclasses.replace(crashed[-1], data={**dict(crashed[-1].data), **dict(outcome.data)})
        if crashed:  # held at a lower rate, died above it: the winner's rate is below the one that killed it
            outcome = dataclasses.replace(outcome, data={**dict(outcome.data), "died_above": crashed[-1].detail})
        return outcome

    def ceiling(self) -> float:
        """The rate search's upper end: twice estimate's throughput bound of one instance for the shortest
        requests (`capacity.rate_ceiling`), or `MAX_RATE` without a model profile."""
        bound = None
        if self.plan.profile is not None:
            bound = capacity.throughput_bound(chip=self.inputs.chip, model=self.plan.profile,
                                              prompt_tokens=self.plan.shortest_prompt,
                                              output_tokens=self.plan.shortest_output,
                                              npus=self.plan.space.npus_per_instance or 1)
        return capacity.rate_ceiling(bound, fallback=MAX_RATE)

    # ------------------------------------------------------------------ the driver's port (tune_driver.TrialPort)

    @property
    def study(self) -> StudyPlan:
        inputs, plan = self.inputs, self.plan
        return StudyPlan(run_dir=inputs.run_dir, resume=inputs.resume, budget=inputs.budget, slos=plan.slos,
                         settings=SearchSettings(budget=inputs.budget, slots=len(plan.slots), seed=inputs.seed,
                                                 objective=inputs.objective, min_agreement=inputs.min_agreement,
                                                 npus_per_instance=plan.space.npus_per_instance or 1,
                                                 max_wall_s=inputs.max_time_s),
                         context={"simulated": False, "service": plan.service, "engine": plan.engine,
                                  "model": plan.model, "chip": inputs.chip},
                         baseline=plan.baseline)

    def opening(self) -> Sequence[str]:
        inputs, plan = self.inputs, self.plan
        notes = [f"tuning {plan.service} ({plan.engine}, space {plan.space.name}: {', '.join(plan.space.names)}) for "
                 f"{', '.join(s.label for s in plan.slos)} on {len(plan.slots)} trial slot(s): "
                 f"{', '.join(f'{s.name}@{s.host}' for s in plan.slots)}; budget {inputs.budget} restarts; "
                 f"run directory {inputs.run_dir}"]
        if plan.profile is None:
            notes.append(f"no dsctl model profile matches {plan.model}: candidates are not screened by the roofline")
        return notes

    def screening(self) -> tuple[space_mod.SearchSpace, search.Screen | None, Sequence[str]]:
        """The roofline (with a model profile of the service's model), then the offline engine model of its
        instances (as --simulate builds it: an engine it models), the lossy knobs narrowed by the model's quality
        verdict."""
        inputs, plan = self.inputs, self.plan
        if plan.profile is None or inputs.screen == "none":
            return plan.space, None, ()
        model = _model_inputs(inputs, plan)
        workload = Workload(length(inputs.prompt_tokens, "--prompt-tokens"),
                            length(inputs.output_tokens, "--output-tokens"), seed=inputs.seed)
        space, narrowed = tune_sim.quality_narrowed(model, plan.space, min_agreement=inputs.min_agreement,
                                                    baseline=plan.baseline)
        screen, _ = tune_sim.build_screen(model, plan.slos, plan.space, workload, min_agreement=inputs.min_agreement)
        return space, screen, narrowed

    def begin(self) -> None:
        """The baseline: the inventory's configuration on every instance, and its greedy outputs (a lossy knob)."""
        self._note(f"deploying the inventory's configuration of {self.plan.service} (the baseline) to "
                   f"{len(self.plan.instances)} instance(s)")
        result = self.deploy(None, artifacts="baseline")
        if result.exit_status != ExitStatus.OK:
            raise DsctlError(f"the baseline deploy failed, nothing was tuned: {_first_line(result.errors)}; "
                             "fix the service and run dsctl deploy first", result.exit_status)
        if self.plan.space.lossy:
            first = self.plan.slots[0]
            self._note(f"recording the baseline's greedy outputs on {len(quality.PROMPTS)} prompts ({first.name} "
                       f"on {first.host}) for the quality guard")
            self.baseline_outputs = completions.greedy_outputs(first.url, self.plan.model, list(quality.PROMPTS),
                                                               max_tokens=QUALITY_TOKENS, api_key=self.plan.api_key)

    def restore(self) -> deploy_verb.DeployResult:
        self._note(f"restoring every instance of {self.plan.service} to the inventory's configuration")
        return self.deploy(None, artifacts=f"restore-{time.time():.0f}")

    def verify(self, rate: float) -> tuple[Verification, ...]:
        def check(slot: Slot) -> Verification:
            self._stage(slot, None, f"confirming at {rate:.3g} req/s")
            try:  # a probe the load generator limited confirms nothing either way: repeated once, then unconfirmed
                metrics = rate_search.measured(lambda r: self.probe(slot, r, warmup=self.inputs.warmup,
                                                                    seed=self.inputs.seed + 7)[1])(rate)
            except rate_search.GeneratorLimited as limit:
                self._stage(slot, None, "unmeasured")
                return Verification(slot.host, slot.name, rate, False, {}, str(limit))
            verdict = slo.judge(self.plan.slos, metrics)
            probe = capacity.judge_probe(self.plan.slos, metrics)
            self._stage(slot, None, "confirmed" if probe.met else "missed")
            return Verification(slot.host, slot.name, rate, probe.met, verdict.values(),
                                verdict.line if probe.met else probe.detail)

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(self.plan.instances))) as pool:
            return tuple(pool.map(check, self.plan.instances))

    def event_fields(self, record: TrialRecord) -> Mapping[str, Any]:
        slot = self._slot_of(record)
        return {"rate": record.rate, "slot": record.slot, "host": slot.host if slot else None,
                "instance": slot.name if slot else None}

    def told(self, record: TrialRecord, incumbent: TrialRecord | None) -> None:
        self.incumbent = incumbent  # the rate searches prune at what it holds
        slot = self._slot_of(record)
        if slot is not None:
            self._stage(slot, None, f"trial {record.number}: {tune_driver.status(record)}")

    def _slot_of(self, record: TrialRecord) -> Slot | None:
        return self.plan.slots[record.slot] if 0 <= record.slot < len(self.plan.slots) else None

    def interrupted(self) -> None:
        """Ctrl-C: the running trials stopped (bounded), every instance restored; exit 130."""
        stopped_in_time = self.trials.stop_and_wait(STOP_WAIT_S)
        state = _restored(self)
        late = "" if stopped_in_time else f" (some trials did not stop within {STOP_WAIT_S:g} s)"
        raise DsctlError(f"tune interrupted{late}; every instance of {self.plan.service} {state}; continue with "
                         f"dsctl tune --resume {self.inputs.run_dir}", ExitStatus.INTERRUPTED) from None

    def conclude(self, found: SearchResult, started: float) -> TuneResult:
        return _finish(self, found, started)


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, abs_tol=1e-9)
    return a == b


def _same_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return set(a) == set(b) and all(same_value(a[k], b[k]) for k in a)


def run(runner: PlaybookRunner, prober: Prober, inputs: LiveTuneInputs,
        progress: ProgressSink = no_progress) -> TuneResult:
    """`dsctl tune INVENTORY`: `prepare` (the fleet read once, --write-back checked once: every refusal before a run
    directory is made or a host contacted), then the one tune driver on the fleet's instances."""
    plan = prepare(inputs)
    inputs = dataclasses.replace(inputs, run_dir=tune_driver.run_dir_for(inputs.run_dir))
    return tune_driver.drive(LiveTune(runner, prober, inputs, plan, progress), progress)


class _RestoreInterrupted(DsctlError):
    """Ctrl-C again while the baseline was being restored: nothing more is tried."""

    exit_status = ExitStatus.INTERRUPTED


def _restored(tune: LiveTune) -> str:
    """Deploy the inventory's configuration to every instance again; how that went, for the error line.  A
    restore that raises is reported, not raised: the caller is already saying what went wrong before it."""
    try:
        restored = tune.restore()
    except (KeyboardInterrupt, deploy_verb.DeployInterrupted):
        raise _RestoreInterrupted("interrupted again while restoring; run dsctl deploy on the inventory to put "
                                  "every instance back on its configuration") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the restore is one line of the result
        return f"NOT restored ({_first_line(str(exc).splitlines())}); run dsctl deploy on the inventory"
    if restored.exit_status == ExitStatus.OK:
        return "restored to the inventory's configuration"
    return f"NOT all restored ({_first_line(restored.errors)}); run dsctl deploy on the inventory"


def _model_inputs(inputs: LiveTuneInputs, plan: LivePlan) -> tune_sim.TuneInputs:
    """The service's instances as --simulate models them, for the screens: dsctl's profile of its model, at the
    rate the tune probes first (``--rate``, or the rate search's floor); the screen --screen asks for, the
    roofline alone for an engine the offline model does not model."""
    screen = inputs.screen if plan.engine in tune_sim.ENGINES else "roofline"
    return tune_sim.TuneInputs(
        model=plan.profile or plan.model, chip=inputs.chip, slos=inputs.slos, run_dir=inputs.run_dir,
        engine=plan.engine, space=plan.space.name, budget=inputs.budget, prompt_tokens=inputs.prompt_tokens,
        output_tokens=inputs.output_tokens, requests=inputs.requests,
        rate=inputs.rate if inputs.rate is not None else MIN_RATE, objective="goodput",
        npus_per_instance=plan.space.npus_per_instance or 1, seed=inputs.seed, alloc_conf=plan.alloc_conf,
        screen=screen)


@dataclass
class _End:
    """What the end left: the configuration every instance runs, its confirmation, the files written."""

    deployed: str = "baseline"  # "winner" or "baseline"
    verification: tuple[Verification, ...] = ()
    written: tuple[str, ...] = ()
    committed: bool = False  # the winner is in the inventory (--write-back)
    errors: list[str] = field(default_factory=list)
    status: ExitStatus = ExitStatus.OK


def _finish(tune: LiveTune, found: SearchResult, started: float) -> TuneResult:
    """The end as one transaction: the artifacts, the winner deployed and confirmed, then (``--write-back``) the
    inventory written.  Until that commit every failure puts the baseline back on every instance: an exception
    is raised again once it has (Ctrl-C: the interrupted error, exit 130), a winner that did not take is the
    result's error."""
    inputs, plan = tune.inputs, tune.plan
    winner = found.best
    baseline_params = plan.space.params(plan.baseline) if plan.baseline else {}
    winner_params = {} if winner is None else {**winner.params, **winner.fields}
    baseline = _baseline_trial(found.trials, tune.baseline_config)
    # no winner over a baseline whose figure is the controller's or rests on too few samples (analysis.baseline_doubt)
    doubt = None if winner is None or _same_config(winner_params, tune.baseline_config or {}) else \
        analysis.baseline_doubt(baseline)
    declined = winner if doubt is not None else None
    if declined is not None:
        winner, winner_params = None, {}
    is_baseline = winner is None or _same_config(winner_params, tune.baseline_config or {})
    try:
        paths = tune_driver.artifacts(found.trials, inputs.run_dir, winner=winner, slos=plan.slos,
                                      title=f"dsctl tune {plan.service} ({plan.model}), {len(plan.slots)} slots")
        end = _end(tune, winner, None if is_baseline else winner_params)
    except _RestoreInterrupted:
        raise
    except (KeyboardInterrupt, deploy_verb.DeployInterrupted):
        state = _restored(tune)
        raise DsctlError(f"tune interrupted at its end; every instance of {plan.service} {state}; continue with "
                         f"dsctl tune --resume {inputs.run_dir}", ExitStatus.INTERRUPTED) from None
    except BaseException as exc:
        tune._note(f"the end of the tune failed ({type(exc).__name__}: {_first_line(str(exc).splitlines())}); "
                   "no instance may stay on a trial's configuration")
        tune._note(f"every instance of {plan.service} {_restored(tune)}")
        raise
    if end.committed:  # nothing below puts the baseline back
        tune._note(f"wrote the winner into {', '.join(end.written) or 'the inventory (it already held it)'}")
    if declined is not None:
        end.status = ExitStatus.ENVIRONMENT if baseline.failure == Failure.UNMEASURED else ExitStatus.ERROR
        held = "" if declined.rate is None else f" held the SLO at {declined.rate:.3g} req/s"
        end.errors.insert(0, f"no winner declared: trial {declined.number} ({config_text(declined)}){held}, but "
                             f"{doubt}, so there is no figure to beat; {RESTORED}; tune again on a quieter "
                             "controller (or fewer --slots)")
    elif winner is None:
        # nothing measured at all (every trial unmeasured or crashed): the controller, not an SLO miss
        unmeasured = found.closest is None and found.counts.get(Failure.UNMEASURED.value)
        end.status = ExitStatus.ENVIRONMENT if unmeasured else ExitStatus.SLO_NOT_MET
        end.errors.insert(0, tune_driver.nothing_met(found, after=RESTORED))
    winning = end.deployed == "winner"
    target = tune.baseline_config
    result = tune_driver.result(
        found, mode="live", subject=(f"{plan.service} ({plan.model}, {plan.engine}, space {plan.space.name}) on "
                                     f"{len(plan.slots)} instances"),
        space=plan.space, best=winner, paths=paths, exit_status=end.status, errors=end.errors, started=started,
        baseline=baseline, baseline_config=target,
        deployment=Deployment(service=plan.service, deployed=end.deployed,
                              params=winner_params if winning else baseline_params,
                              verification=end.verification, written=end.written),
        inputs=tune_driver.echo(inputs, plan.slos, {
            "inventory": str(inputs.inventory), "service": plan.service, "engine": plan.engine, "model": plan.model,
            "slots": [f"{s.host}/{s.name}" for s in plan.slots]}))
    tune_artifacts.write_json(inputs.run_dir / RESULT, result.to_dict())
    return result


def _baseline_trial(trials: Sequence[TrialRecord], target: Mapping[str, Any] | None) -> TrialRecord | None:
    """The evaluated trial that ran the inventory's own configuration (the study's first), if any."""
    if target is None:
        return None
    return next((t for t in sorted(trials, key=lambda t: t.number) if t.evaluated and t.duplicate_of is None
                 and _same_config({**t.params, **t.fields}, target)), None)


def _end(tune: LiveTune, winner: TrialRecord | None, overrides: dict[str, Any] | None) -> _End:
    """Deploy (``overrides``: the winner's; None: the baseline), confirm, then write back; a winner that does
    not take is replaced by the baseline.  Raises only what the caller turns into a restore."""
    inputs, plan = tune.inputs, tune.plan
    end = _End(deployed="baseline" if overrides is None else "winner")
    label = "the baseline (nothing beat it)" if overrides is None else f"trial {winner.number}'s configuration"
    tune._note(f"deploying {label} to every instance of {plan.service}")
    final = tune.deploy(overrides, artifacts="final")
    rate = winner.rate if winner is not None and winner.rate is not None else inputs.rate
    if final.exit_status != ExitStatus.OK:
        end.errors.append(f"the final deploy failed: {_first_line(final.errors)}")
        end.status = final.exit_status
    elif winner is not None and rate:
        end.verification = tune.verify(rate)
        missed = [v for v in end.verification if not v.met]
        end.errors += [f"{v.instance} on {v.host} missed the SLO on the confirming probe at {v.rate:.3g} req/s: "
                       f"{v.detail}" for v in missed]
        if missed:
            end.status = ExitStatus.SLO_NOT_MET
    if overrides is None:
        return end
    if final.exit_status != ExitStatus.OK:  # some instances may have rolled back to a trial's configuration
        end.deployed = "baseline"
        end.errors.append(f"trial {winner.number}'s configuration did not deploy everywhere; every instance of "
                          f"{plan.service} {_restored(tune)}")
        return end
    if not inputs.write_back:
        return end
    if end.status != ExitStatus.OK:
        end.deployed = "baseline"
        end.errors.append(f"--write-back: trial {winner.number}'s configuration missed its confirmation, so it was "
                          f"not written into the inventory; every instance of {plan.service} {_restored(tune)}; its "
                          f"parameters are in {inputs.run_dir / RESULT}")
        return end
    try:
        done = writeback.write_back(inputs.inventory, plan.service, winner.params, fields=winner.fields,
                                    hosts=tuple(dict.fromkeys(slot.host for slot in plan.instances)))
    except Exception as exc:  # noqa: BLE001 - whatever failed, the inventory was left as it was: back to it
        end.deployed, end.status = "baseline", ExitStatus.ERROR
        end.errors.append(f"--write-back failed after trial {winner.number}'s configuration was confirmed: "
                          f"{_first_line(str(exc).splitlines()) or type(exc).__name__}; every instance of "
                          f"{plan.service} {_restored(tune)}; its parameters are in {inputs.run_dir / RESULT}: "
                          "write them into the inventory by hand, then run dsctl deploy")
        return end
    end.written, end.committed = tuple(str(path) for path in done.written), True
    return end
