"""The whole suite: Ctrl-C works in the tests whatever the harness that started them.

A background job of a non-interactive shell (a CI script's `cmd &`) starts with SIGINT ignored, and the tests'
own subprocesses (dsctl, ansible-playbook, the fake ansible) would inherit that: every test of interrupt handling
would then fail for a reason users do not have.  Python's own handler here gives those children the default
disposition again (a handler, unlike SIG_IGN, is not inherited across exec).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)
