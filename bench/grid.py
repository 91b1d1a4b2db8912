"""Regenerate the grid of docs/REPRODUCTION.md (and every number quoted from it) from the reproduction grid.

Runs ``ghosted.grid.run.run_grid`` with the defaults of ``python -m ghosted grid`` (or reads a grid.json
that command already wrote, ``--from DIR``), writes grid.csv / grid.md / grid.json to ``--out-dir``, saves the
grid as the committed results file ``docs/results/grid.json`` (with the date, machine and commands that made
it), and rewrites every block generated from that file (``python -m bench.docs``): the block between
``<!-- grid:table -->`` and ``<!-- /grid:table -->`` in docs/REPRODUCTION.md (the tables, the protocol, the
layers each criterion chose and the wall time) and the sentences of README.md and REPRODUCTION.md that
quote the grid.

Command: ``python -m bench.grid [--out-dir grid] [--eval-tokens 8192] [--calib-seqs 32]``
or, after ``python -m ghosted grid --out-dir grid`` (on any machine): ``python -m bench.grid --from grid
[--machine "where it ran"]``.
"""

from __future__ import annotations

import argparse

from bench.docs import write_all
from bench.grid_results import load_result, save_results

from ghosted.core.progress import TqdmProgress
from ghosted.grid.run import GridConfig, GridResult, run_grid


def main(argv: list[str] | None = None) -> GridResult:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", default=None,
                   help="read DIR/grid.json (or DIR1,DIR2: merged) instead of running the grid")
    p.add_argument("--out-dir", default="grid", help="where the grid's CSV, Markdown and JSON go")
    default = vars(GridConfig().flat())
    p.add_argument("--eval-tokens", type=int, default=default["eval_tokens"])
    p.add_argument("--calib-seqs", type=int, default=default["calib_seqs"])
    p.add_argument("--machine", default=None,
                   help="with --from: the machine the grid ran on, in words (default: this machine)")
    args = p.parse_args(argv)
    if args.source:
        result, commands = load_result(args.source)
    else:
        cfg = GridConfig.of(eval_tokens=args.eval_tokens, calib_seqs=args.calib_seqs)
        with TqdmProgress() as progress:  # bars and one line per part of the grid, on stderr
            result = run_grid(cfg, progress=progress)
        result.save(args.out_dir)
        extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in
                        (("eval_tokens", args.eval_tokens), ("calib_seqs", args.calib_seqs))
                        if v != default[k])
        commands = [f"python -m bench.grid{extra}"]
    save_results(result, commands, where=args.machine)
    write_all()
    return result


if __name__ == "__main__":
    main()
