"""``python -m ghosted grid``: the reproduction grid (criterion x n x every method, two texts)."""

from __future__ import annotations

import argparse
import sys

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_protocol_args, add_task_args, add_text_args, facts_from_args, load_from_args,
    task_options)


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parser(sub) -> None:
    from ghosted.experiments.grid import ALIASES
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
    g.add_argument("--eval-tokens", type=int, default=8192,
                   help="tokens per evaluation text (capped at what its evaluation part holds)")
    g.add_argument("--eval-seq-len", type=int, default=512, help="perplexity window")
    add_protocol_args(p)
    add_task_args(p)
    p.add_argument("--out-dir", default="grid",
                   help="folder for grid.csv, grid.md and grid.json, rewritten as each cell finishes, and "
                        "grid.jsonl, the journal of finished cells")
    p.add_argument("--resume", action="store_true",
                   help="keep the cells a previous grid in --out-dir finished (same settings) and run the rest")
    p.add_argument("--no-cache", action="store_true",
                   help="compute calibration statistics again instead of reusing (and saving) them")
    add_dry_run(p)
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.experiments.grid import GridConfig, run_grid
    from ghosted.recovery.fitting import METHODS
    from ghosted.experiments.validate import check_grid, check_out_dir, parse_counts, plan_grid

    methods = ["dense", *METHODS] if args.methods == "all" else _list(args.methods)
    cfg = GridConfig(model=args.model, selections=_list(args.selections), n_values=parse_counts(args.n, "--n"),
                     methods=methods, calib=args.calib, calib_seqs=args.calib_seqs, seq_len=args.seq_len,
                     heldout_seqs=args.heldout_seqs, evals=_list(args.evals), eval_tokens=args.eval_tokens,
                     eval_seq_len=args.eval_seq_len, device=args.device, dtype=args.dtype, seed=args.seed,
                     batch_size=args.batch_size, cache=not args.no_cache,
                     **task_options(args))
    check_out_dir(args.out_dir)  # cheapest first: a bad --out-dir fails before any text is read
    check_grid(cfg)  # every setting, before the model is loaded
    if args.dry_run:
        print(plan_grid(cfg, facts_from_args(args)))
        return 0
    try:
        result = run_grid(cfg, loaded=load_from_args(args), progress=lambda line: print(line, file=sys.stderr),
                          out_dir=args.out_dir, resume=args.resume)
    except KeyboardInterrupt as err:
        partial = getattr(err, "partial_result", None)
        if partial is not None and not partial.frame.empty:
            print(partial.markdown())
        cells = len(partial.meta.get("settings", {})) if partial is not None else 0
        print(f"interrupted: {cells} finished cell(s) kept in {args.out_dir}/ (grid.jsonl, grid.csv, grid.md); "
              "add --resume to go on from there.", file=sys.stderr)
        return 130
    print(result.markdown())
    for path in result.save(args.out_dir):
        print(f"wrote {path}", file=sys.stderr)
    print(f"grid took {result.meta['seconds']:.0f} s", file=sys.stderr)
    return 0
