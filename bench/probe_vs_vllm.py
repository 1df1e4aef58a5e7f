"""`dsctl probe` against `vllm bench serve` on real vLLM (the CPU build of 0.32.0, the lab's tiny model).

Starts one `vllm serve` of the tiny model on 127.0.0.1 (eager mode), then at each load (an open loop of Poisson
arrivals at ``--rates``) runs both load generators in turn, dsctl probe first then vllm bench serve, ``--rounds``
times (after an untimed warm-up, each round in the other order: a drift of the machine shows as a spread, not as a
difference between the tools), with the same
workload: ``--requests`` requests of ``--prompt-tokens`` prompt and ``--output-tokens`` output tokens, EOS ignored.
Around every run it reads vLLM's own /metrics, so each row has a third column: the server's histograms over exactly
that run (mean TTFT from vllm:time_to_first_token_seconds, mean TPOT from
vllm:request_time_per_output_token_seconds; histograms give means, not p99) and its token counters.

Printed per load: mean and p99 TTFT and TPOT (ms) for each tool (the mean over rounds, and the spread), the server's
means, and the token counts: each tool's input and output totals against the server's counters (they must agree
exactly: a probe that sends other lengths than it reports, or counts what the server did not, fails here).

vllm bench serve's random dataset draws token ids with the model's tokenizer; dsctl probe sends words and fits them
to the server's tokens through /tokenize (no --tokenizer given), which is what a user without the checkpoint's
tokenizer at hand gets.  Both run on the same two cores as the server: the client's own work shows in both.

Usage: .venv/bin/python bench/probe_vs_vllm.py [--rates 2,8] [--requests 100] [--rounds 2]
Needs real vLLM where `python -m dsctl.lab.real_vllm` puts it (.ci/setup does).  About 4 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dsctl.lab import real_vllm

SERVED = real_vllm.SERVED_NAME
SETTLE_S = 8.0  # between runs: the machine's two cores back to the server alone


def scrape(url: str) -> dict[str, float]:
    """The server's sums and counts that the comparison uses."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    out: dict[str, float] = {}
    for family, key in (("vllm:prompt_tokens", "prompt_tokens"), ("vllm:generation_tokens", "generation_tokens"),
                        ("vllm:request_success", "requests")):
        out[key] = sum(s.value for s in families[family].samples if s.name.endswith("_total"))
    for family, key in (("vllm:time_to_first_token_seconds", "ttft"),
                        ("vllm:request_time_per_output_token_seconds", "tpot")):
        out[f"{key}_sum"] = sum(s.value for s in families[family].samples if s.name.endswith("_sum"))
        out[f"{key}_count"] = sum(s.value for s in families[family].samples if s.name.endswith("_count"))
    return out


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    delta = {k: after[k] - before[k] for k in after}

    def mean_ms(key: str) -> float | None:
        return delta[f"{key}_sum"] / delta[f"{key}_count"] * 1e3 if delta[f"{key}_count"] else None

    return {"ttft_mean": mean_ms("ttft"), "tpot_mean": mean_ms("tpot"), "input": delta["prompt_tokens"],
            "output": delta["generation_tokens"], "requests": delta["requests"]}


def run_probe(url: str, rate: float, args: argparse.Namespace, seed: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "dsctl", "probe", url, "--json", "--rate", str(rate),
                           "--requests", str(args.requests), "--warmup", "0", "--prompt-tokens",
                           str(args.prompt_tokens), "--output-tokens", str(args.output_tokens), "--seed", str(seed),
                           "--percentiles", "50,99"], capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode not in (0, 6):
        raise SystemExit(f"dsctl probe exited {done.returncode}: {done.stderr[-2000:]}")
    data = json.loads(done.stdout)["data"]
    m = data["metrics"]
    return {"ttft_mean": m["ttft_ms"]["mean"], "ttft_p99": m["ttft_ms"]["p99"], "tpot_mean": m["tpot_ms"]["mean"],
            "tpot_p99": m["tpot_ms"]["p99"], "input": m["total_input_tokens"], "output": m["total_output_tokens"],
            "requests": m["completed"], "failed": m["failed"], "limited_by": data["limited_by"],
            "prompt_scale": data["prompt_lengths"].get("scale")}


def run_bench(url: str, rate: float, args: argparse.Namespace, seed: int, directory: Path) -> dict:
    result = directory / f"bench-{rate:g}-{seed}.json"
    port = url.rsplit(":", 1)[1]
    done = subprocess.run(
        [str(real_vllm.DEFAULT_VENV / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1",
         "--port", port, "--model", str(real_vllm.DEFAULT_MODEL), "--served-model-name", SERVED,
         "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens), "--random-output-len",
         str(args.output_tokens), "--random-range-ratio", "0", "--num-prompts", str(args.requests),
         "--request-rate", str(rate), "--ignore-eos", "--seed", str(seed), "--num-warmups", "0",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
         "--save-result", "--result-dir", str(directory), "--result-filename", result.name],
        capture_output=True, text=True, timeout=1800, env=real_vllm.environment(), check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve exited {done.returncode}: {done.stderr[-2000:]}")
    r = json.loads(result.read_text())
    return {"ttft_mean": r["mean_ttft_ms"], "ttft_p99": r["p99_ttft_ms"], "tpot_mean": r["mean_tpot_ms"],
            "tpot_p99": r["p99_tpot_ms"], "input": r["total_input_tokens"], "output": r["total_output_tokens"],
            "requests": r["completed"], "failed": r.get("failed", 0)}


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:8.2f}"
    return f"{statistics.fmean(values):8.2f} ±{(max(values) - min(values)) / 2:5.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2,8", help="request rates (req/s), comma-separated")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    if not real_vllm.model_complete(real_vllm.DEFAULT_MODEL):
        raise SystemExit("no real vLLM: run python -m dsctl.lab.real_vllm (or .ci/setup)")

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        server = real_vllm.Server(["--enforce-eager"], directory / "serve.log")
        try:
            started = time.monotonic()
            server.wait_healthy()
            print(f"real vLLM {real_vllm.ALIAS_VERSION} serving the tiny model after "
                  f"{time.monotonic() - started:.0f} s; "
                  f"{args.requests} requests of {args.prompt_tokens} + {args.output_tokens} tokens per run, "
                  f"{args.rounds} rounds per tool and load\n")
            # a served-cold engine's first requests are slow (lazy paths, allocator growth): warm it first, untimed,
            # and alternate which tool goes first in each round (ABBA), so neither always meets the state the other
            # left behind
            run_probe(server.url, rates[0], argparse.Namespace(**{**vars(args), "requests": 30}), 99)
            for rate in rates:
                runs: dict[str, list[dict]] = {"dsctl probe": [], "vllm bench serve": []}
                servers: dict[str, list[dict]] = {"dsctl probe": [], "vllm bench serve": []}
                for round_ in range(args.rounds):
                    for tool in (list(runs) if round_ % 2 == 0 else list(reversed(runs))):
                        # vllm bench serve's process takes a few seconds of CPU to exit (torch); measured with no
                        # pause, the probe that followed it read 16 ms more TTFT than the server saw
                        time.sleep(SETTLE_S)
                        before = scrape(server.url)
                        seed = 100 + round_
                        runs[tool].append(run_probe(server.url, rate, args, seed) if tool == "dsctl probe" else
                                          run_bench(server.url, rate, args, seed, directory))
                        servers[tool].append(server_view(before, scrape(server.url)))
                print(f"== Poisson arrivals at {rate:g} req/s")
                print(f"{'':22}{'dsctl probe':>18}{'vllm bench serve':>20}{'server (probe runs)':>22}"
                      f"{'server (bench runs)':>22}")
                for key, label in (("ttft_mean", "TTFT mean (ms)"), ("ttft_p99", "TTFT p99 (ms)"),
                                   ("tpot_mean", "TPOT mean (ms)"), ("tpot_p99", "TPOT p99 (ms)")):
                    row = f"{label:22}"
                    for tool in runs:
                        row += f"{spread([r[key] for r in runs[tool]]):>18}  "
                    for tool in servers:
                        values = [s.get(key) for s in servers[tool]]
                        row += f"{spread(values) if None not in values else '-':>20}  "
                    print(row)
                for tool in runs:
                    for k, (r, s) in enumerate(zip(runs[tool], servers[tool], strict=True)):
                        exact = (r["input"], r["output"], r["requests"]) == (s["input"], s["output"], s["requests"])
                        extra = ""
                        if tool == "dsctl probe":
                            extra = f"  prompt scale {r['prompt_scale']}  limited by {r['limited_by']}"
                        print(f"  {tool:17} round {k + 1}: tokens in {r['input']:>7} out {r['output']:>6} "
                              f"requests {r['requests']:>4} (failed {r['failed']}); server counted in "
                              f"{s['input']:>7.0f} out {s['output']:>6.0f} requests {s['requests']:>4.0f}: "
                              f"{'exact' if exact else 'DIFFERENT'}{extra}")
                print()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
