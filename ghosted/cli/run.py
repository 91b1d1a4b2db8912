"""``python -m ghosted run``: prune, recover with each method, and report perplexities."""

from __future__ import annotations

import argparse
import sys

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_protocol_args, add_seeds_arg, add_task_args, add_text_args, facts_from_args,
    progress_from_args, write_json)


def add_parser(sub) -> None:
    from ghosted.experiments.spec import RECOVERY_DETAILS
    from ghosted.experiments.spec_flags import add_spec_args

    p = sub.add_parser("run", help="prune layers, recover them with each method, report perplexity",
                       description="Prune layers, fit each recovery method on calibration text, and "
                                   "print perplexity with its protocol. With --recipe, rerun the "
                                   "experiment a results JSON or a ghosted_recipe.json holds; the other "
                                   "flags given on the command line override it.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--recipe", default=None, metavar="FILE",
                   help="rerun the experiment saved in FILE: a results JSON (run --out), a ghosted_recipe.json "
                        "or a saved model's folder; every other flag given on the command line overrides "
                        "the recipe's value (the defaults shown apply only without --recipe)")
    add_model_args(p)
    add_text_args(p)
    add_spec_args(p.add_argument_group("pruning and recovery"),
                  ["drop", "select", "n", "methods", "ghost_mode", "granularity", "eps", "solver", "rank", "fold"])
    add_spec_args(p.add_argument_group("recovery details"), RECOVERY_DETAILS)
    add_protocol_args(p)
    add_task_args(p)
    add_seeds_arg(p, "a whole run on each")
    p.add_argument("--out", default=None, help="write the JSON report here (also what finished, "
                                                 "with \"complete\": false, when the run is stopped); an "
                                                 "existing file only if Ghosted wrote it, never in the model's folder")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out even if it is not a results file Ghosted wrote (never one in the "
                        "model's folder or a cache)")
    add_spec_args(p, ["cache"])
    add_dry_run(p)
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.experiments.spec_files import load_spec
    from ghosted.experiments.spec_flags import spec_from_args
    from ghosted.experiments.run import format_table, run_experiment
    from ghosted.experiments.plans import plan_run
    from ghosted.experiments.validate import check_draws, check_out_file, check_run

    try:
        base = load_spec(args.recipe) if args.recipe else None
    except TypeError as err:  # a field of the wrong kind in the file: the file's fault, one line and exit 2
        raise ValueError(str(err)) from err
    spec = spec_from_args(args, base=base)  # a recipe's model too
    check_out_file(args.out, overwrite=args.overwrite, model=spec.model.source)  # cheapest first: before any text
    check_draws(spec.calibration.seed, args.seeds)  # K whole runs: bounded like every other count
    if args.dry_run:
        check_run(spec)  # what a run's session checks first
        print(plan_run(spec, facts_from_args(spec)))
        return 0
    try:
        with progress_from_args(args) as progress:  # the session checks the spec, then loads the model
            if args.seeds > 1:
                from ghosted.experiments.seeds import run_seeds

                report = run_seeds(spec, args.seeds, progress=progress, offload_folder=args.offload_folder)
            else:
                report, _ = run_experiment(spec, progress=progress, offload_folder=args.offload_folder)
    except (Exception, KeyboardInterrupt) as err:
        return report_stopped(args, err)
    print(format_table(report))
    if report.get("seeds"):
        from ghosted.experiments.seeds import format_seeds

        print(format_seeds(report))
    write_json(args.out, report)
    return 0


def report_stopped(args, err: BaseException) -> int:
    """A stopped run: print and write what finished (``"complete": false``); Ctrl-C exits 130, a
    signal ``128 + signal`` (SIGTERM: 143).

    Any other error goes on to the command line's one-line message, after the partial report.
    """
    from ghosted.core.signals import describe_stop, exit_code
    from ghosted.experiments.run import format_table

    partial = getattr(err, "partial_report", None)
    if partial is not None:
        print(format_table(partial))
        write_json(args.out, partial)
    if not isinstance(err, KeyboardInterrupt):
        raise err
    done = partial["stopped"]["finished"] if partial else "nothing had finished"
    print(f"{describe_stop(err)}: {done}.", file=sys.stderr)
    return exit_code(err)
