"""Prompt files and datasets for `dsctl probe --prompts / --dataset` (pure: parses text already read).

Formats:

* JSONL (``--prompts``, ``--dataset x.jsonl``): one object per line with ``"prompt"`` (a string) or ``"messages"``
  (a chat list), optionally ``"output_tokens"`` (or ``"max_tokens"``), ``"prompt_tokens"`` and, for trace replay,
  ``"timestamp"`` (seconds; the request is sent that long after the first entry's timestamp). A line may also be
  one ShareGPT entry. Blank lines are skipped.
* ShareGPT JSON (``--dataset x.json``, as vLLM's ``--dataset-name sharegpt`` reads it): a list of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``. The first human
  (or ``user``) turn is the prompt; the turn that answers it (``gpt`` / ``assistant``) gives the output length, its
  token count. Entries without such a pair are skipped (and counted).

Token counts (a prompt's, an answer's) use the ``count`` function given: the probe's ``--tokenizer`` when there is
one, else the lab engine's own rule (`dsctl.core.load.tokens.count_tokens`), so the planned lengths are the engine's.

Bounds: a dataset holds at most ``MAX_ENTRIES`` entries and the file at most ``MAX_BYTES`` (the caller checks the
size before reading); the probe cycles through the entries, so more would add nothing but memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 100_000
HUMAN = ("human", "user")
ANSWER = ("gpt", "assistant", "chatgpt", "bard", "bing")

Counter = Callable[[str], int]


@dataclass(frozen=True)
class Dataset:
    items: list[dict[str, Any]]  # what `Workload(prompts=...)` takes: prompt | messages, output_tokens, prompt_tokens
    timestamps: list[float] | None  # seconds from the first entry, ascending; None: no trace (a rate is needed)
    kind: str  # "jsonl" | "sharegpt"
    skipped: int = 0  # ShareGPT entries without a prompt and an answer


def parse(text: str, name: str, count: Counter, *, sharegpt: bool | None = None) -> Dataset:
    """``text`` of the file ``name``; ``sharegpt`` None: a JSON list is ShareGPT, anything else JSONL."""
    if sharegpt is None:
        sharegpt = text.lstrip().startswith("[")
    if sharegpt:
        return _sharegpt(text, name, count)
    return _jsonl(text, name, count)


def _sharegpt(text: str, name: str, count: Counter) -> Dataset:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # json nests by recursion: arrays or objects thousands deep are no dataset
        raise ValueError(f"{name}: nested too deeply to be a ShareGPT list") from None
    if not isinstance(doc, list):
        raise ValueError(f"{name}: a ShareGPT file is a JSON list of {{\"conversations\": [...]}} entries")
    if len(doc) > MAX_ENTRIES:
        raise ValueError(f"{name}: {len(doc)} entries, more than the {MAX_ENTRIES} a probe reads")
    items: list[dict[str, Any]] = []
    skipped = 0
    for entry in doc:
        item = _conversation(entry, count)
        if item is None:
            skipped += 1
        else:
            items.append(item)
    if not items:
        raise ValueError(f"{name}: no entry has a human turn followed by an answer")
    return Dataset(items, None, "sharegpt", skipped)


def _conversation(entry: Any, count: Counter) -> dict[str, Any] | None:
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    for i, turn in enumerate(turns[:-1]):
        if not isinstance(turn, dict) or str(turn.get("from", "")).lower() not in HUMAN:
            continue
        answer = turns[i + 1]
        prompt, reply = turn.get("value"), answer.get("value") if isinstance(answer, dict) else None
        if not isinstance(prompt, str) or not prompt.strip() or not isinstance(reply, str) \
                or str(answer.get("from", "")).lower() not in ANSWER:
            return None
        return {"prompt": prompt, "prompt_tokens": max(1, count(prompt)), "output_tokens": max(1, count(reply))}
    return None


def _jsonl(text: str, name: str, count: Counter) -> Dataset:
    items: list[dict[str, Any]] = []
    stamps: list[float | None] = []
    skipped = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(items) + skipped >= MAX_ENTRIES:
            raise ValueError(f"{name}: more than the {MAX_ENTRIES} entries a probe reads (line {number})")
        where = f"{name} line {number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise ValueError(f"{where}: nested too deeply to be a prompt entry") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: needs a \"prompt\" string or a \"messages\" list")
        if "conversations" in raw:
            item = _conversation(raw, count)
            if item is None:
                skipped += 1
                continue
        else:
            item = _prompt_line(raw, where, count)
        stamp = raw.get("timestamp")
        if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, int | float)
                                  or not math.isfinite(stamp) or stamp < 0):
            raise ValueError(f"{where}: timestamp must be a non-negative number of seconds")
        items.append(item)
        stamps.append(None if stamp is None else float(stamp))
    if not items:
        raise ValueError(f"{name}: no prompts")
    timed = [s for s in stamps if s is not None]
    if timed and len(timed) != len(stamps):
        first = stamps.index(None) if None in stamps else 0
        raise ValueError(f"{name}: entry {first + 1} has no timestamp while others do (a trace needs one on every "
                         "entry)")
    if not timed:
        return Dataset(items, None, "jsonl", skipped)
    order = sorted(range(len(items)), key=lambda i: timed[i])  # a trace replays in time order
    t0 = timed[order[0]]
    return Dataset([items[i] for i in order], [timed[i] - t0 for i in order], "jsonl", skipped)


def _prompt_line(raw: dict[str, Any], where: str, count: Counter) -> dict[str, Any]:
    if not (isinstance(raw.get("prompt"), str) or isinstance(raw.get("messages"), list)):
        raise ValueError(f"{where}: needs a \"prompt\" string or a \"messages\" list")
    out = raw.get("output_tokens", raw.get("max_tokens"))
    if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
        raise ValueError(f"{where}: output_tokens must be a positive integer")
    given = raw.get("prompt_tokens")
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ValueError(f"{where}: prompt_tokens must be a positive integer")
    item: dict[str, Any] = {k: raw[k] for k in ("prompt", "messages") if k in raw}
    if isinstance(item.get("messages"), list):
        item.pop("prompt", None)
        text = " ".join(str(m.get("content", "")) for m in item["messages"] if isinstance(m, dict))
    else:
        item.pop("messages", None)
        text = item["prompt"]
    item["prompt_tokens"] = given or max(1, count(text))
    if out is not None:
        item["output_tokens"] = out
    return item
