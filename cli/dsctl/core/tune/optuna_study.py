"""`dsctl tune`'s search, the Optuna plumbing: the knobs as Optuna distributions, the seeded samplers (TPE with
constraints, or uniform), a trial's constraint values for Optuna releases without ``Trial.set_constraint``, and the
fingerprint a resumed study must match.  No storage is made here: the journal file is
`dsctl.adapters.study_journal`'s; `dsctl.core.tune.study` runs a study on whatever storage it is handed.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from dsctl.core.tune import slo as slo_mod
from dsctl.core.tune.space import Knob, SearchSpace

ATTR = "dsctl"  # the user attribute holding a trial's record


def distribution(knob: Knob) -> BaseDistribution:
    if knob.kind == "bool":
        return CategoricalDistribution([False, True])
    if knob.kind == "categorical":
        return CategoricalDistribution(list(knob.choices))
    if knob.kind == "int":
        return IntDistribution(int(knob.low), int(knob.high), log=knob.log,
                               step=1 if knob.log else int(knob.step or 1))
    return FloatDistribution(float(knob.low), float(knob.high), log=knob.log,
                             step=None if knob.log else knob.step)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {knob.name: distribution(knob) for knob in space.knobs}


def _constraints_from_attrs(trial: FrozenTrial) -> Sequence[float]:
    """For Optuna releases without Trial.set_constraint: the constraint values the driver stored."""
    record = trial.user_attrs.get(ATTR) or {}
    return list((record.get("constraints") or {"none": 0.0}).values())


HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")


def sampler(seed: int, n_startup: int, strategy: str = "tpe") -> optuna.samplers.BaseSampler:
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate / constant_liar are marked experimental
        kwargs: dict[str, Any] = {} if HAS_SET_CONSTRAINT else {"constraints_func": _constraints_from_attrs}
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=True,
                                          constant_liar=True, **kwargs)


def fingerprint(space: SearchSpace, slos: Sequence[slo_mod.Slo], objective: str) -> str:
    """What a study is about; a resume must not change it."""
    body = {"space": [k.to_dict() for k in space.knobs], "constraints": [c.text for c in space.constraints],
            "slos": [s.label for s in slos], "objective": objective, "engine": space.engine}
    return json.dumps(body, sort_keys=True, default=str)
