"""Run under real vLLM's Python: parse `vllm serve` command lines with vLLM's own parser, as `vllm serve` does.

stdin: a JSON list of argument lists (what follows `vllm serve`).  stdout: {"options": [every option string of
`vllm serve`], "results": [one entry per command line: {"ok": true, "options": {dest: value}} or
{"ok": false, "error": "<vLLM's own words>"}]}.  Each line goes
through the serve subcommand's parser (vllm.entrypoints.cli.serve.ServeSubcommand, built as vllm's main builds
it), its validation (validate_parsed_serve_args) and AsyncEngineArgs.from_cli_args (where vLLM turns the flags'
text into its engine arguments, JSON configs included).  Nothing is loaded and nothing served.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> int:
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    serve = command.subparser_init(subparsers)
    results = []
    for argv in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(["serve", *argv])
                command.validate(args)
                if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does before anything else
                    args.model = args.model_tag
                vllm.AsyncEngineArgs.from_cli_args(args)
        except SystemExit:
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            results.append({"ok": False, "error": lines[-1] if lines else "exit"})
            continue
        except Exception as exc:  # noqa: BLE001 - vLLM's own words, whatever it raised
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        options = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}
        results.append({"ok": True, "options": options})
    json.dump({"options": sorted(serve._option_string_actions), "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
