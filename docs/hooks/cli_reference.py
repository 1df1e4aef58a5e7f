"""MkDocs hook: docs/reference/cli.md gets the CLI reference generated from dsctl's Typer app at build time.

Why this way: Typer ships its own Markdown generator (`typer <module> utils docs`, i.e. `typer.cli.get_docs_for_click`),
which walks the Click tree `typer.main.get_command(dsctl.app.app)` builds, lazy verbs included (`LazyVerbs` loads each
verb's module when listed).  Calling it here, on every build, means the page cannot drift from the code and no
generated file is committed.  mkdocs-click was not used: Typer >= 0.24 vendors Click (`typer._click`), so its command
objects are not the `click` package's classes that plugin expects.
"""

from __future__ import annotations

import html
import re

MARKER = "<!-- dsctl-cli-reference -->"
PAGE = "reference/cli.md"
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def generate() -> str:
    """The reference as Markdown: one section per command, nested as the commands are."""
    import typer.main
    from typer.cli import get_docs_for_click

    from dsctl.app import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command, info_name="dsctl")
    return escape_prose(get_docs_for_click(obj=command, ctx=ctx, name="dsctl", indent=1))


def escape_prose(markdown: str) -> str:
    """Help texts say `/run/dsctl/<name>`: outside code spans and fenced blocks, `<` and `>` become entities so
    Markdown does not read them as HTML tags and drop them."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            out.append(line)
            continue
        if fenced:
            out.append(line)
            continue
        pieces, last = [], 0
        for match in _CODE_SPAN.finditer(line):
            pieces.append(html.escape(line[last:match.start()], quote=False))
            pieces.append(match.group(0))
            last = match.end()
        pieces.append(html.escape(line[last:], quote=False))
        out.append("".join(pieces))
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} must hold the marker {MARKER} where the generated reference goes")
    return markdown.replace(MARKER, generate())
