"""``python -m ghosted export``: prune, recover with one method, and save a loadable model folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_text_args, check_output_folder, facts_from_args, load_from_args,
    progress_from_args)
from ghosted.recovery.fitting import METHODS
from ghosted.recovery.methods import DEFAULT


def add_parser(sub) -> None:
    from ghosted.experiments.spec import RECOVERY_DETAILS
    from ghosted.experiments.spec_flags import add_spec_args

    p = sub.add_parser("export", help="prune layers, recover them with one method, save the model",
                       description="Prune layers, fit one recovery method on calibration text, and "
                                   "save a Hugging Face folder with the operators and a recipe. "
                                   "Methods that fold into existing weights (replaceme-ls, "
                                   "replaceme-cos on most families) give a plain checkpoint.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    add_text_args(p, calib=True, evaluation=False)
    g = p.add_argument_group("pruning and recovery")
    add_spec_args(g, ["drop"], required=("drop",))
    g.add_argument("--method", default=DEFAULT, choices=list(METHODS),
                   help="recovery method (ghost: the paper's fit exactly)")
    add_spec_args(g, ["ghost_mode", "granularity", "eps", "solver", "fold"])
    add_spec_args(p.add_argument_group("recovery details"), RECOVERY_DETAILS)
    p.add_argument("--out", required=True,
                   help="new or empty folder to write the model, operators and recipe to (never the "
                        "model's own folder or Ghosted's cache)")
    add_spec_args(p, ["rank"])
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model already in --out (its files go once the new one is complete; "
                        "any other file in the folder is kept)")
    add_dry_run(p)
    add_spec_args(p, ["cache"])
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.experiments.spec_flags import spec_from_args
    from ghosted.operators.checkpoint import save_recovered
    from ghosted.experiments.session import Session
    from ghosted.experiments.plans import plan_export
    from ghosted.experiments.validate import check_export, check_export_model, facts_of_model

    spec = spec_from_args(args).with_options(methods=[args.method])  # the experiment: every check reads it
    if spec.model.layerwise:
        raise ValueError("export does not run layer by layer yet: it writes every kept weight at once, so it needs "
                         "the model loaded whole; run export without --layerwise (or with --device-map auto).")
    check_output_folder(args.out, args.overwrite, spec.model.source)  # before loading: a typo costs nothing
    check_export(spec)  # every setting, before the model is loaded
    if args.dry_run:
        print(plan_export(spec, facts_from_args(spec), args.out))
        return 0
    lm = load_from_args(spec, args.offload_folder)
    drop = check_export_model(spec, facts_of_model(lm.model))  # fail before calibrating, not after
    session = None
    try:
        with progress_from_args(args) as progress:
            session = Session(spec, lm, progress)
            fitted = session.fit(drop)
        out = save_recovered(fitted.models[args.method], args.out, lm, recipe=fitted.recovery,
                             spec=fitted.spec.to_dict(), overwrite=args.overwrite)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM, SIGHUP: the staged folder is gone, --out untouched
        return report_stopped(args, err, cached=bool(session and session.cache and session.cache.written))
    print(describe_folder(out))
    return 0


def report_stopped(args, err: KeyboardInterrupt, cached: bool) -> int:
    """A stopped export: nothing was saved, ``--out`` is as it was; the exit code of the signal."""
    from ghosted.core.signals import describe_stop, exit_code

    state = "left as it was" if Path(args.out).exists() else "not created"
    saved = " (the calibration statistics it finished are cached)" if cached else ""
    print(f"{describe_stop(err)}: no model saved, {args.out} {state}{saved}.", file=sys.stderr)
    return exit_code(err)


def describe_folder(folder: Path) -> str:
    """The files of a saved folder with their sizes, and how to load it."""
    from ghosted.models.loading import read_recipe

    recipe = read_recipe(folder)
    lines = [f"saved {recipe.get('method')} model, layers {recipe.get('dropped_spec')} removed, to {folder}/"]
    ours = set(recipe.get("files") or [])  # what the save wrote; anything else was there before, kept
    for file in sorted(folder.iterdir()):
        kept = "  (not Ghosted's: kept)" if ours and file.name not in ours else ""
        lines.append(f"  {file.name:<34}{file.stat().st_size / 2**20:>10.2f} MiB{kept}")
    lines.append(f"load with {recipe.get('load_with', 'ghosted.load_recovered(path)')}")
    return "\n".join(lines)
