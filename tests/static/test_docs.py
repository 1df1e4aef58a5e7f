"""The documentation: the MkDocs site builds with --strict, the README stays a short front page, and the CLI
reference in the built site is generated from the Typer app (every command of the app has its section, and only
those), so a new command without docs, or a hand-copied reference that drifted, fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CLI_PAGE = REPO / "docs" / "reference" / "cli.md"
MAX_README_LINES = 200
# The README's first screen: the main job on the lab, then every test.
MAIN_JOB = ("bash .ci/setup && inv=$(.venv/bin/dsctl lab up --hosts 3 --driver 24.1.rc3 --firmware 7.5.0.1.129 "
            "--cann 8.0.0) && .venv/bin/dsctl provision \"$inv\" && .venv/bin/dsctl check \"$inv\" && .venv/bin/dsctl "
            "deploy \"$inv\" && .venv/bin/dsctl probe http://10.78.0.11:8000 --rate 8 --requests 80 && .venv/bin/dsctl "
            "tune \"$inv\" --slo ttft=200ms --budget 6 --prompt-tokens 256 --output-tokens 64")
ALL_TESTS = "bash .ci/run"
FIRST_SCREEN_LINES = 30
HEADING_COMMAND = re.compile(r'<h[1-6] id="[^"]*"><code>(dsctl(?: [a-z][a-z0-9-]*)*)</code>')


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module the way CI builds it."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0: noise in a failure
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-d", str(out)],
                            cwd=REPO, capture_output=True, text=True, env=env, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out


def app_commands() -> set[str]:
    """Every command path of the Typer app ("dsctl", "dsctl lab", "dsctl lab up", ...), walked as Click sees it."""
    import typer.main

    from dsctl.app import app

    found: set[str] = set()

    def walk(command, ctx, path: str) -> None:
        found.add(path)
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"{path} lists {name} but cannot build it"
                walk(sub, typer.Context(sub, info_name=name, parent=ctx), f"{path} {name}")

    root = typer.main.get_command(app)
    walk(root, typer.Context(root, info_name="dsctl"), "dsctl")
    return found


def test_the_site_builds_with_strict(site):
    assert (site / "index.html").is_file()
    for page in ("exit-codes", "troubleshooting", "architecture", "reference/cli"):
        assert (site / page / "index.html").is_file(), page


def test_the_cli_reference_is_generated_from_the_app(site):
    source = CLI_PAGE.read_text(encoding="utf-8")
    assert "<!-- dsctl-cli-reference -->" in source
    assert "**Options**" not in source, "docs/reference/cli.md holds a hand-written reference; the hook generates it"
    built = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    documented = set(HEADING_COMMAND.findall(built))
    commands = app_commands()
    assert {"dsctl", "dsctl upgrade", "dsctl lab snapshot restore"} <= commands  # the walk reaches nested groups
    assert commands - documented == set(), "commands without a section in the CLI reference"
    assert documented - commands == set(), "sections for commands the app does not have"


def test_the_readme_is_a_short_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the manual lives in docs/"
    start = next(i for i, line in enumerate(lines) if line.strip() == "```bash")
    assert start < FIRST_SCREEN_LINES, "the set-up commands belong on the README's first screen"
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    commands = [line.strip() for line in lines[start + 1:end] if line.strip() and not line.strip().startswith("#")]
    assert commands == [MAIN_JOB, ALL_TESTS]
