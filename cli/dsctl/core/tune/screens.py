"""Screens: reasons to rule a candidate out before anything restarts (pure).

`roofline_screen` asks `dsctl estimate`'s model (dsctl.core.perf.estimate) two questions per candidate, on the
chips one request runs on (the candidate's tensor parallel size):

* do the weights, the workspace and one full request's KV cache fit at the candidate's gpu_memory_utilization?
  (the engine would stop at start-up with vLLM's words, which the reason quotes);
* does any SLO lie below the *peak* bound (compute for TTFT, bandwidth for TPOT, their sum for E2EL) of a single
  request on an idle engine?  No configuration, load or statistic can beat that bound, so the screen never rules
  out a candidate that could have met the SLO; the efficiency-scaled predictions are not used here.

The same call on the service's current configuration refuses a physically impossible SLO before the first
restart (`impossible`).  ITL and error_rate SLOs have no bound here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dsctl.core.perf.estimate import SLO_METRICS, estimate
from dsctl.core.tune import quality
from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.search import CRASH_VIOLATION, Candidate, Ruled
from dsctl.core.tune.space import Knob, SearchSpace


def _bounds(slos: Sequence[slo_mod.Slo]) -> dict[str, float]:
    bounds: dict[str, float] = {}
    for slo in slos:  # the tightest bound per metric, whatever its statistic: all lie above the single-request bound
        if slo.metric in SLO_METRICS:
            bounds[slo.metric] = min(bounds.get(slo.metric, slo.bound), slo.bound)
    return bounds


def check(*, chip: str, model: str, prompt_tokens: int, output_tokens: int, slos: Sequence[slo_mod.Slo],
          chips: int, memory_utilization: float = 0.9, weight_bytes: float = 2.0) -> str | None:
    """The reason a deployment cannot meet ``slos`` (or cannot start), or None."""
    # the tightest bound per metric, judged on the burst's worst request (estimate's percentile verdict)
    targets = [slo_mod.Slo(metric, slo_mod.DEFAULT_STATISTIC, bound) for metric, bound in _bounds(slos).items()]
    result = estimate(chip, model, prompt_tokens=prompt_tokens, output_tokens=output_tokens, chips=chips,
                      weight_bytes=weight_bytes, memory_utilization=memory_utilization, slo=targets)
    beyond = [v for v in result.verdicts
              if v.bound_ms is not None and v.target_ms is not None and v.bound_ms > v.target_ms]
    memory = [v for v in result.verdicts if v.metric == "memory" and not v.feasible]
    reasons = beyond + memory  # the SLO's physical bound first: it holds whatever the memory
    return f"roofline: {reasons[0].line}" if reasons else None


def roofline_screen(*, chip: str, model: str, prompt_tokens: int, output_tokens: int, slos: Sequence[slo_mod.Slo],
                    npus_per_instance: int, weight_bytes: float = 2.0) -> Callable[[Candidate], str | None]:
    """A `Search` screen over `check` (chips = the candidate's tensor_parallel_size, else the instance's NPUs; a MoE
    model's DP groups: all TP x DP chips, which it runs as one instance -- as one TP group of them here, whose
    per-chip weights and single-request times bound every layout of those chips from below)."""
    cache: dict[tuple[int, float], str | None] = {}
    from dsctl.core.perf import perfmodel
    from dsctl.errors import DsctlError

    try:
        moe = perfmodel.model_by_name(model).is_moe
    except DsctlError:
        moe = False

    def screen(candidate: Candidate) -> str | None:
        chips = int(candidate.fields.get("tensor_parallel_size") or npus_per_instance)
        data_parallel = int(candidate.fields.get("data_parallel_size") or 1)
        if moe and data_parallel > 1:
            chips *= data_parallel
        utilization = float(candidate.params.get("gpu_memory_utilization", 0.9))
        key = (chips, utilization)
        if key not in cache:
            cache[key] = check(chip=chip, model=model, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               slos=slos, chips=chips, memory_utilization=utilization, weight_bytes=weight_bytes)
        return cache[key]

    return screen


def impossible(*, chip: str, model: str, prompt_tokens: int, output_tokens: int, slos: Sequence[slo_mod.Slo],
               npus_per_instance: int, weight_bytes: float = 2.0) -> str | None:
    """Why no configuration of an instance of ``npus_per_instance`` NPUs can meet ``slos``: the peak bound on all
    of the instance's NPUs (the most any tensor parallel size can use) and full memory; None if some might."""
    return check(chip=chip, model=model, prompt_tokens=prompt_tokens, output_tokens=output_tokens, slos=slos,
                 chips=npus_per_instance, memory_utilization=1.0, weight_bytes=weight_bytes)



# The model screen's tolerance (Proposed): the offline evaluator matched the live engine within 25 % on means and
# p90 (tests/engine/test_evaluate_live.py), so a candidate predicted to miss by more than that is not started.  On
# real hardware the model's error has not been measured: `--screen roofline` measures all the bound allows.
MODEL_TOLERANCE = 0.25
# A prediction can be wrong where it matters most (bench/tune.py: on a fixed-batch target whose every feasible
# configuration the model ruled out, a fully trusted screen scored 0 on every seed).  So the model screen is
# bounded (guesses, Proposed): after this many rejections in a row the next candidate is measured anyway (the
# sampler keeps proposing the region the model rules out; one restart tells which is right), and over a whole tune
# it is consulted at most this many times per restart of the budget, after which candidates are only
# roofline-screened.  The roofline is a bound, never wrong, and is not bounded.
MODEL_MAX_REJECTED_IN_A_ROW = 8
MODEL_CONSULTATIONS_PER_RESTART = 8



@dataclass(frozen=True)
class UnderLoad:
    """A predicted stop under load: the engine starts, then a step at full concurrency runs out of memory."""

    message: str  # the engine's words (aclrtMalloc / out of memory)
    burst: str  # what the model ran: e.g. "64 requests of 65023 tokens at once"


# (candidate) -> (a start-up failure message, an `UnderLoad`, or None; the modelled metrics at the lowest load the
# tune probes)
Predictor = Callable[[Candidate], tuple["str | UnderLoad | None", dict | None]]


class ModelScreen:
    """A `Search` screen over dsctl's offline engine model (``predict``): a candidate is not started when the model
    says its engine stops at start-up (vLLM's memory arithmetic and argument checks; ``startup=False`` leaves those
    to the live health gate), or when, at the lowest load the tune would probe, its modelled value of an SLO exceeds
    the bound by more than ``tolerance`` (relative).  Unlike the roofline this is a prediction, not a bound: the
    tolerance is the model error it allows, and the screen is bounded (``max_rejected_in_a_row``,
    ``max_consultations``).  A candidate that faces the quality guard is not started when its agreement with the
    baseline (``agreement_of``: the model's, in closed form) is below ``min_agreement``: the guard would reject it
    after its restart (kv_sparse_threshold 0-0.9 against the 0.9 floor: half of all restarts of bench/tune.py's
    chat-fixed runs were such).  ``consulted``, ``rejected``, ``overruled`` and ``quality_rejected`` count what it
    did."""

    def __init__(self, predict: Predictor, slos: Sequence[slo_mod.Slo], *, tolerance: float = MODEL_TOLERANCE,
                 startup: bool = True, max_rejected_in_a_row: int = MODEL_MAX_REJECTED_IN_A_ROW,
                 max_consultations: int | None = None, min_agreement: float = quality.DEFAULT_MIN_AGREEMENT,
                 agreement_of: Callable[[Candidate], float] | None = None,
                 memory_check: Callable[[Candidate], str | UnderLoad | None] | None = None):
        if max_rejected_in_a_row < 1 or (max_consultations is not None and max_consultations < 0):
            raise ValueError("the model screen's bounds must be positive")
        self.predict, self.slos, self.tolerance, self.startup = predict, slos, tolerance, startup
        self.min_agreement, self.agreement_of, self.memory_check = min_agreement, agreement_of, memory_check
        self.quality_rejected = 0  # by ``agreement_of``, before and outside the consultations
        self.memory_rejected = 0  # start-up or under-load memory verdicts: never overruled, not in ``rejected``
        self.max_rejected_in_a_row, self.max_consultations = max_rejected_in_a_row, max_consultations
        self.consulted = 0
        self.rejected = 0
        self.overruled = 0  # rejections not applied: the candidate ended a run of rejections and was measured
        self._in_a_row = 0

    def reason(self, candidate: Candidate) -> str | None:
        """The model's verdict on ``candidate``, unbounded and uncounted."""
        return self._quality(candidate) or self._performance(candidate)

    def _quality(self, candidate: Candidate) -> str | None:
        if self.agreement_of is None or not candidate.needs_quality:
            return None
        agreement = self.agreement_of(candidate)
        if agreement >= self.min_agreement:
            return None
        return (f"model: output agreement with the baseline predicted {agreement:.3g}, below the quality floor "
                f"{self.min_agreement:g}")

    def _memory_reason(self, failure: str | UnderLoad | None) -> Ruled | None:
        if isinstance(failure, UnderLoad):
            return Ruled(f"model: the engine would run out of memory under load ({failure.burst}): "
                         f"{failure.message.splitlines()[0]}", CRASH_VIOLATION)
        if failure is not None and self.startup:
            return Ruled(f"model: the engine would not start: {failure.splitlines()[0]}", CRASH_VIOLATION)
        return None

    def _memory(self, candidate: Candidate) -> tuple[str | None, dict | None]:
        """The model's verdict on the engine's memory (``memory_check``, then the predictor's start-up) and, when it
        has none, the predictor's metrics."""
        reason = self._memory_reason(self.memory_check(candidate)) if self.memory_check is not None else None
        if reason is not None:
            return reason, None
        failure, metrics = self.predict(candidate)
        reason = self._memory_reason(failure)
        return (reason, None) if reason is not None else (None, metrics if failure is None else None)

    def _performance(self, candidate: Candidate) -> str | None:
        memory, metrics = self._memory(candidate)
        if memory is not None or metrics is None:
            return memory
        return self._slo(metrics)

    def _slo(self, metrics: dict) -> str | None:
        verdict = slo_mod.judge(self.slos, metrics)
        worst = max(verdict.checks, key=lambda check: check.margin)
        if worst.margin > self.tolerance:
            return (f"model: {worst.slo.key} predicted {worst.value:.4g} at the lowest load, over {worst.slo.label} "
                    f"by more than {self.tolerance:.0%}")
        return None

    def __call__(self, candidate: Candidate) -> str | None:
        # Quality first, never overruled, outside the consultations and the run of rejections.  The agreement follows
        # from the configuration in closed form (no run of the model), and it cannot rule out everything (the
        # unsparsified side of the space always passes), while the overrule is there because a performance model
        # can be wrong over a whole region the sampler keeps proposing.  Bounded and overrulable, quality verdicts
        # spent all 200 consultations of a 25-restart run on TPE's proposals (nine in ten beyond the floor: the
        # sampler never sees a screened candidate) and let 8-10 restarts fail the guard (bench/tune.py chat-fixed).
        reason = self._quality(candidate)
        if reason is not None:
            self.quality_rejected += 1
            return reason
        if self.memory_check is not None:
            # The engine's memory arithmetic (engine_config.plan: weights and KV cache against HBM, the argument
            # checks; then one step at full concurrency) involves no speed, so it is no performance prediction: like
            # the roofline it is not a consultation and is never overruled.  On bench/tune.py's long-fixed landscape
            # nearly every configuration with more than two 64K-token sequences stops there, and as consultations
            # these verdicts spent the bound within 10 restarts; after it, TPE restarted into the same region.
            reason = self._memory_reason(self.memory_check(candidate))
            if reason is not None:
                self.memory_rejected += 1
                return reason
        if self.max_consultations is not None and self.consulted >= self.max_consultations:
            return None  # spent: from here on the measurement decides
        self.consulted += 1
        failure, metrics = self.predict(candidate)
        memory = self._memory_reason(failure)
        if memory is not None:
            # Not overruled either (the predictor's start-up is the same arithmetic): overruled, such verdicts cost
            # bench/tune.py's long-fixed runs 13 of 25 restarts, every one of which ran out of memory as predicted.
            self.memory_rejected += 1
            return memory
        reason = self._slo(metrics) if metrics is not None else None
        if reason is None:
            self._in_a_row = 0
            return None
        if self._in_a_row >= self.max_rejected_in_a_row:
            self._in_a_row = 0
            self.overruled += 1
            return None
        self._in_a_row += 1
        self.rejected += 1
        return reason

    def summary(self) -> dict[str, int | None]:
        return {"consulted": self.consulted, "rejected": self.rejected, "overruled": self.overruled,
                "max_consultations": self.max_consultations, "quality_rejected": self.quality_rejected,
                "memory_rejected": self.memory_rejected}


def model_screen(predict: Predictor, slos: Sequence[slo_mod.Slo], *, tolerance: float = MODEL_TOLERANCE,
                 startup: bool = True, budget: int | None = None,
                 min_agreement: float = quality.DEFAULT_MIN_AGREEMENT,
                 agreement_of: Callable[[Candidate], float] | None = None,
                 memory_check: Callable[[Candidate], str | UnderLoad | None] | None = None) -> ModelScreen:
    """The model screen of a tune of ``budget`` restarts (consultations bounded per restart; None: unbounded)."""
    limit = None if budget is None else MODEL_CONSULTATIONS_PER_RESTART * max(1, budget)
    return ModelScreen(predict, slos, tolerance=tolerance, startup=startup, max_consultations=limit,
                       min_agreement=min_agreement, agreement_of=agreement_of, memory_check=memory_check)


def combined(*screens: Callable[[Candidate], str | None] | None) -> Callable[[Candidate], str | None]:
    """The first reason any of ``screens`` gives (None entries skipped), in order: cheap bounds before models."""
    active = [screen for screen in screens if screen is not None]

    def screen(candidate: Candidate) -> str | None:
        for one in active:
            reason = one(candidate)
            if reason:
                return reason
        return None

    return screen


# A continuous lossy knob (no step) is checked at this many evenly spaced points: the narrowed range ends at the
# last point that passes, so it errs on the side of the floor.
QUALITY_POINTS = 33


def _grid(knob: Knob) -> tuple[Any, ...]:
    if knob.kind in ("bool", "categorical"):
        return knob.values
    if knob.step and not knob.log:
        count = int(round((knob.high - knob.low) / knob.step))
        values = [knob.low + i * knob.step for i in range(count + 1)]
    else:
        values = [knob.low + (knob.high - knob.low) * i / (QUALITY_POINTS - 1) for i in range(QUALITY_POINTS)]
    return tuple(int(round(v)) if knob.kind == "int" else round(v, 12) for v in values)


def _reference(knob: Knob, baseline: Mapping[str, Any]) -> Any:
    for value in (baseline.get(knob.name), knob.unset):
        if value is not None and knob.contains(value):
            return value
    return knob.choices[0] if knob.kind == "categorical" else (False if knob.kind == "bool" else knob.low)


def quality_narrowed(space: SearchSpace, agreement_of: Callable[[Candidate], float], min_agreement: float, *,
                     baseline: Mapping[str, Any] | None = None) -> tuple[SearchSpace, tuple[str, ...]]:
    """``space`` with each lossy knob narrowed to the values whose predicted agreement passes ``min_agreement``
    (the other knobs at the baseline's values), and a note per narrowed knob.

    Why: the model screen's quality verdict is closed-form and never overruled, so a candidate beyond the floor is
    never started; left in the space, it is still proposed.  On bench/tune.py's long-fixed landscape
    (kv_sparse_threshold 0-0.9 against the 0.9 floor: 0-0.15 passes) dsctl's TPE asked 600 candidates, 541 of them
    beyond the floor, spent its asks and evaluated 8 of its 25 restarts: the sampler never learns what a screen
    rules out.  Narrowed, every proposal is one the guard may accept.  A numeric knob keeps the contiguous run of
    passing values that holds the baseline's value (or the first run); a bool or categorical one its passing
    values.  A knob where no value passes, or whose baseline value does not (the live guard compares with the
    baseline's outputs, the model with the unsparsified engine's), is left as it is: the screen still judges each
    candidate."""
    base = dict(baseline or {})
    reference = {knob.name: _reference(knob, base) for knob in space.knobs}
    knobs, notes = list(space.knobs), []
    for index, knob in enumerate(space.knobs):
        if not knob.lossy:
            continue
        values = _grid(knob)

        def passes(value: Any, name: str = knob.name) -> bool:
            config = {**reference, name: value}
            candidate = Candidate(-1, config, space.params(config), space.fields(config), True)
            return agreement_of(candidate) >= min_agreement

        verdicts = [passes(value) for value in values]
        if all(verdicts) or not any(verdicts) or (knob.name in base and not passes(base[knob.name])):
            continue
        if knob.kind in ("bool", "categorical"):
            kept = tuple(value for value, ok in zip(values, verdicts, strict=True) if ok)
            narrowed = replace(knob, kind="categorical", choices=kept)
        else:
            start = values.index(reference[knob.name]) if reference[knob.name] in values else -1
            if start < 0 or not verdicts[start]:
                start = verdicts.index(True)
            low = high = start
            while low > 0 and verdicts[low - 1]:
                low -= 1
            while high + 1 < len(values) and verdicts[high + 1]:
                high += 1
            narrowed = replace(knob, low=values[low], high=values[high])
        knobs[index] = narrowed
        notes.append(f"{knob.name} {knob.text} narrowed to {narrowed.text}: beyond it the model predicts output "
                     f"agreement below the quality floor {min_agreement:g}")
    return replace(space, knobs=tuple(knobs)), tuple(notes)
