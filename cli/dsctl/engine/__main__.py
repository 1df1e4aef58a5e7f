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
``--record``, ``--profile-json``.  Multi-node data parallel: ``--data-parallel-size-local``,
``--data-parallel-start-rank``, ``--data-parallel-address``, ``--data-parallel-rpc-port``,
``--headless``, ``--api-server-count`` (and the forms vLLM has but the emulation refuses as
not modelled: ``--data-parallel-rank``, ``--data-parallel-hybrid-lb``, ``--data-parallel-backend ray``).

Start-up, in the order vLLM does it: validate the configuration, bind the
port (not yet listening), "load the weights" (sleep ``startup x time-scale``),
check memory (an impossible configuration exits 1 here with vLLM's / torch_npu's
message, never having listened), log the KV capacity lines, then listen and
print uvicorn's lines.  /health answers 200 from then on.  An instance over
several nodes (dsctl.engine.cluster): the head binds its DP handshake address
before loading and, once loaded, waits for every remote rank's HELLO, HCCL link
and READY (HCCL_CONNECT_TIMEOUT) before it listens; a ``--headless`` node joins
it and serves no API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
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
    serve.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    # Multi-node data parallel (vLLM "Data Parallel Deployment"; names, short forms and types of vLLM's
    # arg_utils.py and cli_args.py; rules and failures: dsctl.engine.cluster).
    serve.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None,
                       help="Number of data parallel replicas to run on this node.")
    serve.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None,
                       help="Starting data parallel rank for secondary nodes.")
    serve.add_argument("--data-parallel-address", "-dpa", type=str, default=None,
                       help="Address of data parallel cluster head-node.")
    serve.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None,
                       help="Port for data parallel RPC communication.")
    serve.add_argument("--data-parallel-rank", "-dpn", type=int, default=None,
                       help="Data parallel rank of this instance. When set, enables external load balancer mode "
                            "(not modelled: refused).")
    serve.add_argument("--data-parallel-backend", "-dpb", type=str, default="mp",
                       help='Backend for data parallel, either "mp" or "ray" (only "mp" is modelled).')
    serve.add_argument("--data-parallel-hybrid-lb", action=argparse.BooleanOptionalAction, default=False,
                       help="Hybrid data-parallel load balancing (not modelled: refused).")
    serve.add_argument("--headless", action="store_true", default=False,
                       help="Run in headless mode. See multi-node data parallel documentation for more details.")
    serve.add_argument("--api-server-count", "-asc", type=int, default=1,
                       help="How many API server processes to run (the emulation serves from one).")
    serve.add_argument("--enable-expert-parallel", action="store_true")
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                       help="Reuse the KV blocks of prompt prefixes seen before (vLLM V1's prefix cache).")
    serve.add_argument("--block-size", type=int, default=128)
    serve.add_argument("--batch-size", type=int, default=None,
                       help="Fixed-batch engine (the CANN 8.0 practice): requests per stream; a stream admits a new "
                            "batch only when its batch has drained (default max_num_seqs / stream_num).")
    serve.add_argument("--stream-num", type=int, default=None,
                       help="Fixed-batch engine: streams, each running its own batch (host and device work of "
                            "different streams overlap). Either flag selects the fixed-batch engine; without "
                            "them the engine batches continuously, as vLLM V1 does.")
    serve.add_argument("--kv-sparse-threshold", type=float, default=0.0,
                       help="Drop KV pairs whose attention score is below this, in [0, 1).")
    serve.add_argument("--dtype", default="auto", help="Accepted for compatibility; the profile decides.")
    serve.add_argument("--quantization", "-q", default=None,
                       help="w8a8 (or ascend) = 1-byte weights; default 2-byte weights.")
    serve.add_argument("--trust-remote-code", action="store_true", help="Accepted for compatibility.")
    serve.add_argument("--enforce-eager", action="store_true",
                       help="No graph capture: slower steps, faster start, less reserved memory.")
    serve.add_argument("--additional-config", default=None,
                       help="JSON (vllm-ascend); pa_shape_list and multistream_overlap_shared_expert are modelled, "
                            "other keys logged.")
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


def _additional(args: argparse.Namespace) -> dict[str, Any]:
    if not args.additional_config:
        return {}
    try:
        value = json.loads(args.additional_config)
    except ValueError as exc:
        raise StartupError(f"argument --additional-config: Value {args.additional_config} cannot be converted to "
                           f"<function loads>: {exc}") from None
    if not isinstance(value, dict):
        raise StartupError("ValueError: --additional-config must be a JSON object")
    return value


def _check_record(path: str) -> None:
    """Refuse a --record file the server could not open, before serving instead of as a traceback."""
    target = Path(path)
    if target.is_dir():
        raise StartupError(f"ValueError: --record {path} is a directory; give a file to append to")
    parent = target.parent
    if not parent.is_dir():
        raise StartupError(f"ValueError: --record {path}: directory {parent} does not exist; create it or "
                           f"give another path")
    if not os.access(target if target.exists() else parent, os.W_OK):
        raise StartupError(f"ValueError: --record {path} is not writable; give a path you can write")


def _plan(args: argparse.Namespace, perfmodel: Any) -> dict[str, Any]:
    """Validate the configuration; everything the engine needs to start, or StartupError."""
    from dsctl.core.perf import engine_config
    from dsctl.engine import cluster

    model_name = args.model or args.model_tag
    if not model_name:
        raise StartupError("error: a model profile is required (dsctl engine serve MODEL or --model MODEL)")
    if args.model and args.model_tag and args.model != args.model_tag:
        raise StartupError(f"ValueError: model given twice: {args.model_tag!r} and --model {args.model!r}")
    # --max-model-len 0 would otherwise fall back to the model's length (``or``) and start silently.
    for name in ("max_num_seqs", "block_size", "stream_num", "batch_size", "tensor_parallel_size",
                 "data_parallel_size", "max_model_len", "max_num_batched_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise StartupError(f"ValueError: --{name.replace('_', '-')} must be positive, got {value}")
    # 0 stays allowed: the OS picks a free port, as with vLLM. Above 65535 bind() raises OverflowError.
    if not 0 <= args.port <= 65535:
        raise StartupError(f"ValueError: --port must be 0..65535, got {args.port}")
    if args.record is not None:
        _check_record(args.record)
    if args.time_scale <= 0:
        raise StartupError(f"ValueError: --time-scale must be positive, got {args.time_scale}")
    if args.jitter < 0:
        raise StartupError(f"ValueError: --jitter must not be negative, got {args.jitter}")
    extra = _additional(args)
    pa_shapes = extra.get("pa_shape_list") or []
    if not isinstance(pa_shapes, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in pa_shapes):
        raise StartupError("ValueError: additional_config pa_shape_list must be a list of integers")
    fixed = args.stream_num is not None or args.batch_size is not None
    visible, raw_visible = _visible_npus()
    try:
        layout = cluster.layout(args, cluster.visible_devices(os.environ, visible))
    except cluster.LayoutError as exc:
        raise StartupError(str(exc)) from None
    # Over several hosts the config is the whole instance's (its DP ranks step together), so the cross-host cost
    # enters the step times: EngineConfig.nodes, when the perf model has it.
    spans = {"nodes": layout.nodes} if layout is not None and "nodes" in _config_fields(engine_config) else {}
    config = engine_config.EngineConfig(
        **spans,
        model=model_name, chip=args.chip, mode=engine_config.FIXED_BATCH if fixed else engine_config.CONTINUOUS,
        tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_chunked_prefill=args.enable_chunked_prefill,
        block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager, pa_shape_list=tuple(pa_shapes),
        multistream_overlap_shared_expert=bool(extra.get("multistream_overlap_shared_expert", False)),
        batch_size=args.batch_size, stream_num=args.stream_num or 1, kv_sparse_threshold=args.kv_sparse_threshold,
        weight_bytes=1.0 if (args.quantization or "").lower() in ("w8a8", "ascend", "int8") else 2.0,
        alloc_conf=os.environ.get("PYTORCH_NPU_ALLOC_CONF", ""), visible_npus=visible)
    if config.mode == engine_config.FIXED_BATCH and args.batch_size is not None and \
            args.batch_size * config.stream_num > args.max_num_seqs:
        raise StartupError(f"ValueError: --batch-size ({args.batch_size}) x --stream-num ({config.stream_num}) cannot "
                           f"exceed --max-num-seqs ({args.max_num_seqs})")
    model = None
    try:
        model = perfmodel.model_by_name(model_name)
    except Exception:  # noqa: BLE001 - plan() reports it in the engine's words
        pass
    if model is not None:
        max_model_len = args.max_model_len or model.max_model_len
        if max_model_len > model.max_model_len and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
            # vLLM 0.32's words and layout (ModelConfig is a pydantic dataclass: its ValidationError, the
            # reason indented under it, the help link), as tests/realvllm saw them from the real engine
            raise StartupError(
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                f"  Value error, User-specified max_model_len ({max_model_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={float(model.max_model_len)} or model_max_length=None in "
                "model's config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If "
                "the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len lead to "
                "nan. If the model uses absolute position encoding, positions exceeding derived_max_model_len will "
                "cause a CUDA array out-of-bounds error. [type=value_error, input_value=ArgsKwargs((), {'model': "
                f"{model_name!r}, ...}}), input_type=ArgsKwargs]\n"
                "    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
    try:
        started = engine_config.plan(config, perfmodel)
        failure = None
    except engine_config.StartupFailure as exc:
        if exc.reason in ("config", "parallel"):
            raise StartupError(exc.message) from None
        started, failure = None, exc
    if started is None:  # memory: the engine gets as far as loading before it fails
        chip = perfmodel.chip_by_name(args.chip)
        d = perfmodel.Deployment(chip=chip, model=model, chips=args.tensor_parallel_size,
                                 memory_utilization=args.gpu_memory_utilization, weight_bytes=config.weight_bytes,
                                 kv_keep_fraction=perfmodel.kv_keep_fraction(args.kv_sparse_threshold),
                                 efficiency=perfmodel.load_profiles()[2])
        keep, max_model_len, batched = d.kv_keep_fraction, args.max_model_len or model.max_model_len, 0
        modelled_startup = perfmodel.startup_seconds(d, args.enforce_eager)
    else:
        d, keep, max_model_len, batched = started.deployment, started.keep, started.max_model_len, started.batched
        modelled_startup = started.startup_s
    startup = modelled_startup if args.startup is None else max(args.startup, 0.0)
    return {"model_name": model_name, "chip": d.chip, "model": d.model, "deployment": d, "keep": keep,
            "max_model_len": max_model_len, "batched": batched, "startup": startup,
            "modelled_startup": modelled_startup, "visible": visible, "raw_visible": raw_visible,
            "config": config, "started": started, "failure": failure, "layout": layout}


def _config_fields(engine_config: Any) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(engine_config.EngineConfig)}


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
                "enable_chunked_prefill=%s, gpu_memory_utilization=%s, block_size=%d, scheduling=%s, batch_size=%s, "
                "stream_num=%d, kv_sparse_threshold=%s (kv keep fraction %.3f), weight_bytes=%s", plan["model"].name,
                (args.served_model_name or [plan["model_name"]])[0], d.chip.name, d.chips, plan["max_model_len"],
                args.max_num_seqs, plan["batched"], args.enable_chunked_prefill, args.gpu_memory_utilization,
                args.block_size, plan["config"].mode,
                plan["started"].batch_size if plan["started"] is not None else args.batch_size,
                plan["config"].stream_num, args.kv_sparse_threshold, plan["keep"], d.weight_bytes)


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
    from dsctl.engine import cann, cluster, profiles, server
    from dsctl.engine.metrics import EngineMetrics

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
    cann.load_runtime(found)
    layout = plan["layout"]
    node = None
    if layout is not None:
        node = _cluster_node(args, layout, found.version, cluster)
        if isinstance(node, cluster.Worker):
            return _serve_headless(args, plan, perfmodel, node)
    host = args.host if args.host is not None else "0.0.0.0"
    try:
        sock = _bind(host, args.port)  # vLLM binds before building the engine, and listens only once it is up
    except OSError as exc:
        return _fail(f"OSError: [Errno {exc.errno}] {exc.strerror}")
    status = 1
    try:
        if node is not None:
            try:
                node.open()  # the DP handshake address, bound before the engines start (vLLM launch_core_engines)
            except cluster.ClusterError as exc:
                return _fail(str(exc))
        status = _start(args, plan, perfmodel, sock, host, server, EngineMetrics, node)
        return status
    finally:
        if node is not None:
            node.close(graceful=status == 0)
        sock.close()


def _cluster_node(args: argparse.Namespace, layout: Any, cann_version: str | None, cluster: Any) -> Any:
    """This node's part of a multi-node instance: the head's coordinator (cluster.Head) or a headless
    cluster.Worker, with HCCL's timeouts and the NPUs' RoCE addresses."""
    timeouts, warnings = cluster.timeouts(os.environ, layout.tp, cann_version)
    for warning in warnings:
        logger.warning("%s", warning)
    ips, problems = cluster.device_ips(layout.devices, os.environ)
    ranks = layout.ranks
    logger.info("Data parallel: %d ranks over %d nodes (TP %d, %s), this node DP rank(s) %d-%d (HCCL ranks %d-%d) "
                "on NPU(s) %s, handshake at %s", layout.dp_size, layout.nodes, layout.tp,
                "expert parallel" if layout.expert_parallel else "no expert parallel", layout.dp_ranks[0],
                layout.dp_ranks[-1], ranks[0], ranks[-1], ",".join(map(str, layout.devices)), layout.handshake_address)
    logger.info("HCCL: RoCE addresses %s; HCCL_CONNECT_TIMEOUT %d s; a step missing a rank fails after %s",
                {device: ips.get(device, "none") for device in layout.devices}, timeouts.connect_s,
                "never" if timeouts.stall_s is None else f"{timeouts.stall_s:g} s "
                f"({'VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS' if timeouts.stall_by == 'rpc' else 'HCCL_EXEC_TIMEOUT'})")

    def log(line: str) -> None:
        (logger.error if "[ERROR]" in line or line.startswith("ERROR") else logger.info)("%s", line)

    if layout.headless:
        return cluster.Worker(layout=layout, ips=ips, ip_problems=problems, timeouts=timeouts,
                              time_scale=args.time_scale, log=log, source_ip=os.environ.get("HCCL_IF_IP") or None)
    return cluster.Head(layout=layout, ips=ips, ip_problems=problems, timeouts=timeouts, log=log)


def _load(args: argparse.Namespace, plan: dict[str, Any], perfmodel: Any, pause: Any) -> int | None:
    """Load the weights (modelled time), or fail as the real engine does: None when loaded, else the exit status.
    ``pause(seconds)`` sleeps and returns a fatal message that cut the sleep short (the DP handshake's)."""
    d = plan["deployment"]
    scale = args.time_scale
    logger.info("Starting to load model %s...", plan["model"].name)
    began = time.monotonic()
    plan["began"] = began
    failure, started = plan["failure"], plan["started"]
    if failure is not None:
        fatal = pause(_failure_delay(plan, failure, perfmodel) * scale)
        if fatal is not None:
            return _fail(fatal)
        logger.error("EngineCore failed to start.")
        return _fail(f"{failure.message}\nRuntimeError: Engine core initialization failed. See root cause above. "
                     f"Failed core proc(s): {{}}")
    init_s = d.efficiency.init_s - (d.efficiency.capture_s if args.enforce_eager else 0.0)
    load_s = (plan["startup"] - init_s if args.startup is None else plan["startup"]) * scale
    fatal = pause(max(load_s, 0.0))
    if fatal is not None:
        return _fail(fatal)
    weights_gib = perfmodel.weights_bytes(d) / d.chips / perfmodel.GIB
    logger.info("Loading weights took %.2f seconds", max(load_s, 0.0))
    logger.info("Model loading took %.4f GiB and %.6f seconds", weights_gib, time.monotonic() - began)
    assert started is not None
    return None


def _sleep(seconds: float) -> None:
    time.sleep(max(seconds, 0.0))


def _serve_headless(args: argparse.Namespace, plan: dict[str, Any], perfmodel: Any, worker: Any) -> int:
    """A headless node (vLLM run_headless): its DP ranks join the head's instance and step with it; no API."""
    layout = worker.layout
    logger.info("Launching %d data parallel engine(s) in headless mode, with head node address %s.", layout.local,
                layout.handshake_address)
    failure = worker.handshake()
    if failure is not None:
        return _fail(failure)
    logger.info("Received init message from front-end: data_parallel_size=%d", worker.dp_size)

    def pause(seconds: float) -> None:
        _sleep(seconds)

    status = _load(args, plan, perfmodel, pause)
    if status is not None:
        return status
    failure = worker.link()  # HCCL's links to the head's NPUs, then READY
    if failure is not None:
        return _fail(failure)
    started = plan["started"]
    _sleep(plan["startup"] * args.time_scale - (time.monotonic() - plan["began"]))
    for line in started.log:
        logger.info("%s", line)
    logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds",
                time.monotonic() - plan["began"])
    logger.info("EngineCore_DP%d-%d ready: HCCL ranks %d-%d linked to the head; stepping with the instance",
                layout.dp_ranks[0], layout.dp_ranks[-1], layout.ranks[0], layout.ranks[-1])
    status = worker.serve()
    logger.info("Shutting down.")
    return status


def _start(args: argparse.Namespace, plan: dict[str, Any], perfmodel: Any, sock: socket.socket, host: str,
           server: Any, metrics_cls: Any, head: Any = None) -> int:
    from dsctl.core.perf import engine_config

    d = plan["deployment"]
    scale = args.time_scale

    def pause(seconds: float) -> str | None:
        if head is None:
            _sleep(seconds)
            return None
        return head.wait(seconds)

    status = _load(args, plan, perfmodel, pause)
    if status is not None:
        return status
    began, started = plan["began"], plan["started"]
    if head is not None:
        # HCCL's comm init: every remote rank links to this node's NPUs within HCCL_CONNECT_TIMEOUT, and every
        # remote engine says READY, or nothing serves (vLLM's front-end waits for all engines before listening).
        head.listen_devices()
        logger.info("Waiting for %d remote rank(s) to link (HCCL_CONNECT_TIMEOUT %d s)", len(head.remote_ranks),
                    head.timeouts.connect_s)
        failure = head.join(head.timeouts.connect_wait_s * scale)
        if failure is not None:
            return _fail(failure)
        logger.info("All %d ranks of the instance linked and ready", head.layout.world)
    fatal = pause(plan["startup"] * scale - (time.monotonic() - began))
    if fatal is not None:
        return _fail(fatal)
    for line in started.log:
        logger.info("%s", line)
    blocks = started.capacity_tokens // args.block_size
    kv_tokens = blocks * args.block_size
    logger.info("Available KV cache memory: %.2f GiB", started.kv_budget_bytes / perfmodel.GIB)
    logger.info("# GPU blocks: %d", blocks)
    logger.info("GPU KV cache size: %s tokens", f"{kv_tokens:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx", f"{plan['max_model_len']:,}",
                kv_tokens / plan["max_model_len"])
    share = perfmodel.allocator_share(plan["config"].alloc_conf)
    logger.info("NPU caching allocator: PYTORCH_NPU_ALLOC_CONF=%r; largest activation allocation under load "
                "%.2f GiB%s", plan["config"].alloc_conf, started.activation_limit / perfmodel.GIB,
                "" if share >= 1 else " (no expandable_segments: long prompts can fail with aclrtMalloc)")
    if not args.enforce_eager:
        logger.info("Graph capturing finished in %.0f secs", d.efficiency.capture_s)
    logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds", time.monotonic() - began)
    scheduler = engine_config.scheduler(started, jitter=args.jitter, seed=args.seed)
    served = args.served_model_name or [plan["model_name"]]
    config = server.ServerConfig(
        served_model_names=served, model_root=plan["model_name"], max_model_len=plan["max_model_len"],
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
        time_scale=scale * plan["cann"].slowdown, advertised_time_scale=scale, seed=args.seed,
        divergence=perfmodel.divergence_probability(plan["keep"]), record=args.record,
        access_log=not args.disable_uvicorn_access_log,
        log_stats_interval=0.0 if args.disable_log_stats else float(os.environ.get("VLLM_LOG_STATS_INTERVAL", 10)),
        version=vllm_version(), cann=plan["cann"].version, cann_toolkit=plan["cann"].toolkit)
    metrics = metrics_cls(served[0], plan["max_model_len"], {
        "block_size": str(args.block_size), "cache_dtype": "auto",
        "gpu_memory_utilization": str(args.gpu_memory_utilization), "num_gpu_blocks": str(blocks),
        "num_cpu_blocks": "0", "enable_prefix_caching": str(args.enable_prefix_caching),
        "stream_num": str(args.stream_num or 1),
        "kv_sparse_threshold": str(args.kv_sparse_threshold)})
    url = f"http://{host}:{args.port}"
    logger.info("Starting vLLM API server 0 on %s", url)
    for path, methods in server.ROUTES.items():
        logger.info("Route: %s, Methods: %s", path, ", ".join(methods))
    return asyncio.run(_run(server, scheduler, config, metrics, sock, host, args.port, url, head))


async def _run(server: Any, scheduler: Any, config: Any, metrics: Any, sock: socket.socket, host: str, port: int,
               url: str, head: Any = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    engine = server.Engine(scheduler, config, metrics)
    if head is not None:
        engine.cluster = head  # a step needs every rank: a lost one stalls the instance (server.Engine._stall)
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
    if engine.fatal is not None:
        sys.stdout.flush()
        print(f"{engine.fatal.splitlines()[-1]}\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
              f"issue. See stack trace (above) for the root cause.", file=sys.stderr, flush=True)
        return 1
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

