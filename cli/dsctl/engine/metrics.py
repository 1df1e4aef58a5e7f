"""Prometheus text exposition with vLLM V1's metric names, labels and buckets (standard library only).

Names, help texts and buckets follow vllm-project/vllm ``vllm/v1/metrics/loggers.py``
(PrometheusStatLogger): labels ``model_name`` and ``engine``.  The text is what prometheus_client's
``generate_latest`` writes: a counter's family and samples are ``<name>_total``; ``_created`` samples
(counters and histograms) form a gauge family of their own after the metric.
Both the current names (``vllm:kv_cache_usage_perc``,
``vllm:inter_token_latency_seconds``) and the older ones still served
(``vllm:gpu_cache_usage_perc``, ``vllm:time_per_output_token_seconds``) are
exported.  Times are wall-clock seconds as the engine observed them (with
``--time-scale`` they shrink by that factor, like every other time).
"""

from __future__ import annotations

import bisect
import time

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _labels(pairs: list[tuple[str, str]]) -> str:
    escaped = (k + '="' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
               for k, v in pairs)
    return "{" + ",".join(escaped) + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, documentation: str):
        self.name = name
        self.documentation = documentation
        self.created = time.time()

    def header(self, name: str | None = None) -> list[str]:
        name = name or self.name
        return [f"# HELP {name} {self.documentation}", f"# TYPE {name} {self.kind}"]

    def created_family(self, series: list[list[tuple[str, str]]]) -> list[str]:
        """prometheus_client writes ``_created`` samples as a gauge family of their own, after the metric."""
        name = f"{self.name}_created"
        return [f"# HELP {name} {self.documentation}", f"# TYPE {name} gauge"] + [
            f"{name}{_labels(labels)} {_num(self.created)}" for labels in series]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, documentation: str):
        super().__init__(name, documentation)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def render(self, labels: list[tuple[str, str]]) -> list[str]:
        return [*self.header(), f"{self.name}{_labels(labels)} {_num(self.value)}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, documentation: str, extra_label: str | None = None,
                 extra_values: tuple[str, ...] = ()):
        super().__init__(name, documentation)
        self.extra_label = extra_label
        self.values = {v: 0.0 for v in extra_values} if extra_label else {"": 0.0}

    def inc(self, amount: float = 1.0, extra: str = "") -> None:
        self.values[extra] = self.values.get(extra, 0.0) + amount

    def total(self) -> float:
        return sum(self.values.values())

    def render(self, labels: list[tuple[str, str]]) -> list[str]:
        # prometheus_client's text format: the family (HELP/TYPE) is named <name>_total like its samples
        lines = self.header(f"{self.name}_total")
        series = [labels + ([(self.extra_label, extra)] if self.extra_label else []) for extra in self.values]
        for full, value in zip(series, self.values.values(), strict=True):
            lines.append(f"{self.name}_total{_labels(full)} {_num(value)}")
        return lines + self.created_family(series)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, buckets: list[float]):
        super().__init__(name, documentation)
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: list[tuple[str, str]]) -> list[str]:
        lines = self.header()
        cumulative = 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            cumulative += count
            lines.append(f"{self.name}_bucket{_labels([*labels, ('le', _num(bound))])} {_num(cumulative)}")
        lines.append(f"{self.name}_count{_labels(labels)} {_num(self.count)}")
        lines.append(f"{self.name}_sum{_labels(labels)} {_num(self.sum)}")
        return lines + self.created_family([labels])


class EngineMetrics:
    """The engine's metric set, one engine (index 0), one served model name."""

    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, str] | None = None):
        self.labels = [("model_name", model_name), ("engine", "0")]
        self.cache_info = cache_info or {}
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.gpu_cache_usage = Gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.")
        self.kv_cache_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                       "finished_reason", FINISH_REASONS)
        self.request_prompt_tokens = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = Histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
        self.max_tokens_param = Histogram("vllm:request_params_max_tokens",
                                          "Histogram of the max_tokens request parameter.", token_buckets)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            ITL_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = Histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)

    def observe_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.tpot.observe(seconds)

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.running, self.waiting, self.gpu_cache_usage, self.kv_cache_usage, self.preemptions,
                       self.prompt_tokens, self.generation_tokens, self.request_success, self.request_prompt_tokens,
                       self.request_generation_tokens, self.iteration_tokens, self.max_tokens_param, self.ttft,
                       self.tpot, self.itl, self.e2e, self.queue_time, self.inference_time, self.prefill_time,
                       self.decode_time):
            lines.extend(metric.render(self.labels))
        if self.cache_info:
            lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                      "# TYPE vllm:cache_config_info gauge",
                      f"vllm:cache_config_info{_labels([*self.cache_info.items(), ('engine', '0')])} 1.0"]
        return "\n".join(lines) + "\n"
