"""`dsctl engine`: the emulated vLLM-compatible serving engine that lab hosts run.

The engine itself is standard-library only (``python3 -m dsctl.engine serve``
works where typer is absent); this Typer command forwards its arguments there.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="The emulated serving engine lab hosts run (vLLM's OpenAI API, modelled NPU timing).",
                  no_args_is_help=True)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Serve the OpenAI-compatible API (flags as `vllm serve`; --help lists them)."""
    from dsctl.engine.__main__ import main

    code = main(["serve", *ctx.args])
    if code:
        raise typer.Exit(code)
