"""``python -m ghosted run``: prune, recover with each method, and report perplexities."""

from __future__ import annotations

import argparse
import sys

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_protocol_args, add_task_args, add_text_args, facts_from_args, load_from_args,
    task_options, write_json)
from ghosted.recovery.methods import methods_help


def add_parser(sub) -> None:
    from ghosted.selection.criteria import alias_text

    p = sub.add_parser("run", help="prune layers, recover them with each method, report perplexity",
                       description="Prune layers, fit each recovery method on calibration text, and "
                                   "print perplexity with its protocol.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    add_text_args(p)
    g = p.add_argument_group("pruning and recovery")
    g.add_argument("--drop", default="",
                   help="layers to remove, 0-based, ranges inclusive: '20-26' or '3,7,9-11'")
    g.add_argument("--select", default="", metavar="METRIC",
                   help="instead of --drop, let this influence criterion choose the layers "
                        "(see 'python -m ghosted influence --help'), e.g. recoverability; aliases: "
                        + alias_text() + "; prunecomp:<criterion> runs Prune&Comp's iterative "
                        "prune-and-compensate loop on it")
    g.add_argument("--n", type=int, default=0, help="how many layers --select removes")
    g.add_argument("--methods", default="dense,none,ghost-auto",
                   help=methods_help())
    g.add_argument("--ghost-mode", default="independent", choices=["independent", "sequential"],
                   help="fit every operator on the dense model (paper), or each on the model already "
                        "pruned and patched upstream")
    g.add_argument("--granularity", default="auto", choices=["auto", "block", "layer"],
                   help="one operator per contiguous block or per removed layer (auto: block for a "
                        "single block, per layer otherwise, as the paper)")
    g.add_argument("--eps", type=float, default=1e-6, help="ridge of the ghost solve")
    g.add_argument("--solver", default="solve", choices=["solve", "pinv"],
                   help="normal equations, or the exact minimum-norm pseudo-inverse")
    g.add_argument("--rank", type=int, default=None,
                   help="rank R of ghost-lowrank's correction M = U·V (2·d·R parameters; default d/4)")
    add_protocol_args(p)
    add_task_args(p)
    p.add_argument("--out", default=None, help="write the JSON report here (also what finished, "
                                                 "with \"complete\": false, when the run is stopped)")
    p.add_argument("--no-cache", action="store_true",
                   help="compute calibration statistics again instead of reusing (and saving) them; "
                        "see 'python -m ghosted cache'")
    add_dry_run(p)
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.experiments.run import RunConfig, format_table, run_experiment
    from ghosted.experiments.validate import check_out_file, check_run, plan_run

    cfg = RunConfig(model=args.model, calib=args.calib, eval=args.eval, calib_seqs=args.calib_seqs,
                    seq_len=args.seq_len, heldout_seqs=args.heldout_seqs, eval_tokens=args.eval_tokens,
                    eval_seq_len=args.eval_seq_len, device=args.device, dtype=args.dtype,
                    seed=args.seed, drop=args.drop, select=args.select, n=args.n,
                    methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                    ghost_mode=args.ghost_mode, granularity=args.granularity, eps=args.eps,
                    solver=args.solver, batch_size=args.batch_size, cache=not args.no_cache, rank=args.rank,
                    **task_options(args))
    check_out_file(args.out)  # cheapest first: a bad --out fails before any text is read
    check_run(cfg)  # every setting, before the model is loaded
    if args.dry_run:
        print(plan_run(cfg, facts_from_args(args)))
        return 0
    try:
        report, _ = run_experiment(cfg, loaded=load_from_args(args))
    except (Exception, KeyboardInterrupt) as err:
        return report_stopped(args, err)
    print(format_table(report))
    write_json(args.out, report)
    return 0


def report_stopped(args, err: BaseException) -> int:
    """A stopped run: print and write what finished (``"complete": false``); Ctrl-C exits 130.

    Any other error goes on to the command line's one-line message, after the partial report.
    """
    from ghosted.experiments.run import format_table

    partial = getattr(err, "partial_report", None)
    if partial is not None:
        print(format_table(partial))
        write_json(args.out, partial)
    if not isinstance(err, KeyboardInterrupt):
        raise err
    done = partial["stopped"]["finished"] if partial else "nothing had finished"
    print(f"interrupted: {done}.", file=sys.stderr)
    return 130
