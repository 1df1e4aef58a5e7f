"""One instance over several hosts: vLLM's multi-node data parallel with HCCL's links, over real sockets.

Standard library only (the lab's stand-in ``vllm`` vendors it).  ``vllm serve`` runs once per node
(vLLM "Data Parallel Deployment", internal load balancing; vllm-ascend "Multi-Node-DP (DeepSeek)")::

    # head: the API server and DP ranks 0..n-1
    vllm serve M --data-parallel-size N --data-parallel-size-local n \\
        --data-parallel-address HEAD --data-parallel-rpc-port P ...
    # every other node: no API server, its DP ranks from r
    vllm serve M --headless --data-parallel-size N --data-parallel-size-local n --data-parallel-start-rank r \\
        --data-parallel-address HEAD --data-parallel-rpc-port P ...

What the emulation does, step by step, and where each step comes from:

1. **Flags, as vLLM v0.13 reads them** (`layout`): ``vllm/engine/arg_utils.py`` ``create_engine_config`` (local
   DP size defaults to the DP size; ``--data-parallel-start-rank`` is read only with ``--data-parallel-size-local``
   and makes a non-headless node a hybrid/external load balancer), ``vllm/config/parallel.py`` (pydantic:
   "data_parallel_size_local (x) must be <= data_parallel_size (y)", "data_parallel_rank (r) must be in the range
   [0, N)"), ``vllm/entrypoints/cli/serve.py`` ``run_headless`` ("api_server_count can't be set in headless mode",
   "data_parallel_size_local must be > 0 in headless mode"; ``--api-server-count 0`` also runs headless).  Defaults:
   address 127.0.0.1, RPC port 29550 (``ParallelConfig``).  Not modelled, refused in one line: hybrid and external
   load balancing, and an API-only head (``--data-parallel-size-local 0``).
2. **vLLM's DP handshake on the management network** (`Head`, `Worker.handshake`): the head binds
   ``tcp://ADDRESS:PORT`` before it loads anything (``launch_core_engines``; a taken port is ZMQ's "Address already
   in use"); each remote engine says HELLO, the head answers with its parallel config (the worker takes the head's
   data_parallel_size, as ``startup_handshake`` does) and later expects READY with a config hash equal to its own.
   The head's refusals are ``wait_for_engine_startup``'s: "Message from engine with unexpected data parallel rank",
   "HELLO message from remote engine r, expected it to be local", "Unexpected HELLO message for remote engine r in
   CoreEngineState.CONNECTED state.", "Configuration mismatch detected for engine r ...".  A worker whose head never
   answers gives up after vLLM's HANDSHAKE_TIMEOUT_MINS = 5: "Did not receive response from front-end process
   within 5 minutes".  Each message is one JSON line over TCP (vLLM uses ZMQ and msgpack); HCCL's root-info exchange
   (HCCL_IF_IP: "the IP address used by the host to communicate with the root node", CANN HCCL guide) rides on the
   same connection, which a worker opens from HCCL_IF_IP when it is set.
3. **HCCL's links on the NPU plane** (`Head.listen_devices`, `Worker.link`): after loading, rank 0's node (the
   head) listens on every NPU's RoCE address at HCCL's device port 16666 (the listen line of vllm-ascend issue
   #1955: "listen on ip[...] and specific port[16666]"), and every NPU of every other node connects *from its own
   RoCE address* to the head's NPU of the same index: NPU i of every server sits in one subnet, plane i
   (ascend-deployer's A2 addressing rule; multi-node.md).  Its RoCE address is what the NPU holds
   (``hccn_tool -i N -ip -g``; the lab's hccn_tool answers what the lab's NPU holds, and that address is live on
   the lab's NPU plane only while its link is up).  Both sides wait ``HCCL_CONNECT_TIMEOUT`` (default 120 s, range
   120..7200; "the actual timeout is the value plus 20 s" from CANN 8.2 on, CANN HCCL guide), then fail with
   HCCL's words: "[Wait][LinkEstablish]wait socket establish timeout, role[0] rank[0] timeout[120 s]", the
   LINK_ERROR_INFO table (one row per rank that never linked: ``dest_ip(user_rank)``, so the rank is named) and
   EI0006 "Getting socket times out" (vllm-ascend issues #1955, #5461, #9447).  Nothing serves before every rank
   of every node has linked and said READY: the head listens for HTTP only then (before, a connection is refused,
   as vLLM binds its API socket first and listens once the engines are up).
4. **Ranks step together** (`Head.lost_ranks`, used by dsctl.engine.server): a worker's process that dies closes
   its sockets; one that freezes or loses its NPU link stops its heartbeats (every 0.5 s on each link, lost after
   10 s: the emulation's own).  vLLM notices nothing while idle (its DP ranks pause together and no collective
   runs), so /health keeps answering 200; the next step needs every rank (MoE dispatch/combine, vLLM "Data
   Parallel Deployment": dummy forward passes keep ranks aligned), so it hangs until a timeout kills the engine
   core: with TP > 1 vLLM's MultiprocExecutor gives up first, after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (default
   300): "TimeoutError: RPC call to execute_model timed out."; otherwise HCCL's HCCL_EXEC_TIMEOUT (A2: default
   1836 s, 0 = never, with HCCL_OP_EXPANSION_MODE=AIV at most 1091) ends the collective with EI0002 "The wait
   execution of the Notify register times out ... remote rank: [r]".  Then EngineDeadError: requests in flight
   fail, /health is unhealthy and the server exits 1.  A worker whose head is gone exits 1 (the emulation's: its
   ranks have nobody to step with); SIGTERM on the head tells the workers to shut down.

Every wait above is in modelled seconds, run ``time_scale`` times faster like the rest of the engine (lab time
scale 0.5: HCCL_CONNECT_TIMEOUT=120 waits 60 wall seconds).  ``DSCTL_ENGINE_NPU_IPS`` (a comma list, one address per
NPU in ASCEND_RT_VISIBLE_DEVICES order) stands in for hccn_tool where there is none (tests on 127.0.0.x).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_DP_ADDRESS = "127.0.0.1"  # vllm/config/parallel.py ParallelConfig.data_parallel_master_ip
DEFAULT_DP_RPC_PORT = 29550  # ParallelConfig.data_parallel_rpc_port
HANDSHAKE_TIMEOUT_MINS = 5  # vllm/v1/engine/core.py EngineCoreProc.startup_handshake
HCCL_DEVICE_PORT = 16666  # HCCL's device NIC port (vllm-ascend #1955: "listen on ip[..] and specific port[16666]")
CONNECT_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_RANGE = 120, (120, 7200)  # CANN HCCL guide, HCCL_CONNECT_TIMEOUT
CONNECT_TIMEOUT_NOTICE_S = 20  # "the actual timeout is the value plus 20 seconds" (CANN 8.2 and later)
EXEC_TIMEOUT_DEFAULT, EXEC_TIMEOUT_AIV_MAX = 1836, 1091  # HCCL_EXEC_TIMEOUT on Atlas A2 (CANN HCCL guide)
EXECUTE_MODEL_TIMEOUT_DEFAULT = 300  # vLLM envs VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (MultiprocExecutor, TP > 1)
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
NPU_IPS_ENV = "DSCTL_ENGINE_NPU_IPS"
HEARTBEAT_S = 0.5  # wall seconds between a worker's heartbeats on each link (the emulation's)
LOST_AFTER_S = 10.0  # a link or a head silent this long is lost (the emulation's)
RETRY_S = 0.2  # between connection attempts
QUERY_TIMEOUT_S = 10.0  # hccn_tool per query
LINE_LIMIT = 64 * 1024  # one protocol message
CONNECTED = "CoreEngineState.CONNECTED"
READY = "CoreEngineState.READY"


class LayoutError(Exception):
    """The flags describe a layout vLLM refuses (or the emulation does not model): the message as printed."""


class ClusterError(Exception):
    """The instance cannot form: the message (one or more lines) as the real engine prints it."""


class RankLost(Exception):
    """A step of the instance could not complete (a rank is gone) and its timeout ran out: the engine core dies."""


# --------------------------------------------------------------------------- the layout of this node


@dataclass(frozen=True)
class Layout:
    """This node's part of a multi-node instance."""

    dp_size: int
    local: int
    start_rank: int
    tp: int
    headless: bool
    address: str
    rpc_port: int
    expert_parallel: bool
    model: str
    devices: tuple[int, ...]  # the NPUs (physical ids) of this node's ranks, in rank order

    @property
    def nodes(self) -> int:
        """Hosts the instance spans, as this node sees it (its local DP size on every node)."""
        return max(1, math.ceil(self.dp_size / self.local))

    @property
    def dp_ranks(self) -> range:
        return range(self.start_rank, self.start_rank + self.local)

    @property
    def ranks(self) -> list[int]:
        """Global (HCCL) ranks of this node: DP rank d's TP rank t is d x TP + t, as the rank table numbers them."""
        return [self.start_rank * self.tp + k for k in range(self.local * self.tp)]

    @property
    def world(self) -> int:
        return self.dp_size * self.tp

    @property
    def handshake_address(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address  # vllm get_tcp_uri
        return f"tcp://{host}:{self.rpc_port}"

    def config_hash(self) -> str:
        """What ParallelConfig.compute_hash covers that the ranks must share (pp, tp, ep, dp, all2all backend)."""
        factors = [1, self.tp, self.expert_parallel, self.dp_size, "allgather_reducescatter"]
        return hashlib.sha256(str(factors).encode()).hexdigest()


def _pydantic(message: str) -> str:
    return ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n"
            f"  Value error, {message} [type=value_error, input_value=ArgsKwargs((), {{...}}), "
            "input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/2.11/v/value_error")


def visible_devices(environ: Mapping[str, str], default_count: int) -> list[int]:
    """Physical NPU ids in ASCEND_RT_VISIBLE_DEVICES order (unset: 0..default_count-1)."""
    raw = environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if not parts:
        return list(range(default_count))
    return [int(part) if part.isdigit() else index for index, part in enumerate(parts)]


def layout(args: Any, devices: Sequence[int]) -> Layout | None:
    """The node's layout for ``vllm serve`` arguments ``args``, or None for a single-node engine (LayoutError)."""
    dp = args.data_parallel_size
    headless = bool(args.headless) or args.api_server_count < 1  # v0.13 serve.py: run_headless for either
    if headless and args.api_server_count > 1:
        raise LayoutError("ValueError: api_server_count can't be set in headless mode")
    local_arg = args.data_parallel_size_local
    if headless and args.data_parallel_hybrid_lb:
        raise LayoutError("AssertionError: data_parallel_hybrid_lb is not applicable in headless mode")
    if args.data_parallel_rank is not None:
        if local_arg not in (1, None):
            raise LayoutError("AssertionError: data_parallel_size_local must be 1 when data_parallel_rank is set")
        raise LayoutError("ValueError: --data-parallel-rank is vLLM's external data-parallel load balancing (one "
                          "`vllm serve` per DP rank, each with its own API server); the dsctl emulated engine does "
                          "not model it: run the head with --data-parallel-size-local and the other nodes --headless")
    if args.data_parallel_hybrid_lb:
        if local_arg is None:
            raise LayoutError("AssertionError: data_parallel_size_local must be set to use data_parallel_hybrid_lb.")
        raise LayoutError("ValueError: --data-parallel-hybrid-lb (an API server on every node) is not modelled by "
                          "the dsctl emulated engine: run the other nodes --headless")
    if args.data_parallel_backend != "mp":
        if args.data_parallel_backend == "ray":
            raise LayoutError("ValueError: --data-parallel-backend ray (Ray places the remote DP ranks) is not "
                              "modelled by the dsctl emulated engine; use mp (one `vllm serve` per node)")
        raise LayoutError(f"AssertionError: ('data_parallel_backend can only be ray or mp, got %s', "
                          f"'{args.data_parallel_backend}')")
    if local_arg is not None and local_arg < 0:
        raise LayoutError(f"ValueError: --data-parallel-size-local must not be negative, got {local_arg}")
    if local_arg is not None:
        local = local_arg
        if args.data_parallel_start_rank and not headless:
            raise LayoutError(
                f"ValueError: --data-parallel-start-rank {args.data_parallel_start_rank} without --headless is vLLM's "
                "hybrid (or, with one local rank, external) data-parallel load balancing, where every node runs its "
                "own API server; the dsctl emulated engine does not model it: run this node with --headless (its "
                "ranks join the head's API server)")
        rank = args.data_parallel_start_rank or 0
    else:
        local, rank = dp, 0  # arg_utils: the local size defaults to the DP size; the start rank is not read
    if local > dp:
        raise LayoutError(_pydantic(f"data_parallel_size_local ({local}) must be <= data_parallel_size ({dp})"))
    if (dp > 1 or local == 0) and not 0 <= rank < dp:
        raise LayoutError(_pydantic(f"data_parallel_rank ({rank}) must be in the range [0, {dp})"))
    if headless and local <= 0:
        raise LayoutError("ValueError: data_parallel_size_local must be > 0 in headless mode")
    if not headless and local >= dp:
        return None  # every rank on this node: the single-node engine
    if local == 0:
        raise LayoutError("ValueError: an API-only head (--data-parallel-size-local 0, every engine on other nodes) "
                          "is not modelled by the dsctl emulated engine; give the head its DP ranks")
    port = args.data_parallel_rpc_port if args.data_parallel_rpc_port is not None else DEFAULT_DP_RPC_PORT
    if not 1 <= port <= 65535:
        raise LayoutError(f"ValueError: --data-parallel-rpc-port must be 1..65535, got {port}")
    used = local * args.tensor_parallel_size
    return Layout(dp_size=dp, local=local, start_rank=rank, tp=args.tensor_parallel_size, headless=headless,
                  address=args.data_parallel_address or DEFAULT_DP_ADDRESS, rpc_port=port,
                  expert_parallel=bool(args.enable_expert_parallel), model=str(args.model or args.model_tag),
                  devices=tuple(list(devices)[:used]))


# --------------------------------------------------------------------------- HCCL's settings and words


def _parse_cann(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


@dataclass(frozen=True)
class Timeouts:
    """The waits, in modelled seconds (wall = modelled x time scale)."""

    connect_s: int  # HCCL_CONNECT_TIMEOUT as HCCL takes it (its messages say it)
    connect_wait_s: float  # what HCCL actually waits (plus 20 s from CANN 8.2)
    stall_s: float | None  # a step that lacks a rank: until the engine core dies (None: never)
    stall_by: str  # "rpc" (vLLM's execute_model RPC) or "hccl" (HCCL_EXEC_TIMEOUT)
    handshake_s: float = HANDSHAKE_TIMEOUT_MINS * 60.0


def _int_env(environ: Mapping[str, str], name: str, warnings: list[str]) -> int | None:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        warnings.append(f"{name}={raw!r} is not an integer; the default is used")
        return None


def timeouts(environ: Mapping[str, str], tp: int, cann_version: str | None) -> tuple[Timeouts, list[str]]:
    """HCCL's and vLLM's timeouts from the environment, and warnings for values they would not take."""
    warnings: list[str] = []
    connect = _int_env(environ, "HCCL_CONNECT_TIMEOUT", warnings)
    low, high = CONNECT_TIMEOUT_RANGE
    if connect is None:
        connect = CONNECT_TIMEOUT_DEFAULT
    elif not low <= connect <= high:
        # Inferred: the guide gives the range, not what HCCL does outside it; the emulation clamps and says so.
        warnings.append(f"HCCL_CONNECT_TIMEOUT={connect} is outside {low}..{high} s; {min(max(connect, low), high)} "
                        "is used")
        connect = min(max(connect, low), high)
    cann = _parse_cann(cann_version)
    wait = connect + (CONNECT_TIMEOUT_NOTICE_S if cann is not None and cann >= (8, 2) else 0)
    exec_s = _int_env(environ, "HCCL_EXEC_TIMEOUT", warnings)
    aiv = environ.get("HCCL_OP_EXPANSION_MODE", "").strip().upper() == "AIV"
    if aiv:
        exec_s = EXEC_TIMEOUT_AIV_MAX if exec_s is None or exec_s <= 0 or exec_s > EXEC_TIMEOUT_AIV_MAX else exec_s
    elif exec_s is None or exec_s < 0:
        exec_s = EXEC_TIMEOUT_DEFAULT
    hccl: float | None = float(exec_s) if exec_s > 0 else None  # 0: never
    stall, by = hccl, "hccl"
    if tp > 1:
        rpc = _int_env(environ, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", warnings)
        rpc = EXECUTE_MODEL_TIMEOUT_DEFAULT if rpc is None or rpc <= 0 else rpc
        if hccl is None or rpc <= hccl:
            stall, by = float(rpc), "rpc"
    return Timeouts(connect_s=connect, connect_wait_s=float(wait), stall_s=stall, stall_by=by), warnings


def _stamp() -> str:
    now = time.time()
    micros = int((now % 1) * 1_000_000)
    return time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(now)) + f".{micros // 1000:03d}.{micros % 1000:03d}"


def hccl_line(where: str, text: str, level: str = "ERROR") -> str:
    pid = os.getpid()
    return f"[{level}] HCCL({pid},python3):{_stamp()} [{where}] [{pid}]{text}"


EI0006 = ("Get_Socket_Timeout(EI0006): Getting socket times out. Reason: 1. The remote does not initiate a connect "
          "request. some NPUs in the cluster are abnormal.    2. The remote does not initiate a connect request "
          "because the collective communication operator is started too late or is not started by some NPU in the "
          "cluster.    "
          "3. The communication link is disconnected. (For example, the IP addresses are not on the same network "
          "segment or the TLS configurations are inconsistent.)\n        Solution: 1. Check the rank service processes "
          "with other errors or no errors in the cluster.2. If this error is reported for all NPUs, check whether the "
          "time difference between the earliest and latest errors is greater than the connect timeout interval ({}s by "
          "default). If so, adjust the timeout interval by using the HCCL_CONNECT_TIMEOUT environment variable.3. "
          "Check the connectivity of the communication link between nodes. (For example, run the 'hccn_tool -i $devid "
          "-tls -g' command to check the TLS status of each NPU).")


@dataclass(frozen=True)
class LinkRow:
    dest_ip: str
    dest_rank: int
    src_ip: str
    src_rank: int
    role: str  # "server" or "client"


def link_timeout_report(role: int, rank: int, device: int, timeout_s: int, rows: Sequence[LinkRow],
                        dp_rank: int) -> str:
    """HCCL's failure when links did not come up in time (vllm-ascend #1955, #9447), then vLLM's engine failure."""
    lines = [hccl_line("hccl_socket_manager.cc:796", f"[Wait][LinkEstablish]wait socket establish timeout, "
                                                      f"role[{role}] rank[{rank}] timeout[{timeout_s} s]"),
             hccl_line("hccl_socket_manager.cc:830", "[Wait][LinksEstablishCompleted] is failed. ret[9]."),
             hccl_line("hccl_socket_manager.cc:591",
                       "   _________________________LINK_ERROR_INFO___________________________"),
             hccl_line("hccl_socket_manager.cc:592", f"   |  comm error, device[{device}]"),
             hccl_line("hccl_socket_manager.cc:625", "   |  dest_ip(user_rank)  |   dest_port   |  src_ip(user_rank)"
                                                     "   |   src_port   |   MyRole   |   Status   |    TlsStatus   |"),
             hccl_line("hccl_socket_manager.cc:627", "   |----------------------|---------------|--------------------"
                                                     "--|--------------|------------|------------|----------------|")]
    for row in rows:
        lines.append(hccl_line("hccl_socket_manager.cc:582",
                               f"   |  {row.dest_ip}({row.dest_rank})   |  {HCCL_DEVICE_PORT}  |   "
                               f"{row.src_ip}({row.src_rank})   |  {HCCL_DEVICE_PORT if row.role == 'server' else 0}  "
                               f"|  {row.role}  | time out |   DISABLE  | LinkInfo"))
    lines.append(f"EI0006: [PID: {os.getpid()}] {_stamp()} " + EI0006.format(CONNECT_TIMEOUT_DEFAULT))
    names = ", ".join(str(row.dest_rank) for row in rows)
    lines.append(f"RuntimeError: HCCL could not link rank {rank} with rank(s) {names} within HCCL_CONNECT_TIMEOUT "
                 f"({timeout_s} s): Getting socket times out (EI0006)")
    lines.append("EngineCore failed to start.")
    lines.append("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                 f"{{'EngineCore_DP{dp_rank}': 1}}")
    return "\n".join(lines)


def stall_report(timeouts_: Timeouts, lost: Sequence[int], first_rank: int) -> str:
    """The engine core's death after a step that some rank never joined."""
    lost_text = ", ".join(str(r) for r in lost)
    if timeouts_.stall_by == "rpc":
        return (f"Step of the data-parallel group did not complete: rank(s) {lost_text} never joined the collective\n"
                "TimeoutError: RPC call to execute_model timed out.")
    seconds = int(timeouts_.stall_s or 0)
    return (f"EI0002: [PID: {os.getpid()}] {_stamp()} The wait execution of the Notify register times out. Reason: The "
            f"Notify register has not received the Notify record from remote rank: [{lost[0]}]. base information: "
            f"[streamID:[2], taskID[1], taskType[Notify Wait], tag[AllToAllV_group_name_ep], AlgType(level 0-1-2):"
            f"[fullmesh-pairwise-pairwise].]. task information: [notify id:[0x0000000000000011], stage:[0], remote "
            f"rank:[{lost[0]}]]. group information: [group:[group_name_ep], user define information[Unspecified], "
            f"rankId[{first_rank}]]\n        Possible Cause: 1. An exception occurs during the execution on some NPUs "
            "in the cluster. As a result, collective communication operation failed.2. The execution speed on some "
            "NPU in the cluster is too slow to complete a communication operation within the timeout interval. "
            "(default 1800s, You can set the interval by using HCCL_EXEC_TIMEOUT.)3. The number of training samples "
            "of each NPU is inconsistent.4. Packet loss or other connectivity problems occur on the communication "
            "link.\n"
            f"RuntimeError: HCCL collective timed out after HCCL_EXEC_TIMEOUT ({seconds} s): remote rank(s) "
            f"{lost_text} did not join (EI0002)")


# --------------------------------------------------------------------------- the NPUs' RoCE addresses


def device_ips(devices: Sequence[int], environ: Mapping[str, str]) -> tuple[dict[int, str], dict[int, str]]:
    """Each NPU's RoCE address, and why an NPU has none (hccn_tool's answer).

    ``DSCTL_ENGINE_NPU_IPS`` (the emulation's: one address per NPU, in ASCEND_RT_VISIBLE_DEVICES order) wins; else
    ``hccn_tool -i N -ip -g`` is asked for every NPU at once (what the NPU holds: the lab's hccn_tool answers from the
    lab's device state)."""
    override = environ.get(NPU_IPS_ENV, "").strip()
    found: dict[int, str] = {}
    missing: dict[int, str] = {}
    if override:
        addresses = [part.strip() for part in override.split(",")]
        for index, device in enumerate(devices):
            if index < len(addresses) and addresses[index]:
                found[device] = addresses[index]
            else:
                missing[device] = f"{NPU_IPS_ENV} gives no address for NPU {device}"
        return found, missing
    tool = HCCN_TOOL if os.access(HCCN_TOOL, os.X_OK) else shutil.which("hccn_tool")
    if tool is None:
        return {}, {device: "hccn_tool not found (is the NPU driver installed?)" for device in devices}
    running = {}
    for device in devices:
        try:
            running[device] = subprocess.Popen([tool, "-i", str(device), "-ip", "-g"], stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            missing[device] = f"hccn_tool: {exc}"
    for device, proc in running.items():
        try:
            out, _ = proc.communicate(timeout=QUERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            missing[device] = f"hccn_tool -i {device} -ip -g did not answer within {QUERY_TIMEOUT_S:g} s"
            continue
        address = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("ipaddr:")),
                       None)
        if proc.returncode == 0 and address:
            found[device] = address
        else:
            missing[device] = (out.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return found, missing


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


async def _write(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    writer.write((json.dumps(message) + "\n").encode())
    await writer.drain()


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------- the head (rank 0's node)


@dataclass
class _Node:
    peer: str
    dp_ranks: list[int]
    devices: dict[int, str | None]  # global rank -> RoCE address the node reported
    writer: asyncio.StreamWriter
    ready: bool = False
    closed: bool = False


@dataclass
class _Link:
    rank: int
    source: str
    last_seen: float
    closed: bool = False


@dataclass
class Head:
    """The head's DP coordinator and rank 0's end of the HCCL links, run on a thread of its own (the engine's
    start-up is sequential, and the links must answer while it loads and while it serves)."""

    layout: Layout
    ips: Mapping[int, str]  # this node's NPUs' RoCE addresses
    ip_problems: Mapping[int, str]
    timeouts: Timeouts
    log: Callable[[str], None]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Event = field(default_factory=threading.Event)
    _fatal: str | None = None
    _nodes: list[_Node] = field(default_factory=list)
    _dp_state: dict[int, str] = field(default_factory=dict)
    _links: dict[int, _Link] = field(default_factory=dict)
    _joined: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None
    _sock: socket.socket | None = None
    _device_servers: list[asyncio.AbstractServer] = field(default_factory=list)
    _graceful: bool = True
    remote_ranks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        own = set(self.layout.ranks)
        self.remote_ranks = [rank for rank in range(self.layout.world) if rank not in own]
        self._remote_set = frozenset(self.remote_ranks)

    def open(self) -> None:
        """Bind the handshake address (before loading, as vLLM does) and start answering on it."""
        lay = self.layout
        family = socket.AF_INET6 if ":" in lay.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((lay.address, lay.rpc_port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise ClusterError(f"zmq.error.ZMQError: {exc.strerror} (addr='{lay.handshake_address}')") from None
        sock.setblocking(False)
        self._sock = sock
        self._dp_state = {rank: "NEW" for rank in range(lay.dp_size) if rank not in lay.dp_ranks}
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="dp-coordinator", daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(started))
        finally:
            loop.close()

    async def _main(self, started: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._coordinator, sock=self._sock, limit=LINE_LIMIT)
        started.set()
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self._stop.wait()
        finally:
            beat.cancel()
            for node in self._nodes:
                if not node.closed:
                    if self._graceful:
                        try:
                            await asyncio.wait_for(_write(node.writer, {"status": "SHUTDOWN"}), 1.0)
                        except (OSError, TimeoutError):
                            pass
                    node.writer.close()
            server.close()
            for device_server in self._device_servers:
                device_server.close()
            # The connections' handlers still wait on their sockets: end them before the loop closes (else asyncio
            # prints "Task was destroyed but it is pending!" into the log the deploy's gate reports from).
            handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

    def _set_fatal(self, message: str) -> None:
        with self._lock:
            if self._fatal is None:
                self._fatal = message
        self._changed.set()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            for node in list(self._nodes):
                if not node.closed:
                    try:
                        node.writer.write(b'{"status": "ALIVE"}\n')
                    except (OSError, RuntimeError):
                        pass

    async def _coordinator(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One remote node's handshake (vLLM wait_for_engine_startup), then its READY and its liveness."""
        node: _Node | None = None
        peer = writer.get_extra_info("peername")
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), LOST_AFTER_S)
            except (TimeoutError, ValueError, ConnectionError):
                return
            if not line:
                return
            hello = _decode(line)
            if hello is None or hello.get("status") != "HELLO" or not isinstance(hello.get("dp_ranks"), list):
                # vLLM reads the first frame as an engine identity: any other traffic on the port kills the head.
                self._set_fatal("RuntimeError: Message from engine with unexpected data parallel rank: "
                                f"{int.from_bytes(line.rstrip()[:64], 'little')}")
                return
            node = self._hello(hello, peer, writer)
            if node is None:
                return
            await _write(writer, {"status": "INIT", "data_parallel_size": self.layout.dp_size,
                                  "data_parallel_master_ip": self.layout.address,
                                  "root": [{"rank": rank, "device_id": device, "device_ip": self.ips.get(device)}
                                           for rank, device in zip(self.layout.ranks, self.layout.devices,
                                                                   strict=True)]})
            while True:
                line = await reader.readline()
                if not line:
                    break
                message = _decode(line) or {}
                if message.get("status") == "READY":
                    self._ready(node, message)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            if node is not None:
                with self._lock:
                    node.closed = True
                self._changed.set()
            writer.close()

    def _hello(self, hello: Mapping[str, Any], peer: Any, writer: asyncio.StreamWriter) -> _Node | None:
        lay = self.layout
        dp_ranks = [int(rank) for rank in hello["dp_ranks"]]
        for rank in dp_ranks:
            if not 0 <= rank < lay.dp_size:
                self._set_fatal(f"RuntimeError: Message from engine with unexpected data parallel rank: {rank}")
                return None
            if rank in lay.dp_ranks:
                self._set_fatal(f"RuntimeError: HELLO message from remote engine {rank}, expected it to be local")
                return None
            if not hello.get("headless", True):
                self._set_fatal(f"RuntimeError: Remote engine {rank} must use --headless unless in external or "
                                "hybrid dp lb mode")
                return None
            with self._lock:
                state = self._dp_state.get(rank)
            if state != "NEW":
                self._set_fatal(f"RuntimeError: Unexpected HELLO message for remote engine {rank} in {state} state.")
                return None
        devices = {int(entry["rank"]): entry.get("device_ip") for entry in hello.get("devices") or []
                   if isinstance(entry, dict) and "rank" in entry}
        node = _Node(peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer), dp_ranks=dp_ranks,
                     devices=devices, writer=writer)
        with self._lock:
            for rank in dp_ranks:
                self._dp_state[rank] = CONNECTED
            self._nodes.append(node)
        self.log(f"HELLO from remote engine(s) {', '.join(map(str, dp_ranks))} at {node.peer} (headless)")
        self._changed.set()
        return node

    def _ready(self, node: _Node, message: Mapping[str, Any]) -> None:
        expected = self.layout.config_hash()
        if message.get("parallel_config_hash") != expected:
            rank = node.dp_ranks[0]
            self._set_fatal(
                f"RuntimeError: Configuration mismatch detected for engine {rank}. All DP workers must have identical "
                "configurations for parameters that affect collective communication (e.g., enable_eplb, "
                f"eplb_config.log_balancedness). Worker hash: {message.get('parallel_config_hash')}, Expected hash: "
                f"{expected}. Please ensure all workers are started with the same command-line arguments.")
            return
        with self._lock:
            node.ready = True
            for rank in node.dp_ranks:
                self._dp_state[rank] = READY
        self._changed.set()

    # -- the HCCL links (rank 0's node listens on every NPU's RoCE address)

    def listen_devices(self) -> None:
        """Start listening on this node's RoCE addresses (HCCL's comm init, after the weights are loaded); a listen
        that fails is logged in HCCL's words and its peers then time out."""
        if self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._listen_devices(), self._loop)
        for line in future.result(30):
            self.log(line)

    async def _listen_devices(self) -> list[str]:
        problems = []
        for device in self.layout.devices:
            address = self.ips.get(device)
            if address is None:
                problems.append(hccl_line("hccl_communicator.cc:2307", f"[InitNic]device[{device}] has no RoCE NIC "
                                          f"address: {self.ip_problems.get(device, 'unknown')}"))
                continue
            try:
                server = await asyncio.start_server(self._link, host=address, port=HCCL_DEVICE_PORT,
                                                    limit=LINE_LIMIT, reuse_address=True)
            except OSError:
                problems.append(hccl_line("hccl_socket.cc:100", f"[HcclSocket][Listen] socket type[1], listen on "
                                          f"ip[{address}] and specific port[{HCCL_DEVICE_PORT}] fail. Please check "
                                          "the port status and whether the port is been using by other process."))
                continue
            self._device_servers.append(server)
        return problems

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link: _Link | None = None
        try:
            line = await asyncio.wait_for(reader.readline(), LOST_AFTER_S)
            message = _decode(line) or {}
            rank = message.get("rank")
            if not isinstance(rank, int) or rank not in self._remote_set:
                return
            link = _Link(rank=rank, source=str(message.get("device_ip")), last_seen=time.monotonic())
            with self._lock:
                self._links[rank] = link
            await _write(writer, {"ok": True})
            self._changed.set()
            while True:
                data = await reader.read(4096)
                if not data:
                    break
                link.last_seen = time.monotonic()
        except (ConnectionError, OSError, TimeoutError, ValueError):
            pass
        finally:
            if link is not None:
                with self._lock:
                    link.closed = True
                self._changed.set()
            writer.close()

    # -- what the engine asks

    def fatal(self) -> str | None:
        with self._lock:
            return self._fatal

    def wait(self, seconds: float) -> str | None:
        """Sleep ``seconds`` (the engine loading), cut short by a fatal handshake error, which is returned."""
        deadline = time.monotonic() + max(seconds, 0.0)
        while True:
            fatal = self.fatal()
            left = deadline - time.monotonic()
            if fatal is not None or left <= 0:
                return fatal
            self._changed.wait(min(left, 0.5))
            self._changed.clear()

    def _unlinked(self) -> list[int]:
        with self._lock:
            ready = {rank for node in self._nodes if node.ready and not node.closed for rank in node.dp_ranks}
            linked = {rank for rank, link in self._links.items() if not link.closed}
        return [rank for rank in self.remote_ranks if rank not in linked or rank // self.layout.tp not in ready]

    def join(self, wall_timeout: float) -> str | None:
        """Wait until every rank of every node has linked and said READY (None), or say why not."""
        deadline = time.monotonic() + wall_timeout
        while True:
            fatal = self.fatal()
            if fatal is not None:
                return fatal
            missing = self._unlinked()
            if not missing:
                with self._lock:
                    self._joined = True
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return self._timeout_report(missing)
            self._changed.wait(min(left, 0.2))
            self._changed.clear()

    def _timeout_report(self, missing: Sequence[int]) -> str:
        lay = self.layout
        with self._lock:
            reported = {rank: ip for node in self._nodes for rank, ip in node.devices.items()}
            order = {rank: index for node in self._nodes for index, rank in enumerate(sorted(node.devices))}
            linked = {rank for rank, link in self._links.items() if not link.closed}
        rows = []
        for rank in missing:
            index = order.get(rank, rank % (lay.local * lay.tp)) % len(lay.devices)  # the peer NPU of the same index
            root_rank, root_device = lay.ranks[index], lay.devices[index]
            rows.append(LinkRow(dest_ip=str(reported.get(rank) or "unknown"), dest_rank=rank,
                                src_ip=str(self.ips.get(root_device, "unknown")), src_rank=root_rank, role="server"))
        not_ready = [rank for rank in missing if rank in linked]
        report = link_timeout_report(0, lay.ranks[0], lay.devices[0], self.timeouts.connect_s, rows, lay.start_rank)
        if not_ready:  # linked but the node never said READY (its engine failed after linking)
            report = (f"Remote engine(s) of rank(s) {', '.join(map(str, not_ready))} linked but never reported READY\n"
                      + report)
        return report

    def lost_ranks(self) -> list[int]:
        """Remote ranks that cannot step any more (their process, node or link gone), once the instance has formed."""
        now = time.monotonic()
        with self._lock:
            if not self._joined:
                return []
            gone = {rank for node in self._nodes if node.closed for rank in node.dp_ranks}
            links = dict(self._links)
        return [rank for rank in self.remote_ranks
                if rank // self.layout.tp in gone or rank not in links or links[rank].closed
                or now - links[rank].last_seen > LOST_AFTER_S]

    def close(self, graceful: bool = True) -> None:
        """Stop answering; ``graceful``: the head was asked to stop and tells its workers to shut down (else they
        find their head gone: a dead engine core, or a start-up that failed)."""
        self._graceful = graceful
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(5)


# --------------------------------------------------------------------------- a headless node


@dataclass
class Worker:
    """A headless node: its DP ranks say HELLO to the head, link their NPUs to the head's, say READY, then step
    with the instance until the head tells them to stop or is gone."""

    layout: Layout
    ips: Mapping[int, str]
    ip_problems: Mapping[int, str]
    timeouts: Timeouts
    time_scale: float
    log: Callable[[str], None]
    source_ip: str | None = None  # HCCL_IF_IP
    _sock: socket.socket | None = None
    _buffer: bytes = b""
    _root: list[dict[str, Any]] = field(default_factory=list)
    _links: list[socket.socket] = field(default_factory=list)
    dp_size: int = 0

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the head before ``deadline`` (None: timed out), b"" when the head closed."""
        sock = self._sock
        assert sock is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                return None
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            self._buffer += chunk
            if len(self._buffer) > LINE_LIMIT:
                return b""
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def handshake(self) -> str | None:
        """HELLO until the head answers with INIT, within vLLM's 5-minute handshake timeout (None: done)."""
        lay = self.layout
        deadline = time.monotonic() + self.timeouts.handshake_s * self.time_scale
        hello = {"status": "HELLO", "local": False, "headless": True, "dp_ranks": list(lay.dp_ranks),
                 "hccl_if_ip": self.source_ip,
                 "devices": [{"rank": rank, "device_id": device, "device_ip": self.ips.get(device)}
                             for rank, device in zip(lay.ranks, lay.devices, strict=True)]}
        failed = ("RuntimeError: Did not receive response from front-end process within "
                  f"{HANDSHAKE_TIMEOUT_MINS} minutes")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"EngineCore failed to start.\n{failed}"
            try:
                sock = socket.create_connection((lay.address, lay.rpc_port), timeout=min(left, 2.0),
                                                source_address=(self.source_ip, 0) if self.source_ip else None)
            except OSError as exc:
                if self.source_ip and exc.errno == errno.EADDRNOTAVAIL:  # HCCL_IF_IP is not this host's
                    return (hccl_line("hccl_socket.cc:251", f"[HcclSocket][Connect] bind to ip[{self.source_ip}] "
                                      "fail, HCCL_IF_IP is not an address of this host") +
                            f"\nEngineCore failed to start.\nRuntimeError: HCCL_IF_IP={self.source_ip}: "
                            "Cannot assign requested address")
                time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock, self._buffer = sock, b""
            try:
                _send(sock, hello)
                line = self._read_line(deadline)
            except OSError:
                line = b""
            if line is None:
                sock.close()
                return f"EngineCore failed to start.\n{failed}"
            message = _decode(line) if line else None
            if message is not None and message.get("status") == "INIT":
                self._root = [entry for entry in message.get("root") or [] if isinstance(entry, dict)]
                self.dp_size = int(message.get("data_parallel_size") or lay.dp_size)
                return None
            sock.close()  # the head went away before answering: ZMQ would reconnect and resend
            self._sock = None
            time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))

    def _peer_of(self, index: int) -> dict[str, Any] | None:
        if not self._root:
            return None
        return self._root[index % len(self._root)]

    def link(self) -> str | None:
        """Link every NPU of this node to the head's NPU of the same index, within HCCL_CONNECT_TIMEOUT; then READY."""
        lay = self.layout
        deadline = time.monotonic() + self.timeouts.connect_wait_s * self.time_scale
        pending = list(range(len(lay.devices)))
        for index in list(pending):
            device = lay.devices[index]
            if device not in self.ips:
                self.log(hccl_line("hccl_communicator.cc:2307", f"[InitNic]device[{device}] has no RoCE NIC address: "
                                   f"{self.ip_problems.get(device, 'unknown')}"))
        while pending:
            for index in list(pending):
                if time.monotonic() >= deadline:
                    break
                sock = self._connect(index, deadline)
                if sock is not None:
                    self._links.append(sock)
                    pending.remove(index)
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return self._timeout_report(pending)
            time.sleep(min(RETRY_S, left))
        try:
            assert self._sock is not None
            _send(self._sock, {"status": "READY", "parallel_config_hash": self.layout.config_hash(),
                               "dp_ranks": list(lay.dp_ranks)})
        except OSError:
            return "EngineCore failed to start.\nRuntimeError: the front-end closed the handshake connection"
        return None

    def _connect(self, index: int, deadline: float) -> socket.socket | None:
        lay = self.layout
        device, rank = lay.devices[index], lay.ranks[index]
        source, peer = self.ips.get(device), self._peer_of(index)
        if source is None or peer is None or not peer.get("device_ip"):
            return None
        family = socket.AF_INET6 if ":" in source else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((source, 0))  # from the NPU's own RoCE address: the NPU plane, never the management network
            sock.settimeout(max(min(1.0, deadline - time.monotonic()), 0.05))
            sock.connect((peer["device_ip"], HCCL_DEVICE_PORT))
            _send(sock, {"rank": rank, "device_ip": source, "dest_rank": peer.get("rank")})
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                reply += chunk
            if not (_decode(reply) or {}).get("ok"):
                raise ConnectionError("refused")
        except (OSError, ValueError):
            sock.close()
            return None
        sock.setblocking(False)
        return sock

    def _timeout_report(self, pending: Sequence[int]) -> str:
        lay = self.layout
        rows = []
        for index in pending:
            peer = self._peer_of(index) or {}
            rows.append(LinkRow(dest_ip=str(peer.get("device_ip") or "unknown"), dest_rank=int(peer.get("rank", 0)),
                                src_ip=str(self.ips.get(lay.devices[index], "unknown")), src_rank=lay.ranks[index],
                                role="client"))
        first = pending[0]
        return link_timeout_report(1, lay.ranks[first], lay.devices[first], self.timeouts.connect_s, rows,
                                   lay.start_rank + first // lay.tp)

    def serve(self) -> int:
        """Step with the instance: heartbeats on every link; 0 when told to shut down (or SIGTERM), 1 when the head
        is gone."""
        stopping = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            stopping.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
        sock = self._sock
        assert sock is not None
        heard = time.monotonic()
        next_beat = 0.0
        try:
            while not stopping.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    for link in self._links:
                        try:
                            link.send(b"\n")
                        except (BlockingIOError, InterruptedError):
                            pass
                        except OSError:
                            pass  # the head's end is gone: the coordinator connection tells
                    next_beat = now + HEARTBEAT_S
                line = self._read_line(min(next_beat, now + HEARTBEAT_S))
                if line == b"":
                    self.log("ERROR: the head closed the data-parallel handshake connection "
                             f"{self.layout.handshake_address}; this node's ranks have no group to step with")
                    return 1
                if line is None:
                    if time.monotonic() - heard > LOST_AFTER_S:
                        self.log(f"ERROR: no word from the head at {self.layout.handshake_address} for "
                                 f"{LOST_AFTER_S:g} s; this node's ranks have no group to step with")
                        return 1
                    continue
                heard = time.monotonic()
                if (_decode(line) or {}).get("status") == "SHUTDOWN":
                    return 0
            return 0
        finally:
            for link in self._links:
                link.close()
            sock.close()

