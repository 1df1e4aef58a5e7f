"""``python3 -m dsctl.engine serve``: the emulated vLLM-compatible serving engine (standard library only).

Flags mirror ``vllm serve`` (the model is a dsctl performance profile name,
not a checkpoint): ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--gpu-memory-utilization``,
``--[no-]enable-chunked-prefill``, ``--tensor-parallel-size``,
``--block-size``, ``--host``, ``--port``, ``--api-key`` (or VLLM_API_KEY),
``--served-model-name``, ``--disable-log-stats``,
``--disable-uvicorn-access-log``; the CANN 8.0 practice knobs
``--stream-num`` and ``--kv-sparse-threshold``; and the emulation's own
``--chip``, ``--time-scale``, ``--seed``, ``--jitter``, ``--startup``,
``--record``, ``--profile-json``.

Start-up, in the order vLLM does it: validate the configuration, bind the
port (not yet listening), "load the weights" (sleep ``startup x time-scale``),
check memory (an impossible configuration exits 1 here with vLLM's / torch_npu's
message, never having listened), log the KV capacity lines, then listen and
print uvicorn's lines.  /health answers 200 from then on.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from dsctl import __version__

logger = logging.getLogger("dsctl.engine")

ENGINE_VERSION = f"{__version__}+dsctl.emu"


def vllm_version() -> str:
    """What GET /version reports: the installed vllm distribution's version (the lab's stand-in vllm in a
    serving venv), else the emulated engine's own."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return ENGINE_VERSION
MEMORY_ENV = ("PYTORCH_NPU_ALLOC_CONF", "NPU_MEMORY_FRACTION", "TASK_QUEUE_ENABLE", "HCCL_BUFFSIZE",
              "HCCL_OP_EXPANSION_MODE", "CPU_AFFINITY_CONF", "OMP_NUM_THREADS", "LD_PRELOAD")
DEFAULT_VISIBLE_NPUS = 8  # an Atlas 800T A2 when ASCEND_RT_VISIBLE_DEVICES is unset
DEFAULT_CHIP = "910B3"


class StartupError(Exception):
    """The engine refuses to start; the message is printed as the real engine prints it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsctl engine", description="Emulated vLLM-compatible serving engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", prog="dsctl engine serve",
        help="Serve the OpenAI-compatible API from a modelled NPU engine.",
        description="Serve the OpenAI-compatible API (vLLM's) from a modelled Ascend NPU engine: a step "
                    "scheduler timed by dsctl's roofline model, synthetic text, no weights.")
    serve.add_argument("model_tag", nargs="?", help="Model profile (as `vllm serve <model>`), e.g. "
                                                     "deepseek-r1-distill-qwen-7b.")
    serve.add_argument("--model", help="Model profile name (same as the positional argument).")
    serve.add_argument("--served-model-name", nargs="+", help="Names the API answers to (default: the model).")
    serve.add_argument("--host", default=None, help="Bind address (default: all interfaces).")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="Require `Authorization: Bearer KEY` on /v1 "
                                                       "(default: $VLLM_API_KEY).")
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="Token budget per engine step (default 2048 with chunked prefill, else "
                            "max(max_model_len, 2048)).")
    serve.add_argument("--max-model-len", type=int, default=None, help="Default: the model's context length.")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--block-size", type=int, default=128)
    serve.add_argument("--stream-num", type=int, default=1,
                       help="Fixed-batch multi-stream execution: streams of max_num_seqs/N requests each.")
    serve.add_argument("--kv-sparse-threshold", type=float, default=0.0,
                       help="Drop KV pairs whose attention score is below this, in [0, 1).")
    serve.add_argument("--dtype", default="auto", help="Accepted for compatibility; the profile decides.")
    serve.add_argument("--quantization", "-q", default=None,
                       help="w8a8 (or ascend) = 1-byte weights; default 2-byte weights.")
    serve.add_argument("--trust-remote-code", action="store_true", help="Accepted for compatibility.")
    serve.add_argument("--enforce-eager", action="store_true", help="Accepted for compatibility.")
    serve.add_argument("--additional-config", default=None, help="JSON; logged, otherwise ignored.")
    serve.add_argument("--disable-log-stats", action="store_true")
    serve.add_argument("--disable-log-requests", action="store_true", help="Accepted for compatibility.")
    serve.add_argument("--disable-uvicorn-access-log", action="store_true")
    serve.add_argument("--chip", default=os.environ.get("DSCTL_ENGINE_CHIP", DEFAULT_CHIP),
                       help="Chip profile (default: $DSCTL_ENGINE_CHIP or 910B3).")
    serve.add_argument("--time-scale", type=float, default=1.0,
                       help="Wall seconds per modelled second (0.01 = 100x faster); every ratio is kept.")
    serve.add_argument("--seed", type=int, default=0, help="Seeds the synthetic text and the jitter.")
    serve.add_argument("--jitter", type=float, default=0.0,
                       help="Relative standard deviation of each step's duration (seeded).")
    serve.add_argument("--startup", type=float, default=None,
                       help="Modelled start-up seconds (default: weight loading + init from the profile).")
    serve.add_argument("--record", default=None,
                       help="Append one JSON line per finished request (wall-clock times) to this file.")
    serve.add_argument("--profile-json", default=None,
                       help="Performance profiles as JSON (profiles.yaml's structure) instead of the shipped ones.")
    return parser


def _visible_npus() -> tuple[int, str]:
    value = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if value is None or not value.strip():
        count = int(os.environ.get("DSCTL_ENGINE_NPUS", DEFAULT_VISIBLE_NPUS))
        return count, "unset"
    return len([part for part in value.split(",") if part.strip()]), value


def _fail(message: str) -> int:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    return 1


def _plan(args: argparse.Namespace, perfmodel: Any) -> dict[str, Any]:
    """Validate the configuration; everything the engine needs to start, or StartupError."""
    from dsctl.errors import DsctlError

    model_name = args.model or args.model_tag
    if not model_name:
        raise StartupError("error: a model profile is required (dsctl engine serve MODEL or --model MODEL)")
    if args.model and args.model_tag and args.model != args.model_tag:
        raise StartupError(f"ValueError: model given twice: {args.model_tag!r} and --model {args.model!r}")
    for name in ("max_num_seqs", "port", "block_size", "stream_num", "tensor_parallel_size"):
        if getattr(args, name) < (0 if name == "port" else 1):
            raise StartupError(f"ValueError: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.time_scale <= 0:
        raise StartupError(f"ValueError: --time-scale must be positive, got {args.time_scale}")
    if args.jitter < 0:
        raise StartupError(f"ValueError: --jitter must not be negative, got {args.jitter}")
    if args.stream_num > args.max_num_seqs:
        raise StartupError(f"ValueError: --stream-num ({args.stream_num}) cannot exceed --max-num-seqs "
                           f"({args.max_num_seqs}): each stream runs max_num_seqs/stream_num requests")
    visible, raw_visible = _visible_npus()
    if args.tensor_parallel_size > visible:
        raise StartupError(f"RuntimeError: please ensure that world_size ({args.tensor_parallel_size}) is less than "
                           f"than max local gpu count ({visible})")
    try:
        chip = perfmodel.chip_by_name(args.chip)
        model = perfmodel.model_by_name(model_name)
        keep = perfmodel.kv_keep_fraction(args.kv_sparse_threshold)
        efficiency = perfmodel.load_profiles()[2]
        weight_bytes = 1.0 if (args.quantization or "").lower() in ("w8a8", "ascend", "int8") else 2.0
        deployment = perfmodel.Deployment(chip=chip, model=model, chips=args.tensor_parallel_size,
                                          memory_utilization=args.gpu_memory_utilization,
                                          weight_bytes=weight_bytes, kv_keep_fraction=keep, efficiency=efficiency)
    except DsctlError as exc:
        raise StartupError(f"ValueError: {exc}") from None
    max_model_len = args.max_model_len or model.max_model_len
    if max_model_len > model.max_model_len and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise StartupError(
            f"ValueError: User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={model.max_model_len} or model_max_length=None in model's config.json). "
            f"To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_"
            f"MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position encoding (RoPE), "
            f"positions exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, "
            f"positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.")
    batched = args.max_num_batched_tokens
    if batched is None:
        batched = 2048 if args.enable_chunked_prefill else max(max_model_len, 2048)
    if not args.enable_chunked_prefill and batched < max_model_len:
        raise StartupError(
            f"ValueError: max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). This "
            f"effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
            f"sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    if batched < args.max_num_seqs:
        raise StartupError(
            f"ValueError: max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
            f"({args.max_num_seqs}).")
    modelled_startup = perfmodel.startup_seconds(deployment)
    startup = modelled_startup if args.startup is None else max(args.startup, 0.0)
    return {"model_name": model_name, "chip": chip, "model": model, "deployment": deployment, "keep": keep,
            "max_model_len": max_model_len, "batched": batched, "startup": startup,
            "modelled_startup": modelled_startup, "visible": visible, "raw_visible": raw_visible}


def _failure_delay(plan: dict[str, Any], exc: Any, perfmodel: Any) -> float:
    """How long into start-up the real engine dies: a weight OOM once HBM is full, the KV checks after loading."""
    d = plan["deployment"]
    if getattr(exc, "reason", "") == "weights":
        load_until_full = d.chip.hbm_gb * perfmodel.GB * d.chips / (d.efficiency.load_gbs * perfmodel.GB)
        full = plan["modelled_startup"]
        fraction = min(1.0, load_until_full / full) if full > 0 else 0.0
        return plan["startup"] * fraction
    return plan["startup"]


def _log_config(args: argparse.Namespace, plan: dict[str, Any]) -> None:
    defaults = vars(build_parser().parse_args(["serve"]))
    changed = {k: v for k, v in vars(args).items() if k not in ("command",) and v != defaults.get(k)}
    if changed.get("api_key"):
        changed["api_key"] = "***"
    logger.info("vLLM API server version %s (dsctl emulated engine; no weights, modelled timing)", ENGINE_VERSION)
    logger.info("non-default args: %s", changed)
    env = {name: os.environ[name] for name in MEMORY_ENV if name in os.environ}
    logger.info("ASCEND_RT_VISIBLE_DEVICES=%s (%d NPUs visible); memory environment: %s", plan["raw_visible"],
                plan["visible"], env or "{}")
    if args.additional_config:
        logger.info("additional_config: %s", args.additional_config)
    d = plan["deployment"]
    logger.info("Initializing a V1 LLM engine with config: model=%r, served_model_name=%s, chip=%s, "
                "tensor_parallel_size=%d, max_seq_len=%d, max_num_seqs=%d, max_num_batched_tokens=%d, "
                "enable_chunked_prefill=%s, gpu_memory_utilization=%s, block_size=%d, stream_num=%d, "
                "kv_sparse_threshold=%s (kv keep fraction %.3f), weight_bytes=%s", plan["model"].name,
                (args.served_model_name or [plan["model_name"]])[0], d.chip.name, d.chips, plan["max_model_len"],
                args.max_num_seqs, plan["batched"], args.enable_chunked_prefill, args.gpu_memory_utilization,
                args.block_size, args.stream_num, args.kv_sparse_threshold, plan["keep"], d.weight_bytes)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def serve(args: argparse.Namespace) -> int:
    from dsctl.engine import cann, profiles, server
    from dsctl.engine.metrics import EngineMetrics
    from dsctl.engine.text import divergence_probability

    server.configure_logging()
    try:
        perfmodel = profiles.import_perfmodel(args.profile_json)
    except (OSError, ValueError) as exc:
        return _fail(f"ValueError: cannot read performance profiles: {exc}")
    try:
        plan = _plan(args, perfmodel)
    except StartupError as exc:
        return _fail(str(exc))
    _log_config(args, plan)
    found = cann.resolve(os.environ)
    (logger.info if found.version else logger.warning)("%s", found.log_line())
    plan["cann"] = found
    host = args.host if args.host is not None else "0.0.0.0"
    try:
        sock = _bind(host, args.port)  # vLLM binds before building the engine, and listens only once it is up
    except OSError as exc:
        return _fail(f"OSError: [Errno {exc.errno}] {exc.strerror}")
    try:
        return _start(args, plan, perfmodel, sock, host, server, EngineMetrics, divergence_probability)
    finally:
        sock.close()


def _start(args: argparse.Namespace, plan: dict[str, Any], perfmodel: Any, sock: socket.socket, host: str,
           server: Any, metrics_cls: Any, divergence_probability: Any) -> int:
    from dsctl.core.perf.engine_sched import Scheduler

    d = plan["deployment"]
    scale = args.time_scale
    logger.info("Starting to load model %s...", plan["model"].name)
    began = time.monotonic()
    try:
        capacity = perfmodel.check_fits(d, plan["max_model_len"])
        failure = None
    except perfmodel.DoesNotFit as exc:
        capacity, failure = 0, exc
    if failure is not None:
        time.sleep(_failure_delay(plan, failure, perfmodel) * scale)
        logger.error("EngineCore failed to start.")
        return _fail(f"{failure}\nRuntimeError: Engine core initialization failed. See root cause above. "
                     f"Failed core proc(s): {{}}")
    load_s = (plan["startup"] - d.efficiency.init_s if args.startup is None else plan["startup"]) * scale
    time.sleep(max(load_s, 0.0))
    weights_gib = perfmodel.weights_bytes(d) / d.chips / perfmodel.GIB
    logger.info("Loading weights took %.2f seconds", max(load_s, 0.0))
    logger.info("Model loading took %.4f GiB and %.6f seconds", weights_gib, time.monotonic() - began)
    time.sleep(max(plan["startup"] * scale - (time.monotonic() - began), 0.0))
    blocks = capacity // args.block_size
    kv_tokens = blocks * args.block_size
    kv_gib = perfmodel.kv_budget_bytes_per_chip(d) / perfmodel.GIB
    logger.info("Available KV cache memory: %.2f GiB", kv_gib)
    logger.info("# GPU blocks: %d", blocks)
    logger.info("GPU KV cache size: %s tokens", f"{kv_tokens:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx", f"{plan['max_model_len']:,}",
                kv_tokens / plan["max_model_len"])
    logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds", time.monotonic() - began)
    scheduler = Scheduler(d, kv_capacity_tokens=kv_tokens, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=plan["batched"], enable_chunked_prefill=args.enable_chunked_prefill,
                          stream_num=args.stream_num, block_size=args.block_size, jitter=args.jitter, seed=args.seed)
    served = args.served_model_name or [plan["model_name"]]
    config = server.ServerConfig(
        served_model_names=served, model_root=plan["model_name"], max_model_len=plan["max_model_len"],
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None, time_scale=scale, seed=args.seed,
        divergence=divergence_probability(plan["keep"]), record=args.record,
        access_log=not args.disable_uvicorn_access_log,
        log_stats_interval=0.0 if args.disable_log_stats else float(os.environ.get("VLLM_LOG_STATS_INTERVAL", 10)),
        version=vllm_version(), cann=plan["cann"].version, cann_toolkit=plan["cann"].toolkit)
    metrics = metrics_cls(served[0], plan["max_model_len"], {
        "block_size": str(args.block_size), "cache_dtype": "auto",
        "gpu_memory_utilization": str(args.gpu_memory_utilization), "num_gpu_blocks": str(blocks),
        "num_cpu_blocks": "0", "enable_prefix_caching": "False", "stream_num": str(args.stream_num),
        "kv_sparse_threshold": str(args.kv_sparse_threshold)})
    url = f"http://{host}:{args.port}"
    logger.info("Starting vLLM API server 0 on %s", url)
    for path, methods in server.ROUTES.items():
        logger.info("Route: %s, Methods: %s", path, ", ".join(methods))
    return asyncio.run(_run(server, scheduler, config, metrics, sock, host, args.port, url))


async def _run(server: Any, scheduler: Any, config: Any, metrics: Any, sock: socket.socket, host: str, port: int,
               url: str) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    engine = server.Engine(scheduler, config, metrics)
    http = server.HttpServer(engine, config)
    pid = os.getpid()

    def ready() -> None:
        out = sys.stdout
        out.write(f"INFO:     Started server process [{pid}]\n")
        out.write("INFO:     Waiting for application startup.\n")
        out.write("INFO:     Application startup complete.\n")
        out.write(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)\n")
        out.flush()

    await server.serve(engine, http, sock, host, port, stop, ready)
    sys.stdout.write("INFO:     Shutting down\nINFO:     Waiting for application shutdown.\n"
                     f"INFO:     Application shutdown complete.\nINFO:     Finished server process [{pid}]\n")
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())

