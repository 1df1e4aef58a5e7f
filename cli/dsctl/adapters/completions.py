"""Greedy (temperature 0) completions from an OpenAI-compatible server, for tune's quality guard.

Plain blocking HTTP (the standard library's http.client): a few short requests, one at a time, each bounded by
``timeout``.  The streaming probe client (`dsctl.adapters.probe_client`) measures latency; this one only needs the
text, so it asks for a non-streamed answer.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence

from dsctl.core.http_url import parse_http_url
from dsctl.errors import DsctlError

MAX_PROMPTS = 64


def greedy_outputs(url: str, model: str, prompts: Sequence[str], *, max_tokens: int = 64,
                   api_key: str | None = None, timeout: float = 60.0) -> list[str]:
    """The text each prompt gets with temperature 0 (``/v1/completions``); DsctlError on any failed request."""
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts per quality check, got {len(prompts)}")
    try:
        parts = parse_http_url(url, schemes=("http",))  # the one URL parser: port 0 is refused, never port 80
    except ValueError as invalid:
        raise ValueError(f"URL {url!r}: {invalid}") from None
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    outputs: list[str] = []
    connection = http.client.HTTPConnection(parts.host, parts.port, timeout=timeout)
    try:
        for prompt in prompts:
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "stream": False})
            try:
                connection.request("POST", "/v1/completions", body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise DsctlError(f"{url}/v1/completions: {type(exc).__name__}: {exc}") from None
            if response.status != 200:
                raise DsctlError(f"{url}/v1/completions answered HTTP {response.status}: "
                                 f"{payload[:200].decode(errors='replace')}")
            try:
                outputs.append(str(json.loads(payload)["choices"][0]["text"]))
            except (ValueError, KeyError, IndexError, TypeError):
                raise DsctlError(f"{url}/v1/completions: no choices[0].text in the answer") from None
    finally:
        connection.close()
    return outputs
