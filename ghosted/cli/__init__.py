"""Command line: ``python -m ghosted <subcommand>``. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

# modules in ghosted/cli/, in --help order
SUBCOMMANDS = ["run", "influence", "grid", "export", "cache", "methods", "criteria"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ghosted",
        description="Prune whole decoder layers from a causal LM and recover them without training.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (anywhere on the command line)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars or progress lines on stderr (anywhere on the command line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"ghosted.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"ghosted.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


# Errors a user can cause (a wrong value, a missing or unwritable file, a model or text that cannot be
# loaded): one line on stderr and exit code 2. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, RuntimeError)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; argparse mistakes exit 2 with usage, user errors return 2 with one line."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted before or after the subcommand
    args = build_parser().parse_args([a for a in argv if a not in ("--debug", "--quiet")])
    args.quiet = "--quiet" in argv  # accepted before or after the subcommand, like --debug
    from ghosted.core.signals import exit_code, signals_as_interrupts

    try:
        with signals_as_interrupts():  # SIGTERM and SIGHUP end a subcommand like Ctrl-C
            return int(args.handler(args) or 0)
    except USER_ERRORS as err:
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C or a signal: no traceback; the subcommand saved what finished
        print(f"{err or 'interrupted'}.", file=sys.stderr)
        return exit_code(err)


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (a few library messages span several)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text + ("" if text.endswith((".", ")")) else ".") + " (--debug shows the traceback)"
