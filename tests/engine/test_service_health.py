"""playbooks/library/service_health.py against the real emulated engine (`python -m dsctl.engine serve`).

The logic (`wait_healthy`) is imported straight from the module file; a few cases also run through
`ansible localhost -m service_health` so argument spec, no_log and check mode are exercised for real.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import free_port

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "playbooks" / "library"
BIN = Path(sys.executable).parent
MODEL = "deepseek-r1-distill-qwen-7b"
KEY = "sh-test-key-5d1c"
WRONG_KEY = "sh-bogus-key-93fa"
READY_LINE = "Uvicorn running on"
OOM = "NPU out of memory. Tried to allocate"


def load_module():
    spec = importlib.util.spec_from_file_location("service_health", LIBRARY / "service_health.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sh = load_module()


class Engine:
    """The engine with stdout and stderr in one log, as supervisor/systemd write it; reaped in the background
    so that `kill -0 PID` reports its death (a zombie would still answer)."""

    def __init__(self, tmp: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"engine-{self.port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dsctl.engine", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--time-scale", "0.01", *args], stdout=out, stderr=subprocess.STDOUT)
        threading.Thread(target=self.proc.wait, daemon=True).start()
        self.process_check = ["sh", "-c", f"kill -0 {self.proc.pid} 2>/dev/null && echo RUNNING || echo EXITED"]

    def wait_ready(self, timeout: float = 20.0) -> Engine:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.log.read_text():
                return self
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.02)
        raise AssertionError("engine did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    served = Engine(tmp_path_factory.mktemp("health"), MODEL, "--startup", "0", "--max-model-len", "4096",
                    "--api-key", KEY).wait_ready()
    yield served
    served.stop()


@pytest.fixture
def dying(tmp_path):
    """deepseek-v3 on one 910B3: loads weights until HBM is full (about 1.4 s wall), then OOMs."""
    started = Engine(tmp_path, "deepseek-v3", "--startup", "3000")
    yield started
    started.stop()


def ansible(tmp_path: Path, args: dict, *extra: str) -> tuple[int, dict, str]:
    env = {**os.environ, "ANSIBLE_LIBRARY": str(LIBRARY), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote-tmp"), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", "-m", "service_health", "-a", json.dumps(args),
         "-M", str(LIBRARY), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert "=>" in done.stdout, output
    return done.returncode, json.loads(done.stdout.split("=>", 1)[1]), output


# --------------------------------------------------------------------------- kind openai (vLLM)


def test_healthy_engine_is_ready_with_every_check(engine):
    result = sh.wait_healthy(engine.url, MODEL, log_file=str(engine.log), api_key=KEY, timeout=20,
                             process_check=engine.process_check, process_running_pattern="RUNNING")
    assert result["healthy"] is True, result
    assert result["checks"] == ["process", "health", "models", "completion"]
    assert result["elapsed"] < 5
    assert "log_tail" not in result and result["process_status"] == "RUNNING"
    assert KEY not in repr(result)


def test_starting_engine_is_waited_for(tmp_path):
    started = Engine(tmp_path, MODEL, "--startup", "150", "--max-model-len", "4096")  # 1.5 s to come up
    try:
        result = sh.wait_healthy(started.url, MODEL, log_file=str(started.log), timeout=20, interval=0.1,
                                 process_check=started.process_check, process_running_pattern="RUNNING")
    finally:
        started.stop()
    assert result["healthy"] is True, result
    assert 1.0 < result["elapsed"] < 10


def test_wrong_api_key_fails_at_once_with_401_and_never_shows_the_key(engine):
    result = sh.wait_healthy(engine.url, MODEL, log_file=str(engine.log), api_key=WRONG_KEY, timeout=20)
    assert result["healthy"] is False
    assert result["msg"] == "GET /v1/models returned 401 Unauthorized: the api_key is wrong"
    assert result["failure_class"] == "unauthorized"
    assert result["checks"] == ["health"]
    assert result["elapsed"] < 3
    assert WRONG_KEY not in repr(result) and KEY not in repr(result)


def test_missing_api_key_says_the_server_wants_one(engine):
    result = sh.wait_healthy(engine.url, MODEL, timeout=20, completion=False)
    assert result["healthy"] is False
    assert "401 Unauthorized: the server requires an API key and api_key is not set" in result["msg"]


def test_model_not_served_fails_at_once(engine):
    result = sh.wait_healthy(engine.url, "qwen2.5-72b", api_key=KEY, timeout=20)
    assert result["healthy"] is False and result["failure_class"] == "rejected"
    assert f"model 'qwen2.5-72b' is not served by 127.0.0.1:{engine.port}; served: ['{MODEL}']" == result["msg"]
    assert result["elapsed"] < 3


def test_process_dying_during_start_up_fails_fast_with_the_oom_line(dying):
    result = sh.wait_healthy(dying.url, "deepseek-v3", log_file=str(dying.log), timeout=60, interval=0.1,
                             process_check=dying.process_check, process_running_pattern="RUNNING", log_lines=5)
    assert result["healthy"] is False
    assert 0.5 < result["elapsed"] < 10  # polled while it loaded, failed at its death, not at the 60 s timeout
    assert result["msg"].startswith("instance exited during start-up: RuntimeError: Engine core initialization "
                                    "failed. See root cause above.")
    assert f"(root cause: RuntimeError: {OOM}" in result["msg"]
    assert result["failure_class"] == "oom"
    assert result["process_status"] == "EXITED" and result["checks"] == []
    assert len(result["log_tail"]) == 5 and any(OOM in line for line in result["log_tail"])
    assert result["log_tail"][-1].startswith("RuntimeError: Engine core initialization failed")


class FakeClock:
    """Time that passes only when the module sleeps (a start-up polled for 20 s in no time)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_the_process_check_runs_every_few_seconds_and_before_the_deadline_not_every_round(tmp_path):
    """supervisorctl costs ~0.2 s of CPU a call: a 20 s start-up polled every second checks the process 6 times
    (at 0, 5, 10, 15 s and in the two rounds that reach the deadline), not 21; the message still lists it."""
    clock, runs = FakeClock(), tmp_path / "runs"
    result = sh.wait_healthy(f"http://127.0.0.1:{free_port()}", MODEL, timeout=20, interval=1.0, clock=clock,
                             sleep=clock.sleep, process_check=["sh", "-c", f"echo run >> {runs}; echo RUNNING"])
    assert result["failure_class"] == "timeout" and result["msg"].endswith("checks passed: process")
    assert len(runs.read_text().splitlines()) == 6


def test_a_process_that_dies_between_checks_is_named_at_the_next_one(tmp_path):
    clock, flag = FakeClock(), tmp_path / "dead"
    original_sleep = clock.sleep

    def sleep(seconds):
        original_sleep(seconds)
        if clock.now >= 7:
            flag.touch()

    result = sh.wait_healthy(f"http://127.0.0.1:{free_port()}", MODEL, timeout=60, interval=1.0, clock=clock,
                             sleep=sleep, process_check=["sh", "-c", f"test -e {flag} && echo EXITED || echo RUNNING"],
                             process_running_pattern="RUNNING")
    assert result["failure_class"] == "exited" and result["process_status"] == "EXITED"
    assert clock.now == 10  # the check at 10 s, the first after its death at 7 s


def test_nothing_listening_times_out_with_a_clear_message(tmp_path):
    port = free_port()
    log = tmp_path / "instance.log"
    log.write_text("INFO starting\nINFO Starting to load model x...\n")
    result = sh.wait_healthy(f"http://127.0.0.1:{port}", MODEL, log_file=str(log), timeout=1.5, interval=0.2,
                             process_check=["echo", "RUNNING"])
    assert result["healthy"] is False and result["failure_class"] == "timeout"
    assert 1.4 <= result["elapsed"] < 4
    assert result["msg"] == ("instance not ready after 1.5s (timeout): connection refused (nothing listening "
                             "yet); checks passed: process")
    assert result["log_tail"] == ["INFO starting", "INFO Starting to load model x..."]


def test_process_check_that_cannot_run_fails(tmp_path):
    result = sh.wait_healthy(f"http://127.0.0.1:{free_port()}", MODEL, timeout=5,
                             process_check=["/nonexistent/supervisorctl", "status", "x"])
    assert result["healthy"] is False and result["elapsed"] < 2
    assert result["msg"].startswith("process_check cannot run '/nonexistent/supervisorctl'")


@pytest.mark.parametrize(("output", "pattern", "alive"), [
    ("dsctl-chat-0                     RUNNING   pid 4242, uptime 0:00:07", "RUNNING|STARTING", True),
    ("dsctl-chat-0                     BACKOFF   Exited too quickly", "RUNNING|STARTING", False),
    ("dsctl-chat-0                     FATAL     Exited too quickly", "RUNNING|STARTING", False),
    ("activating", "^active|^activating", True),
    ("failed", "^active|^activating", False),
    ("inactive", "^active|^activating", False),
    ("false", "^true", False),
])
def test_process_patterns_of_supervisor_systemd_and_docker(output, pattern, alive):
    assert sh.process_alive(["printf", "%s\n", output], pattern, 5) == (alive, output)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="model is required"):
        sh.wait_healthy("http://127.0.0.1:1", timeout=0)
    with pytest.raises(ValueError, match="log_file is required"):
        sh.wait_healthy("http://127.0.0.1:1", kind="mindie", timeout=0)
    with pytest.raises(ValueError, match="url must be"):
        sh.wait_healthy("ftp://x", MODEL, timeout=0)


def test_documentation_parses_and_matches_the_options():
    import inspect

    import yaml

    doc = yaml.safe_load(sh.DOCUMENTATION)
    yaml.safe_load(sh.EXAMPLES)
    returns = yaml.safe_load(sh.RETURN)
    params = [name for name in inspect.signature(sh.wait_healthy).parameters if name not in ("clock", "sleep")]
    assert sorted(doc["options"]) == sorted(params)
    assert set(returns) >= {"healthy", "elapsed", "checks", "log_tail", "msg"}
    source = (LIBRARY / "service_health.py").read_text()
    assert '"api_key": {"type": "str", "no_log": True}' in source
    for name, option in doc["options"].items():
        assert f'"{name}": {{"type": "{option["type"]}"' in source, name


# --------------------------------------------------------------------------- kind mindie


def test_mindie_is_ready_on_its_log_marker_and_port(engine, tmp_path):
    log = tmp_path / "mindie.log"
    log.write_text("[INFO] loading\nDaemon start success!\n")
    result = sh.wait_healthy(engine.url, MODEL, kind="mindie", log_file=str(log), api_key=KEY, timeout=10)
    assert result["healthy"] is True, result
    assert result["checks"] == ["log_marker", "port", "completion"]


def test_mindie_marker_from_an_earlier_run_is_ignored(engine, tmp_path):
    log = tmp_path / "mindie.log"
    log.write_text("Daemon start success!\n")
    result = sh.wait_healthy(engine.url, kind="mindie", log_file=str(log), timeout=0.5, interval=0.1,
                             since=time.time() + 60, completion=False)
    assert result["healthy"] is False
    assert "the log does not show 'Daemon start success!' yet" in result["msg"]
    assert result["log_tail"] == []


def test_mindie_marker_of_the_previous_run_in_an_appended_log_does_not_count(engine, tmp_path):
    # supervisor and systemd (StandardOutput=append:) append to the log across restarts: the previous run's
    # "Daemon start success!" is still in the file, and the file is fresh (the new run writes to it).
    log = tmp_path / "mindie.log"
    log.write_text("[INFO] loading\nDaemon start success!\nstopping\n")
    since, size = time.time(), log.stat().st_size
    with log.open("a") as out:
        out.write("[INFO] loading again\n")
    waiting = sh.wait_healthy(engine.url, kind="mindie", log_file=str(log), timeout=0.5, interval=0.1,
                              since=since, since_log_size=size, completion=False)
    assert waiting["healthy"] is False
    assert "the log does not show 'Daemon start success!' yet" in waiting["msg"]
    assert waiting["log_tail"] == ["[INFO] loading again"]
    # without the restart's offset the stale marker would have passed
    assert sh.wait_healthy(engine.url, kind="mindie", log_file=str(log), timeout=0.5, since=since,
                           completion=False)["healthy"] is True
    with log.open("a") as out:
        out.write("Daemon start success!\n")
    ready = sh.wait_healthy(engine.url, kind="mindie", log_file=str(log), timeout=5, interval=0.1, since=since,
                            since_log_size=size, completion=False)
    assert ready["healthy"] is True and ready["checks"] == ["log_marker", "port"]


def test_a_log_rotated_since_the_restart_is_read_whole(tmp_path):
    log = tmp_path / "instance.log"
    log.write_text("RuntimeError: NPU out of memory. Tried to allocate 2 GiB\n")
    result = sh.wait_healthy(f"http://127.0.0.1:{free_port()}", MODEL, log_file=str(log), timeout=0.3,
                             interval=0.1, since=time.time() - 5, since_log_size=1 << 20,
                             process_check=["echo", "EXITED"], process_running_pattern="RUNNING")
    assert result["failure_class"] == "oom" and result["log_tail"] == [log.read_text().strip()]


@pytest.mark.parametrize("line", [
    "[ERROR] RUNTIME: aclrtMalloc failed, size=2147483648, error code is 207001",
    "EL0004: Failed to allocate memory. ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED",
])
def test_the_cann_runtimes_allocation_failure_is_out_of_memory(line):
    # field-practice.md: the words a health gate must recognise as out of memory
    assert sh.root_cause(["INFO loading weights", line, "Traceback (most recent call last):"]) == ("oom", line)


def test_stale_lines_give_no_root_cause(tmp_path):
    # the previous run died of OOM; the new one exits without a word: its failure is not the old OOM
    log = tmp_path / "instance.log"
    log.write_text("RuntimeError: NPU out of memory. Tried to allocate 2 GiB\n")
    size = log.stat().st_size
    with log.open("a") as out:
        out.write("INFO starting\n")
    result = sh.wait_healthy(f"http://127.0.0.1:{free_port()}", MODEL, log_file=str(log), timeout=5,
                             since=time.time() - 5, since_log_size=size, process_check=["echo", "EXITED"],
                             process_running_pattern="RUNNING")
    assert result["failure_class"] == "exited"
    assert result["msg"] == "instance exited during start-up: INFO starting"
    assert result["log_tail"] == ["INFO starting"]


# --------------------------------------------------------------------------- through Ansible


def test_ansible_healthy_without_showing_the_key(engine, tmp_path):
    rc, result, output = ansible(tmp_path, {
        "url": engine.url, "model": MODEL, "api_key": KEY, "log_file": str(engine.log), "timeout": 20,
        "process_check": engine.process_check, "process_running_pattern": "RUNNING"})
    assert rc == 0, output
    assert result["healthy"] is True and result["changed"] is False
    assert result["checks"] == ["process", "health", "models", "completion"]
    assert KEY not in output


def test_ansible_dead_process_fails_fast(dying, tmp_path):
    began = time.monotonic()
    rc, result, output = ansible(tmp_path, {
        "url": dying.url, "model": "deepseek-v3", "log_file": str(dying.log), "timeout": 60, "interval": 0.2,
        "process_check": dying.process_check, "process_running_pattern": "RUNNING"})
    assert rc != 0
    assert time.monotonic() - began < 15
    assert result["healthy"] is False and result["failure_class"] == "oom"
    assert result["msg"].startswith("instance exited during start-up: ") and OOM in result["msg"]
    assert any(OOM in line for line in result["log_tail"])


def test_ansible_wrong_key_and_check_mode(engine, tmp_path):
    args = {"url": engine.url, "model": MODEL, "api_key": WRONG_KEY, "timeout": 20}
    rc, result, output = ansible(tmp_path, args)
    assert rc != 0 and "401 Unauthorized: the api_key is wrong" in result["msg"]
    assert WRONG_KEY not in output
    rc, result, output = ansible(tmp_path, args, "--check")
    assert rc == 0, output
    assert result["healthy"] is None and result["changed"] is False
