"""Data files shipped with dsctl (chip catalogue, releases and compatibility)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


@cache
def load(name: str) -> dict[str, Any]:
    """Parsed ``dsctl/data/<name>.yaml``; cached because every caller treats it as read-only."""
    return yaml.safe_load(resources.files(__package__).joinpath(f"{name}.yaml").read_text())
