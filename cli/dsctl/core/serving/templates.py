"""The one Jinja environment of dsctl's templates (``templates/``): deploy's engine and service-manager files
(`service_render`) and the gateway's nginx configuration (`gateway`) render through it.

Shell, INI, unit files, JSON and nginx, not HTML: no autoescape, and every value goes through the filter of the
syntax it lands in.  Each renderer registers its filters here when it is imported, so a template only ever meets
filters of the module that renders it, and one loader with one set of options serves them all.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import jinja2

from dsctl.assets import asset_root

_FILTERS: dict[str, Callable[..., str]] = {}


def register(**filters: Callable[..., str]) -> None:
    """Add a renderer's quoting filters (a name given twice must be the same function)."""
    for name, function in filters.items():
        if _FILTERS.get(name, function) is not function:
            raise ValueError(f"template filter {name!r} registered twice")
        _FILTERS[name] = function
    if _environment.cache_info().currsize:
        _environment().filters.update(filters)


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(asset_root() / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(_FILTERS)
    return env


def render(name: str, **context: Any) -> str:
    """``templates/<name>`` rendered with ``context`` (an undefined variable is an error)."""
    return _environment().get_template(name).render(**context)
