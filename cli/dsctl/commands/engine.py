"""`dsctl engine`: the emulated vLLM-compatible serving engine that lab hosts run.

The engine itself is standard-library only (``python3 -m dsctl.engine serve``
works where typer is absent); this Typer command forwards its arguments there.
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="The emulated serving engine lab hosts run (vLLM's OpenAI API, modelled NPU timing).",
                  no_args_is_help=True)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(
    ctx: typer.Context,
    # Parsed here as well as by the engine: a port out of range is dsctl's usage error (exit 2, one line naming
    # --port), where the engine itself, like vLLM, fails at start-up (exit 1).  0 lets the OS pick, as in vLLM.
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535, show_default=False,
                                             help="Port to listen on, 0..65535 (default 8000).")] = None,
) -> None:
    """Serve the OpenAI-compatible API (flags as `vllm serve`; --help lists them)."""
    from dsctl.services import engine

    code = engine.serve(ctx.args, port)
    if code:
        raise typer.Exit(code)
