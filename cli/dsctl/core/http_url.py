"""The one parser of the http(s) URLs a user gives dsctl: ``dsctl probe URL``, inventory URLs (pure).

``urllib.parse`` is lenient where a wrong answer is silent: ``http://127.0.0.1:0`` has ``.port`` 0, which
``parts.port or 80`` turned into port 80, another server than the one named.  Here a URL has an explicit port
from 1 to 65535, or none (the scheme's default: 80 for http, 443 for https, RFC 9110 section 4.2); port 0 is
"any free port" to bind(2) and no server listens on it (RFC 6335 section 6 reserves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class HttpUrl:
    scheme: str
    host: str
    port: int  # the explicit port, else the scheme's default
    path: str


def parse_http_url(text: str, *, schemes: tuple[str, ...] = ("http", "https"), default_scheme: str | None = None,
                   ) -> HttpUrl:
    """``text`` as an http(s) URL; ValueError saying what is wrong (the caller names the field).

    ``default_scheme``: a bare ``HOST:PORT`` is read as ``<default_scheme>://HOST:PORT`` (the probe's URL)."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError("expected a URL without blanks or control characters")
    if default_scheme is not None and "://" not in text:
        text = f"{default_scheme}://{text}"
    parts = urlsplit(text)
    expected = " or ".join(f"{scheme}://HOST[:PORT]" for scheme in schemes)
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"expected {expected}")
    try:
        port = parts.port
    except ValueError:  # not digits, or above 65535
        raise ValueError("expected a port from 1 to 65535 after the host (or none for the scheme's default)") from None
    if port == 0:
        raise ValueError(f"port 0 is no server's port; give the server's port (1..65535), or leave it out for "
                         f"{parts.scheme}'s default {DEFAULT_PORTS[parts.scheme]}")
    return HttpUrl(parts.scheme, parts.hostname, port if port is not None else DEFAULT_PORTS[parts.scheme],
                   parts.path)
