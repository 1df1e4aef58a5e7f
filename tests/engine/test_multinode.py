"""The emulated engine as one instance over several hosts (dsctl.engine.cluster): a head and a --headless worker as
two real processes on 127.x.y.z addresses, joined by vLLM's DP handshake and by HCCL-like links that leave from each
NPU's own address; refusals of vLLM's multi-node flags in vLLM's words.

Time runs 50x faster (--time-scale 0.02): HCCL_CONNECT_TIMEOUT=120 waits 2.4 wall seconds, vLLM's 5-minute handshake
timeout 6 (0.01 where it is waited for: 3).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsctl
from dsctl.core.network.hccn_plan import plan_network
from dsctl.core.serving.multinode import NodeFacts, plan_instances, validate_multinode
from dsctl.engine.__main__ import main as engine_main
from dsctl.lab import wheelhouse

from .conftest import free_port

CLI = Path(dsctl.__file__).resolve().parents[1]
MODEL = "deepseek-v2-lite"  # MoE (64 routed experts): DP 2 x TP 1 with expert parallel, one NPU per node
READY_LINE = "Uvicorn running on"
WORKER_READY = "linked to the head; stepping with the instance"
SCALE = "0.02"
LAYOUT = ("--tensor-parallel-size", "1", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
          "--enable-expert-parallel", "--max-model-len", "4096", "--startup", "0")


def addresses(count: int) -> list[str]:
    """Fresh loopback addresses (all of 127/8 is the loopback), so that runs side by side never share a port."""
    net = random.randint(16, 250), random.randint(0, 255)
    return [f"127.{net[0]}.{net[1]}.{host}" for host in range(2, 2 + count)]


class Node:
    """One node's serving process; ``argv`` after ``serve`` (or a whole stand-in ``vllm`` command line)."""

    def __init__(self, tmp: Path, name: str, argv: list[str], env: dict[str, str], stand_in: Path | None = None):
        self.log = tmp / f"{name}.log"
        self.err = tmp / f"{name}.err"
        command = [sys.executable, str(stand_in), *argv] if stand_in else [sys.executable, "-m", "dsctl.engine",
                                                                              "serve", *argv]
        environ = {k: v for k, v in os.environ.items() if k not in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")}
        environ["PYTHONPATH"] = str(CLI)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command, stdout=self.log.open("w"), stderr=self.err.open("w"),
                                     env={**environ, **env})

    def wait_for(self, text: str, timeout: float = 20.0) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log.read_text():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.err.read_text()}")
            time.sleep(0.02)
        raise AssertionError(f"{text!r} never came: {self.log.read_text()[-2000:]}")

    def wait(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def http(host: str, port: int, method: str, path: str, body: object = None, timeout: float = 20.0) -> tuple[int, bytes]:
    payload = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(head + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def refuses(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) != 0


def engine_args(host: str, port: int, dp_address: str, rpc_port: int, *extra: str) -> list[str]:
    return [MODEL, *LAYOUT, "--time-scale", SCALE, "--host", host, "--port", str(port), "--data-parallel-address",
            dp_address, "--data-parallel-rpc-port", str(rpc_port), *extra]


# --------------------------------------------------------------------------- an instance over two nodes


def test_the_deploys_two_node_command_lines_serve_once_both_nodes_are_up(tmp_path):
    """multinode.plan_instances' argv and env per node, run through the lab's stand-in `vllm serve`."""
    head_ip, worker_ip, head_npu, worker_npu = addresses(4)
    # The plan takes NPU addresses a real site could have (a loopback one is refused); each node's engine then
    # binds the loopback address standing in for its planned one, since both run on this machine.
    planned = {"node-a": "10.20.0.2", "node-b": "10.20.0.3"}
    local = {planned["node-a"]: head_npu, planned["node-b"]: worker_npu}
    network = plan_network({name: {"dsctl_npu_count": 1, "dsctl_npu_ips": [npu], "dsctl_npu_network":
                                   {"netmask": "255.255.255.0"}}
                            for name, npu in planned.items()})
    port, rpc = free_port(), free_port()
    service = validate_multinode({"name": "moe", "engine": "vllm-ascend", "model": "/models/DeepSeek-V2-Lite",
                                  "profile": MODEL, "nodes": 2, "npus_per_node": 1, "tensor_parallel_size": 1,
                                  "data_parallel_size": 2, "enable_expert_parallel": True, "socket_ifname": "lo",
                                  "max_model_len": 4096, "port": port, "data_parallel_rpc_port": rpc})
    hosts = [NodeFacts(name=name, address=ip, npu_count=1, chip="910B3")
             for name, ip in (("node-a", head_ip), ("node-b", worker_ip))]
    instance = plan_instances(service, hosts, network=network)[0]
    stand_in = tmp_path / "vllm_main.py"
    stand_in.write_text(wheelhouse.STAND_IN_VLLM_MAIN)
    ranks = {server["server_id"]: [device["device_ip"] for device in server["device"]]
             for server in instance.rank_table["server_list"]}
    nodes = []
    try:
        for role in instance.nodes:
            env = {**role.env, "ASCEND_RT_VISIBLE_DEVICES": role.visible_devices,
                   "DSCTL_ENGINE_NPU_IPS": ",".join(local[ip] for ip in ranks[role.address]),
                   "DSCTL_ENGINE_TIME_SCALE": SCALE, "DSCTL_ENGINE_STARTUP": "0"}
            argv = [*role.argv[1:], "--max-model-len", "4096"] + (["--host", role.address] if role.is_head else [])
            nodes.append(Node(tmp_path, role.host, argv, env, stand_in=stand_in))
            if role.is_head:  # loaded, waiting for its remote rank: nothing serves yet
                nodes[0].wait_for("Waiting for 1 remote rank(s) to link")
                time.sleep(0.3)
                assert refuses(head_ip, port), "the head listened before every rank was up"
        head, worker = nodes
        head.wait_for(READY_LINE)
        worker.wait_for(WORKER_READY)
        assert "HELLO from remote engine(s) 1" in head.log.read_text()
        assert "All 2 ranks of the instance linked and ready" in head.log.read_text()
        assert http(head_ip, port, "GET", "/health")[0] == 200
        status, body = http(head_ip, port, "POST", "/v1/completions",
                            {"model": "/models/DeepSeek-V2-Lite", "prompt": "hello there", "max_tokens": 4})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
        head.proc.send_signal(signal.SIGTERM)  # the head tells its workers to shut down
        assert head.wait() == 0 and worker.wait() == 0
        assert "Shutting down." in worker.log.read_text()
    finally:
        for node in nodes:
            node.stop()


def test_killing_the_worker_while_serving_stalls_the_instance_until_hccl_gives_up(tmp_path):
    head_ip, worker_ip, head_npu, worker_npu = addresses(4)
    port, rpc = free_port(), free_port()
    common = {"ASCEND_RT_VISIBLE_DEVICES": "0", "HCCL_CONNECT_TIMEOUT": "120", "HCCL_EXEC_TIMEOUT": "120"}
    head = Node(tmp_path, "head", engine_args(head_ip, port, head_ip, rpc),
                {**common, "HCCL_IF_IP": head_ip, "DSCTL_ENGINE_NPU_IPS": head_npu})
    worker = Node(tmp_path, "worker", engine_args(worker_ip, port, head_ip, rpc, "--headless",
                                                  "--data-parallel-start-rank", "1"),
                  {**common, "HCCL_IF_IP": worker_ip, "DSCTL_ENGINE_NPU_IPS": worker_npu})
    try:
        head.wait_for(READY_LINE)
        worker.wait_for(WORKER_READY)
        assert http(head_ip, port, "POST", "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 2})[0] \
            == 200
        worker.proc.kill()
        worker.proc.wait()
        time.sleep(0.5)  # the kernel closes the dead worker's sockets at once; let the head's link reader see it
        assert http(head_ip, port, "GET", "/health")[0] == 200  # idle, vLLM notices nothing: no collective runs
        began = time.monotonic()
        status, body = http(head_ip, port, "POST", "/v1/completions",
                            {"model": MODEL, "prompt": "a b", "max_tokens": 8, "stream": True})
        stalled = time.monotonic() - began
        assert status == 200 and b"[DONE]" not in body and b'"text"' not in body  # not one token, then cut off
        assert stalled >= 120 * float(SCALE) * 0.9, stalled
        assert head.wait() == 1
        err, log = head.err.read_text(), head.log.read_text()
        assert "remote rank(s) 1 did not join (EI0002)" in err and "EngineDeadError" in err
        assert "The wait execution of the Notify register times out" in log and "remote rank: [1]" in log
        assert refuses(head_ip, port)
    finally:
        head.stop()
        worker.stop()


# --------------------------------------------------------------------------- ranks that never join


def test_a_worker_that_never_comes_fails_the_head_after_hccl_connect_timeout_naming_its_rank(tmp_path):
    head_ip, head_npu = addresses(2)
    port = free_port()
    head = Node(tmp_path, "head", engine_args(head_ip, port, head_ip, free_port()),
                {"ASCEND_RT_VISIBLE_DEVICES": "0", "HCCL_CONNECT_TIMEOUT": "120", "DSCTL_ENGINE_NPU_IPS": head_npu})
    try:
        head.wait_for("Waiting for 1 remote rank(s) to link")
        waiting = time.monotonic()
        while head.proc.poll() is None:
            assert refuses(head_ip, port), "the head listened without its remote rank"
            time.sleep(0.1)
        waited = time.monotonic() - waiting
        assert head.wait() == 1 and 120 * float(SCALE) * 0.9 <= waited < 10, waited
        err = head.err.read_text()
        assert "[Wait][LinkEstablish]wait socket establish timeout, role[0] rank[0] timeout[120 s]" in err
        assert "|  unknown(1)   |  16666  |" in err and "server  | time out" in err  # rank 1 never came
        assert "Getting socket times out" in err and "Failed core proc(s): {'EngineCore_DP0': 1}" in err
        assert READY_LINE not in head.log.read_text()
    finally:
        head.stop()


def test_an_npu_whose_address_is_not_on_the_plane_times_out_on_both_sides_naming_the_rank(tmp_path):
    """The worker's NPU holds an address that is on no interface (a link down): its link can never leave it."""
    head_ip, worker_ip, head_npu = addresses(3)
    port, rpc = free_port(), free_port()
    common = {"ASCEND_RT_VISIBLE_DEVICES": "0", "HCCL_CONNECT_TIMEOUT": "120"}
    head = Node(tmp_path, "head", engine_args(head_ip, port, head_ip, rpc),
                {**common, "DSCTL_ENGINE_NPU_IPS": head_npu})
    worker = Node(tmp_path, "worker", engine_args(worker_ip, port, head_ip, rpc, "--headless",
                                                  "--data-parallel-start-rank", "1"),
                  {**common, "HCCL_IF_IP": worker_ip, "DSCTL_ENGINE_NPU_IPS": "192.0.2.77"})  # TEST-NET-1: not ours
    try:
        assert head.wait() == 1 and worker.wait() == 1
        head_err, worker_err = head.err.read_text(), worker.err.read_text()
        assert "|  192.0.2.77(1)   |  16666  |" in head_err  # the worker said HELLO: the head knows its address
        assert "role[1] rank[1] timeout[120 s]" in worker_err
        assert f"|  {head_npu}(0)   |  16666  |   192.0.2.77(1)   |  0  |  client  | time out" in worker_err
        assert "Getting socket times out" in worker_err
    finally:
        head.stop()
        worker.stop()


def test_a_worker_without_its_head_gives_up_after_vllms_handshake_timeout(tmp_path):
    worker_ip, worker_npu = addresses(2)
    worker = Node(tmp_path, "worker", [MODEL, *LAYOUT, "--time-scale", "0.01", "--headless",
                                       "--data-parallel-start-rank", "1", "--data-parallel-address", worker_ip,
                                       "--data-parallel-rpc-port", str(free_port())],
                  {"ASCEND_RT_VISIBLE_DEVICES": "0", "DSCTL_ENGINE_NPU_IPS": worker_npu})
    try:
        assert worker.wait() == 1
        assert 300 * 0.01 * 0.9 <= time.monotonic() - worker.started < 12
        assert worker.err.read_text().splitlines()[-1] == \
            "RuntimeError: Did not receive response from front-end process within 5 minutes"
    finally:
        worker.stop()


def test_the_head_refuses_a_worker_that_claims_its_rank_in_vllms_words(tmp_path):
    head_ip, worker_ip, head_npu, worker_npu = addresses(4)
    port, rpc = free_port(), free_port()
    head = Node(tmp_path, "head", engine_args(head_ip, port, head_ip, rpc, "--startup", "50"),  # still loading
                {"ASCEND_RT_VISIBLE_DEVICES": "0", "DSCTL_ENGINE_NPU_IPS": head_npu})
    head.wait_for("Starting to load model")
    worker = Node(tmp_path, "worker", engine_args(worker_ip, port, head_ip, rpc, "--headless",
                                                  "--data-parallel-start-rank", "0", "--time-scale", "0.01"),
                  {"ASCEND_RT_VISIBLE_DEVICES": "0", "DSCTL_ENGINE_NPU_IPS": worker_npu})
    try:
        assert head.wait() == 1
        assert head.err.read_text().strip() == \
            "RuntimeError: HELLO message from remote engine 0, expected it to be local"
    finally:
        head.stop()
        worker.stop()


# --------------------------------------------------------------------------- flags, as vLLM takes them


@pytest.mark.parametrize(("argv", "words"), [
    (["--data-parallel-size", "2", "--data-parallel-size-local", "3"],
     "Value error, data_parallel_size_local (3) must be <= data_parallel_size (2)"),
    (["--headless", "--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-start-rank", "2"],
     "Value error, data_parallel_rank (2) must be in the range [0, 2)"),
    (["--headless", "--data-parallel-size", "2", "--data-parallel-size-local", "0"],
     "ValueError: data_parallel_size_local must be > 0 in headless mode"),
    (["--headless", "--api-server-count", "2", "--data-parallel-size", "2", "--data-parallel-size-local", "1"],
     "ValueError: api_server_count can't be set in headless mode"),
    (["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-start-rank", "1"],
     "hybrid (or, with one local rank, external) data-parallel load balancing"),
    (["-dp", "2", "-dpl", "0"], "an API-only head (--data-parallel-size-local 0"),
    (["-dp", "4", "-dpl", "2", "-tp", "1"],  # two local ranks on one visible NPU
     "please ensure that world_size (2) is less than than max local gpu count (1)"),
    (["-dp", "2", "-dpl", "1", "--data-parallel-rpc-port", "70000"], "--data-parallel-rpc-port must be 1..65535"),
    (["--headless", "-dp", "2", "-dpl", "1", "--data-parallel-hybrid-lb"],
     "AssertionError: data_parallel_hybrid_lb is not applicable in headless mode"),
    (["-dp", "2", "-dpl", "2", "--data-parallel-rank", "1"],
     "AssertionError: data_parallel_size_local must be 1 when data_parallel_rank is set"),
    (["-dp", "2", "--data-parallel-backend", "ray"], "--data-parallel-backend ray (Ray places the remote DP ranks)"),
])
def test_multi_node_flags_are_refused_in_vllms_words(capsys, monkeypatch, argv, words):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")
    assert engine_main(["serve", MODEL, "--enable-expert-parallel", "--port", "0", *argv]) == 1
    err = capsys.readouterr().err
    assert words in err, err


def test_the_flags_types_are_argparses(capsys):
    with pytest.raises(SystemExit) as exited:
        engine_main(["serve", MODEL, "--data-parallel-size-local", "two"])
    assert exited.value.code == 2
    assert "argument --data-parallel-size-local/-dpl: invalid int value: 'two'" in capsys.readouterr().err


def test_a_taken_handshake_port_is_zmqs_address_in_use(capsys, monkeypatch):
    (address,) = addresses(1)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("DSCTL_ENGINE_NPU_IPS", address)
    with socket.socket() as taken:
        taken.bind((address, 0))
        taken.listen()
        rpc = taken.getsockname()[1]
        status = engine_main(["serve", MODEL, *LAYOUT, "--host", address, "--port", "0", "--data-parallel-address",
                              address, "--data-parallel-rpc-port", str(rpc)])
    assert status == 1
    assert f"zmq.error.ZMQError: Address already in use (addr='tcp://{address}:{rpc}')" in capsys.readouterr().err


def test_the_stand_in_hands_the_multi_node_flags_to_the_engine():
    from dsctl.engine.__main__ import build_parser

    module: dict = {"__name__": "stand_in"}
    exec(compile(wheelhouse.STAND_IN_VLLM_MAIN, "vllm/entrypoints/cli/main.py", "exec"), module)
    flags = ["--headless", "--data-parallel-size", "4", "-dpl", "2", "--data-parallel-start-rank", "2",
             "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13389", "--api-server-count", "0"]
    parser = build_parser()
    assert module["unrecognized"](flags, parser) == []
    assert module["engine_argv"]([MODEL, *flags], parser, module["load_models"], {})[1] == []  # nothing dropped


# --------------------------------------------------------------------------- HCCL's settings, the NPUs' addresses


def test_hccl_timeouts_from_the_environment():
    from dsctl.engine.cluster import timeouts

    default, warnings = timeouts({}, 1, "8.0.0")
    assert (default.connect_s, default.connect_wait_s, default.stall_s, default.stall_by) == (120, 120, 1836, "hccl")
    assert not warnings
    # CANN 8.2 and later wait 20 s more than the value; a value out of 120..7200 is clamped, with a warning.
    later, _ = timeouts({"HCCL_CONNECT_TIMEOUT": "1200"}, 1, "8.3.RC2")
    assert (later.connect_s, later.connect_wait_s) == (1200, 1220)
    clamped, warnings = timeouts({"HCCL_CONNECT_TIMEOUT": "3"}, 1, None)
    assert clamped.connect_s == 120 and "outside 120..7200" in warnings[0]
    # TP > 1: vLLM's execute_model RPC (300 s) gives up before HCCL (1836 s); HCCL_EXEC_TIMEOUT=0 never does.
    assert timeouts({}, 4, None)[0].stall_by == "rpc" and timeouts({}, 4, None)[0].stall_s == 300
    assert timeouts({"HCCL_EXEC_TIMEOUT": "0"}, 1, None)[0].stall_s is None
    assert timeouts({"HCCL_EXEC_TIMEOUT": "0", "HCCL_OP_EXPANSION_MODE": "AIV"}, 1, None)[0].stall_s == 1091


def test_the_npus_addresses_come_from_hccn_tool(tmp_path, monkeypatch):
    """Without DSCTL_ENGINE_NPU_IPS the engine asks hccn_tool (the lab's answers what the lab's NPU holds)."""
    from dsctl.engine.cluster import device_ips

    tool = tmp_path / "hccn_tool"
    tool.write_text("#!/bin/sh\n"  # the emulated hccn_tool's output lines (dsctl.emu.hccn_tool)
                    'if [ "$2" = 3 ]; then echo "Get ipconf failed, because no ip was preset there!"; exit 1; fi\n'
                    'echo "ipaddr:10.79.$2.11"; echo "netmask:255.255.255.0"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    found, missing = device_ips([0, 3, 5], {})
    assert found == {0: "10.79.0.11", 5: "10.79.5.11"}
    assert missing == {3: "Get ipconf failed, because no ip was preset there!"}
    assert device_ips([4, 5], {"DSCTL_ENGINE_NPU_IPS": "127.9.0.4"}) == (
        {4: "127.9.0.4"}, {5: "DSCTL_ENGINE_NPU_IPS gives no address for NPU 5"})
