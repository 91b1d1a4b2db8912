"""Rerun every benchmark in turn; each rewrites its own section of docs/BENCHMARKS.md.

Command: ``python -m bench.all [--skip vs_official,...]`` (each benchmark alone: ``python -m bench.NAME``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from bench._common import ORDER  # docs/BENCHMARKS.md order

LATER = ("stats_cache", "vs_official_layers", "layerwise")  # sections written after ORDER's
BENCHMARKS = [*ORDER, *[name for name in LATER if name not in ORDER]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", default="", help="comma list of benchmarks to leave out")
    args = p.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    for name in BENCHMARKS:
        if name in skip:
            continue
        started = time.perf_counter()
        print(f"== bench.{name}", file=sys.stderr)
        importlib.import_module(f"bench.{name}").main([])
        print(f"== bench.{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
