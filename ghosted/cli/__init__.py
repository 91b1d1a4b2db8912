"""Command line: ``python -m ghosted <subcommand>``. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = ["run", "influence", "grid", "export", "cache"]  # modules in ghosted/cli/, in --help order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ghosted",
        description="Prune whole decoder layers from a causal LM and recover them without training.")
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


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: no traceback; what finished was saved by the subcommand
        print("interrupted.", file=sys.stderr)
        return 130
