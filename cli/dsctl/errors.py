"""One exception family and the exit statuses it maps to (documented in docs/exit-codes.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    VALIDATION_FAILED = 3
    PLAYBOOK_FAILED = 4
    HOSTS_UNREACHABLE = 5
    SLO_NOT_MET = 6
    TIMEOUT = 7
    ENVIRONMENT = 8
    ERROR_RATE_EXCEEDED = 9
    INTERRUPTED = 130


class DsctlError(Exception):
    """An error the user can act on: one line naming what is wrong and how to fix it."""

    exit_status = ExitStatus.ERROR

    def __init__(self, message: str, exit_status: ExitStatus | None = None):
        super().__init__(message)
        if exit_status is not None:
            self.exit_status = exit_status


class UsageError(DsctlError):
    exit_status = ExitStatus.USAGE


class EnvironmentUnsupported(DsctlError):
    """The machine cannot do this (not Linux, not root, a tool missing)."""

    exit_status = ExitStatus.ENVIRONMENT


class HostsUnreachable(DsctlError):
    exit_status = ExitStatus.HOSTS_UNREACHABLE
