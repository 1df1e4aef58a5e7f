"""The landscape a tuner faces on the emulated 910B stack (issue 9's acceptance), from the offline evaluator.

One model and workload (DeepSeek-R1-Distill-Qwen-7B on one 910B3; prompts uniform 64-1024 tokens, outputs
uniform 16-192, max_model_len 4096; ``--requests`` Poisson requests per run, seed 0), two engines:

* the fixed-batch engine of CANN 8.0 sites (``--batch-size B --stream-num S --kv-sparse-threshold T``):
  B x S x T;
* vllm-ascend (continuous batching): max-num-seqs x max-num-batched-tokens x gpu-memory-utilization x chunked
  prefill.

Both run with the vendor's allocator default (PYTORCH_NPU_ALLOC_CONF unset: a fragmenting allocator), as on a
host dsctl has not provisioned (dsctl's env sets expandable_segments:True; ``--expandable`` runs that instead).
For each engine it prints how many configurations fail to start (with the engine's reason), how many fail
under load (aclrtMalloc), and for each SLO/load target how many meet it and the best one (highest goodput; the
output must agree with the unsparsified model on >= 90 % of tokens). Target A is the acceptance's
"ttft p99 <= 200 ms at 4 req/s"; B and C are a streaming-chat and an offline-batch target.

Results (this machine, defaults): fixed-batch 224 configurations, 25 fail to start (torch_npu OOM reserving
S x B full-length KV slots), 0 fail under load; A: 0 meet it (a request waits for a batch to drain);
B: 61, best B=64 S=1 t=0.15; C: 81, best B=8 S=1 t=0.15.  vllm-ascend 504 configurations, 204 fail to start
(144 vLLM token-budget rules, 60 "No available memory for the cache blocks"), 0 fail under load; A: 250 meet it,
best max_num_seqs=16 max_num_batched_tokens=512 (3.61 good req/s, ttft p99 149 ms); B: best 32 / 2048; C: best
8 / 512.  With --prompts uniform:4096:12288 --max-model-len 16384 --requests 40, 49 fixed-batch and 18
vllm-ascend configurations fail under load with aclrtMalloc (the fragmenting allocator; 0.98 utilisation).

Usage: .venv/bin/python bench/landscape.py [--requests 100] [--prompts SPEC] [--max-model-len N] [--expandable]
About 7 minutes on the shared 2-core machine (each evaluation takes 0.05-0.5 s).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import sys
import time

from dsctl.core.load.workload import LengthSpec, Workload
from dsctl.core.perf.engine_config import CONTINUOUS, FIXED_BATCH, EngineConfig
from dsctl.core.perf.evaluate import FAILED_TO_START, FAILED_UNDER_LOAD, Evaluation, Target, best, run_target

MODEL = "deepseek-r1-distill-qwen-7b"
TARGETS = (
    Target("A: ttft p99 <= 200 ms at 4 req/s", 4.0, {"ttft": 200.0}),
    Target("B: tpot p99 <= 40 ms at 8 req/s", 8.0, {"tpot": 40.0}),
    Target("C: e2el p99 <= 20 s at 1 req/s", 1.0, {"e2el": 20000.0}),
)
FIXED_GRID = {"batch_size": (1, 2, 4, 8, 16, 32, 64, 128), "stream_num": (1, 2, 4, 8),
              "kv_sparse_threshold": (0.0, 0.05, 0.1, 0.15, 0.3, 0.5, 0.9)}
VLLM_GRID = {"max_num_seqs": (8, 16, 32, 64, 128, 256),
             "max_num_batched_tokens": (256, 512, 1024, 2048, 4096, 8192, 16384),
             "gpu_memory_utilization": (0.25, 0.5, 0.7, 0.9, 0.95, 0.98),
             "enable_chunked_prefill": (True, False)}


PROMPTS = "uniform:64:1024"
MAX_MODEL_LEN = 4096


def workload(prompts: str = PROMPTS) -> Workload:
    return Workload(LengthSpec.parse(prompts), LengthSpec.parse("uniform:16:192"), seed=0)


def configs(base: EngineConfig, grid: dict[str, tuple]) -> list[EngineConfig]:
    names = list(grid)
    return [base.with_(**dict(zip(names, values, strict=True))) for values in itertools.product(*grid.values())]


def knobs(config: EngineConfig, grid: dict[str, tuple]) -> str:
    return " ".join(f"{name}={getattr(config, name)}" for name in grid)


def failure_class(message: str) -> str:
    """The failure's class: its last line up to the first number (the sizes differ per configuration)."""
    line = message.splitlines()[-1] if message else ""
    return re.split(r"\(?\d", line, maxsplit=1)[0].strip()[:100]


def landscape(title: str, base: EngineConfig, grid: dict[str, tuple], requests: int, prompts: str) -> None:
    began = time.monotonic()
    candidates = configs(base, grid)
    results: dict[str, list[Evaluation]] = {t.name: [] for t in TARGETS}
    start_failures: collections.Counter[str] = collections.Counter()
    load_failures: collections.Counter[str] = collections.Counter()
    for config in candidates:
        for index, target in enumerate(TARGETS):
            e = run_target(config, target, workload(prompts), requests)
            results[target.name].append(e)
            if e.status == FAILED_TO_START:
                start_failures[failure_class(e.message)] += 1
                for other in TARGETS[index + 1:]:
                    results[other.name].append(e)
                break
        under_load = [results[t.name][-1] for t in TARGETS if results[t.name][-1].status == FAILED_UNDER_LOAD]
        if under_load:
            load_failures[failure_class(under_load[0].message.splitlines()[-1])] += 1
    failed_start = sum(start_failures.values())
    failed_load = sum(load_failures.values())
    print(f"\n== {title}: {len(candidates)} configurations ({' x '.join(grid)}), {requests} requests per run, "
          f"{time.monotonic() - began:.0f} s")
    print(f"fail to start: {failed_start}")
    for reason, count in start_failures.most_common(4):
        print(f"    {count:4d}  {reason}")
    print(f"fail under load (at any of the targets' loads, {', '.join(f'{t.rate:g}' for t in TARGETS)} req/s): "
          f"{failed_load}")
    for reason, count in load_failures.most_common(2):
        print(f"    {count:4d}  {reason}")
    winners = []
    for target in TARGETS:
        evaluations = results[target.name]
        meeting = [e for e in evaluations if target.meets(e)]
        top = best(evaluations, target)
        winners.append(top)
        if top is None:
            print(f"{target.name}: 0 meet it")
            continue
        metric = next(iter(target.slo_ms))
        print(f"{target.name}: {len(meeting)} meet it; best goodput {top.metrics['request_goodput']:.2f} req/s: "
              f"{knobs(top.config, grid)} ({metric} p99 {top.value(metric):.0f} ms, "
              f"{top.metrics['output_throughput']:.0f} tok/s, agreement {top.agreement:.2f})")
    distinct = {knobs(w.config, grid) for w in winners if w is not None}
    print(f"distinct best configurations over the {len(TARGETS)} targets: {len(distinct)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--prompts", default=PROMPTS,
                        help="prompt lengths (N, uniform:LO:HI, normal:MEAN:STD); long ones (e.g. uniform:4096:12288 "
                             "with --max-model-len 16384) show the aclrtMalloc failures under load")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--expandable", action="store_true",
                        help="run with PYTORCH_NPU_ALLOC_CONF=expandable_segments:True (dsctl's provisioned env)")
    args = parser.parse_args(argv)
    alloc = "expandable_segments:True" if args.expandable else ""
    base = EngineConfig(MODEL, max_model_len=args.max_model_len, alloc_conf=alloc)
    print(f"{MODEL} on one 910B3, prompts {args.prompts}, outputs {workload().output_len}, "
          f"max_model_len {args.max_model_len}, PYTORCH_NPU_ALLOC_CONF={alloc or '(unset)'}")
    landscape("fixed-batch engine (CANN 8.0 practice)", base.with_(mode=FIXED_BATCH), FIXED_GRID, args.requests,
              args.prompts)
    landscape("vllm-ascend (continuous batching)", base.with_(mode=CONTINUOUS), VLLM_GRID, args.requests, args.prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
