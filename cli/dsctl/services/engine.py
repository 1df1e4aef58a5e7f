"""The engine verb (`dsctl engine serve`): run the emulated serving engine in this process until it stops.

The engine is standard-library only and has its own command line (``python3 -m dsctl.engine serve``, flags as
``vllm serve``), which lab hosts run without dsctl's dependencies; the verb hands it the arguments as given.
"""

from __future__ import annotations

from collections.abc import Sequence


def serve(args: Sequence[str], port: int | None = None) -> int:
    """Serve with the engine's flags ``args`` (``port``: the --port dsctl's command line checked); its exit status."""
    from dsctl.engine.__main__ import main  # imported when it runs: the engine's modules are not needed before

    return main(["serve", *args, *(["--port", str(port)] if port is not None else [])])
