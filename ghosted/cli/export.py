"""``python -m ghosted export``: prune, recover with one method, and save a loadable model folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_text_args, check_output_folder, facts_from_args, load_from_args)
from ghosted.recovery.fitting import METHODS


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="prune layers, recover them with one method, save the model",
                       description="Prune layers, fit one recovery method on calibration text, and "
                                   "save a Hugging Face folder with the operators and a recipe. "
                                   "Methods that fold into existing weights (replaceme-ls, "
                                   "replaceme-cos on most families) give a plain checkpoint.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    add_text_args(p, calib=True, evaluation=False)
    g = p.add_argument_group("pruning and recovery")
    g.add_argument("--drop", required=True,
                   help="layers to remove, 0-based, ranges inclusive: '20-26' or '3,7,9-11'")
    g.add_argument("--method", default="ghost-auto", choices=list(METHODS),
                   help="recovery method (ghost: the paper's fit exactly)")
    g.add_argument("--ghost-mode", default="independent", choices=["independent", "sequential"],
                   help="fit every operator on the dense model (paper), or each on the model already "
                        "pruned and patched upstream")
    g.add_argument("--granularity", default="auto", choices=["auto", "block", "layer"],
                   help="one operator per contiguous block or per removed layer")
    g.add_argument("--eps", type=float, default=1e-6, help="ridge of the ghost solve")
    g.add_argument("--solver", default="solve", choices=["solve", "pinv"],
                   help="normal equations, or the exact minimum-norm pseudo-inverse")
    g.add_argument("--no-fold", action="store_true",
                   help="keep ReplaceMe's map as a hooked operator instead of folding it into weights")
    p.add_argument("--out", required=True,
                   help="new or empty folder to write the model, operators and recipe to (never the "
                        "model's own folder or Ghosted's cache)")
    p.add_argument("--rank", type=int, default=None,
                   help="rank R of ghost-lowrank's correction M = U·V (2·d·R parameters; default d/4)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model already in --out (removed once the new one is complete)")
    add_dry_run(p)
    p.add_argument("--no-cache", action="store_true",
                   help="compute calibration statistics again instead of reusing (and saving) them")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.calibration.collect import CalibrationConfig
    from ghosted.operators.checkpoint import save_recovered
    from ghosted.data.windows import split_calibration
    from ghosted.recovery.fitting import RecoveryConfig, recover
    from ghosted.data.windows import calibration_windows
    from ghosted.experiments.validate import check_export, check_export_model, facts_of_model, plan_export

    check_output_folder(args.out, args.overwrite, args.model)  # before loading: a typo costs nothing
    check_export(args)  # every setting, before the model is loaded
    if args.dry_run:
        print(plan_export(args, facts_from_args(args)))
        return 0
    lm = load_from_args(args)
    drop = check_export_model(args, facts_of_model(lm.model))  # fail before calibrating, not after
    calib = calibration_windows(lm.tokenizer, args.calib, args.calib_seqs + args.heldout_seqs,
                                args.seq_len, args.seed)
    fit, heldout = split_calibration(calib, args.heldout_seqs)
    config = RecoveryConfig(eps=args.eps, solver=args.solver, mode=args.ghost_mode,
                            granularity=args.granularity, replaceme_fold=not args.no_fold, rank=args.rank,
                            calibration=CalibrationConfig(batch_size=args.batch_size, seed=args.seed))
    run = recover(lm.model, drop, [args.method], fit, heldout, config, cache=not args.no_cache)
    out = save_recovered(run.results[args.method].model, args.out, lm, recipe=run,
                         overwrite=args.overwrite)
    print(describe_folder(out))
    return 0


def describe_folder(folder: Path) -> str:
    """The files of a saved folder with their sizes, and how to load it."""
    from ghosted.models.loading import read_recipe

    recipe = read_recipe(folder)
    lines = [f"saved {recipe.get('method')} model, layers {recipe.get('dropped_spec')} removed, to {folder}/"]
    for file in sorted(folder.iterdir()):
        lines.append(f"  {file.name:<34}{file.stat().st_size / 2**20:>10.2f} MiB")
    lines.append(f"load with {recipe.get('load_with', 'ghosted.load_recovered(path)')}")
    return "\n".join(lines)
