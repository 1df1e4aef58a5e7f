# Copyright: dsctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine-readable progress for dsctl: one JSON object per line, appended to $DSCTL_EVENTS_FILE."""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: dsctl_events
type: aggregate
short_description: Append one JSON event per line for dsctl to a file
description:
  - Writes playbook, play, task, per-host result and final stats events as JSON lines
    to the file named by C(DSCTL_EVENTS_FILE), flushing after every line, so that
    dsctl can show live progress and summarize the run.
  - Results of tasks with C(no_log) keep only the host, task and status.
  - Does nothing when C(DSCTL_EVENTS_FILE) is unset.
requirements:
  - enable in configuration (C(callbacks_enabled=dsctl_events))
options:
  events_file:
    description: File to append the JSON lines to; created with mode 0600 if missing.
    type: path
    env:
      - name: DSCTL_EVENTS_FILE
"""

TAIL_LINES = 20
MSG_MAX = 500
FACT_PREFIXES = ("ascend_", "dsctl_", "inference_service_", "gateway_report")
NO_LOG_MSG = "output hidden (no_log)"


def _one_line(value):
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, default=str, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    line = " ".join(value.split())
    return line if len(line) <= MSG_MAX else line[: MSG_MAX - 3] + "..."


def _tail(value):
    if isinstance(value, list):
        lines = [str(line) for line in value]
    elif value:
        lines = str(value).splitlines()
    else:
        lines = []
    return lines[-TAIL_LINES:]


def _is_no_log(task, result):
    if getattr(task, "no_log", None) is True or result.get("_ansible_no_log") or "censored" in result:
        return True
    items = result.get("results")
    return isinstance(items, list) and any(isinstance(i, dict) and i.get("_ansible_no_log") for i in items)


def _facts(result):
    found = {}
    sources = [result]
    if isinstance(result.get("results"), list):
        sources += [item for item in result["results"] if isinstance(item, dict)]
    for source in sources:
        facts = source.get("ansible_facts")
        if isinstance(facts, dict):
            found.update({k: v for k, v in facts.items() if str(k).startswith(FACT_PREFIXES)})
    return found


def _detail(result):
    """The result to describe: for a loop, its first failed item (else its last item)."""
    items = [item for item in result.get("results") or [] if isinstance(item, dict)]
    if not items:
        return result
    failed = [item for item in items if item.get("failed")]
    return failed[0] if failed else items[-1]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dsctl_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._path = None
        self._stream = None

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._path = self.get_option("events_file") or None

    def _emit(self, event, **fields):
        if not self._path:
            return
        if self._stream is None:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._stream = os.fdopen(fd, "a", encoding="utf-8")
        record = {"event": event, "ts": round(time.time(), 3)}
        record.update(fields)
        self._stream.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        self._stream.flush()

    @staticmethod
    def _role(task):
        role = getattr(task, "_role", None)
        if role is None:
            return None
        try:
            return role.get_name(include_role_fqcn=False)
        except TypeError:
            return role.get_name()

    @staticmethod
    def _task_name(task):
        return (task.name or task.action or "").strip()

    def _result(self, status, result, ignore_errors=False):
        # ansible-core 2.19 names them result/host/task; older releases _result/_host/_task.
        data = getattr(result, "result", None)
        if not isinstance(data, dict):
            data = result._result
        task = getattr(result, "task", None) or result._task
        host = getattr(result, "host", None) or result._host
        if status == "ok" and data.get("changed"):
            status = "changed"
        base = {"host": host.get_name(), "task": self._task_name(task), "role": self._role(task),
                "changed": bool(data.get("changed")), "failed": status == "failed",
                "ignore_errors": bool(ignore_errors)}
        if _is_no_log(task, data):
            self._emit("runner_" + status, msg=NO_LOG_MSG, no_log=True, **base)
            return
        detail = _detail(data)
        msg = detail.get("msg") or data.get("msg") or detail.get("skip_reason") or data.get("skip_reason")
        rc = detail.get("rc")
        stdout = detail.get("stdout_lines") or detail.get("stdout") or detail.get("module_stdout")
        stderr = detail.get("stderr_lines") or detail.get("stderr") or detail.get("module_stderr")
        fields = {"msg": _one_line(msg), "rc": rc if isinstance(rc, int) else None,
                  "stdout_tail": _tail(stdout), "stderr_tail": _tail(stderr)}
        facts = _facts(data)
        if facts:
            fields["facts"] = facts
        self._emit("runner_" + status, **base, **fields)

    def v2_playbook_on_start(self, playbook):
        self._emit("playbook_start", playbook=getattr(playbook, "_file_name", None))

    def v2_playbook_on_play_start(self, play):
        self._emit("play_start", play=(play.get_name() or "").strip())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._emit("task_start", task=self._task_name(task), role=self._role(task), action=task.action,
                   handler=False)

    def v2_playbook_on_handler_task_start(self, task):
        self._emit("task_start", task=self._task_name(task), role=self._role(task), action=task.action,
                   handler=True)

    def v2_runner_on_start(self, host, task):
        self._emit("runner_start", host=host.get_name(), task=self._task_name(task), role=self._role(task))

    def v2_runner_on_ok(self, result):
        self._result("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("failed", result, ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._result("skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("unreachable", result)

    def v2_playbook_on_stats(self, stats):
        hosts = {}
        for host in sorted(stats.processed):
            summary = stats.summarize(host)
            hosts[host] = {key: summary.get(key, 0)
                           for key in ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored")}
        self._emit("stats", hosts=hosts)
        if self._stream is not None:
            self._stream.close()
            self._stream = None
