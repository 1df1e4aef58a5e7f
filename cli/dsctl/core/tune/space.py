"""`dsctl tune` search spaces: knobs, ranges, dependencies, and ``--param`` overrides (pure, no I/O).

The spaces are data (``dsctl/data/tune_spaces.yaml``): for vllm-ascend (max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization, chunked prefill, ...), MindIE (maxBatchSize, maxPrefillBatchSize as a ratio of it,
maxQueueDelayMicroseconds, ...) and the field guide's fixed-batch server (batch_size, stream_num,
kv_sparse_threshold) that the lab engine serves.  `resolve_space` checks every knob against the parameter
registry (``engine_params.yaml``, through dsctl.core.serving.service): the type must match and the range must lie
within the registry's bounds (a data bug otherwise, ValueError); a knob the registry does not list for the engine,
or that the host's vllm-ascend release does not read, is dropped and the reason kept in ``notes``.

A configuration (``config``) maps knob names to sampled values.  `SearchSpace.params` turns it into the engine
parameters the service gets (knob -> registry name, ratios resolved), `SearchSpace.fields` into the service fields
(tensor_parallel_size, data_parallel_size), and `SearchSpace.violations` checks the dependencies
(maxPrefillBatchSize <= maxBatchSize, tp x dp = NPUs of the instance); ``derived`` parameters follow from knobs
(the fixed-batch space's max_num_seqs = batch_size x stream_num).

The layout of an instance over ``nodes`` hosts (vllm-ascend Multi-Node-DP, multi-node.md): one ``vllm serve`` per
node, TP x local DP = the node's NPUs, so tensor_parallel_size takes the divisors of one node's NPUs and
data_parallel_size = the instance's NPUs / tp (a multiple of nodes).  A knob marked ``experts`` (vllm-ascend's
enable_expert_parallel) is searched only for a MoE model (``moe=True``) over several hosts: vLLM ignores it on a
dense model, and inside one host dsctl's model gives it no effect (in-host collectives are a fixed latency), so
there it would only spend the budget.

Overrides (``--param``, also from the inventory)::

    --param max_num_seqs=16:256        narrow (or extend) a range; ints stay ints
    --param max_num_seqs=16:256:log    ... sampled on a log scale
    --param stream_num=1,2,4           a fixed set of values
    --param enforce_eager=false        pin one value
    --param enable_prefix_caching=true,false   add a registry parameter the space does not search

An unknown name gets a "did you mean" (difflib over the space's knobs and the engine's parameters).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dsctl import data
from dsctl.core.serving import service
from dsctl.errors import UsageError

KINDS = ("int", "float", "bool", "categorical")
PARALLEL_FIELDS = ("tensor_parallel_size", "data_parallel_size")
_REGISTRY_KIND = {"int": "int", "float": "float", "bool": "bool", "enum": "categorical", "str": "categorical"}
# A numeric knob's multiplicative move in the local search around an incumbent (Knob.neighbours): 5/4, so a batch
# of 40 moves to 50 or 32, and 8 -> 512 takes ~19 moves (a guess at a step that still tells neighbours apart on the
# capacity landscapes of bench/landscape.py, where adjacent batch sizes differ by less than the noise).
NEIGHBOUR_FACTOR = 1.25


@dataclass(frozen=True)
class Knob:
    """One searched dimension."""

    name: str
    kind: str  # int | float | bool | categorical
    param: str  # the registry name (or a service field for parallel knobs)
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    ratio_of: str | None = None
    lossy: bool = False
    parallel: bool = False
    unset: Any = None  # the engine's value when the parameter is left out
    source: str = ""
    experts: bool = False  # a MoE layout knob (enable_expert_parallel): searched for MoE models over several hosts
    per_tp_group: bool = False  # a per-step budget of one data-parallel rank, split over its TP group's NPUs

    @property
    def values(self) -> tuple[Any, ...]:
        """Every value, for discrete knobs (bool, categorical, stepped int); () for continuous ones."""
        if self.kind == "bool":
            return (False, True)
        if self.kind == "categorical":
            return self.choices
        if self.kind == "int" and not self.log:
            return tuple(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return ()

    def contains(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "categorical":
            return any(value == choice and type(value) is type(choice) for choice in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and not float(value).is_integer():
            return False
        if not self.low <= value <= self.high:
            return False
        if self.step and not self.log:
            steps = (value - self.low) / self.step
            return abs(steps - round(steps)) < 1e-9
        return True

    def neighbours(self, value: Any) -> tuple[Any, ...]:
        """The values one move from ``value``, for a local search around an incumbent: the other boolean; the
        adjacent choices; for numbers one factor of `NEIGHBOUR_FACTOR` each way and, on a linear scale, one step
        (a stepped knob's step, an int's 1, else a tenth of the range), on the knob's grid: a move is small near
        the bottom of a range and still reaches the top of a wide one in a few moves.  Only values the knob
        contains, never ``value`` itself."""
        if self.kind == "bool":
            return (not value,)
        if self.kind == "categorical":
            index = next((i for i, choice in enumerate(self.choices) if choice == value
                          and type(choice) is type(value)), None)
            if index is None:
                return ()
            return tuple(self.choices[i] for i in (index - 1, index + 1) if 0 <= i < len(self.choices))
        moves = [value * NEIGHBOUR_FACTOR, value / NEIGHBOUR_FACTOR]
        if not self.log:  # on a log scale the factor is the step
            step = self.step or (1 if self.kind == "int" else 0.1 * (self.high - self.low))
            moves += [value + step, value - step]
        out: list[Any] = []
        for move in moves:
            move = self.on_grid(min(max(move, self.low), self.high))
            if move != value and self.contains(move) and move not in out:
                out.append(move)
        return tuple(out)

    def snap(self, value: Any) -> Any:
        """A stepped float as its step's decimal value: Optuna's ``low + k x step`` gives 0.8400000000000001, which
        would reach the engine's argv and the report as it is."""
        if self.kind == "float" and self.step and not self.log and isinstance(value, float):
            return self.on_grid(value)
        return value

    def on_grid(self, value: float) -> Any:
        """``value`` on the knob's grid: an int rounded (to its step on a linear scale), a stepped float to its step."""
        if self.kind == "int":
            if self.step and not self.log:
                return int(self.low + round((value - self.low) / self.step) * self.step)
            return int(round(value))
        if self.step and not self.log:
            return round(self.low + round((value - self.low) / self.step) * self.step, 10)
        return value

    @property
    def text(self) -> str:
        if self.kind == "bool":
            return "true/false"
        if self.kind == "categorical":
            return ",".join(_show(choice) for choice in self.choices)
        tail = ":log" if self.log else (f" step {self.step:g}" if self.step else "")
        scale = f" x {self.ratio_of}" if self.ratio_of else ""
        return f"{self.low:g}:{self.high:g}{tail}{scale}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "param": self.param, "low": self.low, "high": self.high,
                "log": self.log, "step": self.step, "choices": list(self.choices), "ratio_of": self.ratio_of,
                "lossy": self.lossy, "parallel": self.parallel, "range": self.text}


@dataclass(frozen=True)
class Constraint:
    """A dependency between knobs: ``le`` (a <= b), ``divides`` (a divides b), ``product`` (a x b = equals)."""

    kind: str
    names: tuple[str, ...]
    equals: str | None = None
    why: str = ""

    @property
    def text(self) -> str:
        a, b = self.names
        if self.kind == "le":
            return f"{a} <= {b}"
        if self.kind == "divides":
            return f"{a} divides {b}"
        return f"{a} x {b} = {self.equals}"

    def violation(self, values: Mapping[str, Any]) -> str | None:
        """A one-line reason when ``values`` break this dependency; None when it holds or does not apply."""
        a, b = self.names
        if a not in values or b not in values:
            return None
        x, y = values[a], values[b]
        if self.kind == "le" and x > y:
            return f"{a} {_show(x)} > {b} {_show(y)}: {self.why}"
        if self.kind == "divides" and (x <= 0 or y % x):
            return f"{a} {_show(x)} does not divide {b} {_show(y)}: {self.why}"
        if self.kind == "product" and self.equals in values and x * y != values[self.equals]:
            return f"{a} {_show(x)} x {b} {_show(y)} != {self.equals} {values[self.equals]}: {self.why}"
        return None


@dataclass(frozen=True)
class Derived:
    """An engine parameter a space sets from its knobs (``product``: the knobs' values multiplied), not searched."""

    param: str
    product: tuple[str, ...]
    why: str = ""


@dataclass(frozen=True)
class SearchSpace:
    name: str
    engine: str
    knobs: tuple[Knob, ...]
    constraints: tuple[Constraint, ...] = ()
    notes: tuple[str, ...] = ()
    npus_per_instance: int | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)  # the service's current params (constraint context)
    vllm_ascend: str | None = None  # the host's release (version gates)
    derived: tuple[Derived, ...] = ()
    nodes: int = 1  # hosts one instance spans (npus_per_instance / nodes NPUs each)

    @property
    def npus_per_node(self) -> int | None:
        return None if self.npus_per_instance is None else self.npus_per_instance // self.nodes

    def knob(self, name: str) -> Knob:
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(knob.name for knob in self.knobs)

    @property
    def lossy(self) -> tuple[str, ...]:
        return tuple(knob.name for knob in self.knobs if knob.lossy)

    def params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Engine parameters (registry names) for a configuration; ratio knobs become integers (at least 1)."""
        out: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.parallel or knob.name not in config:
                continue
            value = config[knob.name]
            if knob.ratio_of is not None:
                base = self._value(knob.ratio_of, config)
                value = max(1, int(round(value * base))) if base is not None else None
                if value is None:
                    continue
            elif knob.kind == "int":
                value = int(value)
            out[knob.param] = value
        for rule in self.derived:
            factors = [self._value(name, config) for name in rule.product]
            if all(isinstance(f, int) and not isinstance(f, bool) for f in factors):
                out[rule.param] = math.prod(factors)
        return out

    def fields(self, config: Mapping[str, Any]) -> dict[str, int]:
        """Service fields a configuration sets: tensor_parallel_size and the data_parallel_size it implies."""
        for knob in self.knobs:
            if knob.parallel and knob.name in config:
                tp = int(config[knob.name])
                out = {"tensor_parallel_size": tp}
                if _has_data_parallel(self.engine) and self.npus_per_instance:
                    out["data_parallel_size"] = self.npus_per_instance // tp
                return out
        return {}

    def _value(self, name: str, config: Mapping[str, Any]) -> Any:
        if name in config:
            knob = self.knob(name) if name in self.names else None
            return int(config[name]) if knob is not None and knob.kind == "int" else config[name]
        return service.effective_params(self.engine, self.fixed).get(name)

    def values(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Every name a constraint may refer to: current params and defaults, this config's knobs (by knob and
        by registry name, resolved), its service fields and npus_per_instance."""
        values: dict[str, Any] = dict(service.effective_params(self.engine, self.fixed))
        params = self.params(config)
        values.update(params)
        for knob in self.knobs:
            if knob.param in params:
                values[knob.name] = params[knob.param]
        values.update(self.fields(config))
        if self.npus_per_instance is not None:
            values["npus_per_instance"] = self.npus_per_instance
        return values

    def neighbours(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The configurations one knob's move (`Knob.neighbours`) from ``config``, in knob order; not checked
        against the constraints (`violations` does that).

        A move of the parallel knob (tensor_parallel_size t -> t') is a layout move: the ``per_tp_group`` knobs
        (max_num_batched_tokens) follow it by t'/t, so each NPU's share of a step stays what it was.  Why: in vLLM
        each data-parallel rank is its own engine core with its own scheduler (vLLM docs, "Data Parallel
        Deployment"), so the step's token budget is per rank, and its TP group's NPUs split that step; the chunk a
        step prefills sets how long the decodes it carries stall (the TPOT), so the best budget moves with the
        TP degree (bench/landscape.py moe-long: the top at TP 2 sits near 1400 tokens, at TP 1 near 700-800;
        from 1418 tokens at TP 2, 84 % of the optimum, the plain move to TP 1 measured 51 % and the layout move
        94 %, single workload draws)."""
        out = []
        for knob in self.knobs:
            if knob.name not in config:
                continue
            for value in knob.neighbours(config[knob.name]):
                move = {**config, knob.name: value}
                if knob.parallel:
                    move.update(self._per_tp_group(config, config[knob.name], value))
                out.append(move)
        return out

    def _per_tp_group(self, config: Mapping[str, Any], tp: Any, new_tp: Any) -> dict[str, Any]:
        """The ``per_tp_group`` knobs scaled by new_tp / tp, on their grid and within their range."""
        out: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.per_tp_group and knob.name in config and tp:
                scaled = knob.on_grid(min(max(config[knob.name] * new_tp / tp, knob.low), knob.high))
                if knob.contains(scaled):
                    out[knob.name] = scaled
        return out

    def moved_knob(self, base: Mapping[str, Any], move: Mapping[str, Any]) -> str | None:
        """The knob a move from ``base`` moves: the one knob that differs, or the parallel knob of a layout move
        (its ``per_tp_group`` knobs scaled along, `neighbours`); None for anything else."""
        differ = differing(base, move)
        if differ is None:
            return None
        if len(differ) == 1:
            return differ[0]
        parallel = [name for name in differ if name in self.names and self.knob(name).parallel]
        if len(parallel) != 1:
            return None
        followers = self._per_tp_group(base, base[parallel[0]], move[parallel[0]])
        rest = [name for name in differ if name != parallel[0]]
        return parallel[0] if all(name in followers and comparable(followers[name]) == comparable(move[name])
                                  for name in rest) else None

    @property
    def switches(self) -> tuple[str, ...]:
        """The knobs of a few values (booleans, choices, the parallel layout), whose moves the refinement tries
        before a number's among moves it has no evidence on (analysis.refinement_order)."""
        return tuple(knob.name for knob in self.knobs if knob.kind in ("bool", "categorical"))

    def violations(self, config: Mapping[str, Any]) -> list[str]:
        """The dependencies a configuration breaks (one line each), and values outside their knob's range."""
        problems = [f"{name}: {_show(config[name])} outside {self.knob(name).text}"
                    for name in self.names if name in config and not self.knob(name).contains(config[name])]
        values = self.values(config)
        problems += [reason for constraint in self.constraints if (reason := constraint.violation(values))]
        if not problems:  # the registry's own checks, as deploy will run them (its cross-parameter rules too)
            try:
                service.check_params(self.engine, {**self.fixed, **self.params(config)}, vllm_ascend=self.vllm_ascend)
            except service.ServiceError as problem:
                problems.append(str(problem).removesuffix(f"; {service.FIX}"))
        return problems

    def baseline(self, params: Mapping[str, Any], fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The configuration of the service as it runs now (its params and registry defaults), for the knobs
        that have a value there; ratio knobs as their ratio."""
        current = service.effective_params(self.engine, params)
        config: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.parallel:
                tp = (fields or {}).get("tensor_parallel_size")
                if tp is not None:
                    config[knob.name] = int(tp)
                continue
            if knob.param not in current:
                if knob.unset is not None:
                    config[knob.name] = knob.unset
                continue
            value = current[knob.param]
            if knob.ratio_of is not None:
                base = current.get(self.knob(knob.ratio_of).param) if knob.ratio_of in self.names else None
                if not base:
                    continue
                value = value / base
            config[knob.name] = value
        return config

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "knobs": [knob.to_dict() for knob in self.knobs],
                "constraints": [c.text for c in self.constraints], "notes": list(self.notes)}


def including_baseline(space: SearchSpace, baseline: Mapping[str, Any],
                       overridden: Sequence[str] = ()) -> SearchSpace:
    """``space`` stretched so that the service's own configuration (``baseline``, `SearchSpace.baseline`), the live
    tune's first trial and the figure a winner must beat, is one of its points: a number outside a knob's range
    widens the range to it (a stepped knob only when the value is on its grid), a categorical value joins the
    choices; each widening is noted.  A knob narrowed or pinned with ``--param`` (``overridden``) is the user's
    range and is kept: a baseline value outside it is noted instead (that knob then starts from the space, so the
    first trial is not the inventory's configuration).  Issue 42: a real-vLLM service at max_num_seqs 2 (the space
    starts at 8) had its baseline trial silently run at a sampled 12."""
    knobs: list[Knob] = []
    notes: list[str] = []
    for knob in space.knobs:
        value = baseline.get(knob.name)
        if value is None or knob.contains(value) or knob.parallel or knob.ratio_of is not None:
            knobs.append(knob)
            continue
        wider = None
        if knob.kind == "categorical":
            wider = replace(knob, choices=(*knob.choices, value))
        elif knob.kind in ("int", "float") and not isinstance(value, bool) and isinstance(value, (int, float)) \
                and math.isfinite(value) and (knob.kind == "float" or float(value).is_integer()) \
                and (value > 0 or not knob.log):
            on_grid = not knob.step or knob.log or abs((value - knob.low) / knob.step
                                                       - round((value - knob.low) / knob.step)) < 1e-9
            wider = replace(knob, low=min(knob.low, value), high=max(knob.high, value)) if on_grid else None
        if knob.name in overridden or wider is None:
            notes.append(f"{knob.name}: the service's {_show(value)} is outside the searched {knob.text}"
                         f"{' (--param)' if knob.name in overridden else ''}; the first trial is not its "
                         "configuration")
            knobs.append(knob)
            continue
        notes.append(f"{knob.name}: searched over {wider.text}, widened from {knob.text} to hold the service's "
                     f"{_show(value)} (the baseline)")
        knobs.append(wider)
    return replace(space, knobs=tuple(knobs), notes=(*space.notes, *notes))


def comparable(value: Any) -> Any:
    """A knob's value as the search compares it: numbers to 9 decimal places (a float knob's grid steps are
    coarser; 0.1 + 0.2 and 0.3 are one value), a bool never equal to a number.  One definition for every
    comparison of configurations (the search's duplicates and one-knob pairs, `SearchSpace.moved_knob`)."""
    if isinstance(value, bool):
        return (bool, value)
    if isinstance(value, float) and math.isfinite(value):
        return (float, round(value, 9))
    if isinstance(value, int):
        return (float, round(float(value), 9)) if abs(value) < 2 ** 53 else (int, value)
    return (type(value).__name__, value)


def differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str] | None:
    """The knobs whose values differ between two configurations (`comparable`); None when they do not set the same
    knobs (a knob one of them leaves unset is no value to move from)."""
    if a.keys() != b.keys():
        return None
    return [name for name in a if comparable(a[name]) != comparable(b[name])]


def lone_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The one knob in which two configurations differ; None when they differ in none or in several, or do not
    set the same knobs."""
    differ = differing(a, b)
    return differ[0] if differ is not None and len(differ) == 1 else None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --------------------------------------------------------------------------- loading and checking


def spaces_data() -> dict[str, Any]:
    return data.load("tune_spaces")


def space_names() -> tuple[str, ...]:
    return tuple(spaces_data()["spaces"])


def default_space(engine: str, spaces: Mapping[str, Any] | None = None) -> str:
    """The space `dsctl tune` uses for a service of ``engine`` when none is named."""
    table = (spaces or spaces_data())["spaces"]
    for name, spec in table.items():
        if engine in (spec.get("default_for") or ()):
            return name
    raise UsageError(f"no tune space for engine {engine!r}; add one to dsctl/data/tune_spaces.yaml")


def _has_data_parallel(engine: str) -> bool:
    return "data_parallel_size" in service.registry()[engine]["reserved"].values()


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _check_against_registry(space: str, knob: Knob, entry: Mapping[str, Any]) -> None:
    """A data bug (ValueError) when a knob's type or range does not fit the registry's entry."""
    where = f"tune_spaces.yaml: {space}.{knob.name}"
    expected = _REGISTRY_KIND.get(entry["type"])
    if knob.ratio_of is not None:
        if entry["type"] != "int" or knob.kind != "float":
            raise ValueError(f"{where}: ratio_of needs a float ratio of an int parameter")
        return
    if entry["type"] == "int" and "choices" in entry:
        expected = "categorical"
    if knob.kind != expected and not (knob.kind == "categorical" and entry["type"] in ("int", "float", "bool")):
        raise ValueError(f"{where}: knob type {knob.kind} does not match the registry's {entry['type']}")
    for value in _probe_values(knob):
        try:
            checked = service._param_value(knob.param, entry, value, f"params.{knob.param}")
        except service.ServiceError as problem:
            raise ValueError(f"{where}: {value!r} is outside the registry's range ({problem})") from None
        if checked != value:
            raise ValueError(f"{where}: {value!r} is normalised by the registry to {checked!r}")


def _probe_values(knob: Knob) -> tuple[Any, ...]:
    if knob.kind in ("bool", "categorical"):
        return knob.values
    low, high = knob.low, knob.high
    return (int(low), int(high)) if knob.kind == "int" else (float(low), float(high))


def _knob(space: str, name: str, spec: Mapping[str, Any], lossy_params: Sequence[str]) -> Knob:
    where = f"tune_spaces.yaml: {space}.{name}"
    kind = spec.get("type")
    if kind not in KINDS:
        raise ValueError(f"{where}: type must be one of {', '.join(KINDS)}")
    param = spec.get("param", name)
    knob = Knob(name=name, kind=kind, param=param, low=spec.get("low"), high=spec.get("high"),
                log=bool(spec.get("log", False)), step=spec.get("step"), choices=tuple(spec.get("choices") or ()),
                ratio_of=spec.get("ratio_of"), lossy=bool(spec.get("lossy", False)) or param in lossy_params,
                parallel=bool(spec.get("parallel", False)), unset=spec.get("unset"),
                source=str(spec.get("source", "")), experts=bool(spec.get("experts", False)),
                per_tp_group=bool(spec.get("per_tp_group", False)))
    if knob.per_tp_group and knob.kind not in ("int", "float"):
        raise ValueError(f"{where}: per_tp_group needs a numeric knob")
    _check_shape(where, knob)
    return knob


def _check_shape(where: str, knob: Knob) -> None:
    if knob.parallel:
        return
    if knob.kind in ("int", "float"):
        if knob.low is None or knob.high is None or not knob.low <= knob.high:
            raise ValueError(f"{where}: needs low <= high")
        if knob.log and (knob.step or knob.low <= 0):
            raise ValueError(f"{where}: a log scale needs low > 0 and no step")
        if knob.step:
            steps = (knob.high - knob.low) / knob.step
            if knob.step <= 0 or abs(steps - round(steps)) > 1e-9:
                raise ValueError(f"{where}: high - low must be a multiple of step")
    if knob.kind == "categorical" and not knob.choices:
        raise ValueError(f"{where}: a categorical knob needs choices")


def resolve_space(name: str, *, vllm_ascend: str | None = None, npus_per_instance: int | None = None,
                  params: Mapping[str, Any] | None = None, overrides: Sequence[str] = (),
                  spaces: Mapping[str, Any] | None = None, nodes: int = 1, moe: bool | None = None) -> SearchSpace:
    """The named space for a service: knobs checked against the registry and version-gated (dropped with a note),
    the parallel knob expanded to the divisors of ``npus_per_instance`` (over ``nodes`` hosts: of one node's NPUs),
    ``experts`` knobs kept for a MoE model (``moe``) over several hosts, then ``overrides`` (``--param``) applied.

    ``params`` are the service's current engine parameters (constraint context and baseline).  ``spaces`` replaces
    the data file (tests).  Raises `UsageError` for an unknown space or a bad override."""
    table = spaces or spaces_data()
    if name not in table["spaces"]:
        close = difflib.get_close_matches(name, list(table["spaces"]), n=1)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(table['spaces'])}"
        raise UsageError(f"tune space {name!r} is unknown; {hint}")
    spec = table["spaces"][name]
    engine = spec["engine"]
    known = service.engine_params(engine)
    fields = set(service.registry()[engine]["reserved"].values())  # service fields the engine takes
    lossy_params = tuple(table.get("lossy_params") or ())
    knobs: list[Knob] = []
    notes: list[str] = []
    for knob_name, knob_spec in (spec.get("knobs") or {}).items():
        knob = _knob(name, knob_name, knob_spec, lossy_params)
        if knob.parallel:
            if knob.param not in fields:
                notes.append(f"{knob.name}: {engine} has no such service field; dropped")
                continue
            if npus_per_instance is None:
                notes.append(f"{knob.name}: the instance's NPU count is not known; not searched")
                continue
            if nodes > 1 and _has_data_parallel(engine):  # TP x local DP = one node's NPUs
                choices = _divisors(npus_per_instance // nodes)
            else:
                choices = _divisors(npus_per_instance) if _has_data_parallel(engine) else (npus_per_instance,)
            if len(choices) < 2:
                notes.append(f"{knob.name}: only {choices[0]} fits {npus_per_instance} NPU(s); not searched")
                continue
            knobs.append(replace(knob, choices=choices))
            continue
        entry = known.get(knob.param)
        if entry is None:
            notes.append(f"{knob.name}: {engine} has no parameter {knob.param} in engine_params.yaml; dropped")
            continue
        if knob.experts and not (moe and nodes > 1):
            if moe is False and nodes > 1:
                notes.append(f"{knob.name}: a dense model has no experts to shard; not searched")
            elif moe and nodes <= 1:
                notes.append(f"{knob.name}: no modelled effect inside one host (in-host collectives are a fixed "
                             f"latency); searched with --nodes > 1")
            continue
        gate = service._gate_problem(engine, entry, vllm_ascend)
        if gate:
            notes.append(f"{knob.name}: {gate}; dropped")
            continue
        _check_against_registry(name, knob, entry)
        knobs.append(knob)
    constraints = tuple(Constraint(kind, tuple(c[kind]), c.get("equals"), str(c.get("why", "")))
                        for c in spec.get("constraints") or () for kind in ("le", "divides", "product") if kind in c)
    derived = tuple(_derived(name, param, rule, known) for param, rule in (spec.get("derived") or {}).items())
    space = SearchSpace(name=name, engine=engine, knobs=tuple(knobs), constraints=constraints, notes=tuple(notes),
                        npus_per_instance=npus_per_instance, fixed=dict(params or {}), vllm_ascend=vllm_ascend,
                        derived=derived, nodes=max(1, nodes))
    for text in overrides:
        space = apply_override(space, parse_override(text), vllm_ascend=vllm_ascend, lossy_params=lossy_params)
    return space


def _derived(space: str, param: str, rule: Mapping[str, Any], known: Mapping[str, Any]) -> Derived:
    where = f"tune_spaces.yaml: {space}.derived.{param}"
    factors = rule.get("product")
    if param not in known or known[param]["type"] != "int":
        raise ValueError(f"{where}: needs an int parameter of the engine")
    if not isinstance(factors, list) or len(factors) < 2:
        raise ValueError(f"{where}: product needs a list of at least two knob names")
    return Derived(param, tuple(factors), str(rule.get("why", "")))


# --------------------------------------------------------------------------- --param


@dataclass(frozen=True)
class Override:
    """``name=lo:hi[:log]`` (a range) or ``name=a,b,c`` (values; one value pins the knob)."""

    text: str
    name: str
    low: str | None = None
    high: str | None = None
    log: bool = False
    values: tuple[str, ...] = ()


def _param_error(text: str, why: str) -> UsageError:
    return UsageError(f"--param {text!r}: {why}")


def parse_override(text: str) -> Override:
    name, sep, rest = text.partition("=")
    name, rest = name.strip(), rest.strip()
    if not sep or not name or not rest:
        raise _param_error(text, "expected name=lo:hi[:log] or name=a,b,c, e.g. max_num_seqs=16:256:log")
    if ":" in rest:
        parts = [part.strip() for part in rest.split(":")]
        if len(parts) == 3 and parts[2].lower() == "log":
            return Override(text, name, parts[0], parts[1], log=True)
        if len(parts) != 2 or not all(parts):
            raise _param_error(text, "a range is lo:hi or lo:hi:log, e.g. max_num_seqs=16:256:log")
        return Override(text, name, parts[0], parts[1])
    values = tuple(part.strip() for part in rest.split(","))
    if not all(values):
        raise _param_error(text, "an empty value between commas; write e.g. stream_num=1,2,4")
    return Override(text, name, values=values)


def _number(text: str, override: Override, kind: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise _param_error(override.text, f"{text!r} is not a number") from None
    if kind == "int":
        if not value.is_integer():
            raise _param_error(override.text, f"{override.name} takes integers, got {text!r}")
        return int(value)
    if math.isinf(value) or math.isnan(value):
        raise _param_error(override.text, f"{text!r} is not a finite number")
    return value


def _typed(text: str, override: Override, entry: Mapping[str, Any] | None, kind: str) -> Any:
    base = entry["type"] if entry is not None else ("int" if kind == "int" else kind)
    if base == "bool" or kind == "bool":
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise _param_error(override.text, f"{override.name} is true or false, got {text!r}")
        return lowered == "true"
    if base in ("int", "float"):
        return _number(text, override, base)
    if base == "enum":  # registry enums hold ints (MindIE policies) or strings (dtype)
        for choice in entry["choices"]:
            if str(choice).lower() == text.lower():
                return choice
        return text
    return text


def _registry_check(override: Override, param: str, entry: Mapping[str, Any] | None, value: Any) -> None:
    if entry is None:
        return
    try:
        service._param_value(param, entry, value, f"params.{param}")
    except service.ServiceError as problem:
        reason = str(problem).split(": ", 1)[-1].split("; fix it")[0]
        raise _param_error(override.text, f"{_show(value)} is not allowed for {param}: {reason}") from None


def apply_override(space: SearchSpace, override: Override, *, vllm_ascend: str | None = None,
                   lossy_params: Sequence[str] = ()) -> SearchSpace:
    """``space`` with one knob narrowed, extended, pinned or added; `UsageError` (one line) if it cannot be."""
    known = service.engine_params(space.engine)
    existing = next((k for k in space.knobs if k.name == override.name or k.param == override.name), None)
    rule = next((d for d in space.derived if d.param == override.name), None)
    if existing is None and rule is not None:
        raise _param_error(override.text, f"{rule.param} follows {' x '.join(rule.product)} in space {space.name}; "
                                          f"set {' or '.join(rule.product)} instead")
    if existing is None and override.name not in known:
        candidates = list(space.names) + [n for n in known if known[n]["type"] != "json"]
        close = difflib.get_close_matches(override.name, candidates, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"searchable: {', '.join(space.names)}"
        raise _param_error(override.text, f"{override.name!r} is not a {space.engine} knob; {hint}")
    if existing is not None and existing.parallel:
        if override.low is not None:
            raise _param_error(override.text, f"{existing.name} takes a list of degrees, e.g. {existing.name}=2,4")
        choices = tuple(_number(v, override, "int") for v in override.values)
        for tp in choices:
            if tp not in existing.choices:
                where = (f"one node's {space.npus_per_node} NPUs (TP x local DP = a node's NPUs over the instance's "
                         f"{space.nodes} hosts)" if space.nodes > 1 else
                         f"the instance's {space.npus_per_instance} NPUs")
                raise _param_error(override.text, f"{existing.name} {tp} does not divide {where}; use one of "
                                                  f"{','.join(map(str, existing.choices))}")
        return _replace_knob(space, existing, replace(existing, choices=choices))
    param = existing.param if existing is not None else override.name
    entry = known[param]
    if entry["type"] == "json":
        raise _param_error(override.text, f"{param} is a JSON parameter; set it in the inventory, not as a knob")
    gate = service._gate_problem(space.engine, entry, vllm_ascend)
    if gate:
        raise _param_error(override.text, gate)
    lossy = (existing.lossy if existing is not None else False) or param in lossy_params
    if override.low is not None:
        kind = "int" if entry["type"] == "int" else "float"
        if entry["type"] not in ("int", "float") or "choices" in entry:
            raise _param_error(override.text, f"{param} takes a set of values, not a range; write {param}=a,b")
        low, high = _number(override.low, override, kind), _number(override.high, override, kind)
        if low > high:
            raise _param_error(override.text, f"the low end {override.low} is above the high end {override.high}")
        if override.log and low <= 0:
            raise _param_error(override.text, "a log scale needs a positive low end")
        for value in (low, high):
            _registry_check(override, param, entry, value)
        knob = Knob(name=existing.name if existing else param, kind=kind, param=param, low=low, high=high,
                    log=override.log, step=None if override.log or kind == "int" else
                    (existing.step if existing is not None and existing.step and
                     _on_grid(low, high, existing.step) else None),
                    lossy=lossy, unset=existing.unset if existing is not None else None,
                    per_tp_group=existing is not None and existing.per_tp_group,  # the parameter's nature, kept
                    source=f"--param {override.text}")
    else:
        kind = "bool" if entry["type"] == "bool" else ("int" if entry["type"] == "int" else
                                                        "float" if entry["type"] == "float" else "categorical")
        values = tuple(_typed(v, override, entry, kind) for v in override.values)
        for value in values:
            _registry_check(override, param, entry, value)
        if len(set(values)) != len(values):
            raise _param_error(override.text, "a value is listed twice")
        knob = Knob(name=existing.name if existing else param, kind="categorical", param=param, choices=values,
                    lossy=lossy, unset=existing.unset if existing is not None else None,
                    source=f"--param {override.text}")
    if existing is None:
        return replace(space, knobs=(*space.knobs, knob))
    return _replace_knob(space, existing, knob)


def _on_grid(low: float, high: float, step: float) -> bool:
    steps = (high - low) / step
    return abs(steps - round(steps)) < 1e-9


def _replace_knob(space: SearchSpace, old: Knob, new: Knob) -> SearchSpace:
    return replace(space, knobs=tuple(new if knob is old else knob for knob in space.knobs))
