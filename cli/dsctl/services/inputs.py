"""What the verbs take from a command line, checked as the verbs take it: the bounds of each kind of number, the
vault options and ``--param`` overrides.

The commands apply these while the command line is parsed (a Typer callback per number option,
`dsctl.cli_options.bounded`), before a verb runs; they raise `UsageError` (exit 2), one line naming the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import yaml_bounds
from dsctl.core.load import limits
from dsctl.errors import UsageError


@dataclass(frozen=True)
class Bound:
    """A number option's range: ``low`` .. ``high`` (None: not checked); ``what`` names the unit in the error line
    (``"requests of one probe"``), ``why`` (optional, ``" (...)"``) where the upper bound comes from."""

    low: float | None
    high: float | None
    what: str
    why: str = ""

    def but(self, **changes: Any) -> Bound:
        """This bound with some fields changed (``HOSTS.but(low=0)``)."""
        return dataclasses.replace(self, **changes)

    def check(self, option: str, value: float) -> None:
        """The one number rule (`dsctl.core.load.limits.number`: finite, within the bounds), a UsageError."""
        try:
            limits.number(option, value, self.low, self.high, self.what, self.why)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


# The kinds of number the verbs take, each with its bounds (dsctl.core.load.limits says why each is what it is).
HOSTS = Bound(1, limits.MAX_HOSTS, "hosts")
IN_FLIGHT = Bound(None, limits.MAX_CONCURRENCY, "requests in flight")
REQUESTS = Bound(None, limits.MAX_REQUESTS, "requests of one probe")
TOKENS = Bound(None, limits.MAX_TOKENS, "tokens per request")
INSTANCE_NPUS = Bound(1, limits.MAX_CHIPS, "NPUs of one instance", limits.MAX_CHIPS_WHY)
SECONDS = Bound(None, limits.SECONDS_PER_DAY, "seconds")
RUN_SECONDS = Bound(None, limits.MAX_RUN_SECONDS, "seconds")
SEED = Bound(0, limits.MAX_SEED, "", " (numpy's seed range)")
SHARE = Bound(0, 1, "", " (a share)")


def vault_options(password_file: Path | None, ask: bool) -> VaultOptions | None:
    """How Ansible gets the vault password, from ``--vault-password-file`` / ``--ask-vault-pass``.

    Nothing is asked here: with ``--ask-vault-pass`` the adapters prompt once, on first use, keep the password in
    the returned object for the rest of the command, and hand it to ansible-playbook as a 0600 file inside the
    run's artifacts directory that is removed after the run (`ansible_run.write_vault_password`).
    """
    if password_file is not None and ask:
        raise UsageError("--ask-vault-pass: give it or --vault-password-file, not both")
    if password_file is not None and not password_file.is_file():
        raise UsageError(f"--vault-password-file: {password_file} is not a file")
    if password_file is None and not ask:
        return None
    return VaultOptions(password_file=password_file.absolute() if password_file is not None else None, ask=ask)


def _param_value(text: str) -> Any:
    try:
        return yaml_bounds.safe_load(text, "--param") if text.strip() else text
    except yaml_bounds.TooLarge as exc:
        raise UsageError(str(exc)) from None
    except yaml.YAMLError:
        return text  # not YAML: the plain string, which the parameter's schema then judges


def parse_params(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``--param SERVICE.KEY=VALUE`` (repeatable) -> {service: {key: value}}; the value is read as YAML (64, 0.9,
    true, {"a": 1}), so it has the type the inventory would give it."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items or ():
        target, sep, value = item.partition("=")
        service, dot, key = target.partition(".")
        if not sep or not dot or not service or not key:
            raise UsageError(f"--param {item!r}: expected SERVICE.KEY=VALUE, e.g. chat.max_num_seqs=64")
        overrides.setdefault(service, {})[key] = _param_value(value)
    return overrides
