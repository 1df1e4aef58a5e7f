"""OpenAI-compatible request parsing and response shapes, as vLLM's OpenAI server produces them.

Sources: vllm-project/vllm ``vllm/entrypoints/openai/{api_server,serving_completion,serving_chat,
serving_engine,protocol}.py``.

* Errors: ``{"object": "error", "message", "type", "param", "code"}`` (vLLM's
  ErrorResponse): 400 ``BadRequestError`` for bad bodies and over-long
  requests, 404 ``NotFoundError`` "The model `X` does not exist.".
  With ``--api-key``, paths under ``/v1`` without ``Authorization: Bearer
  <key>`` get 401 ``{"error": "Unauthorized"}``; /health and /metrics stay open.
* Completions stream chunks are dumped with every field (``"usage": null``
  included), chat chunks with only the fields set, as vLLM does; the usage
  chunk of ``stream_options.include_usage`` has ``"choices": []``.
* Ids: ``cmpl-<id>`` / ``chatcmpl-<id>``, where ``<id>`` is the client's
  ``X-Request-Id`` header when given, else a random uuid4 hex.

Not modelled: several prompts or choices per request (n > 1), logprobs,
echo, stop strings, tools; generation always runs to ``max_tokens``
(finish_reason "length").
"""

from __future__ import annotations

import hmac
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from dsctl.core.load.tokens import count_tokens
from dsctl.engine.text import prompt_key

DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's CompletionRequest default
CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 1  # role marker
CHAT_TEMPLATE_TOKENS_FIXED = 3  # BOS + assistant generation prompt


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.status)


def error_body(message: str, err_type: str, code: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


UNAUTHORIZED = {"error": "Unauthorized"}


def authorized(headers: dict[str, str], api_key: str | None) -> bool:
    if not api_key:
        return True
    return hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {api_key}".encode())  # constant time


@dataclass
class GenerationRequest:
    kind: str  # "completion" | "chat"
    request_id: str  # cmpl-... / chatcmpl-...
    model: str
    prompt_tokens: int
    key: bytes  # what the synthetic text is seeded with
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    created: int
    text: str = ""  # the prompt as the engine tokenises it (prefix caching hashes its blocks)


def _bad(message: str) -> ApiError:
    return ApiError(400, message)


def _load(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except RecursionError:  # nesting deeper than the interpreter's stack: refused, not a crash
        raise _bad("JSON decode error: the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints beyond sys.get_int_max_str_digits()
        raise _bad(f"JSON decode error: {exc}") from None
    if not isinstance(data, dict):
        raise _bad("Input should be a valid dictionary or object to extract fields from")
    return data


def _int_field(data: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name}: Input should be a valid integer")
    if minimum is not None and value < minimum:
        raise _bad(f"{name} must be at least {minimum}, got {value}.")
    return value


def _common(data: dict[str, Any], served: list[str]) -> tuple[str, bool, bool, bool, int | None]:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model: Input should be a valid string")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream: Input should be a valid boolean")
    options = data.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise _bad("Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise _bad("stream_options: Input should be a valid dictionary")
        include_usage = bool(options.get("include_usage") or False)
        continuous = bool(options.get("continuous_usage_stats") or False)
    n = _int_field(data, "n", 1)
    if n not in (None, 1):
        raise _bad("n > 1 is not supported by this engine")
    for name in ("temperature", "top_p"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"{name}: Input should be a valid number")
    seed = _int_field(data, "seed")
    if model is None:
        model = served[0]
    elif model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return model, stream, include_usage, continuous, seed


def _check_length(prompt_tokens: int, max_tokens: int | None, max_model_len: int, default: int | None) -> int:
    if prompt_tokens >= max_model_len:
        raise _bad(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                   f"{prompt_tokens} input tokens. Please reduce the length of the input messages.")
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens if default is None else min(default,
                                                                                 max_model_len - prompt_tokens)
    if prompt_tokens + max_tokens > max_model_len:
        raise _bad(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                   f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
                   f"({max_tokens} > {max_model_len} - {prompt_tokens}).")
    return max_tokens


def new_id(base: str | None) -> str:
    return base if base else uuid.uuid4().hex


def parse_completion(body: bytes, served: list[str], max_model_len: int, request_id: str | None = None
                     ) -> GenerationRequest:
    data = _load(body)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("Prompt cannot be empty")
        tokens = count_tokens(prompt) or 1
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = len(prompt)
    elif prompt is None:
        raise _bad("Either prompt or prompt_embeds must be provided and non-empty.")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("batched prompts are not supported by this engine: send one prompt per request")
    else:
        raise _bad("prompt: Input should be a valid string or a list of token ids")
    model, stream, include_usage, continuous, seed = _common(data, served)
    max_tokens = _int_field(data, "max_tokens", 1)
    max_tokens = _check_length(tokens, max_tokens, max_model_len, DEFAULT_COMPLETION_MAX_TOKENS)
    text = prompt if isinstance(prompt, str) else " ".join(str(t) for t in prompt)
    return GenerationRequest("completion", f"cmpl-{new_id(request_id)}", model, tokens, prompt_key(prompt, seed),
                             max_tokens, stream, include_usage, continuous, int(time.time()), text)


def _message_text(message: Any) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _bad("messages: each message needs a 'role' and 'content'")
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise _bad("messages: only text content parts are supported by this engine")
        return "\n".join(parts)
    raise _bad("messages: content should be a string or a list of parts")


def parse_chat(body: bytes, served: list[str], max_model_len: int, request_id: str | None = None
               ) -> GenerationRequest:
    data = _load(body)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: Field required (a non-empty list of messages)")
    texts = [(m.get("role") if isinstance(m, dict) else "", _message_text(m)) for m in messages]
    tokens = CHAT_TEMPLATE_TOKENS_FIXED + sum(CHAT_TEMPLATE_TOKENS_PER_MESSAGE + count_tokens(t) for _, t in texts)
    model, stream, include_usage, continuous, seed = _common(data, served)
    max_tokens = _int_field(data, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int_field(data, "max_tokens", 1)
    max_tokens = _check_length(tokens, max_tokens, max_model_len, None)
    rendered = "\n".join(f"<{role}>{text}" for role, text in texts)
    return GenerationRequest("chat", f"chatcmpl-{new_id(request_id)}", model, tokens, prompt_key(rendered, seed),
                             max_tokens, stream, include_usage, continuous, int(time.time()), rendered)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


_PLAIN_TEXT = re.compile(r"[ -!#-\[\]-~]*")  # printable ASCII but '"' and '\\': a JSON string as it is


def _json_string(text: str) -> str:
    return '"' + text + '"' if _PLAIN_TEXT.fullmatch(text) else json.dumps(text)


# The key a time-scaled emulated engine adds to each stream event: the wall seconds from the request's arrival to the
# iteration that produced the event's latest token.  The probe divides them by the scale (modelled engine time) and
# adds the rest of what it measured (the network, the client, the server's front) unscaled, so a millisecond the
# controller loses is a millisecond, not 1/scale of them.  At time scale 1 the engine sends none: the stream is vLLM's
# byte for byte.  No real server sends it.
ENGINE_ELAPSED_KEY = "dsctl_engine_elapsed_s"


class Shaper:
    """Serialises one request's responses; stream chunks come pre-framed as SSE events.

    Stream events are built from per-request templates (the JSON around the text is fixed), so an event costs a
    few string concatenations; the synthetic text (lowercase words) needs no escaping.
    """

    def __init__(self, req: GenerationRequest, *, stamps: bool = False):
        """``stamps``: every choice-bearing event also carries ``ENGINE_ELAPSED_KEY``, the wall seconds from the
        request's arrival to the iteration that produced its latest token (a time-scaled engine only: see
        ``ENGINE_ELAPSED_KEY``)."""
        self.req = req
        self.stamps = stamps
        self.chat = req.kind == "chat"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self._head = ('data: {"id":' + json.dumps(req.request_id) + ',"object":"' + obj + '","created":'
                      + str(req.created) + ',"model":' + json.dumps(req.model) + ',"choices":[')
        if self.chat:
            prefix = self._head + '{"index":0,"delta":{"content":'
            self._running = '},"logprobs":null,"finish_reason":null}]'
            self._last = '},"logprobs":null,"finish_reason":"length","stop_reason":null}]'
        else:
            prefix = self._head + '{"index":0,"text":'
            self._running = ',"logprobs":null,"finish_reason":null,"stop_reason":null}]'
            self._last = ',"logprobs":null,"finish_reason":"length","stop_reason":null}]'
        self._prefix = prefix
        self._fixed_tail = None if req.continuous_usage else ("}\n\n" if self.chat else ',"usage":null}\n\n')

    def role_chunk(self, elapsed: float | None = None) -> bytes:
        """The chat stream's first event (empty content, role assistant)."""
        return (self._head + '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                '"finish_reason":null}]' + self._tail(0) + self._stamp(elapsed) + "}\n\n").encode()

    def _stamp(self, elapsed: float | None) -> str:
        return "" if not self.stamps or elapsed is None else f',"{ENGINE_ELAPSED_KEY}":{elapsed:.6f}'

    def _tail(self, completion_tokens: int) -> str:
        if self.req.continuous_usage:
            return ',"usage":' + json.dumps(_usage(self.req.prompt_tokens, completion_tokens), separators=(",", ":"))
        return "" if self.chat else ',"usage":null'

    def token_chunk(self, text: str, completion_tokens: int, finished: bool, elapsed: float | None = None) -> bytes:
        tail = self._fixed_tail
        if tail is None:
            tail = self._tail(completion_tokens) + "}\n\n"
        if self.stamps and elapsed is not None:
            tail = tail[:-3] + self._stamp(elapsed) + "}\n\n"
        return (self._prefix + _json_string(text) + (self._last if finished else self._running) + tail).encode()

    def usage_chunk(self, completion_tokens: int) -> bytes:
        return (self._head + '],"usage":' + json.dumps(_usage(self.req.prompt_tokens, completion_tokens),
                                                       separators=(",", ":")) + "}\n\n").encode()

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"

    def response(self, text: str, completion_tokens: int) -> dict[str, Any]:
        usage = {**_usage(self.req.prompt_tokens, completion_tokens), "prompt_tokens_details": None}
        base = {"id": self.req.request_id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.req.created, "model": self.req.model}
        if self.chat:
            choice = {"index": 0,
                      "message": {"role": "assistant", "reasoning_content": None, "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
            return {**base, "choices": [choice], "usage": usage, "prompt_logprobs": None}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                  "prompt_logprobs": None}
        return {**base, "choices": [choice], "usage": usage}


def models_body(served: list[str], root: str, max_model_len: int, created: int) -> dict[str, Any]:
    data = []
    for name in served:
        data.append({
            "id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root, "parent": None,
            "max_model_len": max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_OID, name).hex}", "object": "model_permission",
                "created": created, "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                "group": None, "is_blocking": False,
            }],
        })
    return {"object": "list", "data": data}
