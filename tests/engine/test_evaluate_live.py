"""The offline evaluator against the live engine measured by `dsctl probe`, at two configurations.

The engine runs at --time-scale 1 (modelled seconds are wall seconds); the probe sends the same workload and Poisson
schedule (same seed) at the evaluator's rate, so wall-clock numbers should equal the evaluator's virtual ones.
Noise: loopback HTTP, the engine's and the probe's event loops, and a shared 2-core machine (a few ms):
means and p90 agree within 25 % or 8 ms, throughput within 10 %.  Fixed batches make TTFT jumpy: a request that
arrives just after a stream formed its batch waits a whole batch, so a few ms of host delay move it.
"""

from __future__ import annotations

import pytest

from dsctl.core.load.arrivals import ArrivalSpec
from dsctl.core.load.workload import LengthSpec, Workload
from dsctl.core.perf.engine_config import CONTINUOUS, FIXED_BATCH, EngineConfig
from dsctl.core.perf.evaluate import evaluate
from dsctl.services.probe import ProbeConfig, probe
from dsctl.services.runtime import HttpProber

from .test_engine_server import MODEL, Engine

SCALE = 1.0
RATE = 2.0
REQUESTS = 40
PROMPTS, OUTPUTS = "uniform:64:512", "uniform:16:96"


def tolerance(config: EngineConfig, metric: str, statistic: str) -> float:
    """25 %, except a fixed-batch engine's TTFT tail: p90 of 40 requests is the 4th-slowest, and a request that
    misses a batch by a few ms of host delay waits a whole batch more, so that one statistic moves in whole
    batches (a fresh-clone CI run here measured 900 ms live against 1319 ms offline: -32 %). Means stay at 25 %."""
    if config.mode == FIXED_BATCH and metric == "ttft_ms" and statistic == "p90":
        return 0.40
    return 0.25


@pytest.mark.parametrize("flags,engine_config", [
    ((), EngineConfig(MODEL, mode=CONTINUOUS, max_model_len=4096)),
    (("--batch-size", "4", "--stream-num", "2"),
     EngineConfig(MODEL, mode=FIXED_BATCH, max_model_len=4096, batch_size=4, stream_num=2)),
], ids=["continuous", "fixed-batch-4x2"])
def test_evaluator_matches_a_live_engine_and_probe(tmp_path, flags, engine_config):
    workload = Workload(LengthSpec.parse(PROMPTS), LengthSpec.parse(OUTPUTS), seed=5)
    offline = evaluate(engine_config, workload, ArrivalSpec(rate=RATE), REQUESTS, seed=5)
    assert offline.ok
    started = Engine(tmp_path, MODEL, "--max-model-len", "4096", "--startup", "0", "--time-scale", str(SCALE),
                     "--disable-uvicorn-access-log", "--disable-log-stats", *flags,
                     unset=("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "PYTORCH_NPU_ALLOC_CONF")).wait_ready()
    try:
        config = ProbeConfig(url=f"http://127.0.0.1:{started.port}", model=MODEL, rate=RATE / SCALE,
                             requests=REQUESTS, prompt_tokens=PROMPTS, output_tokens=OUTPUTS, seed=5, timeout=120.0)
        outcome = probe(HttpProber(), config)
    finally:
        started.stop()
    live = outcome.data["metrics"]
    assert live["completed"] == REQUESTS
    for metric in ("ttft_ms", "tpot_ms", "e2el_ms"):
        for statistic in ("mean", "p90"):
            want = offline.metrics[metric][statistic] * SCALE
            got = live[metric][statistic]
            allowed = max(tolerance(engine_config, metric, statistic) * want, 8.0)
            assert abs(got - want) <= allowed, (metric, statistic, got, want)
    want = offline.metrics["output_throughput"] / SCALE
    assert abs(live["output_throughput"] - want) <= 0.1 * want, (live["output_throughput"], want)
