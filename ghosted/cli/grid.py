"""``python -m ghosted grid``: the reproduction grid (criterion x n x every method, two texts)."""

from __future__ import annotations

import argparse
import sys

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_protocol_args, add_seeds_arg, add_task_args, add_text_args, facts_from_args,
    load_from_args, progress_from_args)


GRID_FILES = ("grid.csv", "grid.md", "grid.json", "grid_tasks.csv", "grid.jsonl")  # what a grid writes


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parser(sub) -> None:
    from ghosted.experiments.spec_flags import add_spec_args
    from ghosted.grid.run import ALIASES, grid_base
    from ghosted.recovery.methods import methods_help

    p = sub.add_parser("grid", help="the reproduction grid: selection x layers removed x every method",
                       description="Choose layers with each selection criterion for each n, recover them with "
                                   "every method (one calibration pass per layer set), and report perplexity "
                                   "on each evaluation text (shared-prefix evaluation). Writes grid.csv, "
                                   "grid.md and grid.json to --out-dir.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    add_text_args(p, evaluation=False)
    g = p.add_argument_group("grid")
    g.add_argument("--selections", default="streamline,shortgpt",
                   help="selection criteria: " + ", ".join(f"{k} (= {v}, the paper's code)" for k, v in ALIASES.items())
                        + ", or any criterion of `python -m ghosted influence`")
    g.add_argument("--n", default="7,11", help="numbers of layers removed, comma list")
    g.add_argument("--methods", default="all", help="'all' or a " + methods_help())
    g.add_argument("--evals", default="bundled:wiki,bundled:news", help="evaluation texts, comma list")
    add_spec_args(g, ["eval_tokens", "eval_seq_len"], defaults={"eval_tokens": grid_base().evaluation.eval_tokens})
    add_seeds_arg(g, "every cell fitted on each (the layers chosen on the first)")
    add_protocol_args(p)
    add_task_args(p)
    p.add_argument("--out-dir", default="grid",
                   help="folder for grid.csv, grid.md and grid.json, rewritten as each cell finishes, and "
                        "grid.jsonl, the journal of finished cells")
    p.add_argument("--resume", action="store_true",
                   help="keep the cells a previous grid in --out-dir finished (same settings) and run the rest")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new grid in an --out-dir that holds an earlier one (its journal is replaced "
                        "when the first new part finishes), or whose grid files Ghosted did not write")
    add_spec_args(p, ["cache"])
    add_dry_run(p)
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.experiments.spec_flags import spec_from_args
    from ghosted.grid.run import GridConfig, run_grid
    from ghosted.grid.journal import GridJournal
    from ghosted.recovery.methods import REGISTRY
    from ghosted.experiments.plans import plan_grid
    from ghosted.experiments.validate import check_grid, check_out_dir, parse_counts
    from ghosted.core.signals import describe_stop, exit_code

    methods = list(REGISTRY) if args.methods == "all" else _list(args.methods)
    base = spec_from_args(args, ignore=("n", "methods")).with_options(methods=methods)  # --n, --methods: the grid's
    cfg = GridConfig(base=base, selections=_list(args.selections), n_values=parse_counts(args.n, "--n"),
                     evals=_list(args.evals), seeds=args.seeds)
    check_out_dir(args.out_dir, overwrite=args.overwrite or args.resume, model=args.model,  # --resume: its own
                  names=GRID_FILES)  # cheapest first: a bad --out-dir fails before any text is read
    GridJournal.check(args.out_dir, args.resume, args.overwrite)  # an earlier grid's journal is never lost
    check_grid(cfg)  # every setting, before the model is loaded
    if args.dry_run:
        print(plan_grid(cfg, facts_from_args(args)))
        return 0
    try:
        with progress_from_args(args) as progress:
            result = run_grid(cfg, loaded=load_from_args(args), progress=progress, out_dir=args.out_dir,
                              resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt as err:
        partial = getattr(err, "partial_result", None)
        if partial is not None and not partial.frame.empty:
            print(partial.markdown())
        cells = len(partial.meta.get("settings", {})) if partial is not None else 0
        print(f"{describe_stop(err)}: {cells} finished cell(s) kept in {args.out_dir}/ (grid.jsonl, grid.csv, "
              "grid.md); add --resume to go on from there.", file=sys.stderr)
        return exit_code(err)
    print(result.markdown())
    for path in result.save(args.out_dir):
        print(f"wrote {path}", file=sys.stderr)
    print(f"grid took {result.meta['seconds']:.0f} s", file=sys.stderr)
    return 0
