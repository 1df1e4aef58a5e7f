"""The landscapes a tuner faces on the emulated 910B stack: each configuration's figure over `dsctl tune`'s default
spaces, with the ground truth running on other hardware figures than the screens' model.

A landscape is a model, an instance, a workload, an SLO and a tune space (the engine's default space of
cli/dsctl/data/tune_spaces.yaml, unpinned: the searches in bench/tune.py sample all of it).  Its figure per
configuration is what `dsctl tune --simulate` measures: by default the capacity (the highest offered rate the
instance sustains while meeting the SLO), or with ``--rate`` the goodput at that load.  Eight landscapes:

* chat-fixed: DeepSeek-R1-Distill-Qwen-7B on one 910B3, the fixed-batch engine (batch size per stream, stream
  count, KV sparsity), chat lengths (prompts 64-1024, outputs 16-192), TPOT p90 <= 60 ms;
* chat-vllm: the same workload on vllm-ascend (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization,
  chunked prefill, prefix caching, eager mode), TTFT p90 <= 500 ms;
* long-fixed: the fixed-batch engine on 32K-64K prompts with a reasoning model's longer answers (outputs 512-1024,
  prompt + output within max_model_len 65536: the engine refuses longer requests with HTTP 400, as vLLM does),
  where KV memory binds and decode reads the long context, so sparsity lets more sequences in and saves reads,
  TPOT p90 <= 120 ms (with outputs of 128-512 prefill bound everything and the best threshold was 0);
* moe-vllm: DeepSeek-V2-Lite (MoE with MLA and shared experts) on a 2-NPU vllm-ascend instance (tensor x data
  parallel, the shared-expert overlap stream), prompts 64-2048, TPOT p90 <= 50 ms;
* long-vllm: long-fixed's workload on vllm-ascend, TPOT p90 <= 100 ms and TTFT p90 <= 20 s (a long document's
  answer read as it streams, its first token within 20 s; at the lowest load the TTFT p90 is already ~12 s): the
  KV cache holds a handful of 64K contexts, so gpu_memory_utilization sets how many run at once; the prefill chunk
  (max_num_batched_tokens) trades the decode steps it stalls (TPOT) against the prefill's pace (TTFT).  Without
  chunked prefill vLLM refuses a max_num_batched_tokens below max_model_len, and the space's reach 32768: the
  table enumerates chunked prefill on only (the searches still sample off, and crash there);
* moe-long: moe-vllm's model and instance on long documents (prompts 8K-32K, answers 256-1024), TPOT p90 <= 50 ms
  and TTFT p90 <= 10 s: a prefill chunk too small misses the TTFT, one too large stalls the decodes past the TPOT
  (at max_num_seqs 64, tensor parallel 2: 512 tokens 0.50 req/s, 1024 1.06, 2048 0.48), and tensor parallel,
  the shared-expert overlap, eager mode and max_num_seqs move it by 4-40 %;
* moe-agent: moe-vllm's model and instance on an agent's turns (prompts 1K-8K: a tool loop's growing context;
  answers 64-512), TTFT p90 <= 300 ms and TPOT p90 <= 30 ms: the prefill chunk must be large enough to bring an
  8K prompt's first token within 300 ms and small enough that the decodes each chunk stalls keep 30 ms, so the top
  is where the chunk, the layout and the overlap meet (seed 0, the overlap on: tensor parallel 1 at 700 / 1024 /
  1400 / 2048 tokens 3.33 / 3.87 / 3.44 / 3.15 req/s, tensor parallel 2 at 1024 / 2048 / 2800 3.08 / 3.63 / 3.12;
  the overlap off at tensor parallel 1, 1024 tokens: 3.47), and max_num_seqs below ~24 caps the decode batch
  under the load (16: 2.95).  Its top is bound by the workload's draw (the optimum's nine draws spread 24 %): at
  seed 0, the draw the searches see, ~1000-1090 tokens measure best, over nine draws 845 does;
* moe-rag: moe-vllm's model and instance answering over retrieved documents (prompts 1K-8K, answers 64-512) with
  TPOT p90 <= 30 ms alone: a larger prefill chunk takes a prompt in fewer steps, until a step that carries one no
  longer keeps the decodes within 30 ms, so capacity climbs to a cliff (seed 0, the overlap on: tensor parallel 1
  at 512 / 644 / 712 / 1024 tokens 8.16 / 8.94 / 6.51 / 4.13 req/s; tensor parallel 2, whose two NPUs share a
  step, at 1024 / 1164 / 1533 tokens 7.36 / 8.00 / 4.76): the top is a ridge a few dozen tokens wide under the
  cliff of each layout.

The ground truth's hardware is not the model's (``MODEL_ERROR``, stated below): prefill compute and decode
bandwidth 10 % and 8 % below dsctl's profile, per-step and per-sequence host overhead 40 % above.  The screens
(roofline and model) predict with the profile, as they would on a site whose hardware dsctl has not measured, so
a screen can be wrong; its figures never enter the truth.

Enumeration: the truth is exact only where it was evaluated. Each landscape lists the values per knob its table
enumerates (``grid``: the space's ranges at powers of two, the float steps a search can tell apart; the vllm-ascend
landscapes three sizes per size knob, since at 300-s windows the full 588-point chat-vllm table would take hours on
two cores); every configuration a search asks outside it is evaluated too, on demand, and the optimum is the best
over everything evaluated ("best known"). A candidate the quality guard rejects (agreement below the floor, known
from its configuration) is not simulated: it costs its restart and counts as a failure.

Figures robust to the workload's draw.  One capacity measurement is one draw of requests and arrivals, and at
the top of a landscape that draw decides about as much as the configuration does.  With 100-s probe windows, on
chat-fixed, batch sizes 36-64 at two streams all saturated near 6.2 req/s and measured 5.97-6.24 at seed 0,
except batch 59 at 6.73; at seeds 0, 101 and 202 it measured 6.73, 7.03 and 5.97, a spread of 16 %, wider than
the 2 % window.  300-s windows (capacity.SIM_WINDOW_S) narrowed that (the optimum's spread 6.6 % on chat-fixed),
but long-fixed's probes rest on the sample-size rule's ~110 requests, not on the window, and spread 15-22 %.  Where
throughput binds, the rate search bisected the 5 % slack band, where verdicts flip with the draw: moe-vllm's
optimum spread 17.6 % over the seeds (32.0 / 43.3 / 46.2 req/s); resolved at the rate the server completes
(rate_search.py, "Throughput-bound tops") it spreads 1.7 %, chat-fixed's 4.5 % (was 8.8 %).  So a
configuration's *figure* is the median of its capacity over the workload seeds `FIGURE_SEEDS` (seed 0, the
measurement every search sees, and two more), and the optimum is the best figure.  The extra seeds are measured
only for configurations whose seed-0 value is within `FIGURE_CUT` of the best figure (below it a median near the
top would need both other draws a third above seed 0's); below it the figure is the seed-0 value.  The searches
themselves see only seed 0, as `dsctl tune --simulate` does.

The top's figures.  A median of three draws is still as wide as the window the searches are judged by, and the
optimum is the *largest* of many such figures, so it is biased upward by the luckiest draws (the winner's curse).
On chat-fixed the median-of-three optimum was 7.09 req/s (batch 57, threshold 0.15, 2 streams); over seven draws
that configuration averaged 6.76 and eleven of its neighbours 6.66-6.84, so "3 % above its neighbours" was the
draw.  So configurations whose median lies within `TOP_SHARE` of the best are measured at the nine `TOP_SEEDS`,
their figure is the mean, and the optimum is the best such mean; describe() prints its standard error.

This file prints, per landscape: the table's size and time, failures to start and under load, the optimum and
its configuration, how flat the top is (configurations whose figure is within 2 % and 5 % of the optimum) and the
workload-seed noise (the optimum's configuration at each seed of its figure, and the spread).

Tables cost minutes each (tens for the vllm-ascend ones): ``--cache DIR`` keeps every evaluated configuration (the
table, the searches' extra ones, the other seeds) in DIR, keyed by the landscape, the objective, the seed and a
digest of what produced them (`TRUTH_CODE`, the landscape's definition, the truth's hardware), so a rerun of the
same code reads them back and a change to it starts afresh.

Usage: .venv/bin/python bench/landscape.py [--landscapes chat-fixed,chat-vllm,long-fixed,moe-vllm,long-vllm,moe-long,
                                                          moe-agent,moe-rag]
                                           [--rate R] [--cache DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import pickle
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dsctl.core.perf import perfmodel
from dsctl.core.tune import capacity, quality
from dsctl.core.tune.search import CRASHES, Candidate, Failure, Outcome
from dsctl.services import tune

# The ground truth's hardware against dsctl's profile (guesses of a plausible site-to-model gap: the profile's
# efficiencies are themselves inferred, profiles.yaml; a slower host CPU than the profile assumed is the usual gap).
MODEL_ERROR = {"compute": 0.90, "bandwidth": 0.92, "step_overhead_ms": 1.4, "host_ms_per_seq": 1.4}
# The truth's outputs diverge from the unsparsified ones this much more often than dsctl's model says (a guess: no
# public measurement of kv_sparse_threshold's effect on agreement exists, field-practice.md), so the model
# screen's quality verdict can be wrong too.
DIVERGENCE_ERROR = 1.1
# A configuration's figure: the median of its capacity at these workload seeds, for those within FIGURE_CUT of the
# best figure (see the docstring).  0.75: a third below the top, twice the largest seed-to-seed spread
# measured (16 %, chat-fixed batch 59 at 2 streams).
FIGURE_SEEDS = (0, 101, 202)
FIGURE_CUT = 0.75
# The top's figures: the mean over TOP_SEEDS for configurations whose FIGURE_SEEDS median is within TOP_SHARE of the
# best such mean (see the docstring, "The top's figures").  Nine draws: chat-fixed's per-seed spread at the top is
# ~3.5 % (standard deviation), so a mean of nine has a standard error of ~1.2 %, below the 2 % window the searches
# are judged by; a median of three (~4 %) was wider than it.  0.08: twice the median-of-three's standard error there,
# so a configuration whose three draws were unlucky still gets its nine.
TOP_SEEDS = (0, 101, 202, 303, 404, 505, 606, 707, 808)
TOP_SHARE = 0.08


def truth_hardware() -> perfmodel.Efficiency:
    profile = perfmodel.load_profiles()[2]
    return dataclasses.replace(profile, **{name: getattr(profile, name) * factor
                                           for name, factor in MODEL_ERROR.items()})


@dataclasses.dataclass(frozen=True)
class Landscape:
    key: str
    title: str
    engine: str
    model: str
    npus: int
    prompts: str
    outputs: str
    max_model_len: int
    slo: str | tuple[str, ...]  # one SLO, or several that must all hold
    grid: Mapping[str, tuple[Any, ...]]  # the values per knob the table enumerates (other knobs: the space's)
    chip: str = "910B3"

    def inputs(self, *, objective: str = "capacity", rate: float | None = None, seed: int = 0,
               truth: bool = True) -> tune.TuneInputs:
        slos = (self.slo,) if isinstance(self.slo, str) else self.slo
        return tune.TuneInputs(model=self.model, chip=self.chip, slos=slos, run_dir=Path("."),
                               engine=self.engine, prompt_tokens=self.prompts, output_tokens=self.outputs,
                               max_model_len=self.max_model_len, npus_per_instance=self.npus, seed=seed,
                               objective=objective, rate=rate, hardware=truth_hardware() if truth else None)


_FIXED = {"batch_size": (1, 2, 4, 8, 16, 32, 64), "stream_num": (1, 2, 3, 4, 6, 8),
          "kv_sparse_threshold": (0.0, 0.05, 0.1, 0.15)}
_VLLM = {"max_num_seqs": (8, 16, 32, 64, 128, 256, 512),
         "max_num_batched_tokens": (512, 1024, 2048, 4096, 8192, 16384, 32768),
         "gpu_memory_utilization": (0.8, 0.9, 0.98), "enable_chunked_prefill": (False, True),
         "enable_prefix_caching": (False,), "enforce_eager": (False, True),
         "multistream_overlap_shared_expert": (False,)}
# moe-agent's and moe-rag's table: one prompt length range, so one grid (TTFT or TPOT binds; the searches sample the
# whole space either way)
_MOE_TURNS = {**_VLLM, "max_num_seqs": (16, 32, 64, 256), "max_num_batched_tokens": (512, 1024, 2048, 4096, 16384),
              "gpu_memory_utilization": (0.8, 0.98), "enforce_eager": (False,),
              "multistream_overlap_shared_expert": (False, True), "tensor_parallel_size": (1, 2)}
LANDSCAPES = {
    "chat-fixed": Landscape("chat-fixed", "fixed-batch, 7B chat, tpot p90 <= 60 ms", "lab-engine",
                            "deepseek-r1-distill-qwen-7b", 1, "uniform:64:1024", "uniform:16:192", 4096,
                            "tpot:p90=60ms", _FIXED),
    "chat-vllm": Landscape("chat-vllm", "vllm-ascend, 7B chat, ttft p90 <= 500 ms", "vllm-ascend",
                           "deepseek-r1-distill-qwen-7b", 1, "uniform:64:1024", "uniform:16:192", 4096,
                           "ttft:p90=500ms", {**_VLLM, "max_num_seqs": (16, 64, 256),
                                              "max_num_batched_tokens": (1024, 4096, 16384)}),
    "long-fixed": Landscape("long-fixed", "fixed-batch, 7B on 32K-64K prompts, tpot p90 <= 120 ms", "lab-engine",
                            "deepseek-r1-distill-qwen-7b", 1, "uniform:32768:64512", "uniform:512:1024", 65536,
                            "tpot:p90=120ms", {**_FIXED, "batch_size": (1, 2, 3, 4, 6, 8, 12, 16)}),
    "moe-vllm": Landscape("moe-vllm", "vllm-ascend, DeepSeek-V2-Lite (MoE) on 2 NPUs, tpot p90 <= 50 ms",
                          "vllm-ascend", "deepseek-v2-lite", 2, "uniform:64:2048", "uniform:16:256", 8192,
                          "tpot:p90=50ms", {**_VLLM, "max_num_seqs": (16, 64, 256), "enforce_eager": (False,),
                                            "max_num_batched_tokens": (1024, 4096, 16384),
                                            "multistream_overlap_shared_expert": (False, True),
                                            "tensor_parallel_size": (1, 2)}),
    "long-vllm": Landscape("long-vllm", "vllm-ascend, 7B on 32K-64K prompts, tpot p90 <= 100 ms, ttft p90 <= 20 s",
                           "vllm-ascend", "deepseek-r1-distill-qwen-7b", 1, "uniform:32768:64512", "uniform:512:1024",
                           65536, ("tpot:p90=100ms", "ttft:p90=20s"),
                           {**_VLLM, "max_num_seqs": (8, 16, 32, 64), "enable_chunked_prefill": (True,)}),
    "moe-long": Landscape("moe-long", "vllm-ascend, DeepSeek-V2-Lite (MoE) on 2 NPUs, 8K-32K prompts, "
                          "tpot p90 <= 50 ms, ttft p90 <= 10 s", "vllm-ascend", "deepseek-v2-lite", 2,
                          "uniform:8192:32768", "uniform:256:1024", 40960, ("tpot:p90=50ms", "ttft:p90=10s"),
                          {**_VLLM, "max_num_seqs": (16, 64, 256),
                           "max_num_batched_tokens": (512, 1024, 2048, 4096, 16384),
                           "enable_chunked_prefill": (True,), "enforce_eager": (False,),
                           "multistream_overlap_shared_expert": (False, True), "tensor_parallel_size": (1, 2)}),
    "moe-agent": Landscape("moe-agent", "vllm-ascend, DeepSeek-V2-Lite (MoE) on 2 NPUs, agent turns: 1K-8K prompts, "
                           "ttft p90 <= 300 ms, tpot p90 <= 30 ms", "vllm-ascend", "deepseek-v2-lite", 2,
                           "uniform:1024:8192", "uniform:64:512", 16384, ("ttft:p90=300ms", "tpot:p90=30ms"),
                           _MOE_TURNS),
    "moe-rag": Landscape("moe-rag", "vllm-ascend, DeepSeek-V2-Lite (MoE) on 2 NPUs, retrieval answers: 1K-8K prompts, "
                         "tpot p90 <= 30 ms", "vllm-ascend", "deepseek-v2-lite", 2, "uniform:1024:8192",
                         "uniform:64:512", 16384, "tpot:p90=30ms",
                         _MOE_TURNS),
}


def key(config: Mapping[str, Any]) -> tuple:
    """A configuration's cache key; floats to 9 decimals (0.8400000000000001 and 0.84 are one configuration)."""
    return tuple(sorted((name, round(value, 9) if isinstance(value, float) else value)
                        for name, value in config.items()))


# The code a table's outcomes come from (tune.simulator and what it runs), relative to the dsctl package; the searches'
# own code (core/tune/study.py, services/tune_search.py, screens.py) is left out so that a change to the search reads
# the same tables.
# (search.py's FAILURE_PATTERNS name the crash classes the truth records: clear the cache after changing them.)
TRUTH_CODE = ("core/perf", "core/load", "core/tune/capacity.py", "core/tune/rate_search.py", "core/tune/slo.py",
              "core/tune/quality.py", "core/tune/space.py", "services/tune.py", "services/tune_driver.py", "data")


def code_digest(landscape: Landscape) -> str:
    """A digest of what a landscape's outcomes depend on: `TRUTH_CODE`, the landscape's definition and the truth's
    hardware and divergence (not the rest of this file: how figures are taken from outcomes does not change them)."""
    package = Path(perfmodel.__file__).resolve().parents[2]
    digest = hashlib.sha256(repr((landscape, sorted(MODEL_ERROR.items()), DIVERGENCE_ERROR)).encode())
    for part in TRUTH_CODE:
        root = package / part
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                     and p.suffix in (".py", ".yaml", ".json"))
        for path in paths:
            digest.update(str(path.relative_to(package)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


class Truth:
    """A landscape's figure per configuration, evaluated once each, on the ground truth's hardware."""

    def __init__(self, landscape: Landscape, *, objective: str = "capacity", rate: float | None = None,
                 seed: int = 0, cache: Path | None = None):
        self.landscape = landscape
        self.inputs = landscape.inputs(objective=objective, rate=rate, seed=seed)
        self.slos, self.space, self.workload = tune.resolve(self.inputs)
        self._evaluate = tune.simulator(self.inputs, self.slos, self.space, self.workload)
        self.outcomes: dict[tuple, Outcome | None] = {}  # None: rejected by the quality guard, not simulated
        self.seconds = 0.0
        self.seed = seed
        self._other_seeds: dict[int, Truth] = {}
        self._top: tuple[int, float, float] = (0, 0.0, 0.0)  # (outcomes evaluated, best median, best mean): memo
        self.cache = cache
        # the digest of the code as this process loaded it: taken at save time, a file edited while a long run goes
        # on would label that run's outcomes with code that did not produce them
        self.digest = code_digest(landscape)
        self._cached = 0
        if cache is not None and self.cache_file().exists():
            loaded = pickle.loads(self.cache_file().read_bytes())  # noqa: S301 (our own file)
            self.outcomes.update({key(dict(k)): outcome for k, outcome in loaded.items()})
            self._cached = len(self.outcomes)

    def cache_file(self) -> Path:
        assert self.cache is not None
        rate = "" if self.inputs.rate is None else f"-rate{self.inputs.rate:g}"
        name = f"{self.landscape.key}-{self.inputs.objective}{rate}-seed{self.seed}-{self.digest}"
        return self.cache / f"{name}.pkl"

    def save(self) -> None:
        """Write the evaluated configurations (this seed's and the other seeds') to the cache, when one is set."""
        if self.cache is None:
            return
        for other in self._other_seeds.values():
            other.save()
        if len(self.outcomes) != self._cached:
            self.cache.mkdir(parents=True, exist_ok=True)
            partial = self.cache_file().with_suffix(".part")
            partial.write_bytes(pickle.dumps(self.outcomes))
            partial.replace(self.cache_file())
            self._cached = len(self.outcomes)

    def candidate(self, config: Mapping[str, Any]) -> Candidate:
        return Candidate(-1, dict(config), self.space.params(config), self.space.fields(config),
                         bool(self.space.lossy))

    def table(self) -> list[dict[str, Any]]:
        """The enumeration: the landscape's grid values, the space's own choices for knobs the grid leaves out."""
        axes = {}
        for knob in self.space.knobs:
            if knob.name in self.landscape.grid:
                axes[knob.name] = self.landscape.grid[knob.name]
            elif knob.kind == "bool":
                axes[knob.name] = (False, True)
            elif knob.choices:
                axes[knob.name] = tuple(knob.choices)
            else:
                raise SystemExit(f"landscape {self.landscape.key}: no grid for knob {knob.name}")
        configs = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
        return [c for c in configs if not self.space.violations(c)]

    def agreement(self, config: Mapping[str, Any]) -> float:
        """The truth's output agreement with the baseline: the model's divergence x DIVERGENCE_ERROR."""
        modelled = tune.agreement(tune.engine_config_for(self.inputs, self.space, self.candidate(config)))
        return max(0.0, 1.0 - (1.0 - modelled) * DIVERGENCE_ERROR)

    def outcome(self, config: Mapping[str, Any]) -> Outcome | None:
        k = key(config)
        if k not in self.outcomes:
            candidate = self.candidate(config)
            agreement = self.agreement(config)
            if candidate.needs_quality and agreement < quality.DEFAULT_MIN_AGREEMENT:
                self.outcomes[k] = None
            else:
                began = time.process_time()
                outcome = self._evaluate(candidate)
                self.outcomes[k] = dataclasses.replace(outcome, agreement=agreement if candidate.needs_quality
                                                       else outcome.agreement)
                self.seconds += time.process_time() - began
        return self.outcomes[k]

    def failure(self, config: Mapping[str, Any]) -> str | None:
        """None when the configuration meets the SLO and the quality guard, else its class: crash, slo, quality."""
        outcome = self.outcome(config)
        if outcome is None or (outcome.agreement is not None and outcome.agreement < quality.DEFAULT_MIN_AGREEMENT):
            return "quality"
        if outcome.failure in CRASHES or (outcome.failure is not None and outcome.failure != Failure.SLO_MISS):
            return "crash"
        # judged as tune_search.Search judges a trial: the SLO statistics over a window the instance sustained (a rate
        # search where no rate held reports its closest probe, whose statistics can meet the SLO unsustained)
        if outcome.failure == Failure.SLO_MISS or outcome.metrics is None \
                or not capacity.judge_probe(self.slos, outcome.metrics).met:
            return "slo"
        return None

    def value(self, config: Mapping[str, Any]) -> float | None:
        """The figure of a configuration that meets the SLO and the quality guard, else None."""
        if self.failure(config) is not None:
            return None
        outcome = self.outcome(config)
        assert outcome is not None
        if outcome.objective is not None:
            return float(outcome.objective)
        if self.inputs.objective == "capacity":  # the highest rate that held, as tune_search.Search takes it
            return float(outcome.rate or 0.0)
        return float(outcome.metrics.get("request_goodput") or 0.0)  # type: ignore[union-attr]

    def evaluated(self) -> list[tuple]:
        return list(self.outcomes)

    def top_value(self) -> float:
        """The best seed-0 value evaluated so far."""
        return max((v for k in list(self.outcomes) if (v := self.value(dict(k))) is not None), default=0.0)

    def _stage_one_top(self) -> float:
        """The best FIGURE_SEEDS median evaluated so far: medians taken from the highest seed-0 value down, until the
        seed-0 values fall below FIGURE_CUT x the best median so far (recomputed only when more were evaluated: every
        figure asks).  Against the best median, not the best seed-0 value: a lucky seed-0 draw 50 % above its own
        median (long-fixed) would otherwise put the cut above configurations whose medians are the top."""
        if self._top[0] != len(self.outcomes):
            values = sorted(((v, k) for k in list(self.outcomes) if (v := self.value(dict(k))) is not None),
                            key=lambda pair: -pair[0])
            medians: list[tuple[float, tuple]] = []
            best = 0.0
            for value, k in values:
                if value < FIGURE_CUT * best:
                    break
                medians.append((self._median(dict(k)), k))
                best = max(best, medians[-1][0])
            top = 0.0  # the best TOP_SEEDS mean, from the highest median down until the medians leave its window
            for median, k in sorted(medians, key=lambda pair: -pair[0]):
                if median < (1 - TOP_SHARE) * top:
                    break
                top = max(top, self._mean(dict(k)))
            self._top = (len(self.outcomes), best, top)
        return self._top[1]

    def top_figure(self) -> float:
        """The best figure evaluated so far (the optimum's): the best TOP_SEEDS mean."""
        self._stage_one_top()
        return self._top[2]

    def _median(self, config: Mapping[str, Any]) -> float:
        return statistics.median(self.at_seed(seed, config) for seed in FIGURE_SEEDS)

    def _mean(self, config: Mapping[str, Any]) -> float:
        return statistics.mean(self.at_seed(seed, config) for seed in TOP_SEEDS)

    def at_seed(self, seed: int, config: Mapping[str, Any]) -> float:
        """The configuration's value measured with another workload seed (0 when it then misses or fails)."""
        if seed == self.seed:
            return self.value(config) or 0.0
        if seed not in self._other_seeds:
            self._other_seeds[seed] = Truth(self.landscape, objective=self.inputs.objective, rate=self.inputs.rate,
                                            seed=seed, cache=self.cache)
        return self._other_seeds[seed].value(config) or 0.0

    def figure(self, config: Mapping[str, Any]) -> float | None:
        """The configuration's figure (the docstring's "Figures robust to the workload's draw"): None when it fails
        at seed 0 (what a search saw); its seed-0 value when that is below FIGURE_CUT x the best median; the mean
        over TOP_SEEDS when its FIGURE_SEEDS median is within TOP_SHARE of the best such mean; else that median."""
        value = self.value(config)
        if value is None:
            return None
        if value < FIGURE_CUT * self._stage_one_top():
            return value
        median = self._median(config)
        return median if median < (1 - TOP_SHARE) * self.top_figure() else self._mean(config)

    def optimum(self) -> tuple[float, dict[str, Any] | None]:
        """The best figure over everything evaluated, and its configuration."""
        best, where = 0.0, None
        for k in list(self.outcomes):
            figure = self.figure(dict(k))
            if figure is not None and figure > best:
                best, where = figure, dict(k)
        return best, where

    def flatness(self, shares: Iterable[float] = (0.02, 0.05)) -> dict[float, int]:
        best, _ = self.optimum()
        figures = [f for k in list(self.outcomes) if (f := self.figure(dict(k))) is not None]
        return {share: sum(1 for f in figures if f >= best * (1 - share)) for share in shares}


def describe(truth: Truth, objective: str, rate: float | None) -> dict[str, Any]:
    """Enumerate the table and print the landscape's figures; returns them."""
    began = time.monotonic()
    for index, config in enumerate(truth.table(), 1):
        truth.outcome(config)
        if index % 25 == 0:
            truth.save()  # a table takes up to an hour: an interrupted run keeps what it evaluated
    classes = [truth.failure(dict(k)) for k in truth.outcomes]
    top, where = truth.optimum()
    flat = truth.flatness()
    feasible = classes.count(None)
    unit = "req/s sustained" if rate is None else f"good req/s at {rate:g} req/s"
    print(f"\n== {truth.landscape.key}: {truth.landscape.title}; space {truth.space.name} "
          f"({', '.join(k.name for k in truth.space.knobs)})")
    print(f"table: {len(truth.outcomes)} configurations in {time.monotonic() - began:.0f} s; "
          f"{feasible} meet the SLO and the quality guard, {classes.count('crash')} crash (start or load), "
          f"{classes.count('slo')} miss the SLO at every rate, {classes.count('quality')} fail the quality guard")
    if where is None:
        print("no configuration meets it")
        return {"optimum": 0.0}
    noise = [truth.at_seed(seed, where) for seed in TOP_SEEDS]
    spread = (max(noise) - min(noise)) / top * 100 if top else 0.0
    error = statistics.stdev(noise) / len(noise) ** 0.5 / top * 100 if top else 0.0
    print(f"optimum {top:.3g} {unit} (best seed-0 value {truth.top_value():.3g}): "
          f"{' '.join(f'{k}={v}' for k, v in sorted(where.items()))}")
    print(f"flatness: {flat[0.02]} configurations within 2 % of the optimum, {flat[0.05]} within 5 % "
          f"(of {feasible} feasible)")
    print(f"workload-seed noise: the optimum's configuration at seeds {', '.join(map(str, TOP_SEEDS))}: "
          f"{', '.join(f'{v:.3g}' for v in noise)} (spread {spread:.1f} % of its figure, their mean; "
          f"standard error of the mean {error:.1f} %)")
    return {"optimum": top, "config": where, "flat": flat, "noise": noise, "spread": spread, "error": error,
            "feasible": feasible}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", default=",".join(LANDSCAPES))
    parser.add_argument("--rate", type=float, default=None, help="goodput at this load instead of capacity")
    parser.add_argument("--cache", type=Path, default=None, help="keep the evaluated configurations here")
    args = parser.parse_args(argv)
    objective = "capacity" if args.rate is None else "goodput"
    print(f"ground truth hardware vs dsctl's profile: {', '.join(f'{k} x{v:g}' for k, v in MODEL_ERROR.items())}")
    for name in args.landscapes.split(","):
        truth = Truth(LANDSCAPES[name], objective=objective, rate=args.rate, cache=args.cache)
        describe(truth, objective, args.rate)
        truth.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
