"""Import ``dsctl.core.perf.perfmodel`` on a host that has only the standard library.

perfmodel reads ``dsctl/data/profiles.yaml`` through ``dsctl.data.load``, which
imports PyYAML.  A lab host's system python3 may lack it, so before importing
perfmodel the engine

* uses ``--profile-json FILE`` when given: the same document as profiles.yaml,
  as JSON (the lab can write it on the controller, or ship calibrated
  numbers);
* otherwise, without PyYAML, registers a stand-in ``yaml`` module whose
  ``safe_load`` reads the YAML subset profiles.yaml uses (block mappings and
  sequences, comments, plain and quoted scalars, flow sequences over several
  lines, folded/literal block scalars, anchors, aliases and ``<<`` merges).
  A unit test checks it against PyYAML on the shipped profiles.yaml.
"""

from __future__ import annotations

import json
import re
import sys
import types
from typing import Any

_INT = re.compile(r"[-+]?(?:0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?$|[-+]?\.[0-9_]+(?:[eE][-+][0-9]+)?$")


def import_perfmodel(profile_json: str | None = None) -> Any:
    """dsctl.core.perf.perfmodel, with its profiles taken from ``profile_json`` when given."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        stub = types.ModuleType("yaml")
        stub.safe_load = safe_load  # type: ignore[attr-defined]
        stub.YAMLError = ValueError  # type: ignore[attr-defined]
        sys.modules["yaml"] = stub
    from dsctl import data

    if profile_json:
        with open(profile_json, encoding="utf-8") as handle:
            raw = json.load(handle)
        original = data.load

        def load(name: str) -> dict[str, Any]:
            return raw if name == "profiles" else original(name)

        data.load = load  # type: ignore[assignment]
    from dsctl.core.perf import perfmodel

    if profile_json:
        perfmodel._profiles.cache_clear()
    return perfmodel


# --------------------------------------------------------------------------- a YAML subset


def scalar(text: str) -> Any:
    """A plain or quoted scalar, resolved as PyYAML's safe loader does for the common types."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return json.loads(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
        return True
    if text in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return False
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    return text


def _strip_comment(line: str) -> str:
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'" and (index == 0 or line[index - 1] in " [,{:"):
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line.rstrip()


def _split_flow(body: str) -> list[str]:
    items, depth, quote, current = [], 0, None, []
    for char in body:
        if quote:
            current.append(char)
            if char == quote:
                quote = None
            continue
        if char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        items.append("".join(current))
    return items


def _flow(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return [_flow(item) for item in _split_flow(text[1:-1])]
    if text.startswith("{"):
        result = {}
        for item in _split_flow(text[1:-1]):
            key, _, value = item.partition(":")
            result[scalar(key)] = _flow(value)
        return result
    return scalar(text)


class _Parser:
    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.index = 0
        self.anchors: dict[str, Any] = {}

    def _peek(self) -> tuple[int, str] | None:
        while self.index < len(self.lines):
            raw = self.lines[self.index]
            content = _strip_comment(raw)
            if content.strip() and not content.strip().startswith("---"):
                return len(content) - len(content.lstrip(" ")), content.strip()
            self.index += 1
        return None

    def parse(self) -> Any:
        first = self._peek()
        return None if first is None else self._block(first[0])

    def _block(self, indent: int) -> Any:
        first = self._peek()
        assert first is not None
        if first[1] == "-" or first[1].startswith("- "):
            return self._sequence(indent)
        return self._mapping(indent)

    def _value(self, rest: str, indent: int) -> Any:
        anchor = None
        if rest.startswith("&"):
            anchor, _, rest = rest.partition(" ")
            anchor = anchor[1:]
            rest = rest.strip()
        if rest.startswith("*"):
            value = self.anchors[rest[1:].strip()]
        elif rest == "":
            following = self._peek()
            if following is None or following[0] < indent or (following[0] == indent
                                                                and not following[1].startswith("- ")):
                value = None
            else:
                value = self._block(following[0])
        elif rest[0] in ">|":
            value = self._block_scalar(rest, indent)
        elif rest[0] in "[{":
            value = self._flow_value(rest)
        else:
            value = scalar(rest)
        if anchor:
            self.anchors[anchor] = value
        return value

    def _flow_value(self, rest: str) -> Any:
        text = rest
        while text.count("[") + text.count("{") > text.count("]") + text.count("}"):
            text += " " + _strip_comment(self.lines[self.index]).strip()
            self.index += 1
        return _flow(text)

    def _block_scalar(self, header: str, indent: int) -> str:
        style, chomp = header[0], header[1:2]
        collected: list[str] = []
        block_indent = None
        while self.index < len(self.lines):
            line = self.lines[self.index]
            if line.strip():
                current = len(line) - len(line.lstrip(" "))
                if current <= indent:
                    break
                if block_indent is None:
                    block_indent = current
                collected.append(line[block_indent:])
            else:
                collected.append("")
            self.index += 1
        while collected and collected[-1] == "":
            collected.pop()
        if style == "|":
            text = "\n".join(collected)
        else:
            text = ""
            for number, line in enumerate(collected):
                if number == 0:
                    text = line
                elif line == "" or collected[number - 1] == "":
                    text += "\n" if line == "" else line
                else:
                    text += " " + line
        return text if chomp == "-" else text + "\n"

    def _mapping(self, indent: int) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        merged: dict[Any, Any] = {}
        while True:
            peeked = self._peek()
            if peeked is None or peeked[0] < indent:
                break
            if peeked[0] > indent:
                raise ValueError(f"line {self.index + 1}: unexpected indentation")
            content = peeked[1]
            if content.startswith("- "):
                break
            key_text, rest = self._split_key(content)
            self.index += 1
            value = self._value(rest, indent)
            if key_text == "<<":
                for source in value if isinstance(value, list) else [value]:
                    merged.update(source)
            else:
                result[scalar(key_text)] = value
        return {**merged, **result} if merged else result

    @staticmethod
    def _split_key(content: str) -> tuple[str, str]:
        if content[0] in "\"'":
            end = content.index(content[0], 1)
            key, remainder = content[: end + 1], content[end + 1:]
            if not remainder.startswith(":"):
                raise ValueError(f"bad mapping key: {content}")
            return key, remainder[1:].strip()
        match = re.match(r"(.*?):(?:\s+(.*))?$", content)
        if not match:
            raise ValueError(f"not a mapping entry: {content}")
        return match.group(1).strip(), (match.group(2) or "").strip()

    def _sequence(self, indent: int) -> list[Any]:
        result: list[Any] = []
        while True:
            peeked = self._peek()
            if peeked is None or peeked[0] != indent or not (peeked[1] == "-" or peeked[1].startswith("- ")):
                break
            rest = peeked[1][1:].strip()
            if rest and re.match(r"[^\[{\"'][^:]*:(\s|$)", rest):
                # "- key: value" opens a mapping indented past the dash
                inner = indent + 2
                self.lines[self.index] = " " * inner + rest
                result.append(self._mapping(inner))
            else:
                self.index += 1
                result.append(self._value(rest, indent))
        return result


def safe_load(text: str) -> Any:
    return _Parser(text if isinstance(text, str) else text.read()).parse()
