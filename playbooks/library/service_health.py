#!/usr/bin/python
"""Wait until a freshly (re)started inference instance serves, or say why it never will.

Runs on the serving host right after the deploy role (re)starts an instance.  Readiness follows
shared/reference/serving-and-tuning.md section 11: vLLM is ready when GET /health is 200 and GET /v1/models
lists the model; MindIE when its log prints ``Daemon start success!``.  On top of that one real one-token
completion proves the engine generates.  A process that dies during start-up fails the task at once (with
the root cause from its log) instead of waiting out the timeout.

Stdlib only; ``wait_healthy`` is the whole logic and is importable without Ansible.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: service_health
short_description: Wait until an inference instance (vLLM or MindIE) is ready to serve
description:
  - Polls the instance until it is ready or O(timeout) passes.  A round first runs O(process_check) (the first
    round, then at most every 5 seconds, and the last round before the deadline); when its output no longer
    matches O(process_running_pattern) the instance died and the task fails at once with the instance log's last
    line and root cause (out of memory, graph capture, device busy, missing library).
  - O(kind=openai) (vLLM) is ready when C(GET /health) returns 200, C(GET /v1/models) lists O(model) and, with
    O(completion), C(POST /v1/completions) (prompt C(ping), C(max_tokens) 1) returns 200 with C(usage).
  - O(kind=mindie) is ready when O(log_file) contains C(Daemon start success!), the port accepts a TCP
    connection and, with O(completion), C(POST /v1/chat/completions) returns 200.
  - A 401 (wrong or missing O(api_key)), a model the server does not serve and a completion refused with 400/404
    fail at once; connection errors, timeouts and 5xx answers are retried.
  - Never changes the host.  In check mode nothing is probed and RV(healthy) is null.
options:
  url:
    description: Base URL of the instance, for example C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: Served model name (vLLM's C(--served-model-name)); required for O(kind=openai).
    type: str
  kind:
    description: The engine's API and readiness signal.
    type: str
    choices: [openai, mindie]
    default: openai
  log_file:
    description:
      - The instance log (stdout and stderr).  Its tail is returned on failure and gives the message when the
        process dies.  Required for O(kind=mindie).
    type: path
  timeout:
    description: Seconds to wait for readiness.
    type: float
    default: 900
  interval:
    description: Seconds between rounds.
    type: float
    default: 1
  api_key:
    description: "Sent as C(Authorization: Bearer KEY).  Never returned."
    type: str
  process_check:
    description:
      - Command (argv list, no shell) whose output (stdout and stderr) tells whether the instance process is
        alive, for example C([supervisorctl, status, dsctl-chat-0]), C([systemctl, is-active, dsctl-chat-0]) or
        C([docker, inspect, -f, "{{.State.Running}}", dsctl-chat-0]).  Its exit status is ignored.
      - In a playbook, Go templates such as C({{.State.Running}}) must be kept from Jinja, for example with the
        C(!unsafe) tag.
      - Omitted, a dead process is only noticed as a timeout.
    type: list
    elements: str
  process_running_pattern:
    description:
      - Regular expression (multi-line search) the O(process_check) output matches while the process is alive,
        for example C(RUNNING|STARTING), C(^active|^activating) or C(^true).
      - Note that C(systemctl is-active) reports C(activating) while a C(Restart=) unit waits to restart.
    type: str
    default: RUNNING|STARTING
  completion:
    description: Also require one real one-token completion.
    type: bool
    default: true
  log_lines:
    description: How many lines of O(log_file) RV(log_tail) carries.
    type: int
    default: 30
  since:
    description:
      - Epoch seconds (the host's clock) of the (re)start.  Log lines written before it belong to an earlier run
        and never count (no MindIE C(Daemon start success!) of the previous run, no stale log tail or root cause).
      - A O(log_file) last modified before O(since) holds nothing of this run.  Managers append to the log across
        restarts, so give O(since_log_size) too (the bytes before it are the earlier runs').
    type: float
  since_log_size:
    description:
      - Size in bytes of O(log_file) at O(since), taken right before the restart.  Only what follows that offset
        is read; a log now smaller than it was rotated or truncated since and is read whole.
    type: int
author: dsctl
"""

EXAMPLES = r"""
- name: Wait for the chat instance
  service_health:
    url: http://127.0.0.1:8000
    model: deepseek-r1-distill-qwen-7b
    log_file: /var/log/dsctl/dsctl-chat-0.log
    api_key: "{{ dsctl_api_key }}"
    process_check: [supervisorctl, status, dsctl-chat-0]
    process_running_pattern: RUNNING|STARTING
    timeout: 900
"""

RETURN = r"""
healthy:
  description: Whether the instance is ready; null in check mode.
  returned: always
  type: bool
elapsed:
  description: Seconds spent waiting.
  returned: always
  type: float
checks:
  description: The checks that passed in the last round, in order (process, health, models, log_marker, port,
    completion).
  returned: always
  type: list
  elements: str
failure_class:
  description: Start-up failure class recognised in the log (oom, graph_capture, device_busy, missing_library,
    startup_error) or C(exited) / C(unauthorized) / C(timeout) / C(rejected).
  returned: on failure
  type: str
process_status:
  description: Last output line of O(process_check).
  returned: when process_check is given
  type: str
log_tail:
  description: The last O(log_lines) lines of O(log_file).
  returned: on failure
  type: list
  elements: str
msg:
  description: "What happened; on a dead process C(instance exited during start-up: <last non-empty log line>)."
  returned: always
  type: str
"""

import http.client  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

PROBE_TIMEOUT_S = 5.0  # /health, /v1/models, TCP connect
COMPLETION_TIMEOUT_S = 30.0  # the first generation after start-up may warm kernels up
PROCESS_CHECK_TIMEOUT_S = 15.0
# The process check runs on the first round, then once this long has passed since the last one, and on the round
# before the deadline: `supervisorctl status` costs about 0.2 s of CPU (it imports pkg_resources), and a start-up
# polled every second ran it dozens of times; an instance that dies is still named within this period.
PROCESS_CHECK_PERIOD_S = 5.0
TAIL_BYTES = 1 << 20
MINDIE_MARKER = "Daemon start success!"
# serving-and-tuning.md section 11, "Failure signatures"; first match in this order names the class. The CANN
# runtime's allocation failure (aclrtMalloc failed, ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED, code 207001) is out of
# memory too: the words field-practice.md ("Memory env") says a health gate must recognise.
FAILURE_SIGNATURES = (
    ("oom", re.compile(r"out of memory|No available memory for the cache blocks|OutOfMemory|aclrtMalloc failed|"
                       r"ACL_ERROR_RT_MEMORY_ALLOCATION", re.I)),
    ("graph_capture", re.compile(r"error code is 207008")),
    ("device_busy", re.compile(r"ret is -8020")),
    ("missing_library", re.compile(r"cannot open shared object file")),
    ("startup_error", re.compile(r"^\s*(?:\w+\.)*\w*(?:Error|Exception):\s|\bERROR\b")),
)
GENERIC_WRAPPERS = re.compile(r"See root cause above|EngineCore failed to start|Traceback \(most recent call")
# vLLM's configs are pydantic dataclasses: a refused value is "...ValidationError: 1 validation error for
# ModelConfig", the reason on the indented lines below it ("  Value error, User-specified max_model_len ...
# [type=value_error, ...]"), then a help link as the log's last line (vLLM 0.32, tests/realvllm).
CAUSE_MAX = 200
PYDANTIC_HEADER = re.compile(r"ValidationError: \d+ validation errors? for \w+")
PYDANTIC_FOOTER = re.compile(r"^\s*For further information visit https://errors\.pydantic\.dev/")
PYDANTIC_DETAIL = re.compile(r"\s*\[type=[^\]]*\]\s*$")


class Unhealthy(Exception):
    """Stop waiting: the instance will not become ready on its own."""

    def __init__(self, msg, failure_class):
        super().__init__(msg)
        self.failure_class = failure_class


# --------------------------------------------------------------------------- log


def read_log(path, since=None, since_log_size=None):
    """The last TAIL_BYTES of what the log got since the restart, as lines: the bytes after ``since_log_size``
    (all of them when the log is smaller now: rotated), nothing when it was last modified before ``since``;
    [] when missing."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            if since is not None and os.fstat(handle.fileno()).st_mtime < since:
                return []
            size = handle.seek(0, os.SEEK_END)
            start = since_log_size if since_log_size is not None and 0 <= since_log_size <= size else 0
            position = max(size - TAIL_BYTES, start)
            handle.seek(position)
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if position > start and lines:
        lines = lines[1:]  # the first line was cut
    return [line.rstrip() for line in lines]


def tail(lines, count):
    return lines[-count:] if count > 0 else []


def last_line(lines):
    return next((line.strip() for line in reversed(lines) if line.strip() and not PYDANTIC_FOOTER.search(line)), "")


def root_cause(lines):
    """(class, line): the most specific failure line of the log, the last one of its class (a pydantic
    ValidationError with the reasons indented under it)."""
    for name, pattern in FAILURE_SIGNATURES:
        for index in range(len(lines) - 1, -1, -1):
            line = lines[index]
            if pattern.search(line) and (name != "startup_error" or not GENERIC_WRAPPERS.search(line)):
                return name, with_pydantic_reasons(lines, index)
    return None, None


def with_pydantic_reasons(lines, index):
    """The line at ``index``, and when it is a pydantic ValidationError header, the reasons indented below it."""
    line = lines[index].strip()
    if not PYDANTIC_HEADER.search(line):
        return line
    reasons = []
    for below in lines[index + 1:index + 1 + 20]:  # bounded: a ValidationError lists a handful of fields
        if not below.startswith((" ", "\t")) or PYDANTIC_FOOTER.search(below):
            if PYDANTIC_FOOTER.search(below):
                continue
            break
        reasons.append(PYDANTIC_DETAIL.sub("", below.strip()))
    line = re.sub(r"^(?:\w+\.)+(?=ValidationError)", "", line)  # pydantic_core._pydantic_core.: no news to a reader
    return f"{line}: {'; '.join(r for r in reasons if r)}" if reasons else line


# --------------------------------------------------------------------------- process


def process_alive(argv, pattern, timeout):
    """(alive, last output line) from the process check; its exit status is ignored (is-active exits 3)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=max(timeout, 0.5), check=False)
    except subprocess.TimeoutExpired:
        return True, "process check timed out"  # a hung supervisor is not a dead instance; keep waiting
    except OSError as exc:
        raise Unhealthy(f"process_check cannot run {argv[0]!r}: {exc.strerror or exc}", "process_check") from None
    output = done.stdout.decode("utf-8", errors="replace")
    return bool(re.search(pattern, output, re.M)), last_line(output.splitlines())


# --------------------------------------------------------------------------- HTTP


class Endpoint:
    def __init__(self, url, api_key):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://HOST[:PORT], got {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key

    def request(self, method, path, timeout, body=None, auth=True):
        """(status, parsed JSON or text); OSError / HTTPException on transport errors."""
        headers = {"Accept": "application/json", "Connection": "close"}
        if auth and self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=max(timeout, 0.1))
        try:
            conn.request(method, self.prefix + path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read(1 << 20)
        finally:
            conn.close()
        text = raw.decode("utf-8", errors="replace")
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def connect(self, timeout):
        with socket.create_connection((self.host, self.port), timeout=max(timeout, 0.1)):
            return True


def describe(body):
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:300]
    return str(body).strip()[:300]


def check_status(what, status, body, api_key):
    """Raise Unhealthy for answers that retrying cannot fix; return False for retryable ones."""
    if status == 401:
        hint = "the api_key is wrong" if api_key else "the server requires an API key and api_key is not set"
        raise Unhealthy(f"{what} returned 401 Unauthorized: {hint}", "unauthorized")
    if status in (400, 403, 404):
        raise Unhealthy(f"{what} returned {status}: {describe(body)}", "rejected")
    return status == 200


def probe_openai(endpoint, model, completion, remaining, passed):
    """One round against vLLM's API; returns None when ready, else why not (retryable)."""
    status, body = endpoint.request("GET", "/health", min(PROBE_TIMEOUT_S, remaining()), auth=False)
    if status != 200:
        return f"GET /health returned {status}"
    passed.append("health")
    status, body = endpoint.request("GET", "/v1/models", min(PROBE_TIMEOUT_S, remaining()))
    if not check_status("GET /v1/models", status, body, endpoint.api_key):
        return f"GET /v1/models returned {status}"
    served = [entry.get("id") for entry in body.get("data", []) if isinstance(entry, dict)] \
        if isinstance(body, dict) else []
    if model not in served:
        raise Unhealthy(f"model {model!r} is not served by {endpoint.host}:{endpoint.port}; served: {served}",
                        "rejected")
    passed.append("models")
    if completion:
        what = "POST /v1/completions"
        status, body = endpoint.request("POST", "/v1/completions", min(COMPLETION_TIMEOUT_S, remaining()),
                                        body={"model": model, "prompt": "ping", "max_tokens": 1})
        if not check_status(what, status, body, endpoint.api_key):
            return f"{what} returned {status}: {describe(body)}"
        if not (isinstance(body, dict) and isinstance(body.get("usage"), dict)):
            return f"{what} answered 200 without usage"
        passed.append("completion")
    return None


def probe_mindie(endpoint, model, completion, remaining, passed, log):
    if not any(MINDIE_MARKER in line for line in log):
        return f"the log does not show {MINDIE_MARKER!r} yet"
    passed.append("log_marker")
    endpoint.connect(min(PROBE_TIMEOUT_S, remaining()))
    passed.append("port")
    if completion:
        what = "POST /v1/chat/completions"
        request = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}
        if model:
            request["model"] = model
        status, body = endpoint.request("POST", "/v1/chat/completions", min(COMPLETION_TIMEOUT_S, remaining()),
                                        body=request)
        if not check_status(what, status, body, endpoint.api_key):
            return f"{what} returned {status}: {describe(body)}"
        if not (isinstance(body, dict) and body.get("choices")):
            return f"{what} answered 200 without choices"
        passed.append("completion")
    return None


# --------------------------------------------------------------------------- the loop


def scrub(value, secret):
    """Remove the API key from anything returned (server answers might echo it)."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, "********")
    if isinstance(value, list):
        return [scrub(item, secret) for item in value]
    if isinstance(value, dict):
        return {key: scrub(item, secret) for key, item in value.items()}
    return value


def wait_healthy(url, model=None, kind="openai", log_file=None, timeout=900.0, interval=1.0, api_key=None,
                 process_check=None, process_running_pattern="RUNNING|STARTING", completion=True, log_lines=30,
                 since=None, since_log_size=None, clock=time.monotonic, sleep=time.sleep):
    """Poll until ready or timeout.  Returns a dict with healthy, elapsed, checks, msg (and on failure
    failure_class and log_tail; process_status when process_check is given).  Never raises for the instance's
    own failures; ValueError for bad arguments."""
    if kind not in ("openai", "mindie"):
        raise ValueError(f"kind must be openai or mindie, got {kind!r}")
    if kind == "openai" and not model:
        raise ValueError("model is required for kind=openai")
    if kind == "mindie" and not log_file:
        raise ValueError("log_file is required for kind=mindie (its readiness marker is a log line)")
    if process_check is not None and not process_check:
        raise ValueError("process_check must be a non-empty command list")
    try:
        re.compile(process_running_pattern)
    except re.error as exc:
        raise ValueError(f"process_running_pattern is not a valid regular expression: {exc}") from None
    endpoint = Endpoint(url, api_key or None)
    began = clock()
    deadline = began + max(float(timeout), 0.0)

    def remaining():
        return max(deadline - clock(), 0.1)

    result = {"healthy": False, "checks": []}
    reason = "no probe ran"
    checked_at = None  # when the process check last ran (it found the process alive then)
    while True:
        passed = []
        result["checks"] = passed
        try:
            if process_check:
                now = clock()
                if checked_at is None or now - checked_at >= PROCESS_CHECK_PERIOD_S or now + interval >= deadline:
                    alive, status_line = process_alive(list(process_check), process_running_pattern,
                                                       min(PROCESS_CHECK_TIMEOUT_S, remaining()))
                    result["process_status"] = status_line
                    if not alive:
                        log = read_log(log_file, since, since_log_size)
                        raise Unhealthy(exited_message(log, status_line), "exited")
                    checked_at = now
                passed.append("process")
            if kind == "openai":
                reason = probe_openai(endpoint, model, completion, remaining, passed)
            else:
                reason = probe_mindie(endpoint, model, completion, remaining, passed,
                                      read_log(log_file, since, since_log_size))
        except Unhealthy as exc:
            return finish(result, began, clock, False, str(exc), api_key, (log_file, since, since_log_size),
                          log_lines, exc.failure_class)
        except (OSError, http.client.HTTPException) as exc:
            reason = transport_error(exc)
        if reason is None:
            result["healthy"] = True
            return finish(result, began, clock, True, f"ready after {clock() - began:.1f}s: {', '.join(passed)}",
                          api_key)
        now = clock()
        if now >= deadline:
            done = ", ".join(passed) or "none"
            msg = f"instance not ready after {timeout:g}s (timeout): {reason}; checks passed: {done}"
            return finish(result, began, clock, False, msg, api_key, (log_file, since, since_log_size), log_lines,
                          "timeout")
        sleep(max(min(interval, deadline - now), 0.0))


def exited_message(log, status_line):
    last = last_line(log)
    _, cause = root_cause(log)
    if cause and PYDANTIC_DETAIL.sub("", last) in cause:  # the last line is the cause's own reason: say it once
        return "instance exited during start-up: " + clipped(cause)
    msg = "instance exited during start-up: " + (clipped(last) or f"(no log) process check says {status_line!r}")
    if cause and cause != last:
        msg += f" (root cause: {clipped(cause)})"
    return msg


def clipped(line):
    """A log line cut to CAUSE_MAX characters: the deploy's one-line error keeps room for what happened next
    (rolled back or not); the whole line is in the log tail the task returns."""
    return line if len(line) <= CAUSE_MAX else line[:CAUSE_MAX - 3] + "..."


def transport_error(exc):
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listening yet)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "request timed out"
    return f"{type(exc).__name__}: {exc}"


def finish(result, began, clock, healthy, msg, api_key, log=(None, None, None), log_lines=30, failure_class=None):
    """``log`` is (log_file, since, since_log_size)."""
    result["healthy"] = healthy
    result["elapsed"] = round(clock() - began, 2)
    result["msg"] = msg
    if not healthy:
        log = read_log(*log)
        cause_class, _ = root_cause(log)
        if failure_class == "exited" and cause_class:
            failure_class = cause_class
        result["failure_class"] = failure_class
        result["log_tail"] = tail(log, log_lines)
    return scrub(result, api_key)


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str"},
            "kind": {"type": "str", "choices": ["openai", "mindie"], "default": "openai"},
            "log_file": {"type": "path"},
            "timeout": {"type": "float", "default": 900},
            "interval": {"type": "float", "default": 1},
            "api_key": {"type": "str", "no_log": True},
            "process_check": {"type": "list", "elements": "str"},
            "process_running_pattern": {"type": "str", "default": "RUNNING|STARTING"},
            "completion": {"type": "bool", "default": True},
            "log_lines": {"type": "int", "default": 30},
            "since": {"type": "float"},
            "since_log_size": {"type": "int"},
        },
        required_if=[("kind", "openai", ("model",)), ("kind", "mindie", ("log_file",))],
        supports_check_mode=True,
    )
    if module.check_mode:
        module.exit_json(changed=False, healthy=None, elapsed=0.0, checks=[], msg="check mode: not probed")
    params = dict(module.params)
    try:
        result = wait_healthy(**params)
    except ValueError as exc:
        module.fail_json(msg=str(exc), healthy=False, elapsed=0.0, checks=[])
    if result["healthy"]:
        module.exit_json(changed=False, **result)
    module.fail_json(changed=False, **result)


if __name__ == "__main__":
    main()
